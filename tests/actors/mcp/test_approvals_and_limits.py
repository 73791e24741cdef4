"""An MCP tool that needs approval in a turn (asked, approved, run; denied, not run), a
precheck that refuses before anybody is asked, the concurrency limit, and what /mcp answers
to the methods it does not serve."""

from __future__ import annotations

import json

import httpx2
import trio
from trio_websocket import open_websocket_url

from tests.actors.mcp.conftest import (
    ALICE,
    MISBEHAVING,
    mcp_node,
    mcp_server,
    session_key,
)
from tests.support.node import Client
from tests.support.polling import eventually
from turnstile.actors.mcp import McpServerConfig


async def test_a_turns_call_of_an_approve_tool_waits_for_a_person(tmp_path):
    servers = {"misb": McpServerConfig(command=MISBEHAVING, users=["alice"])}
    async with mcp_node(tmp_path, servers, serve=True) as node:
        session = await node.directory.create_session("alice", session_id="ask")
        url = node.url.replace("http://", "ws://") + "/ws"
        headers = [(b"authorization", f"Bearer {ALICE}".encode())]
        async with open_websocket_url(url, extra_headers=headers) as ws:
            client = Client(ws)
            await client.send(type="attach", session_id=session.id)
            await client.expect("attached")
            # add_tool has no annotations: APPROVE; approved, it runs
            content = '/call misb.add_tool {"name": "approved_one"}'
            await client.send(type="send", session_id=session.id, content=content)
            asked = await client.expect("approval_required", tool="misb.add_tool")
            assert asked["arguments"] == {"name": "approved_one"}
            await client.send(
                type="approve", session_id=session.id, approval_id=asked["approval_id"]
            )
            done = await client.expect("tool_call", tool="misb.add_tool")
            assert done["ok"] is True and done["result"] == {"text": "added"}
            await client.expect("stream_end")
            # denied, it does not
            content = '/call misb.add_tool {"name": "denied_one"}'
            await client.send(type="send", session_id=session.id, content=content)
            asked = await client.expect("approval_required", tool="misb.add_tool")
            await client.send(type="deny", session_id=session.id, approval_id=asked["approval_id"])
            refused = await client.expect("tool_call", tool="misb.add_tool")
            assert refused["ok"] is False and refused["error"]["code"] == "denied"
            await client.expect("stream_end")
            # bad arguments are refused before anybody is asked
            content = '/call misb.add_tool {"name": 5}'
            await client.send(type="send", session_id=session.id, content=content)
            bad = await client.expect("tool_call", tool="misb.add_tool")
            assert bad["error"]["code"] == "bad_arguments"
            await client.expect("stream_end")
            assert not [f for f in client.frames[-6:] if f["type"] == "approval_required"]
        server = mcp_server(node, "misb")
        await eventually(lambda: _listed(node, "misb.approved_one"))
        assert "misb.denied_one" not in node.tools.names()
        assert server.starts == 1


async def _listed(node, name: str) -> bool:
    await trio.lowlevel.checkpoint()
    return name in node.tools.names()


async def test_calls_past_max_concurrency_wait_their_turn(tmp_path):
    servers = {"misb": McpServerConfig(command=MISBEHAVING, max_concurrency=1, call_timeout=600)}
    async with mcp_node(tmp_path, servers) as node:
        key = await session_key(node)
        limiter = mcp_server(node, "misb")._limiter
        echoed: list = []
        async with trio.open_nursery() as nursery:
            hanging = trio.CancelScope()

            async def hang() -> None:
                with hanging:
                    await node.tools.call(key, "alice", "misb.hang", {})

            async def echo() -> None:
                echoed.append(await node.tools.call(key, "alice", "misb.echo", {"text": "x"}))

            async def holding() -> bool:  # the store and the server are threads and pipes
                await trio.lowlevel.checkpoint()
                return limiter.statistics().borrowed_tokens == 1

            async def queued() -> bool:
                await trio.lowlevel.checkpoint()
                return limiter.statistics().tasks_waiting == 1

            nursery.start_soon(hang)
            await eventually(holding)  # the hanging call holds the one slot
            nursery.start_soon(echo)
            await eventually(queued)
            assert echoed == []  # it waits while the hanging call holds the one slot
            hanging.cancel()
        assert echoed[0].data == {"text": "x"}


async def test_mcp_serves_post_only(tmp_path):
    async with mcp_node(tmp_path, {}, serve=True) as node:
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with httpx2.AsyncClient(headers=headers) as http:
            for method in ("GET", "DELETE"):
                answer = await http.request(method, f"{node.url}/mcp")
                assert answer.status_code == 405, answer.text
            listed = await http.post(
                f"{node.url}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={
                    "Accept": "application/json, text/event-stream",
                    "MCP-Protocol-Version": "2025-11-25",
                },
            )
            assert listed.status_code == 200, listed.text
            names = [tool["name"] for tool in json.loads(listed.text)["result"]["tools"]]
            assert "send_message" in names


async def test_what_mcp_refuses_it_answers_in_the_apis_error_shape(tmp_path):
    async with mcp_node(tmp_path, {}, serve=True) as node:
        headers = {"Authorization": f"Bearer {ALICE}", "MCP-Protocol-Version": "2025-11-25"}
        accept = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(headers=headers) as http:
            not_jsonrpc = await http.post(f"{node.url}/mcp", json={}, headers=accept)
            assert not_jsonrpc.status_code == 400
            error = not_jsonrpc.json()["error"]
            assert error["code"] == "bad_message"
            assert error["message"].startswith("Validation error")
            text = await http.post(
                f"{node.url}/mcp", content=b"x", headers={**accept, "Content-Type": "text/plain"}
            )
            assert text.status_code in (400, 415)
            assert text.json()["error"]["code"] == "bad_message"
            unacceptable = await http.post(
                f"{node.url}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Accept": "text/html"},
            )
            assert unacceptable.status_code == 406
            assert unacceptable.json()["error"]["code"] == "bad_message"
