"""The scheduler's load at start, a page at a time (issue 26: a million pending jobs): the
store's pages by id (``JobStore.active_jobs``) give every active job with a next occurrence
once, as the slim ``ActiveJob`` the index keeps; a scheduler whose pages are smaller than its
jobs indexes each of them once and fires each once, on both backends."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import pytest
import trio

from tests.runtime.store._support import T0
from tests.support.mock_node import once
from tests.support.polling import eventually
from turnstile.actors.scheduling.actor import ResumeJob, SchedulerActor, SchedulerLimits
from turnstile.actors.scheduling.records import ActiveJob
from turnstile.actors.scheduling.spec import JobSpec, decode_spec
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.actor import Delivered
from turnstile.runtime.clock import SystemClock
from turnstile.runtime.errors import ConflictError
from turnstile.runtime.store import decode_json
from turnstile.runtime.supervisor import open_supervisor

H = timedelta(hours=1)


def spec(prompt: str, at=T0) -> dict[str, Any]:
    return msgspec.to_builtins(JobSpec(schedule=once(at), deliver={"prompt": prompt}))


async def test_active_jobs_come_a_page_at_a_time_by_id_each_once(jobs, jobs_store, clock):
    await jobs_store.create_session("s1", "ada")
    await jobs_store.create_session("s2", "ada")
    # Created out of id order, a second apart; every state, and an active job with no next.
    made = [
        ("j7", "active", T0 + H, "s1"),
        ("j2", "paused", T0 + H, "s1"),
        ("j5", "active", T0 + 2 * H, "s2"),
        ("j1", "active", T0, "s1"),
        ("j9", "active", None, "s2"),
        ("j4", "completed", None, "s1"),
        ("j3", "active", T0 + 3 * H, "s1"),
        ("j8", "active", T0 + H, None),
        ("j6", "cancelled", None, "s2"),
    ]
    for job_id, state, at, session_id in made:
        await jobs.create_job(
            job_id,
            kind="once",
            spec=spec(job_id),
            session_id=session_id,
            next_fire_at=at,
            state=state,
        )
        clock.advance(seconds=1)
    seen: list[tuple[ActiveJob, Any]] = []
    after, pages = "", 0
    while True:
        page = await jobs.active_jobs(after, limit=2)
        pages += 1
        seen += page
        if len(page) < 2:
            break
        after = page[-1][0].id
    assert pages == 3  # 2 + 2 + 1
    wanted = {"j1", "j3", "j5", "j7", "j8"}  # active with a next occurrence
    assert [job.id for job, _ in seen] == sorted(wanted)
    by_id = {job.id: (job, created_at) for job, created_at in seen}
    for job_id, _state, at, session_id in made:
        if job_id not in wanted:
            continue
        job = by_id[job_id][0]
        stored = await jobs.get_job(job_id)
        assert job == ActiveJob(
            id=job_id,
            session_id=session_id,
            kind="once",
            spec=job.spec,
            next_fire_at=at,
            run_count=0,
        )
        assert decode_json(job.spec) == stored.spec  # the stored text, as it is
        assert decode_spec(job_id, job.spec).deliver == {"prompt": job_id}
    # the created_at given with each sorts as the jobs were created
    order = [job_id for job_id, *_ in made if job_id in wanted]
    assert sorted(wanted, key=lambda job_id: by_id[job_id][1]) == order
    # one string per session, shared by its jobs
    assert by_id["j1"][0].session_id is by_id["j3"][0].session_id
    assert await jobs.active_jobs("j8") == []


async def test_a_reload_across_pages_indexes_and_fires_every_job_once(jobs_backend):
    clock = SystemClock()
    delivered: list[str] = []

    async def publish(session_id: str, message: Any) -> None:
        if isinstance(message, Delivered):
            delivered.append(message.job_update.job_id)

    async with jobs_backend.open(clock) as store:
        jobs = JobStore(store)
        await store.create_session("s1", "ada")
        soon = clock.now() + timedelta(seconds=0.5)
        # 3 per page: the pages end on a bad spec, a paused job, the overdue ones
        expected, overdue = [], ["o3", "o1", "o2"]  # created in this order
        for i in range(10):
            job_id = f"j{i:02d}"
            if i == 4:
                bad = {**spec(job_id), "max_runs": "twice"}
                await jobs.create_job(
                    job_id, kind="once", spec=bad, session_id="s1", next_fire_at=soon
                )
                continue
            state = "paused" if i == 5 else "active"
            await jobs.create_job(
                job_id,
                kind="once",
                spec=spec(job_id),
                session_id="s1",
                next_fire_at=soon,
                state=state,
            )
            if state == "active":
                expected.append(job_id)
        for job_id in overdue:
            await jobs.create_job(
                job_id,
                kind="once",
                spec=spec(job_id),
                session_id="s1",
                next_fire_at=clock.now() - H,
            )
            await trio.sleep(0.002)  # created_at apart
        actors: list[SchedulerActor] = []

        def factory() -> SchedulerActor:
            actor = SchedulerActor(
                store,
                clock,
                publish=publish,
                limits=SchedulerLimits(restart_rate=20),
                load_page=3,
            )
            actors.append(actor)
            return actor

        async with open_supervisor("root", escalate=False) as sup:
            await sup.spawn(factory, name="scheduler")
            (scheduler,) = actors
            assert sorted(scheduler.entries) == sorted(expected + overdue)
            assert scheduler.metrics.value("turnstile_scheduler_bad_specs_total") == 1

            async def all_fired() -> bool:
                return len(delivered) >= len(expected) + len(overdue)

            await eventually(all_fired)
            await trio.sleep(0.3)  # nothing fires again
            assert sorted(delivered) == sorted(expected + overdue)
            for job_id in expected + overdue:
                assert [r.state for r in await jobs.list_runs(job_id)] == ["queued"], job_id
            # the overdue ones were spread in the order they were created
            runs = {job_id: (await jobs.list_runs(job_id))[0].id for job_id in overdue}
            assert sorted(overdue, key=runs.__getitem__) == overdue
            await sup.stop("scheduler")


async def test_a_stored_spec_that_is_no_object_is_left_alone_loaded_or_resumed(jobs_backend):
    clock = SystemClock()

    async def publish(session_id: str, message: Any) -> None:
        pass

    async with jobs_backend.open(clock) as store:
        jobs = JobStore(store)
        await store.create_session("s1", "ada")
        later = clock.now() + H
        for job_id, state in (("a", "active"), ("b", "active"), ("p", "paused")):
            await jobs.create_job(
                job_id,
                kind="once",
                spec=spec(job_id, later),
                session_id="s1",
                next_fire_at=later,
                state=state,
            )
        # written by hand: JSON, but no object
        await jobs_backend.sql("UPDATE jobs SET spec = '[1]' WHERE id IN ('b', 'p')")
        actors: list[SchedulerActor] = []

        def factory() -> SchedulerActor:
            actors.append(SchedulerActor(store, clock, publish=publish, load_page=1))
            return actors[-1]

        async with open_supervisor("root", escalate=False) as sup:
            ref = await sup.spawn(factory, name="scheduler")
            (scheduler,) = actors
            assert sorted(scheduler.entries) == ["a"]
            assert scheduler.metrics.value("turnstile_scheduler_bad_specs_total") == 1
            with pytest.raises(ConflictError, match=r"^job 'p' cannot fire again: its spec is"):
                await ref.ask(ResumeJob(job_id="p"))
            assert scheduler.metrics.value("turnstile_scheduler_bad_specs_total") == 2
            await sup.stop("scheduler")
