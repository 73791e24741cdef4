"""Scheduling's store: its jobs and runs, and firing their occurrences, over ``Store.run``.

:class:`JobStore` wraps the node's :class:`~runtime.store.Store`: each method checks its
arguments (with the kernel's checks, so both backends raise the same errors), encodes JSON and
times, and runs one of scheduling's operations (:mod:`~actors.scheduling.queries`,
:mod:`~actors.scheduling.fire`) with ``store.run``. The tables are scheduling's own
(:mod:`~actors.scheduling.schema`); a session's jobs and runs go with it (``ON DELETE
CASCADE``). It holds nothing but the store, so making one is free: the scheduler, its tools,
routes and turns each make theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from msgspec import UNSET, UnsetType

from turnstile.actors.scheduling.fire import FIRE_JOB, FIRE_JOBS
from turnstile.actors.scheduling.queries import (
    ACTIVE_JOBS,
    CREATE_JOB,
    CREATE_JOB_WITHIN,
    DELETE_JOB,
    DUE_ACTIVE,
    DUE_JOBS,
    GET_JOB,
    GET_RUN,
    LIST_JOBS,
    LIST_RUNS,
    TRANSITION_JOB,
    UPDATE_JOB,
    UPDATE_RUN,
    active_record,
    no_job,
    no_run,
)
from turnstile.actors.scheduling.records import (
    JOB_STATES,
    ActiveJob,
    FireRequest,
    FireResult,
    Job,
    JobRun,
)
from turnstile.runtime.errors import AlreadyExists, LimitExceeded
from turnstile.runtime.store import (
    Store,
    check_int,
    check_limit,
    check_text,
    check_time,
    encode_json,
    encode_optional_json,
    optional_ts,
)

__all__ = ["JobStore"]


def _check_job_state(state: object) -> str:
    if state not in JOB_STATES:
        raise ValueError(f"unknown job state {state!r}")
    return state


def _check_job_states(states: Sequence[str] | None) -> list[str] | None:
    if states is None:
        return None
    if isinstance(states, str):
        raise TypeError("states must be a sequence of str, not a str")
    return [_check_job_state(s) for s in states]


def _check_fire_input(value: object) -> tuple[str, str] | None:
    """``(source, payload)`` -> ``(source, payload as JSON)``."""
    if value is None:
        return None
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise TypeError("input must be a (source, payload) pair")
    source, payload = value
    return check_text(source, "source"), encode_json(payload)


class JobStore:
    """Scheduling's jobs and runs in ``store``, and the fires that consume their occurrences.

    Args:
        store: the node's store, opened with scheduling's migration set
            (:data:`~actors.scheduling.schema.SCHEDULING`).

    Attributes:
        store: that store.
    """

    __slots__ = ("store",)

    def __init__(self, store: Store) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"<JobStore {self.store!r}>"

    def _now(self) -> Any:
        return self.store.engine.db_time(self.store.clock.now())

    def _time(self, value: object, what: str) -> Any:
        return self.store.engine.db_time(check_time(value, what))

    def _optional_time(self, value: object, what: str) -> Any:
        return None if value is None else self._time(value, what)

    async def create_job(
        self,
        id: str,
        *,
        kind: str,
        spec: dict[str, Any],
        session_id: str | None = None,
        next_fire_at: datetime | None = None,
        state: str = "active",
        max_per_session: int | None = None,
    ) -> Job:
        """Create a job (``run_count`` 0).

        Args:
            id: caller-supplied, non-empty.
            kind: the kind of schedule; not interpreted by the store.
            spec: the schedule and what to deliver.
            session_id: the session its turns go to, or None.
            next_fire_at: the first occurrence, or None.
            state: one of :data:`~actors.scheduling.records.JOB_STATES`.
            max_per_session: refuse when the session has this many pending (active or
                paused) jobs already. The count and the insert are one transaction (on
                PostgreSQL under a lock on the session), so concurrent creations, through
                any number of nodes, never pass it. Needs ``session_id``.

        Raises:
            LimitExceeded: ``session already has 3 scheduled jobs (limit 3)`` (checked first).
            AlreadyExists: ``job 'x' already exists``.
            NotFound: ``no session with id 'x'``.
        """
        check_text(id, "id")
        check_text(kind, "kind")
        _check_job_state(state)
        if session_id is not None:
            check_text(session_id, "session_id")
        data = encode_json(spec, "spec")
        args = {
            "id": id,
            "kind": kind,
            "spec": data,
            "session_id": session_id,
            "next_fire_at": self._optional_time(next_fire_at, "next_fire_at"),
            "state": state,
            "now": self._now(),
        }
        if max_per_session is None:
            job = await self.store.run(CREATE_JOB, **args)
        else:
            limit = check_int(max_per_session, "max_per_session")
            if limit < 1:
                raise ValueError("max_per_session must be positive")
            if session_id is None:
                raise TypeError("max_per_session needs a session_id")
            answer = await self.store.run(CREATE_JOB_WITHIN, limit=limit, **args)
            if isinstance(answer, int):
                raise LimitExceeded(f"session already has {answer} scheduled jobs (limit {limit})")
            job = answer
        if job is None:
            raise AlreadyExists(f"job {id!r} already exists")
        return job

    async def get_job(self, id: str) -> Job:
        """Read one job.

        Raises:
            NotFound: ``no job with id 'x'``.
        """
        job = await self.store.run(GET_JOB, id=id)
        if job is None:
            raise no_job(id)
        return job

    async def list_jobs(
        self, session_id: str | None = None, states: Sequence[str] | None = None
    ) -> list[Job]:
        """Jobs ordered by (created_at, id), optionally of one session and/or in ``states``."""
        wanted = _check_job_states(states)
        return await self.store.run(LIST_JOBS, session_id=session_id, states=wanted)

    async def active_jobs(self, after: str = "", limit: int = 5000) -> list[tuple[ActiveJob, Any]]:
        """A page of the active jobs that have a next occurrence, by id: what a scheduler
        loads at start, page after page (pass the last id of one page as ``after`` of the
        next; a short page is the last).

        Args:
            after: the page starts after this id; ``""``: at the first job.
            limit: at most this many jobs.

        Returns:
            ``(job, created_at)`` per job, ``created_at`` as the database orders it (ISO
            text on SQLite, a datetime on PostgreSQL): only for sorting jobs of one page set.
        """
        if not isinstance(after, str):
            raise TypeError(f"after must be a str, not {type(after).__name__}")
        check_limit(limit)
        return await self.store.run(ACTIVE_JOBS, after=after, limit=limit)

    async def update_job(
        self,
        id: str,
        *,
        kind: str | UnsetType = UNSET,
        spec: dict[str, Any] | UnsetType = UNSET,
        state: str | UnsetType = UNSET,
        next_fire_at: datetime | None | UnsetType = UNSET,
    ) -> Job:
        """Change a job's fields; bumps ``updated_at`` when anything is set.

        This is a plain write, not a compare-and-set: to consume an occurrence use
        :meth:`fire_job`.

        Returns:
            The job as stored after the update.

        Raises:
            NotFound: ``no job with id 'x'``.
        """
        args: dict[str, Any] = {
            "set_kind": kind is not UNSET,
            "kind": None if kind is UNSET else check_text(kind, "kind"),
            "set_spec": spec is not UNSET,
            "spec": None if spec is UNSET else encode_json(spec, "spec"),
            "set_state": state is not UNSET,
            "state": None if state is UNSET else _check_job_state(state),
            "set_next_fire_at": next_fire_at is not UNSET,
            "next_fire_at": None
            if next_fire_at is UNSET
            else self._optional_time(next_fire_at, "next_fire_at"),
        }
        if not (
            args["set_kind"] or args["set_spec"] or args["set_state"] or args["set_next_fire_at"]
        ):
            return await self.get_job(id)
        job = await self.store.run(UPDATE_JOB, id=id, now=self._now(), **args)
        if job is None:
            raise no_job(id)
        return job

    async def transition_job(
        self,
        id: str,
        expected: str,
        state: str,
        *,
        next_fire_at: datetime | None | UnsetType = UNSET,
    ) -> Job | None:
        """Move a job from state ``expected`` to ``state`` (and set ``next_fire_at``, if
        given) in one compare-and-set on its state: a pause never lands on a job a fire just
        completed. Returns the job as stored after it, or None when it was not in ``expected``
        (or does not exist)."""
        unset = isinstance(next_fire_at, UnsetType)
        return await self.store.run(
            TRANSITION_JOB,
            id=id,
            expected=_check_job_state(expected),
            state=_check_job_state(state),
            set_next_fire_at=not unset,
            next_fire_at=None if unset else self._optional_time(next_fire_at, "next_fire_at"),
            now=self._now(),
        )

    async def delete_job(self, id: str) -> None:
        """Delete a job and its runs (inbox items it enqueued stay).

        Raises:
            NotFound: ``no job with id 'x'``.
        """
        if not await self.store.run(DELETE_JOB, id=id):
            raise no_job(id)

    async def due_jobs(self, before: datetime, limit: int = 100) -> list[Job]:
        """Active jobs with ``next_fire_at <= before``, ordered by (next_fire_at, id)."""
        b = self._time(before, "before")
        check_limit(limit)
        return await self.store.run(DUE_JOBS, before=b, limit=limit)

    async def due_jobs_wanted(
        self, before: datetime, wanted: Callable[[str, datetime | None], bool], limit: int = 100
    ) -> list[ActiveJob]:
        """The active jobs due by ``before`` (as :meth:`due_jobs`, by ``(next_fire_at, id)``,
        at most ``limit`` looked at) for which ``wanted(id, next_fire_at)`` is true.

        Only those are decoded: a scheduler's take-on pass looks at every due job of every
        node each interval and wants the few it does not have (10,000 due jobs on SQLite, the
        pass took 162-230 ms of CPU decoding them all, 114-120 ms with this)."""
        b = self._time(before, "before")
        check_limit(limit)
        rows = await self.store.run(DUE_ACTIVE, before=b, limit=limit)
        return [active_record(row)[0] for row in rows if wanted(row[0], optional_ts(row[4]))]

    async def list_runs(self, job_id: str, limit: int = 100) -> list[JobRun]:
        """A job's runs, newest first, at most ``limit``.

        Raises:
            NotFound: ``no job with id 'x'``.
        """
        check_limit(limit)
        return await self.store.run(LIST_RUNS, job_id=job_id, limit=limit)

    async def get_run(self, run_id: int) -> JobRun:
        """One run by its id.

        Raises:
            NotFound: ``no run with id 5``.
        """
        check_int(run_id, "run_id")
        run = await self.store.run(GET_RUN, run_id=run_id)
        if run is None:
            raise no_run(run_id)
        return run

    async def update_run(
        self, run_id: int, state: str, detail: dict[str, Any] | None = None
    ) -> JobRun:
        """Set a run's state (any non-empty string, e.g. ``"turn_completed"``).

        Args:
            run_id: the run.
            state: the new state.
            detail: the new detail; None leaves the current detail as it is.

        Raises:
            NotFound: ``no run with id 5``.
        """
        check_int(run_id, "run_id")
        check_text(state, "state")
        data = encode_optional_json(detail)
        run = await self.store.run(
            UPDATE_RUN, run_id=run_id, state=state, detail=data, now=self._now()
        )
        if run is None:
            raise no_run(run_id)
        return run

    async def fire_job(
        self,
        job_id: str,
        expected_next_fire_at: datetime,
        new_next_fire_at: datetime | None,
        run_state: str = "queued",
        input: tuple[str, dict[str, Any]] | None = None,
        detail: dict[str, Any] | None = None,
        counts: bool = True,
        extra_runs: Sequence[tuple[datetime, str, dict[str, Any] | None]] = (),
    ) -> FireResult | None:
        """Consume one occurrence of a job, exactly once, in one transaction.

        Compare-and-set: only when the job is ``active`` and its ``next_fire_at`` equals
        ``expected_next_fire_at``, the store advances ``next_fire_at`` to ``new_next_fire_at``
        (None also moves the job to ``completed``), increments ``run_count``, records a run for
        the occurrence (``scheduled_for = expected_next_fire_at``) and, when ``input`` is
        given, enqueues it in the job's session inbox and links it to the run. The input's
        payload gets the run's id as ``run_id``: its turn settles that run by id, however many
        runs (coalesced or missed occurrences) the same fire recorded after it.

        Args:
            job_id: the job.
            expected_next_fire_at: the occurrence being fired, as read from the job.
            new_next_fire_at: the following occurrence, or None when there is none.
            run_state: the state of the new run.
            input: ``(source, payload)`` of the turn input to enqueue, or None.
            detail: the new run's detail, or None.
            counts: whether the occurrence counts towards ``run_count`` (a skipped, missed
                occurrence does not).
            extra_runs: more run records to write in the same transaction, as
                ``(scheduled_for, state, detail)`` — the occurrences a misfire policy
                coalesced or skipped.

        Returns:
            What was written, or None when the compare-and-set lost (the job was fired,
            changed, paused or completed by someone else).

        Raises:
            NotFound: ``no job with id 'x'``.
            ConflictError: ``input`` was given but the job has no session.
        """
        expected = self._time(expected_next_fire_at, "expected_next_fire_at")
        new = self._optional_time(new_next_fire_at, "new_next_fire_at")
        check_text(run_state, "run_state")
        inp = _check_fire_input(input)
        data = encode_optional_json(detail)
        extra = [
            (self._time(when, "extra_runs"), state, encode_optional_json(more))
            for when, state, more in extra_runs
        ]
        return await self.store.run(
            FIRE_JOB,
            job_id=job_id,
            expected=expected,
            new=new,
            run_state=run_state,
            input=inp,
            detail=data,
            now=self._now(),
            counts=counts,
            extra_runs=extra,
        )

    async def fire_jobs(self, fires: Sequence[FireRequest]) -> list[FireResult | None]:
        """Fire many on-time occurrences at once, each exactly once, as :meth:`fire_job` fires
        one that delivers a turn (with an input, counted, no extra runs).

        Each occurrence is its own compare-and-set: one that loses writes nothing and does not
        stop the others. On PostgreSQL the batch is one statement (one round trip); a batch
        racing another node's over the same jobs fires each occurrence once in total (the row
        lock makes the second writer re-check the condition, as for ``fire_job``).

        Args:
            fires: the occurrences, at most one per job.

        Returns:
            One answer per request, in order: what ``fire_job`` would return, or None when this
            call did not fire it: the compare-and-set lost (fired, changed, paused, cancelled
            or completed by someone else), or the job does not exist or has no session.
            ``fire_job`` with the same arguments tells those apart (None, ``NotFound``,
            ``ConflictError``).

        Raises:
            ValueError: the same job twice.
        """
        requests, seen = [], set()
        for fire in fires:
            if not isinstance(fire, FireRequest):
                raise TypeError(f"fires must be FireRequests, not {type(fire).__name__}")
            check_text(fire.job_id, "job_id")
            if fire.job_id in seen:
                raise ValueError(f"job {fire.job_id!r} is in fires twice")
            seen.add(fire.job_id)
            requests.append(
                (
                    fire.job_id,
                    self._time(fire.expected_next_fire_at, "expected_next_fire_at"),
                    self._optional_time(fire.new_next_fire_at, "new_next_fire_at"),
                    check_text(fire.run_state, "run_state"),
                    _check_fire_input(fire.input or ()),
                    encode_optional_json(fire.detail),
                )
            )
        if not requests:
            return []
        return await self.store.run(FIRE_JOBS, fires=requests, now=self._now())
