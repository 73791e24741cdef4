"""Heartbeats on trio's MockClock: interval, active hours, suppression, profiles, on_error."""

from __future__ import annotations

import json
from datetime import timedelta

import msgspec
import pytest
import trio

from actors.directory import create_derived_session
from actors.session import Attach
from runtime.agents.base import AgentError
from tests.actors.test_scheduler import DAY, T0, node
from tests.actors.test_session import Recorder
from tools.builtin import register_builtin_tools
from tools.heartbeat import HEARTBEAT_PROFILES, register_heartbeat_tools
from tools.registry import ToolRegistry


class HeartbeatAgent:
    """Answers by mode: 'quiet' (short), 'loud' (long), 'tool' (acts), 'fail'."""

    name = "hb"

    def __init__(self, mode: str = "quiet") -> None:
        self.mode = mode
        self.turns: list = []
        self.refused: list = []

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn):
        self.turns.append(turn)
        if self.mode == "fail":
            raise AgentError("model down")
        if self.mode == "tool":
            await turn.call_tool("clock.now", {})
            refused = await turn.call_tool("set_heartbeat", {"enabled": False})
            self.refused.append(refused.error)
        text = "All clear." if self.mode != "loud" else "Found a problem: " + "x" * 400
        await turn.emit("stream_delta", text)
        return text


class Heartbeats:
    def __init__(self, n, tools) -> None:
        self.n, self.tools = n, tools

    async def set(self, **arguments):
        result = await self.tools.call("s", "ada", "set_heartbeat", arguments)
        assert result.ok, result.error
        return result.data

    async def watch(self, session_id: str) -> Recorder:
        watcher = Recorder()
        await self.n.registry.ref(f"session:{session_id}").ask(Attach(subscriber=watcher))
        return watcher


def kinds(watcher: Recorder) -> list[str]:
    return [json.loads(frame)["type"] for frame in watcher.frames]


class running:
    """``async with running(agent) as (n, hb)``: a mock-clock node with heartbeat tools."""

    def __init__(self, agent) -> None:
        self.agent = agent
        self.tools = ToolRegistry()

    async def __aenter__(self):
        self._node = node(tools=self.tools, profiles=HEARTBEAT_PROFILES, agent=self.agent)
        n = await self._node.__aenter__()
        register_builtin_tools(self.tools, n.clock)
        register_heartbeat_tools(
            self.tools,
            n.scheduler,
            n.store,
            n.clock,
            lambda parent, suffix: create_derived_session(n.store, 100, parent, suffix),
        )
        return n, Heartbeats(n, self.tools)

    async def __aexit__(self, *exc):
        return await self._node.__aexit__(*exc)


@pytest.mark.guard(3 * DAY)
async def test_a_quiet_dedicated_heartbeat_runs_on_interval_and_is_suppressed(autojump_clock):
    agent = HeartbeatAgent("quiet")
    async with running(agent) as (n, hb):
        made = await hb.set(enabled=True, interval_minutes=30, checklist="CI green?")
        assert (made["session_id"], made["next_run_at"]) == ("s.heartbeat", "2026-11-21T12:30:00Z")
        assert made["understood"] == "every 30 minutes"
        watcher = await hb.watch("s.heartbeat")
        await trio.sleep(2 * 3600 + 1)
        assert len(agent.turns) == 4
        first = agent.turns[0]
        assert first.history == []  # dedicated: a clean context each time
        assert first.input.system_segment.endswith("Your checklist:\nCI green?")
        assert first.input.max_tokens == 4096
        assert "stream_start" not in kinds(watcher)  # suppressed: not forwarded
        assert kinds(watcher).count("heartbeat_suppressed") == 4
        runs = await n.store.list_runs(made["heartbeat_id"])
        assert all(r.state == "turn_completed" and r.detail["suppressed"] for r in runs)
        assert runs[0].detail["response"] == "All clear."  # logged
        assert [len(t.history) for t in agent.turns] == [0, 0, 0, 0]


@pytest.mark.guard(3 * DAY)
async def test_a_heartbeat_that_finds_something_is_forwarded(autojump_clock):
    agent = HeartbeatAgent("loud")
    async with running(agent) as (n, hb):
        await hb.set(enabled=True, interval_minutes=15, session="main", model_override="cheap")
        watcher = await hb.watch("s")
        await trio.sleep(15 * 60 + 1)
        assert kinds(watcher)[-3:] == ["stream_start", "stream_delta", "stream_end"]
        assert agent.turns[0].input.model == "cheap"
        end = json.loads(watcher.frames[-1])
        assert end["text"].startswith("Found a problem")


