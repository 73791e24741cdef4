"""Idempotent ingress end to end: a real node, real WebSocket clients, real HTTP.

A client that does not know whether its message arrived (the connection dropped, a request
timed out) sends it again with the same id: ``client_msg_id`` on the WebSocket, the
``Idempotency-Key`` header (or ``client_msg_id``) over HTTP. It gets the first answer again and
the session runs one turn, however often and however concurrently the message is resent, and
across a restart of the node.
"""

from __future__ import annotations

import trio

from tests.support.node import connect, new_session, running_node

KEY = {"Idempotency-Key": "order-7f3a"}


def turn_events(events: list[dict], kind: str) -> list[int]:
    """The ``input_id`` of every event of ``kind`` (one per turn, for the stream markers)."""
    return [e["input_id"] for e in events if e["type"] == kind]


async def read_events(node, session_id: str) -> list[dict]:
    async with node.http() as http:
        response = await http.get(f"/sessions/{session_id}/events")
        assert response.status_code == 200, response.text
        return response.json()["events"]


async def test_a_resend_after_a_reconnect_gets_the_first_ack_and_runs_one_turn(tmp_path, gated):
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s")
        send = {"type": "send", "session_id": "s", "content": "wait:pay", "client_msg_id": "m1"}
        async with connect(node) as client:
            await client.send(**send)
            ack = await client.expect("ack", client_msg_id="m1")
        # The connection dropped while the turn runs; the client cannot tell whether its
        # message was stored, so it reconnects and sends it again.
        async with connect(node) as client:
            await client.send(type="attach", session_id="s", after_seq=0)
            await client.expect("session_sync")
            await client.send(**send)
            again = await client.expect("ack", client_msg_id="m1")
            assert again == ack  # the same frame: same input id, nothing more
            gated.gate("wait:pay").set()
            await client.expect("stream_end", input_id=ack["input_id"])
            # Once the turn is over, a late resend still answers the same ack ...
            await client.send(**send)
            assert await client.expect("ack", client_msg_id="m1") == ack
            # ... and the next message runs next: nothing was queued in between.
            await client.send(type="send", session_id="s", content="after", client_msg_id="m2")
            after = await client.expect("ack", client_msg_id="m2")
            await client.expect("stream_end", input_id=after["input_id"])
            streamed = client.events("s")
        assert turn_events(streamed, "turn_queued") == [ack["input_id"], after["input_id"]]
        assert turn_events(streamed, "stream_start") == [ack["input_id"], after["input_id"]]
        assert turn_events(streamed, "stream_end") == [ack["input_id"], after["input_id"]]
        assert gated.running == ["wait:pay", "after"]


async def test_a_send_whose_ack_never_arrived_is_stored_once_when_resent(tmp_path, gated):
    """The client closes right after sending, before any ack: the first send may or may not
    have been stored. Either way the resend's ack names the one input, and one turn runs."""
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s")
        send = {"type": "send", "session_id": "s", "content": "hi", "client_msg_id": "m1"}
        async with connect(node) as client:
            await client.send(**send)
        async with connect(node) as client:
            await client.send(type="attach", session_id="s", after_seq=0)
            await client.send(**send)
            ack = await client.expect("ack", client_msg_id="m1")
            await client.expect("stream_end", input_id=ack["input_id"])
            await client.send(type="send", session_id="s", content="next", client_msg_id="m2")
            following = (await client.expect("ack", client_msg_id="m2"))["input_id"]
            await client.expect("stream_end", input_id=following)
        events = await read_events(node, "s")
        assert turn_events(events, "stream_start") == [ack["input_id"], following]
        assert gated.running == ["hi", "next"]


async def test_a_resend_is_answered_as_then_whatever_the_session_s_policy_says_now(tmp_path, gated):
    """Under ``reject`` a resend of the running turn's message is its ack, not ``busy``; under
    ``inject`` a resend of a folded-in message is folded in once."""
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "r", policy="reject")
        await new_session(node, "i", policy="inject")
        async with connect(node) as client:
            await client.send(type="attach", session_id="r")
            await client.send(type="send", session_id="r", content="wait:r", client_msg_id="a")
            ack = await client.expect("ack", client_msg_id="a")
            await client.expect("stream_start", session_id="r")
            await client.send(type="send", session_id="r", content="wait:r", client_msg_id="a")
            assert await client.expect("ack", client_msg_id="a") == ack
            await client.send(type="send", session_id="r", content="new", client_msg_id="b")
            assert (await client.expect("error", session_id="r"))["code"] == "busy"
            gated.gate("wait:r").set()
            await client.expect("stream_end", session_id="r")

            await client.send(type="attach", session_id="i")
            await client.send(type="send", session_id="i", content="wait:i")
            first = (await client.expect("stream_start", session_id="i"))["input_id"]
            note = {"type": "send", "session_id": "i", "content": "fyi", "client_msg_id": "n"}
            await client.send(**note)
            folded = await client.expect("ack", client_msg_id="n")
            assert folded == {
                "type": "ack",
                "session_id": "i",
                "client_msg_id": "n",
                "injected": True,
            }
            await client.send(**note)
            assert await client.expect("ack", client_msg_id="n") == folded
            gated.gate("wait:i").set()
            end = await client.expect("stream_end", input_id=first)
            assert end["text"] == "reply:wait:i +fyi"  # folded in once
        events = await read_events(node, "i")
        assert [e["content"] for e in events if e["type"] == "user_message"] == ["fyi"]
        assert turn_events(events, "stream_start") == [first]


