"""The scheduler on trio's MockClock: exact firing, misfires, max_runs, cron deferral, CAS."""

from __future__ import annotations

from datetime import timedelta

import pytest
import trio
import trio.testing

from tests.support.mock_node import DAY, LIMITS, T0, Node, node, once
from turnstile.actors.scheduling.actor import (
    AddJob,
    CancelJob,
    Schedule,
    SchedulerActor,
    SchedulerLimits,
)
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.actor import (
    Attach,
    Delivered,
    Submit,
)
from turnstile.runtime.errors import StoreError, StoreUnavailable


@pytest.mark.guard(2 * DAY)
async def test_a_once_job_fires_exactly_on_time_and_its_run_follows_the_turn(autojump_clock):
    async with node() as n:
        job = await n.add(schedule=once(T0 + timedelta(hours=5)), label="reminder")
        assert job.next_fire_at == T0 + timedelta(hours=5)
        await trio.sleep(5 * 3600 - 1)
        assert n.starts() == []  # not a moment early
        await n.seen.until(b'"stream_end"')
        assert n.clock.now() == T0 + timedelta(hours=5)  # fired on the dot (mock time)
        (start,) = n.starts()
        assert (start["source"], start["content"], start["label"]) == (
            "schedule",
            "do the thing",
            "reminder",
        )
        assert n.ends()[0]["text"] == "reply:do the thing"
        await trio.testing.wait_all_tasks_blocked()  # the run record is settled after the close
        (run,) = await JobStore(n.store).list_runs(job.id)
        assert run.state == "turn_completed"
        assert run.detail["prompt"] == "do the thing" and run.detail["late_seconds"] == 0
        assert (await JobStore(n.store).get_job(job.id)).state == "completed"
        assert start["job_id"] == job.id and start["run_id"] == run.id


@pytest.mark.guard(2 * DAY)
async def test_an_interval_job_stops_after_max_runs(autojump_clock):
    async with node() as n:
        job = await n.add(
            kind="interval",
            schedule=Schedule(type="interval", interval_seconds=600),
            max_runs=3,
        )
        await trio.sleep(DAY)
        assert len(n.starts()) == 3
        runs = await JobStore(n.store).list_runs(job.id)
        assert sorted(r.scheduled_for for r in runs) == [
            T0 + timedelta(minutes=10 * k) for k in (1, 2, 3)
        ]
        done = await JobStore(n.store).get_job(job.id)
        assert (done.state, done.run_count) == ("completed", 3)


@pytest.mark.guard(2 * DAY)
async def test_a_cron_occurrence_during_a_turn_waits_for_it_to_end(autojump_clock):
    async with node() as n:
        await n.registry.ref("session:s").ask(Submit(content="wait:long"))
        await n.add(
            kind="cron",
            schedule=Schedule(type="cron", cron="0 13 * * *"),
            deliver={
                "prompt": "daily digest",
                "source": "cron",
            },
        )
        await trio.sleep(2 * 3600)  # 13:00 passes while the user's turn is still running
        assert [s["content"] for s in n.starts()] == ["wait:long"]
        n.agent.gate("wait:long").set()
        await n.seen.until(b'"stream_end"', 2)
        assert [(s["source"], s["content"]) for s in n.starts()] == [
            ("user", "wait:long"),
            ("cron", "daily digest"),
        ]
        assert [e["text"] for e in n.ends()] == ["reply:wait:long", "reply:daily digest"]


@pytest.mark.guard(2 * DAY)
async def test_a_cancelled_job_never_fires(autojump_clock):
    async with node() as n:
        job = await n.add(schedule=once(T0 + timedelta(minutes=30)))
        cancelled = await n.scheduler.ask(CancelJob(job_id=job.id, session_id="s"))
        assert cancelled.state == "cancelled"
        await trio.sleep(3600)
        assert n.starts() == [] and await JobStore(n.store).list_runs(job.id) == []


