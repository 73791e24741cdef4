"""The rows the store hands out, as immutable msgspec Structs.

Every time is an aware UTC ``datetime``; every JSON payload is a ``dict``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

__all__ = [
    "INPUT_STATES",
    "FINAL_INPUT_STATES",
    "JOB_STATES",
    "RUN_STATES",
    "Session",
    "InboxItem",
    "Enqueued",
    "EventRecord",
    "Job",
    "JobRun",
    "FireResult",
    "MigrationRecord",
]

#: Every state an inbox item can be in: ``queued -> running -> done | failed | interrupted``;
#: recovery may move an ``interrupted`` one back to ``queued`` to run its turn again.
INPUT_STATES = ("queued", "running", "done", "failed", "interrupted")
#: The states ``finish_input`` may move a running input to.
FINAL_INPUT_STATES = ("done", "failed", "interrupted")
#: Every state a job can be in.
JOB_STATES = ("active", "paused", "completed", "cancelled")
#: The run states the scheduler uses today; the store accepts any non-empty string.
RUN_STATES = ("queued", "turn_completed", "turn_failed", "missed", "coalesced")


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """One agent session.

    Attributes:
        id: caller-supplied id.
        owner: the user the session belongs to.
        metadata: free-form JSON object.
        policy: what to do with input that arrives mid-turn (default ``"enqueue"``).
        created_at: when the session was created.
        updated_at: when the row last changed (including appends to its event log).
        last_seq: seq of the last event appended, 0 when the log is empty.
    """

    id: str
    owner: str
    metadata: dict[str, Any]
    policy: str
    created_at: datetime
    updated_at: datetime
    last_seq: int


class InboxItem(msgspec.Struct, frozen=True, kw_only=True):
    """One durable turn input in a session's inbox.

    Attributes:
        id: monotonic integer assigned by the store.
        session_id: the session it belongs to.
        source: where it came from (``"user"``, ``"cron"``, ...).
        payload: the input itself.
        state: one of :data:`INPUT_STATES`.
        created_at: when it was enqueued.
        updated_at: when its state last changed.
        detail: what ``finish_input`` recorded (an error, a summary), or None.
        idempotency_key: the key it was enqueued under (``enqueue_keyed``), unique in its
            session, or None.
    """

    id: int
    session_id: str
    source: str
    payload: dict[str, Any]
    state: str
    created_at: datetime
    updated_at: datetime
    detail: dict[str, Any] | None = None
    idempotency_key: str | None = None


class Enqueued(msgspec.Struct, frozen=True, kw_only=True):
    """What ``enqueue_keyed`` answers: the input stored under the key, and whether this call
    stored it (False: an earlier call with the same key did, and nothing was written)."""

    item: InboxItem
    created: bool


class EventRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a session's event log; ``seq`` is gap-free per session, from 1."""

    session_id: str
    seq: int
    type: str
    payload: dict[str, Any]
    ts: datetime


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


class FireResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a successful ``fire_job`` wrote: the advanced job, the run, and the input if any."""

    job: Job
    run: JobRun
    input: InboxItem | None


class MigrationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``schema_migrations``: step ``version`` of the migration set ``set_name``."""

    version: int
    name: str
    applied_at: datetime
    set_name: str = "kernel"
