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

With a store, every task is also a row of ``background_tasks`` (``background_schema.py``),
written when it starts and when it ends, with the node incarnation that runs it: any node
answers a task it does not hold from there (same session, same isolation), and a task whose
node ended before it did (a crash, a clean stop, a node declared dead) is closed as ``lost`` by
:class:`LostTasks` (``background_lost``) and its session told, once.

The task record, its notification texts and its stored form are in ``background_task``. This
module re-exports the names other modules imported from it before the split.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from turnstile.actors.execution.background_lost import LostTasks
from turnstile.actors.execution.background_task import (
    BackgroundTask,
    from_store,
    iso,
    notification_text,
    stored_result,
)
from turnstile.actors.execution.queries import DROP_SESSION, FINISH, GET, LIST, START
from turnstile.actors.sessions.actor import Inject
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.runtime.actor import Actor
from turnstile.runtime.clock import Clock
from turnstile.runtime.codec import Message
from turnstile.runtime.errors import InvalidArgument, LimitExceeded, NotFound, StoreError
from turnstile.runtime.store import NodeRef, Store

__all__ = [
    "BackgroundActor",
    "BackgroundTask",
    "StartTask",
    "CancelTask",
    "GetTask",
    "ListTasks",
    "LostTasks",
    "notification_text",
]

log = logging.getLogger("turnstile.background")

#: Completions this close together reach the session as one notification.
BATCH_WINDOW = 0.05
#: Finished tasks kept per session for background_result (in memory, and in the store).
KEEP_FINISHED = 100
#: A stored task's arguments are a summary: their JSON, cut here.
STORED_ARGS_CHARS = 1000
#: How long the write that ends a task may go on once the node is stopping.
_WRITE_GRACE = 5.0


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


class RunTool(Protocol):
    """The registry's call (``ToolRegistry.call``), as the background actor makes it."""

    def __call__(
        self,
        session_id: str,
        owner: str,
        tool: str,
        params: dict[str, Any],
        /,
        *,
        approved: bool = ...,
        background: bool = ...,
        idempotency_key: str | None = ...,
    ) -> Awaitable[ToolResult]: ...