async def downtime(n: Node, policy: str, hours: int):
    """A job every hour; the scheduler is down for ``hours`` hours, then restarts."""
    job = await n.add(
        kind="cron",
        schedule=Schedule(type="cron", cron="30 * * * *"),
        misfire=policy,
        deliver={"prompt": "hourly", "source": "cron"},
    )
    await n.scheduler.stop()
    await trio.sleep(hours * 3600)  # 12:30, 13:30, … pass with no scheduler running
    await n.start_scheduler("scheduler-again")
    await trio.sleep(60)
    return job


@pytest.mark.guard(2 * DAY)
@pytest.mark.parametrize(
    ("policy", "delivered", "states"),
    [
        ("coalesce", 1, {"turn_completed": 1, "coalesced": 2}),
        ("skip", 0, {"missed": 3}),
        ("catch_up", 3, {"turn_completed": 3}),
    ],
)
async def test_misfire_policies_after_downtime(autojump_clock, policy, delivered, states):
    async with node() as n:
        job = await downtime(n, policy, hours=3)
        await trio.testing.wait_all_tasks_blocked()
        assert len(n.starts()) == delivered
        runs = await JobStore(n.store).list_runs(job.id)
        counted: dict[str, int] = {}
        for run in runs:
            counted[run.state] = counted.get(run.state, 0) + 1
        assert counted == states
        assert sorted(r.scheduled_for for r in runs) == [
            T0 + timedelta(minutes=30 + 60 * k) for k in range(3)
        ]
        after = await JobStore(n.store).get_job(job.id)
        assert after.next_fire_at == T0 + timedelta(hours=3, minutes=30)  # back on schedule


@pytest.mark.guard(2 * DAY)
async def test_two_schedulers_on_one_store_deliver_an_occurrence_once(autojump_clock):
    async with node() as n:
        job = await n.add(schedule=once(T0 + timedelta(minutes=5)))
        await n.start_scheduler("second")  # loads the same job from the store
        await trio.sleep(600)
        assert len(n.starts()) == 1
        assert len(await JobStore(n.store).list_runs(job.id)) == 1
        assert len(await n.store.list_inputs("s")) == 1


@pytest.mark.guard(2 * DAY)
async def test_overdue_jobs_at_restart_are_spread_not_stampeded(autojump_clock):
    async with node(start_scheduler=False) as n:
        n.scheduler = await n.start_scheduler()
        jobs = [await n.add(schedule=once(T0 + timedelta(minutes=1))) for _ in range(20)]
        await n.scheduler.stop()
        await trio.sleep(3600)
        limits = SchedulerLimits(min_interval_seconds=300, restart_rate=10)
        await n.sup.spawn(
            lambda: SchedulerActor(n.store, n.clock, publish=n.publish, limits=limits),
            name="restarted",
        )
        await trio.sleep(10)
        fired = []
        for job in jobs:
            (run,) = await JobStore(n.store).list_runs(job.id)
            fired.append(run.created_at)
        spread = (max(fired) - min(fired)).total_seconds()
        assert spread == pytest.approx(1.9, abs=0.01)  # 20 jobs at 10 per second


async def test_bad_schedules_are_refused_with_the_field(autojump_clock):
    from turnstile.runtime.errors import InvalidArgument

    async with node() as n:
        cases = [
            (dict(schedule=once(T0 - timedelta(minutes=1))), "when"),
            (dict(schedule=Schedule(type="interval", interval_seconds=5)), "interval_seconds"),
            (dict(schedule=Schedule(type="cron", cron="* * * * *")), "cron"),
            (dict(schedule=Schedule(type="cron", cron="nope")), "cron"),
            (dict(schedule=once(T0 + timedelta(hours=1)), misfire="retry"), "misfire"),
            (
                dict(schedule=once(T0 + timedelta(hours=1)), deliver={"prompt": "x" * 9000}),
                "prompt",
            ),
        ]
        for fields, field in cases:
            with pytest.raises(InvalidArgument) as info:
                await n.add(**fields)
            assert info.value.field == field, fields


