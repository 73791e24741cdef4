"""Jobs, runs and the exactly-once ``fire_job``, on both backends."""

from __future__ import annotations

from datetime import timedelta

import pytest
import trio

from tests.runtime.store._support import T0
from turnstile.runtime.errors import AlreadyExists, ConflictError, NotFound
from turnstile.runtime.store import FireRequest, Job

H = timedelta(hours=1)


async def test_create_get_list_job(store):
    await store.create_session("s1", "ada")
    job = await store.create_job(
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
    assert await store.get_job("j1") == job
    bare = await store.create_job("j0", kind="once", spec={}, state="paused")
    assert bare.session_id is None and bare.next_fire_at is None and bare.state == "paused"

    assert [j.id for j in await store.list_jobs()] == ["j0", "j1"]
    assert [j.id for j in await store.list_jobs(session_id="s1")] == ["j1"]
    assert [j.id for j in await store.list_jobs(states=["paused"])] == ["j0"]
    assert [j.id for j in await store.list_jobs(states=["active", "paused"])] == ["j0", "j1"]
    assert await store.list_jobs(session_id="s1", states=["paused"]) == []
    assert await store.list_jobs(states=[]) == []


async def test_job_errors(store):
    await store.create_job("j1", kind="once", spec={})
    with pytest.raises(AlreadyExists, match=r"^job 'j1' already exists$"):
        await store.create_job("j1", kind="once", spec={})
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.create_job("j2", kind="once", spec={}, session_id="nope")
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await store.get_job("nope")
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await store.update_job("nope", state="paused")
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await store.delete_job("nope")
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await store.list_runs("nope")
    with pytest.raises(ValueError, match=r"^unknown job state 'running'$"):
        await store.create_job("j3", kind="once", spec={}, state="running")
    with pytest.raises(ValueError, match=r"^unknown job state 'x'$"):
        await store.update_job("j1", state="x")
    with pytest.raises(ValueError, match=r"^unknown job state 'x'$"):
        await store.list_jobs(states=["x"])
    with pytest.raises(TypeError, match="spec must be a dict"):
        await store.create_job("j4", kind="once", spec=None)
    assert [j.id for j in await store.list_jobs()] == ["j1"]


async def test_update_and_delete_job(store, clock):
    await store.create_job("j1", kind="cron", spec={"a": 1}, next_fire_at=T0)
    clock.advance(minutes=1)
    job = await store.update_job("j1", state="paused", spec={"a": 2})
    assert (job.state, job.spec, job.next_fire_at) == ("paused", {"a": 2}, T0)
    assert job.updated_at == T0 + timedelta(minutes=1)
    job = await store.update_job("j1", next_fire_at=T0 + H, kind="interval")
    assert (job.kind, job.next_fire_at) == ("interval", T0 + H)
    job = await store.update_job("j1", next_fire_at=None)
    assert job.next_fire_at is None
    assert await store.update_job("j1") == job
    assert await store.get_job("j1") == job
    await store.delete_job("j1")
    with pytest.raises(NotFound):
        await store.get_job("j1")


async def test_due_jobs(store):
    await store.create_job("late", kind="once", spec={}, next_fire_at=T0 + 2 * H)
    await store.create_job("b", kind="once", spec={}, next_fire_at=T0)
    await store.create_job("a", kind="once", spec={}, next_fire_at=T0)
    await store.create_job("early", kind="once", spec={}, next_fire_at=T0 - H)
    await store.create_job("paused", kind="once", spec={}, next_fire_at=T0 - H, state="paused")
    await store.create_job("never", kind="once", spec={})
    assert [j.id for j in await store.due_jobs(T0)] == ["early", "a", "b"]
    assert [j.id for j in await store.due_jobs(T0, limit=2)] == ["early", "a"]
    assert [j.id for j in await store.due_jobs(T0 - 2 * H)] == []
    assert [j.id for j in await store.due_jobs(T0 + 3 * H)] == ["early", "a", "b", "late"]
    # a naive datetime is taken to be UTC
    assert len(await store.due_jobs(T0.replace(tzinfo=None))) == 3


async def test_fire_job(store, clock):
    await store.create_session("s1", "ada")
    await store.create_job("j1", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    clock.advance(seconds=2)

    fired = await store.fire_job("j1", T0, T0 + H, input=("cron", {"text": "standup"}))
    assert fired is not None
    assert (fired.job.next_fire_at, fired.job.run_count, fired.job.state) == (T0 + H, 1, "active")
    assert fired.input.session_id == "s1" and fired.input.source == "cron"
    # the input names its run, so its turn settles that run by id
    assert fired.input.payload == {"text": "standup", "run_id": fired.run.id}
    assert fired.input.state == "queued"
    assert fired.run.job_id == "j1" and fired.run.scheduled_for == T0
    assert fired.run.state == "queued" and fired.run.input_id == fired.input.id
    assert await store.get_job("j1") == fired.job
    assert await store.list_inputs("s1") == [fired.input]
    assert await store.list_runs("j1") == [fired.run]
    assert await store.get_run(fired.run.id) == fired.run
    with pytest.raises(NotFound, match="^no run with id 999$"):
        await store.get_run(999)

    # the same occurrence again: the compare-and-set loses, nothing is written
    assert await store.fire_job("j1", T0, T0 + H, input=("cron", {})) is None
    assert len(await store.list_inputs("s1")) == 1
    assert (await store.get_job("j1")).run_count == 1

    # a missed occurrence: a run without input
    missed = await store.fire_job("j1", T0 + H, T0 + 2 * H, run_state="missed", detail={"n": 1})
    assert missed.input is None and missed.run.input_id is None
    assert (missed.run.state, missed.run.detail) == ("missed", {"n": 1})

    # no next occurrence: the job completes and can no longer fire
    last = await store.fire_job("j1", T0 + 2 * H, None, input=("cron", {}))
    assert (last.job.state, last.job.next_fire_at, last.job.run_count) == ("completed", None, 3)
    assert await store.fire_job("j1", T0 + 2 * H, None) is None
    assert await store.due_jobs(T0 + 10 * H) == []
    assert [r.scheduled_for for r in await store.list_runs("j1")] == [T0 + 2 * H, T0 + H, T0]


async def test_fire_job_refusals(store):
    await store.create_session("s1", "ada")
    await store.create_job("paused", kind="cron", spec={}, next_fire_at=T0, state="paused")
    assert await store.fire_job("paused", T0, T0 + H) is None
    with pytest.raises(NotFound, match=r"^no job with id 'nope'$"):
        await store.fire_job("nope", T0, T0 + H)

    await store.create_job("lonely", kind="cron", spec={}, next_fire_at=T0)
    with pytest.raises(ConflictError, match=r"^job 'lonely' has no session$"):
        await store.fire_job("lonely", T0, T0 + H, input=("cron", {}))
    job = await store.get_job("lonely")  # rolled back entirely
    assert (job.next_fire_at, job.run_count) == (T0, 0)
    assert await store.list_runs("lonely") == []
    with pytest.raises(TypeError, match=r"input must be a \(source, payload\) pair"):
        await store.fire_job("lonely", T0, T0 + H, input={"text": "x"})


async def test_concurrent_fires_enqueue_once(store, backend):
    """Two store instances race to fire each occurrence: exactly one wins, one input appears."""
    await store.create_session("s1", "ada")
    await store.create_job("j1", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    async with backend.open() as other:
        for k in range(5):
            results = []

            async def fire(s, k=k, results=results) -> None:
                occurrence = T0 + k * H
                results.append(
                    await s.fire_job("j1", occurrence, occurrence + H, input=("cron", {"k": k}))
                )

            async with trio.open_nursery() as nursery:
                for s in (store, other, store, other):
                    nursery.start_soon(fire, s)
            assert sum(r is not None for r in results) == 1
    inputs = await store.list_inputs("s1")
    assert [i.payload["k"] for i in inputs] == [0, 1, 2, 3, 4]
    runs = await store.list_runs("j1")
    assert len(runs) == 5 and {r.input_id for r in runs} == {i.id for i in inputs}
    assert (await store.get_job("j1")).run_count == 5


async def test_list_and_update_runs(store, clock):
    await store.create_job("j1", kind="cron", spec={}, next_fire_at=T0)
    for k in range(4):
        await store.fire_job("j1", T0 + k * H, T0 + (k + 1) * H)
    runs = await store.list_runs("j1")
    assert [r.scheduled_for for r in runs] == [T0 + k * H for k in (3, 2, 1, 0)]  # newest first
    assert [r.id for r in await store.list_runs("j1", limit=2)] == [runs[0].id, runs[1].id]

    clock.advance(seconds=30)
    run = await store.update_run(runs[-1].id, "turn_completed", {"tokens": 5})
    assert (run.state, run.detail, run.created_at) == ("turn_completed", {"tokens": 5}, T0)
    assert run.updated_at == T0 + timedelta(seconds=30)
    run = await store.update_run(run.id, "turn_failed")  # None keeps the detail
    assert (run.state, run.detail) == ("turn_failed", {"tokens": 5})
    with pytest.raises(NotFound, match=r"^no run with id 99999$"):
        await store.update_run(99999, "missed")
    await store.delete_job("j1")
    with pytest.raises(NotFound, match=rf"^no run with id {run.id}$"):
        await store.update_run(run.id, "missed")


async def test_fire_job_can_skip_counting_and_records_extra_runs_atomically(store):
    await store.create_session("s1", "ada")
    await store.create_job("j", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    fired = await store.fire_job(
        "j",
        T0,
        T0 + 3 * H,
        run_state="missed",
        counts=False,
        extra_runs=[(T0 + H, "missed", None), (T0 + 2 * H, "missed", {"why": "downtime"})],
    )
    assert fired is not None and fired.job.run_count == 0 and fired.input is None
    runs = await store.list_runs("j")
    assert [(r.scheduled_for, r.state, r.detail) for r in reversed(runs)] == [
        (T0, "missed", None),
        (T0 + H, "missed", None),
        (T0 + 2 * H, "missed", {"why": "downtime"}),
    ]
    # a lost compare-and-set writes none of them
    assert await store.fire_job("j", T0, T0 + 4 * H, extra_runs=[(T0, "coalesced", None)]) is None
    assert len(await store.list_runs("j")) == 3


# -- fire_jobs: many on-time occurrences at once ------------------------------------------------


def _fire(job_id: str, expected, new, **more) -> FireRequest:
    return FireRequest(
        job_id=job_id,
        expected_next_fire_at=expected,
        new_next_fire_at=new,
        input=("cron", {"job": job_id}),
        **more,
    )


async def test_fire_jobs_fires_each_occurrence_once_and_only_those_that_match(store, clock):
    for sid in ("s1", "s2"):
        await store.create_session(sid, "ada")
    for job_id, sid in (("a", "s1"), ("b", "s2"), ("last", "s1"), ("cancelled", "s1")):
        await store.create_job(job_id, kind="cron", spec={}, session_id=sid, next_fire_at=T0)
    await store.create_job("paused", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    await store.update_job("paused", state="paused")
    await store.update_job("cancelled", state="cancelled", next_fire_at=None)
    await store.create_job("early", kind="cron", spec={}, session_id="s1", next_fire_at=T0 + H)
    await store.create_job("lonely", kind="cron", spec={}, next_fire_at=T0)
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
    answers = await store.fire_jobs(fires)
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
        assert await store.get_job(fired.job.id) == fired.job
        assert await store.list_runs(fired.job.id) == [fired.run]
    assert await store.list_inputs("s1") == sorted([a.input, last.input], key=lambda i: i.id)
    assert await store.list_inputs("s2") == [b.input]
    # those that did not match wrote nothing
    for job_id in ("paused", "cancelled", "early", "lonely"):
        job = await store.get_job(job_id)
        assert job.run_count == 0 and await store.list_runs(job_id) == []
    assert (await store.get_job("early")).next_fire_at == T0 + H

    # the same occurrences again: every compare-and-set loses, nothing is written
    assert await store.fire_jobs(fires) == [None] * len(fires)
    assert len(await store.list_inputs("s1")) == 2
    assert (await store.get_job("a")).run_count == 1
    assert await store.fire_jobs([]) == []


async def test_fire_jobs_refusals(store):
    await store.create_session("s1", "ada")
    await store.create_job("j1", kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    with pytest.raises(ValueError, match=r"^job 'j1' is in fires twice$"):
        await store.fire_jobs([_fire("j1", T0, T0 + H), _fire("j1", T0, T0 + H)])
    with pytest.raises(TypeError, match=r"^input must be a \(source, payload\) pair$"):
        await store.fire_jobs(
            [FireRequest(job_id="j1", expected_next_fire_at=T0, new_next_fire_at=None, input=None)]
        )
    with pytest.raises(TypeError, match=r"^fires must be FireRequests, not tuple$"):
        await store.fire_jobs([("j1", T0, T0 + H)])
    assert (await store.get_job("j1")).run_count == 0  # nothing was written


async def test_batches_racing_over_the_same_jobs_fire_each_occurrence_once(store, backend):
    """Two store instances (two nodes) fire overlapping batches of the same occurrences at
    once, in opposite orders: each occurrence fires once in total, and neither batch fails."""
    await store.create_session("s1", "ada")
    ids = [f"j{n:03d}" for n in range(120)]
    for job_id in ids:
        await store.create_job(job_id, kind="cron", spec={}, session_id="s1", next_fire_at=T0)
    async with backend.open() as other:
        for k in range(4):
            occurrence = T0 + k * H
            batches = [
                (store, ids[:80]),
                (other, list(reversed(ids[40:]))),
                (other, ids[::2]),
                (store, list(reversed(ids[1::2]))),
            ]
            won: list[str] = []

            async def fire(s, batch, occurrence=occurrence, won=won) -> None:
                answers = await s.fire_jobs([_fire(j, occurrence, occurrence + H) for j in batch])
                won.extend(a.job.id for a in answers if a is not None)

            async with trio.open_nursery() as nursery:
                for s, batch in batches:
                    nursery.start_soon(fire, s, batch)
            assert sorted(won) == ids  # each once, none lost
    inputs = await store.list_inputs("s1")
    assert len(inputs) == 4 * len(ids)
    for job_id in ids[::17]:
        job = await store.get_job(job_id)
        assert (job.run_count, job.next_fire_at) == (4, T0 + 4 * H)
        assert [r.scheduled_for for r in await store.list_runs(job_id)] == [
            T0 + k * H for k in (3, 2, 1, 0)
        ]
