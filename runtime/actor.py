"""Actors and the refs that reach them.

An ``Actor`` is plain state plus a ``receive`` coroutine. It never runs on its own: a
supervisor runs it inside a nursery, one message at a time, from a ``Mailbox`` that outlives any
single incarnation (so a restart keeps what was waiting). Users talk to an actor only through
its ``ActorRef``, which they never construct:

* ``await ref.tell(msg)`` — fire and forget; waits while the mailbox is full (backpressure).
* ``ref.tell_nowait(msg)`` — the same, but raises ``MailboxFull`` instead of waiting.
* ``await ref.ask(msg)`` — request/reply; an exception raised while handling it is raised in
  the asker, and the actor carries on. Bound the wait with a trio cancel scope.
* ``await ref.stop()`` — graceful: messages already queued are handled, later ones refused.

An exception while handling a *tell* crashes the actor: ``on_failure`` runs, and the supervisor
decides what happens next (see ``runtime.supervisor``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from turnstile.runtime import tracing
from turnstile.runtime.mailbox import STOP, Ask, Mailbox, Reply

__all__ = ["Actor", "ActorRef"]

log = logging.getLogger("turnstile.actor")

#: How long ``on_stop`` may take when the actor is being torn down by cancellation.
STOP_GRACE_SECONDS = 5.0


class Actor:
    """Base class for actors. Override ``receive`` and, if needed, the lifecycle hooks.

    Attributes:
        ref: this actor's own ref, set before ``on_start`` runs.
    """

    ref: ActorRef

    #: Set True to get ``self.nursery``: a nursery that lives as long as this incarnation, for
    #: tasks the actor starts itself (a session's running turn). It is cancelled after
    #: ``on_stop``; a task in it that fails crashes the actor.
    uses_nursery: bool = False
    nursery: trio.Nursery | None = None

    def can_passivate(self) -> bool:
        """Whether an idle virtual actor may be passivated now (False while work runs)."""
        return True

    async def on_start(self) -> None:
        """Runs before the first message of each incarnation (load state here)."""

    async def on_stop(self) -> None:
        """Runs when the actor stops, is passivated or is shut down (save state here)."""

    async def on_failure(self, exc: BaseException, message: object) -> None:
        """Runs when handling ``message`` raised ``exc`` and the actor is about to crash."""

    async def receive(self, message: Any) -> Any:
        """Handle one message; the return value answers an ``ask``."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(message).__name__}")


class ActorRef:
    """The address of a running actor. Obtained from a supervisor or registry, never built."""

    __slots__ = ("name", "_cell")

    def __init__(self, name: str, cell: ActorCell) -> None:
        self.name = name
        self._cell = cell

    def __repr__(self) -> str:
        return f"<ActorRef {self.name}>"

    @property
    def is_alive(self) -> bool:
        """True while the actor accepts messages."""
        return not self._cell.mailbox.closed

    @property
    def mailbox_depth(self) -> int:
        """How many messages are waiting."""
        return len(self._cell.mailbox)

    @property
    def mailbox_capacity(self) -> int:
        """How many messages may wait before ``tell`` blocks."""
        return self._cell.mailbox.capacity

    async def tell(self, message: object) -> None:
        """Deliver ``message``, waiting while the mailbox is full.

        Raises:
            ActorStopped: the actor is stopped.
        """
        await self._cell.mailbox.put(message)

    def tell_nowait(self, message: object) -> None:
        """Deliver ``message`` or raise at once.

        Raises:
            MailboxFull: the mailbox is at capacity.
            ActorStopped: the actor is stopped.
        """
        self._cell.mailbox.put_nowait(message)

    async def ask(self, message: object) -> Any:
        """Deliver ``message`` and wait for the actor's answer.

        Returns:
            what the actor's ``receive`` returned.

        Raises:
            ActorStopped: the actor stopped before handling the message.
            Exception: whatever ``receive`` raised while handling it.
        """
        reply = Reply()
        await self._cell.mailbox.put(Ask(message, reply))
        return await reply.wait()

    def stop_nowait(self) -> None:
        """Ask the actor to stop gracefully without waiting (an actor may do this to itself)."""
        self._cell.request_stop()

    async def stop(self) -> None:
        """Stop gracefully: queued messages are handled first; wait until ``on_stop`` is done."""
        self._cell.request_stop()
        await self._cell.wait_stopped()


