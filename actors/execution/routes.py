"""The execution feature's HTTP endpoints: a session's pending approvals, approve or deny one
(through any node: the approvals are in the store), and a session's background tasks (list,
read, cancel). Another user's session, approval or task is ``404`` like one that does not
exist. Each route describes its answers for the API document (``/openapi.json``) with the
Structs below."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import trio

from turnstile.actors.execution.approvals import ApprovalDesk
from turnstile.actors.execution.background import CancelTask, GetTask, ListTasks
from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.ids import public_view
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute

__all__ = ["execution_routes"]


class PendingApproval(msgspec.Struct):
    """A tool call waiting for a person: approve or deny it by ``approval_id``."""

    approval_id: str
    tool: str


class PendingApprovals(msgspec.Struct):
    """``GET /sessions/{id}/approvals``: the session's pending approvals."""

    approvals: list[PendingApproval]


class Decision(msgspec.Struct):
    """An approval decided: the waiting tool call runs (``approved``) or is refused."""

    approval_id: str
    decision: Literal["approved", "denied"]
    session_id: str


class TaskView(msgspec.Struct):
    """A background task (``docs/tools.md``).

    Attributes:
        task_id: its id in the session.
        tool_name: the tool it runs.
        status: ``running``, ``completed``, ``failed``, ``cancelled`` or ``lost`` (its node
            ended before it did: docs/tools.md).
        started_at: when it started (ISO 8601, UTC).
        elapsed_seconds: how long it ran (so far).
    """

    task_id: str
    tool_name: str
    status: Literal["running", "completed", "failed", "cancelled", "lost"]
    started_at: str
    elapsed_seconds: float


class TaskList(msgspec.Struct):
    """``GET /sessions/{id}/tasks``: the session's background tasks, running and finished."""

    tasks: list[TaskView]


class TaskCancelled(msgspec.Struct):
    """``POST /sessions/{id}/tasks/{task_id}/cancel``: whether it was running."""

    task_id: str
    cancelled: bool


def _task(view: dict[str, Any]) -> TaskView:
    return TaskView(**view)


def execution_routes(
    node: NodeContext, background: ActorRef, approvals: ApprovalDesk
) -> list[HttpRoute]:
    """The endpoints over the background actor and the approval desk."""

    async def owned(request: ApiRequest) -> str:
        return await node.directory.owned_key(request.user, request.path["id"])

    async def pending(request: ApiRequest) -> Any:
        waiting = await approvals.list_pending(await owned(request))
        return PendingApprovals(approvals=[PendingApproval(**p) for p in waiting])

    def decide(approved: bool):
        async def endpoint(request: ApiRequest) -> Any:
            answer = await approvals.answer(request.user, request.path["id"], approved)
            decided = public_view(answer)
            return Decision(**decided)

        return endpoint

    async def tasks(request: ApiRequest) -> Any:
        listed = await background.ask(ListTasks(session_id=await owned(request)))
        now = trio.current_time()
        return TaskList(tasks=[_task(t.view(now)) for t in listed])

    async def task(request: ApiRequest) -> Any:
        key = await owned(request)
        found = await background.ask(GetTask(session_id=key, task_id=request.path["task_id"]))
        return _task(found.view(trio.current_time()))

    async def cancel(request: ApiRequest) -> Any:
        key, task_id = await owned(request), request.path["task_id"]
        cancelled = await background.ask(CancelTask(session_id=key, task_id=task_id))
        return TaskCancelled(task_id=task_id, cancelled=cancelled)

    decided = "400 when it was decided already (or timed out while you answered)."
    return [
        HttpRoute(
            "GET",
            "/sessions/{id}/approvals",
            pending,
            summary="The tool calls of a session waiting for a person",
            response=PendingApprovals,
            errors=(404,),
        ),
        HttpRoute(
            "POST",
            "/approvals/{id}/approve",
            decide(True),
            summary="Approve a waiting tool call: it runs",
            response=Decision,
            errors=(404,),
            description=decided,
        ),
        HttpRoute(
            "POST",
            "/approvals/{id}/deny",
            decide(False),
            summary="Deny a waiting tool call: it is refused",
            response=Decision,
            errors=(404,),
            description=decided,
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/tasks",
            tasks,
            summary="A session's background tasks",
            response=TaskList,
            errors=(404,),
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/tasks/{task_id}",
            task,
            summary="One background task",
            response=TaskView,
            errors=(404,),
        ),
        HttpRoute(
            "POST",
            "/sessions/{id}/tasks/{task_id}/cancel",
            cancel,
            summary="Cancel a running background task",
            response=TaskCancelled,
            errors=(404,),
        ),
    ]
