"""The scheduling feature's HTTP endpoints: the caller's jobs (all of them, or a session's),
one job with its runs, cancelling, pausing and resuming a job, the session's pending recall
(read, cancel, skip) and its heartbeat (settings and runs).

Every endpoint checks that the caller owns the session (another user's is ``404``) and answers
with session names, never keys. Each route describes its answers for the API document
(``/openapi.json``) with the Structs below.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from turnstile.actors.feature import NodeContext
from turnstile.actors.scheduling.actor import CancelJob, PauseJob, ResumeJob
from turnstile.actors.scheduling.heartbeat import heartbeat_view
from turnstile.actors.scheduling.recall import cancel_recall, get_recall, skip_recall
from turnstile.actors.scheduling.records import Job, JobRun
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.scheduling.tools import job_status
from turnstile.actors.sessions.ids import public_id, public_view, session_key
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.errors import NotFound
from turnstile.runtime.gateway.frames import SessionId
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute, decode_query

__all__ = ["scheduling_routes"]

#: Sessions read per page when listing every job of a user.
_PAGE = 1000


class JobsQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``GET /jobs``'s query string: only one session's jobs, only jobs in one state
    (``failed``: an active or completed job whose last run failed, as ``schedule_list``)."""

    session: SessionId | None = None
    state: Literal["active", "paused", "completed", "failed", "cancelled"] | None = None


class JobList(msgspec.Struct):
    """Jobs, each with its session's name in ``session_id``: by session, oldest first."""

    jobs: list[Job]


class JobDetail(msgspec.Struct):
    """``GET /jobs/{id}``: a job and its last 100 run records (missed and coalesced too)."""

    job: Job
    runs: list[JobRun]


class RecallView(msgspec.Struct, kw_only=True):
    """A recall (``docs/scheduling.md``).

    Attributes:
        recall_id: the recall (also its job's id).
        call_type: ``once``, ``recurring`` or ``immediate``.
        status: ``pending``, ``paused``, ``fired`` or ``cancelled``.
        trigger_at: its next occurrence (ISO 8601), or null.
        interval_seconds: (recurring) its period.
        internal_comment: the agent's note about it.
        additional_context_message: the self-instruction.
        fired_count: how many times it fired.
        created_at, updated_at: ISO 8601.
    """

    recall_id: str
    call_type: str | None
    status: str
    trigger_at: str | None
    interval_seconds: int | None
    internal_comment: str
    additional_context_message: str
    fired_count: int
    created_at: str | None
    updated_at: str | None


class PendingRecall(msgspec.Struct):
    """``GET /sessions/{id}/recall``: the pending recall, or null."""

    recall: RecallView | None


class RecallChanged(RecallView, kw_only=True, omit_defaults=True):
    """A recall cancelled or skipped: the ``recall_update`` event's fields.

    Attributes:
        action: ``cancelled`` or ``skipped``.
        skipped_trigger_at: (``skipped``) the occurrence that was skipped.
    """

    action: str
    skipped_trigger_at: str | None | UnsetType = UNSET


class HeartbeatRunView(msgspec.Struct):
    """One heartbeat run: when it was due, its state, and what it found."""

    run_id: int
    heartbeat_id: str
    scheduled_for: str | None
    state: str
    suppressed: bool
    response: str | None
    error: str | None


class HeartbeatView(msgspec.Struct):
    """``GET /sessions/{id}/heartbeat``.

    Attributes:
        heartbeat: the kept settings (``enabled``, the checklist, interval, active hours …,
            and while it is scheduled ``heartbeat_id``, ``session_id``, ``next_run_at``), or
            null when it was never set.
        runs: its latest 50 runs, newest first.
    """

    heartbeat: dict[str, Any] | None
    runs: list[HeartbeatRunView]


def _public_job(job: Job) -> Job:
    if job.session_id is None:
        return job
    return msgspec.structs.replace(job, session_id=public_id(job.session_id))


