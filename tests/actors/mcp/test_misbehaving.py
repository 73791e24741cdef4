"""A server that crashes mid-call, one that hangs, one that stops reading, one that lists
hostile names and schemas, one whose tools change; the environment a stdio server gets; the
result cap; the idempotency key. ``misbehaving.py`` is the server."""

from __future__ import annotations

import json
import os

import trio

from tests.actors.mcp.conftest import MISBEHAVING, mcp_node, mcp_server, session_key, until
from tests.support.fake_openai import check_parameters
from turnstile.actors.config import ExecutionConfig
from turnstile.actors.mcp import McpServerConfig
from turnstile.actors.mcp.catalog import MAX_DESCRIPTION_CHARS
from turnstile.actors.sessions.agents.base import TurnInput
from turnstile.tools.policy import Policy

FAST = {"backoff_initial": 0.05, "backoff_max": 0.05}


def misbehaving(*args: str, **options) -> dict[str, McpServerConfig]:
    return {"misb": McpServerConfig(command=[*MISBEHAVING, *args], **options)}


async def test_a_server_that_crashes_mid_call_fails_the_call_at_once_and_starts_again(tmp_path):
    async with mcp_node(tmp_path, misbehaving(call_timeout=600), mcp=FAST) as node:
        server = mcp_server(node, "misb")
        key = await session_key(node)
        with trio.fail_after(30):  # not the call's 600 s timeout: the death ends the call
            crashed = await node.tools.call(key, "alice", "misb.crash", {})
        assert crashed.error["code"] == "mcp_server_died"
        assert "exited with status 3: crashing on purpose" in crashed.error["message"]
        await until(server, lambda: server.state == "running" and server.starts == 2)
        echoed = await node.tools.call(key, "alice", "misb.echo", {"text": "back"})
        assert echoed.data == {"text": "back"}
        assert server.status()["last_error"].startswith("the server exited with status 3")


async def test_a_call_to_a_server_backing_off_fails_at_once_saying_when(tmp_path):
    slow = {"backoff_initial": 3600, "backoff_max": 3600}
    async with mcp_node(tmp_path, misbehaving(), mcp=slow) as node:
        server = mcp_server(node, "misb")
        key = await session_key(node)
        await node.tools.call(key, "alice", "misb.crash", {})
        await until(server, lambda: server.state == "backoff")
        refused = await node.tools.call(key, "alice", "misb.echo", {"text": "x"})
        assert refused.error["code"] == "mcp_unavailable"
        assert refused.error["message"].startswith(
            "mcp server 'misb' is not running (the server exited with status 3"
        )
        assert refused.error["message"].endswith("it is started again in 3600 s")


async def test_a_call_that_hangs_times_out_and_the_server_stays(tmp_path):
    async with mcp_node(tmp_path, misbehaving(call_timeout=1)) as node:
        server = mcp_server(node, "misb")
        key = await session_key(node)
        hung = await node.tools.call(key, "alice", "misb.hang", {})
        assert hung.error == {
            "code": "timeout",
            "message": "mcp server 'misb' did not answer within 1 s",
        }
        # it still answers (pings, calls): not started again
        echoed = await node.tools.call(key, "alice", "misb.echo", {"text": "still here"})
        assert echoed.data == {"text": "still here"}
        assert server.starts == 1


async def test_a_server_that_stops_reading_is_started_again_after_a_timeout(tmp_path):
    async with mcp_node(tmp_path, misbehaving(call_timeout=1), mcp=FAST) as node:
        server = mcp_server(node, "misb")
        key = await session_key(node)
        frozen = await node.tools.call(key, "alice", "misb.freeze", {})
        assert frozen.error["code"] == "timeout"
        await until(server, lambda: server.starts == 2 and server.state == "running")
        assert "ping" in server.status()["last_error"]
        echoed = await node.tools.call(key, "alice", "misb.echo", {"text": "new"})
        assert echoed.data == {"text": "new"}


