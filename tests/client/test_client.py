"""``turnstile.client`` against a real node (hypercorn on loopback, the real gateway): a turn's
events typed and gap-free, reconnecting without a gap or a duplicate when the connection is
killed mid-stream (a TCP proxy between the client and the node resets it), a message resent
with its idempotency key after its ``ack`` was lost, the REST routes, errors by their codes,
and the same client under asyncio.

Nothing sleeps to synchronise: each test waits for the events it expects, on a second stream
attached straight to the node when it needs to know what the node did meanwhile.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

import anyio
import pytest
import trio

from tests.support.agents import GatedAgent
from tests.support.node import ALICE, BOB, running_node
from tests.support.polling import eventually
from tests.support.tcpproxy import open_tcp_proxy
from turnstile.client import (
    Ack,
    BadRequest,
    Conflict,
    ConnectionLost,
    Event,
    FactForgotten,
    FactSaved,
    MemoryDeleted,
    NotFound,
    SessionDeleted,
    SessionStream,
    StreamDelta,
    StreamEnd,
    StreamStart,
    SummaryChanged,
    ToolCalled,
    ToolError,
    TopicEvent,
    TopicReset,
    TurnQueued,
    Unauthorized,
    UnknownEvent,
    decode_topic_event,
    open_client,
)

#: a hang guard per test (real clock, 2 loaded cores), not a promise
WAIT = 60


async def read_until(stream: SessionStream, done: Callable[[Event], bool]) -> list[Event]:
    """The stream's events up to and including the first for which ``done`` is true."""
    seen: list[Event] = []
    async for event in stream:
        seen.append(event)
        if done(event):
            return seen
    raise AssertionError(f"the stream ended before the event expected: {seen}")


def ends(input_id: int | None) -> Callable[[Event], bool]:
    return lambda e: isinstance(e.data, StreamEnd) and e.data.input_id == input_id


async def stream_dropped(stream: SessionStream) -> bool:
    return stream.statistics().dropped > 0


async def test_a_turn_streams_as_typed_events_with_gap_free_seqs(tmp_path):
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            session = await client.create_session("s1")
            assert (session.id, session.owner, session.last_seq) == ("s1", "alice", 0)
            async with client.attach("s1") as stream:
                assert stream.last_seq == 0
                ack = await stream.send("hello there")
                assert isinstance(ack, Ack) and ack.input_id == 1
                assert ack.client_msg_id and ack.client_msg_id.startswith("tsc-")
                events = await read_until(stream, ends(ack.input_id))
                assert await stream.call("echo", {"text": "hi"}) == {"text": "hi"}
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert isinstance(events[0].data, TurnQueued)
            start = events[1].data
            assert isinstance(start, StreamStart)
            assert (start.source, start.content) == ("user", "hello there")
            text = "".join(e.data.text for e in events if isinstance(e.data, StreamDelta))
            end = events[-1].data
            assert isinstance(end, StreamEnd)
            assert (end.status, end.text, text) == ("completed", "You said: hello there", text)
            assert text == "You said: hello there"
            assert {e.session_id for e in events} == {"s1"}
            # the same events over HTTP, typed the same
            assert await client.events("s1") == events
            assert await client.history("s1") == [
                {"role": "user", "content": "hello there", "source": "user"},
                {"role": "assistant", "content": "You said: hello there", "status": "completed"},
            ]


async def test_attach_after_seq_replays_what_was_missed_then_goes_on_live(tmp_path):
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            await client.create_session("s1")
            first = await client.post_message("s1", "one")
            async with client.attach("s1", after_seq=0) as stream:
                replayed = await read_until(stream, ends(first.input_id))
                second = await stream.send("two")
                live = await read_until(stream, ends(second.input_id))
            seqs = [e.seq for e in replayed + live]
            assert seqs == list(range(1, len(seqs) + 1))


