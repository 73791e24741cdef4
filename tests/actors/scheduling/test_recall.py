"""Recalls as an agent (and the HTTP layer) use them, on trio's MockClock.

The node's scheduler refuses intervals under 300 s (``tests.support.mock_node.LIMITS``).
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import trio
import trio.testing

from tests.support.agents import SeeingAgent
from tests.support.mock_node import DAY, T0, node, once
from turnstile.actors.scheduling.recall import (
    cancel_recall,
    get_recall,
    register_recall_tools,
    skip_recall,
)
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.actor import Submit, history_from_events
from turnstile.runtime.errors import InvalidArgument, NotFound
from turnstile.tools.registry import ToolRegistry

TODO = "Read /tmp/build.log with filesystem. If errors, report the last 50 lines."


def tools_for(n, session_id: str = "s"):
    registry = ToolRegistry()
    register_recall_tools(registry, n.scheduler, n.store, n.clock, n.publish)

    async def call(name, **arguments):
        return await registry.call(session_id, "ada", name, arguments)

    return call


async def ok(call, name, **arguments) -> dict:
    result = await call(name, **arguments)
    assert result.ok, result.error
    return result.data


def recall_updates(n) -> list[dict]:
    frames = [json.loads(f) for f in n.seen.frames if b'"recall_update"' in f]
    return [f for f in frames if f["type"] == "recall_update"]


async def settle(n) -> None:
    await trio.testing.wait_all_tasks_blocked()


@pytest.mark.guard(2 * DAY)
async def test_a_once_recall_fires_on_time_with_its_instruction_then_frees_the_slot(
    autojump_clock,
):
    async with node(agent=SeeingAgent()) as n:
        call = tools_for(n)
        made = await ok(
            call,
            "schedule_recall",
            call_type="once",
            when="in 30m",
            internal_comment="check\nthe build",
            additional_context_message=TODO,
        )
        rid = made["recall_id"]
        assert rid.startswith("rc_")
        assert made == {
            "recall_id": rid,
            "call_type": "once",
            "status": "pending",
            "trigger_at": "2026-11-21T12:30:00Z",
            "interval_seconds": None,
            "internal_comment": "check\nthe build",
            "additional_context_message": TODO,
            "fired_count": 0,
            "created_at": "2026-11-21T12:00:00Z",
            "updated_at": "2026-11-21T12:00:00Z",
            "action": "scheduled",
            "understood": made["understood"],
        }
        assert made["understood"].startswith("in 30m")
        await trio.sleep(30 * 60 - 1)
        assert n.starts() == []  # not a moment early
        await n.seen.until(b'"stream_end"')
        assert n.clock.now() == T0 + timedelta(minutes=30)
        (start,) = n.starts()
        assert start["source"] == "recall"
        # the user-role content is one trigger line; the self-instruction goes separately
        assert start["content"] == f"[RECALL] recall_id={rid} call_type=once note=check the build"
        assert (start["job_id"], start["is_recall"], start["instruction"]) == (rid, True, TODO)
        item = (await n.store.list_inputs("s"))[0]
        assert (item.payload["recall_id"], item.payload["is_recall"]) == (rid, True)
        # ... to the agent as this turn's system text, never as a user message
        (seen,) = n.agent.inputs
        assert seen.content == start["content"] and TODO not in seen.content
        assert seen.system_segment.endswith(f"Your self-instruction:\n{TODO}")
        await settle(n)
        (run,) = await JobStore(n.store).list_runs(rid)
        assert run.detail["instruction"] == TODO
        fired = recall_updates(n)[-1]
        assert (fired["action"], fired["status"], fired["trigger_at"]) == ("fired", "fired", None)
        assert (fired["fired_at"], fired["run_id"]) == ("2026-11-21T12:30:00Z", run.id)
        # the transcript (live and rebuilt from the log) marks the entry as a recall
        entry = history_from_events(await n.store.read_events("s"))[0]
        assert (entry.role, entry.is_recall, entry.cron_job_id) == ("user", True, None)
        session = n.registry.ref("session:s")
        await session.ask(Submit(content="and now?"))
        await n.seen.until(b'"stream_end"', 2)
        assert n.agent.histories[-1][0] == entry
        assert await get_recall(n.store, "s") is None
        (listed,) = (await ok(call, "manage_recall", action="list"))["recalls"]
        assert (listed["status"], listed["trigger_at"], listed["fired_count"]) == ("fired", None, 1)
        # Fired, it no longer blocks the next one.
        assert (
            await ok(
                call, "schedule_recall", call_type="immediate", additional_context_message="again"
            )
        )["status"] == "pending"


@pytest.mark.guard(2 * DAY)
async def test_a_recurring_recall_fires_every_interval_from_its_first_trigger(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        made = await ok(
            call,
            "schedule_recall",
            call_type="recurring",
            interval_seconds=600,
            when="in 1h",
            additional_context_message="poll https://ci.example/api/status with http",
        )
        assert (made["trigger_at"], made["interval_seconds"]) == ("2026-11-21T13:00:00Z", 600)
        await trio.sleep(3600 + 25 * 60)
        await settle(n)
        contents = [s["content"] for s in n.starts()]
        assert (
            contents
            == [f"[RECALL] recall_id={made['recall_id']} call_type=recurring every=600s"] * 3
        )  # 13:00, 13:10, 13:20
        (run3, run2, run1) = await JobStore(n.store).list_runs(made["recall_id"])
        assert [r.scheduled_for for r in (run1, run2, run3)] == [
            T0 + timedelta(minutes=m) for m in (60, 70, 80)
        ]
        # each firing reschedules it, and says so
        moved = [u for u in recall_updates(n) if u["action"] == "rescheduled"]
        assert [(u["fired_at"], u["trigger_at"], u["status"], u["run_id"]) for u in moved] == [
            ("2026-11-21T13:00:00Z", "2026-11-21T13:10:00Z", "pending", run1.id),
            ("2026-11-21T13:10:00Z", "2026-11-21T13:20:00Z", "pending", run2.id),
            ("2026-11-21T13:20:00Z", "2026-11-21T13:30:00Z", "pending", run3.id),
        ]
        pending = await get_recall(n.store, "s")
        assert (pending["status"], pending["trigger_at"], pending["fired_count"]) == (
            "pending",
            "2026-11-21T13:30:00Z",
            3,
        )


@pytest.mark.guard(2 * DAY)
async def test_a_recurring_recall_without_when_starts_one_interval_from_now(autojump_clock):
    async with node() as n:
        made = await ok(
            tools_for(n),
            "schedule_recall",
            call_type="recurring",
            interval_seconds=300,
            additional_context_message="x",
        )
        assert made["trigger_at"] == "2026-11-21T12:05:00Z" and "understood" not in made


@pytest.mark.guard(2 * DAY)
async def test_an_immediate_recall_runs_at_once(autojump_clock):
    async with node() as n:
        made = await ok(
            tools_for(n), "schedule_recall", call_type="immediate", additional_context_message=TODO
        )
        assert made["trigger_at"] == "2026-11-21T12:00:00Z"
        await n.seen.until(b'"stream_end"')
        assert n.clock.now() == T0
        assert n.starts()[0]["content"] == (
            f"[RECALL] recall_id={made['recall_id']} call_type=immediate"
        )


@pytest.mark.guard(2 * DAY)
async def test_a_recall_due_during_a_turn_waits_for_it_to_end_then_runs_first(autojump_clock):
    async with node() as n:
        session = n.registry.ref("session:s")
        await session.ask(Submit(content="wait:long"))  # the turn that schedules the recall
        made = await ok(
            tools_for(n),
            "schedule_recall",
            call_type="once",
            when="in 5m",
            additional_context_message="look again",
        )
        await trio.sleep(3600)  # due at 12:05 while the turn still runs
        await session.ask(Submit(content="later from the user"))
        assert [s["content"] for s in n.starts()] == ["wait:long"]
        (run,) = await JobStore(n.store).list_runs(made["recall_id"])
        assert (run.state, run.detail["late_seconds"]) == ("queued", 0)  # in the inbox on time
        n.agent.gate("wait:long").set()
        await n.seen.until(b'"stream_end"', 3)
        assert [s["source"] for s in n.starts()] == ["user", "recall", "user"]  # inbox order
        assert n.clock.now() == T0 + timedelta(hours=1)  # at once, not at a re-poll
        await settle(n)
        (run,) = await JobStore(n.store).list_runs(made["recall_id"])
        assert run.state == "turn_completed"


async def test_the_database_allows_one_pending_recall_per_session(autojump_clock):
    async with node() as n:
        await n.store.create_session("other", "bob")
        call = tools_for(n)
        first = await ok(
            call, "schedule_recall", call_type="once", when="in 1h", additional_context_message="a"
        )
        second = await call(
            "schedule_recall",
            call_type="recurring",
            interval_seconds=600,
            additional_context_message="b",
        )
        assert second.error == {
            "code": "conflict",
            "message": f"session already has a pending recall (id {first['recall_id']}); "
            "cancel it first with manage_recall",
        }
        # Two at once: nothing checks before inserting; the index lets exactly one through.
        await ok(call, "manage_recall", action="cancel")
        results = []

        async def schedule(text: str) -> None:
            results.append(
                await call(
                    "schedule_recall",
                    call_type="once",
                    when="in 1h",
                    additional_context_message=text,
                )
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(schedule, "c")
            nursery.start_soon(schedule, "d")
        assert sorted(r.ok for r in results) == [False, True]
        assert [r.error["code"] for r in results if not r.ok] == ["conflict"]
        # Another session has its own slot.
        assert await ok(
            tools_for(n, "other"),
            "schedule_recall",
            call_type="once",
            when="in 2h",
            additional_context_message="e",
        )
        jobs = await JobStore(n.store).list_jobs(states=["active"])
        assert sorted(j.session_id for j in jobs if j.kind == "recall") == ["other", "s"]


@pytest.mark.guard(2 * DAY)
async def test_cancel_stops_the_recall_and_tells_the_session(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        made = await ok(
            call,
            "schedule_recall",
            call_type="recurring",
            interval_seconds=600,
            additional_context_message="x",
            internal_comment="poll",
        )
        cancelled = await ok(call, "manage_recall", action="cancel", session_id="s")
        assert (cancelled["recall_id"], cancelled["status"], cancelled["action"]) == (
            made["recall_id"],
            "cancelled",
            "cancelled",
        )
        assert cancelled["trigger_at"] is None
        await trio.sleep(DAY)
        assert n.starts() == []
        updates = recall_updates(n)
        assert [(u["action"], u["status"], u["recall_id"]) for u in updates] == [
            ("scheduled", "pending", made["recall_id"]),
            ("cancelled", "cancelled", made["recall_id"]),
        ]
        assert updates[0]["internal_comment"] == "poll" and updates[0]["session_id"] == "s"
        again = await call("manage_recall", action="cancel")
        assert again.error == {"code": "not_found", "message": "session has no pending recall"}


@pytest.mark.guard(2 * DAY)
async def test_skip_moves_a_future_trigger_by_one_interval(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        made = await ok(
            call,
            "schedule_recall",
            call_type="recurring",
            interval_seconds=600,
            additional_context_message="x",
        )
        await trio.sleep(60)
        skipped = await ok(call, "manage_recall", action="skip")
        assert skipped["trigger_at"] == "2026-11-21T12:20:00Z"  # trigger 12:10 + 600 s
        assert (skipped["skipped_trigger_at"], skipped["action"]) == (
            "2026-11-21T12:10:00Z",
            "skipped",
        )
        await trio.sleep(15 * 60)  # 12:16: 12:10 passed silently
        assert n.starts() == []
        await n.seen.until(b'"stream_end"')
        assert n.clock.now() == T0 + timedelta(minutes=20)
        updates = recall_updates(n)
        assert [u["action"] for u in updates] == ["scheduled", "skipped", "rescheduled"]
        assert updates[1]["skipped_trigger_at"] == "2026-11-21T12:10:00Z"
        assert (await get_recall(n.store, "s"))["trigger_at"] == "2026-11-21T12:30:00Z"
        assert made["recall_id"] == skipped["recall_id"]


@pytest.mark.guard(2 * DAY)
async def test_skip_of_an_overdue_trigger_counts_from_now(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        made = await ok(
            call,
            "schedule_recall",
            call_type="recurring",
            interval_seconds=600,
            additional_context_message="x",
        )
        await trio.sleep(120)
        # As after a downtime: the stored trigger (12:01) is already behind now (12:02).
        await JobStore(n.store).update_job(
            made["recall_id"], next_fire_at=T0 + timedelta(minutes=1)
        )
        skipped = await skip_recall(n.scheduler, n.store, n.clock, "s", n.publish)
        assert skipped["skipped_trigger_at"] == "2026-11-21T12:01:00Z"
        assert skipped["trigger_at"] == "2026-11-21T12:12:00Z"  # now + 600 s, not 12:11
        await n.seen.until(b'"stream_end"')
        assert n.clock.now() == T0 + timedelta(minutes=12)


async def test_skip_of_a_once_recall_is_an_error_and_changes_nothing(autojump_clock):
    async with node() as n:
        call = tools_for(n)
        made = await ok(
            call, "schedule_recall", call_type="once", when="in 1h", additional_context_message="x"
        )
        result = await call("manage_recall", action="skip")
        assert result.error == {
            "code": "invalid_argument",
            "message": f"skip only applies to recurring recalls; recall {made['recall_id']} "
            "is once: cancel it instead",
        }
        assert (await get_recall(n.store, "s"))["trigger_at"] == "2026-11-21T13:00:00Z"
        nothing = await tools_for(n, "nobody")("manage_recall", action="skip")
        assert nothing.error == {"code": "not_found", "message": "session has no pending recall"}


@pytest.mark.guard(3 * DAY)
async def test_list_shows_every_recall_of_the_session_with_its_status(autojump_clock):
    async with node() as n:
        await n.store.create_session("other", "bob")
        call = tools_for(n)
        fired = await ok(
            call,
            "schedule_recall",
            call_type="once",
            when="in 10m",
            additional_context_message="one",
        )
        await trio.sleep(600)
        await n.seen.until(b'"stream_end"')
        cancelled = await ok(
            call,
            "schedule_recall",
            call_type="once",
            when="in 1h",
            additional_context_message="two",
        )
        await ok(call, "manage_recall", action="cancel")
        await trio.sleep(1)  # list order is creation order; ties would fall to the random ids
        pending = await ok(
            call,
            "schedule_recall",
            call_type="recurring",
            interval_seconds=900,
            internal_comment="poll",
            additional_context_message="three",
        )
        await ok(
            tools_for(n, "other"),
            "schedule_recall",
            call_type="once",
            when="in 1h",
            additional_context_message="not yours",
        )
        listed = await ok(call, "manage_recall", action="list")
        assert (listed["total"], listed["truncated"], listed["pending_recall_id"]) == (
            3,
            False,
            pending["recall_id"],
        )
        assert [
            (r["recall_id"], r["call_type"], r["status"], r["trigger_at"], r["interval_seconds"])
            for r in listed["recalls"]
        ] == [
            (fired["recall_id"], "once", "fired", None, None),
            (cancelled["recall_id"], "once", "cancelled", None, None),
            (pending["recall_id"], "recurring", "pending", "2026-11-21T12:25:01Z", 900),
        ]
        assert listed["recalls"][2]["internal_comment"] == "poll"


@pytest.mark.guard(2 * DAY)
async def test_every_recall_run_ends_with_a_session_sync_watched_or_not(autojump_clock):
    """recall.md's finally: session_sync after every recall run, even one a client watched
    from its start (any turn nobody watched ends with one anyway); a watched cron run or user
    turn needs none."""
    async with node(agent=SeeingAgent()) as n:  # n.seen watches s from the start
        session = n.registry.ref("session:s")
        await session.ask(Submit(content="hello"))
        await n.seen.until(b'"stream_end"')
        made = await ok(
            tools_for(n),
            "schedule_recall",
            call_type="once",
            when="in 1h",
            additional_context_message=TODO,
        )
        await n.seen.until(b'"session_sync"')
        types = [e.type for e in await n.store.read_events("s")]
        assert types.count("session_sync") == 1 and types[-2:] == ["stream_end", "session_sync"]
        sync = (await n.store.read_events("s"))[-1].payload
        recall_input = [i for i in await n.store.list_inputs("s") if i.source == "recall"]
        assert sync == {
            "busy": False,
            "policy": "enqueue",
            "queued": 0,
            "input_id": recall_input[0].id,
            "status": "completed",
        }
        assert n.clock.now() == T0 + timedelta(hours=1)
        assert made["recall_id"] == recall_input[0].payload["recall_id"]
        await session.ask(Submit(content="a user turn"))
        await n.seen.until(b'"stream_end"', 3)
        await n.add(
            schedule=once(n.clock.now() + timedelta(minutes=1)),
            deliver={"prompt": "digest", "source": "cron"},
        )
        await n.seen.until(b'"stream_end"', 4)
        await settle(n)
        assert [e.source for e in await n.store.list_inputs("s")][-1] == "cron"
        assert [e.type for e in await n.store.read_events("s")].count("session_sync") == 1


async def test_manage_recall_reaches_the_users_other_sessions(autojump_clock):
    """recall.md: manage_recall's session_id names another session of the same user; another
    user's session of that name is not reached (it answers as a name nobody uses)."""
    async with node() as n:
        for key, owner in (("ada/t", "ada"), ("bob/u", "bob")):
            await n.store.create_session(key, owner)
            await ok(
                tools_for(n, key),
                "schedule_recall",
                call_type="recurring",
                interval_seconds=900,
                additional_context_message="poll",
            )
        theirs = await get_recall(n.store, "bob/u")
        call = tools_for(n)  # from ada's session s
        listed = await ok(call, "manage_recall", action="list", session_id="t")
        (only,) = listed["recalls"]
        assert listed["pending_recall_id"] == only["recall_id"]
        assert (await ok(call, "manage_recall", action="list"))["recalls"] == []  # s's own
        skipped = await ok(call, "manage_recall", action="skip", session_id="t")
        assert skipped["action"] == "skipped"
        assert skipped["trigger_at"] == "2026-11-21T12:30:00Z"
        cancelled = await ok(call, "manage_recall", action="cancel", session_id="t")
        assert (cancelled["action"], cancelled["status"]) == ("cancelled", "cancelled")
        assert await get_recall(n.store, "ada/t") is None
        # bob's session is not ada's to reach, by its name or by its key
        for name in ("u", "bob/u", "../bob/u"):
            for action in ("cancel", "skip", "list"):
                result = await call("manage_recall", action=action, session_id=name)
                assert result.error == {
                    "code": "not_found",
                    "message": f"no session with id {name!r}",
                }, (name, action)
        assert await get_recall(n.store, "bob/u") == theirs  # untouched