class ActorCell:
    """What a supervisor keeps for one actor across incarnations: its factory and mailbox.

    Args:
        name: a readable name, used in refs, task names and crash reports.
        factory: makes a fresh ``Actor`` for each incarnation.
        capacity: the mailbox bound.
        idle_timeout: seconds without a message after which ``on_idle`` is called (virtual
            actors passivate this way); None never times out.
        on_idle: a synchronous callback that returns True to stop the actor for idleness.

    Attributes:
        finished: True once the actor is gone for good.
        on_finish: called once, synchronously, when the actor is gone for good.
    """

    __slots__ = (
        "name",
        "factory",
        "mailbox",
        "ref",
        "finished",
        "_stopped",
        "idle_timeout",
        "on_idle",
        "on_finish",
        "actor",
    )

    def __init__(
        self,
        name: str,
        factory: Callable[[], Actor],
        capacity: int,
        idle_timeout: float | None = None,
        on_idle: Callable[[ActorCell], bool] | None = None,
    ) -> None:
        self.name = name
        self.factory = factory
        self.mailbox = Mailbox(capacity, owner=name)
        self.ref = ActorRef(name, self)
        self.finished = False
        self._stopped: trio.Event | None = None  # made on demand: idle actors stay small
        self.idle_timeout = idle_timeout
        self.on_idle = on_idle
        self.on_finish: Callable[[ActorCell], None] | None = None
        self.actor: Actor | None = None

    def request_stop(self) -> None:
        """Refuse new messages and queue the stop marker behind the ones already waiting."""
        if not self.mailbox.closed:
            self.mailbox.close()
            self.mailbox.force_put(STOP)

    def finish(self, error_factory: Callable[[], BaseException]) -> None:
        """The actor is gone for good: fail what waits and wake everyone waiting on ``stop``."""
        self.mailbox.close()
        self.mailbox.fail_pending(error_factory)
        self.actor = None
        if not self.finished:
            self.finished = True
            if self._stopped is not None:
                self._stopped.set()
            if self.on_finish is not None:
                self.on_finish(self)

    async def wait_stopped(self) -> None:
        """Wait until the actor is gone for good (returns at once if it already is)."""
        if self.finished:
            await trio.lowlevel.checkpoint()
            return
        if self._stopped is None:
            self._stopped = trio.Event()
        await self._stopped.wait()

    async def run_incarnation(
        self, task_status: trio.TaskStatus[ActorRef] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run one incarnation: ``on_start``, messages until stopped, ``on_stop``.

        Returns normally when the actor stopped (asked to, or idle). Raises ``Crash`` when
        handling a tell (or ``on_start``) failed; the message that failed is not redelivered.
        When cancelled (shutdown, or a sibling's crash under one_for_all) the message being
        handled goes back to the head of the mailbox and ``on_stop`` still runs, bounded.
        """
        # The actor's task was started from whichever task first asked for it: its spans (and
        # its own tasks') have the parents they name, not that request's span.
        tracing.clear_context()
        actor = self.factory()
        actor.ref = self.ref
        self.actor = actor
        if not actor.uses_nursery:
            await self._run(actor, task_status)
            return
        try:
            async with trio.open_nursery() as nursery:
                actor.nursery = nursery
                await self._run(actor, task_status)
                nursery.cancel_scope.cancel()  # whatever the actor left running ends with it
        except BaseExceptionGroup as group:
            crashes, _ = group.split(Crash)
            if crashes is not None:
                raise _first_leaf(crashes) from None
            errors, _ = group.split(Exception)
            if errors is not None:  # one of the actor's own tasks failed
                raise Crash(self.name, None, errors, "running its own task") from errors
            raise
        finally:
            actor.nursery = None

    async def _run(self, actor: Actor, task_status: trio.TaskStatus[ActorRef]) -> None:
        mailbox = self.mailbox
        queue = mailbox.queue
        item: object = None
        try:
            try:
                await actor.on_start()
            except Exception as exc:
                raise Crash(self.name, None, exc) from exc
            task_status.started(self.ref)
            receive = actor.receive
            while True:
                if not queue:
                    if self.idle_timeout is None:
                        await mailbox.wait_nonempty()
                    else:
                        with trio.move_on_after(self.idle_timeout):
                            await mailbox.wait_nonempty()
                        if (
                            not queue
                            and self.on_idle is not None
                            and actor.can_passivate()
                            and self.on_idle(self)
                        ):
                            break
                        continue
                item = mailbox.take()
                if type(item) is Ask:
                    try:
                        value = await receive(item.message)
                    except Exception as exc:
                        item.reply.set_error(exc)
                    else:
                        item.reply.set_value(value)
                elif item is STOP:
                    break
                else:
                    try:
                        await receive(item)
                    except Exception as exc:
                        await _run_failure_hook(actor, exc, item)
                        raise Crash(self.name, item, exc) from exc
                item = None
        except trio.Cancelled:
            # Cut off mid-message: give the message back so the next incarnation sees it.
            if item is not None and item is not STOP:
                mailbox.push_front(item)
            with trio.move_on_after(STOP_GRACE_SECONDS, shield=True):
                await _run_stop_hook(actor)
            raise
        await _run_stop_hook(actor)


async def _run_stop_hook(actor: Actor) -> None:
    try:
        await actor.on_stop()
    except Exception:
        log.exception("on_stop of %r failed", actor)


async def _run_failure_hook(actor: Actor, exc: BaseException, message: object) -> None:
    try:
        await actor.on_failure(exc, message)
    except Exception:
        log.exception("on_failure of %r failed", actor)


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


class Crash(Exception):
    """One incarnation of an actor failed; carries what a crash report needs."""

    def __init__(
        self, actor: str, message: object, exc: BaseException, during: str | None = None
    ) -> None:
        super().__init__(f"{actor} crashed")
        self.actor = actor
        self.message = message
        self.exc = exc
        if during is None:
            during = "starting" if message is None else f"handling {type(message).__name__}"
        self.during = during
