"""Background tasks: run a tool without blocking the turn, and hear about it when it is done.

The background actor owns every task in its own nursery (cancelled on shutdown: no orphan
work), keyed by id and by the session that started it — another session's task is "not found".
A task runs its tool through the tool registry, so policies apply exactly as for a direct call.

When a task finishes, its session is told with the reference's text::

    [BACKGROUND TASK COMPLETED] task_id=bg-…, tool=http.get, elapsed=1.2s
    Result: {…}

(``FAILED`` and ``Error:`` on failure; results over 2,000 characters are cut, with a pointer to
``background_result``). The notification is folded into the session's running turn before its
next model call, or starts a turn when the session is idle. Tasks that finish within the same
``BATCH_WINDOW`` are delivered as one notification.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from turnstile.actors.sessions.actor import Inject
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.runtime.actor import Actor
from turnstile.runtime.clock import Clock
from turnstile.runtime.codec import Message
from turnstile.runtime.errors import InvalidArgument, LimitExceeded, NotFound

__all__ = [
    "BackgroundActor",
    "BackgroundTask",
    "StartTask",
    "CancelTask",
    "GetTask",
    "ListTasks",
    "notification_text",
]

#: Results longer than this are cut in the notification (background_result has them whole).
NOTIFY_RESULT_CHARS = 2000
#: Completions this close together reach the session as one notification.
BATCH_WINDOW = 0.05
#: Finished tasks kept per session for background_result.
KEEP_FINISHED = 100


@dataclass
class BackgroundTask:
    """One background task and, once done, its outcome."""

    id: str
    session_id: str
    owner: str
    tool: str
    params: dict[str, Any]
    started_at: str
    started: float
    preapproved: bool = False
    idempotency_key: str | None = None
    status: str = "running"  # running | completed | failed | cancelled
    result: ToolResult | None = None
    finished: float | None = None
    done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)

    def elapsed(self, now: float) -> float:
        return round((self.finished if self.finished is not None else now) - self.started, 3)

    def view(self, now: float) -> dict[str, Any]:
        return {
            "task_id": self.id,
            "tool_name": self.tool,
            "status": self.status,
            "started_at": self.started_at,
            "elapsed_seconds": self.elapsed(now),
        }


class StartTask(Message, tag="start_task", kw_only=True):
    """Start ``tool`` with ``params`` for a session; answers the ``BackgroundTask``.

    ``preapproved``: the call was approved already (``http.download`` moving itself to the
    background after its approval), so the task does not ask again. ``idempotency_key``: the
    key of the turn's call that started it, which the task's own call carries on.
    """

    session_id: str
    owner: str
    tool: str
    params: dict[str, Any]
    preapproved: bool = False
    idempotency_key: str | None = None


class GetTask(Message, tag="get_task", kw_only=True):
    """Answers the session's task (running or finished)."""

    session_id: str
    task_id: str


class CancelTask(Message, tag="cancel_task", kw_only=True):
    """Cancel a running task; answers whether it was running."""

    session_id: str
    task_id: str


class DropSessionTasks(Message, tag="drop_session_tasks", kw_only=True):
    """End everything of a deleted session: cancel its running tasks, forget every record and
    every notice not yet delivered. Answers how many tasks there were."""

    session_id: str


class ListTasks(Message, tag="list_tasks", kw_only=True):
    """Answers the session's tasks, running first."""

    session_id: str


def notification_text(task: BackgroundTask, now: float) -> str:
    """The reference's notification for a finished task."""
    head = f"task_id={task.id}, tool={task.tool}, elapsed={task.elapsed(now):.1f}s"
    result = task.result
    if task.status == "cancelled":
        return f"[BACKGROUND TASK CANCELLED] {head}"
    if result is None or not result.ok:
        message = (result.error or {}).get("message") if result else "the task failed"
        return f"[BACKGROUND TASK FAILED] {head}\nError: {message}"
    body = json.dumps({"success": True, "data": result.data}, default=str)
    if len(body) <= NOTIFY_RESULT_CHARS:
        return f"[BACKGROUND TASK COMPLETED] {head}\nResult: {body}"
    return (
        f"[BACKGROUND TASK COMPLETED] {head}\n"
        f"Result (truncated): {body[:NOTIFY_RESULT_CHARS]}... ({len(body)} chars total)\n"
        f'Use background_result(task_id="{task.id}") to get the full output.'
    )


