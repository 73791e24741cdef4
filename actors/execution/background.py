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
:class:`LostTasks` — at the next start of that node, or by the next sweep of any node — and
its session is told, once::

    [BACKGROUND TASK FAILED] task_id=bg-…, tool=http.get, elapsed=31.0s
    Error: lost: node 'a' stopped before the task finished
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import trio

from turnstile.actors.execution.queries import (
    CLOSE_LOST,
    DROP_SESSION,
    FINISH,
    GET,
    LIST,
    LOOK,
    MARK_TOLD,
    START,
    StoredTask,
)
from turnstile.actors.sessions.actor import Inject
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.runtime.actor import Actor
from turnstile.runtime.clock import Clock
from turnstile.runtime.codec import Message
from turnstile.runtime.errors import InvalidArgument, LimitExceeded, NotFound, StoreError
from turnstile.runtime.membership import ended_by
from turnstile.runtime.store import ClusterView, NodeRecord, NodeRef, Store

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

#: Results longer than this are cut in the notification (background_result has them whole).
NOTIFY_RESULT_CHARS = 2000
#: Completions this close together reach the session as one notification.
BATCH_WINDOW = 0.05
#: Finished tasks kept per session for background_result (in memory, and in the store).
KEEP_FINISHED = 100
#: A stored task's arguments are a summary: their JSON, cut here.
STORED_ARGS_CHARS = 1000
#: A stored result longer than this (as JSON) is kept cut, as text: ``{"success", "truncated",
#: "chars", "text"}``; the node that ran the task keeps it whole in memory.
STORED_RESULT_CHARS = 64_000
#: How long the write that ends a task may go on once the node is stopping.
_WRITE_GRACE = 5.0
#: Lost tasks told per pass of :class:`LostTasks` (the rest at the next one).
_TELL_PER_PASS = 200


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
    status: str = "running"  # running | completed | failed | cancelled | lost
    result: ToolResult | None = None
    finished: float | None = None
    done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: when it started, by the node's clock (what the store records)
    started_on: datetime | None = None
    #: its row was written when it started (so its end is written too)
    recorded: bool = False
    #: read from the store: run by another node (or an earlier incarnation of this one)
    stored: bool = False

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
    return _text(task.id, task.tool, task.status, task.elapsed(now), task.result)


def lost_text(task: StoredTask) -> str:
    """The notification for a task closed as lost: a failure, read from its row alone (so
    every node that tells it tells the same words)."""
    assert task.finished_at is not None
    elapsed = (task.finished_at - task.started_at).total_seconds()
    return _text(task.id, task.tool, task.state, elapsed, _result_of(task.result))


def _text(task_id: str, tool: str, status: str, elapsed: float, result: ToolResult | None) -> str:
    head = f"task_id={task_id}, tool={tool}, elapsed={elapsed:.1f}s"
    if status == "cancelled":
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
        f'Use background_result(task_id="{task_id}") to get the full output.'
    )


def _stored_result(result: ToolResult | None) -> str | None:
    """A result as the store keeps it: JSON, cut past :data:`STORED_RESULT_CHARS`."""
    if result is None:
        return None
    body: dict[str, Any] = {"success": result.ok}
    if result.ok:
        body["data"] = result.data
    else:
        body["error"] = result.error
    text = json.dumps(body, default=str)
    if len(text) <= STORED_RESULT_CHARS:
        return text
    cut = {
        "success": result.ok,
        "truncated": True,
        "chars": len(text),
        "text": text[:STORED_RESULT_CHARS],
    }
    return json.dumps(cut)


def _result_of(stored: dict[str, Any] | None) -> ToolResult | None:
    if stored is None:
        return None
    if stored.get("truncated"):
        cut = {k: stored[k] for k in ("truncated", "chars", "text")}
        if stored["success"]:
            return ToolResult(ok=True, data=cut)
        return ToolResult(ok=False, error={"code": "truncated", "message": stored["text"], **cut})
    if stored["success"]:
        return ToolResult(ok=True, data=stored.get("data"))
    return ToolResult(ok=False, error=stored.get("error"))


