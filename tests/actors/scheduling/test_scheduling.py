"""The scheduling primitives as an agent calls them, on trio's MockClock."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import trio
import trio.testing

from tests.support.agents import GatedAgent, SeeingAgent
from tests.support.mock_node import DAY, T0, node
from turnstile.actors.scheduling.tools import register_scheduling_tools
from turnstile.actors.sessions.agents.base import AgentError
from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.registry import ToolRegistry


async def tools_for(n):
    registry = ToolRegistry()
    register_scheduling_tools(registry, n.scheduler, n.store, n.clock)

    async def call(name, **arguments):
        return await registry.call("s", "ada", name, arguments)

    return call


@pytest.mark.guard(3 * DAY)
async def test_schedule_once_echoes_what_it_understood_and_fires_a_notification(autojump_clock):
    async with node() as n:
        call = await tools_for(n)
        result = await call("schedule_once", when="in 2h 15m", prompt="stretch", label="break")
        assert result.ok, result.error
        data = result.data
        assert data["run_at"] == "2026-11-21T14:15:00Z"
        assert data["understood"].startswith("in 2h 15m")
        assert (data["schedule_type"], data["status"], data["action_type"]) == (
            "once",
            "active",
            "notification",
        )
        await trio.sleep(2 * 3600 + 15 * 60)
        await n.seen.until(b'"stream_end"')
        (start,) = n.starts()
        assert (
            start["content"]
            == f"[SCHEDULED NOTIFICATION] job_id={data['job_id']} label=break\nstretch"
        )
        assert start["source"] == "schedule"


@pytest.mark.guard(12 * DAY)
async def test_schedule_cron_in_a_timezone_and_list_status_cancel(autojump_clock):
    async with node() as n:
        call = await tools_for(n)
        made = await call(
            "schedule_cron",
            cron="every Monday at 10am",
            timezone="Europe/Paris",
            action_type="llm_prompt",
            prompt="weekly plan",
        )
        assert made.ok, made.error
        job = made.data
        assert (job["cron"], job["timezone"]) == ("0 10 * * 1", "Europe/Paris")
        assert job["next_run_at"] == "2026-11-23T09:00:00Z"  # 10:00 in Paris is 09:00Z in winter
        await trio.sleep(3 * DAY)
        await n.seen.until(b'"stream_end"')
        assert [s["content"] for s in n.starts()] == ["weekly plan"]
        status = (await call("schedule_status", job_id=job["job_id"])).data
        assert status["run_count"] == 1
        assert status["recent_runs"][0]["state"] == "turn_completed"
        assert status["recent_runs"][0]["scheduled_for"] == "2026-11-23T09:00:00Z"
        listed = (await call("schedule_list")).data
        assert (listed["total"], listed["active"]) == (1, 1)
        assert listed["jobs"][0]["last_run_at"] == "2026-11-23T09:00:00Z"
        assert listed["jobs"][0]["last_run_status"] == "turn_completed"
        assert (await call("schedule_list", status="active")).data["total"] == 1
        assert (await call("schedule_list", status="failed")).data["total"] == 0
        refused = await call("schedule_list", status="sleeping")
        assert (refused.error["code"], refused.error["field"]) == ("bad_arguments", "$.status")
        cancelled = await call("schedule_cancel", job_id=job["job_id"])
        assert cancelled.data == {"job_id": job["job_id"], "status": "cancelled"}
        await trio.sleep(7 * DAY)
        assert len(n.starts()) == 1


class FailingAgent(GatedAgent):
    """Fails every turn whose input says ``boom``."""

    async def run_turn(self, turn) -> str:
        if "boom" in turn.input.content:
            raise AgentError("it went boom")
        return await super().run_turn(turn)


@pytest.mark.guard(3 * DAY)
async def test_schedule_list_filters_on_every_state_a_failed_run_makes_a_failed_job(
    autojump_clock,
):
    """The reference's states (active, paused, completed, failed) and cancelled: a job whose
    last run failed is ``failed``; the filter was refused before."""
    async with node(agent=FailingAgent()) as n:
        call = await tools_for(n)

        async def make(tool, **arguments) -> str:
            made = await call(tool, action_type="llm_prompt", **arguments)
            assert made.ok, made.error
            return made.data["job_id"]

        ids = {
            "failed": await make("schedule_once", when="in 1h", prompt="boom"),
            "completed": await make("schedule_once", when="in 1h", prompt="fine"),
            "active": await make("schedule_cron", cron="every day at 9am", prompt="daily"),
            "paused": await make("schedule_cron", cron="every day at 10am", prompt="later"),
            "cancelled": await make("schedule_once", when="in 5h", prompt="never"),
        }
        failing = await make("schedule_cron", cron="every day at 1pm", prompt="boom daily")
        assert (await call("schedule_pause", job_id=ids["paused"])).ok
        assert (await call("schedule_cancel", job_id=ids["cancelled"])).ok
        await trio.sleep(2 * 3600)  # both one-off jobs ran, and the daily boom at 13:00
        await n.seen.until(b'"stream_end"', 3)
        listed = (await call("schedule_list")).data
        status = {job["job_id"]: job["status"] for job in listed["jobs"]}
        assert status == {**{job_id: name for name, job_id in ids.items()}, failing: "failed"}
        assert (listed["total"], listed["failed"], listed["active"]) == (6, 2, 1)
        by_id = {job["job_id"]: job for job in listed["jobs"]}
        assert by_id[failing]["last_run_status"] == "turn_failed"
        assert "next_run_at" in by_id[failing]  # failed, and fires again tomorrow
        assert "next_run_at" not in by_id[ids["failed"]]
        for name in ("active", "paused", "completed", "cancelled"):
            only = (await call("schedule_list", status=name)).data
            assert [job["job_id"] for job in only["jobs"]] == [ids[name]], name
        failed = (await call("schedule_list", status="failed")).data
        assert {job["job_id"] for job in failed["jobs"]} == {ids["failed"], failing}
        shown = (await call("schedule_status", job_id=ids["failed"])).data
        assert (shown["status"], shown["last_run_status"]) == ("failed", "turn_failed")


@pytest.mark.guard(5 * DAY)
async def test_a_job_is_paused_and_resumed(autojump_clock):
    async with node() as n:
        call = await tools_for(n)
        daily = (await call("schedule_cron", cron="every day at 9am", prompt="standup")).data
        paused = await call("schedule_pause", job_id=daily["job_id"])
        assert paused.ok, paused.error
        assert (paused.data["status"], paused.data["next_run_at"]) == (
            "paused",
            "2026-11-22T09:00:00Z",
        )
        again = await call("schedule_pause", job_id=daily["job_id"])
        assert again.data["status"] == "paused"  # a paused job answers as it is
        await trio.sleep(2 * DAY)  # two 9 o'clocks pass: nothing fires
        assert n.starts() == []
        resumed = await call("schedule_resume", job_id=daily["job_id"])
        assert resumed.ok, resumed.error
        # from its next occurrence after now (14:00 on the 23rd): the missed ones are not run
        assert (resumed.data["status"], resumed.data["next_run_at"]) == (
            "active",
            "2026-11-24T09:00:00Z",
        )
        await trio.sleep(DAY)
        await n.seen.until(b'"stream_end"')
        assert [s["content"] for s in n.starts()] == [
            f"[SCHEDULED NOTIFICATION] job_id={daily['job_id']}\nstandup"
        ]

        # a one-off job whose time passes while it is paused fires when it is resumed
        once = (await call("schedule_once", when="in 1h", prompt="tea")).data
        await call("schedule_pause", job_id=once["job_id"])
        await trio.sleep(3 * 3600)
        assert len(n.starts()) == 1
        assert (await call("schedule_resume", job_id=once["job_id"])).data["status"] == "active"
        await n.seen.until(b'"stream_start"', 2)
        assert n.starts()[-1]["content"].endswith("\ntea")
        frames = [json.loads(f) for f in n.seen.frames if b'"job_update"' in f]
        updates = [f["event"] for f in frames]
        assert updates.count("paused") == 2 and updates.count("resumed") == 2

        # a job that is done cannot change; another session's job is not found
        await trio.testing.wait_all_tasks_blocked()
        done = await call("schedule_pause", job_id=once["job_id"])
        assert done.error == {
            "code": "conflict",
            "message": f"job {once['job_id']!r} is completed; only a pending job can change",
        }
        registry = ToolRegistry()
        register_scheduling_tools(registry, n.scheduler, n.store, n.clock)
        other = await registry.call("t", "ada", "schedule_resume", {"job_id": daily["job_id"]})
        assert other.error["code"] == "not_found"


@pytest.mark.guard(2 * DAY)
async def test_remember_understands_french(autojump_clock):
    async with node() as n:
        call = await tools_for(n)
        reminder = await call("remember", what="check the deploy", when="demain à 9h")
        assert reminder.ok and reminder.data["run_at"] == "2026-11-22T09:00:00Z"
        assert reminder.data["action_type"] == "notification"
        await trio.sleep(DAY)
        await n.seen.until(b'"stream_end"')
        assert "check the deploy" in n.starts()[0]["content"]


@pytest.mark.parametrize(
    ("arguments", "code", "message"),
    [
        ({"when": "blorp", "prompt": "x"}, "invalid_argument", "could not understand 'blorp'"),
        ({"when": "every day at 9am", "prompt": "x"}, "invalid_argument", "use schedule_cron"),
        ({"when": "in 5m"}, "invalid_argument", "notification needs a prompt"),
        ({"when": "in 5m", "prompt": "x", "output_channel": "slack"}, "invalid_argument",
         "output channel 'slack' is not configured (available: llm_notification)"),
        ({"when": "in 5m", "prompt": "x", "action_type": "tool_call"}, "invalid_argument",
         "tool_call needs tool_name"),
        ({"when": "in 5m", "prompt": "x", "surprise": 1}, "bad_arguments",
         "unknown field at $.surprise"),
        ({"when": "2020-01-01T00:00:00Z", "prompt": "x"}, "invalid_argument", "is in the past"),
    ],
)  # fmt: skip
async def test_bad_schedule_once_calls_are_typed_errors(autojump_clock, arguments, code, message):
    async with node() as n:
        call = await tools_for(n)
        result = await call("schedule_once", **arguments)
        assert not result.ok
        assert result.error["code"] == code
        assert message in result.error["message"]


async def test_jobs_of_another_session_are_not_found(autojump_clock):
    async with node() as n:
        await n.store.create_session("other", "bob")
        call = await tools_for(n)
        made = (await call("schedule_once", when="in 1h", prompt="mine")).data
        registry = ToolRegistry()
        register_scheduling_tools(registry, n.scheduler, n.store, n.clock)
        theirs = await registry.call("other", "bob", "schedule_cancel", {"job_id": made["job_id"]})
        assert theirs.error == {
            "code": "not_found",
            "message": f"no job with id {made['job_id']!r}",
        }
        assert (await registry.call("other", "bob", "schedule_list", {})).data["total"] == 0
        assert n.clock.now() - T0 < timedelta(minutes=1)


@pytest.mark.guard(2 * DAY)
async def test_a_scheduled_tool_call_runs_the_tool_and_hands_the_agent_its_result(autojump_clock):
    from turnstile.runtime.clock import SystemClock
    from turnstile.tools.builtin import register_builtin_tools

    session_tools = ToolRegistry()
    register_builtin_tools(session_tools, SystemClock())
    async with node(tools=session_tools) as n:
        call = await tools_for(n)
        made = await call(
            "schedule_once",
            when="in 10m",
            action_type="tool_call",
            tool_name="echo",
            tool_params={"text": "pong"},
        )
        assert made.ok, made.error
        await trio.sleep(600)
        await n.seen.until(b'"stream_end"')
        assert n.seen.count(b'"tool_call"') == 1
        (end,) = n.ends()
        job_id = made.data["job_id"]
        assert end["text"] == (
            f'reply:[SCHEDULED TOOL RESULT] job_id={job_id} tool=echo ok=true\n{{"text":"pong"}}'
        )


@pytest.mark.guard(2 * DAY)
async def test_a_jobs_notification_and_tool_result_are_notices_its_prompt_is_not(autojump_clock):
    """What a job delivers into the session reaches the model as the runtime speaking (a
    system message, execution-primitives reference) when it is a notification or a tool's
    result (``TurnInput.notice``, ``stream_start.notice``, the history entry's ``notice``); a
    prompt is for the agent to answer, as the user's turn would be."""
    from turnstile.runtime.clock import SystemClock
    from turnstile.tools.builtin import register_builtin_tools

    session_tools = ToolRegistry()
    register_builtin_tools(session_tools, SystemClock())
    agent = SeeingAgent()
    async with node(tools=session_tools, agent=agent) as n:
        call = await tools_for(n)
        for arguments in (
            {"when": "in 10m", "prompt": "stretch"},
            {"when": "in 20m", "action_type": "tool_call", "tool_name": "echo",
             "tool_params": {"text": "pong"}},
            {"when": "in 30m", "action_type": "llm_prompt", "prompt": "plan the day"},
        ):  # fmt: skip
            assert (await call("schedule_once", **arguments)).ok
        await trio.sleep(1800)
        await n.seen.until(b'"stream_end"', 3)
        notification, tool_result, prompt = agent.inputs
        assert notification.content.startswith("[SCHEDULED NOTIFICATION]")
        assert tool_result.content.startswith("[SCHEDULED TOOL RESULT]")
        assert [i.notice for i in agent.inputs] == [True, True, False]
        assert [s.get("notice") for s in n.starts()] == [True, True, None]
        entries = [e for e in agent.histories[-1] if e.role == "user"]
        assert [e.notice for e in entries] == [True, True]


@pytest.mark.guard(2 * DAY)
async def test_output_channel_sends_a_scheduled_notification_to_that_channel(autojump_clock):
    sent = []

    async def notify(session_id, owner, channel, text, **fields):
        sent.append((session_id, owner, channel, text, fields["source"]))
        return {"channel": channel, "delivered": True, "fallback": False}

    def check_channel(channel, output_config):
        if channel not in ("llm_notification", "ops"):
            raise InvalidArgument(f"no channel named {channel!r}", field="channel")

    async with node(notify=notify) as n:
        registry = ToolRegistry()
        register_scheduling_tools(registry, n.scheduler, n.store, n.clock, check_channel)
        made = await registry.call(
            "s", "ada", "schedule_once",
            {"when": "in 1h", "prompt": "deploy window opens", "output_channel": "ops"},
        )  # fmt: skip
        assert made.ok, made.error
        refused = await registry.call(
            "s", "ada", "schedule_once", {"when": "in 1h", "prompt": "x", "output_channel": "pager"}
        )
        assert refused.error["message"] == "no channel named 'pager'"
        await trio.sleep(3600)
        await n.seen.until(b'"stream_end"')
        ((sid, owner, channel, text, source),) = sent
        assert (sid, owner, channel, source) == ("s", "ada", "ops", "schedule")
        assert text.endswith("deploy window opens")
        assert n.ends()[0]["text"] == "delivered to ops"  # no model turn was spent
        assert n.agent.running == []