class BackgroundActor(Actor):
    """Owns background tasks. See the module docstring.

    Args:
        run_tool: ``async (session_id, owner, tool, params, *, approved, background,
            idempotency_key) -> ToolResult`` (the registry's call).
        publish: ``async (session_id, message)`` — tells a session actor (``Inject``).
        clock: for ``started_at``.
        max_running_per_session: running tasks one session may have.
    """

    uses_nursery = True

    def __init__(
        self,
        run_tool: Callable[[str, str, str, dict[str, Any]], Awaitable[ToolResult]],
        publish: Callable[[str, Any], Awaitable[None]],
        clock: Clock,
        *,
        max_running_per_session: int = 20,
    ) -> None:
        self.run_tool = run_tool
        self.publish = publish
        self.clock = clock
        self.max_running = max_running_per_session
        self.tasks: dict[str, BackgroundTask] = {}
        self._outbox: dict[str, list[BackgroundTask]] = {}

    async def receive(self, message: Any) -> Any:
        match message:
            case StartTask():
                return self._start(message)
            case GetTask():
                return self._get(message.session_id, message.task_id)
            case CancelTask():
                task = self._get(message.session_id, message.task_id)
                if task.status != "running":
                    return False
                task.scope.cancel()
                return True
            case DropSessionTasks(session_id=session_id):
                return self._drop_session(session_id)
            case ListTasks():
                mine = [t for t in self.tasks.values() if t.session_id == message.session_id]
                return sorted(mine, key=lambda t: (t.status != "running", -t.started))
        raise InvalidArgument(f"background actor cannot handle {type(message).__name__}")

    def _drop_session(self, session_id: str) -> int:
        mine = [t for t in self.tasks.values() if t.session_id == session_id]
        for task in mine:
            task.scope.cancel()
            del self.tasks[task.id]
        self._outbox.pop(session_id, None)
        return len(mine)

    def _get(self, session_id: str, task_id: str) -> BackgroundTask:
        task = self.tasks.get(task_id)
        if task is None or task.session_id != session_id:
            raise NotFound(f"no background task with id {task_id!r}")
        return task

    def _start(self, msg: StartTask) -> BackgroundTask:
        running = sum(
            1
            for t in self.tasks.values()
            if t.session_id == msg.session_id and t.status == "running"
        )
        if running >= self.max_running:
            raise LimitExceeded(
                f"session has {running} background tasks running (limit {self.max_running})"
            )
        task = BackgroundTask(
            id=f"bg-{uuid.uuid4().hex[:8]}",
            session_id=msg.session_id,
            owner=msg.owner,
            tool=msg.tool,
            params=msg.params,
            preapproved=msg.preapproved,
            idempotency_key=msg.idempotency_key,
            started_at=self.clock.now().isoformat().replace("+00:00", "Z"),
            started=trio.current_time(),
        )
        self.tasks[task.id] = task
        self._forget_old(msg.session_id)
        self.nursery.start_soon(self._run, task, name=f"background {task.id}")
        return task

    def _forget_old(self, session_id: str) -> None:
        finished = [
            t for t in self.tasks.values() if t.session_id == session_id and t.status != "running"
        ]
        for task in sorted(finished, key=lambda t: t.started)[
            : max(0, len(finished) - KEEP_FINISHED)
        ]:
            del self.tasks[task.id]

    async def _run(self, task: BackgroundTask) -> None:
        with task.scope:
            try:
                task.result = await self.run_tool(
                    task.session_id,
                    task.owner,
                    task.tool,
                    task.params,
                    approved=task.preapproved,
                    background=True,
                    idempotency_key=task.idempotency_key,
                )
                task.status = "completed" if task.result.ok else "failed"
            except Exception as exc:  # the registry turns tool errors into results; this is a bug
                task.result = ToolResult(
                    ok=False, error={"code": "internal", "message": type(exc).__name__}
                )
                task.status = "failed"
        if task.scope.cancelled_caught:
            task.status = "cancelled"
        task.finished = trio.current_time()
        task.done.set()
        await self._notify(task)

    async def _notify(self, task: BackgroundTask) -> None:
        """Batch completions per session for ``BATCH_WINDOW``, then tell the session once.

        A task whose session was deleted (``DropSessionTasks``) notifies nobody.
        """
        if self.tasks.get(task.id) is not task:
            return
        pending = self._outbox.get(task.session_id)
        if pending is not None:
            pending.append(task)
            return
        batch = self._outbox[task.session_id] = [task]
        await trio.sleep(BATCH_WINDOW)
        if self._outbox.get(task.session_id) is not batch:
            return  # the session was deleted meanwhile (``DropSessionTasks``)
        del self._outbox[task.session_id]
        now = trio.current_time()
        text = "\n\n".join(notification_text(t, now) for t in batch)
        with trio.CancelScope(shield=True):
            await self.publish(
                task.session_id,
                Inject(
                    source="notification",
                    content=text,
                    payload={"background_tasks": [t.id for t in batch]},
                ),
            )
