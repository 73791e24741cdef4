"""Supervisors: who runs actors, and what happens when one crashes.

Every actor runs as a task in a nursery owned by a supervisor, so there are no orphan tasks:
leaving ``open_supervisor`` stops every child. When handling a tell raises, the actor crashes,
a ``CrashReport`` naming the actor, the message type and the exception is logged and kept, and
the strategy decides what restarts:

* ``ONE_FOR_ONE`` — only the crashed actor; siblings never notice.
* ``ONE_FOR_ALL`` — every child; a sibling cut off mid-message gets that message redelivered.

A restarted actor is a fresh ``Actor`` object over the *same* mailbox: what was waiting is
handled by the new incarnation. The message that caused the crash is not redelivered.

Restart intensity: at most ``max_restarts`` restarts within ``within`` seconds (trio's clock).
One more crash and the supervisor gives up: with ``escalate=True`` (the default) it stops all
its children and raises ``SupervisorEscalation`` to its parent (a parent supervisor treats that
as the crash of a child); with ``escalate=False`` — what a registry of independent virtual
actors wants — intensity is counted per child, and only the offending child is given up on,
its pending asks failing with ``ActorCrashed``.

It is over 400 lines because spawning, restarting and giving up read and change the same children
and restart counts under one nursery; the restart rules can only be checked in one place.
"""

from __future__ import annotations

import enum
import logging
import traceback
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import trio

from turnstile.runtime.actor import Actor, ActorCell, ActorRef, Crash
from turnstile.runtime.errors import (
    ActorCrashed,
    ActorStopped,
    StoreUnavailable,
    SupervisorEscalation,
)

__all__ = ["Strategy", "CrashReport", "Supervisor", "open_supervisor"]

log = logging.getLogger("turnstile.supervisor")


class Strategy(enum.Enum):
    """Which children restart when one crashes."""

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"


@dataclass(frozen=True)
class CrashReport:
    """What a crash looked like, for logs, metrics and tests.

    Attributes:
        supervisor: the supervisor's name.
        actor: the crashed child's name.
        message_type: the type name of the message being handled, or None.
        during: what the actor was doing: ``handling Foo``, ``starting``, or
            ``running its own task``.
        error: the exception raised.
        traceback: the formatted traceback.
        at: trio's clock when it happened.
    """

    supervisor: str
    actor: str
    message_type: str | None
    during: str
    error: BaseException
    traceback: str
    at: float

    def __str__(self) -> str:
        return (
            f"{self.actor} crashed while {self.during}: {type(self.error).__name__}: {self.error}"
        )


class _RunOnce(Protocol):
    """One run of a child: ``ActorCell.run_incarnation`` or a nested ``Supervisor._run``."""

    def __call__(self, *, task_status: trio.TaskStatus[object]) -> Awaitable[None]: ...


class _Child:
    """One supervised child: an actor cell, or a nested supervisor (exactly one is set)."""

    __slots__ = ("name", "run_once", "restart", "scope", "restarts", "cell", "sub")

    def __init__(
        self,
        name: str,
        run_once: _RunOnce,
        restart: bool,
        cell: ActorCell | None,
        sub: Supervisor | None = None,
    ) -> None:
        self.name = name
        self.run_once = run_once
        self.restart = restart
        self.scope: trio.CancelScope | None = None
        self.restarts: deque[float] | None = None  # per-child intensity, made on first crash
        self.cell = cell
        self.sub = sub


