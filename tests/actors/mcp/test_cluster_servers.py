"""Several nodes on one PostgreSQL each run their own MCP servers (``docs/mcp.md``, "Several
nodes each run their own servers; nothing of a server is shared between nodes").

Two nodes, both configured with ``mcp-server-time`` over stdio. Node ``a`` opens first: no
tool list is kept yet, so it starts its server to list the tools, and the store keeps the
list. Node ``b`` then finds that list and registers the tools from it without starting anything:
the list is shared, the process is not. A session held by each node calls the tool in a turn;
``b``'s call starts ``b``'s own server (its first use), a process of its own beside ``a``'s.
When ``a`` stops, its server goes with it, and ``b``'s session still calls its own.
"""

from __future__ import annotations

import json

import pytest
import trio

from tests.actors.mcp.conftest import TOKENS, WAIT, installed, mcp_server
from tests.support.sessions import Recorder
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.mcp import McpConfig, McpServerConfig
from turnstile.actors.node import Node, open_node

CALL = '/call time.get_current_time {"timezone": "Asia/Tokyo"}'


def node_config(store: str, node_id: str) -> Config:
    command = [installed("mcp-server-time"), "--local-timezone", "UTC"]
    servers = {"time": McpServerConfig(command=command, egress="none")}
    node = NodeConfig(id=node_id, lease_seconds=600, placement="leases")
    return Config(store=store, node=node, agent="scripted", mcp=McpConfig(servers=servers))


async def call_in_a_turn(node: Node, session_id: str, watcher: Recorder, n: int) -> dict:
    """Send ``CALL`` to ``session_id`` (held by ``node``) and return its turn's ``tool_call``
    (the ``n``-th of the session)."""
    await node.directory.submit("alice", session_id, CALL)
    with trio.fail_after(WAIT):
        await watcher.until(b'"stream_end"', n)
    calls = [json.loads(f) for f in watcher.frames if b'"tool_call"' in f]
    assert len(calls) == n
    return calls[-1]


async def serve_node(
    config: Config, stop: trio.Event, stopped: trio.Event, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """A node in a task of its own, so that it can stop while another runs on."""
    try:
        async with open_node(config, tokens=TOKENS, serve=False) as node:
            task_status.started(node)
            await stop.wait()
    finally:
        stopped.set()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
async def test_each_node_runs_its_own_server_and_shares_only_the_tool_list(pg_store):
    stop_a, a_stopped = trio.Event(), trio.Event()
    stop_b, b_stopped = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery:
        a = await nursery.start(serve_node, node_config(pg_store, "a"), stop_a, a_stopped)
        on_a = mcp_server(a, "time")
        with trio.fail_after(WAIT):
            await on_a.ready()  # started when the node opened, to learn its tools
        a_process = on_a.process
        assert a_process is not None

        b = await nursery.start(serve_node, node_config(pg_store, "b"), stop_b, b_stopped)
        on_b = mcp_server(b, "time")
        # the tools from the list a's server gave, kept in the store; b's server not started
        assert "time.get_current_time" in b.tools.names()
        assert (on_b.state, on_b.process, on_b.starts) == ("stopped", None, 0)

        watchers = {}
        for node, session_id in ((a, "on-a"), (b, "on-b")):
            await node.directory.create_session("alice", session_id=session_id)
            watchers[session_id] = Recorder()
            await node.directory.attach("alice", session_id, watchers[session_id])  # it holds it
        for node, session_id in ((a, "on-a"), (b, "on-b")):
            call = await call_in_a_turn(node, session_id, watchers[session_id], 1)
            assert (call["tool"], call["ok"]) == ("time.get_current_time", True), call
            assert call["result"]["structured"]["timezone"] == "Asia/Tokyo"

        # each node called its own process: a's was not started again, b's once, on first use
        b_process = on_b.process
        assert b_process is not None and b_process.pid != a_process.pid
        assert (on_a.starts, on_b.starts) == (1, 1)
        assert a_process.returncode is None and b_process.returncode is None

        # a stops, and its server with it; b's runs on and answers b's session
        stop_a.set()
        with trio.fail_after(WAIT):
            await a_stopped.wait()
        assert a_process.exited.is_set()
        call = await call_in_a_turn(b, "on-b", watchers["on-b"], 2)
        assert call["ok"] is True, call
        assert (on_b.process, on_b.starts) == (b_process, 1)
        stop_b.set()
