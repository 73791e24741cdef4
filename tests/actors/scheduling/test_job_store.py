"""Jobs, runs and the exactly-once ``fire_job``, on both backends."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import trio

from tests.runtime.store._support import T0
from turnstile.actors.scheduling.records import FireRequest, Job
from turnstile.actors.scheduling.store import JobStore
from turnstile.runtime.errors import AlreadyExists, ConflictError, NotFound

H = timedelta(hours=1)


async def test_create_get_list_job(jobs, jobs_store):
    await jobs_store.create_session("s1", "ada")
    job = await jobs.create_job(
        "j1", kind="cron", spec={"cron": "0 9 * * *"}, session_id="s1", next_fire_at=T0
    )
    assert job == Job(
        id="j1",
        session_id="s1",
        kind="cron",
        spec={"cron": "0 9 * * *"},
        state="active",
        next_fire_at=T0,
        created_at=T0,
        updated_at=T0,
        run_count=0,
    )
    assert await jobs.get_job("j1") == job
    bare = await jobs.create_job("j0", kind="once", spec={}, state="paused")
    assert bare.session_id is None and bare.next_fire_at is None and bare.state == "paused"

    assert [j.id for j in await jobs.list_jobs()] == ["j0", "j1"]
    assert [j.id for j in await jobs.list_jobs(session_id="s1")] == ["j1"]
    assert [j.id for j in await jobs.list_jobs(states=["paused"])] == ["j0"]
    assert [j.id for j in await jobs.list_jobs(states=["active", "paused"])] == ["j0", "j1"]
    assert await jobs.list_jobs(session_id="s1", states=["paused"]) == []
    assert await jobs.list_jobs(states=[]) == []


async def test_job_errors(jobs):
    await jobs.create_job("j1", kind="once", spec={})
    with pytest.raises(AlreadyExists, match=r"^job 'j1' already exists$"):
        await jobs.create_job("j1", kind="once", spec={})
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await jobs.create_job("j2", kind="once", spec={}, session_id="nope")
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await jobs.get_job("nope")
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await jobs.update_job("nope", state="paused")
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await jobs.delete_job("nope")
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await jobs.list_runs("nope")
    with pytest.raises(ValueError, match=r"^unknown job state 'running'$"):
        await jobs.create_job("j3", kind="once", spec={}, state="running")
    with pytest.raises(ValueError, match=r"^unknown job state 'x'$"):
        await jobs.update_job("j1", state="x")
    with pytest.raises(ValueError, match=r"^unknown job state 'x'$"):
        await jobs.list_jobs(states=["x"])
    with pytest.raises(TypeError, match="spec must be a dict"):
        await jobs.create_job("j4", kind="once", spec=None)
    assert [j.id for j in await jobs.list_jobs()] == ["j1"]


async def test_update_and_delete_job(jobs, clock):
    await jobs.create_job("j1", kind="cron", spec={"a": 1}, next_fire_at=T0)
    clock.advance(minutes=1)
    job = await jobs.update_job("j1", state="paused", spec={"a": 2})
    assert (job.state, job.spec, job.next_fire_at) == ("paused", {"a": 2}, T0)
    assert job.updated_at == T0 + timedelta(minutes=1)
    job = await jobs.update_job("j1", next_fire_at=T0 + H, kind="interval")
    assert (job.kind, job.next_fire_at) == ("interval", T0 + H)
    job = await jobs.update_job("j1", next_fire_at=None)
    assert job.next_fire_at is None
    assert await jobs.update_job("j1") == job
    assert await jobs.get_job("j1") == job
    await jobs.delete_job("j1")
    with pytest.raises(NotFound):
        await jobs.get_job("j1")


async def test_transition_job_is_a_compare_and_set_on_the_state(jobs, clock):
    """What pausing and resuming a job use: a pause never lands on a job a fire completed."""
    await jobs.create_job("j1", kind="cron", spec={}, next_fire_at=T0)
    paused = await jobs.transition_job("j1", "active", "paused")
    assert (paused.state, paused.next_fire_at) == ("paused", T0)
    assert await jobs.transition_job("j1", "active", "paused") is None  # not active now
    resumed = await jobs.transition_job("j1", "paused", "active", next_fire_at=T0 + H)
    assert (resumed.state, resumed.next_fire_at) == ("active", T0 + H)
    await jobs.update_job("j1", state="completed", next_fire_at=None)
    assert await jobs.transition_job("j1", "active", "paused") is None
    assert (await jobs.get_job("j1")).state == "completed"
    assert await jobs.transition_job("nope", "active", "paused") is None
    with pytest.raises(ValueError, match=r"^unknown job state 'asleep'$"):
        await jobs.transition_job("j1", "completed", "asleep")


async def test_due_jobs(jobs):
    await jobs.create_job("late", kind="once", spec={}, next_fire_at=T0 + 2 * H)
    await jobs.create_job("b", kind="once", spec={}, next_fire_at=T0)
    await jobs.create_job("a", kind="once", spec={}, next_fire_at=T0)
    await jobs.create_job("early", kind="once", spec={}, next_fire_at=T0 - H)
    await jobs.create_job("paused", kind="once", spec={}, next_fire_at=T0 - H, state="paused")
    await jobs.create_job("never", kind="once", spec={})
    assert [j.id for j in await jobs.due_jobs(T0)] == ["early", "a", "b"]
    assert [j.id for j in await jobs.due_jobs(T0, limit=2)] == ["early", "a"]
    assert [j.id for j in await jobs.due_jobs(T0 - 2 * H)] == []
    assert [j.id for j in await jobs.due_jobs(T0 + 3 * H)] == ["early", "a", "b", "late"]
    # a naive datetime is taken to be UTC
    assert len(await jobs.due_jobs(T0.replace(tzinfo=None))) == 3


async def test_due_jobs_wanted_decodes_only_what_the_predicate_wants(jobs):
    """A scheduler's take-on pass: every due job is offered as (id, next_fire_at), in due
    order; only those wanted come back, whole."""
    await jobs.create_job("late", kind="once", spec={"a": 1}, next_fire_at=T0 + 2 * H)
    await jobs.create_job("b", kind="cron", spec={"b": [2]}, next_fire_at=T0, session_id=None)
    await jobs.create_job("a", kind="once", spec={}, next_fire_at=T0)
    await jobs.create_job("early", kind="once", spec={}, next_fire_at=T0 - H)
    await jobs.create_job("paused", kind="once", spec={}, next_fire_at=T0 - H, state="paused")
    offered: list[tuple[str, datetime | None]] = []

    def wanted(job_id: str, due: datetime | None) -> bool:
        offered.append((job_id, due))
        return job_id != "a"

    found = await jobs.due_jobs_wanted(T0, wanted)
    assert offered == [("early", T0 - H), ("a", T0), ("b", T0)]
    assert [(j.id, j.kind, j.next_fire_at, j.run_count) for j in found] == [
        ("early", "once", T0 - H, 0),
        ("b", "cron", T0, 0),
    ]
    assert json.loads(found[1].spec) == {"b": [2]}  # the stored text, decoded when it fires
    offered.clear()
    assert [j.id for j in await jobs.due_jobs_wanted(T0 + 3 * H, wanted, limit=2)] == ["early"]
    assert [job_id for job_id, _ in offered] == ["early", "a"]


async def test_fire_job(jobs, jobs_store, clock):
    await jobs_store.create_session("s1", "ada")
    await jobs.create_job("j1", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    clock.advance(seconds=2)

    fired = await jobs.fire_job("j1", T0, T0 + H, input=("cron", {"text": "standup"}))
    assert fired is not None
    assert (fired.job.next_fire_at, fired.job.run_count, fired.job.state) == (T0 + H, 1, "active")
    assert fired.input.session_id == "s1" and fired.input.source == "cron"
    # the input names its run, so its turn settles that run by id
    assert fired.input.payload == {"text": "standup", "run_id": fired.run.id}
    assert fired.input.state == "queued"
    assert fired.run.job_id == "j1" and fired.run.scheduled_for == T0
    assert fired.run.state == "queued" and fired.run.input_id == fired.input.id
    assert await jobs.get_job("j1") == fired.job
    assert await jobs_store.list_inputs("s1") == [fired.input]
    assert await jobs.list_runs("j1") == [fired.run]
    assert await jobs.get_run(fired.run.id) == fired.run
    with pytest.raises(NotFound, match="^no run with id 999$"):
        await jobs.get_run(999)

    # the same occurrence again: the compare-and-set loses, nothing is written
    assert await jobs.fire_job("j1", T0, T0 + H, input=("cron", {})) is None
    assert len(await jobs_store.list_inputs("s1")) == 1
    assert (await jobs.get_job("j1")).run_count == 1

    # a missed occurrence: a run without input
    missed = await jobs.fire_job("j1", T0 + H, T0 + 2 * H, run_state="missed", detail={"n": 1})
    assert missed.input is None and missed.run.input_id is None
    assert (missed.run.state, missed.run.detail) == ("missed", {"n": 1})

    # no next occurrence: the job completes and can no longer fire
    last = await jobs.fire_job("j1", T0 + 2 * H, None, input=("cron", {}))
    assert (last.job.state, last.job.next_fire_at, last.job.run_count) == ("completed", None, 3)
    assert await jobs.fire_job("j1", T0 + 2 * H, None) is None
    assert await jobs.due_jobs(T0 + 10 * H) == []
    assert [r.scheduled_for for r in await jobs.list_runs("j1")] == [T0 + 2 * H, T0 + H, T0]


async def test_fire_job_refusals(jobs, jobs_store):
    await jobs_store.create_session("s1", "ada")
    await jobs.create_job("paused", kind="cron", spec={}, next_fire_at=T0, state="paused")
    assert await jobs.fire_job("paused", T0, T0 + H) is None
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await jobs.fire_job("nope", T0, T0 + H)

    await jobs.create_job("lonely", kind="cron", spec={}, next_fire_at=T0)
    with pytest.raises(ConflictError, match=r"^job 'lonely' has no session$"):
        await jobs.fire_job("lonely", T0, T0 + H, input=("cron", {}))
    job = await jobs.get_job("lonely")  # rolled back entirely
    assert (job.next_fire_at, job.run_count) == (T0, 0)
    assert await jobs.list_runs("lonely") == []
    with pytest.raises(TypeError, match=r"input must be a \(source, payload\) pair"):
        await jobs.fire_job("lonely", T0, T0 + H, input={"text": "x"})


async def test_concurrent_fires_enqueue_once(jobs, jobs_store, jobs_backend):
    """Two store instances race to fire each occurrence: exactly one wins, one input appears."""
    await jobs_store.create_session("s1", "ada")
    await jobs.create_job("j1", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    async with jobs_backend.open() as other:
        for k in range(5):
            results = []

            async def fire(s, k=k, results=results) -> None:
                occurrence = T0 + k * H
                results.append(
                    await JobStore(s).fire_job(
                        "j1", occurrence, occurrence + H, input=("cron", {"k": k})
                    )
                )

            async with trio.open_nursery() as nursery:
                for s in (jobs_store, other, jobs_store, other):
                    nursery.start_soon(fire, s)
            assert sum(r is not None for r in results) == 1
    inputs = await jobs_store.list_inputs("s1")
    assert [i.payload["k"] for i in inputs] == [0, 1, 2, 3, 4]
    runs = await jobs.list_runs("j1")
    assert len(runs) == 5 and {r.input_id for r in runs} == {i.id for i in inputs}
    assert (await jobs.get_job("j1")).run_count == 5


async def test_list_and_update_runs(jobs, clock):
    await jobs.create_job("j1", kind="cron", spec={}, next_fire_at=T0)
    for k in range(4):
        await jobs.fire_job("j1", T0 + k * H, T0 + (k + 1) * H)
    runs = await jobs.list_runs("j1")
    assert [r.scheduled_for for r in runs] == [T0 + k * H for k in (3, 2, 1, 0)]  # newest first
    assert [r.id for r in await jobs.list_runs("j1", limit=2)] == [runs[0].id, runs[1].id]

    clock.advance(seconds=30)
    run = await jobs.update_run(runs[-1].id, "turn_completed", {"tokens": 5})
    assert (run.state, run.detail, run.created_at) == ("turn_completed", {"tokens": 5}, T0)
    assert run.updated_at == T0 + timedelta(seconds=30)
    run = await jobs.update_run(run.id, "turn_failed")  # None keeps the detail
    assert (run.state, run.detail) == ("turn_failed", {"tokens": 5})
    with pytest.raises(NotFound, match=r"^no run with id 99999$"):
        await jobs.update_run(99999, "missed")
    await jobs.delete_job("j1")
    with pytest.raises(NotFound, match=rf"^no run with id {run.id}$"):
        await jobs.update_run(run.id, "missed")


async def test_fire_job_can_skip_counting_and_records_extra_runs_atomically(jobs, jobs_store):
    await jobs_store.create_session("s1", "ada")
    await jobs.create_job("j", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    fired = await jobs.fire_job(
        "j",
        T0,
        T0 + 3 * H,
        run_state="missed",
        counts=False,
        extra_runs=[(T0 + H, "missed", None), (T0 + 2 * H, "missed", {"why": "downtime"})],
    )
    assert fired is not None and fired.job.run_count == 0 and fired.input is None
    runs = await jobs.list_runs("j")
    assert [(r.scheduled_for, r.state, r.detail) for r in reversed(runs)] == [
        (T0, "missed", None),
        (T0 + H, "missed", None),
        (T0 + 2 * H, "missed", {"why": "downtime"}),
    ]
    # a lost compare-and-set writes none of them
    assert await jobs.fire_job("j", T0, T0 + 4 * H, extra_runs=[(T0, "coalesced", None)]) is None
    assert len(await jobs.list_runs("j")) == 3


# -- fire_jobs: many on-time occurrences at once ------------------------------------------------


def _fire(job_id: str, expected, new, **more) -> FireRequest:
    return FireRequest(
        job_id=job_id,
        expected_next_fire_at=expected,
        new_next_fire_at=new,
        input=("cron", {"job": job_id}),
        **more,
    )


async def test_fire_jobs_fires_each_occurrence_once_and_only_those_that_match(
    jobs, jobs_store, clock
):
    for sid in ("s1", "s2"):
        await jobs_store.create_session(sid, "ada")
    for job_id, sid in (("a", "s1"), ("b", "s2"), ("last", "s1"), ("cancelled", "s1")):
        await jobs.create_job(job_id, kind="cron", spec={}, session_id=sid, next_fire_at=T0)
    await jobs.create_job("paused", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    await jobs.update_job("paused", state="paused")
    await jobs.update_job("cancelled", state="cancelled", next_fire_at=None)
    await jobs.create_job("early", kind="cron", spec={}, session_id="s1", next_fire_at=T0 + H)
    await jobs.create_job("lonely", kind="cron", spec={}, next_fire_at=T0)
    clock.advance(seconds=2)

    fires = [
        _fire("b", T0, T0 + H, detail={"late_seconds": 2}),
        _fire("paused", T0, T0 + H),
        _fire("a", T0, T0 + H),
        _fire("nope", T0, T0 + H),
        _fire("cancelled", T0, T0 + H),
        _fire("early", T0, T0 + 2 * H),  # its occurrence is another one: the CAS loses
        _fire("lonely", T0, T0 + H),
        _fire("last", T0, None),
    ]
    answers = await jobs.fire_jobs(fires)
    assert [a is not None for a in answers] == [True, False, True, False, False, False, False, True]
    b, a, last = answers[0], answers[2], answers[7]
    # each answer is what fire_job answers for that occurrence
    assert (b.job.id, b.job.next_fire_at, b.job.run_count, b.job.state) == (
        "b",
        T0 + H,
        1,
        "active",
    )
    assert (b.run.job_id, b.run.scheduled_for, b.run.state) == ("b", T0, "queued")
    assert b.run.detail == {"late_seconds": 2} and b.run.input_id == b.input.id
    assert b.run.created_at == T0 + timedelta(seconds=2)
    assert (b.input.session_id, b.input.source, b.input.state) == ("s2", "cron", "queued")
    assert b.input.payload == {"job": "b", "run_id": b.run.id}
    assert (last.job.state, last.job.next_fire_at) == ("completed", None)
    for fired in (a, b, last):
        assert await jobs.get_job(fired.job.id) == fired.job
        assert await jobs.list_runs(fired.job.id) == [fired.run]
    assert await jobs_store.list_inputs("s1") == sorted([a.input, last.input], key=lambda i: i.id)
    assert await jobs_store.list_inputs("s2") == [b.input]
    # those that did not match wrote nothing
    for job_id in ("paused", "cancelled", "early", "lonely"):
        job = await jobs.get_job(job_id)
        assert job.run_count == 0 and await jobs.list_runs(job_id) == []
    assert (await jobs.get_job("early")).next_fire_at == T0 + H

    # the same occurrences again: every compare-and-set loses, nothing is written
    assert await jobs.fire_jobs(fires) == [None] * len(fires)
    assert len(await jobs_store.list_inputs("s1")) == 2
    assert (await jobs.get_job("a")).run_count == 1
    assert await jobs.fire_jobs([]) == []


async def test_fire_jobs_refusals(jobs, jobs_store):
    await jobs_store.create_session("s1", "ada")
    await jobs.create_job("j1", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    with pytest.raises(ValueError, match=r"^job 'j1' is in fires twice$"):
        await jobs.fire_jobs([_fire("j1", T0, T0 + H), _fire("j1", T0, T0 + H)])
    with pytest.raises(TypeError, match=r"^input must be a \(source, payload\) pair$"):
        await jobs.fire_jobs(
            [FireRequest(job_id="j1", expected_next_fire_at=T0, new_next_fire_at=None, input=None)]
        )
    with pytest.raises(TypeError, match=r"^fires must be FireRequests, not tuple$"):
        await jobs.fire_jobs([("j1", T0, T0 + H)])
    assert (await jobs.get_job("j1")).run_count == 0  # nothing was written


async def test_batches_racing_over_the_same_jobs_fire_each_occurrence_once(
    jobs, jobs_store, jobs_backend
):
    """Two store instances (two nodes) fire overlapping batches of the same occurrences at
    once, in opposite orders: each occurrence fires once in total, and neither batch fails."""
    await jobs_store.create_session("s1", "ada")
    ids = [f"j{n:03d}" for n in range(120)]
    for job_id in ids:
        await jobs.create_job(job_id, kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    async with jobs_backend.open() as other:
        for k in range(4):
            occurrence = T0 + k * H
            batches = [
                (jobs_store, ids[:80]),
                (other, list(reversed(ids[40:]))),
                (other, ids[::2]),
                (jobs_store, list(reversed(ids[1::2]))),
            ]
            won: list[str] = []

            async def fire(s, batch, occurrence=occurrence, won=won) -> None:
                answers = await JobStore(s).fire_jobs(
                    [_fire(j, occurrence, occurrence + H) for j in batch]
                )
                won.extend(a.job.id for a in answers if a is not None)

            async with trio.open_nursery() as nursery:
                for s, batch in batches:
                    nursery.start_soon(fire, s, batch)
            assert sorted(won) == ids  # each once, none lost
    inputs = await jobs_store.list_inputs("s1")
    assert len(inputs) == 4 * len(ids)
    for job_id in ids[::17]:
        job = await jobs.get_job(job_id)
        assert (job.run_count, job.next_fire_at) == (4, T0 + 4 * H)
        assert [r.scheduled_for for r in await jobs.list_runs(job_id)] == [
            T0 + k * H for k in (3, 2, 1, 0)
        ]


async def test_delete_session_deletes_its_jobs_and_their_runs(jobs, jobs_store, jobs_backend):
    # by the tables' own ON DELETE CASCADE: the kernel's delete_session names no job
    store = jobs_store
    await store.create_session("s1", "ada")
    await store.create_session("s2", "ada")
    for sid in ("s1", "s2"):
        await store.enqueue_input(sid, "user", {"t": sid})
        await store.append_events(sid, [("a", {}), ("b", {})])
        await jobs.create_job(f"j-{sid}", kind="once", spec={}, session_id=sid, next_fire_at=T0)
        await jobs.fire_job(f"j-{sid}", T0, None, input=("cron", {}))
    await jobs.create_job("global", kind="once", spec={}, next_fire_at=T0)
    await jobs.fire_job("global", T0, None)

    await store.delete_session("s1")

    assert [j.id for j in await jobs.list_jobs()] == ["global", "j-s2"]  # same created_at: by id
    for table, left in [("inbox", 2), ("events", 2), ("jobs", 2), ("job_runs", 2)]:
        assert await jobs_backend.count(table) == left, table
    with pytest.raises(NotFound):
        await store.list_inputs("s1")
    assert len(await store.list_inputs("s2")) == 2


async def test_timestamps_round_trip(jobs):
    odd = datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5)))
    job = await jobs.create_job("j1", kind="once", spec={}, next_fire_at=odd)
    assert job.next_fire_at == odd and job.next_fire_at.utcoffset() == timedelta(0)
    assert (await jobs.get_job("j1")).next_fire_at == odd
    assert [j.id for j in await jobs.due_jobs(odd)] == ["j1"]
    assert await jobs.due_jobs(odd - timedelta(microseconds=1)) == []