class Supervisor:
    """Runs children and restarts them by strategy. Get one from ``open_supervisor``.

    Args:
        name: used in task names and crash reports.
        strategy: ``ONE_FOR_ONE`` or ``ONE_FOR_ALL``.
        max_restarts: restarts allowed within ``within`` seconds.
        within: the intensity window, in seconds.
        escalate: give up by escalating to the parent (True) or by dropping only the
            offending child (False; intensity then counts per child).
        on_crash: called with each ``CrashReport`` (for metrics); must not raise.
    """

    def __init__(
        self,
        name: str = "root",
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        *,
        max_restarts: int = 3,
        within: float = 5.0,
        escalate: bool = True,
        on_crash: Callable[[CrashReport], None] | None = None,
    ) -> None:
        if max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if within <= 0:
            raise ValueError("within must be > 0")
        self.name = name
        self.strategy = strategy
        self.max_restarts = max_restarts
        self.within = within
        self.escalate = escalate
        self.on_crash = on_crash
        self.crash_reports: deque[CrashReport] = deque(maxlen=100)
        self._children: dict[str, _Child] = {}
        self._restarts: deque[float] = deque()
        self._nursery: trio.Nursery | None = None
        self._serial = 0
        self._restarting = False

    def __repr__(self) -> str:
        return f"<Supervisor {self.name} {self.strategy.value} children={len(self._children)}>"

    @property
    def children(self) -> list[str]:
        """Names of the children, in start order."""
        return list(self._children)

    def _add_child(
        self,
        factory: Callable[[], Actor],
        name: str | None,
        mailbox_size: int,
        restart: bool,
        idle_timeout: float | None,
        on_idle: Callable[[ActorCell], bool] | None,
    ) -> tuple[_Child, ActorCell]:
        """Make an actor's cell and record it as a child (not started yet)."""
        if name is None:
            self._serial += 1
            name = f"{getattr(factory, '__name__', 'actor')}-{self._serial}"
        if name in self._children:
            raise ValueError(f"a child named {name!r} is already running")
        if mailbox_size < 1:
            raise ValueError("mailbox_size must be >= 1")
        cell = ActorCell(name, factory, mailbox_size, idle_timeout, on_idle)
        child = self._children[name] = _Child(name, cell.run_incarnation, restart, cell)
        return child, cell

    async def spawn(
        self,
        factory: Callable[[], Actor],
        *,
        name: str | None = None,
        mailbox_size: int = 1000,
        restart: bool = True,
        idle_timeout: float | None = None,
        on_idle: Callable[[ActorCell], bool] | None = None,
    ) -> ActorRef:
        """Start an actor and return its ref once ``on_start`` has completed.

        Args:
            factory: makes a fresh actor for each incarnation (a class works).
            name: unique among this supervisor's children; generated when omitted.
            mailbox_size: the mailbox bound (backpressure beyond it).
            restart: restart after a crash (True) or let the actor die (False).
            idle_timeout: see ``ActorCell``.
            on_idle: see ``ActorCell``.

        Raises:
            Exception: whatever the actor's first ``on_start`` raised.
        """
        child, _ = self._add_child(factory, name, mailbox_size, restart, idle_timeout, on_idle)
        try:
            ref: ActorRef = await self._require_nursery().start(
                self._supervise, child, name=f"actor {child.name}"
            )
        except Crash as crash:
            raise crash.exc from None
        return ref

    def spawn_soon(
        self,
        factory: Callable[[], Actor],
        *,
        name: str | None = None,
        mailbox_size: int = 1000,
        restart: bool = True,
        idle_timeout: float | None = None,
        on_idle: Callable[[ActorCell], bool] | None = None,
    ) -> ActorRef:
        """Like ``spawn`` but returns the ref at once; messages queue until ``on_start`` ends.

        A failing first ``on_start`` counts as a crash (restart, or give up).
        """
        child, cell = self._add_child(factory, name, mailbox_size, restart, idle_timeout, on_idle)
        self._require_nursery().start_soon(
            self._supervise, child, False, name=f"actor {child.name}"
        )
        return cell.ref

    async def spawn_supervisor(
        self,
        name: str,
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        *,
        max_restarts: int = 3,
        within: float = 5.0,
        escalate: bool = True,
    ) -> Supervisor:
        """Start a nested supervisor as a child. Its escalation counts as this child's crash."""
        if name in self._children:
            raise ValueError(f"a child named {name!r} is already running")
        sub = Supervisor(
            name,
            strategy,
            max_restarts=max_restarts,
            within=within,
            escalate=escalate,
            on_crash=self.on_crash,
        )
        child = _Child(name, sub._run, True, None, sub)
        self._children[name] = child
        await self._require_nursery().start(self._supervise, child, name=f"supervisor {name}")
        return sub

    async def stop(self, name: str) -> None:
        """Stop the named child gracefully and wait for it.

        Raises:
            KeyError: no child has that name.
        """
        child = self._children.get(name)
        if child is None:
            raise KeyError(f"no child named {name!r}")
        if child.cell is not None:
            await child.cell.ref.stop()
        elif child.scope is not None:
            child.restart = False
            child.scope.cancel()

    async def stop_all(self) -> None:
        """Stop every child gracefully, newest first, and wait for each."""
        for name in reversed(list(self._children)):
            child = self._children.get(name)
            if child is not None:
                await self.stop(name)

    def _require_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise ActorStopped(f"supervisor {self.name!r} is not running")
        return self._nursery

    async def _run(
        self, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run as a nested supervisor: (re)start every child, then wait until cancelled."""
        self._restarting = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for child in list(self._children.values()):
                    nursery.start_soon(self._supervise, child, False, name=f"actor {child.name}")
                task_status.started(self)
                await trio.sleep_forever()
        except BaseExceptionGroup as group:
            raise _translate(group) from None
        finally:
            self._nursery = None

    def _abandon(self) -> None:
        """Nobody will restart this supervisor: fail everything its children still hold."""
        for child in list(self._children.values()):
            if child.cell is not None:
                child.cell.finish(lambda: ActorStopped("supervisor gave up before handling it"))
            elif child.sub is not None:
                child.sub._abandon()
        self._children.clear()

    async def _supervise(
        self,
        child: _Child,
        report_start: bool = True,
        task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run ``child`` until it stops for good, restarting it by strategy after crashes."""
        status = _StartedFlag(task_status if report_start else trio.TASK_STATUS_IGNORED)
        try:
            while True:
                child.scope = scope = trio.CancelScope()
                try:
                    with scope:
                        await child.run_once(task_status=status)
                except (Crash, SupervisorEscalation) as failure:
                    if report_start and not status.done:
                        raise  # the first start failed: spawn() raises it
                    try:
                        self._on_child_crash(child, failure)
                    except _GiveUp:
                        return
                    continue
                if scope.cancelled_caught and child.restart:
                    continue  # a sibling crashed under one_for_all: start afresh
                return
        finally:
            child.scope = None
            if not self._restarting:
                self._drop(child)

    def _drop(self, child: _Child) -> None:
        if self._children.get(child.name) is child:
            del self._children[child.name]
        if child.cell is not None:
            name = child.name
            child.cell.finish(lambda: ActorStopped(f"{name} stopped before handling it"))
        elif child.sub is not None:
            child.sub._abandon()

    def _on_child_crash(self, child: _Child, failure: BaseException) -> None:
        """Report the crash, then restart (by returning) or give up (by raising)."""
        report = self._report(child, failure)
        if not child.restart:
            self._give_up(child, report)
        now = trio.current_time()
        if self.escalate:
            window = self._restarts
        else:
            if child.restarts is None:
                child.restarts = deque()
            window = child.restarts
        while window and window[0] <= now - self.within:
            window.popleft()
        if len(window) >= self.max_restarts:
            if self.escalate:
                self._restarting = True  # keep the children: a parent may restart us
                raise SupervisorEscalation(self.name, report)
            self._give_up(child, report)
        window.append(now)
        if self.strategy is Strategy.ONE_FOR_ALL:
            for sibling in list(self._children.values()):
                if sibling is not child and sibling.scope is not None:
                    sibling.scope.cancel()

    def _give_up(self, child: _Child, report: CrashReport) -> None:
        if child.cell is not None:
            if _store_outage(report.error):  # the server's 503 for whoever waits, not a crash
                child.cell.finish(StoreUnavailable)
            else:
                child.cell.finish(lambda: ActorCrashed(str(report)))
        raise _GiveUp

    def _report(self, child: _Child, failure: BaseException) -> CrashReport:
        if isinstance(failure, Crash):
            error, message, during = failure.exc, failure.message, failure.during
            message_type = None if message is None else type(message).__name__
        else:
            error, message_type, during = failure, None, "supervising its children"
        report = CrashReport(
            supervisor=self.name,
            actor=child.name,
            message_type=message_type,
            during=during,
            error=error,
            traceback="".join(traceback.format_exception(error)),
            at=trio.current_time(),
        )
        self.crash_reports.append(report)
        log.error("crash report: %s\n%s", report, report.traceback)
        if self.on_crash is not None:
            self.on_crash(report)
        return report


def _store_outage(error: BaseException) -> bool:
    """Whether ``error`` is ``StoreUnavailable`` (alone, or every error of a group)."""
    if isinstance(error, BaseExceptionGroup):
        _, rest = error.split(StoreUnavailable)
        return rest is None
    return isinstance(error, StoreUnavailable)


class _GiveUp(Exception):
    """Internal: a child is dropped without escalation."""


class _StartedFlag:
    """Forwards ``started()`` once and remembers that it happened (for restarts too)."""

    __slots__ = ("_status", "done")

    def __init__(self, status: trio.TaskStatus[object]) -> None:
        self._status = status
        self.done = False

    def started(self, value: object = None) -> None:
        if not self.done:
            self.done = True
            self._status.started(value)


def _translate(group: BaseExceptionGroup) -> BaseException:
    """A lone escalation (beside cancellations) stands for the whole group."""
    escalation = _only(group, SupervisorEscalation)
    return escalation if escalation is not None else group


@asynccontextmanager
async def open_supervisor(
    name: str = "root",
    strategy: Strategy = Strategy.ONE_FOR_ONE,
    *,
    max_restarts: int = 3,
    within: float = 5.0,
    escalate: bool = True,
    on_crash: Callable[[CrashReport], None] | None = None,
) -> AsyncIterator[Supervisor]:
    """Open a supervisor whose children live as long as the ``async with`` block.

    On leaving the block every child is stopped gracefully (queued messages handled,
    ``on_stop`` run). If the supervisor gives up, the block is cancelled and
    ``SupervisorEscalation`` is raised from it.
    """
    sup = Supervisor(
        name,
        strategy,
        max_restarts=max_restarts,
        within=within,
        escalate=escalate,
        on_crash=on_crash,
    )
    try:
        async with trio.open_nursery() as nursery:
            sup._nursery = nursery
            yield sup
            await sup.stop_all()
    except BaseExceptionGroup as group:
        translated = _translate(group)
        if translated is group:
            raise
        raise translated from None
    finally:
        sup._nursery = None
        sup._abandon()


def _only(group: BaseExceptionGroup, kind: type[BaseException]) -> BaseException | None:
    """The single ``kind`` error in ``group`` when everything else is cancellation."""
    matched, rest = group.split(kind)
    if matched is None:
        return None
    if rest is not None:
        _, other = rest.split(trio.Cancelled)
        if other is not None:
            return None
    leaves = list(_leaves(matched))
    return leaves[0] if len(leaves) == 1 else None


def _leaves(group: BaseExceptionGroup) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
