"""``/mcp``: the node's sessions as an MCP server, driven by the SDK's own client over
streamable HTTP with the node's bearer tokens; and a node whose MCP server is another node's
``/mcp``, reached through the guard proxy."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.actors.mcp.conftest import ALICE, BOB, TOKENS, mcp_node, mcp_server, session_key, until
from tests.support.serve import run_script
from turnstile.actors.config import Config
from turnstile.actors.mcp import McpConfig, McpServerConfig
from turnstile.actors.node import open_node


@asynccontextmanager
async def served(tmp_path):
    config = Config(port=0, store=f"sqlite:///{tmp_path}/node.db", agent="scripted")
    async with open_node(config, tokens=TOKENS) as node:
        yield node


@asynccontextmanager
async def mcp_client(url: str, token: str, **options):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http), **options) as c:
            yield c


def answer(result) -> dict:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # the 2026-07-28 era, and the handshake's
async def test_an_mcp_client_drives_a_session(tmp_path, mode):
    async with served(tmp_path) as node, mcp_client(node.url, ALICE, mode=mode) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert names[:4] == ["list_sessions", "create_session", "send_message", "read_history"]
        assert {"schedule_recall", "watch_start", "memory", "schedule_list"} <= set(names)
        created = answer(await client.call_tool("create_session", {"session_id": "ide"}))
        assert created["id"] == "ide"
        listed = answer(await client.call_tool("list_sessions", {}))
        assert [s["id"] for s in listed["sessions"]] == ["ide"]
        sent = answer(
            await client.call_tool("send_message", {"session_id": "ide", "content": "hello"})
        )
        assert sent == {
            "input_id": sent["input_id"],
            "status": "completed",
            "text": "You said: hello",
        }
        history = answer(await client.call_tool("read_history", {"session_id": "ide"}))
        assert [(e["role"], e["content"]) for e in history["entries"]] == [
            ("user", "hello"),
            ("assistant", "You said: hello"),
        ]
        # the primitives, in the session: memory, a recall, a watcher
        saved = answer(
            await client.call_tool(
                "memory",
                {
                    "session_id": "ide",
                    "action": "save",
                    "category": "preference",
                    "key": "coffee",
                    "value": "dark roast",
                },
            )
        )
        assert saved
        facts = answer(await client.call_tool("memory", {"session_id": "ide", "action": "list"}))
        assert [f["value"] for f in facts["facts"]] == ["dark roast"]
        recall = answer(
            await client.call_tool(
                "schedule_recall",
                {
                    "session_id": "ide",
                    "call_type": "once",
                    "when": "in 2 hours",
                    "additional_context_message": "remind the user to stretch",
                },
            )
        )
        recalls = answer(
            await client.call_tool("manage_recall", {"session_id": "ide", "action": "list"})
        )
        assert recall["recall_id"] in json.dumps(recalls)
        watching = answer(
            await client.call_tool(
                "watch_start",
                {"session_id": "ide", "tool": "clock.now", "params": {}, "interval": 60},
            )
        )
        listed = answer(await client.call_tool("watch_list", {"session_id": "ide"}))
        assert watching["watcher_id"] in json.dumps(listed)


async def test_another_users_session_answers_as_one_that_does_not_exist(tmp_path):
    async with served(tmp_path) as node:
        await node.directory.create_session("alice", session_id="private")
        async with mcp_client(node.url, BOB) as bob:
            theirs = await bob.call_tool("send_message", {"session_id": "private", "content": "x"})
            nobodys = await bob.call_tool("send_message", {"session_id": "nope", "content": "x"})
            assert theirs.is_error and nobodys.is_error
            assert theirs.content[0].text == "not_found: no session with id 'private'"
            assert nobodys.content[0].text == "not_found: no session with id 'nope'"
            history = await bob.call_tool("read_history", {"session_id": "private"})
            assert history.content[0].text == "not_found: no session with id 'private'"
            memory = await bob.call_tool("memory", {"session_id": "private", "action": "list"})
            assert memory.content[0].text == "not_found: no session with id 'private'"
            assert answer(await bob.call_tool("list_sessions", {}))["sessions"] == []
        # nothing of it reached alice's session
        assert await node.directory.history("alice", "private") == []


async def test_no_token_no_mcp(tmp_path):
    async with served(tmp_path) as node, httpx2.AsyncClient() as http:
        request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        refused = await http.post(f"{node.url}/mcp", json=request)
        assert refused.status_code == 401
        assert refused.json() == {
            "error": {"code": "unauthorized", "message": "missing bearer token"}
        }
        wrong = await http.post(
            f"{node.url}/mcp", json=request, headers={"Authorization": "Bearer wrong-token-xx"}
        )
        assert wrong.status_code == 401


async def test_a_node_uses_another_nodes_mcp_through_the_guard(tmp_path, monkeypatch):
    monkeypatch.setenv("OTHER_NODE_TOKEN", f"Bearer {ALICE}")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with served(tmp_path / "a") as other:
        await other.directory.create_session("alice", session_id="remote")
        server = McpServerConfig(
            url=f"{other.url}/mcp", headers_env={"Authorization": "OTHER_NODE_TOKEN"}
        )
        # loopback, allowed by the config: it starts and its tools join
        mcp = {"allowed_hosts": ["127.0.0.1"]}
        async with mcp_node(tmp_path / "b", {"other": server}, mcp=mcp) as node:
            assert "other.send_message" in node.tools.names()
            key = await session_key(node)
            sent = await node.tools.call(
                key,
                "alice",
                "other.send_message",
                {"session_id": "remote", "content": "from afar"},
                approved=True,
            )
            assert sent.ok, sent.error
            assert sent.data["structured"]["text"] == "You said: from afar"
        # not allowed: the guard refuses the connection, and the server never starts
        config = Config(
            port=0,
            store=f"sqlite:///{tmp_path}/b/again.db",
            agent="scripted",
            mcp=McpConfig(servers={"other": server}, backoff_initial=3600, backoff_max=3600),
        )
        async with open_node(config, tokens=TOKENS, serve=False) as node:
            refused = mcp_server(node, "other")
            await until(refused, lambda: refused.state == "backoff")
            assert "other.send_message" not in node.tools.names()
            proxy = node.features["mcp"].proxy
            assert proxy.refused[-1] == (
                "127.0.0.1",
                "refusing 127.0.0.1 (loopback address) for host '127.0.0.1'",
            )


_NO_SDK_UNTIL_ASKED = """
import sys, trio, httpx
from turnstile.actors.config import Config
from turnstile.actors.node import open_node

