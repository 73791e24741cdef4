"""A job's changes that callers ask for, on the store's side, and the events that say so.

``SchedulerActor`` (``actor``) owns the timers: it indexes a job when it is added, resumed or
moved, and drops its timer when it is cancelled or paused. What a change must hold in the
store is here: which jobs a caller may change (its session's, and only while pending), the
compare-and-sets that pause and resume a job (so a pause never lands on a job a fire just
completed, and two nodes never both resume one), where a resumed job goes on, and the
``job_update`` event each change publishes to the job's session. It is apart from the actor
so that the actor's module holds the wheel and the fire path, and these rules read alone.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from turnstile.actors.scheduling.cronexpr import CronSchedule
from turnstile.actors.scheduling.events import JobUpdate
from turnstile.actors.scheduling.firing import JobEntry
from turnstile.actors.scheduling.records import Job
from turnstile.actors.scheduling.spec import JobSpecError, Schedule, job_spec, next_occurrence
from turnstile.actors.scheduling.store import JobStore
from turnstile.runtime.errors import ConflictError, NotFound

__all__ = ["job_label", "job_update", "pause_job", "pending_job", "resume_job"]


async def pending_job(jobs: JobStore, job_id: str, session_id: str | None) -> Job:
    """The job ``job_id``, which a caller may pause or resume.

    Args:
        jobs: the jobs' store.
        job_id: the job.
        session_id: the caller's session: another session's job is answered as missing; None:
            any job (the node itself, or a re-read after a lost compare-and-set).

    Raises:
        NotFound: no such job (or not ``session_id``'s).
        ConflictError: the job is done (completed or cancelled): only a pending job changes.
    """
    job = await jobs.get_job(job_id)
    if session_id is not None and job.session_id != session_id:
        raise NotFound(f"no job with id {job_id!r}")
    if job.state not in ("active", "paused"):
        raise ConflictError(f"job {job.id!r} is {job.state}; only a pending job can change")
    return job


async def pause_job(jobs: JobStore, job: Job) -> Job | None:
    """Pause the active ``job`` by a compare-and-set on its state: a fire that completes the
    job first wins, and a fire that already read the job loses its own (``state = 'active'``)
    and re-reads it. ``next_fire_at`` stays, to show what was next.

    Returns:
        the paused job, or None when it was no longer active (the caller re-reads it).
    """
    return await jobs.transition_job(job.id, "active", "paused")


async def resume_job(
    jobs: JobStore, job: Job, schedule: Schedule, cron: CronSchedule | None, now: datetime
) -> Job | None:
    """Resume the paused ``job`` by a compare-and-set on its state. What fell due while it was
    paused is not run: a recurring job goes on from its next occurrence after ``now``, a
    one-off job whose time passed fires at ``now``.

    Args:
        jobs: the jobs' store.
        job: the job as read, paused.
        schedule, cron: its schedule, and the schedule's cron evaluator (None: not cron).
        now: the wall clock's now.

    Returns:
        the resumed job, or None when it was no longer paused (resumed or cancelled meanwhile,
        on another node: the caller re-reads it).
    """
    after = job.next_fire_at
    if after is None or after <= now:
        after = next_occurrence(schedule, now, cron) or now
    return await jobs.transition_job(job.id, "paused", "active", next_fire_at=after)


def job_update(job: Job, what: str, label: str, run_id: int | None = None) -> JobUpdate:
    """The ``job_update`` event saying ``what`` happened to ``job`` (``run_id``: a fire's)."""
    return JobUpdate(
        job_id=job.id,
        kind=job.kind,
        event=what,
        state=job.state,
        label=label,
        next_fire_at=job.next_fire_at.isoformat() if job.next_fire_at else None,
        run_count=job.run_count,
        run_id=msgspec.UNSET if run_id is None else run_id,
    )


def job_label(job: Job, entry: JobEntry | None) -> str:
    """The job's label for a ``job_update``: from its entry, else from its spec. A spec that
    does not decode gives ``""``: it must not stop the job from being cancelled."""
    if entry is not None:
        return entry.spec().label
    try:
        return job_spec(job).label
    except JobSpecError:
        return ""
