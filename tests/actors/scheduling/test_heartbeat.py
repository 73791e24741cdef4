"""Heartbeats on trio's MockClock: interval, active hours, suppression, profiles, on_error."""

from __future__ import annotations

import json
from datetime import timedelta

import msgspec
import pytest
import trio

from tests.support.mock_node import DAY, T0, node
from tests.support.sessions import Recorder
from turnstile.actors.scheduling.heartbeat import (
    HEARTBEAT_PROFILES,
    disable_heartbeat,
    heartbeat_view,
    register_heartbeat_tools,
)
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.actor import Attach
from turnstile.actors.sessions.agents.base import AgentError
from turnstile.actors.sessions.directory import create_derived_session
from turnstile.tools.builtin import register_builtin_tools
from turnstile.tools.registry import ToolRegistry


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
    """``async with running(agent) as (n, hb)``: a mock-clock node with heartbeat tools, whose
    notifications (``notify``) are recorded in ``alerts``."""

    def __init__(self, agent, defaults=None) -> None:
        self.agent = agent
        self.tools = ToolRegistry()
        self.defaults = defaults
        self.alerts: list[dict] = []

    async def _notify(self, session_id, owner, channel, message, **options):
        self.alerts.append(
            {"session_id": session_id, "owner": owner, "channel": channel, "message": message}
        )
        return {"channel": channel, "delivered": True}

    async def __aenter__(self):
        self._node = node(
            tools=self.tools,
            profiles=HEARTBEAT_PROFILES,
            agent=self.agent,
            notify=self._notify,
            disable_job=lambda n, job_id: disable_heartbeat(n.store, n.scheduler, job_id),
        )
        n = await self._node.__aenter__()
        register_builtin_tools(self.tools, n.clock)
        register_heartbeat_tools(
            self.tools,
            n.scheduler,
            n.store,
            n.clock,
            lambda parent, suffix: create_derived_session(n.store, 100, parent, suffix),
            defaults=self.defaults,
        )
        self.hb = Heartbeats(n, self.tools)
        self.hb.alerts = self.alerts
        return n, self.hb

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
        runs = await JobStore(n.store).list_runs(made["heartbeat_id"])
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
        runs = await JobStore(n.store).list_runs(made["heartbeat_id"], limit=100)
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
        assert (await JobStore(n.store).get_job(made["heartbeat_id"])).state == state
        if policy == "disable":
            assert "heartbeat_disabled" in kinds(watcher)
            # The owner is alerted in the parent session, and the settings are kept, disabled.
            (alert,) = hb.alerts
            assert (alert["session_id"], alert["channel"]) == ("s", "llm_notification")
            assert made["heartbeat_id"] in alert["message"]
            view = await heartbeat_view(n.store, "s")
            assert (view["heartbeat"]["enabled"], view["heartbeat"]["on_error"]) == (
                False,
                "disable",
            )
        else:
            assert hb.alerts == []


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
        assert (off.data["enabled"], off.data["session_id"]) == (False, "s")
        unknown = {"enabled": True, "alert_channel": ""}
        result = await hb.tools.call("s", "ada", "set_heartbeat", unknown)
        assert result.error["field"] == "$.alert_channel"


async def test_the_agents_heartbeat_defaults_fill_what_a_call_leaves_out(autojump_clock):
    from turnstile.actors.scheduling.heartbeat import heartbeat_params
    from turnstile.runtime.errors import InvalidArgument

    defaults = {"interval_minutes": 60, "checklist": "open PRs?", "session": "main"}
    async with running(HeartbeatAgent(), defaults=defaults) as (n, hb):
        made = await hb.set(enabled=True)
        assert (made["interval_minutes"], made["session_id"]) == (60, "s")
        kept = (await heartbeat_view(n.store, "s"))["heartbeat"]
        assert kept["checklist"] == "open PRs?"
        again = await hb.set(enabled=True, interval_minutes=15)  # only what it names changes
        assert (again["interval_minutes"], again["session_id"]) == (15, "s")
    schema = msgspec.json.schema(heartbeat_params(defaults))["$defs"]["SetHeartbeat"]
    assert schema["properties"]["interval_minutes"]["default"] == 60
    assert schema["required"] == ["enabled"]
    with pytest.raises(InvalidArgument) as info:
        heartbeat_params({"interval_minutes": 5})
    assert info.value.field == "heartbeat.interval_minutes"


@pytest.mark.guard(3 * DAY)
async def test_disabling_keeps_the_settings_and_enabling_resumes_them(autojump_clock):
    agent = HeartbeatAgent("loud")
    async with running(agent) as (n, hb):
        first = await hb.set(
            enabled=True,
            interval_minutes=20,
            checklist="Is the deploy green?",
            active_hours_start="08:00",
            active_hours_end="23:00",
            tool_profile="heartbeat_active",
            suppress_threshold=10,
        )
        off = await hb.set(enabled=False)
        assert off["kept"]["checklist"] == "Is the deploy green?"
        assert (await JobStore(n.store).get_job(first["heartbeat_id"])).state == "cancelled"
        await trio.sleep(3600)
        assert agent.turns == []  # disabled: nothing runs
        view = await heartbeat_view(n.store, "s")
        assert view["heartbeat"]["enabled"] is False
        assert view["heartbeat"]["interval_minutes"] == 20
        back = await hb.set(enabled=True)  # nothing re-entered
        assert back["understood"] == "every 20 minutes, 08:00–23:00 UTC"
        assert (back["tool_profile"], back["suppress_threshold"]) == ("heartbeat_active", 10)
        await trio.sleep(20 * 60 + 1)
        (turn,) = agent.turns
        assert turn.input.system_segment.endswith("Your checklist:\nIs the deploy green?")


@pytest.mark.guard(3 * DAY)
async def test_the_runs_are_listed_with_what_each_found(autojump_clock):
    agent = HeartbeatAgent("quiet")
    async with running(agent) as (n, hb):
        made = await hb.set(enabled=True, interval_minutes=15)
        await trio.sleep(15 * 60 + 1)
        agent.mode = "loud"
        await trio.sleep(15 * 60)
        view = await heartbeat_view(n.store, "s")
        assert view["heartbeat"]["heartbeat_id"] == made["heartbeat_id"]
        assert view["heartbeat"]["session_id"] == "s.heartbeat"
        loud, quiet = view["runs"]  # newest first
        assert (quiet["suppressed"], quiet["response"]) == (True, "All clear.")
        assert quiet["state"] == "turn_completed"
        assert loud["suppressed"] is False and loud["response"].startswith("Found a problem")
        assert loud["scheduled_for"] == "2026-11-21T12:30:00Z"


def test_the_heartbeat_profile_looks_and_reports_and_the_active_one_writes():
    look = HEARTBEAT_PROFILES["heartbeat"]
    assert {"filesystem.read", "filesystem.list", "http.get", "send_notification"} <= look
    assert "shell.read" in look  # the reference's read-only shell commands, not the shell
    assert not {"filesystem.write", "http.post", "shell.run", "run_parallel"} & look
    active = HEARTBEAT_PROFILES["heartbeat_active"]
    assert look < active and {"filesystem.write", "http.download"} <= active
    assert not {"shell.run", "run_parallel", "background_run"} & active
