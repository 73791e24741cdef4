"""Tools from a real MCP server nobody here wrote: ``mcp-server-time`` over stdio, through
everything a tool goes through (registry, policies, validation, a turn's call)."""

from __future__ import annotations

import os

import msgspec

from tests.actors.mcp.conftest import (
    ALICE,
    TOKENS,
    installed,
    mcp_node,
    mcp_server,
    session_key,
)
from tests.support.fake_openai import check_parameters
from tests.support.node import Client
from turnstile.actors.config import Config, ExecutionConfig
from turnstile.actors.mcp import McpConfig, McpServerConfig
from turnstile.actors.node import open_node
from turnstile.tools.policy import Policy


def time_server(**options) -> dict[str, McpServerConfig]:
    command = [installed("mcp-server-time"), "--local-timezone", "UTC"]
    return {"time": McpServerConfig(command=command, **options)}


async def test_its_tools_join_the_registry_and_answer(tmp_path):
    async with mcp_node(tmp_path, time_server()) as node:
        names = [n for n in node.tools.names() if n.startswith("time.")]
        assert names == ["time.convert_time", "time.get_current_time"]
        # read-only by the server's annotations: AUTO
        assert node.tools.policy_of("time.get_current_time") is Policy.AUTO
        spec = next(s for s in node.tools.specs() if s.name == "time.get_current_time")
        assert spec.description.startswith("[MCP server time] Get current time")
        check_parameters(spec.parameters)  # what a model server accepts
        key = await session_key(node)
        args = {"timezone": "Europe/Paris"}
        result = await node.tools.call(key, "alice", "time.get_current_time", args)
        assert result.ok, result.error
        assert result.data["structured"]["timezone"] == "Europe/Paris"
        assert "text" not in result.data  # the same JSON as the structured content: once
        converted = await node.tools.call(
            key,
            "alice",
            "time.convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
        )
        assert converted.data["structured"]["target"]["datetime"].endswith("T21:00:00+09:00")


async def test_bad_arguments_are_refused_before_the_server_sees_them(tmp_path):
    async with mcp_node(tmp_path, time_server()) as node:
        key = await session_key(node)
        wrong = await node.tools.call(key, "alice", "time.get_current_time", {"timezone": 3})
        assert wrong.error == {
            "code": "bad_arguments",
            "message": "3 is not of type 'string' at $.timezone",
            "field": "$.timezone",
        }
        missing = await node.tools.call(key, "alice", "time.get_current_time", {})
        assert missing.error["code"] == "bad_arguments"
        assert missing.error["message"] == "'timezone' is a required property at $"
        # the server's own refusal is the tool's error
        nowhere = await node.tools.call(
            key, "alice", "time.get_current_time", {"timezone": "Nowhere/Else"}
        )
        assert nowhere.error["code"] == "tool_error"
        assert "Invalid timezone" in nowhere.error["message"]


async def test_policies_override_the_annotations(tmp_path):
    policies = {"time.*": "APPROVE", "time.convert_time": "BLOCK"}
    async with mcp_node(tmp_path, time_server(), policies=policies) as node:
        assert node.tools.policy_of("time.get_current_time") is Policy.APPROVE
        key = await session_key(node)
        blocked = await node.tools.call(
            key,
            "alice",
            "time.convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "UTC"},
        )
        assert blocked.error["code"] == "blocked"


async def test_a_turn_calls_it_and_the_stream_shows_the_call(tmp_path):
    from trio_websocket import open_websocket_url

    async with mcp_node(tmp_path, time_server(), serve=True) as node:
        url = node.url.replace("http://", "ws://") + "/ws"
        session = await node.directory.create_session("alice", session_id="t1")
        headers = [(b"authorization", f"Bearer {ALICE}".encode())]
        async with open_websocket_url(url, extra_headers=headers) as ws:
            client = Client(ws)
            await client.send(type="attach", session_id=session.id)
            await client.expect("attached")
            content = '/call time.get_current_time {"timezone": "Asia/Tokyo"}'
            await client.send(type="send", session_id=session.id, content=content)
            call = await client.expect("tool_call")
            assert call["tool"] == "time.get_current_time"
            assert call["ok"] is True
            assert call["result"]["structured"]["timezone"] == "Asia/Tokyo"
            end = await client.expect("stream_end")
            assert end["status"] == "completed"
            assert "Asia/Tokyo" in end["text"]


async def test_the_server_stops_with_the_node(tmp_path):
    async with mcp_node(tmp_path, time_server()) as node:
        server = mcp_server(node, "time")
        process = server.process
        assert process is not None and process.returncode is None
    assert process.exited.is_set()  # reaped before the node's block ended
    try:
        os.kill(process.pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"the server (pid {process.pid}) outlived the node")


async def test_a_server_whose_tools_are_known_is_started_on_first_use(tmp_path, store_url):
    # the first start lists them, and the store keeps the list (both backends)
    async with mcp_node(tmp_path, time_server(), store=store_url) as node:
        assert mcp_server(node, "time").starts == 1
    settings = Config(
        port=0,
        store=store_url,
        agent="scripted",
        mcp=McpConfig(servers=time_server()),
    )
    async with open_node(settings, tokens=TOKENS, serve=False) as node:
        server = mcp_server(node, "time")
        # its tools are there from the store, and nothing runs until one is called
        assert "time.get_current_time" in node.tools.names()
        assert (server.state, server.starts, server.process) == ("stopped", 0, None)
        key = await session_key(node)
        result = await node.tools.call(key, "alice", "time.get_current_time", {"timezone": "UTC"})
        assert result.ok, result.error
        assert (server.state, server.starts) == ("running", 1)
    # registered as the node starts, like every feature's tools: [execution] may name them
    carried = msgspec.structs.replace(
        settings, execution=ExecutionConfig(direct_tools=["time.get_current_time"])
    )
    async with open_node(carried, tokens=TOKENS, serve=False) as node:
        assert mcp_server(node, "time").starts == 0
    other = McpConfig(servers=time_server(call_timeout=5))  # options: the same server
    moved = McpConfig(servers={"time": McpServerConfig(command=[installed("mcp-server-time")])})
    for config, started in ((other, False), (moved, True)):
        settings = msgspec.structs.replace(settings, mcp=config)
        async with open_node(settings, tokens=TOKENS, serve=False) as node:
            server = mcp_server(node, "time")
            assert server.wanted is started  # another command lists anew