async def main(db):
    config = Config(port=0, store=f"sqlite:///{db}", agent="scripted")
    async with open_node(config, tokens={"tok": "ann"}) as node:
        print("at start", "mcp" in sys.modules, flush=True)
        print("jsonschema", "jsonschema" in sys.modules, flush=True)
        # the first request loads the SDK (seconds on a loaded box): a generous bound
        async with httpx.AsyncClient(headers={"Authorization": "Bearer tok"}, timeout=120) as http:
            sent = await http.post(
                f"{node.url}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                headers={"Accept": "application/json, text/event-stream",
                         "MCP-Protocol-Version": "2025-06-18"},
            )
        print("asked", sent.status_code, "mcp" in sys.modules, flush=True)
        print("tools", len(sent.json()["result"]["tools"]), flush=True)

trio.run(main, sys.argv[1])
"""


async def test_a_node_loads_the_mcp_sdk_only_when_mcp_is_first_asked(tmp_path):
    """A node without MCP servers starts without the SDK (about a second of CPU each start)
    nor jsonschema (which checks MCP servers' tools: 0.04 s); the first ``POST /mcp`` loads
    the SDK and is answered like any other."""
    out = await run_script(_NO_SDK_UNTIL_ASKED, str(tmp_path / "node.db"))
    assert "at start False" in out
    assert "jsonschema False" in out
    assert "asked 200 True" in out
    assert int(out.split("tools ")[1].split()[0]) >= 4