async def test_a_connection_killed_mid_stream_resumes_without_gap_or_duplicate(tmp_path):
    """The proxy resets the stream's connection in the middle of a turn and refuses new ones
    while that turn ends and another runs; once it lets them through, the stream attaches again
    after the last seq it had and reads exactly what the node stored, once, in order."""
    gated = GatedAgent()
    with trio.fail_after(WAIT):
        async with (
            running_node(tmp_path, agent=gated) as node,
            open_tcp_proxy("127.0.0.1", urlsplit(node.url).port or 80) as proxy,
            open_client(f"http://127.0.0.1:{proxy.port}", ALICE) as through_proxy,
            open_client(node.url, ALICE) as direct,
        ):
            await direct.create_session("s1")
            async with (
                direct.attach("s1", after_seq=0) as reference,
                through_proxy.attach("s1", after_seq=0, reconnect_attempts=1000) as stream,
            ):
                first = await stream.send("wait:first")
                before = await read_until(
                    stream, lambda e: isinstance(e.data, StreamStart)
                )  # the turn is running

                await proxy.cut()  # mid-stream: the connection is reset, new ones refused
                gated.gate("wait:first").set()
                second = await direct.post_message("s1", "second")
                expected = await read_until(reference, ends(second.input_id))
                proxy.heal()

                after = await read_until(stream, ends(second.input_id))
                assert stream.statistics().connects >= 2
            got = before + after
            assert [e.seq for e in got] == list(range(1, len(got) + 1))
            assert got == expected
            assert [e.type for e in got].count("stream_end") == 2
            assert first.input_id is not None


async def test_a_message_whose_ack_was_lost_is_sent_again_and_stored_once(tmp_path):
    """The proxy drops what the node sends back, so the ``send`` reaches the node and its
    ``ack`` never comes; then it resets the connection. The stream sends the message again on
    the new connection with the same ``client_msg_id``: the node answers the first ``ack``
    again and runs one turn."""
    with trio.fail_after(WAIT):
        async with (
            running_node(tmp_path) as node,
            open_tcp_proxy("127.0.0.1", urlsplit(node.url).port or 80) as proxy,
            open_client(f"http://127.0.0.1:{proxy.port}", ALICE) as through_proxy,
            open_client(node.url, ALICE) as direct,
        ):
            await direct.create_session("s1")
            async with (
                direct.attach("s1", after_seq=0) as reference,
                through_proxy.attach("s1", reconnect_attempts=1000) as stream,
            ):
                proxy.half_open("down")
                acks: list[Ack] = []

                async def send() -> None:
                    acks.append(await stream.send("only once", client_msg_id="m-1"))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send)
                    stored = await read_until(reference, lambda e: e.type == "stream_end")
                    proxy.heal()
                    proxy.reset()  # the ack is lost with the connection
                assert stream.statistics().connects == 2
            (ack,) = acks
            (end,) = [e.data for e in stored if isinstance(e.data, StreamEnd)]
            assert (ack.input_id, ack.client_msg_id) == (end.input_id, "m-1")
            starts = [e for e in await direct.events("s1") if isinstance(e.data, StreamStart)]
            assert [s.data.content for s in starts] == ["only once"]  # type: ignore[union-attr]


async def test_a_reader_a_full_buffer_behind_loses_nothing(tmp_path):
    """A buffer of two events and a reader that reads nothing until the turn is over: the
    stream drops what does not fit, then attaches again after the last event it kept, on the
    same connection, and the reader gets every event once."""
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            await client.create_session("s1")
            async with (
                client.attach("s1", after_seq=0) as reference,
                client.attach("s1", after_seq=0, max_buffer=2) as stream,
            ):
                ack = await stream.send("hello there")
                expected = await read_until(reference, ends(ack.input_id))
                assert len(expected) > 2
                await eventually(functools.partial(stream_dropped, stream))
                got = await read_until(stream, ends(ack.input_id))
                assert stream.statistics().connects == 1
            assert got == expected


