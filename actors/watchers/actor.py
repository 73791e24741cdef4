"""Watchers: run a tool on an interval, silently, and tell the session only what matters.

A watcher belongs to a session (and its owner). Every ``interval`` seconds (5–3,600) it runs its
tool through the tool registry — policies apply exactly as for a direct call — and an
escalation strategy decides whether the result is worth a notification.

This module holds ``WatcherActor`` itself: how it answers its messages, a watcher's lifecycle
(start, pause, resume, stop) and the timer wheel that runs the checks. The rest of the actor
lives beside it, each part in its own module:

* ``spec.py`` — the messages, strategies and bounds, ``validate_spec``, backoff and timeouts.
* ``state.py`` — ``Watcher``: one watcher's state, history ring and views.
* ``escalation.py`` — the strategies, debounce, cooldown, the notification and its delivery
  (``EscalationMixin``).
* ``persistence.py`` — the store: write-through, write-behind, reload (``PersistenceMixin``).
* ``cluster.py`` — several nodes on one store: which node checks which watcher, handovers,
  controls through any node (``ClusterMixin``; idle on one node).

The names other modules imported from here before that split (the watch tools' bounds among
them) are still importable from here.

**Timing.** Checks are indexed by one ``TimerWheel``; one task sleeps until its next deadline
and starts what is due, each check in its own short-lived task under a ``CapacityLimiter``
(``MAX_CONCURRENT_CHECKS``). An idle actor with 10,000 watchers has two sleeping tasks (the
wheel and the persister), not 10,000. A new watcher checks at once, then every interval, on a
fixed grid (a slow check does not make the next one drift). A check may take at most
``check_timeout(interval)``; longer is an error.

It is over 400 lines because the mailbox's messages (start, pause, resume, stop, list) and the
wheel that runs the checks share the watchers' index and the per-watcher epochs that keep a stale
check from landing; the escalation, persistence and cluster halves are mixins of their own.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.actors.sessions.ids import public_id
from turnstile.actors.watchers.base import _Outbox
from turnstile.actors.watchers.cluster import LOCAL, ClusterMixin, WatcherShare
from turnstile.actors.watchers.escalation import EscalationMixin, notification_text
from turnstile.actors.watchers.persistence import INDEX, NAMESPACE, PersistenceMixin, index_key
from turnstile.actors.watchers.spec import (
    DEFAULT_INTERVAL,
    MAX_BATCH_SIZE,
    MAX_COOLDOWN_SECONDS,
    MAX_DEBOUNCE,
    MAX_INTERVAL,
    MAX_LABEL_CHARS,
    MIN_INTERVAL,
    STRATEGIES,
    DropSessionWatchers,
    GetWatcher,
    ListWatchers,
    PauseWatcher,
    ResumeWatcher,
    StartWatcher,
    StopWatcher,
    WatcherHistory,
    _Scoped,
    backoff_delay,
    check_timeout,
    validate_spec,
)
from turnstile.actors.watchers.state import (
    HISTORY_CHUNKS,
    HISTORY_SIZE,
    Watcher,
)
from turnstile.runtime import tracing
from turnstile.runtime.actor import Actor
from turnstile.runtime.clock import Clock
from turnstile.runtime.codec import Message
from turnstile.runtime.errors import InvalidArgument, NotFound
from turnstile.runtime.store import Store
from turnstile.runtime.timerwheel import TimerWheel

__all__ = [
    "STRATEGIES",
    "BeginChecks",
    "WatcherActor",
    "Watcher",
    "StartWatcher",
    "StopWatcher",
    "PauseWatcher",
    "ResumeWatcher",
    "GetWatcher",
    "ListWatchers",
    "WatcherHistory",
    "DropSessionWatchers",
    "notification_text",
    "backoff_delay",
    "check_timeout",
    # Imported from here by the watch tools and the tests before the split; they live in
    # spec.py, state.py and persistence.py now.
    "MIN_INTERVAL",
    "MAX_INTERVAL",
    "DEFAULT_INTERVAL",
    "MAX_LABEL_CHARS",
    "MAX_BATCH_SIZE",
    "MAX_DEBOUNCE",
    "MAX_COOLDOWN_SECONDS",
    "HISTORY_SIZE",
    "NAMESPACE",
]

log = logging.getLogger("turnstile.watcher")

#: Checks running at once, across every watcher.
MAX_CONCURRENT_CHECKS = 64


class BeginChecks(Message, tag="begin_checks", kw_only=True):
    """Start checking: the wheel runs. A watcher actor spawned ``held`` runs no check before
    it; the watchers feature sends it in its ``open``, once every feature is ready. Answers
    None; a second one changes nothing."""


class WatcherActor(ClusterMixin, EscalationMixin, PersistenceMixin, Actor):
    """Owns every watcher (with several nodes, checks this node's share and reaches the
    others' through the store: ``cluster.py``). See the module docstring.

    Args:
        run_tool: ``async (session_id, owner, tool, params) -> ToolResult`` — the registry's
            call (``watchers.tools.watch_runner(registry)`` also refuses tools whose policy has
            become APPROVE or BLOCK since the watcher started).
        publish: ``async (session_id, message)`` — tells a session actor (``Inject``,
            ``Publish``).
        store: where watchers persist (key-value namespace ``watchers``).
        clock: wall time for persisted times and cooldowns; trio's clock for the wheel.
        max_watchers_per_session: running and paused watchers one session may have.
        persist_interval: check results are flushed at most this often (seconds).
        max_concurrent_checks: checks in flight at once, over every watcher.
        share: several nodes on one store: which watchers this node checks (the node's
            ``Membership``; ``cluster.py``). None: one node, which checks every watcher.
        held: load the watchers at start but check none until told :class:`BeginChecks` (a
            node spawns it so in its features' ``start`` and begins it in their ``open``);
            False: check from the start (a restarted incarnation of an actor that had begun;
            tests).
    """

    uses_nursery = True

    def __init__(
        self,
        run_tool: Callable[[str, str, str, dict[str, Any]], Awaitable[ToolResult]],
        publish: Callable[[str, Any], Awaitable[None]],
        store: Store,
        clock: Clock,
        *,
        max_watchers_per_session: int = 20,
        persist_interval: float = 1.0,
        max_concurrent_checks: int = MAX_CONCURRENT_CHECKS,
        notify=None,
        share: WatcherShare | None = None,
        held: bool = False,
    ) -> None:
        self.share = share
        self.held = held
        self._begun = False
        self.run_tool = run_tool
        self.publish = publish
        #: ``async (session_id, owner, channel, text, **fields)`` — the notifier, for watchers
        #: whose ``notify_config.output_channel`` names a channel other than the session.
        self.notify = notify
        self.store = store
        self.clock = clock
        self.max_per_session = max_watchers_per_session
        self.persist_interval = persist_interval
        self.wheel = TimerWheel(now=trio.current_time())
        self.watchers: dict[str, Watcher] = {}
        self.by_session: dict[str, set[str]] = {}
        self._wake = trio.Event()
        self._sleep_until = math.inf
        self._limiter = trio.CapacityLimiter(max_concurrent_checks)
        self._dirty: set[str] = set()
        self._dirty_chunks: set[tuple[str, int]] = set()
        self._dirty_event = trio.Event()
        self._write_lock = trio.Lock()
        self._outbox: dict[str, _Outbox] = {}
        #: Counters for benches and status: checks run, escalations, flushes, items flushed.
        self.stats = {"checks": 0, "escalations": 0, "flushes": 0, "flushed_items": 0}
        #: Recent lateness samples (seconds from due to start of the check).
        self.lateness: deque[float] = deque(maxlen=100_000)
        if share is not None:
            self._cluster_init()

    # -- lifecycle --

    async def on_start(self) -> None:
        if self.share is None:
            await self._load()
        else:
            await self._cluster_start()
        self._tasks.start_soon(self._persist_loop, name="watcher persister")
        if not self.held:
            self._begin()

    def _begin(self) -> None:
        """Start the wheel: from now on, due checks run (those of watchers started or resumed
        before it are in the wheel already)."""
        if not self._begun:
            self._begun = True
            self._tasks.start_soon(self._run, name="watcher wheel")

    async def on_stop(self) -> None:
        with trio.move_on_after(5, shield=True):
            await self._flush()
            for session_id in list(self._outbox):
                box = self._outbox.pop(session_id)
                await self._send(session_id, box)

    # -- messages --

    async def receive(self, message: Any) -> Any:
        if self.share is not None:
            answer = await self._cluster_receive(message)
            if answer is not LOCAL:
                return answer
        match message:
            case BeginChecks():
                return self._begin()
            case StartWatcher():
                return await self._start(message)
            case StopWatcher():
                watcher = self._get(message)
                view = watcher.summary_view()
                await self._stop([watcher])
                view["status"] = "stopped"
                view["next_check_at"] = None
                return view
            case PauseWatcher():
                return await self._pause(self._get(message))
            case ResumeWatcher():
                return await self._resume(self._get(message))
            case GetWatcher():
                count = max(0, min(HISTORY_SIZE, message.history))
                return self._get(message).status_view(count)
            case WatcherHistory():
                return _history(self._get(message), message.last_n)
            case ListWatchers():
                return self._list(message)
            case DropSessionWatchers():
                mine = [self.watchers[w] for w in self.by_session.get(message.session_id, ())]
                await self._stop(mine, announce=False)
                return len(mine)
        raise InvalidArgument(f"watcher actor cannot handle {type(message).__name__}")

    async def _cluster_receive(self, message: Any) -> Any:
        """Several nodes: what another node holds is read from the store, or asked of it."""
        match message:
            case _Scoped() if message.watcher_id in self.watchers:
                return LOCAL
            case StopWatcher():
                return await self._forward(message, "stop")
            case PauseWatcher():
                return await self._forward(message, "pause")
            case ResumeWatcher():
                return await self._forward(message, "resume")
            case GetWatcher():
                count = max(0, min(HISTORY_SIZE, message.history))
                return (await self._stored(message)).status_view(count)
            case WatcherHistory():
                return _history(await self._stored(message), message.last_n)
            case ListWatchers():
                if message.session_id is None and message.owner is None:
                    return LOCAL  # refused as on one node
                found = await self._list_stored(message.session_id, message.owner)
                return self._sorted_views(found)
            case DropSessionWatchers():
                return await self._drop_everywhere(message.session_id)
        return LOCAL

    def _get(self, msg: _Scoped) -> Watcher:
        watcher = self.watchers.get(msg.watcher_id)
        if (
            watcher is None
            or (msg.session_id is not None and watcher.session_id != msg.session_id)
            or (msg.owner is not None and watcher.owner != msg.owner)
        ):
            raise NotFound(f"no watcher with id {msg.watcher_id!r}")
        return watcher

    def _list(self, msg: ListWatchers) -> list[dict[str, Any]]:
        if msg.session_id is None and msg.owner is None:
            raise InvalidArgument("list watchers of a session or of an owner", field="session_id")
        if msg.session_id is not None:
            found = [self.watchers[w] for w in self.by_session.get(msg.session_id, ())]
        else:
            found = list(self.watchers.values())
        if msg.owner is not None:
            found = [w for w in found if w.owner == msg.owner]
        return self._sorted_views(found)

    @staticmethod
    def _sorted_views(found: list[Watcher]) -> list[dict[str, Any]]:
        found.sort(key=lambda w: (w.state != "running", w.created_at, w.id))
        return [w.summary_view() for w in found]

    def _add(self, watcher: Watcher) -> None:
        self.watchers[watcher.id] = watcher
        self.by_session.setdefault(watcher.session_id, set()).add(watcher.id)

    async def _start(self, msg: StartWatcher) -> dict[str, Any]:
        config, expr = validate_spec(
            msg.tool, msg.params, msg.interval, msg.label, msg.notify_when, msg.notify_config
        )
        if self.share is None:  # this actor is the only writer: its count is the store's
            count = len(self.by_session.get(msg.session_id, ()))
            if count >= self.max_per_session:
                raise self._full(count)
        watcher = Watcher(
            id=uuid.uuid4().hex[:12],
            session_id=msg.session_id,
            owner=msg.owner,
            tool=msg.tool,
            params=msg.params,
            interval=float(msg.interval),
            label=msg.label,
            notify_when=msg.notify_when,
            notify_config=config,
            created_at=self.clock.now().timestamp(),
        )
        watcher.expr = expr
        if msg.notify_when == "on_error":
            watcher.confirmed = watcher.notified = "ok"
        elif msg.notify_when == "on_threshold":
            watcher.confirmed = watcher.notified = "false"
        if self.share is not None and not self.share.owns(watcher.id):
            # another node checks it: its row, then a request that it adopt it (at once)
            watcher.next_check_at = watcher.created_at
            await self._save_first(watcher)
            self._post(watcher.session_id, self._lifecycle(watcher, "started"))
            await self._request(watcher.id, "start")
            return watcher.start_view()
        if self.share is not None:
            watcher.holder = self._me
        self._add(watcher)
        try:
            if self.share is None:
                await self._save_now(watcher)
            else:
                await self._save_first(watcher)
        except BaseException:
            self._forget(watcher)
            raise
        self._post(watcher.session_id, self._lifecycle(watcher, "started"))
        self._schedule(watcher, 0.0)  # the first check runs at once
        return watcher.start_view()

    async def _pause(self, watcher: Watcher) -> dict[str, Any]:
        if watcher.state == "running":
            watcher.state = "paused"
            watcher.epoch += 1
            if watcher.handle is not None:
                self.wheel.cancel(watcher.handle)
                watcher.handle = None
            watcher.next_check_at = None
            await self._save_now(watcher)
            self._post(watcher.session_id, self._lifecycle(watcher, "paused"))
        return watcher.summary_view()

    async def _resume(self, watcher: Watcher) -> dict[str, Any]:
        if watcher.state == "paused":
            watcher.state = "running"
            watcher.epoch += 1
            self._schedule(watcher, watcher.delay())
            await self._save_now(watcher)
            self._post(watcher.session_id, self._lifecycle(watcher, "resumed"))
        return watcher.summary_view()

    async def _stop(self, watchers: list[Watcher], announce: bool = True) -> None:
        """Delete these watchers' rows, then forget them. A refused delete leaves them held
        and running, so that asking again stops them: they were forgotten first before, and
        the session delete's retry found nothing to delete and left the rows (issue 23's crash
        harness, ``--fault fail``, scenario ``delete``). The write lock keeps a flush from
        writing them back in between."""
        keys = [
            key
            for w in watchers
            for key in (w.id, *(f"{w.id}/h{k:02d}" for k in range(HISTORY_CHUNKS)))
        ]
        async with self._write_lock:
            items = [(NAMESPACE, key) for key in keys]
            if self.share is not None and watchers:
                items += [(INDEX, index_key(w.session_id, w.id)) for w in watchers]
            # one commit: a crash between the row and its index entry left the entry behind
            # (issue 23's crash harness, scenario ``delete`` on PostgreSQL)
            await self.store.kv_delete_items(items)
            for watcher in watchers:
                self._forget(watcher)
                self._dirty.discard(watcher.id)
            self._dirty_chunks = {c for c in self._dirty_chunks if c[0] in self.watchers}
            if self.share is not None and watchers:
                self._gone.update(w.id for w in watchers)
        if announce:
            for watcher in watchers:
                watcher.state = "stopped"
                self._post(watcher.session_id, self._lifecycle(watcher, "stopped"))

    def _forget(self, watcher: Watcher) -> None:
        watcher.epoch += 1
        if watcher.handle is not None:
            self.wheel.cancel(watcher.handle)
            watcher.handle = None
        if self.watchers.get(watcher.id) is watcher:
            del self.watchers[watcher.id]
        ids = self.by_session.get(watcher.session_id)
        if ids is not None:
            ids.discard(watcher.id)
            if not ids:
                del self.by_session[watcher.session_id]

    # -- the wheel --

    def _schedule(self, watcher: Watcher, delay: float) -> None:
        if watcher.handle is not None:
            self.wheel.cancel(watcher.handle)
        deadline = trio.current_time() + max(0.0, delay)
        watcher.next_check_at = self.clock.now().timestamp() + max(0.0, delay)
        watcher.handle = self.wheel.schedule(deadline, watcher.id)
        if deadline < self._sleep_until and not self._wake.is_set():
            self._wake.set()

    async def _run(self) -> None:
        async with trio.open_nursery() as checks:
            while True:
                deadline = self.wheel.next_deadline()
                self._sleep_until = math.inf if deadline is None else deadline
                with trio.move_on_at(self._sleep_until):
                    await self._wake.wait()
                self._wake = trio.Event()
                self._sleep_until = -math.inf  # awake: schedule() need not wake us
                now = trio.current_time()
                for watcher_id in self.wheel.advance(now):
                    watcher = self.watchers.get(watcher_id)
                    if watcher is None or watcher.state != "running":
                        continue
                    due = watcher.handle.deadline if watcher.handle is not None else now
                    watcher.handle = None
                    token = object()
                    try:  # the checks due together start together, not one per trio batch
                        self._limiter.acquire_on_behalf_of_nowait(token)
                    except trio.WouldBlock:
                        await self._limiter.acquire_on_behalf_of(token)
                    checks.start_soon(
                        self._check, watcher, watcher.epoch, due, token, name=f"watch {watcher_id}"
                    )

    async def _check(self, watcher: Watcher, epoch: int, due: float, token: object) -> None:
        """One check of ``watcher``: a span ``watcher check`` of its own when the node traces
        (its tool call is its child; what it escalates is stored under it)."""
        if not tracing.active():
            return await self._check_now(watcher, epoch, due, token)
        attributes = {
            "turnstile.watcher.id": watcher.id,
            "turnstile.watcher.tool": watcher.tool,
            "turnstile.session.id": public_id(watcher.session_id),
            "turnstile.watcher.late_seconds": max(0.0, trio.current_time() - due),
        }
        with tracing.span("watcher check", attributes=attributes):
            await self._check_now(watcher, epoch, due, token)

    async def _check_now(self, watcher: Watcher, epoch: int, due: float, token: object) -> None:
        started = trio.current_time()
        self.lateness.append(started - due)
        timeout = check_timeout(watcher.interval)
        try:
            result: ToolResult | None = None
            with trio.move_on_after(timeout):
                result = await self.run_tool(
                    watcher.session_id, watcher.owner, watcher.tool, watcher.params
                )
            if result is None:
                result = ToolResult(
                    ok=False,
                    error={"code": "timeout", "message": f"the check took over {timeout:g}s"},
                )
        except Exception as exc:  # the registry turns tool errors into results; this is a bug
            log.exception("watcher %s: check failed", watcher.id)
            result = ToolResult(ok=False, error={"code": "internal", "message": type(exc).__name__})
        finally:
            self._limiter.release_on_behalf_of(token)
        self.stats["checks"] += 1
        if self.watchers.get(watcher.id) is not watcher or watcher.epoch != epoch:
            return  # stopped, paused or resumed meanwhile: this result belongs to nobody
        self._apply(watcher, result, round((trio.current_time() - started) * 1000, 1))
        delay = watcher.delay()
        self._schedule(watcher, max(0.0, due + delay - trio.current_time()))


def _history(watcher: Watcher, last_n: int) -> dict[str, Any]:
    """``watch_history``'s answer: the newest ``last_n`` checks of ``watcher``."""
    if not 1 <= last_n <= HISTORY_SIZE:
        raise InvalidArgument(f"last_n must be from 1 to {HISTORY_SIZE}", field="last_n")
    entries = watcher.history_view(last_n)
    return {
        "watcher_id": watcher.id,
        "entries": entries,
        "count": len(entries),
        "total_checks": watcher.check_count,
    }