class BackgroundActor(Actor):
    """Owns background tasks. See the module docstring.

    Args:
        run_tool: ``async (session_id, owner, tool, params, *, approved, background,
            idempotency_key) -> ToolResult`` (the registry's call).
        publish: ``async (session_id, message)`` — tells a session actor (``Inject``).
        clock: for ``started_at``.
        max_running_per_session: running tasks one session may have.
        store: where tasks are recorded (``background_tasks``) and read when they are not
            held here; None keeps them in memory alone.
        node: ``() -> NodeRef | None``, the node incarnation that runs the tasks it starts
            (recorded with each); a task started while it answers None is not recorded.
    """

    uses_nursery = True

    def __init__(
        self,
        run_tool: RunTool,
        publish: Callable[[str, Any], Awaitable[None]],
        clock: Clock,
        *,
        max_running_per_session: int = 20,
        store: Store | None = None,
        node: Callable[[], NodeRef | None] | None = None,
    ) -> None:
        self.run_tool = run_tool
        self.publish = publish
        self.clock = clock
        self.max_running = max_running_per_session
        self.store = store
        self.node = node
        self.tasks: dict[str, BackgroundTask] = {}
        self._outbox: dict[str, list[BackgroundTask]] = {}

    async def receive(self, message: Any) -> Any:
        match message:
            case StartTask():
                return self._start(message)
            case GetTask():
                return await self._find(message.session_id, message.task_id)
            case CancelTask():
                task = await self._find(message.session_id, message.task_id)
                if task.status != "running" or task.stored:
                    return False  # ended, or run by another node: only that one can cancel it
                task.scope.cancel()
                return True
            case DropSessionTasks(session_id=session_id):
                return await self._drop_session(session_id)
            case ListTasks():
                return await self._list(message.session_id)
        raise InvalidArgument(f"background actor cannot handle {type(message).__name__}")

    async def _drop_session(self, session_id: str) -> int:
        mine = [t for t in self.tasks.values() if t.session_id == session_id]
        for task in mine:
            task.scope.cancel()
            del self.tasks[task.id]
        self._outbox.pop(session_id, None)
        if self.store is not None:
            try:
                return max(len(mine), await self.store.run(DROP_SESSION, session_key=session_id))
            except StoreError as exc:
                log.warning("forgetting the background tasks of %s failed: %s", session_id, exc)
        return len(mine)

    def _get(self, session_id: str, task_id: str) -> BackgroundTask:
        task = self.tasks.get(task_id)
        if task is None or task.session_id != session_id:
            raise NotFound(f"no background task with id {task_id!r}")
        return task

    async def _find(self, session_id: str, task_id: str) -> BackgroundTask:
        """The session's task: held here, else as the store has it (another node runs it, or
        an earlier incarnation of this one did)."""
        try:
            return self._get(session_id, task_id)
        except NotFound:
            if self.store is None:
                raise
        row = await self.store.run(GET, session_key=session_id, id=task_id)
        if row is None:
            raise NotFound(f"no background task with id {task_id!r}")
        return from_store(row, self.clock)

    async def _list(self, session_id: str) -> list[BackgroundTask]:
        mine = {t.id: t for t in self.tasks.values() if t.session_id == session_id}
        if self.store is not None:
            try:
                limit = KEEP_FINISHED + self.max_running
                rows = await self.store.run(LIST, session_key=session_id, limit=limit)
            except StoreError as exc:
                log.warning("listing the stored background tasks of %s failed: %s", session_id, exc)
                rows = []
            for row in rows:
                if row.id not in mine:
                    mine[row.id] = from_store(row, self.clock)
        return sorted(mine.values(), key=lambda t: (t.status != "running", -t.started))

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
        now = self.clock.now()
        task = BackgroundTask(
            id=f"bg-{uuid.uuid4().hex[:8]}",
            session_id=msg.session_id,
            owner=msg.owner,
            tool=msg.tool,
            params=msg.params,
            preapproved=msg.preapproved,
            idempotency_key=msg.idempotency_key,
            started_at=iso(now),
            started=trio.current_time(),
            started_on=now,
        )
        self.tasks[task.id] = task
        self._forget_old(msg.session_id)
        if self.nursery is None:  # uses_nursery: there while the actor runs
            raise RuntimeError("the background actor is not running")
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
        await self._record_start(task)
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
        # Cancelled with the node (a shutdown) ends here, its row still ``running``: once the
        # node is stopped, whoever sweeps next closes it as lost and tells the session.
        if task.scope.cancelled_caught:
            task.status = "cancelled"
        task.finished = trio.current_time()
        task.done.set()
        if await self._record_end(task):
            await self._notify(task)

    async def _record_start(self, task: BackgroundTask) -> None:
        """One ``INSERT``; a store that fails it costs the task its row, never its run."""
        ref = self.node() if self.node is not None else None
        if self.store is None or ref is None:
            return
        started = {
            "id": task.id,
            "session_key": task.session_id,
            "owner": task.owner,
            "tool": task.tool,
            "args": json.dumps(task.params, default=str)[:STORED_ARGS_CHARS],
            "started_at": self.store.db_time(task.started_on or self.clock.now()),
            "node_id": ref.id,
            "node_epoch": ref.epoch,
        }
        try:
            await self.store.run(START, task=started, keep=KEEP_FINISHED)
        except StoreError as exc:
            log.warning("background task %s: recording its start failed: %s", task.id, exc)
            return
        task.recorded = True

    async def _record_end(self, task: BackgroundTask) -> bool:
        """One ``UPDATE`` of the task's row; whether its session is to be told here (False: the
        row was closed as lost by another node meanwhile, which told the session, or it is
        gone with its session)."""
        if self.store is None or not task.recorded:
            return True
        with trio.move_on_after(_WRITE_GRACE, shield=True):
            try:
                ended = await self.store.run(
                    FINISH,
                    session_key=task.session_id,
                    id=task.id,
                    state=task.status,
                    result=stored_result(task.result),
                    now=self.store.db_time(self.clock.now()),
                )
            except StoreError as exc:
                log.warning("background task %s: recording its end failed: %s", task.id, exc)
                return True
            if not ended:
                log.warning(
                    "background task %s ended (%s) after it was closed as lost or deleted:"
                    " its session is not told again",
                    task.id,
                    task.status,
                )
            return ended
        return True

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