@pytest.mark.guard(3 * DAY)
async def test_outside_active_hours_no_turn_runs(autojump_clock):
    agent = HeartbeatAgent("loud")
    async with running(agent) as (n, hb):
        made = await hb.set(
            enabled=True,
            interval_minutes=60,
            active_hours_start="09:00",
            active_hours_end="12:00",
            timezone="Europe/Paris",  # 08:00–11:00Z in winter; T0 is 12:00Z
        )
        assert made["understood"] == "every 60 minutes, 09:00–12:00 Europe/Paris"
        await trio.sleep(DAY - 60)  # 23 occurrences: 13:00Z … 11:00Z the next day
        runs = await n.store.list_runs(made["heartbeat_id"], limit=100)
        ran = sorted(r.scheduled_for for r in runs if r.state == "turn_completed")
        assert ran == [T0 + timedelta(hours=h) for h in (20, 21, 22)]  # 08:00, 09:00, 10:00Z
        assert sum(r.state == "outside_active_hours" for r in runs) == 20
        assert len(agent.turns) == 3


@pytest.mark.guard(3 * DAY)
async def test_the_tool_profile_limits_what_a_heartbeat_may_call(autojump_clock):
    agent = HeartbeatAgent("tool")
    async with running(agent) as (n, hb):
        await hb.set(enabled=True, interval_minutes=15)
        await trio.sleep(15 * 60 + 1)
        (turn,) = agent.turns
        assert {t.name for t in turn.tools} == {"echo", "clock.now"}  # what exists ∩ profile
        assert agent.refused == [
            {
                "code": "not_allowed",
                "message": "tool 'set_heartbeat' is not allowed in this turn's tool profile",
            }
        ]


@pytest.mark.guard(3 * DAY)
@pytest.mark.parametrize(("policy", "turns", "state"), [
    ("skip", 2, "active"),
    ("retry_once", 4, "active"),
    ("disable", 1, "cancelled"),
])  # fmt: skip
async def test_on_error_policies(autojump_clock, policy, turns, state):
    agent = HeartbeatAgent("fail")
    async with running(agent) as (n, hb):
        made = await hb.set(enabled=True, interval_minutes=15, on_error=policy)
        watcher = await hb.watch("s.heartbeat")
        await trio.sleep(30 * 60 + 1)
        assert len(agent.turns) == turns
        assert (await n.store.get_job(made["heartbeat_id"])).state == state
        if policy == "disable":
            assert "heartbeat_disabled" in kinds(watcher)


async def test_bad_heartbeat_settings_are_refused(autojump_clock):
    async with running(HeartbeatAgent()) as (n, hb):
        cases = [
            ({"enabled": True, "interval_minutes": 5}, "$.interval_minutes"),
            ({"enabled": True, "active_hours_start": "9am", "active_hours_end": "17:00"},
             "$.active_hours_start"),
            ({"enabled": True, "active_hours_start": "09:00"}, "active_hours_end"),
            ({"enabled": True, "timezone": "Mars/Base"}, "timezone"),
            ({"enabled": True, "tool_profile": "root"}, "$.tool_profile"),
        ]  # fmt: skip
        for arguments, field in cases:
            result = await hb.tools.call("s", "ada", "set_heartbeat", arguments)
            assert not result.ok and result.error.get("field") == field, (arguments, result)
        off = await hb.tools.call("s", "ada", "set_heartbeat", {"enabled": False})
        assert off.data == {"enabled": False, "session_id": "s"}


def test_the_agents_heartbeat_defaults_fill_what_a_call_leaves_out():
    from runtime.errors import InvalidArgument
    from tools.heartbeat import heartbeat_params

    params = heartbeat_params({"interval_minutes": 60, "checklist": "open PRs?", "session": "main"})
    made = msgspec.convert({"enabled": True}, params)
    assert (made.interval_minutes, made.checklist, made.session) == (60, "open PRs?", "main")
    assert msgspec.convert({"enabled": True, "interval_minutes": 15}, params).interval_minutes == 15
    assert (
        msgspec.json.schema(params)["$defs"]["SetHeartbeat"]["properties"]["interval_minutes"][
            "default"
        ]
        == 60
    )
    with pytest.raises(InvalidArgument) as info:
        heartbeat_params({"interval_minutes": 5})
    assert info.value.field == "heartbeat.interval_minutes"
