"""The session-bound cron tool and the automations that block deleting a session (MockClock)."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
import trio
import trio.testing

from tests.support.agents import SeeingAgent
from tests.support.mock_node import DAY, T0, node
from turnstile.actors.scheduling.actor import Schedule, SchedulerActor, SchedulerLimits
from turnstile.actors.scheduling.checks import register_check_tools
from turnstile.actors.scheduling.cron import (
    bound_automations,
    cancel_bound_automations,
    register_cron_tool,
    render_trigger,
)
from turnstile.actors.scheduling.spec import job_spec
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.actor import SetPolicy, Submit, history_from_events
from turnstile.tools.registry import ToolRegistry

MONITOR = "Check the deploy dashboard and report anything red."


def tools_for(n):
    registry = ToolRegistry()
    register_cron_tool(registry, n.scheduler, n.store, n.clock)
    register_check_tools(registry, n.scheduler, n.store, n.clock)

    async def call(tool, /, session="s", owner="ada", **arguments):
        return await registry.call(session, owner, tool, arguments)

    return call


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.guard(3 * DAY)
async def test_cron_add_binds_the_job_to_the_session_and_each_run_is_a_trigger_turn(
    autojump_clock,
):
    async with node(agent=SeeingAgent()) as n:
        call = tools_for(n)
        made = await call(
            "cron", action="add", schedule="0 13 * * *", prompt=MONITOR, name="daily-monitor"
        )
        assert made.ok, made.error
        job_id = made.data["job_id"]
        assert made.data == {
            "job_id": job_id,
            "name": "daily-monitor",
            "session_id": "s",
            "status": "active",
            "cron": "0 13 * * *",
            "timezone": "UTC",
            "next_run_at": "2026-11-21T13:00:00Z",
            "run_count": 0,
            "prompt_ref": "daily-monitor@v1",
            "prompt_sha256": sha(MONITOR),
            "prompt": MONITOR,
            "understood": "every day at 13:00 UTC — next 2026-11-21T13:00:00Z",
        }
        await trio.sleep(3600 - 1)
        assert n.starts() == []
        await n.seen.until(b'"stream_end"')
        assert n.clock.now() == T0 + timedelta(hours=1)  # on the dot
        trigger = f"[CRON] job={job_id} prompt=daily-monitor@v1\n{MONITOR}"
        (start,) = n.starts()
        assert (start["source"], start["content"], start["label"]) == (
            "cron",
            trigger,
            "daily-monitor",
        )
        assert n.ends()[0]["text"] == f"reply:{trigger}"
        await trio.testing.wait_all_tasks_blocked()
        (run,) = await JobStore(n.store).list_runs(job_id)
        assert (start["job_id"], start["run_id"]) == (job_id, run.id)
        assert run.state == "turn_completed"
        assert run.detail["prompt"] == trigger  # the full rendered prompt, in the run record
        variables = {"job_id": job_id, "name": "daily-monitor", "version": 1, "prompt": MONITOR}
        assert run.detail["prompt_variables"] == variables  # ... and what it was rendered from
        assert render_trigger(**variables) == trigger
        assert run.detail["status"] == "completed"
        (item,) = await n.store.list_inputs("s")
        assert item.source == "cron" and item.payload["cron_job_name"] == "daily-monitor"
        assert item.payload["prompt_ref"] == {
            "name": "daily-monitor",
            "version": 1,
            "sha256": sha(MONITOR),
            "template": "cron.trigger@v1",
        }
        assert "prompt_text" not in item.payload  # the job holds the prompt, not every input
        # the transcript entry carries the trigger's metadata (cron-session-binding.md)
        entry, answer = history_from_events(await n.store.read_events("s"))
        assert (entry.role, entry.content, entry.is_recall) == ("user", trigger, False)
        assert (entry.cron_turn, entry.cron_job_name) == (True, "daily-monitor")
        assert (entry.cron_job_id, entry.cron_run_id) == (job_id, run.id)
        assert entry.cron_prompt_ref == item.payload["prompt_ref"]
        # the answer is the turn's ordinary assistant entry, with its source, for rendering
        assert (answer.role, answer.content, answer.status) == (
            "assistant",
            f"reply:{trigger}",
            "completed",
        )
        assert (answer.source, answer.cron_job_id, answer.cron_job_name) == (
            "cron",
            job_id,
            "daily-monitor",
        )
        assert not answer.cron_turn and answer.cron_run_id is None
        end = n.ends()[0]
        assert (end["source"], end["job_id"], end["label"]) == ("cron", job_id, "daily-monitor")
        await trio.sleep(DAY - 1)
        await n.seen.until(b'"stream_end"', 2)
        assert n.clock.now() == T0 + timedelta(days=1, hours=1)
        runs = await JobStore(n.store).list_runs(job_id)
        assert sorted(r.scheduled_for for r in runs) == [
            T0 + timedelta(hours=1),
            T0 + timedelta(days=1, hours=1),
        ]
        # the next cron turn's agent reads the same entries in its history
        assert n.agent.histories[-1][:2] == [entry, answer]


async def test_a_recurring_phrase_in_the_sessions_timezone_and_a_derived_name(autojump_clock):
    async with node() as n:
        await n.store.update_session("s", metadata={"timezone": "Europe/Paris"})
        call = tools_for(n)
        made = (
            await call(
                "cron", action="add", schedule="every weekday at 9am", prompt="Summarise alerts!"
            )
        ).data
        assert (made["cron"], made["timezone"], made["next_run_at"]) == (
            "0 9 * * 1-5",
            "Europe/Paris",
            "2026-11-23T08:00:00Z",  # T0 is a Saturday; 09:00 in Paris is 08:00Z in winter
        )
        assert (made["name"], made["prompt_ref"]) == ("summarise-alerts", "summarise-alerts@v1")
        assert made["understood"] == (
            "every weekday at 09:00 Europe/Paris — next 2026-11-23T08:00:00Z"
        )
        other = (
            await call(
                "cron",
                action="add",
                schedule="tous les lundis à 10h",
                prompt="plan",
                timezone="America/New_York",
            )
        ).data
        assert (other["cron"], other["timezone"], other["next_run_at"]) == (
            "0 10 * * 1",
            "America/New_York",
            "2026-11-23T15:00:00Z",
        )


async def test_the_prompt_version_names_one_exact_text(autojump_clock):
    async with node() as n:
        call = tools_for(n)

        async def add(prompt):
            return await call("cron", action="add", schedule="0 9 * * *", prompt=prompt, name="r")

        first = (await add("report A")).data
        assert first["prompt_ref"] == "r@v1"
        twice = await add("report B")
        assert twice.error == {
            "code": "already_exists",
            "message": f"cron job 'r' already exists in this session (job_id={first['job_id']}): "
            "remove it first, or choose another name",
        }
        gone = await call("cron", action="remove", name="r")
        assert gone.data == {"job_id": first["job_id"], "name": "r", "status": "cancelled"}
        same = (await add("report A")).data  # the same text keeps its version
        assert same["prompt_ref"] == "r@v1" and same["job_id"] != first["job_id"]
        await call("cron", action="remove", job_id=same["job_id"])
        changed = (await add("report B")).data  # a new text is a new version
        assert (changed["prompt_ref"], changed["prompt_sha256"]) == ("r@v2", sha("report B"))
        job = await JobStore(n.store).get_job(changed["job_id"])
        spec = job_spec(job)
        assert spec.prompt == f"[CRON] job={job.id} prompt=r@v2\nreport B"
        assert (spec.prompt_version, spec.prompt_text) == (2, "report B")


@pytest.mark.guard(2 * DAY)
async def test_cron_list_shows_this_sessions_cron_jobs_with_their_last_run(autojump_clock):
    async with node() as n:
        await n.store.create_session("s2", "ada")
        call = tools_for(n)
        hourly = (
            await call("cron", action="add", schedule="30 * * * *", prompt="tick", name="tick")
        ).data
        await call("cron", action="add", schedule="0 9 * * *", prompt="x" * 300, name="long")
        await call("cron", action="add", session="s2", schedule="0 9 * * *", prompt="elsewhere")
        await call("schedule_check", delay_minutes=90, instructions="not a cron job")
        await trio.sleep(3600)
        await n.seen.until(b'"stream_end"')
        await trio.testing.wait_all_tasks_blocked()
        listed = (await call("cron", action="list")).data
        assert (listed["session_id"], listed["total"]) == ("s", 2)
        tick, long = listed["jobs"]
        (run,) = await JobStore(n.store).list_runs(hourly["job_id"])
        assert tick["last_run"] == {
            "run_id": run.id,
            "scheduled_for": "2026-11-21T12:30:00Z",
            "state": "turn_completed",
        }
        assert (tick["run_count"], tick["next_run_at"]) == (1, "2026-11-21T13:30:00Z")
        assert long["prompt"] == "x" * 200 + "…" and "last_run" not in long


async def test_cron_remove_is_for_this_sessions_live_cron_jobs(autojump_clock):
    async with node() as n:
        await n.store.create_session("s2", "ada")
        call = tools_for(n)
        theirs = (
            await call("cron", action="add", session="s2", schedule="@daily", prompt="a")
        ).data
        check = (await call("schedule_check", delay_minutes=5, instructions="c")).data
        for job_id in (theirs["job_id"], check["scheduled_id"], "nope"):
            refused = await call("cron", action="remove", job_id=job_id)
            assert refused.error == {
                "code": "not_found",
                "message": f"no cron job with id {job_id!r} in this session",
            }
        assert (await call("cron", action="remove", name="zzz")).error["message"] == (
            "no cron job named 'zzz' in this session"
        )
        assert (await call("cron", action="remove")).error == {
            "code": "invalid_argument",
            "message": "cron remove needs job_id or name",
            "field": "job_id",
        }
        mine = (await call("cron", action="add", schedule="@daily", prompt="b")).data
        assert (await call("cron", action="remove", job_id=mine["job_id"])).ok
        again = await call("cron", action="remove", job_id=mine["job_id"])
        assert again.error["message"] == f"cron job {mine['job_id']!r} is already cancelled"


@pytest.mark.guard(2 * DAY)
async def test_a_cron_occurrence_during_a_turn_waits_and_is_never_injected(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        session = n.registry.ref("session:s")
        await session.ask(SetPolicy(policy="inject"))  # even a session that folds user input in
        await session.ask(Submit(content="wait:long"))
        made = (await call("cron", action="add", schedule="0 13 * * *", prompt="digest")).data
        await trio.sleep(2 * 3600)  # 13:00 passes while the turn runs
        assert [s["content"] for s in n.starts()] == ["wait:long"]
        assert n.seen.count(b'"user_message"') == 0
        assert n.agent.running == ["wait:long"]
        (run,) = await JobStore(n.store).list_runs(made["job_id"])
        assert run.state == "queued"  # enqueued, not completed by being enqueued
        n.agent.gate("wait:long").set()
        await n.seen.until(b'"stream_end"', 2)
        trigger = f"[CRON] job={made['job_id']} prompt=digest@v1\ndigest"
        assert [(s["source"], s["content"]) for s in n.starts()] == [
            ("user", "wait:long"),
            ("cron", trigger),
        ]
        assert [e["text"] for e in n.ends()] == ["reply:wait:long", f"reply:{trigger}"]
        await trio.testing.wait_all_tasks_blocked()
        (run,) = await JobStore(n.store).list_runs(made["job_id"])
        assert run.state == "turn_completed"
        assert run.detail["late_seconds"] == 0  # fired on time, waited in the inbox


@pytest.mark.parametrize(
    ("arguments", "code", "message", "field"),
    [
        ({"schedule": "61 * * * *"}, "invalid_argument",
         "bad cron expression '61 * * * *': minute 61 is out of range 0-59", "schedule"),
        ({"schedule": "tomorrow at 9am"}, "invalid_argument",
         "'tomorrow at 9am' happens once (tomorrow at 09:00 UTC — 2026-11-22T09:00:00Z); a cron "
         "job must recur: use schedule_once or schedule_check for one-shots", "schedule"),
        ({"schedule": "every minute"}, "invalid_argument",
         "cron fires more often than every 300 seconds", "schedule"),
        ({"schedule": "blorp"}, "invalid_argument",
         "could not understand 'blorp' as a time: try 'in 5m', 'tomorrow at 9am', "
         "'every Monday at 10am', a cron expression or ISO 8601", "schedule"),
        ({"schedule": "@daily", "timezone": "Mars/Olympus"}, "invalid_argument",
         "unknown timezone 'Mars/Olympus'", "timezone"),
        ({"schedule": None}, "invalid_argument", "cron add needs a schedule", "schedule"),
        ({"prompt": " "}, "invalid_argument", "cron add needs a prompt", "prompt"),
        ({"prompt": "x" * 4001}, "bad_arguments",
         "expected `str` of length <= 4000 at $.prompt", "$.prompt"),
        ({"name": "a b"}, "invalid_argument",
         "name must be letters, digits, '_', '.' or '-', starting with a letter or digit "
         "(e.g. 'daily-monitor'), got 'a b'", "name"),
        ({"deliver": True}, "bad_arguments", "unknown field at $.deliver", "$.deliver"),
        ({"action": "update"}, "bad_arguments",
         "invalid enum value 'update' at $.action", "$.action"),
    ],
)  # fmt: skip
async def test_bad_cron_adds_are_typed_errors(autojump_clock, arguments, code, message, field):
    async with node() as n:
        arguments = {"action": "add", "schedule": "@daily", "prompt": "p", **arguments}
        arguments = {k: v for k, v in arguments.items() if v is not None}
        result = await tools_for(n)("cron", **arguments)
        assert not result.ok
        assert result.error == {"code": code, "message": message, "field": field}
        assert await JobStore(n.store).list_jobs() == []


async def test_cron_needs_the_callers_session(autojump_clock):
    async with node() as n:
        await n.store.create_session("b", "bob")
        call = tools_for(n)
        empty = await call("cron", session="", action="list")
        assert empty.error == {
            "code": "invalid_argument",
            "message": "a cron job belongs to a session: call it from a session's turn",
            "field": "session_id",
        }
        for session in ("ghost", "b"):  # unknown, or someone else's
            refused = await call(
                "cron", session=session, action="add", schedule="@daily", prompt="p"
            )
            assert refused.error == {
                "code": "not_found",
                "message": f"no session with id {session!r}: a cron job needs its session",
            }
        assert await JobStore(n.store).list_jobs() == []


async def test_the_jobs_per_session_limit_is_a_typed_error(autojump_clock):
    async with node(start_scheduler=False) as n:
        limits = SchedulerLimits(max_jobs_per_session=1, min_interval_seconds=300)
        n.scheduler = await n.sup.spawn(
            lambda: SchedulerActor(n.store, n.clock, publish=n.publish, limits=limits),
            name="small",
        )
        call = tools_for(n)
        assert (await call("cron", action="add", schedule="@daily", prompt="one")).ok
        refused = await call("cron", action="add", schedule="@hourly", prompt="two")
        assert refused.error == {
            "code": "limit_exceeded",
            "message": "session already has 1 scheduled jobs (limit 1)",
        }


@pytest.mark.guard(2 * DAY)
async def test_bound_automations_list_user_jobs_and_cancel_drops_every_pending_job(autojump_clock):
    async with node() as n:
        await n.store.create_session("s2", "ada")
        call = tools_for(n)
        cron = (await call("cron", action="add", schedule="0 9 * * *", prompt="digest")).data
        check = (await call("schedule_check", delay_minutes=60, instructions="CI on PR #3")).data
        once = await n.add(schedule=Schedule(type="once", run_at=T0 + timedelta(hours=2)))
        gone = (await call("schedule_check", delay_minutes=5, instructions="gone")).data
        await call("cancel_scheduled", scheduled_id=gone["scheduled_id"])
        await call("schedule_check", session="s2", delay_minutes=5, instructions="elsewhere")
        # the agent's own recall ends with the session but does not block its deletion
        recall = await n.add(
            kind="recall", schedule=Schedule(type="once", run_at=T0 + timedelta(hours=3))
        )
        assert await bound_automations(n.store, "s") == [
            {
                "id": check["scheduled_id"],
                "kind": "check",
                "name": "CI on PR #3",
                "enabled": True,
                "state": "active",
                "schedule": "once at 2026-11-21T13:00:00Z",
                "next_run_at": "2026-11-21T13:00:00Z",
            },
            {
                "id": once.id,
                "kind": "once",
                "name": "do the thing",
                "enabled": True,
                "state": "active",
                "schedule": "once at 2026-11-21T14:00:00Z",
                "next_run_at": "2026-11-21T14:00:00Z",
            },
            {
                "id": cron["job_id"],
                "kind": "cron",
                "name": "digest",
                "enabled": True,
                "state": "active",
                "schedule": "cron 0 9 * * * (UTC)",
                "next_run_at": "2026-11-22T09:00:00Z",
            },
        ]
        cancelled = await cancel_bound_automations(n.scheduler, n.store, "s")
        assert [(c["id"], c["state"], c["enabled"]) for c in cancelled] == [
            (check["scheduled_id"], "cancelled", False),
            (once.id, "cancelled", False),
            (recall.id, "cancelled", False),
            (cron["job_id"], "cancelled", False),
        ]
        assert await bound_automations(n.store, "s") == []
        assert len(await bound_automations(n.store, "s2")) == 1  # other sessions untouched
        await trio.sleep(DAY)
        assert n.starts() == []  # the timers went with the jobs