async def test_another_session_is_not_found(autojump_clock):
    async with node() as n:
        await n.store.create_session("other", "bob")
        await ok(
            tools_for(n, "other"),
            "schedule_recall",
            call_type="once",
            when="in 1h",
            additional_context_message="theirs",
        )
        call = tools_for(n)
        for action in ("cancel", "skip", "list"):
            result = await call("manage_recall", action=action, session_id="other")
            assert result.error == {"code": "not_found", "message": "no session with id 'other'"}
        assert await get_recall(n.store, "other") is not None  # untouched


async def test_the_http_functions(autojump_clock):
    async with node() as n:
        assert await get_recall(n.store, "s") is None
        with pytest.raises(NotFound, match="^session has no pending recall$"):
            await cancel_recall(n.scheduler, n.store, "s", n.publish)
        made = await ok(
            tools_for(n),
            "schedule_recall",
            call_type="once",
            when="in 1h",
            additional_context_message="x",
        )
        view = await get_recall(n.store, "s")
        assert view == {k: v for k, v in made.items() if k not in ("action", "understood")}
        with pytest.raises(InvalidArgument, match="^skip only applies to recurring recalls"):
            await skip_recall(n.scheduler, n.store, n.clock, "s", n.publish)
        done = await cancel_recall(n.scheduler, n.store, "s", None)  # publish is optional
        assert (done["status"], done["action"]) == ("cancelled", "cancelled")