@pytest.mark.guard(2 * DAY)
async def test_reschedule_moves_the_next_occurrence_and_immediate_fires_now(autojump_clock):
    from turnstile.actors.scheduling.actor import RescheduleJob

    async with node() as n:
        job = await n.add(schedule=once(T0 + timedelta(hours=1)))
        moved = await n.scheduler.ask(
            RescheduleJob(job_id=job.id, session_id="s", next_fire_at=T0 + timedelta(hours=3))
        )
        assert moved.next_fire_at == T0 + timedelta(hours=3)
        await trio.sleep(2 * 3600)
        assert n.starts() == []  # not at the old time
        await n.seen.until(b'"stream_end"')
        assert n.clock.now() == T0 + timedelta(hours=3)
        await n.add(schedule=once(n.clock.now()), immediate=True)
        await n.seen.until(b'"stream_end"', 2)
        assert n.clock.now() == T0 + timedelta(hours=3)  # at once


@pytest.mark.guard(4 * DAY)
async def test_the_delivered_run_is_settled_after_sixty_hours_of_downtime(autojump_clock):
    """An hourly job down 60 h writes 59 coalesced runs after the delivered one in one fire;
    the turn still finds its run (by the id in its inbox payload, not by scanning recent runs)."""
    async with node() as n:
        job = await downtime(n, "coalesce", hours=60)
        await trio.testing.wait_all_tasks_blocked()
        (start,) = n.starts()
        runs = await JobStore(n.store).list_runs(job.id, limit=1000)
        assert len(runs) == 60
        (delivered,) = [r for r in runs if r.input_id is not None]
        assert delivered.state == "turn_completed"
        assert delivered.detail["coalesced"] == 59 and delivered.detail["status"] == "completed"
        assert (start["job_id"], start["run_id"]) == (job.id, delivered.id)
        (item,) = await n.store.list_inputs("s")
        assert item.payload["run_id"] == delivered.id


@pytest.mark.guard(2 * DAY)
async def test_at_most_n_scheduled_turns_run_at_once_the_rest_wait_queued_in_order(
    autojump_clock,
):
    """Five sessions' jobs fire at 13:00 with three slots: three turns run, two inputs stay
    queued in their inboxes; a user turn needs no slot; a user message sent behind a waiting
    scheduled input does not overtake it; each freed slot starts the next one."""
    async with node(scheduled_turns=3) as n:
        names = ["s", "t1", "t2", "t3", "t4"]
        for name in names[1:]:
            await n.store.create_session(name, "ada")
        for name in names:
            await n.add(
                session_id=name,
                schedule=once(T0 + timedelta(hours=1)),
                deliver={"prompt": f"wait:{name}", "source": "cron"},
            )
        await trio.sleep(3600 + 60)
        running = list(n.agent.running)
        assert len(running) == 3
        waiting = [name for name in names if f"wait:{name}" not in running]
        for name in waiting:
            (item,) = await n.store.list_inputs(name)
            assert item.state == "queued"  # nothing claimed: a crash now would lose nothing
        blocked = waiting[0]
        await n.registry.ref(f"session:{blocked}").ask(Submit(content="from the user"))
        await n.store.create_session("u", "ada")
        await n.registry.ref("session:u").ask(Submit(content="wait:free"))
        await trio.testing.wait_all_tasks_blocked()
        assert "wait:free" in n.agent.running  # user turns take no slot
        assert "from the user" not in n.agent.running  # it queues behind the cron input
        n.agent.gate(running[0]).set()
        await trio.testing.wait_all_tasks_blocked()
        assert len([c for c in n.agent.running if c.startswith("wait:t") or c == "wait:s"]) == 4
        for gate in [*running[1:], *(f"wait:{w}" for w in waiting), "wait:free"]:
            n.agent.gate(gate).set()
        await trio.testing.wait_all_tasks_blocked()
        for name in names:
            assert {i.state for i in await n.store.list_inputs(name)} == {"done"}, name
        order = [c for c in n.agent.running if c in (f"wait:{blocked}", "from the user")]
        assert order == [f"wait:{blocked}", "from the user"]


