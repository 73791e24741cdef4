"""The scheduler's firing machinery: an indexed job, which of its occurrences are due and
what its misfire policy makes of them, what an occurrence delivers, the span a fire is traced
in, and the batches that fire the occurrences found due together (``SchedulerActor`` in
``actor`` drives them: it owns the wheel and the index of jobs, and decides when to fire)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import trio

from turnstile.actors.scheduling.cronexpr import CronSchedule
from turnstile.actors.scheduling.records import ActiveJob, FireRequest, FireResult, Job
from turnstile.actors.scheduling.spec import (
    JobSpec,
    Schedule,
    cron_of,
    decode_spec,
    in_active_hours,
    next_occurrence,
)
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.ids import public_id
from turnstile.runtime import tracing
from turnstile.runtime.errors import NotFound, StoreUnavailable
from turnstile.runtime.timerwheel import TimerHandle

__all__ = [
    "MAX_BATCH",
    "MAX_BATCHES_IN_FLIGHT",
    "MAX_RECORDED_MISSES",
    "DueOccurrences",
    "FireBatches",
    "JobEntry",
    "JobShare",
    "due_occurrences",
    "fires_here",
    "next_fire",
    "occurrence_content",
    "occurrence_input",
    "occurrence_jitter",
    "reread_job",
    "run_detail",
    "spread_overdue",
    "traced_fire",
]

log = logging.getLogger("turnstile.scheduler")

#: ``reread_job`` asks a store that does not answer again after this long at first, doubling
#: up to ``REREAD_MAX_DELAY`` seconds.
REREAD_FIRST_DELAY = 0.25
REREAD_MAX_DELAY = 5.0


async def reread_job(jobs: JobStore, job_id: str) -> Job | None:
    """The job ``job_id`` as stored now, or None when it is gone.

    A store that does not answer (``StoreUnavailable``: an outage, or on a loaded box a pool
    whose connections stayed busy past the operation's bound) is asked again, with backoff,
    until it does: raised, it would crash the scheduler, whose restart re-reads every job it
    holds (seen in a three-node test at load 8), where one job is all that is missing."""
    delay = REREAD_FIRST_DELAY
    while True:
        try:
            return await jobs.get_job(job_id)
        except NotFound:
            return None
        except StoreUnavailable:
            log.warning(
                "re-reading job %s: the store did not answer; again in %.2f s", job_id, delay
            )
            await trio.sleep(delay)
            delay = min(2 * delay, REREAD_MAX_DELAY)


#: At most this many occurrences are fired in one ``JobStore.fire_jobs`` (PostgreSQL, sequential
#: statements: 1 occurrence 0.8 ms, 50 in 6 ms, 200 in 29 ms, which is more per occurrence).
MAX_BATCH = 100
#: At most this many batches are in flight at once; the fires that come meanwhile wait and
#: make the next batch (so the busier the store, the fuller the batches). With 2, fires at a
#: steady 1,000/s queued behind them (the connections the store has work in parallel).
MAX_BATCHES_IN_FLIGHT = 8
#: At most this many missed occurrences are recorded one by one (the rest as a count).
MAX_RECORDED_MISSES = 100


def occurrence_content(job_id: str, spec: JobSpec) -> str:
    """What the session's turn is given when the job fires."""
    action = spec.action_type or "llm_prompt"
    prompt = spec.prompt
    head = f"job_id={job_id}" + (f" label={spec.label}" if spec.label else "")
    if action == "notification":
        return f"[SCHEDULED NOTIFICATION] {head}\n{prompt}"
    if action == "tool_call":
        return f"[SCHEDULED TOOL CALL] {head} tool={spec.tool_name}"
    if action == "heartbeat":
        return f"[HEARTBEAT] job_id={job_id}\n{prompt}"
    return prompt


def occurrence_input(
    job: ActiveJob, spec: JobSpec, occurrence: datetime
) -> tuple[str, dict[str, Any]]:
    """The inbox input an occurrence of ``job`` delivers: its source and its payload, which
    carries the current span's trace context (the fire's span, if any) to the turn."""
    payload = {
        **spec.deliver,
        "content": occurrence_content(job.id, spec),
        "job_id": job.id,
        "kind": job.kind,
        "label": spec.label,
        "scheduled_for": occurrence.isoformat(),
    }
    payload.pop("prompt", None)
    payload = tracing.carry(payload, tracing.current_trace())
    return spec.source or job.kind, payload


def run_detail(
    job: ActiveJob, spec: JobSpec, late: float, extra: list[tuple[datetime, str, Any]]
) -> dict[str, Any]:
    """The detail of the run record a delivered occurrence writes: the prompt, how ``late``
    (seconds) it fired, a recall's instruction, a cron prompt's template variables, and how
    many other occurrences it recorded with it (``extra``: coalesced or missed ones)."""
    detail: dict[str, Any] = {"prompt": spec.prompt, "late_seconds": round(late, 6)}
    if spec.instruction:  # a recall's self-instruction, for the run record
        detail["instruction"] = spec.instruction
    variables = spec.prompt_variables(job.id)
    if variables is not None:  # a cron prompt's template variables, for the run record
        detail["prompt_variables"] = variables
    if extra:
        detail["coalesced" if extra[0][1] == "coalesced" else "missed"] = len(extra)
    return detail


def occurrence_jitter(job_id: str, occurrence: datetime, seconds: float) -> float:
    """A stable pseudo-random delay in [0, ``seconds``) for the job's occurrence."""
    if seconds <= 0:
        return 0.0
    digest = hashlib.blake2b(f"{job_id}@{occurrence.isoformat()}".encode(), digest_size=8)
    return seconds * int.from_bytes(digest.digest(), "big") / 2**64


class JobEntry:
    """An indexed job: what firing needs of its row (:class:`ActiveJob`: the spec as the
    stored JSON text, decoded when the job fires), its spec's jitter, its cron evaluator once
    built, its timer.

    A scheduler holds one per pending job, so it holds no decoded spec: a waiting job is a few
    objects, none of them tracked by the garbage collector but this one and its timer.
    """

    __slots__ = ("job", "jitter", "_cron", "handle")

    def __init__(self, job: ActiveJob, jitter: float = 0.0) -> None:
        self.job = job
        # ``or 0.0``: the constant, shared, for the jobs without jitter (nearly all).
        self.jitter = jitter or 0.0
        self._cron: CronSchedule | None = None
        self.handle: TimerHandle | None = None

    @classmethod
    def of(cls, job: ActiveJob) -> JobEntry:
        """An entry for ``job``, whose spec must decode.

        Raises:
            JobSpecError: it does not.
        """
        return cls(job, decode_spec(job.id, job.spec).jitter_seconds)

    def due_at(self) -> datetime:
        """When the job's timer is due: its next occurrence, delayed by its jitter."""
        at = next_fire(self.job)
        if not self.jitter:
            return at
        return at + timedelta(seconds=occurrence_jitter(self.job.id, at, self.jitter))

    def spec(self) -> JobSpec:
        """The job's spec, decoded from its text at each call (a fire, about as long as the
        text: microseconds). It decoded when the entry was made, so it does again."""
        return decode_spec(self.job.id, self.job.spec)

    def cron(self, schedule: Schedule) -> CronSchedule | None:
        """The job's own cron evaluator (``schedule`` is its spec's), built at its first fire:
        a reload takes the next fire time from the store and need not parse 100k expressions
        up front."""
        if self._cron is None and schedule.type == "cron":
            self._cron = cron_of(schedule)
        return self._cron


def next_fire(job: ActiveJob) -> datetime:
    """When an indexed job is next due: every active job has a next fire time (the store
    completes a job whose schedule has none left)."""
    if job.next_fire_at is None:
        raise RuntimeError(f"job {job.id!r} is indexed without a next fire time")
    return job.next_fire_at


def spread_overdue(
    overdue: list[tuple[Any, str]], now: datetime, rate: float
) -> list[tuple[str, datetime]]:
    """When to fire the jobs a scheduler found overdue at start: ``rate`` per second from
    ``now``, so a long downtime does not fire everything at once, the oldest job first.

    Args:
        overdue: ``(created_at, id)`` per job (``created_at`` as the store orders it).
        now: the wall clock's now.
        rate: jobs per second.

    Returns:
        ``(id, when)`` per job, in that order.
    """
    overdue.sort()
    return [(job_id, now + timedelta(seconds=i / rate)) for i, (_, job_id) in enumerate(overdue)]


@dataclass(frozen=True, slots=True)
class DueOccurrences:
    """What a job's fire at some moment has to do (:func:`due_occurrences`).

    Attributes:
        due: every occurrence due by then, oldest first (the first is the one the job's row
            expects; at most ``MAX_RECORDED_MISSES`` more).
        following: the job's next occurrence after them (None: it has none left).
        policy: ``on_time``, or what is done with a misfire (``coalesce``, ``skip``,
            ``catch_up``: the spec's ``misfire``), or ``outside_active_hours`` (no turn runs).
    """

    due: list[datetime]
    following: datetime | None
    policy: str


def due_occurrences(entry: JobEntry, spec: JobSpec, now: datetime) -> DueOccurrences:
    """Which of ``entry``'s occurrences are due at ``now`` and what its policy (in ``spec``,
    the entry's spec) makes of them.

    An occurrence is a misfire when it is more than the spec's ``misfire_grace_seconds`` late,
    or when several are due (the scheduler was down); a job with ``active_hours`` runs no turn
    outside them, whatever else holds. Pure: the wall clock is ``now``.
    """
    schedule = spec.schedule
    expected = next_fire(entry.job)
    # Every occurrence due by now, oldest first (bounded: a long downtime of a frequent job).
    due = [expected]
    cron = entry.cron(schedule)
    following = next_occurrence(schedule, expected, cron)
    while following is not None and following <= now and len(due) <= MAX_RECORDED_MISSES:
        due.append(following)
        following = next_occurrence(schedule, following, cron)
    if following is not None and following <= now:  # beyond what we record one by one
        following = next_occurrence(schedule, now, cron)
    misfired = now - expected > timedelta(seconds=spec.misfire_grace_seconds) or len(due) > 1
    policy: str = spec.misfire if misfired else "on_time"
    window = spec.active_hours
    if window and not in_active_hours(window, now):
        policy = "outside_active_hours"  # no turn runs; the occurrence is recorded
    return DueOccurrences(due, following, policy)


async def traced_fire(
    job: ActiveJob,
    occurrence: datetime,
    now: datetime,
    deliver: Callable[[], Awaitable[FireResult | None]],
) -> FireResult | None:
    """``deliver()`` the ``occurrence`` of ``job``, in a span ``fire <kind>`` of its own when
    the node traces (a producer span with no parent: a fire starts its own trace).

    ``deliver`` stores the current span with the inbox input it makes, so the turn that runs
    it is the span's child, whichever node runs it.

    Returns:
        what ``deliver`` returned: the fire's result, or None when it did not fire (another
        scheduler fired the occurrence first).
    """
    if not tracing.active():
        return await deliver()
    attributes = {
        "turnstile.job.id": job.id,
        "turnstile.job.kind": job.kind,
        "turnstile.session.id": public_id(job.session_id or ""),
        "turnstile.job.scheduled_for": occurrence.isoformat(),
        "turnstile.job.late_seconds": (now - occurrence).total_seconds(),
    }
    with tracing.span(f"fire {job.kind}", kind="producer", attributes=attributes) as span:
        result = await deliver()
        span.set("turnstile.job.fired", result is not None)
        if result is not None:
            span.set("turnstile.job.run_id", result.run.id)
            if result.input is not None:
                span.set("turnstile.input.id", result.input.id)
        return result


class _Waiting:
    """One occurrence waiting in :class:`FireBatches` for its batch's answer."""

    __slots__ = ("request", "done", "result")

    def __init__(self, request: FireRequest) -> None:
        self.request = request
        self.done = trio.Event()
        self.result: FireResult | None = None


class FireBatches:
    """Fires the occurrences that come together with one ``JobStore.fire_jobs`` per batch.

    The first occurrence to come starts a sender task, which takes what has come by the time it
    runs: every fire started in the same pass of trio's run loop as that first one (the wheel
    starts all those due at one instant together). A sender sends batch after batch while
    occurrences wait; a second one starts when a batch leaves some behind, or when one comes
    while every sender is sending, up to ``MAX_BATCHES_IN_FLIGHT``; what comes while that many
    are in flight waits for the next batch. A batch that fails (the store raised) answers None
    for each of its occurrences, like one that did not fire them: they are then fired alone.
    """

    def __init__(self, store: JobStore, nursery: trio.Nursery) -> None:
        self._store = store
        self._nursery = nursery
        self._queue: list[_Waiting] = []
        self._senders = 0  # sender tasks started and not ended
        self._starting = False  # one of them has not yet taken its first batch

    async def fire(self, request: FireRequest) -> FireResult | None:
        """Fire ``request`` in the next batch: what ``fire_jobs`` answered for it."""
        waiting = _Waiting(request)
        self._queue.append(waiting)
        self._start_sender()
        await waiting.done.wait()
        return waiting.result

    def _start_sender(self) -> None:
        if not self._starting and self._senders < MAX_BATCHES_IN_FLIGHT:
            self._starting = True
            self._senders += 1
            self._nursery.start_soon(self._send, name="scheduler: fire batches")

    async def _send(self) -> None:
        self._starting = False
        try:
            while self._queue:
                batch = self._queue[:MAX_BATCH]
                del self._queue[:MAX_BATCH]
                if self._queue:
                    self._start_sender()
                results: list[FireResult | None] = [None] * len(batch)
                try:
                    results = await self._store.fire_jobs([waiting.request for waiting in batch])
                except Exception:
                    log.warning(
                        "firing %d occurrences at once failed; firing them one by one",
                        len(batch),
                        exc_info=True,
                    )
                finally:
                    for waiting, result in zip(batch, results, strict=True):
                        waiting.result = result
                        waiting.done.set()
        finally:
            self._senders -= 1


def fires_here(share: JobShare | None, job: Job | ActiveJob, now: datetime) -> bool:
    """Whether this node fires ``job`` now: always on one node (``share`` None); with
    several, the jobs its share gives it, and any occurrence overdue by more than a lease (an
    orphan)."""
    if share is None or share.owns(job.id):
        return True
    due = job.next_fire_at
    return due is not None and due <= now - timedelta(seconds=share.lease_seconds)


class JobShare(Protocol):
    """Several nodes on one store: which jobs this node fires (``runtime.membership``'s
    ``Membership``). Each job is fired by one live node, chosen by the job's id; a job whose
    occurrence is overdue by more than a lease (its node died, or had not seen the job) is
    fired by whichever node finds it first. The fire's compare-and-set keeps every occurrence
    single either way."""

    lease_seconds: float

    @property
    def interval(self) -> float:
        """How often to look for jobs to take on (a third of the lease)."""
        ...

    def owns(self, key: str) -> bool:
        """Whether this node fires the job ``key``."""
        ...
