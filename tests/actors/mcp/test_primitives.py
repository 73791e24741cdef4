"""An MCP tool is a tool like any other to the primitives: tool_search indexes and describes
it, run_parallel runs several at once, background_run runs one as a task, and a watcher polls
one without a model call."""

from __future__ import annotations

from tests.actors.mcp.conftest import MISBEHAVING, WAIT, mcp_node, session_key
from tests.support.polling import eventually
from turnstile.actors.mcp import McpServerConfig


def servers() -> dict[str, McpServerConfig]:
    return {"misb": McpServerConfig(command=MISBEHAVING)}


async def test_tool_search_run_parallel_and_background_run_reach_mcp_tools(tmp_path):
    async with mcp_node(tmp_path, servers()) as node:
        key = await session_key(node)
        found = await node.tools.call(key, "alice", "tool_search", {"names": ["misb.echo"]})
        assert [t["name"] for t in found.data["tools"]] == ["misb.echo"]
        assert found.data["tools"][0]["parameters"]["required"] == ["text"]
        run = await node.tools.call(
            key, "alice", "tool_run", {"name": "misb.echo", "params": {"text": "via tool_run"}}
        )
        assert run.data == {"text": "via tool_run"}
        parallel = await node.tools.call(
            key,
            "alice",
            "run_parallel",
            {
                "actions": [
                    {"name": "misb.echo", "params": {"text": "one"}},
                    {"name": "misb__echo", "params": {"text": "two"}},  # as a model names it
                    {"name": "misb.echo", "params": {"text": 3}},
                    {"name": "misb.add_tool", "params": {"name": "x"}},  # APPROVE: not run
                ]
            },
        )
        counts = [parallel.data[k] for k in ("succeeded", "failed", "requires_approval")]
        assert counts == [2, 1, 1]
        results = parallel.data["results"]
        assert [r.get("data") for r in results[:2]] == [{"text": "one"}, {"text": "two"}]
        assert results[2]["error"]["code"] == "bad_arguments"
        assert results[3]["requires_approval"] is True
        started = await node.tools.call(
            key, "alice", "background_run", {"name": "misb.echo", "params": {"text": "later"}}
        )
        assert started.ok, started.error
        waited = await node.tools.call(
            key, "alice", "background_wait", {"task_id": started.data["task_id"], "timeout": WAIT}
        )
        assert waited.data["status"] == "completed", waited.data
        assert waited.data["result"] == {"success": True, "data": {"text": "later"}}


async def test_a_watcher_polls_an_mcp_tool(tmp_path):
    async with mcp_node(tmp_path, servers()) as node:
        key = await session_key(node)
        started = await node.tools.call(
            key,
            "alice",
            "watch_start",
            {"tool": "misb.echo", "params": {"text": "steady"}, "interval": 5},
        )
        assert started.ok, started.error
        watcher = started.data["watcher_id"]

        async def checked() -> list:
            # the first check runs at once; watch_history reads the watcher's state
            history = await node.tools.call(key, "alice", "watch_history", {"watcher_id": watcher})
            return history.data["entries"]

        (check,) = await eventually(checked)
        assert check["ok"] is True and check["result"] == '{"text":"steady"}'
        assert check["escalated"] is True  # on_change: the first look is the baseline