@pytest.mark.guard(2 * DAY)
async def test_deleting_a_session_whose_scheduled_turn_waits_for_a_slot_does_not_hang(
    autojump_clock,
):
    from turnstile.actors.sessions.actor import DeleteSession

    async with node(scheduled_turns=1) as n:
        await n.store.create_session("t", "ada")
        for name in ("s", "t"):
            await n.add(
                session_id=name,
                schedule=once(T0 + timedelta(hours=1)),
                deliver={"prompt": f"wait:{name}", "source": "cron"},
            )
        await trio.sleep(3600 + 60)
        (first,) = n.agent.running
        other = "t" if first == "wait:s" else "s"
        with trio.fail_after(1):
            await n.registry.ref(f"session:{other}").ask(DeleteSession())
        n.agent.gate(first).set()
        await trio.testing.wait_all_tasks_blocked()
        assert n.agent.running == [first]  # the deleted session's turn never ran


@pytest.mark.guard(2 * DAY)
async def test_a_turn_nobody_watched_start_ends_with_a_session_sync(autojump_clock):
    """recall.md: a headless run ends with session_sync, so a client that attaches late
    re-reads the session; a turn a client watched from its start needs none."""
    async with node() as n:
        await n.store.create_session("h", "ada")  # nobody attached
        for name in ("h", "s"):
            await n.add(
                session_id=name,
                schedule=once(T0 + timedelta(hours=1)),
                deliver={"prompt": "wait:go", "source": "cron"},
            )
        await trio.sleep(3600 + 1)
        late = type(n.seen)()
        await n.registry.ref("session:h").ask(Attach(subscriber=late))  # attaches mid-turn
        n.agent.gate("wait:go").set()
        await late.until(b'"session_sync"')
        await trio.testing.wait_all_tasks_blocked()
        tail = [e.type for e in await n.store.read_events("h")][-2:]
        assert tail == ["stream_end", "session_sync"]
        sync = (await n.store.read_events("h"))[-1].payload
        (item,) = await n.store.list_inputs("h")
        assert sync == {
            "busy": False,
            "policy": "enqueue",
            "queued": 0,
            "input_id": item.id,
            "status": "completed",
        }
        assert "session_sync" not in [e.type for e in await n.store.read_events("s")]


class CountingJobs(JobStore):
    """The node's job store, counting the fires asked of it (``fire_jobs`` batches by size)."""

    def __init__(self, store) -> None:
        super().__init__(store)
        self.batches: list[int] = []
        self.alone = 0

    async def fire_jobs(self, fires):
        self.batches.append(len(fires))
        return await super().fire_jobs(fires)

    async def fire_job(self, *args, **kwargs):
        self.alone += 1
        return await super().fire_job(*args, **kwargs)


@pytest.mark.guard(2 * DAY)
async def test_occurrences_due_together_fire_in_batches_each_once(autojump_clock):
    """450 jobs due at the same instant (one of them cancelled before): five batches of at
    most 100 (one statement each on PostgreSQL), each occurrence delivered once, with its own
    input and run; the cancelled one does not fire."""
    async with node(start_scheduler=False) as n:
        store = CountingJobs(n.store)
        delivered = []

        async def publish(session_id, message) -> None:
            if isinstance(message, Delivered):
                delivered.append((session_id, message.input_id, message.job_update.job_id))

        scheduler = await n.sup.spawn(
            lambda: SchedulerActor(n.store, n.clock, publish=publish, limits=LIMITS, jobs=store)
        )
        due = T0 + timedelta(minutes=5)
        jobs = []
        for k in range(450):
            session = f"s{k % 5}"
            if k < 5:
                await n.store.create_session(session, "ada")
            job = await scheduler.ask(
                AddJob(session_id=session, kind="once", schedule=once(due), deliver={"prompt": "p"})
            )
            jobs.append(job)
        await scheduler.ask(CancelJob(job_id=jobs[7].id))
        await trio.sleep(600)
        assert store.batches == [100, 100, 100, 100, 49] and store.alone == 0
        fired = {job_id for _, _, job_id in delivered}
        assert len(delivered) == len(fired) == 449 and jobs[7].id not in fired
        assert len({input_id for _, input_id, _ in delivered}) == 449
        for job in jobs[::50]:
            (run,) = await JobStore(n.store).list_runs(job.id)
            assert run.scheduled_for == due and run.created_at == due  # on the dot (mock time)
        assert await JobStore(n.store).list_runs(jobs[7].id) == []
        inputs = [i for k in range(5) for i in await n.store.list_inputs(f"s{k}")]
        assert len(inputs) == 449


