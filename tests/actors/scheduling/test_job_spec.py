"""Job specs: what each writer stores (byte for byte what it stored before ``JobSpec``), how a
stored spec reads back, and what a spec that does not decode does."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
import trio

from tests.support.mock_node import DAY, T0, node, once
from turnstile.actors.scheduling.actor import AddJob, CancelJob
from turnstile.actors.scheduling.checks import register_check_tools
from turnstile.actors.scheduling.cron import automation_view, register_cron_tool
from turnstile.actors.scheduling.heartbeat import register_heartbeat_tools
from turnstile.actors.scheduling.recall import register_recall_tools
from turnstile.actors.scheduling.spec import (
    ActiveHours,
    JobSpec,
    JobSpecError,
    RecallSpec,
    Schedule,
    job_spec,
)
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.scheduling.tools import register_scheduling_tools
from turnstile.tools.registry import ToolRegistry

BASE = {"misfire": "coalesce", "misfire_grace_seconds": 60.0, "max_runs": 0, "jitter_seconds": 0.0}


async def tools_for(n):
    registry = ToolRegistry()
    register_scheduling_tools(registry, n.scheduler, n.store, n.clock)
    register_cron_tool(registry, n.scheduler, n.store, n.clock)
    register_check_tools(registry, n.scheduler, n.store, n.clock)
    register_recall_tools(registry, n.scheduler, n.store, n.clock, n.publish)

    async def derive(parent, suffix):
        await n.store.create_session(parent + suffix, "ada")
        return parent + suffix

    register_heartbeat_tools(registry, n.scheduler, n.store, n.clock, derive)

    async def call(tool, /, **arguments):
        result = await registry.call("s", "ada", tool, arguments)
        assert result.ok, result.error
        return result.data

    return call


def stored(job) -> bytes:
    """The spec as the store keeps it (decoding and re-encoding JSON keeps keys and order)."""
    return msgspec.json.encode(job.spec)


# What each writer stored before JobSpec existed: the same keys, in the same order. ``<ID>`` is
# the job's own id.
CRON_SHA = "c91e7011801b8ca271e82b3be0ce8de5bb0e9d7d2fa3a9ba98f76c4bdb66d011"
EXPECTED = {
    "once": {
        "schedule": {"type": "once", "run_at": "2026-11-22T08:00:00Z", "timezone": "Europe/Paris"},
        "deliver": {
            "action_type": "tool_call",
            "source": "schedule",
            "tool_name": "echo",
            "tool_params": {"a": 1},
            "output_channel": "llm_notification",
        },
        "label": "",
        **{**BASE, "misfire": "skip", "jitter_seconds": 5.0},
        "understood": "tomorrow at 09:00 Europe/Paris — 2026-11-22T08:00:00Z",
    },
    "cron": {
        "schedule": {"type": "cron", "cron": "0 9 * * 1-5", "timezone": "Europe/Paris"},
        "deliver": {
            "source": "cron",
            "action_type": "llm_prompt",
            "prompt": "[CRON] job=<ID> prompt=daily-monitor@v1\nreport red",
            "cron_job_name": "daily-monitor",
            "prompt_ref": {
                "name": "daily-monitor",
                "version": 1,
                "sha256": CRON_SHA,
                "template": "cron.trigger@v1",
            },
        },
        "label": "daily-monitor",
        **BASE,
        "understood": "every weekday at 09:00 Europe/Paris — next 2026-11-23T08:00:00Z",
        "prompt_name": "daily-monitor",
        "prompt_version": 1,
        "prompt_sha256": CRON_SHA,
        "prompt_text": "report red",
    },
    "check": {
        "schedule": {"type": "once", "run_at": "2026-11-21T12:05:00Z"},
        "deliver": {
            "source": "check",
            "action_type": "llm_prompt",
            "prompt": "[SCHEDULED CHECK] id=<ID> requested_at=2026-11-21T12:00:00Z "
            "reference=https://x/pull/3\ncheck CI",
            "type": "scheduled_check",
            "instructions": "check CI",
            "requested_at": "2026-11-21T12:00:00Z",
            "reference": "https://x/pull/3",
        },
        "label": "check CI",
        **BASE,
        "instructions": "check CI",
        "understood": "in 5m — 2026-11-21T12:05:00Z",
        "reference": "https://x/pull/3",
    },
    "recall": {
        "schedule": {"type": "interval", "interval_seconds": 600},
        "deliver": {
            "source": "recall",
            "action_type": "llm_prompt",
            "prompt": "[RECALL] recall_id=<ID> call_type=recurring every=600s",
            "instruction": "poll",
            "recall_id": "<ID>",
            "is_recall": True,
        },
        "label": "",
        **BASE,
        "recall": {
            "call_type": "recurring",
            "interval_seconds": 600,
            "internal_comment": "",
            "additional_context_message": "poll",
        },
    },
    "heartbeat_main": {
        "schedule": {"type": "interval", "interval_seconds": 3600},
        "deliver": {
            "source": "heartbeat",
            "action_type": "heartbeat",
            "prompt": "Run your heartbeat checklist.",
            "heartbeat": {
                "checklist": "look",
                "model_override": None,
                "tool_profile": "heartbeat",
                "max_tokens": 4096,
                "suppress_threshold": 300,
                "on_error": "skip",
                "dedicated": False,
                "alert_channel": "llm_notification",
                "heartbeat_of": "s",
            },
        },
        "label": "heartbeat",
        **{**BASE, "misfire": "skip"},
        "heartbeat_of": "s",
        "active_hours": {"start": "09:00", "end": "17:30", "timezone": "Europe/Paris"},
        "understood": "every 60 minutes, 09:00–17:30 Europe/Paris",
    },
    "heartbeat": {
        "schedule": {"type": "interval", "interval_seconds": 1800},
        "deliver": {
            "source": "heartbeat",
            "action_type": "heartbeat",
            "prompt": "Run your heartbeat checklist.",
            "heartbeat": {
                "checklist": "look",
                "model_override": None,
                "tool_profile": "heartbeat",
                "max_tokens": 4096,
                "suppress_threshold": 300,
                "on_error": "skip",
                "dedicated": True,
                "alert_channel": "llm_notification",
                "heartbeat_of": "s",
            },
        },
        "label": "heartbeat",
        **{**BASE, "misfire": "skip"},
        "heartbeat_of": "s",
        "active_hours": None,  # written as null, not left out
        "understood": "every 30 minutes",
    },
    "raw": {
        "schedule": {"type": "interval", "interval_seconds": 3600},
        "deliver": {"prompt": "do the thing", "source": "schedule"},
        "label": "",
        **{**BASE, "misfire": "catch_up", "misfire_grace_seconds": 5, "max_runs": 2},
    },
}


@pytest.mark.guard(2 * DAY)
async def test_every_writer_stores_the_spec_it_stored_before(autojump_clock):
    async with node() as n:
        call = await tools_for(n)
        made = {"raw": "raw"}
        made["once"] = await call(
            "schedule_once",
            when="tomorrow at 9am",
            action_type="tool_call",
            tool_name="echo",
            tool_params={"a": 1},
            jitter_seconds=5,
            misfire="skip",
            timezone="Europe/Paris",
        )
        made["cron"] = await call(
            "cron",
            action="add",
            schedule="every weekday at 9am",
            prompt="report red",
            name="daily-monitor",
            timezone="Europe/Paris",
        )
        made["check"] = await call(
            "schedule_check", delay_minutes=5, instructions="check CI", reference="https://x/pull/3"
        )
        made["recall"] = await call(
            "schedule_recall",
            call_type="recurring",
            interval_seconds=600,
            additional_context_message="poll",
        )
        made["heartbeat"] = await call("set_heartbeat", enabled=True, checklist="look")
        made["heartbeat_main"] = await call(  # replaces it, keeping its checklist
            "set_heartbeat",
            enabled=True,
            session="main",
            active_hours_start="09:00",
            active_hours_end="17:30",
            timezone="Europe/Paris",
            interval_minutes=60,
        )
        await n.add(
            kind="interval",
            schedule=Schedule(type="interval", interval_seconds=3600),
            misfire="catch_up",
            misfire_grace_seconds=5,
            max_runs=2,
            job_id="raw",
        )
        ids = {
            name: data if name == "raw" else next(v for k, v in data.items() if k.endswith("id"))
            for name, data in made.items()
        }
        jobs = await JobStore(n.store).list_jobs(session_id="s")
        jobs += await JobStore(n.store).list_jobs(session_id="s.heartbeat")
        assert {job.id: stored(job) for job in jobs} == {
            ids[name]: msgspec.json.encode(spec).replace(b"<ID>", ids[name].encode())
            for name, spec in EXPECTED.items()
        }


def test_a_stored_spec_reads_back_with_defaults_for_missing_base_fields():
    spec = msgspec.convert(
        {"schedule": {"type": "once", "run_at": "2026-11-22T08:00:00Z"}}, JobSpec
    )
    assert spec == JobSpec(schedule=Schedule(type="once", run_at=T0 + timedelta(hours=20)))
    assert (spec.label, spec.misfire, spec.misfire_grace_seconds, spec.deliver) == (
        "",
        "coalesce",
        60.0,
        {},
    )
    assert (spec.prompt, spec.action_type, spec.output_channel, spec.source) == (
        "",
        None,
        "llm_notification",
        None,
    )
    assert spec.understood is msgspec.UNSET and spec.active_hours is msgspec.UNSET
    assert msgspec.to_builtins(spec) == {
        "schedule": {"type": "once", "run_at": "2026-11-22T08:00:00Z"},
        "deliver": {},
        "label": "",
        **BASE,
    }
    heartbeat = msgspec.convert(
        {**msgspec.to_builtins(spec), "heartbeat_of": "s", "active_hours": None}, JobSpec
    )
    assert (heartbeat.heartbeat_of, heartbeat.active_hours) == ("s", None)


def test_add_job_carries_every_spec_field():
    """``AddJob.spec()`` copies the JobSpec fields by name: a new one must be added to both."""
    assert set(JobSpec.__struct_fields__) <= set(AddJob.__struct_fields__)
    add = AddJob(
        session_id="s",
        kind="recall",
        schedule=once(T0),
        deliver={"prompt": "p"},
        recall=RecallSpec(call_type="once"),
        active_hours=ActiveHours(start="09:00", end="10:00"),
    )
    assert add.spec() == JobSpec(
        schedule=once(T0),
        deliver={"prompt": "p"},
        recall=RecallSpec(call_type="once"),
        active_hours=ActiveHours(start="09:00", end="10:00"),
    )


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({}, "Object missing required field `schedule`"),
        (
            {"schedule": {"type": "once"}, "jitter_seconds": "lots"},
            "Expected `float`, got `str` - at `$.jitter_seconds`",
        ),
        (
            {"schedule": {"type": "once"}, "misfire": "later"},
            "Invalid enum value 'later' - at `$.misfire`",
        ),
        (
            {"schedule": {"type": "interval"}, "active_hours": {"start": "9am", "end": "17:00"}},
            "Expected `str` matching regex '^([01]\\\\d|2[0-3]):[0-5]\\\\d$' - at "
            "`$.active_hours.start`",
        ),
    ],
)
async def test_a_spec_that_does_not_decode_is_a_typed_error(spec, why):
    async with node(start_scheduler=False) as n:
        job = await JobStore(n.store).create_job("bad", kind="once", spec=spec, session_id="s")
        with pytest.raises(JobSpecError) as caught:
            job_spec(job)
        assert str(caught.value) == f"job 'bad' has an unreadable spec: {why}"
        assert (caught.value.job_id, caught.value.code) == ("bad", "bad_job_spec")


@pytest.mark.guard(2 * DAY)
async def test_the_scheduler_skips_a_job_whose_spec_does_not_decode(autojump_clock):
    async with node(start_scheduler=False) as n:
        good = JobSpec(schedule=once(T0 + timedelta(hours=1)), deliver={"prompt": "good"})
        at = T0 + timedelta(hours=1)
        await JobStore(n.store).create_job(
            "good", kind="once", spec=msgspec.to_builtins(good), session_id="s", next_fire_at=at
        )
        bad = {**msgspec.to_builtins(good), "max_runs": "twice"}
        await JobStore(n.store).create_job(
            "bad", kind="once", spec=bad, session_id="s", next_fire_at=at
        )
        await n.start_scheduler()  # does not fail for one bad row
        await trio.sleep(2 * 3600)
        assert [s["content"] for s in n.starts()] == ["good"]
        assert (await JobStore(n.store).get_job("bad")).state == "active"  # left alone, not fired
        with pytest.raises(JobSpecError):
            automation_view(await JobStore(n.store).get_job("bad"))
        cancelled = await n.scheduler.ask(CancelJob(job_id="bad"))  # but it can be cancelled
        assert cancelled.state == "cancelled"
