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

**Told once, even across a crash.** A task's end is stored with the idempotency key of the
notice that will tell it (``notice``: ``background:<id>`` of the batch's first task), the notice
is asked of the session (stored there, or folded into its turn, before the answer) under that
key, and only then is the task marked told (``notified_at``). A node that dies anywhere between
leaves the task ended and untold; the sweep after its end (``LostTasks``, at the next start on
one node) tells it under the same key, so the session stores the notice once.

**The limit holds across nodes.** ``max_running_per_session`` counts the session's running rows
in the store, in the transaction that inserts the new one (``queries.START``): starts at once
through several nodes never pass it.

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
from turnstile.actors.execution.queries import DROP_SESSION, FINISH, GET, LIST, MARK_TOLD, START
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
        self._outbox: dict[str, _Batch] = {}

    async def receive(self, message: Any) -> Any:
        match message:
            case StartTask():
                return await self._start(message)
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

    async def _start(self, msg: StartTask) -> BackgroundTask:
        """Record and start a task, unless its session is at ``max_running`` running tasks.

        Raises:
            LimitExceeded: the session is at the limit (counted in the store, on every node,
                when there is one); nothing was started.
            StoreError: the store did not record it; nothing was started.
        """
        running = sum(
            1
            for t in self.tasks.values()
            if t.session_id == msg.session_id and t.status == "running"
        )
        if running >= self.max_running:
            raise self._full(running)
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
        if self.nursery is None:  # uses_nursery: there while the actor runs
            raise RuntimeError("the background actor is not running")
        found = await self._record_start(task)
        if found is not None:
            raise self._full(found)
        self.tasks[task.id] = task
        self._forget_old(msg.session_id)
        self.nursery.start_soon(self._run, task, name=f"background {task.id}")
        return task

    def _full(self, running: int) -> LimitExceeded:
        return LimitExceeded(
            f"session has {running} background tasks running (limit {self.max_running})"
        )

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
        # Cancelled with the node (a shutdown) ends here, its row still ``running``: once the
        # node is stopped, whoever sweeps next closes it as lost and tells the session.
        if task.scope.cancelled_caught:
            task.status = "cancelled"
        task.finished = trio.current_time()
        task.done.set()
        batch = self._batch_for(task)
        ended = await self._record_end(task, batch.key)
        batch.ended(task, told_here=ended)
        if batch.tasks[0] is task:
            await self._notify(batch)

    async def _record_start(self, task: BackgroundTask) -> int | None:
        """One transaction: the count of the session's running tasks and the ``INSERT``.
        None when recorded (or there is nothing to record it in); else how many run, and
        nothing was written."""
        ref = self.node() if self.node is not None else None
        if self.store is None or ref is None:
            return None
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
        found = await self.store.run(
            START, task=started, keep=KEEP_FINISHED, limit=self.max_running
        )
        if found is None:
            task.recorded = True
        return found

    def _batch_for(self, task: BackgroundTask) -> _Batch:
        """The session's open batch, which ``task`` joins, or a new one it opens (and whose
        notice it sends once the window closes)."""
        batch = self._outbox.get(task.session_id)
        if batch is None:
            batch = self._outbox[task.session_id] = _Batch(f"background:{task.id}")
        batch.tasks.append(task)
        batch.pending += 1
        if batch.all_ended.is_set():  # the ends stored so far are not all of them now
            batch.all_ended = trio.Event()
        return batch

    async def _record_end(self, task: BackgroundTask, notice: str) -> bool:
        """One ``UPDATE`` of the task's row, with the key of the notice that tells it; whether
        its session is to be told here (False: the row was closed as lost by another node
        meanwhile, which tells the session, or it is gone with its session). A refused write is
        tried again, every half second, for up to ``_WRITE_GRACE`` (then the row stays
        ``running`` until this node's end closes it as lost)."""
        if self.store is None or not task.recorded:
            return True
        with trio.move_on_after(_WRITE_GRACE, shield=True):
            while True:
                try:
                    ended = await self.store.run(
                        FINISH,
                        session_key=task.session_id,
                        id=task.id,
                        state=task.status,
                        result=stored_result(task.result),
                        now=self.store.db_time(self.clock.now()),
                        notice=notice,
                    )
                    break
                except StoreError as exc:
                    log.warning(
                        "background task %s: recording its end failed (trying again): %s",
                        task.id,
                        exc,
                    )
                    await trio.sleep(0.5)
            if not ended:
                log.warning(
                    "background task %s ended (%s) after it was closed as lost or deleted:"
                    " its session is not told again",
                    task.id,
                    task.status,
                )
            return ended
        log.warning("background task %s: its end was not recorded", task.id)
        return True

    async def _notify(self, batch: _Batch) -> None:
        """Tell the session of the tasks that ended within ``BATCH_WINDOW`` of the first, once.

        The notice is asked of the session (stored there before the answer) under the batch's
        key, then its tasks are marked told; a crash between leaves them untold for the sweep,
        which tells them under the same key (``LostTasks``). A task whose session was deleted
        (``DropSessionTasks``) notifies nobody.
        """
        first = batch.tasks[0]
        if self.tasks.get(first.id) is not first:
            self._outbox.pop(first.session_id, None)
            return
        await trio.sleep(BATCH_WINDOW)
        if self._outbox.get(first.session_id) is not batch:
            return  # the session was deleted meanwhile (``DropSessionTasks``)
        del self._outbox[first.session_id]  # a task ending from now on opens the next batch
        with trio.CancelScope(shield=True):
            await batch.all_ended.wait()  # their ends are stored (or refused)
            told = [t for t in batch.tasks if t.id in batch.told_here]
            if not told:
                return
            now = trio.current_time()
            text = "\n\n".join(notification_text(t, now) for t in told)
            notice = Inject(
                source="notification",
                content=text,
                payload={"background_tasks": [t.id for t in told]},
                idempotency_key=batch.key,
            )
            if not await self._tell(first.session_id, notice, told):
                return
            recorded = [t.id for t in told if t.recorded]
            if self.store is None or not recorded:
                return
            with trio.move_on_after(_WRITE_GRACE):
                try:
                    await self.store.run(
                        MARK_TOLD,
                        session_key=first.session_id,
                        ids=recorded,
                        now=self.store.db_time(self.clock.now()),
                    )
                except StoreError as exc:
                    log.warning(
                        "background task(s) %s: recording that session %s was told failed (a"
                        " sweep tells it again, under the same key: stored once): %s",
                        ", ".join(recorded),
                        first.session_id,
                        exc,
                    )

    async def _tell(self, session_id: str, notice: Inject, told: list[BackgroundTask]) -> bool:
        """Ask the session to store ``notice``; whether it did. A store that refuses it is
        asked again every half second for up to ``_WRITE_GRACE`` (the notice's key makes it
        one notice however often it is asked): the crash harness's ``--fault fail`` found a
        single refused commit left the task untold while its node lived on, since only the
        sweep after a node's end tells what a node did not."""
        deadline = trio.current_time() + _WRITE_GRACE
        while True:
            try:
                await self.publish(session_id, notice)
                return True
            except NotFound:
                return False  # the session is gone, and its tasks with it
            except StoreError as exc:
                if trio.current_time() + 0.5 < deadline:
                    log.info("telling session %s of its background tasks: %s (again)", session_id,
                             exc)  # fmt: skip
                    await trio.sleep(0.5)
                    continue
                failed: Exception = exc
            except Exception as exc:
                failed = exc
            log.warning(
                "telling session %s of background task(s) %s failed (told after this"
                " node's end, or by a later sweep): %s",
                session_id,
                ", ".join(t.id for t in told),
                failed,
            )
            return False


class _Batch:
    """The tasks of one session that end within one ``BATCH_WINDOW``: one notice, one key."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.tasks: list[BackgroundTask] = []
        self.pending = 0
        self.told_here: set[str] = set()
        self.all_ended = trio.Event()

    def ended(self, task: BackgroundTask, *, told_here: bool) -> None:
        """``task``'s end is stored; ``told_here``: its session is told by this batch."""
        if told_here:
            self.told_here.add(task.id)
        self.pending -= 1
        if self.pending == 0:
            self.all_ended.set()
