"""The scheduler: the one owner of time.

Every job lives in the store; the scheduler keeps an in-memory ``TimerWheel`` of when each
active job is due, rebuilt from the store at start. Spawned ``held`` (as the node does, in its
features' ``start``), it fires nothing until told :class:`Begin` (in their ``open``, once the
sessions can run what it fires). One task sleeps until the wheel's next deadline — no polling
ticker, so firing is as precise as trio's clock — and fires what is due.

Firing an occurrence is one store transaction (``JobStore.fire_job``): compare-and-set the job's
expected ``next_fire_at``, advance it (or complete the job), write the run record and insert
the turn input into the session's inbox. So an occurrence is enqueued exactly once — after a
crash, and with several schedulers on one PostgreSQL. The run record then follows the real
turn: the session marks it ``turn_completed`` or ``turn_failed``.

The occurrences the wheel finds due at the same moment (a burst, or a node so busy that its
loop wakes late) that deliver on time (or coalesced without a run of their own for what they
missed) are fired in batches (``JobStore.fire_jobs``: one statement on PostgreSQL for up to
``MAX_BATCH`` of them): a burst of hundreds due in the same second costs a few statements, not
hundreds. One found due alone is fired on its own, without the batch's hand-offs. Each
compare-and-set is still the job's own; one the batch did not fire (lost, gone, no session) is
fired on its own, whose answer says why. Everything after the fire (the session told, metrics,
the next occurrence) is per job, as for a fire of its own.

Misfires (the scheduler was down, or the job is due far in the past):

* ``coalesce`` (default) — deliver once, late; the other missed occurrences are recorded as
  ``coalesced`` runs.
* ``skip`` — deliver nothing; every missed occurrence is recorded as a ``missed`` run.
* ``catch_up`` — deliver every missed occurrence, up to ``MAX_CATCH_UP``; the rest are ``missed``.

A job with ``active_hours`` in its spec (heartbeats) runs no turn outside that window: the
occurrence is recorded as ``outside_active_hours`` and the job moves on.

A job's spec is a ``JobSpec`` (``actors.scheduling.spec``), checked when the job is indexed;
a job whose stored spec does not decode is logged and left alone, not fired, so one damaged
row cannot stop the others. The index keeps each job slim (``records.ActiveJob``: the spec as
its stored text, decoded again at each fire), and the load at start reads the active jobs a
page at a time (``load_page``), by id.

An occurrence is a misfire when it is more than ``misfire_grace_seconds`` (default 60) late.
Overdue jobs found at start-up are spread over time (``restart_rate`` per second) so 10,000 of
them do not stampede the sessions. ``max_runs`` completes a job after that many deliveries;
``jitter_seconds`` delays each occurrence by a stable pseudo-random amount.

The messages are in ``messages``; the firing machinery (indexed jobs, which occurrences are due
and what the misfire policy makes of them, the fire's span, batches) in ``firing``; the store's
side of a change a caller asks (who may change a job, the compare-and-sets of pause and resume,
the ``job_update`` events) in ``changes``. This module is over 400 lines because the wheel and
the fire path share the index of jobs and are read together.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import msgspec
import trio

from turnstile.actors.scheduling.changes import (
    job_label,
    job_update,
    pause_job,
    pending_job,
    resume_job,
)
from turnstile.actors.scheduling.firing import (
    FireBatches,
    JobEntry,
    JobShare,
    due_occurrences,
    fires_here,
    occurrence_input,
    reread_job,
    run_detail,
    spread_overdue,
    traced_fire,
)
from turnstile.actors.scheduling.messages import (
    MISFIRE_POLICIES,
    AddJob,
    Begin,
    CancelJob,
    PauseJob,
    RescheduleJob,
    ResumeJob,
    SchedulerLimits,
    validate_spec,
)
from turnstile.actors.scheduling.records import ActiveJob, FireRequest, FireResult, Job, JobRun
from turnstile.actors.scheduling.spec import (
    JobSpec,
    JobSpecError,
    Schedule,
    cron_of,
    first_occurrence,
    in_active_hours,
    next_occurrence,
)
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.actor import Delivered, Publish
from turnstile.actors.sessions.event_types import SessionEvent
from turnstile.runtime.actor import Actor
from turnstile.runtime.clock import Clock, utc
from turnstile.runtime.errors import ConflictError, InvalidArgument, NotFound, StoreError
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.store import Store
from turnstile.runtime.timerwheel import TimerWheel

__all__ = [
    "MISFIRE_POLICIES",
    "Schedule",
    "SchedulerActor",
    "SchedulerLimits",
    "JobShare",
    "AddJob",
    "Begin",
    "CancelJob",
    "PauseJob",
    "RescheduleJob",
    "ResumeJob",
    "next_occurrence",
    "in_active_hours",
]

log = logging.getLogger("turnstile.scheduler")

#: At most this many missed occurrences are delivered by ``catch_up``.
MAX_CATCH_UP = 10
#: How many fires may be in flight at once (so group commit and batches gather them).
MAX_CONCURRENT_FIRES = 1024
#: How many of them may be fires of their own (``JobStore.fire_job``: extra runs, skips, what a
#: batch did not fire) at once: each is a statement or a transaction of its own.
MAX_SOLO_FIRES = 64
#: jobs read per page of the load at start (10,000 jobs are about 2.5 MB of rows in flight)
LOAD_PAGE = 10_000
#: jobs read per look for jobs to take on (several nodes): every node reads the due ones of
#: all nodes, oldest first, so a backlog of others' jobs must not hide its own
_TAKE_ON_PAGE = 10_000


class SchedulerActor(Actor):
    """Owns every active job's timer. See the module docstring.

    Args:
        store: where jobs and runs live.
        clock: wall time for schedules; trio's clock for the wheel.
        publish: ``async (session_id, message)`` → tell the session actor (``Delivered`` after a
            fire, ``Publish`` for other job updates).
        limits: scheduling limits.
        metrics: lateness and fire counts.
        fired_events: ``(job, run) -> [event, …]``: events a feature adds to the
            session's log when one of its jobs delivers a turn (recalls: ``recall_update``);
            the scheduler itself knows no job kind.
        share: several nodes: which jobs this node fires (:class:`JobShare`); None: all.
        held: load the jobs at start but fire none until told :class:`Begin` (a node spawns
            it so in its features' ``start`` and begins it in their ``open``, once the sessions
            can run what it fires); False: fire from the start (a restarted incarnation of a
            scheduler that had begun; tests).
        jobs: the jobs' and runs' operations (:class:`~actors.scheduling.store.JobStore`);
            None: over ``store`` (a test passes its own to count or refuse fires).
        load_page: how many jobs each read of the start's load takes (``LOAD_PAGE``).
    """

    uses_nursery = True

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        publish,
        limits: SchedulerLimits | None = None,
        metrics: Metrics | None = None,
        fired_events: Callable[[Job, JobRun], list[SessionEvent]] | None = None,
        share: JobShare | None = None,
        held: bool = False,
        jobs: JobStore | None = None,
        load_page: int = LOAD_PAGE,
    ) -> None:
        self.load_page = load_page
        self.share = share
        self.held = held
        self._begun = False
        self.store = store
        self.jobs = jobs if jobs is not None else JobStore(store)
        self.fired_events = fired_events
        self.clock = clock
        self.publish = publish
        self.limits = limits or SchedulerLimits()
        self.metrics = metrics = metrics or Metrics()
        metrics.counter("turnstile_scheduler_fires_total", "Occurrences fired (inbox rows).")
        metrics.counter("turnstile_scheduler_fire_errors_total", "Fires that failed.")
        metrics.counter("turnstile_scheduler_bad_specs_total", "Jobs whose spec did not decode.")
        metrics.histogram(
            "turnstile_scheduler_lateness_seconds",
            "Fire lateness: an occurrence's due time to its inbox row's commit, by job kind.",
            ("kind",),
        )
        self.wheel = TimerWheel(now=trio.current_time())
        self.entries: dict[str, JobEntry] = {}
        self._wake = trio.Event()
        self._fires = trio.CapacityLimiter(MAX_CONCURRENT_FIRES)
        self._solo_fires = trio.CapacityLimiter(MAX_SOLO_FIRES)
        self._batches: FireBatches | None = None  # on start (it needs the actor's nursery)
        #: Recent lateness samples in seconds, due → inbox commit (for the bench).
        self.lateness: deque[float] = deque(maxlen=100_000)

    # -- lifecycle --

    async def on_start(self) -> None:
        # Page by page (keyset by id), each row straight into the slim record an entry keeps.
        overdue: list[tuple[Any, str]] = []  # (created_at, id) of the jobs due already
        after: str | None = ""
        while after is not None:
            page = await self.jobs.active_jobs(after, limit=self.load_page)
            after = page[-1][0].id if len(page) == self.load_page else None
            clocks = (self.clock.monotonic(), now := self.clock.now())
            for job, created_at in page:
                entry = self._entry(job) if fires_here(self.share, job, now) else None
                if entry is None:
                    continue
                self.entries[job.id] = entry
                at = entry.due_at()
                if at <= now:
                    overdue.append((created_at, job.id))
                else:
                    self._index(entry, at, clocks)
        for job_id, at in spread_overdue(overdue, self.clock.now(), self.limits.restart_rate):
            self._index(self.entries[job_id], at)
        log.info("scheduler loaded %d active jobs (%d overdue)", len(self.entries), len(overdue))
        self._batches = FireBatches(self.jobs, self._tasks)
        if not self.held:
            self._begin()

    def _begin(self) -> None:
        """Start the wheel (and the look for jobs to take on): from now on, what is due fires.
        Jobs added, cancelled or moved before it are in the wheel already."""
        if self._begun:
            return
        self._begun = True
        self._tasks.start_soon(self._run, name="scheduler wheel")
        if self.share is not None:
            self._tasks.start_soon(self._take_on, name="scheduler: jobs to take on")

    async def _take_on(self) -> None:
        """Several nodes: every share interval, index the jobs due within two intervals that are
        this node's (made elsewhere, or moved here) and the orphans; the wheel drops the rest."""
        share = self.share
        assert share is not None
        while True:
            await trio.sleep(share.interval)
            now = self.clock.now()
            horizon = now + timedelta(seconds=2 * share.interval)
            orphaned = now - timedelta(seconds=share.lease_seconds)  # wanted: as fires_here

            def wanted(job_id: str, due: datetime | None, orphaned: datetime = orphaned) -> bool:
                return job_id not in self.entries and (
                    share.owns(job_id) or (due is not None and due <= orphaned)
                )

            try:
                due = await self.jobs.due_jobs_wanted(horizon, wanted, limit=_TAKE_ON_PAGE)
            except StoreError as exc:
                log.warning("looking for jobs to take on failed: %s", exc)
                continue
            for job in due:  # (one may have been indexed while the query ran)
                entry = None if job.id in self.entries else self._entry(job)
                if entry is not None:
                    self.entries[job.id] = entry
                    self._index(entry, entry.due_at())

    async def receive(self, message: Any) -> Any:
        match message:
            case AddJob():
                return await self._add(message)
            case CancelJob():
                return await self._cancel(message)
            case RescheduleJob():
                return await self._reschedule(message)
            case PauseJob():
                return await self._pause(message)
            case ResumeJob():
                return await self._resume(message)
            case Begin():
                return self._begin()
        raise InvalidArgument(f"scheduler cannot handle {type(message).__name__}")

    # -- adding and cancelling --

    async def _add(self, msg: AddJob) -> Job:
        spec = msg.spec()
        validate_spec(spec, self.limits, self.clock.now())
        now = self.clock.now()
        schedule = spec.schedule
        entry_cron = cron_of(schedule) if schedule.type == "cron" else None
        first = now if msg.immediate else first_occurrence(schedule, now, entry_cron)
        if schedule.type == "once" and first <= now and not msg.immediate:
            raise InvalidArgument(
                f"{first.isoformat()} is in the past (now is {now.isoformat()})", field="when"
            )
        job = await self.jobs.create_job(
            msg.job_id or uuid.uuid4().hex[:12],
            kind=msg.kind,
            spec=msgspec.to_builtins(spec),
            session_id=msg.session_id,
            next_fire_at=first,
            # counted and taken in the insert's transaction: no other node's add between
            max_per_session=self.limits.max_jobs_per_session,
        )
        entry = JobEntry(ActiveJob.of(job), spec.jitter_seconds)
        self.entries[job.id] = entry
        self._index(entry, entry.due_at())
        await self._job_update(job, "scheduled", spec.label)
        return job

    async def _cancel(self, msg: CancelJob) -> Job:
        job = await self.jobs.get_job(msg.job_id)
        if msg.session_id is not None and job.session_id != msg.session_id:
            raise NotFound(f"no job with id {msg.job_id!r}")
        if job.state in ("active", "paused"):
            job = await self.jobs.update_job(job.id, state="cancelled", next_fire_at=None)
            await self._job_update(job, "cancelled", job_label(job, self.entries.get(job.id)))
        entry = self.entries.pop(job.id, None)
        if entry is not None and entry.handle is not None:
            self.wheel.cancel(entry.handle)
        return job

    async def _reschedule(self, msg: RescheduleJob) -> Job:
        job = await self.jobs.get_job(msg.job_id)
        if msg.session_id is not None and job.session_id != msg.session_id:
            raise NotFound(f"no job with id {msg.job_id!r}")
        if job.state != "active":
            raise InvalidArgument(f"job {job.id!r} is {job.state}, not active", field="job_id")
        entry = self.entries.get(job.id) or JobEntry.of(ActiveJob.of(job))  # JobSpecError
        job = await self.jobs.update_job(job.id, next_fire_at=utc(msg.next_fire_at))
        entry.job = ActiveJob.of(job, entry.job.spec)
        self.entries[job.id] = entry
        self._index(entry, entry.due_at())
        await self._job_update(job, "rescheduled", entry.spec().label)
        return job

    async def _pause(self, msg: PauseJob) -> Job:
        job = await pending_job(self.jobs, msg.job_id, msg.session_id)
        if job.state == "active":
            moved = await pause_job(self.jobs, job)
            if moved is None:  # changed meanwhile: as it is now (completed: ConflictError)
                return await pending_job(self.jobs, job.id, None)
            job = moved
            await self._job_update(job, "paused", job_label(job, self.entries.get(job.id)))
        entry = self.entries.pop(job.id, None)
        if entry is not None and entry.handle is not None:
            self.wheel.cancel(entry.handle)
        return job

    async def _resume(self, msg: ResumeJob) -> Job:
        job = await pending_job(self.jobs, msg.job_id, msg.session_id)
        if job.state == "active":
            return job
        entry = self._entry(job)
        if entry is None:
            raise ConflictError(f"job {job.id!r} cannot fire again: its spec is unreadable")
        now = self.clock.now()
        schedule = (spec := entry.spec()).schedule
        moved = await resume_job(self.jobs, job, schedule, entry.cron(schedule), now)
        if moved is None:  # resumed or cancelled meanwhile (another node): as it is now
            return await pending_job(self.jobs, job.id, None)
        job = moved
        entry.job = ActiveJob.of(job, entry.job.spec)
        self.entries[job.id] = entry
        self._index(entry, entry.due_at())
        await self._job_update(job, "resumed", spec.label)
        return job

    # -- the wheel --

    @property
    def _tasks(self) -> trio.Nursery:
        """The actor's nursery, for its own tasks (there once it started)."""
        if self.nursery is None:
            raise RuntimeError("the scheduler has not started")
        return self.nursery

    def _index(
        self, entry: JobEntry, at: datetime, clocks: tuple[float, datetime] | None = None
    ) -> None:
        """Set ``entry``'s timer for ``at``; ``clocks``: ``(monotonic, now)`` read together just
        before (a load's page: one reading of both clocks for thousands of jobs)."""
        if entry.handle is not None:
            self.wheel.cancel(entry.handle)
        if clocks is None:
            clocks = (self.clock.monotonic(), self.clock.now())
        deadline = max(self.wheel.now, clocks[0] + (at - clocks[1]).total_seconds())
        entry.handle = self.wheel.schedule(deadline, entry.job.id)
        if not self._wake.is_set():
            self._wake.set()

    async def _run(self) -> None:
        async with trio.open_nursery() as fires:
            while True:
                deadline = self.wheel.next_deadline()
                with trio.move_on_at(math.inf if deadline is None else deadline):
                    await self._wake.wait()
                self._wake = trio.Event()
                ready = []
                for job_id in self.wheel.advance(trio.current_time()):
                    entry = self.entries.get(job_id)
                    if entry is not None and not fires_here(
                        self.share, entry.job, self.clock.now()
                    ):
                        del self.entries[job_id]  # another node fires it
                        entry = None
                    if entry is not None:
                        entry.handle = None
                        ready.append(entry)
                # Several due at once (a burst, or the loop woke late because the node is
                # busy): in batches. One alone: its own statement, without the batch's hops.
                together = len(ready) > 1
                for entry in ready:
                    job_id = entry.job.id
                    # Without a checkpoint while a slot is free: every fire due now starts
                    # in the same batch of the run loop (an awaited acquire yields, so the
                    # n-th of a burst started n batches late, each up to milliseconds when
                    # a thousand sessions are busy).
                    try:
                        self._fires.acquire_on_behalf_of_nowait(job_id)
                    except trio.WouldBlock:
                        await self._fires.acquire_on_behalf_of(job_id)
                    fires.start_soon(self._fire_guarded, entry, together, name=f"fire {job_id}")

    async def _fire_guarded(self, entry: JobEntry, together: bool = False) -> None:
        try:
            await self._fire(entry, together)
        except NotFound:  # the job (or its session) was deleted: forget its timer
            self.entries.pop(entry.job.id, None)
        except Exception:
            log.exception("firing job %s failed; it will be retried", entry.job.id)
            self.metrics.inc("turnstile_scheduler_fire_errors_total")
            if self.entries.get(entry.job.id) is entry and entry.handle is None:
                self._index(entry, self.clock.now() + timedelta(seconds=5))
        finally:
            self._fires.release_on_behalf_of(entry.job.id)

    async def _fire(self, entry: JobEntry, together: bool = False) -> None:
        """Fire ``entry``'s due occurrences; ``together``: with others due at the same moment
        (what can go in a batch does)."""
        job = entry.job
        spec = entry.spec()
        now = self.clock.now()
        plan = due_occurrences(entry, spec, now)
        due, following, policy = plan.due, plan.following, plan.policy
        expected = due[0]

        if policy == "catch_up":
            deliver, rest = due[:MAX_CATCH_UP], due[MAX_CATCH_UP:]
            result = None
            for i, occurrence in enumerate(deliver):
                last = i == len(deliver) - 1
                new_next = following if last else deliver[i + 1]
                extra = [(o, "missed", None) for o in rest] if last else []
                result = await self._fire_one(job, spec, occurrence, new_next, now, extra, together)
                if result is None:
                    return self._forget_or_reload(job.id)
                if result.job.state != "active":
                    break
                job = ActiveJob.of(result.job, job.spec)
        elif policy in ("skip", "outside_active_hours"):
            state = "missed" if policy == "skip" else "outside_active_hours"
            result = await self._fire_alone(
                job.id,
                expected,
                following,
                run_state=state,
                counts=False,
                detail={"late_seconds": (now - expected).total_seconds()},
                extra_runs=[(o, state, None) for o in due[1:]],
            )
            if result is None:
                return self._forget_or_reload(job.id)
            await self._job_update(result.job, state, spec.label)
        else:  # on time, or coalesce: deliver once
            extra = [(o, "coalesced", None) for o in due[1:]]
            result = await self._fire_one(job, spec, expected, following, now, extra, together)
            if result is None:
                return self._forget_or_reload(job.id)
        if result is None:  # catch_up with nothing to deliver (never: ``due`` has one at least)
            return None
        fired = result.job
        if fired.state == "active" and fired.next_fire_at is not None:
            entry.job = ActiveJob.of(fired, entry.job.spec)
            self._index(entry, entry.due_at())
        else:
            self.entries.pop(fired.id, None)

    async def _fire_one(
        self, job: ActiveJob, spec: JobSpec, occurrence, new_next, now, extra, together=False
    ):
        """Deliver one occurrence: CAS, run record and inbox input in one transaction (in a
        batch when it records no other run); traced as ``fire <kind>`` (``firing.traced_fire``),
        the span stored with the inbox input."""
        return await traced_fire(
            job,
            occurrence,
            now,
            lambda: self._deliver(job, spec, occurrence, new_next, now, extra, together),
        )

    async def _deliver(
        self, job: ActiveJob, spec: JobSpec, occurrence, new_next, now, extra, together
    ):
        """``_fire_one``'s work (the span current, if any, goes with the input)."""
        if spec.max_runs and job.run_count + 1 >= spec.max_runs:
            new_next = None  # this is the last delivery
        turn_input = occurrence_input(job, spec, occurrence)
        detail = run_detail(job, spec, (now - occurrence).total_seconds(), extra)
        result = None
        if together and not extra and self._batches is not None:
            result = await self._batches.fire(
                FireRequest(
                    job_id=job.id,
                    expected_next_fire_at=occurrence,
                    new_next_fire_at=new_next,
                    input=turn_input,
                    detail=detail,
                )
            )
        if result is None:  # extra runs, or the batch did not fire it: alone, which says why
            result = await self._fire_alone(
                job.id,
                occurrence,
                new_next,
                run_state="queued",
                input=turn_input,
                detail=detail,
                extra_runs=extra,
            )
        if result is not None:
            committed = (self.clock.now() - occurrence).total_seconds()
            self.metrics.inc("turnstile_scheduler_fires_total")
            self.metrics.observe("turnstile_scheduler_lateness_seconds", committed, kind=job.kind)
            self.lateness.append(committed)
            update = job_update(result.job, "fired", spec.label, run_id=result.run.id)
            events = [] if self.fired_events is None else self.fired_events(result.job, result.run)
            if job.session_id is None or result.input is None:  # a fire always delivers one
                raise RuntimeError(f"job {job.id!r} fired without a session input")
            await self._tell(
                job.session_id,
                Delivered(
                    input_id=result.input.id,
                    source=result.input.source,
                    job_update=update,
                    events=events,
                ),
            )
        return result

    async def _fire_alone(self, *args: Any, **kwargs: Any) -> FireResult | None:
        """``JobStore.fire_job``, at most ``MAX_SOLO_FIRES`` at once."""
        async with self._solo_fires:
            return await self.jobs.fire_job(*args, **kwargs)

    def _forget_or_reload(self, job_id: str) -> None:
        """The compare-and-set lost: someone else fired or changed the job; re-read it later."""
        self.entries.pop(job_id, None)
        self._tasks.start_soon(self._reload, job_id, name=f"reload {job_id}")

    async def _reload(self, job_id: str) -> None:
        job = await reread_job(self.jobs, job_id)  # (a store that does not answer: again)
        if job is None:
            return
        if job.state == "active" and job.next_fire_at is not None and job_id not in self.entries:
            entry = self._entry(job)
            if entry is not None:
                self.entries[job_id] = entry
                self._index(entry, entry.due_at())

    def _entry(self, job: Job | ActiveJob) -> JobEntry | None:
        """An entry for a stored job, or None (logged) when its spec does not decode."""
        try:
            return JobEntry.of(job if isinstance(job, ActiveJob) else ActiveJob.of(job))
        except JobSpecError as exc:
            log.error("not scheduling job %s: %s", job.id, exc)
            self.metrics.inc("turnstile_scheduler_bad_specs_total")
            return None

    async def _job_update(self, job: Job, what: str, label: str) -> None:
        if job.session_id is not None:
            update = job_update(job, what, label)
            await self._tell(job.session_id, Publish(event=update))

    async def _tell(self, session_id: str, message: Any) -> None:
        try:
            await self.publish(session_id, message)
        except Exception:  # the session is gone or broken; the store already has the truth
            log.warning("could not tell session %s about job", session_id, exc_info=True)
