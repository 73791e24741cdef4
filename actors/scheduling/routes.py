"""The scheduling feature's HTTP endpoints: a session's jobs, one job with its runs, the
session's pending recall (read, cancel, skip) and its heartbeat (settings and runs).

Every endpoint checks that the caller owns the session (another user's is ``404``) and answers
with session names, never keys.
"""

from __future__ import annotations

from typing import Any

import msgspec

from turnstile.actors.feature import NodeContext
from turnstile.actors.scheduling.heartbeat import heartbeat_view
from turnstile.actors.scheduling.recall import cancel_recall, get_recall, skip_recall
from turnstile.actors.sessions.ids import public_id, public_view, session_key
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.errors import NotFound
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute
from turnstile.runtime.store import Job

__all__ = ["scheduling_routes"]


def _public_job(job: Job) -> Job:
    if job.session_id is None:
        return job
    return msgspec.structs.replace(job, session_id=public_id(job.session_id))


def scheduling_routes(node: NodeContext, scheduler: ActorRef) -> list[HttpRoute]:
    """The endpoints, over the node's directory (ownership) and store."""
    store, clock = node.store, node.clock

    async def owned(request: ApiRequest) -> str:
        return await node.directory.owned_key(request.user, request.path["id"])

    async def session_jobs(request: ApiRequest) -> Any:
        key = await owned(request)
        return {"jobs": [_public_job(job) for job in await store.list_jobs(session_id=key)]}

    async def get_job(request: ApiRequest) -> Any:
        job_id, user = request.path["id"], request.user
        try:
            job = await store.get_job(job_id)
            if job.session_id is None or job.session_id != session_key(
                user, public_id(job.session_id)
            ):
                raise NotFound(job_id)
            await node.directory.owned_key(user, public_id(job.session_id))
        except (NotFound, ValueError):
            raise NotFound(f"no job with id {job_id!r}") from None
        return {"job": _public_job(job), "runs": await store.list_runs(job_id, limit=100)}

    async def read_recall(request: ApiRequest) -> Any:
        return {"recall": public_view(await get_recall(store, await owned(request)))}

    async def cancel(request: ApiRequest) -> Any:
        key = await owned(request)
        return public_view(await cancel_recall(scheduler, store, key, node.tell_session))

    async def skip(request: ApiRequest) -> Any:
        key = await owned(request)
        return public_view(await skip_recall(scheduler, store, clock, key, node.tell_session))

    async def heartbeat(request: ApiRequest) -> Any:
        return public_view(await heartbeat_view(store, await owned(request)))

    return [
        HttpRoute("GET", "/sessions/{id}/jobs", session_jobs),
        HttpRoute("GET", "/jobs/{id}", get_job),
        HttpRoute("GET", "/sessions/{id}/recall", read_recall),
        HttpRoute("DELETE", "/sessions/{id}/recall", cancel),
        HttpRoute("POST", "/sessions/{id}/recall/skip", skip),
        HttpRoute("GET", "/sessions/{id}/heartbeat", heartbeat),
    ]
