"""Sessions end to end: a real node, real WebSocket clients, real HTTP."""

from __future__ import annotations

import json

import pytest
import trio
from trio_websocket import ConnectionClosed

from tests.support.node import ALICE, BOB, connect, new_session, running_node
from turnstile.actors.sessions.agents import ScriptedAgent


def turns(events: list[dict]) -> list[tuple[str, int]]:
    """(kind, input_id) for every stream_start / stream_end, in order."""
    return [
        (e["type"], e["input_id"]) for e in events if e["type"] in ("stream_start", "stream_end")
    ]


async def test_a_message_streams_a_turn_and_lands_in_history(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            attached = await client.expect("attached", session_id="s1")
            assert attached["last_seq"] == 0
            await client.expect("session_sync", busy=False, policy="enqueue")
            await client.send(
                type="send", session_id="s1", content="hello there", client_msg_id="m1"
            )
            ack = await client.expect("ack", client_msg_id="m1")
            start = await client.expect("stream_start", input_id=ack["input_id"])
            assert (start["source"], start["content"]) == ("user", "hello there")
            end = await client.expect("stream_end", input_id=ack["input_id"])
            assert (end["status"], end["text"]) == ("completed", "You said: hello there")
            deltas = [e["text"] for e in client.events("s1") if e["type"] == "stream_delta"]
            assert "".join(deltas) == "You said: hello there"
            seqs = [e["seq"] for e in client.events("s1")]
            assert seqs == list(range(1, len(seqs) + 1))  # gap-free, increasing
        async with node.http() as http:
            history = (await http.get("/sessions/s1/history")).json()["history"]
    assert history == [
        {"role": "user", "content": "hello there", "source": "user"},
        {"role": "assistant", "content": "You said: hello there", "status": "completed"},
    ]


async def test_concurrent_senders_never_overlap_turns_and_keep_each_senders_order(tmp_path):
    async with running_node(tmp_path, agent=ScriptedAgent()) as node:
        await new_session(node, "busy")
        async with connect(node) as watcher:
            await watcher.send(type="attach", session_id="busy")
            await watcher.expect("session_sync")
            acked: dict[int, list[int]] = {}

            async def sender(n: int) -> None:
                async with connect(node) as client:
                    acked[n] = []
                    for i in range(8):
                        await client.send(
                            type="send",
                            session_id="busy",
                            content=f"c{n}-{i}",
                            client_msg_id=f"{n}-{i}",
                        )
                        acked[n].append(
                            (await client.expect("ack", client_msg_id=f"{n}-{i}"))["input_id"]
                        )

            async with trio.open_nursery() as nursery:
                for n in range(5):
                    nursery.start_soon(sender, n)
            last = max(i for ids in acked.values() for i in ids)
            await watcher.expect("stream_end", input_id=last)
        events = watcher.events("busy")
    marks = turns(events)
    assert len(marks) == 80
    for k in range(0, 80, 2):  # start, end, start, end: never two starts in a row
        assert marks[k][0] == "stream_start" and marks[k + 1] == ("stream_end", marks[k][1])
    started = [input_id for kind, input_id in marks if kind == "stream_start"]
    assert started == sorted(started)  # arrival (inbox) order
    for ids in acked.values():
        assert ids == sorted(ids)
        contents = [
            e["content"] for e in events if e["type"] == "stream_start" and e["input_id"] in ids
        ]
        assert contents == sorted(contents, key=lambda c: int(c.split("-")[1]))


async def test_stop_cancels_the_running_turn_which_closes_as_stopped(tmp_path, gated):
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s")
            await client.send(type="send", session_id="s", content="wait:forever")
            first = (await client.expect("stream_start"))["input_id"]
            await client.send(type="send", session_id="s", content="next")
            await client.send(type="stop", session_id="s")
            assert (await client.expect("stopping"))["running"] is True
            end = await client.expect("stream_end", input_id=first)
            assert end["status"] == "stopped"
            queued = await client.expect("stream_end", status="completed")
            assert queued["text"] == "reply:next"  # stop ends the turn, not the queue


async def test_the_session_list_says_which_sessions_run_a_turn_and_how_many_inputs_wait(
    tmp_path, gated
):
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "busy")
        await new_session(node, "quiet")
        async with connect(node) as client, node.http() as http:
            await client.send(type="attach", session_id="busy")
            await client.send(type="send", session_id="busy", content="wait:a")
            await client.expect("stream_start")
            for text in ("b", "c"):
                await client.send(type="send", session_id="busy", content=text)
                await client.expect("turn_queued", source="user", ahead=1 if text == "b" else 2)

            async def listed() -> dict[str, tuple[str, int]]:
                sessions = (await http.get("/sessions")).json()["sessions"]
                return {s["id"]: (s["status"], s["queued"]) for s in sessions}

            assert await listed() == {"busy": ("running", 2), "quiet": ("idle", 0)}
            gated.gate("wait:a").set()
            await client.expect("stream_end", text="reply:c")