def scheduling_routes(node: NodeContext, scheduler: ActorRef) -> list[HttpRoute]:
    """The endpoints, over the node's directory (ownership) and store."""
    store, clock = node.store, node.clock
    job_store = JobStore(store)

    async def owned(request: ApiRequest) -> str:
        return await node.directory.owned_key(request.user, request.path["id"])

    async def session_jobs(request: ApiRequest) -> Any:
        key = await owned(request)
        return JobList(jobs=[_public_job(job) for job in await job_store.list_jobs(session_id=key)])

    async def all_jobs(request: ApiRequest) -> Any:
        query = decode_query(request.query, JobsQuery)
        states = None if query.state is None else [query.state]
        if query.state == "failed":
            states = ["active", "completed"]
        if query.session is not None:
            keys = [await node.directory.owned_key(request.user, query.session)]
        else:
            keys, after = [], None
            while True:  # every session of the caller's, a page at a time
                page = await node.directory.list_sessions(request.user, limit=_PAGE, after_id=after)
                keys += [session_key(request.user, s.id) for s in page]
                if len(page) < _PAGE:
                    break
                after = page[-1].id
        jobs = []
        for key in keys:
            jobs += await job_store.list_jobs(session_id=key, states=states)
        if query.state == "failed":
            jobs = [job for job in jobs if await _failed(job)]
        return JobList(jobs=[_public_job(job) for job in jobs])

    async def _failed(job: Job) -> bool:
        if not job.run_count:
            return False
        runs = await job_store.list_runs(job.id, limit=1)
        return job_status(job, runs[0] if runs else None) == "failed"

    async def owned_job(request: ApiRequest) -> Job:
        """The caller's job named in the path; another user's is not found, like none."""
        job_id, user = request.path["id"], request.user
        try:
            job = await job_store.get_job(job_id)
            if job.session_id is None or job.session_id != session_key(
                user, public_id(job.session_id)
            ):
                raise NotFound(job_id)
            await node.directory.owned_key(user, public_id(job.session_id))
        except (NotFound, ValueError):
            raise NotFound(f"no job with id {job_id!r}") from None
        return job

    async def get_job(request: ApiRequest) -> Any:
        job = await owned_job(request)
        runs = await job_store.list_runs(job.id, limit=100)
        return JobDetail(job=_public_job(job), runs=runs)

    async def cancel_job(request: ApiRequest) -> Any:
        job = await owned_job(request)
        cancelled = await scheduler.ask(CancelJob(job_id=job.id, session_id=job.session_id))
        return _public_job(cancelled)

    async def pause_job(request: ApiRequest) -> Any:
        job = await owned_job(request)
        return _public_job(await scheduler.ask(PauseJob(job_id=job.id, session_id=job.session_id)))

    async def resume_job(request: ApiRequest) -> Any:
        job = await owned_job(request)
        return _public_job(await scheduler.ask(ResumeJob(job_id=job.id, session_id=job.session_id)))

    async def read_recall(request: ApiRequest) -> Any:
        recall = await get_recall(store, await owned(request))
        return PendingRecall(recall=None if recall is None else RecallView(**recall))

    async def cancel(request: ApiRequest) -> Any:
        key = await owned(request)
        changed = await cancel_recall(scheduler, store, key, node.tell_session)
        return msgspec.convert(public_view(changed), RecallChanged)

    async def skip(request: ApiRequest) -> Any:
        key = await owned(request)
        changed = await skip_recall(scheduler, store, clock, key, node.tell_session)
        return msgspec.convert(public_view(changed), RecallChanged)

    async def heartbeat(request: ApiRequest) -> Any:
        return msgspec.convert(
            public_view(await heartbeat_view(store, await owned(request))), HeartbeatView
        )

    return [
        HttpRoute(
            "GET",
            "/jobs",
            all_jobs,
            summary="Your scheduled jobs, every session's (or one's), by session",
            query=JobsQuery,
            response=JobList,
            errors=(404,),
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/jobs",
            session_jobs,
            summary="A session's scheduled jobs",
            response=JobList,
            errors=(404,),
        ),
        HttpRoute(
            "GET",
            "/jobs/{id}",
            get_job,
            summary="A job and its last 100 run records",
            response=JobDetail,
            errors=(404,),
        ),
        HttpRoute(
            "POST",
            "/jobs/{id}/cancel",
            cancel_job,
            summary="Cancel a job: it fires no more (a job already done is answered as it is)",
            response=Job,
            errors=(404,),
        ),
        HttpRoute(
            "POST",
            "/jobs/{id}/pause",
            pause_job,
            summary="Pause a job: it fires nothing until resumed (a paused one answers as it is)",
            response=Job,
            errors=(404, 409),
            description="409 when the job is done (completed or cancelled).",
        ),
        HttpRoute(
            "POST",
            "/jobs/{id}/resume",
            resume_job,
            summary="Resume a paused job from its next occurrence (none missed meanwhile is run)",
            response=Job,
            errors=(404, 409),
            description="409 when the job is done (completed or cancelled). A one-off job whose "
            "time passed while it was paused fires at once.",
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/recall",
            read_recall,
            summary="The session's pending recall",
            response=PendingRecall,
            errors=(404,),
        ),
        HttpRoute(
            "DELETE",
            "/sessions/{id}/recall",
            cancel,
            summary="Cancel the session's pending recall",
            response=RecallChanged,
            errors=(404, 409),
            description="404 when no recall is pending; 409 when it fired meanwhile.",
        ),
        HttpRoute(
            "POST",
            "/sessions/{id}/recall/skip",
            skip,
            summary="Move a recurring recall one interval on",
            response=RecallChanged,
            errors=(404,),
            description="400 when the pending recall is not recurring; 404 when none is.",
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/heartbeat",
            heartbeat,
            summary="The session's heartbeat settings and latest runs",
            response=HeartbeatView,
            errors=(404,),
        ),
    ]
