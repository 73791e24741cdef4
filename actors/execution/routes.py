"""The execution feature's HTTP endpoints: a session's pending approvals, approve or deny one,
and a session's background tasks (list, read, cancel). Another user's session, approval or task
is ``404`` like one that does not exist."""

from __future__ import annotations

from typing import Any

import trio

from turnstile.actors.execution.approvals import ApprovalDesk
from turnstile.actors.execution.background import CancelTask, GetTask, ListTasks
from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.ids import public_view
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute

__all__ = ["execution_routes"]


def execution_routes(
    node: NodeContext, background: ActorRef, approvals: ApprovalDesk
) -> list[HttpRoute]:
    """The endpoints over the background actor and the approval desk."""

    async def owned(request: ApiRequest) -> str:
        return await node.directory.owned_key(request.user, request.path["id"])

    async def pending(request: ApiRequest) -> Any:
        return {"approvals": approvals.pending(await owned(request))}

    def decide(approved: bool):
        async def endpoint(request: ApiRequest) -> Any:
            return public_view(approvals.resolve(request.user, request.path["id"], approved))

        return endpoint

    async def tasks(request: ApiRequest) -> Any:
        listed = await background.ask(ListTasks(session_id=await owned(request)))
        now = trio.current_time()
        return {"tasks": [t.view(now) for t in listed]}

    async def task(request: ApiRequest) -> Any:
        key = await owned(request)
        found = await background.ask(GetTask(session_id=key, task_id=request.path["task_id"]))
        return found.view(trio.current_time())

    async def cancel(request: ApiRequest) -> Any:
        key, task_id = await owned(request), request.path["task_id"]
        cancelled = await background.ask(CancelTask(session_id=key, task_id=task_id))
        return {"task_id": task_id, "cancelled": cancelled}

    return [
        HttpRoute("GET", "/sessions/{id}/approvals", pending),
        HttpRoute("POST", "/approvals/{id}/approve", decide(True)),
        HttpRoute("POST", "/approvals/{id}/deny", decide(False)),
        HttpRoute("GET", "/sessions/{id}/tasks", tasks),
        HttpRoute("GET", "/sessions/{id}/tasks/{task_id}", task),
        HttpRoute("POST", "/sessions/{id}/tasks/{task_id}/cancel", cancel),
    ]