def _from_store(row: StoredTask, clock: Clock) -> BackgroundTask:
    """A stored task as the tools and routes read one: its times on this node's trio clock."""
    now = trio.current_time()
    started = now - (clock.now() - row.started_at).total_seconds()
    finished = None
    if row.finished_at is not None:
        finished = started + (row.finished_at - row.started_at).total_seconds()
    task = BackgroundTask(
        id=row.id,
        session_id=row.session_key,
        owner=row.owner,
        tool=row.tool,
        params={},
        started_at=_iso(row.started_at),
        started=started,
        status=row.state,
        result=_result_of(row.result),
        finished=finished,
        started_on=row.started_at,
        stored=True,
    )
    if row.state != "running":
        task.done.set()
    return task


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


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
        return _from_store(row, self.clock)

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
                    mine[row.id] = _from_store(row, self.clock)
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
            started_at=_iso(now),
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
                    result=_stored_result(task.result),
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


class LostTasks:
    """Closes as ``lost`` the running tasks of node incarnations that have ended, and tells
    their sessions, once.

    A pass (:meth:`close`) reads which incarnations run tasks and which lost tasks were not
    told yet (one read); closes the tasks of every incarnation that ``view`` shows ended
    (:func:`~runtime.membership.ended_by`) with one conditional ``UPDATE`` each, so however
    many nodes pass at once each task is closed by one; then tells each lost task's session
    its failure and marks it told. A tell that fails (the session's queue is full, the store
    did not answer) is tried again at the next pass, by this node or another; the notice
    carries the idempotency key ``background-lost:<task id>``, so a session told twice (two
    nodes passing at once over an untold task) stores it once.

    Args:
        store: the node's store.
        clock: the node's clock (``finished_at`` of the tasks it closes).
        tell: ``async (session_key, Inject)``: delivers the notice, on this node or another.
    """

    def __init__(
        self, store: Store, clock: Clock, tell: Callable[[str, Any], Awaitable[Any]]
    ) -> None:
        self.store = store
        self.clock = clock
        self.tell = tell

    async def close(self, view: ClusterView) -> list[StoredTask]:
        """One pass over ``view`` (a fresh or older ``store.list_nodes()``: an incarnation it
        shows ended never comes back). Returns the tasks it closed.

        Raises:
            StoreError: the store did not answer (nothing is lost: the next pass redoes it).
        """
        running, untold = await self.store.run(LOOK, limit=_TELL_PER_PASS)
        pending = {(t.session_key, t.id): t for t in untold}
        closed: list[StoredTask] = []
        for node_id, epoch in running:
            current = ended_by(view, NodeRef(node_id, epoch))
            if current is None:
                continue
            why = _lost_because(current, epoch)
            result = ToolResult(ok=False, error={"code": "lost", "message": why})
            rows = await self.store.run(
                CLOSE_LOST,
                node_id=node_id,
                node_epoch=epoch,
                result=_stored_result(result),
                now=self.store.db_time(self.clock.now()),
            )
            if rows:
                log.warning(
                    "closed %d background task(s) of node %r epoch %d as lost (%s): %s",
                    len(rows),
                    node_id,
                    epoch,
                    why,
                    ", ".join(f"{t.id} (session {t.session_key})" for t in rows),
                )
            closed.extend(rows)
            pending.update({(t.session_key, t.id): t for t in rows})
        for task in sorted(pending.values(), key=lambda t: (t.finished_at, t.id)):
            await self._tell(task)
        return closed

    async def _tell(self, task: StoredTask) -> None:
        notice = Inject(
            source="notification",
            content=lost_text(task),
            payload={"background_tasks": [task.id]},
            idempotency_key=f"background-lost:{task.id}",
        )
        try:
            await self.tell(task.session_key, notice)
        except NotFound:
            pass  # the session is gone: nobody to tell
        except Exception as exc:
            log.warning(
                "telling session %s that background task %s was lost failed (tried again at"
                " the next sweep): %s",
                task.session_key,
                task.id,
                exc,
            )
            return
        await self.store.run(
            MARK_TOLD,
            session_key=task.session_key,
            id=task.id,
            now=self.store.db_time(self.clock.now()),
        )


def _lost_because(current: NodeRecord, epoch: int) -> str:
    if current.epoch > epoch:
        return (
            f"lost: node {current.id!r} epoch {epoch} ended before the task finished (the node"
            f" started again as epoch {current.epoch})"
        )
    return f"lost: node {current.id!r} stopped before the task finished"
