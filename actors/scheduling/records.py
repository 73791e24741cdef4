"""The scheduler's rows as the store hands them out: jobs, their runs, and what a fire wrote.

Immutable msgspec Structs; every time is an aware UTC ``datetime``, every JSON payload a
``dict``. The tables are scheduling's own (:mod:`~actors.scheduling.schema`), read and written
by its operations (:mod:`~actors.scheduling.queries`, :mod:`~actors.scheduling.fire`) through
:class:`~actors.scheduling.store.JobStore`.
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import msgspec

from turnstile.runtime.store import InboxItem, escape_json

__all__ = [
    "JOB_STATES",
    "RUN_STATES",
    "ActiveJob",
    "FireRequest",
    "FireResult",
    "Job",
    "JobRun",
]

#: Every state a job can be in.
JOB_STATES = ("active", "paused", "completed", "cancelled")
#: The run states the scheduler uses today; the store accepts any non-empty string.
RUN_STATES = ("queued", "turn_completed", "turn_failed", "missed", "coalesced")


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """A scheduled job.

    Attributes:
        id: caller-supplied id.
        session_id: the session its turns go to, or None for a session-less job.
        kind: what sort of schedule (``"cron"``, ``"once"``, ...); the store does not interpret it.
        spec: the schedule and the input to deliver, as the scheduler wrote it.
        state: one of :data:`JOB_STATES`.
        next_fire_at: the next occurrence, or None when there is none.
        created_at: when the job was created.
        updated_at: when the row last changed.
        run_count: how many times ``fire_job`` succeeded for it.
    """

    id: str
    session_id: str | None
    kind: str
    spec: dict[str, Any]
    state: str
    next_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    run_count: int


class ActiveJob(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An active job as the scheduler keeps it while it waits: what firing it needs, and not
    the rest of its row (a scheduler holds one per pending job, a million of them on a big
    node: ``docs/performance.md``, issue 26).

    The spec stays the JSON text the store holds (a string is one object, the decoded spec a
    dozen); the scheduler decodes it when the job fires. Session ids and kinds are interned,
    so the jobs of one session share one string. Not tracked by the garbage collector: it
    holds only strings, a datetime and an int.

    Attributes:
        id: the job's id.
        session_id: the session its turns go to, or None.
        kind: what sort of schedule.
        spec: the spec as the store keeps it (JSON text, escaped as
            :func:`~runtime.store.encode_json` writes it).
        next_fire_at: the next occurrence, or None when there is none.
        run_count: how many times ``fire_job`` succeeded for it.
    """

    id: str
    session_id: str | None
    kind: str
    spec: str
    next_fire_at: datetime | None
    run_count: int

    @classmethod
    def of(cls, job: Job, spec: str | None = None) -> ActiveJob:
        """``job`` (a whole row) as the scheduler keeps it.

        Args:
            job: the row.
            spec: its spec's stored text, if at hand; None: the row's spec encoded again.
        """
        return cls(
            id=job.id,
            session_id=_intern(job.session_id),
            kind=sys.intern(job.kind),
            spec=_spec_text(job.spec) if spec is None else spec,
            next_fire_at=job.next_fire_at,
            run_count=job.run_count,
        )


def _spec_text(spec: Any) -> str:
    # Any JSON value (a row written by hand may hold a list): ``decode_spec`` says what is wrong.
    return escape_json(msgspec.json.encode(spec))


def _intern(text: str | None) -> str | None:
    return None if text is None else sys.intern(text)


class JobRun(msgspec.Struct, frozen=True, kw_only=True):
    """One occurrence of a job.

    Attributes:
        id: integer assigned by the store.
        job_id: the job it belongs to.
        scheduled_for: the occurrence it stands for.
        state: e.g. one of :data:`RUN_STATES`.
        input_id: the inbox item it enqueued, or None.
        detail: free-form JSON object, or None.
        created_at: when it was recorded.
        updated_at: when its state last changed.
    """

    id: int
    job_id: str
    scheduled_for: datetime
    state: str
    input_id: int | None
    detail: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime


class FireRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One occurrence for ``fire_jobs`` to fire: the arguments of a ``fire_job`` that delivers
    a turn on time (an input, counted, no extra runs).

    Attributes:
        job_id: the job.
        expected_next_fire_at: the occurrence being fired, as read from the job.
        new_next_fire_at: the following occurrence, or None when there is none (the job
            completes).
        input: ``(source, payload)`` of the turn input to enqueue in the job's session inbox.
        detail: the run's detail, or None.
        run_state: the state of the new run.
    """

    job_id: str
    expected_next_fire_at: datetime
    new_next_fire_at: datetime | None
    input: tuple[str, dict[str, Any]]
    detail: dict[str, Any] | None = None
    run_state: str = "queued"


class FireResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a successful ``fire_job`` wrote: the advanced job, the run, and the input if any."""

    job: Job
    run: JobRun
    input: InboxItem | None
