"""schedule_check, list_schedule and cancel_scheduled as an agent calls them (MockClock)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import trio
import trio.testing

from tests.support.mock_node import DAY, T0, node
from turnstile.actors.scheduling.actor import Schedule
from turnstile.actors.scheduling.checks import register_check_tools
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.actor import SetPolicy, Submit
from turnstile.tools.registry import ToolRegistry


def tools_for(n):
    registry = ToolRegistry()
    register_check_tools(registry, n.scheduler, n.store, n.clock)

    async def call(name, session="s", owner="ada", **arguments):
        return await registry.call(session, owner, name, arguments)

    return call


@pytest.mark.guard(2 * DAY)
async def test_schedule_check_answers_and_fires_on_the_instant_as_a_check_turn(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        pr = "https://github.com/nitejar/nitejar/pull/3"
        result = await call(
            "schedule_check",
            delay_minutes=5,
            instructions="Check CI status on PR #3. If it failed, pull the logs and fix it.",
            reference=pr,
        )
        assert result.ok, result.error
        check_id = result.data["scheduled_id"]
        assert result.data == {
            "scheduled_id": check_id,
            "type": "check",
            "session_id": "s",
            "status": "pending",
            "run_at": "2026-11-21T12:05:00Z",
            "understood": "in 5m — 2026-11-21T12:05:00Z",
            "instructions": "Check CI status on PR #3. If it failed, pull the logs and fix it.",
            "reference": pr,
        }
        await trio.sleep(5 * 60 - 1)
        assert n.starts() == []  # not a moment early
        await n.seen.until(b'"stream_end"')
        assert n.clock.now() == T0 + timedelta(minutes=5)
        content = (
            f"[SCHEDULED CHECK] id={check_id} requested_at=2026-11-21T12:00:00Z reference={pr}\n"
            "Check CI status on PR #3. If it failed, pull the logs and fix it."
        )
        (start,) = n.starts()
        assert (start["source"], start["content"], start["job_id"]) == ("check", content, check_id)
        await trio.testing.wait_all_tasks_blocked()
        (item,) = await n.store.list_inputs("s")
        assert item.source == "check"
        assert {k: item.payload[k] for k in ("type", "reference", "requested_at", "kind")} == {
            "type": "scheduled_check",
            "reference": pr,
            "requested_at": "2026-11-21T12:00:00Z",
            "kind": "check",
        }
        (run,) = await JobStore(n.store).list_runs(check_id)
        assert (run.state, run.detail["prompt"]) == ("turn_completed", content)
        job = await JobStore(n.store).get_job(check_id)
        assert (job.kind, job.state) == ("check", "completed")


@pytest.mark.guard(2 * DAY)
async def test_fractional_delays_round_to_seconds_and_the_longest_is_a_day(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        short = (await call("schedule_check", delay_minutes=1.5, instructions="a")).data
        assert (short["run_at"], short["understood"]) == (
            "2026-11-21T12:01:30Z",
            "in 1m 30s — 2026-11-21T12:01:30Z",
        )
        long = (await call("schedule_check", delay_minutes=1440, instructions="b")).data
        assert long["understood"] == "in 24h — 2026-11-22T12:00:00Z"
        assert "reference" not in long
        await trio.sleep(DAY)
        await n.seen.until(b'"stream_end"', 2)
        assert [s["content"].split("\n")[1] for s in n.starts()] == ["a", "b"]
        assert n.starts()[0]["content"].split("\n")[0] == (
            f"[SCHEDULED CHECK] id={short['scheduled_id']} requested_at=2026-11-21T12:00:00Z"
        )


@pytest.mark.guard(2 * DAY)
async def test_a_check_due_during_a_turn_waits_for_it_even_with_policy_inject(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        session = n.registry.ref("session:s")
        await session.ask(SetPolicy(policy="inject"))
        await session.ask(Submit(content="wait:long"))
        made = (await call("schedule_check", delay_minutes=10, instructions="look again")).data
        await trio.sleep(3600)
        assert [s["content"] for s in n.starts()] == ["wait:long"]
        assert n.seen.count(b'"user_message"') == 0  # never folded into the running turn
        n.agent.gate("wait:long").set()
        await n.seen.until(b'"stream_end"', 2)
        content = (
            f"[SCHEDULED CHECK] id={made['scheduled_id']} requested_at=2026-11-21T12:00:00Z\n"
            "look again"
        )
        assert [(s["source"], s["content"]) for s in n.starts()] == [
            ("user", "wait:long"),
            ("check", content),
        ]
        assert [e["text"] for e in n.ends()] == ["reply:wait:long", f"reply:{content}"]
        (run,) = await JobStore(n.store).list_runs(made["scheduled_id"])
        assert run.scheduled_for == T0 + timedelta(minutes=10)  # due then, delivered after


async def sessions_of_two_owners(n):
    """s and s2 are ada's, b is bob's; each gets a check, s2 a cron job too."""
    await n.store.create_session("s2", "ada")
    await n.store.create_session("b", "bob")
    call = tools_for(n)
    mine = (await call("schedule_check", delay_minutes=30, instructions="mine")).data
    other = (
        await call("schedule_check", session="s2", delay_minutes=10, instructions="in s2")
    ).data
    bobs = (
        await call("schedule_check", session="b", owner="bob", delay_minutes=5, instructions="b")
    ).data
    cron = await n.add(
        session_id="s2",
        kind="cron",
        schedule=Schedule(type="cron", cron="0 9 * * *"),
        deliver={"prompt": "daily digest", "source": "cron"},
        label="digest",
    )
    return call, mine, other, bobs, cron


async def test_list_schedule_for_the_session_or_all_the_owners_sessions(autojump_clock):
    async with node() as n:
        call, mine, other, bobs, cron = await sessions_of_two_owners(n)
        only = await call("list_schedule", session_only=True)
        assert only.data == {
            "scope": "session",
            "session_id": "s",
            "items": [
                {
                    "scheduled_id": mine["scheduled_id"],
                    "type": "check",
                    "session_id": "s",
                    "status": "pending",
                    "run_at": "2026-11-21T12:30:00Z",
                    "instructions": "mine",
                    "label": "mine",
                }
            ],
            "total": 1,
        }
        everything = (await call("list_schedule")).data
        assert everything["scope"] == "owner" and everything["total"] == 3
        assert [(i["scheduled_id"], i["session_id"]) for i in everything["items"]] == [
            (other["scheduled_id"], "s2"),  # soonest first
            (mine["scheduled_id"], "s"),
            (cron.id, "s2"),
        ]
        assert everything["items"][2] == {
            "scheduled_id": cron.id,
            "type": "cron",
            "session_id": "s2",
            "status": "pending",
            "run_at": "2026-11-22T09:00:00Z",
            "instructions": "daily digest",
            "recurrence": "0 9 * * * (UTC)",
            "label": "digest",
        }
        assert bobs["scheduled_id"] not in str(everything)  # never another user's
        theirs = (await call("list_schedule", session="b", owner="bob")).data
        assert [i["scheduled_id"] for i in theirs["items"]] == [bobs["scheduled_id"]]


@pytest.mark.guard(2 * DAY)
async def test_cancel_scheduled_own_items_only(autojump_clock):
    async with node() as n:
        call, mine, other, bobs, _ = await sessions_of_two_owners(n)
        # An item of another of ada's sessions is hers to cancel.
        done = await call("cancel_scheduled", scheduled_id=other["scheduled_id"])
        assert done.data == {
            "scheduled_id": other["scheduled_id"],
            "type": "check",
            "session_id": "s2",
            "status": "cancelled",
        }
        again = await call("cancel_scheduled", scheduled_id=other["scheduled_id"])
        assert again.error == {
            "code": "invalid_argument",
            "message": f"scheduled item {other['scheduled_id']!r} is cancelled, not pending",
            "field": "scheduled_id",
        }
        # Bob's is not found, exactly like an id that does not exist.
        for ghost in (bobs["scheduled_id"], "nope"):
            refused = await call("cancel_scheduled", scheduled_id=ghost)
            assert refused.error == {
                "code": "not_found",
                "message": f"no scheduled item with id {ghost!r}",
            }
        await trio.sleep(3600)
        assert (
            await JobStore(n.store).get_job(bobs["scheduled_id"])
        ).state == "completed"  # still fired
        assert await JobStore(n.store).list_runs(other["scheduled_id"]) == []
        fired = await call("cancel_scheduled", scheduled_id=mine["scheduled_id"])
        assert fired.error["message"] == (
            f"scheduled item {mine['scheduled_id']!r} is fired, not pending"
        )
        listed = (await call("list_schedule")).data
        assert [i["type"] for i in listed["items"]] == ["cron"]


@pytest.mark.parametrize(
    ("arguments", "code", "message"),
    [
        ({"delay_minutes": 0, "instructions": "x"}, "bad_arguments",
         "expected `float` >= 1.0 at $.delay_minutes"),
        ({"delay_minutes": 1441, "instructions": "x"}, "bad_arguments",
         "expected `float` <= 1440.0 at $.delay_minutes"),
        ({"delay_minutes": 5, "instructions": "x" * 4001}, "bad_arguments",
         "expected `str` of length <= 4000 at $.instructions"),
        ({"delay_minutes": 5, "instructions": ""}, "bad_arguments",
         "expected `str` of length >= 1 at $.instructions"),
        ({"delay_minutes": 5, "instructions": "  \n "}, "invalid_argument",
         "instructions are empty"),
        ({"delay_minutes": 5}, "bad_arguments", "missing required field at $.instructions"),
        ({"delay_minutes": 5, "instructions": "x", "reference": "a\nb"}, "invalid_argument",
         "reference must be one line"),
        ({"delay_minutes": 5, "instructions": "x", "when": "in 5m"}, "bad_arguments",
         "unknown field at $.when"),
    ],
)  # fmt: skip
async def test_bad_schedule_check_calls_are_typed_errors(autojump_clock, arguments, code, message):
    async with node() as n:
        result = await tools_for(n)("schedule_check", **arguments)
        assert not result.ok
        assert (result.error["code"], result.error["message"]) == (code, message)
        assert await JobStore(n.store).list_jobs() == []


async def test_a_call_without_a_usable_session_is_refused(autojump_clock):
    async with node() as n:
        await n.store.create_session("b", "bob")
        call = tools_for(n)
        empty = await call("schedule_check", session="", delay_minutes=5, instructions="x")
        assert empty.error == {
            "code": "invalid_argument",
            "message": "a scheduled check belongs to a session: call it from a session's turn",
            "field": "session_id",
        }
        for session in ("ghost", "b"):  # unknown, or not ada's
            refused = await call(
                "schedule_check", session=session, delay_minutes=5, instructions="x"
            )
            assert refused.error == {
                "code": "not_found",
                "message": f"no session with id {session!r}: a scheduled check needs its session",
            }
        assert await JobStore(n.store).list_jobs() == []


async def test_the_scheduler_limit_is_a_typed_error(autojump_clock):
    from turnstile.actors.scheduling.actor import SchedulerActor, SchedulerLimits

    async with node(start_scheduler=False) as n:
        n.scheduler = await n.sup.spawn(
            lambda: SchedulerActor(
                n.store, n.clock, publish=n.publish, limits=SchedulerLimits(max_jobs_per_session=2)
            ),
            name="small",
        )
        call = tools_for(n)
        for _ in range(2):
            assert (await call("schedule_check", delay_minutes=5, instructions="x")).ok
        refused = await call("schedule_check", delay_minutes=5, instructions="x")
        assert refused.error == {
            "code": "limit_exceeded",
            "message": "session already has 2 scheduled jobs (limit 2)",
        }