@pytest.mark.parametrize(
    ("arguments", "code", "message"),
    [
        ({"call_type": "once"}, "invalid_argument",
         "call_type 'once' needs when, e.g. '30m' or 'tomorrow at 09:00'"),
        ({"call_type": "once", "when": "in 5m", "interval_seconds": 600}, "invalid_argument",
         "interval_seconds only applies to call_type 'recurring'"),
        ({"call_type": "recurring"}, "invalid_argument",
         "call_type 'recurring' needs interval_seconds"),
        ({"call_type": "recurring", "interval_seconds": 120}, "invalid_argument",
         "interval must be at least 300 seconds"),  # the scheduler's own minimum
        ({"call_type": "recurring", "interval_seconds": 59}, "bad_arguments",
         "expected `int` >= 60 at $.interval_seconds"),
        ({"call_type": "recurring", "interval_seconds": 30 * 86400 + 1}, "bad_arguments",
         "expected `int` <= 2592000 at $.interval_seconds"),
        ({"call_type": "immediate", "when": "in 5m"}, "invalid_argument",
         "call_type 'immediate' fires right after this turn: leave out when"),
        ({"call_type": "once", "when": "every 5 minutes"}, "invalid_argument",
         "'every 5 minutes' repeats (every 5 minutes"),
        ({"call_type": "once", "when": "blorp"}, "invalid_argument",
         "could not understand 'blorp' as a time"),
        ({"call_type": "once", "when": "2020-01-01T00:00:00Z"}, "invalid_argument",
         "is in the past"),
        ({"call_type": "once", "when": "in 5m", "additional_context_message": "  "},
         "invalid_argument", "additional_context_message must not be blank"),
        ({"call_type": "later"}, "bad_arguments", "invalid enum value 'later' at $.call_type"),
        ({"call_type": "once", "when": "in 5m", "surprise": 1}, "bad_arguments",
         "unknown field at $.surprise"),
    ],
)  # fmt: skip
async def test_bad_schedule_recall_calls_are_typed_errors(autojump_clock, arguments, code, message):
    async with node() as n:
        arguments.setdefault("additional_context_message", "x")
        result = await tools_for(n)("schedule_recall", **arguments)
        assert not result.ok
        assert result.error["code"] == code, result.error
        assert message in result.error["message"], result.error
        assert await JobStore(n.store).list_jobs() == []
