"""One connection, many things at once: a call waiting for a person never stops the connection
from reading, a closed connection's calls are cancelled, and a deleted session says so."""

from __future__ import annotations

import functools

import trio

from tests.support.node import WAIT, Node, connect, new_session, running_node
from turnstile.actors import node as node_module
from turnstile.runtime.gateway import ConnectionLimits

POLICIES = {"echo": "APPROVE"}


async def connections_gauge(node: Node) -> float:
    async with node.http() as http:
        text = (await http.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith("turnstile_websocket_connections "):
            return float(line.split()[1])
    raise AssertionError("no turnstile_websocket_connections in /metrics")


async def until_gauge(node: Node, value: float) -> None:
    """Poll /metrics (bounded) until the connections gauge reads ``value``."""
    with trio.fail_after(WAIT):
        while await connections_gauge(node) != value:
            pass


async def test_a_call_waiting_for_approval_does_not_stop_the_connection(tmp_path):
    async with running_node(tmp_path, policies=POLICIES) as node:
        await new_session(node, "c")
        async with connect(node) as client:
            await client.send(type="attach", session_id="c")
            await client.expect("session_sync")
            await client.send(
                type="call", id="slow", session_id="c", tool="echo", arguments={"text": "hi"}
            )
            asked = await client.expect("approval_required", tool="echo")

            # the same connection still answers everything else
            await client.send(type="send", session_id="c", content="meanwhile", client_msg_id="m")
            ack = await client.expect("ack", client_msg_id="m")
            assert ack["input_id"] >= 1
            await client.send(type="call", id="quick", session_id="c", tool="clock.now")
            quick = await client.expect("result", id="quick")
            assert quick["ok"] is True and "utc" in quick["data"]

            # and the approve frame that releases the first call is read too
            await client.send(type="approve", session_id="c", approval_id=asked["approval_id"])
            decided = await client.expect("approval", approval_id=asked["approval_id"])
            assert decided["decision"] == "approved"
            slow = await client.expect("result", id="slow")
            assert slow == {"type": "result", "id": "slow", "ok": True, "data": {"text": "hi"}}


async def test_a_run_parallel_with_an_action_that_needs_approval_answers_at_once(tmp_path):
    """The action that needs approval comes back as requires_approval, not run and not asked
    (run_parallel waited for a person before, up to the approval timeout)."""
    async with running_node(tmp_path, policies=POLICIES) as node:
        await new_session(node, "c")
        async with connect(node) as client:
            await client.send(type="attach", session_id="c")
            await client.expect("session_sync")
            actions = [
                {"name": "echo", "params": {"text": "one"}},
                {"name": "clock.now", "params": {}},
            ]
            await client.send(
                type="call",
                id="par",
                session_id="c",
                tool="run_parallel",
                arguments={"actions": actions},
            )
            par = await client.expect("result", id="par")
            assert par["ok"] is True
            data = par["data"]
            assert (data["total"], data["succeeded"], data["requires_approval"]) == (2, 1, 1)
            assert data["results"][0]["requires_approval"] is True
            assert data["results"][0]["error"]["code"] == "requires_approval"
            assert data["results"][1]["success"] is True
            assert not [f for f in client.events("c") if f["type"] == "approval_required"]
            async with node.http() as http:
                assert (await http.get("/sessions/c/approvals")).json() == {"approvals": []}


async def test_a_closed_connection_cancels_its_calls_and_withdraws_their_approvals(tmp_path):
    async with running_node(tmp_path, policies=POLICIES) as node:
        await new_session(node, "c")
        async with connect(node) as observer:
            await observer.send(type="attach", session_id="c")
            await observer.expect("session_sync")
            await until_gauge(node, 1)

            async with connect(node) as doomed:
                for n in range(3):  # the 2nd and 3rd may or may not be read before the close
                    await doomed.send(
                        type="call",
                        id=f"d{n}",
                        session_id="c",
                        tool="echo",
                        arguments={"text": str(n)},
                    )
                await observer.expect("approval_required", tool="echo")
            # the client is gone: the gauge comes down at once, not when the approval times out
            await until_gauge(node, 1)

            async with node.http() as http:
                assert (await http.get("/sessions/c/approvals")).json() == {"approvals": []}
                # a marker after everything the closed connection could have raised
                posted = await http.post("/sessions/c/messages", json={"content": "marker"})
                assert posted.status_code == 202
            await observer.expect("stream_end", text="You said: marker")
            asked = [
                f["approval_id"] for f in observer.events("c") if f["type"] == "approval_required"
            ]
            resolved = {
                f["approval_id"]: f["decision"]
                for f in observer.events("c")
                if f["type"] == "approval_resolved"
            }
            assert 1 <= len(asked) <= 3
            assert resolved == {approval_id: "cancelled" for approval_id in asked}


async def test_calls_in_flight_on_one_connection_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(
        node_module, "ConnectionLimits", functools.partial(ConnectionLimits, max_inflight_calls=2)
    )
    async with running_node(tmp_path, policies=POLICIES) as node:
        await new_session(node, "c")
        async with connect(node) as client:
            await client.send(type="attach", session_id="c")
            await client.expect("session_sync")
            for n in range(2):
                await client.send(
                    type="call", id=f"w{n}", session_id="c", tool="echo", arguments={"text": str(n)}
                )
                await client.expect("approval_required", tool="echo")
            await client.send(type="call", id="w0", session_id="c", tool="clock.now")
            same = await client.expect("error", id="w0")
            assert same["code"] == "invalid_argument" and same["field"] == "id"
            await client.send(type="call", id="over", session_id="c", tool="clock.now")
            over = await client.expect("error", id="over")
            assert over == {
                "type": "error",
                "code": "limit_exceeded",
                "message": "at most 2 calls may be in flight on one connection",
                "session_id": "c",
                "id": "over",
            }
            async with node.http() as http:
                (first, _) = (await http.get("/sessions/c/approvals")).json()["approvals"]
                await http.post(f"/approvals/{first['approval_id']}/deny")
            assert (await client.expect("result"))["ok"] is False  # denied: room for one more
            await client.send(type="call", id="then", session_id="c", tool="clock.now")
            assert (await client.expect("result", id="then"))["ok"] is True


async def test_a_deleted_session_tells_its_attached_clients(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "gone")
        async with connect(node) as client:
            await client.send(type="attach", session_id="gone")
            await client.expect("session_sync")
            await client.send(type="send", session_id="gone", content="hi")
            end = await client.expect("stream_end")
            async with node.http() as http:
                assert (await http.delete("/sessions/gone")).status_code == 204
            deleted = await client.expect(lambda f: f["type"] in ("session_deleted", "error"))
            assert deleted == {
                "type": "session_deleted",
                "session_id": "gone",
                "last_seq": end["seq"],
            }
            # the connection is no longer attached: detaching from a gone session is quiet
            await client.send(type="detach", session_id="gone")
            await client.expect("detached", session_id="gone")
