"""The watch_* tools and the HTTP functions: policies, bounds, scoping, responses."""

from __future__ import annotations

import pytest
import trio

from tests.support.mock_node import DAY
from tests.support.watchers import watching
from turnstile.actors.watchers.actor import DropSessionWatchers, StartWatcher
from turnstile.actors.watchers.safeexpr import ExprError
from turnstile.actors.watchers.tools import (
    UnwatchableTool,
    get_watcher,
    list_watchers,
    pause_watcher,
    resume_watcher,
    start_watcher,
    stop_watcher,
    watcher_history,
)
from turnstile.runtime.errors import DecodeError, LimitExceeded, NotFound
from turnstile.tools.policy import PolicyTable


async def test_block_and_approve_tools_cannot_be_watched(autojump_clock):
    async with watching() as w:
        for tool, policy in (("probe.write", "BLOCK"), ("probe.ask", "APPROVE")):
            refused = await w.call("watch_start", tool=tool)
            assert refused.error == {
                "code": "unwatchable_tool",
                "message": f"{tool} cannot be watched: its policy is {policy} (watchers run "
                "unattended, so only AUTO tools can be watched)",
                "field": "tool",
            }
        wrong = await w.call("watch_start", tool="probe.read", params={"nope": 1})
        assert wrong.error["field"] == "params"
        assert wrong.error["message"].startswith("params do not fit probe.read")
        unknown = await w.call("watch_start", tool="probe.nope")
        assert unknown.error["message"] == "no tool named 'probe.nope'"
        nested = await w.call("watch_start", name="watch_list")
        assert nested.error["code"] == "invalid_argument"
        both = await w.call("watch_start", tool="probe.read", name="probe.read")
        assert both.error["field"] == "tool"
        assert (await w.call("watch_list")).data["total"] == 0


@pytest.mark.guard(DAY)
async def test_a_tool_whose_policy_tightens_later_fails_its_checks_without_running(
    autojump_clock,
):
    async with watching() as w:
        started = await w.call(  # the reference's spelling: name
            "watch_start", name="probe.read", interval=5, notify_when="on_error"
        )
        assert started.data["tool_name"] == "probe.read"
        await trio.sleep(1)
        w.tools.policies = PolicyTable({"probe.read": "APPROVE"})
        await trio.sleep(5)
        assert len(w.probe.calls) == 1  # the check at 5 never reached the tool
        (note,) = w.notes()
        assert "Error: probe.read cannot be watched: its policy is APPROVE" in note


async def test_limits_and_bounds(autojump_clock):
    async with watching(max_watchers_per_session=2) as w:
        await w.n.store.create_session("other", "bob")
        await w.start(interval=60)
        await w.start(interval=60)
        third = await w.call("watch_start", tool="probe.read", interval=60)
        assert third.error["code"] == "limit_exceeded"
        assert "limit 2" in third.error["message"]
        other = await w.call("watch_start", session="other", owner="bob", tool="probe.read")
        assert other.ok  # the limit is per session
        for bad in (
            {"interval": 4},
            {"interval": 3601},
            {"label": "x" * 201},
            {"notify_when": "sometimes"},
            {"notify_config": {"debounce": 0}},
            {"notify_config": {"bogus": 1}},
            {"notify_config": {"expression": "x" * 501}},
        ):
            refused = await w.call("watch_start", session="third", tool="probe.read", **bad)
            assert refused.error["code"] == "bad_arguments", bad
        with pytest.raises(LimitExceeded):
            await w.ref.ask(
                StartWatcher(
                    session_id="fourth",
                    owner="ada",
                    tool="probe.read",
                    params={"key": "k" * 20_000},
                )
            )
        for config, field in (
            ({"batch_size": 3}, "notify_config.batch_size"),  # summary only
            ({"expression": "result.a == 1"}, "notify_config.expression"),  # threshold only
        ):
            refused = await w.call(
                "watch_start", session="third", tool="probe.read", notify_config=config
            )
            assert refused.error["field"] == field
        refused = await w.call(
            "watch_start",
            session="third",
            tool="probe.read",
            notify_when="summary",
            notify_config={"cooldown_seconds": 5},
        )
        assert refused.error["field"] == "notify_config.cooldown_seconds"