@pytest.mark.guard(2 * DAY)
async def test_a_batch_that_fails_is_fired_one_by_one(autojump_clock):
    """The store refuses the batch (a lost connection, a deadlock): each of its occurrences is
    fired on its own, once."""
    async with node(start_scheduler=False) as n:
        store = CountingJobs(n.store)

        async def refuse(fires):
            store.batches.append(len(fires))
            raise StoreError("postgres: connection lost")

        store.fire_jobs = refuse
        scheduler = await n.sup.spawn(
            lambda: SchedulerActor(n.store, n.clock, publish=n.publish, limits=LIMITS, jobs=store)
        )
        due = T0 + timedelta(minutes=5)
        jobs = [
            await scheduler.ask(
                AddJob(session_id="s", kind="once", schedule=once(due), deliver={"prompt": "p"})
            )
            for _ in range(3)
        ]
        await trio.sleep(600)
        assert store.batches == [3] and store.alone == 3
        for job in jobs:
            assert len(await JobStore(n.store).list_runs(job.id)) == 1
        assert len(await n.store.list_inputs("s")) == 3


@pytest.mark.guard(2 * DAY)
async def test_an_occurrence_due_alone_is_fired_on_its_own(autojump_clock):
    """Jobs due at different moments (a steady stream) each go as a statement of their own:
    a batch would only add its hand-offs."""
    async with node(start_scheduler=False) as n:
        store = CountingJobs(n.store)
        scheduler = await n.sup.spawn(
            lambda: SchedulerActor(n.store, n.clock, publish=n.publish, limits=LIMITS, jobs=store)
        )
        for k in range(3):
            at = T0 + timedelta(minutes=5, seconds=k)
            await scheduler.ask(
                AddJob(session_id="s", kind="once", schedule=once(at), deliver={"prompt": "p"})
            )
        await trio.sleep(600)
        assert store.batches == [] and store.alone == 3
        assert len(await n.store.list_inputs("s")) == 3


class LosingJobs(JobStore):
    """The node's job store, where the first fire loses its compare-and-set (as when another
    node changed the job) and the re-read that follows finds the store not answering twice
    (a pool whose connections stayed busy past the bound, on a loaded box)."""

    def __init__(self, store) -> None:
        super().__init__(store)
        self.lost = False
        self.unanswered = 2

    async def fire_job(self, *args, **kwargs):
        if not self.lost:
            self.lost = True
            return None
        return await super().fire_job(*args, **kwargs)

    async def get_job(self, id: str):
        if self.lost and self.unanswered:
            self.unanswered -= 1
            raise StoreUnavailable("the store is unavailable; retry in a few seconds")
        return await super().get_job(id)


@pytest.mark.guard(2 * DAY)
async def test_a_job_re_read_while_the_store_does_not_answer_is_asked_again_not_crashed(
    autojump_clock,
):
    """A fire that lost its compare-and-set re-reads its job; the store does not answer the
    first two re-reads: the scheduler asks again (it does not crash and restart, which
    re-read every job), and the job fires once."""
    async with node(start_scheduler=False) as n:
        store = LosingJobs(n.store)
        scheduler = await n.sup.spawn(
            lambda: SchedulerActor(n.store, n.clock, publish=n.publish, limits=LIMITS, jobs=store)
        )
        job = await scheduler.ask(
            AddJob(
                session_id="s",
                kind="once",
                schedule=once(T0 + timedelta(minutes=5)),
                deliver={"prompt": "p"},
            )
        )
        await trio.sleep(600)
        assert list(n.sup.crash_reports) == []  # (before: StoreUnavailable crashed it)
        assert store.lost and store.unanswered == 0
        assert len(await JobStore(n.store).list_runs(job.id)) == 1
        assert len(await n.store.list_inputs("s")) == 1