async def test_a_deleted_session_ends_the_stream_after_its_events(tmp_path):
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            await client.create_session("gone")
            async with client.attach("gone") as stream:
                ack = await stream.send("last words")
                await client.delete_session("gone")
                got = [event async for event in stream]  # ends when the session is gone
                assert [e.seq for e in got] == list(range(1, len(got) + 1))
                assert ack.input_id == 1
                with pytest.raises(SessionDeleted) as deleted:
                    await stream.receive()
                assert deleted.value.code == "not_found"
                with pytest.raises(SessionDeleted):
                    await stream.send("anyone?")


async def test_errors_are_exceptions_carrying_the_protocols_codes(tmp_path):
    with trio.fail_after(WAIT):
        async with (
            running_node(tmp_path) as node,
            open_client(node.url, ALICE) as alice,
            open_client(node.url, BOB) as bob,
            open_client(node.url, "not-a-token") as nobody,
        ):
            await alice.create_session("mine", policy="reject")
            with pytest.raises(NotFound) as found:
                await bob.get_session("mine")  # another user's is like one that is not there
            assert (found.value.code, found.value.status) == ("not_found", 404)
            with pytest.raises(NotFound) as found:
                async with bob.attach("mine"):
                    pass
            assert (found.value.code, found.value.status) == ("not_found", None)
            with pytest.raises(Unauthorized) as refused:
                await nobody.list_sessions()
            assert refused.value.code == "unauthorized"
            with pytest.raises(Unauthorized):
                async with nobody.attach("mine"):
                    pass
            with pytest.raises(BadRequest) as bad:
                await alice.create_session("x.heartbeat")
            assert (bad.value.code, bad.value.field) == ("invalid_argument", "id")
            async with alice.attach("mine") as stream:
                with pytest.raises(ToolError) as tool:
                    await stream.call("no.such.tool")
                assert tool.value.code == "unknown_tool"
                with pytest.raises(ToolError) as tool:
                    await stream.call("echo", {"txt": "a typo"})
                assert tool.value.code == "bad_arguments"
                await stream.send("a", client_msg_id="k")
                with pytest.raises(Conflict) as reused:
                    await stream.send("b", client_msg_id="k")
                assert (reused.value.code, reused.value.field) == (
                    "idempotency_key_reused",
                    "client_msg_id",
                )
                with pytest.raises(BadRequest) as bad:
                    await stream.set_policy("sometimes")
                assert bad.value.code in ("invalid_argument", "bad_message")
            with pytest.raises(Conflict) as reused:
                await alice.post_message("mine", "c", client_msg_id="k")
            assert (reused.value.code, reused.value.status) == ("idempotency_key_reused", 409)


async def test_a_node_nobody_runs_is_connection_lost():
    with socket.socket() as sock:  # a port nobody listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with trio.fail_after(WAIT):
        async with open_client(url, ALICE) as client:
            with pytest.raises(ConnectionLost) as lost:
                await client.list_sessions()
            assert lost.value.message == f"cannot reach the node at {url}: connection refused"
            assert lost.value.code == "connection_lost"
            with pytest.raises(ConnectionLost) as lost:
                async with client.attach("s1"):
                    pass
            assert lost.value.message == "connection refused"