async def test_http_idempotency_key_answers_the_first_post_and_runs_one_turn(tmp_path, gated):
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s")
        async with connect(node) as watcher, node.http() as http:
            await watcher.send(type="attach", session_id="s")
            await watcher.expect("session_sync")
            post = {"json": {"content": "wait:hi"}, "headers": KEY}
            first = await http.post("/sessions/s/messages", **post)
            assert first.status_code == 202, first.text
            assert "idempotent-replayed" not in first.headers
            again = await http.post("/sessions/s/messages", **post)
            assert (again.status_code, again.json()) == (202, first.json())
            assert again.headers["idempotent-replayed"] == "true"
            input_id = first.json()["input_id"]

            # The same key with another message: a conflict naming the header; nothing stored.
            other = await http.post("/sessions/s/messages", json={"content": "bye"}, headers=KEY)
            assert other.status_code == 409
            assert other.json()["error"] == {
                "code": "idempotency_key_reused",
                "message": "Idempotency-Key 'order-7f3a' was already used for another message"
                " of this session; a resend must repeat the message exactly",
                "field": "Idempotency-Key",
            }
            # client_msg_id in the body is the same id as the header (and the WebSocket's).
            body_id = await http.post(
                "/sessions/s/messages", json={"content": "wait:hi", "client_msg_id": "order-7f3a"}
            )
            assert body_id.json() == {"input_id": input_id, "client_msg_id": "order-7f3a"}
            assert body_id.headers["idempotent-replayed"] == "true"
            await watcher.send(
                type="send", session_id="s", content="wait:hi", client_msg_id="order-7f3a"
            )
            assert (await watcher.expect("ack"))["input_id"] == input_id

            bad = await http.post(
                "/sessions/s/messages", json={"content": "hi"}, headers={"Idempotency-Key": "a b"}
            )
            assert (bad.status_code, bad.json()["error"]["field"]) == (400, "Idempotency-Key")
            assert bad.json()["error"]["code"] == "invalid_argument"
            both = await http.post(
                "/sessions/s/messages",
                json={"content": "hi", "client_msg_id": "x"},
                headers={"Idempotency-Key": "y"},
            )
            assert (both.status_code, both.json()["error"]["field"]) == (400, "Idempotency-Key")

            gated.gate("wait:hi").set()
            await watcher.expect("stream_end", input_id=input_id)
            await watcher.send(type="send", session_id="s", content="after", client_msg_id="z")
            await watcher.expect("stream_end", text="reply:after")
            streamed = watcher.events("s")
        assert len(turn_events(streamed, "turn_queued")) == 2  # "wait:hi" once, then "after"
        assert turn_events(streamed, "stream_start")[0] == input_id
        assert gated.running == ["wait:hi", "after"]


async def test_a_hundred_concurrent_duplicates_make_one_input_and_one_turn(tmp_path, gated):
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s")
        async with connect(node) as watcher:
            await watcher.send(type="attach", session_id="s")
            await watcher.expect("session_sync")
            answers: list[tuple[int, dict, str | None]] = []
            async with node.http() as http:

                async def post() -> None:
                    response = await http.post(
                        "/sessions/s/messages", json={"content": "wait:storm"}, headers=KEY
                    )
                    replayed = response.headers.get("idempotent-replayed")
                    answers.append((response.status_code, response.json(), replayed))

                async with trio.open_nursery() as nursery:
                    for _ in range(100):
                        nursery.start_soon(post)
            assert {status for status, _, _ in answers} == {202}
            assert len({body["input_id"] for _, body, _ in answers}) == 1
            assert (
                sorted(replayed or "first" for _, _, replayed in answers)
                == ["first"] + ["true"] * 99
            )
            input_id = answers[0][1]["input_id"]
            gated.gate("wait:storm").set()
            await watcher.expect("stream_end", input_id=input_id)
            await watcher.send(type="send", session_id="s", content="after", client_msg_id="z")
            await watcher.expect("stream_end", text="reply:after")
            streamed = watcher.events("s")
        assert len(turn_events(streamed, "turn_queued")) == 2
        assert turn_events(streamed, "stream_start")[0] == input_id
        assert gated.running == ["wait:storm", "after"]


async def test_the_dedupe_survives_a_restart_of_the_node(tmp_path, gated):
    send = {"type": "send", "session_id": "s", "content": "hi", "client_msg_id": "m1"}
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s")
            await client.send(**send)
            ack = await client.expect("ack", client_msg_id="m1")
            await client.expect("stream_end", input_id=ack["input_id"])
    async with running_node(tmp_path, agent=gated) as node:  # same store, a new process state
        async with connect(node) as client:
            await client.send(**send)
            assert await client.expect("ack", client_msg_id="m1") == ack
        async with node.http() as http:
            again = await http.post(
                "/sessions/s/messages", json={"content": "hi"}, headers={"Idempotency-Key": "m1"}
            )
            assert again.json()["input_id"] == ack["input_id"]
        events = await read_events(node, "s")
    assert turn_events(events, "turn_queued") == [ack["input_id"]]
    assert gated.running == ["hi"]