async def test_hostile_names_and_schemas_are_mapped_or_left_out(tmp_path, caplog):
    async with mcp_node(tmp_path, misbehaving("--hostile")) as node:
        names = {n for n in node.tools.names() if n.startswith("misb.")}
        assert {
            "misb.get_weather",
            "misb.etc_passwd",
            "misb.long_description",
            "misb.liar",
        } <= names
        for left_out in (
            "not_object",
            "no_schema",
            "bad_schema",
            "remote_ref",
            "dangling_ref",
            "deep",
        ):
            assert f"misb.{left_out}" not in names
        assert not any("x" * 100 in n for n in names)
        assert len(names) == 10 + 4  # the ordinary ten and the four that pass
        for spec in node.tools.specs():
            if spec.name.startswith("misb."):
                check_parameters(spec.parameters)
        long = next(s for s in node.tools.specs() if s.name == "misb.long_description")
        assert len(long.description) <= MAX_DESCRIPTION_CHARS + len("[MCP server misb] ")
        # "readOnlyHint": "yes" is not true: APPROVE
        assert node.tools.policy_of("misb.liar") is Policy.APPROVE
        assert node.tools.policy_of("misb.add_tool") is Policy.APPROVE
        # get-weather took the name: get_weather is left out, said why; so is the call to it
        key = await session_key(node)
        called = await node.tools.call(key, "alice", "misb.get_weather", {}, ask_approval=False)
        assert called.ok is False and called.error["code"] == "requires_approval"
        reasons = "\n".join(r.getMessage() for r in caplog.records)
        assert "tool 'get_weather' left out: another tool of the server is also named" in reasons
        assert "tool 'remote_ref' left out: the input schema refers outside itself" in reasons
        assert "tool 'dangling_ref' left out: the input schema's $ref" in reasons


async def test_its_tool_list_is_followed_on_list_changed(tmp_path):
    policies = {"misb.add_tool": "AUTO"}
    async with mcp_node(tmp_path, misbehaving(), policies=policies) as node:
        server = mcp_server(node, "misb")
        key = await session_key(node)
        before = server.listings
        added = await node.tools.call(key, "alice", "misb.add_tool", {"name": "fresh"})
        assert added.ok, added.error
        await until(server, lambda: server.listings > before)
        assert "misb.fresh" in node.tools.names()
        fresh = await node.tools.call(key, "alice", "misb.fresh", {}, ask_approval=False)
        assert fresh.error["code"] == "requires_approval"  # no annotations: APPROVE