async def test_another_sessions_watcher_is_not_found(autojump_clock):
    from turnstile.actors.watchers.tools import get_watcher, list_watchers, stop_watcher

    async with watching() as w:
        wid = await w.start(interval=60)
        for tool in ("watch_status", "watch_stop", "watch_pause", "watch_resume", "watch_history"):
            theirs = await w.call(tool, session="other", watcher_id=wid)
            assert theirs.error == {"code": "not_found", "message": f"no watcher with id {wid!r}"}
        assert (await w.call("watch_list", session="other")).data["total"] == 0
        # The HTTP functions scope by owner.
        with pytest.raises(NotFound):
            await get_watcher(w.ref, wid, "bob")
        with pytest.raises(NotFound):
            await stop_watcher(w.ref, wid, "bob")
        mine = await get_watcher(w.ref, wid, "ada")
        assert mine["watcher_id"] == wid and mine["owner"] == "ada"
        assert (await list_watchers(w.ref, owner="bob"))["total"] == 0
        assert (await list_watchers(w.ref, owner="ada"))["total"] == 1


async def test_the_http_functions_share_the_tools_logic(autojump_clock):
    async with watching() as w:
        spec = {
            "tool": "probe.read",
            "params": {"key": "b"},
            "interval": 30,
            "label": "API health",
            "notify_when": "on_error",
        }
        started = await start_watcher(w.ref, w.tools, "s", "ada", spec)
        wid = started["watcher_id"]
        assert started["hint"] == (
            "Watcher 'API health' started. Checking probe.read every 30s. "
            "You'll be notified via 'on_error' strategy."
        )
        with pytest.raises(DecodeError) as bad:
            await start_watcher(w.ref, w.tools, "s", "ada", {**spec, "interval": 1})
        assert bad.value.field == "$.interval"
        with pytest.raises(UnwatchableTool) as refused:
            await start_watcher(w.ref, w.tools, "s", "ada", {"tool": "probe.write"})
        assert (refused.value.tool, refused.value.policy.value) == ("probe.write", "BLOCK")
        with pytest.raises(ExprError) as expr:
            await start_watcher(
                w.ref,
                w.tools,
                "s",
                "ada",
                {
                    "tool": "probe.read",
                    "notify_when": "on_threshold",
                    "notify_config": {"expression": "result.x = 1"},
                },
            )
        assert expr.value.position == 9
        await trio.sleep(1)
        full = await get_watcher(w.ref, wid, "ada")
        assert full["params"] == {"key": "b"} and full["check_count"] == 1
        assert [e["check"] for e in full["recent_history"]] == [1]
        assert full["last_result"] == {"ok": True, "result": '{"value":1}'}
        assert (await pause_watcher(w.ref, wid, "ada"))["status"] == "paused"
        assert (await pause_watcher(w.ref, wid, "ada"))["status"] == "paused"  # idempotent
        assert (await list_watchers(w.ref, session_id="s", owner="ada"))["paused"] == 1
        assert (await resume_watcher(w.ref, wid, "ada"))["status"] == "running"
        assert (await watcher_history(w.ref, wid, 5, "ada"))["count"] == 1
        with pytest.raises(NotFound):
            await pause_watcher(w.ref, wid, "bob")
        stopped = await stop_watcher(w.ref, wid, "ada")
        assert stopped["message"] == f"Watcher {wid} stopped after 1 checks."
        with pytest.raises(NotFound):
            await get_watcher(w.ref, wid, "ada")


async def test_a_deleted_sessions_watchers_are_dropped(autojump_clock):
    async with watching() as w:
        for _ in range(3):
            await w.start(interval=60)
        assert await w.ref.ask(DropSessionWatchers(session_id="s")) == 3
        assert (await w.call("watch_list")).data["total"] == 0
        assert await w.ref.ask(DropSessionWatchers(session_id="s")) == 0


async def test_the_tools_have_schemas_for_function_calling(autojump_clock):
    async with watching() as w:
        specs = {s.name: s for s in w.tools.specs()}
        assert {
            "watch_start",
            "watch_stop",
            "watch_pause",
            "watch_resume",
            "watch_status",
            "watch_list",
            "watch_history",
        } <= set(specs)
        start = specs["watch_start"].parameters["properties"]
        assert {"tool", "name", "params", "interval", "label", "notify_when", "notify_config"} <= (
            set(start)
        )
        assert start["interval"]["minimum"] == 5 and start["interval"]["maximum"] == 3600
        history = specs["watch_history"].parameters
        assert history["required"] == ["watcher_id"]
        no_session = await w.tools.call("", "ada", "watch_start", {"tool": "probe.read"})
        assert no_session.error["field"] == "session_id"
