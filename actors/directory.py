"""The session directory: the gateway's ``SessionBackend``, on top of session actors.

It checks ownership (someone else's session is ``NotFound``, so ids do not leak), enforces the
per-user and per-session limits, and turns each request into a message to the session's
virtual actor. Reads that need no actor (events, history) go straight to the store.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from actors.approvals import ApprovalDesk
from actors.background import CancelTask, GetTask, ListTasks
from actors.session import (
    POLICIES,
    Attach,
    DeleteSession,
    Detach,
    SetPolicy,
    StopTurn,
    Submit,
    ToolCaller,
    load_history,
)
from runtime.actor import ActorRef
from runtime.agents.base import HistoryEntry, ToolResult
from runtime.errors import BlockedByAutomations, Busy, InvalidArgument, LimitExceeded, NotFound
from runtime.gateway.backend import Attached, Submitted, Subscriber
from runtime.metrics import Metrics
from runtime.registry import Registry
from runtime.store import EventRecord, Job, JobRun, Session, Store

__all__ = ["RecallHooks", "SessionDirectory"]

#: Transcript entries ``GET /sessions/{id}/history`` returns at most.
HISTORY_LIMIT = 1000
_OWNER_CACHE_MAX = 100_000


@dataclass(frozen=True)
class RecallHooks:
    """The recall operations behind ``/sessions/{id}/recall`` (implemented in ``tools``)."""

    get: Callable[[str], Awaitable[dict[str, Any] | None]]
    cancel: Callable[[str], Awaitable[dict[str, Any]]]
    skip: Callable[[str], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class WatcherHooks:
    """The watcher operations behind the HTTP watcher endpoints (implemented in ``tools``).

    ``start(session_id, owner, spec)``, ``list(session_id, owner)``, and
    ``get|stop|pause|resume(watcher_id, owner)`` (another user's watcher is ``NotFound``);
    ``drop_session(session_id)`` stops a deleted session's watchers.
    """

    start: Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]
    list: Callable[[str, str], Awaitable[dict[str, Any]]]
    get: Callable[[str, str], Awaitable[dict[str, Any]]]
    stop: Callable[[str, str], Awaitable[dict[str, Any]]]
    pause: Callable[[str, str], Awaitable[dict[str, Any]]]
    resume: Callable[[str, str], Awaitable[dict[str, Any]]]
    drop_session: Callable[[str], Awaitable[int]]


class SessionDirectory:
    """Implements ``runtime.gateway.SessionBackend``.

    Args:
        store: the node's store.
        registry: where ``session:<id>`` actors live.
        tools: runs tools for ``call`` frames.
        max_sessions_per_user: creation beyond it is ``LimitExceeded``.
        metrics: where request counts go.
        automations: ``async (session_id) -> list[dict]``: the scheduled jobs bound to a session
            (deleting it is blocked while there are any, unless confirmed).
        cancel_automations: ``async (session_id) -> list[dict]``: cancels them.
    """

    def __init__(
        self,
        store: Store,
        registry: Registry,
        tools: ToolCaller,
        *,
        max_sessions_per_user: int,
        metrics: Metrics,
        automations=None,
        cancel_automations=None,
        recalls: RecallHooks | None = None,
        approvals: ApprovalDesk | None = None,
        notifier=None,
        watchers: WatcherHooks | None = None,
        background: ActorRef | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.tools = tools
        self.max_sessions_per_user = max_sessions_per_user
        self._metrics = metrics
        self._owners: dict[str, str] = {}
        self._automations = automations
        self._cancel_automations = cancel_automations
        self._recalls = recalls
        self._approvals = approvals
        self._notifier = notifier
        self._watchers = watchers
        self._background = background

    async def ping(self) -> None:
        await self.store.ping()

    def metrics(self) -> dict[str, float]:
        return self._metrics.snapshot()

    # -- ownership --

    async def _owned(self, user: str, session_id: str) -> None:
        owner = self._owners.get(session_id)
        if owner is None:
            try:
                owner = (await self.store.get_session(session_id)).owner
            except NotFound:
                raise NotFound(f"no session with id {session_id!r}") from None
            if len(self._owners) >= _OWNER_CACHE_MAX:
                self._owners.clear()
            self._owners[session_id] = owner
        if owner != user:
            raise NotFound(f"no session with id {session_id!r}")

    async def _ask(self, session_id: str, message: Any) -> Any:
        ref = await self.registry.resolve(f"session:{session_id}")
        if ref.mailbox_depth >= ref.mailbox_capacity:
            raise Busy(f"session {session_id!r} has too many messages waiting; try again")
        return await ref.ask(message)

    # -- sessions --

    async def create_session(
        self,
        user: str,
        *,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        policy: str = "enqueue",
    ) -> Session:
        if policy not in POLICIES:
            raise InvalidArgument(
                f"policy must be one of {', '.join(POLICIES)}, got {policy!r}", field="policy"
            )
        mine = await self.store.list_sessions(owner=user, limit=self.max_sessions_per_user)
        if len(mine) >= self.max_sessions_per_user:
            raise LimitExceeded(
                f"user {user!r} already has {len(mine)} sessions "
                f"(limit {self.max_sessions_per_user})"
            )
        session_id = session_id or uuid.uuid4().hex
        session = await self.store.create_session(
            session_id, user, metadata=metadata or {}, policy=policy
        )
        self._owners[session_id] = user
        self._metrics.inc("turnstile_sessions_created_total")
        return session

    async def list_sessions(
        self, user: str, *, limit: int = 100, after_id: str | None = None
    ) -> list[Session]:
        return await self.store.list_sessions(owner=user, limit=limit, after_id=after_id)

    async def get_session(self, user: str, session_id: str) -> Session:
        await self._owned(user, session_id)
        return await self.store.get_session(session_id)

    async def delete_session(self, user: str, session_id: str, *, confirm: bool = False) -> None:
        await self._owned(user, session_id)
        if self._automations is not None:
            bound = await self._automations(session_id)
            if bound and not confirm:
                raise BlockedByAutomations(
                    f"session {session_id!r} has {len(bound)} scheduled job(s); "
                    "delete with confirm=true to remove them too",
                    bound,
                )
            if bound:
                await self._cancel_automations(session_id)
        await self._ask(session_id, DeleteSession())
        if self._watchers is not None:
            await self._watchers.drop_session(session_id)
        if self._notifier is not None:
            await self._notifier.discard_buffered(session_id)
        self._owners.pop(session_id, None)

    # -- turns --

    async def submit(
        self, user: str, session_id: str, content: str, payload: dict[str, Any] | None = None
    ) -> Submitted:
        await self._owned(user, session_id)
        submitted = await self._ask(
            session_id, Submit(source="user", content=content, payload=payload or {})
        )
        self._metrics.inc("turnstile_inputs_total")
        return submitted

    async def stop(self, user: str, session_id: str) -> bool:
        await self._owned(user, session_id)
        return await self._ask(session_id, StopTurn())

    async def set_policy(self, user: str, session_id: str, policy: str) -> str:
        await self._owned(user, session_id)
        return await self._ask(session_id, SetPolicy(policy=policy))

    # -- watching --

    async def attach(self, user: str, session_id: str, subscriber: Subscriber) -> Attached:
        await self._owned(user, session_id)
        attached = await self._ask(session_id, Attach(subscriber=subscriber))
        if self._notifier is not None:  # what was held while nobody watched, in order
            await self._notifier.deliver_buffered(session_id)
        return attached

    async def detach(self, user: str, session_id: str, subscriber: Subscriber) -> None:
        await self._owned(user, session_id)
        if self.registry.is_active(f"session:{session_id}"):
            await self._ask(session_id, Detach(subscriber=subscriber))

    async def read_events(
        self, user: str, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        await self._owned(user, session_id)
        return await self.store.read_events(session_id, after_seq=after_seq, limit=limit)

    async def history(self, user: str, session_id: str) -> list[HistoryEntry]:
        await self._owned(user, session_id)
        return await load_history(self.store, session_id, HISTORY_LIMIT)

    async def call_tool(
        self, user: str, session_id: str, tool: str, arguments: dict[str, Any]
    ) -> ToolResult:
        await self._owned(user, session_id)
        self._metrics.inc("turnstile_tool_calls_total")
        return await self.tools.call(session_id, user, tool, arguments)

    # -- jobs --

    async def list_jobs(self, user: str, session_id: str) -> list[Job]:
        await self._owned(user, session_id)
        return await self.store.list_jobs(session_id=session_id)

    async def get_job(self, user: str, job_id: str) -> tuple[Job, list[JobRun]]:
        try:
            job = await self.store.get_job(job_id)
            if job.session_id is None:
                raise NotFound(job_id)
            await self._owned(user, job.session_id)
        except NotFound:
            raise NotFound(f"no job with id {job_id!r}") from None
        return job, await self.store.list_runs(job_id, limit=100)

    # -- recalls --

    def _recall_hooks(self) -> RecallHooks:
        if self._recalls is None:
            raise NotFound("recalls are not enabled on this node")
        return self._recalls

    async def get_recall(self, user: str, session_id: str) -> dict[str, Any] | None:
        await self._owned(user, session_id)
        return await self._recall_hooks().get(session_id)

    async def cancel_recall(self, user: str, session_id: str) -> dict[str, Any]:
        await self._owned(user, session_id)
        return await self._recall_hooks().cancel(session_id)

    async def skip_recall(self, user: str, session_id: str) -> dict[str, Any]:
        await self._owned(user, session_id)
        return await self._recall_hooks().skip(session_id)

    # -- approvals --

    async def resolve_approval(self, user: str, approval_id: str, approved: bool) -> dict[str, Any]:
        if self._approvals is None:
            raise NotFound(f"no pending approval with id {approval_id!r}")
        return self._approvals.resolve(user, approval_id, approved)

    async def pending_approvals(self, user: str, session_id: str) -> list[dict[str, Any]]:
        await self._owned(user, session_id)
        return [] if self._approvals is None else self._approvals.pending(session_id)

    # -- watchers --

    def _watcher_hooks(self) -> WatcherHooks:
        if self._watchers is None:
            raise NotFound("watchers are not enabled on this node")
        return self._watchers

    async def start_watcher(
        self, user: str, session_id: str, spec: dict[str, Any]
    ) -> dict[str, Any]:
        await self._owned(user, session_id)
        return await self._watcher_hooks().start(session_id, user, spec)

    async def list_watchers(self, user: str, session_id: str) -> dict[str, Any]:
        await self._owned(user, session_id)
        return await self._watcher_hooks().list(session_id, user)

    async def watcher(self, user: str, watcher_id: str, action: str) -> dict[str, Any]:
        """``get``, ``stop``, ``pause`` or ``resume`` one of ``user``'s watchers."""
        hooks = self._watcher_hooks()
        return await getattr(hooks, action)(watcher_id, user)

    # -- background tasks --

    def _background_ref(self) -> ActorRef:
        if self._background is None:
            raise NotFound("background tasks are not enabled on this node")
        return self._background

    async def list_tasks(self, user: str, session_id: str) -> list[dict[str, Any]]:
        await self._owned(user, session_id)
        tasks = await self._background_ref().ask(ListTasks(session_id=session_id))
        now = trio.current_time()
        return [t.view(now) for t in tasks]

    async def task(self, user: str, session_id: str, task_id: str) -> dict[str, Any]:
        await self._owned(user, session_id)
        task = await self._background_ref().ask(GetTask(session_id=session_id, task_id=task_id))
        return task.view(trio.current_time())

    async def cancel_task(self, user: str, session_id: str, task_id: str) -> dict[str, Any]:
        await self._owned(user, session_id)
        cancelled = await self._background_ref().ask(
            CancelTask(session_id=session_id, task_id=task_id)
        )
        return {"task_id": task_id, "cancelled": cancelled}