async def test_policy_reject_refuses_messages_during_a_turn(tmp_path, gated):
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s", policy="reject")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s")
            await client.send(type="send", session_id="s", content="wait:a")
            await client.expect("stream_start")
            await client.send(type="send", session_id="s", content="refused", client_msg_id="r")
            error = await client.expect("error", session_id="s")
            assert (error["code"], error["message"]) == (
                "busy",
                "session is busy with a turn and its policy is reject",
            )
            gated.gate("wait:a").set()
            await client.expect("stream_end", status="completed")
            await client.send(type="send", session_id="s", content="accepted", client_msg_id="ok")
            await client.expect("ack", client_msg_id="ok")
            assert (await client.expect("stream_end"))["text"] == "reply:accepted"


async def test_policy_interrupt_closes_the_running_turn_then_runs_the_new_message(tmp_path, gated):
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s")
            await client.send(type="set_policy", session_id="s", policy="interrupt")
            await client.expect("policy", policy="interrupt")
            await client.send(type="send", session_id="s", content="wait:long")
            first = (await client.expect("stream_start"))["input_id"]
            await client.send(type="send", session_id="s", content="urgent")
            assert (await client.expect("stream_end", input_id=first))["status"] == "interrupted"
            end = await client.expect("stream_end")
            assert (end["status"], end["text"]) == ("completed", "reply:urgent")


async def test_policy_inject_folds_the_message_into_the_running_turn(tmp_path, gated):
    async with running_node(tmp_path, agent=gated) as node:
        await new_session(node, "s", policy="inject")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s")
            await client.send(type="send", session_id="s", content="wait:x")
            first = (await client.expect("stream_start"))["input_id"]
            await client.send(type="send", session_id="s", content="also this", client_msg_id="i")
            ack = await client.expect("ack", client_msg_id="i")
            assert ack.get("injected") is True and "input_id" not in ack
            await client.expect("user_message", content="also this", injected_into=first)
            gated.gate("wait:x").set()
            end = await client.expect("stream_end", input_id=first)
            assert end["text"] == "reply:wait:x +also this"
        async with node.http() as http:
            history = (await http.get("/sessions/s/history")).json()["history"]
    assert [h["content"] for h in history] == ["wait:x", "also this", "reply:wait:x +also this"]


async def test_two_clients_on_one_session_see_the_same_events_in_the_same_order(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "shared")
        async with connect(node) as a, connect(node) as b:
            for client in (a, b):
                await client.send(type="attach", session_id="shared")
                await client.expect("session_sync")
            await a.send(type="send", session_id="shared", content="from a", client_msg_id="a")
            await b.send(type="send", session_id="shared", content="from b", client_msg_id="b")
            for client in (a, b):
                await client.expect("stream_end", text="You said: from a")
                await client.expect("stream_end", text="You said: from b")
            assert a.events("shared") == b.events("shared")
            assert len(a.events("shared")) > 6


async def test_reconnect_with_after_seq_replays_exactly_what_was_missed(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "r")
        async with connect(node) as client:
            await client.send(type="attach", session_id="r")
            await client.send(type="send", session_id="r", content="one")
            await client.expect("stream_end")
            seen = client.events("r")[-1]["seq"]
        async with node.http() as http:  # turns happen while the client is away
            for text in ("two", "three"):
                assert (
                    await http.post("/sessions/r/messages", json={"content": text})
                ).status_code == 202
        async with connect(node) as client:
            await client.send(type="attach", session_id="r", after_seq=seen)
            await client.expect("stream_end", text="You said: three")
            replayed = client.events("r")
            async with node.http() as http:
                stored = (await http.get("/sessions/r/events", params={"after_seq": seen})).json()[
                    "events"
                ]
            assert [e["seq"] for e in replayed] == list(range(seen + 1, seen + 1 + len(replayed)))
            assert replayed == stored[: len(replayed)]
            # and it is live afterwards
            await client.send(type="send", session_id="r", content="four")
            await client.expect("stream_end", text="You said: four")