async def test_a_stdio_server_gets_the_environment_it_is_given_and_nothing_else(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("NODE_SECRET", "s3cret")
    servers = {
        "guarded": McpServerConfig(command=MISBEHAVING, env={"GREETING": "hi"}),
        "bare": McpServerConfig(
            command=MISBEHAVING, egress="none", inherit_env=["PATH"], cwd=str(tmp_path)
        ),
    }
    async with mcp_node(tmp_path, servers) as node:
        key = await session_key(node)
        guarded = await node.tools.call(key, "alice", "guarded.env", {})
        env = json.loads(guarded.data["text"])
        env.pop("LC_CTYPE", None)  # Python's own coercion of the C locale may add it
        proxy = node.features["mcp"].proxy.url
        assert env == {
            "GREETING": "hi",
            **{name: proxy for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
            **{name: proxy for name in ("http_proxy", "https_proxy", "all_proxy")},
            "NO_PROXY": "",
            "no_proxy": "",
        }
        bare = await node.tools.call(key, "alice", "bare.env", {})
        env = json.loads(bare.data["text"])
        env.pop("LC_CTYPE", None)
        assert env == {"PATH": os.environ["PATH"]}
        cwd = await node.tools.call(key, "alice", "bare.cwd", {})
        assert cwd.data == {"text": str(tmp_path)}


async def test_a_large_result_is_cut_and_says_so(tmp_path):
    async with mcp_node(tmp_path, misbehaving(max_result_chars=1000)) as node:
        key = await session_key(node)
        result = await node.tools.call(key, "alice", "misb.big", {"chars": 50_000})
        assert result.data["truncated"] is True
        assert result.data["chars"] == len(
            json.dumps({"text": "a" * 50_000}, separators=(",", ":"))
        )
        assert result.data["text"].endswith("… [truncated]")
        assert len(json.dumps(result.data, ensure_ascii=False)) <= 1000
        small = await node.tools.call(key, "alice", "misb.big", {"chars": 10})
        assert small.data == {"text": "a" * 10}


async def test_a_failing_tool_is_the_calls_error(tmp_path):
    async with mcp_node(tmp_path, misbehaving()) as node:
        key = await session_key(node)
        failed = await node.tools.call(key, "alice", "misb.fail", {})
        assert failed.error == {"code": "tool_error", "message": "misb.fail: it went wrong"}


async def test_a_turns_call_carries_its_idempotency_key(tmp_path):
    async with mcp_node(tmp_path, misbehaving()) as node:
        key = await session_key(node)
        result = await node.tools.call(
            key, "alice", "misb.meta", {}, idempotency_key="turnstile-k1"
        )
        assert json.loads(result.data["text"]) == {"turnstile/idempotency_key": "turnstile-k1"}
        plain = await node.tools.call(key, "alice", "misb.meta", {})
        assert json.loads(plain.data["text"]) == {}


async def test_servers_per_user_and_narrowed_by_a_sessions_metadata(tmp_path):
    servers = {
        "mine": McpServerConfig(command=MISBEHAVING, users=["alice"]),
        "ours": McpServerConfig(command=MISBEHAVING),
    }
    async with mcp_node(tmp_path, servers) as node:
        alice, bob = await session_key(node), await session_key(node, "bob")
        ok = await node.tools.call(alice, "alice", "mine.echo", {"text": "a"})
        assert ok.ok
        refused = await node.tools.call(bob, "bob", "mine.echo", {"text": "b"})
        assert refused.error == {
            "code": "not_allowed",
            "message": "mcp server 'mine' is not available to this user",
        }
        assert (await node.tools.call(bob, "bob", "ours.echo", {"text": "b"})).ok
        narrowed = await session_key(node, mcp={"servers": ["ours"]})
        out = await node.tools.call(narrowed, "alice", "mine.echo", {"text": "a"})
        assert out.error == {
            "code": "not_allowed",
            "message": "mcp server 'mine' is not among this session's servers",
        }
        assert (await node.tools.call(narrowed, "alice", "ours.echo", {"text": "a"})).ok
        nothing = await session_key(node, mcp={"servers": "ours"})  # malformed: nothing
        assert (await node.tools.call(nothing, "alice", "ours.echo", {"text": "a"})).error[
            "code"
        ] == "not_allowed"


async def test_a_turn_sees_a_tool_that_replaced_another(tmp_path):
    """The turn shaper caches each turn's tools until the registry changes: a list_changed
    that replaces one tool by another keeps their number, and the turn still sees the new."""
    async with mcp_node(
        tmp_path, misbehaving(), execution=ExecutionConfig(tool_mode="direct")
    ) as node:
        shaper = node.features["execution"].shaper.shaper
        before = {spec.name for spec in shaper.select(shaper.settings).tools}
        assert "misb.echo" in before
        feature = node.features["mcp"]
        server = mcp_server(node, "misb")
        listed = [
            {"name": "renamed", "inputSchema": {"type": "object"}}
            if t == "echo"
            else {"name": t, "inputSchema": {"type": "object"}}
            for t in (
                "echo",
                "env",
                "crash",
                "hang",
                "freeze",
                "big",
                "fail",
                "add_tool",
                "meta",
                "cwd",
            )
        ]
        await feature._register_all(server, listed)
        after = {spec.name for spec in shaper.select(shaper.settings).tools}
        assert len(after) == len(before)
        assert "misb.renamed" in after and "misb.echo" not in after


async def test_a_model_is_not_shown_the_servers_its_session_may_not_use(tmp_path):
    servers = {
        "mine": McpServerConfig(command=MISBEHAVING, users=["alice"]),
        "ours": McpServerConfig(command=MISBEHAVING),
    }
    direct = ExecutionConfig(tool_mode="direct")
    async with mcp_node(tmp_path, servers, execution=direct) as node:
        shaper = node.features["execution"].shaper.shaper
        turn = TurnInput(input_id=1, source="user", content="hi")

        def shown(owner: str, metadata: dict) -> set[str]:
            shaped = shaper.shape(metadata, turn, [], None, owner=owner)
            names = {spec.name.partition(".")[0] for spec in shaped.tools if "." in spec.name}
            return names & {"mine", "ours"}

        assert shown("alice", {}) == {"mine", "ours"}
        assert shown("bob", {}) == {"ours"}
        assert shown("alice", {"mcp": {"servers": ["ours"]}}) == {"ours"}
        assert shown("alice", {"mcp": {"servers": []}}) == set()
        # tool_search and tool_run answer as for no tool; the turn refuses it too
        bob = await session_key(node, "bob")
        found = await node.tools.call(bob, "bob", "tool_search", {"names": ["mine.echo"]})
        assert found.data == {"tools": [], "unknown": ["mine.echo"]}
        searched = await node.tools.call(bob, "bob", "tool_search", {"query": "echo"})
        assert {t["name"] for t in searched.data["tools"]} >= {"ours.echo"}
        assert "mine.echo" not in {t["name"] for t in searched.data["tools"]}
        run = await node.tools.call(
            bob, "bob", "tool_run", {"name": "mine.echo", "params": {"text": "x"}}
        )
        assert run.error == {"code": "unknown_tool", "message": "no tool named 'mine.echo'"}
        alice = await session_key(node)
        found = await node.tools.call(alice, "alice", "tool_search", {"names": ["mine.echo"]})
        assert [t["name"] for t in found.data["tools"]] == ["mine.echo"]
        # compact mode's index, for the same two users
        compact = shaper.select(shaper.settings, None, shaper.registry.hidden_from("bob", {}))
        assert not [name for name in compact.indexed if name.startswith("mine.")]