async def test_the_rest_routes(tmp_path):
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            assert (await client.health())["protocol"] == 1
            created = await client.create_session(metadata={"k": "v"})
            assert created.metadata == {"k": "v"}
            assert [s.id for s in await client.list_sessions()] == [created.id]
            posted = await client.post_message(created.id, "hi", client_msg_id="p1")
            again = await client.post_message(created.id, "hi", client_msg_id="p1")
            assert posted == again  # the same answer, no second turn
            async with client.attach(created.id, after_seq=0) as stream:
                await read_until(stream, ends(posted.input_id))
            assert await client.stop(created.id) is False
            assert await client.jobs() == []
            scheduled = await client.call(
                created.id, "schedule_once", {"when": "in 2 hours", "prompt": "later"}
            )
            (job,) = await client.jobs(session_id=created.id)
            assert job["id"] == scheduled["job_id"]
            assert (await client.pause_job(job["id"]))["state"] == "paused"
            assert (await client.resume_job(job["id"]))["state"] == "active"
            assert (await client.cancel_job(job["id"]))["state"] == "cancelled"
            assert (await client.get_job(job["id"]))["job"]["state"] == "cancelled"
            assert (await client.watchers())["watchers"] == []
            assert await client.approvals(created.id) == []
            assert await client.recall(created.id) is None
            await client.delete_session(created.id)
            assert await client.list_sessions() == []
            with pytest.raises(NotFound):
                await client.get_session(created.id)


async def test_the_memory_routes(tmp_path):
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            saved = await client.put_fact("drinks", "coffee", "dark roast")
            assert saved["fact"]["value"] == "dark roast"
            facts = (await client.facts())["facts"]
            assert [(f["category"], f["key"], f["value"]) for f in facts] == [
                ("drinks", "coffee", "dark roast")
            ]
            found = await client.search_memory("coffee")
            assert [f["key"] for f in found["facts"]] == ["coffee"]
            await client.put_memory_summary("likes coffee")
            assert (await client.memory_summary())["summary"] == "likes coffee"
            changes = await client.memory_changes()
            assert [c["type"] for c in changes["changes"]] == ["fact_saved", "summary_changed"]
            assert (await client.memory_changes(after_seq=changes["last_seq"]))["changes"] == []
            assert (await client.forget_fact("coffee", category="drinks")) == {"deleted": 1}
            assert (await client.facts())["facts"] == []
            deleted = await client.delete_memory()
            assert deleted == {"deleted": {"facts": 0, "summary": 1, "sessions": 0}}


async def test_a_tool_call_shows_in_the_stream(tmp_path):
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            await client.create_session("s1")
            async with client.attach("s1") as stream:
                ack = await stream.send('/call echo {"text":"x"}')
                events = await read_until(stream, ends(ack.input_id))
            (called,) = [e.data for e in events if isinstance(e.data, ToolCalled)]
            assert (called.tool, called.ok, called.result) == ("echo", True, {"text": "x"})


async def test_the_client_works_under_asyncio(tmp_path):
    """The same client in a thread running an asyncio loop (anyio's asyncio backend), against
    a node running on trio."""

    async with running_node(tmp_path) as node:

        async def on_asyncio() -> str:
            async with open_client(node.url, ALICE) as client:
                session = await client.create_session()
                async with client.attach(session.id) as stream:
                    ack = await stream.send("from asyncio")
                    events = await read_until(stream, ends(ack.input_id))
            end = events[-1].data
            assert isinstance(end, StreamEnd)
            return end.text

        with trio.fail_after(WAIT):
            text = await trio.to_thread.run_sync(lambda: anyio.run(on_asyncio, backend="asyncio"))
    assert text == "You said: from asyncio"


async def test_a_topic_replays_goes_live_and_resumes_after_a_cut(tmp_path):
    """``subscribe("memory")``: what the log holds after ``after_seq``, then live events; the
    connection cut while facts are saved, the stream reads exactly what the log has, once."""
    with trio.fail_after(WAIT):
        async with (
            running_node(tmp_path) as node,
            open_tcp_proxy("127.0.0.1", urlsplit(node.url).port or 80) as proxy,
            open_client(f"http://127.0.0.1:{proxy.port}", ALICE) as through_proxy,
            open_client(node.url, ALICE) as direct,
        ):
            await direct.put_fact("drinks", "coffee", "dark roast")
            async with through_proxy.subscribe(
                "memory", after_seq=0, reconnect_attempts=1000
            ) as stream:
                replayed = await stream.receive()
                assert isinstance(replayed, TopicEvent)
                assert (replayed.type, replayed.fields["fact"]["value"]) == (
                    "fact_saved",
                    "dark roast",
                )
                await direct.put_fact("food", "lunch", "soup")
                live = await stream.receive()
                assert isinstance(live, TopicEvent)
                assert live.fields["fact"]["key"] == "lunch"

                await proxy.cut()
                await direct.put_fact("food", "dinner", "rice")
                await direct.put_memory_summary("eats")
                proxy.heal()
                after = [await stream.receive(), await stream.receive()]
                assert stream.statistics().connects >= 2
            changes = (await direct.memory_changes())["changes"]
            got = [replayed, live, *after]
            assert all(isinstance(e, TopicEvent) for e in got)
            assert [(e.seq, e.type) for e in got] == [(c["seq"], c["type"]) for c in changes]