async def test_a_user_never_sees_another_users_session(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "alices", token=ALICE)
        async with node.http(BOB) as bob:
            for method, path in [
                ("GET", "/sessions/alices"),
                ("GET", "/sessions/alices/history"),
                ("GET", "/sessions/alices/events"),
                ("POST", "/sessions/alices/messages"),
                ("POST", "/sessions/alices/stop"),
                ("DELETE", "/sessions/alices"),
            ]:
                response = await bob.request(
                    method, path, json={"content": "x"} if method == "POST" else None
                )
                assert response.status_code == 404, (method, path)
                assert response.json() == {
                    "error": {"code": "not_found", "message": "no session with id 'alices'"}
                }
            assert (await bob.get("/sessions")).json() == {"sessions": []}
        async with connect(node, BOB) as client:
            await client.send(type="attach", session_id="alices")
            error = await client.expect("error")
            assert (error["code"], error["message"]) == ("not_found", "no session with id 'alices'")
            await client.send(type="send", session_id="alices", content="hi")
            assert (await client.expect("error"))["code"] == "not_found"
            await client.send(
                type="call", id="c", session_id="alices", tool="echo", arguments={"text": "x"}
            )
            assert (await client.expect("error", id="c"))["code"] == "not_found"
        async with node.http("wrong-token-xxxxxxxx") as stranger:
            response = await stranger.get("/sessions")
            assert response.status_code == 401
            assert response.json()["error"] == {"code": "unauthorized", "message": "invalid token"}
        async with connect(node, token="") as anonymous:
            error = await anonymous.expect("error")
            assert (error["code"], error["message"]) == ("unauthorized", "missing bearer token")


async def test_websocket_from_a_foreign_origin_is_refused(tmp_path):
    async with running_node(tmp_path, allowed_origins=["https://app.example"]) as node:
        async with connect(node, origin="https://evil.example") as client:
            error = await client.expect("error")
            assert (error["code"], error["message"]) == ("unauthorized", "origin not allowed")
        async with connect(node, origin="https://app.example") as client:
            await new_session(node, "o")
            await client.send(type="attach", session_id="o")
            await client.expect("attached")


async def test_malformed_frames_get_typed_errors_and_the_connection_keeps_working(tmp_path):
    async with running_node(tmp_path, limits=_small_frames()) as node:
        await new_session(node, "m")
        async with connect(node) as client:
            cases = [
                ("{not json", "bad_message", None),
                ('{"type":"teleport","session_id":"m"}', "bad_message", "$.type"),
                ('{"type":"send","session_id":"m"}', "bad_message", "$.content"),
                ('{"type":"send","session_id":5,"content":"x"}', "bad_message", "$.session_id"),
                ('{"type":"attach","session_id":"m","after_seq":-1}', "bad_message", "$.after_seq"),
                (
                    '{"type":"send","session_id":"m","content":"x","extra":1}',
                    "bad_message",
                    "$.extra",
                ),
                (
                    '{"type":"set_policy","session_id":"m","policy":"yolo"}',
                    "invalid_argument",
                    "policy",
                ),
                (
                    json.dumps({"type": "send", "session_id": "m", "content": "x" * 101}),
                    "invalid_argument",
                    "content",
                ),
            ]
            for raw, code, field in cases:
                await client.send_raw(raw)
                error = await client.expect("error")
                assert (error["code"], error.get("field")) == (code, field), raw
            await client.send(type="send", session_id="m", content="still fine", client_msg_id="ok")
            await client.expect("ack", client_msg_id="ok")
        async with connect(node) as client:  # a frame past the limit closes the connection
            await client.send(type="send", session_id="m", content="x" * 3000)
            with pytest.raises(ConnectionClosed) as closed:
                await client.expect("ack")
            assert closed.value.reason.code == 1009
        async with node.http() as http:
            response = await http.post("/sessions/m/messages", content=b"[1,2]")
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "bad_message"
            response = await http.post("/sessions", json={"id": "bad id!"})
            assert response.status_code == 400 and response.json()["error"]["field"] == "$.id"


def _small_frames():
    from turnstile.actors.config import Limits

    return Limits(max_frame_bytes=2048, max_content_chars=100)


async def test_limits_sessions_per_user_and_queued_inputs(tmp_path, gated):
    from turnstile.actors.config import Limits

    async with running_node(
        tmp_path, agent=gated, limits=Limits(max_sessions_per_user=2, max_queued_inputs=2)
    ) as node:
        await new_session(node, "one")
        await new_session(node, "two")
        async with node.http() as http:
            response = await http.post("/sessions", json={"id": "three"})
            assert response.status_code == 429
            assert (
                response.json()["error"]["message"]
                == "user 'alice' already has 2 sessions (limit 2)"
            )
            assert (
                await http.post("/sessions/one/messages", json={"content": "wait:a"})
            ).status_code == 202
            for _ in range(2):
                assert (
                    await http.post("/sessions/one/messages", json={"content": "q"})
                ).status_code == 202
            response = await http.post("/sessions/one/messages", json={"content": "q"})
            assert response.status_code == 429
            assert response.json()["error"]["code"] == "limit_exceeded"
            gated.gate("wait:a").set()


async def test_call_runs_a_tool_and_answers_with_result(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "t")
        async with connect(node) as client:
            await client.send(
                type="call", id="1", session_id="t", tool="echo", arguments={"text": "hi"}
            )
            assert await client.expect("result", id="1") == {
                "type": "result",
                "id": "1",
                "ok": True,
                "data": {"text": "hi"},
            }
            await client.send(type="call", id="2", session_id="t", tool="nope")
            result = await client.expect("result", id="2")
            assert result["error"] == {"code": "unknown_tool", "message": "no tool named 'nope'"}
            await client.send(type="attach", session_id="t")
            await client.send(
                type="send", session_id="t", content='/call echo {"text": "via agent"}'
            )
            await client.expect("tool_started", tool="echo")
            call = await client.expect("tool_call", tool="echo")
            assert call["ok"] is True and call["result"] == {"text": "via agent"}
            end = await client.expect("stream_end")
            assert end["text"] == 'echo returned {"text": "via agent"}'


async def test_a_failing_agent_closes_the_turn_with_a_short_message(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "f")
        async with connect(node) as client:
            await client.send(type="attach", session_id="f")
            await client.send(type="send", session_id="f", content="/fail model exploded")
            end = await client.expect("stream_end")
            assert (end["status"], end["error"], end["text"]) == ("failed", "model exploded", "")
            await client.send(type="send", session_id="f", content="")
            assert (await client.expect("stream_end", status="empty"))["text"] == ""


async def test_deleting_a_session_removes_it(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "d")
        async with node.http() as http:
            await http.post("/sessions/d/messages", json={"content": "hi"})
            assert (await http.delete("/sessions/d")).status_code == 204
            assert (await http.get("/sessions/d")).status_code == 404
            assert (await http.get("/healthz")).json()["status"] == "ok"
            metrics = (await http.get("/metrics")).text
            assert "turnstile_sessions_created_total 1.0" in metrics.splitlines()


async def test_a_burst_of_events_reaches_the_client_whole_in_few_socket_writes(
    tmp_path, monkeypatch
):
    """Events a turn streams faster than the store commits are stored and written in batches;
    the client still gets each as its own frame, in order, none missing."""
    from hypercorn.trio.tcp_server import TCPServer

    writes: list[int] = []
    original = TCPServer.protocol_send

    async def counting(self, event):
        if isinstance(getattr(event, "data", None), bytes):
            writes.append(len(event.data))
        await original(self, event)

    monkeypatch.setattr(TCPServer, "protocol_send", counting)
    async with running_node(tmp_path) as node:
        deltas = await streamed_reply(node, 300, before_send=writes.clear)
    assert len(deltas) == 302
    assert len(writes) <= 10  # for 305 frames (ack, turn_queued, start, deltas, end)


async def streamed_reply(node, words: int, before_send=None) -> list[str]:
    """Send a message of ``words`` words to a new session and check the streamed reply: all of
    it, in order, gap-free. Returns its deltas."""
    text = " ".join(f"w{i}" for i in range(words))
    await new_session(node, "s1")
    async with connect(node) as client:
        await client.send(type="attach", session_id="s1")
        await client.expect("session_sync")
        if before_send is not None:
            before_send()
        await client.send(type="send", session_id="s1", content=text, client_msg_id="m")
        end = await client.expect("stream_end")
        events = client.events("s1")
        deltas = [e["text"] for e in events if e["type"] == "stream_delta"]
        assert "".join(deltas) == end["text"] == f"You said: {text}"
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        return deltas


async def test_under_a_plain_asgi_server_each_event_is_its_own_send(tmp_path, monkeypatch):
    """Without the server's send-many message type the gateway falls back to one
    websocket.send per frame, and the client sees the same stream."""
    from turnstile.actors import node as node_module

    monkeypatch.setattr(node_module, "WS_SEND_MANY", None)
    async with running_node(tmp_path) as node:
        assert len(await streamed_reply(node, 40)) == 42