async def test_the_memory_topics_events_are_typed(tmp_path):
    """Each ``memory`` event is the feature's Struct, over the WebSocket and in the change log
    alike; the subscription says where the log stood when it began."""
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            await client.put_fact("drinks", "tea", "green")
            await client.delete_memory()  # supersedes the save: the log keeps only this
            await client.put_fact("drinks", "coffee", "dark roast")
            await client.put_memory_summary("likes coffee")
            await client.put_fact("food", "lunch", "soup")
            await client.forget_fact("lunch")  # supersedes the lunch's save
            async with client.subscribe("memory", after_seq=0) as stream:
                assert stream.statistics().head_seq == 6
                got = [await stream.receive() for _ in range(4)]
                with pytest.raises(anyio.WouldBlock):
                    stream.receive_nowait()
            assert all(isinstance(e, TopicEvent) for e in got)
            assert [e.seq for e in got if isinstance(e, TopicEvent)] == [2, 3, 4, 6]
            deleted, saved, summary, forgotten = [e.data for e in got if isinstance(e, TopicEvent)]
            assert deleted == MemoryDeleted(deleted={"facts": 1, "summary": 0, "sessions": 0})
            assert isinstance(saved, FactSaved) and saved.created is True
            assert (saved.fact["category"], saved.fact["key"], saved.fact["value"]) == (
                "drinks",
                "coffee",
                "dark roast",
            )
            assert isinstance(summary, SummaryChanged) and summary.summary == "likes coffee"
            assert forgotten == FactForgotten(category="food", key="lunch", reason="forgotten")
            page = await client.memory_changes()
            assert [decode_topic_event(frame) for frame in page["changes"]] == got


def test_a_topic_event_of_a_type_or_topic_the_client_does_not_know_is_still_delivered():
    stamp = {"seq": 9, "ts": "2026-11-28T00:00:00Z"}
    newer = decode_topic_event({"type": "fact_renamed", "topic": "memory", "x": 1, **stamp})
    assert (newer.type, newer.data) == ("fact_renamed", UnknownEvent("fact_renamed", {"x": 1}))
    changed = {"type": "fact_saved", "topic": "memory", "fact": "not an object", **stamp}
    assert decode_topic_event(changed).data == UnknownEvent("fact_saved", {"fact": "not an object"})
    other = decode_topic_event({"type": "fact_saved", "topic": "notes", "created": True, **stamp})
    assert other.data == UnknownEvent("fact_saved", {"created": True})


async def test_a_topic_resumed_beyond_its_log_says_reset_and_an_unknown_one_is_not_found(
    tmp_path,
):
    with trio.fail_after(WAIT):
        async with running_node(tmp_path) as node, open_client(node.url, ALICE) as client:
            async with client.subscribe("memory", after_seq=10_000) as stream:
                reset = await stream.receive()
                assert reset == TopicReset("memory", 0)
                await client.put_fact("drinks", "tea", "green")
                event = await stream.receive()
                assert isinstance(event, TopicEvent) and event.type == "fact_saved"
            with pytest.raises(NotFound) as missing:
                async with client.subscribe("no-such-topic"):
                    pass
            assert missing.value.code == "not_found"
