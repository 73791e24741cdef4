"""A bounded, single-consumer mailbox, and the one-shot reply an ``ask`` waits on.

Why not a trio memory channel? An actor's mailbox must outlive the actor incarnation that
reads it (a restarted actor handles what was waiting), must be inspectable (depth, closing with
every pending ask failed), and must let the actor drain a pile-up without a scheduling round
trip per message. A deque plus trio's low-level parking gives all three and is cheaper than a
channel per actor; the ``put``/``put_nowait`` pair follows trio's ``send``/``send_nowait``
checkpoint rules exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import outcome
import trio
from trio.lowlevel import (
    Abort,
    ParkingLot,
    cancel_shielded_checkpoint,
    checkpoint_if_cancelled,
    current_task,
    reschedule,
    wait_task_rescheduled,
)

from turnstile.runtime.errors import ActorStopped, MailboxFull

__all__ = ["Mailbox", "Reply", "Ask", "STOP"]


class Reply:
    """A one-shot slot an asker waits on; the actor fills it with a value or an error."""

    __slots__ = ("_task", "_outcome")

    def __init__(self) -> None:
        self._task: trio.lowlevel.Task | None = None
        self._outcome: outcome.Outcome[object] | None = None

    @property
    def done(self) -> bool:
        """True once a value or an error has been set."""
        return self._outcome is not None

    def set_value(self, value: object) -> None:
        """Answer the ask with ``value``; later answers are ignored."""
        self._set(outcome.Value(value))

    def set_error(self, error: BaseException) -> None:
        """Answer the ask by raising ``error`` in the asker; later answers are ignored."""
        self._set(outcome.Error(error))

    def _set(self, result: outcome.Outcome[object]) -> None:
        if self._outcome is not None:
            return
        self._outcome = result
        task, self._task = self._task, None
        if task is not None:
            reschedule(task, result)  # wait() returns (or raises) what it carries

    async def wait(self) -> object:
        """Wait for the answer and return it (or raise the error it carries)."""
        result = self._outcome
        if result is None:
            self._task = current_task()

            def abort(_: object) -> Abort:
                self._task = None
                return Abort.SUCCEEDED

            return await wait_task_rescheduled(abort)
        return result.unwrap()


class Ask:
    """A message that expects an answer, as it sits in a mailbox."""

    __slots__ = ("message", "reply")

    def __init__(self, message: object, reply: Reply) -> None:
        self.message = message
        self.reply = reply


class _Stop:
    __slots__ = ()

    def __repr__(self) -> str:
        return "STOP"


STOP = _Stop()
"""The marker a graceful stop puts at the back of a mailbox."""


class Mailbox:
    """A bounded FIFO with one reader (the actor) and any number of writers.

    Args:
        capacity: how many messages may wait; ``put`` blocks and ``put_nowait`` raises
            ``MailboxFull`` beyond it.
        owner: a name used in error messages.
    """

    __slots__ = ("queue", "capacity", "owner", "_reader", "_writers", "_closed")

    def __init__(self, capacity: int, owner: str = "actor") -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.queue: deque[object] = deque()
        self.capacity = capacity
        self.owner = owner
        self._reader: trio.lowlevel.Task | None = None
        self._writers: ParkingLot | None = None  # made when a writer first waits
        self._closed = False

    def __len__(self) -> int:
        return len(self.queue)

    @property
    def closed(self) -> bool:
        """True once the mailbox refuses new messages."""
        return self._closed

    def put_nowait(self, item: object) -> None:
        """Append ``item`` or raise at once.

        Raises:
            ActorStopped: the mailbox is closed.
            MailboxFull: the mailbox is at capacity.
        """
        if self._closed:
            raise ActorStopped(f"{self.owner} is stopped")
        queue = self.queue
        if len(queue) >= self.capacity:
            raise MailboxFull(f"mailbox of {self.owner} is full ({self.capacity} messages)")
        queue.append(item)
        if self._reader is not None:
            task, self._reader = self._reader, None
            reschedule(task)

    async def put(self, item: object) -> None:
        """Append ``item``, waiting while the mailbox is full (backpressure).

        Raises:
            ActorStopped: the mailbox is closed, or closes while we wait.
        """
        await checkpoint_if_cancelled()
        while len(self.queue) >= self.capacity and not self._closed:
            if self._writers is None:
                self._writers = ParkingLot()
            await self._writers.park()
        self.put_nowait(item)
        await cancel_shielded_checkpoint()

    def force_put(self, item: object) -> None:
        """Append past capacity and even when closed: for control markers such as STOP."""
        self.queue.append(item)
        if self._reader is not None:
            task, self._reader = self._reader, None
            reschedule(task)

    def push_front(self, item: object) -> None:
        """Put ``item`` back at the head, for redelivery to a new incarnation."""
        self.queue.appendleft(item)

    def take(self) -> object:
        """Pop the oldest message (the caller checked that there is one) and wake a writer."""
        item = self.queue.popleft()
        if self._writers:
            self._writers.unpark()
        return item

    async def wait_nonempty(self) -> None:
        """Park the reader until a message arrives. Only one task may read a mailbox."""
        if self.queue:
            await trio.lowlevel.checkpoint()
            return
        self._reader = current_task()

        def abort(_: object) -> Abort:
            self._reader = None
            return Abort.SUCCEEDED

        await wait_task_rescheduled(abort)

    def close(self) -> None:
        """Refuse new messages from now on; writers waiting for room get ``ActorStopped``."""
        self._closed = True
        if self._writers is not None:
            self._writers.unpark_all()

    def reopen(self) -> None:
        """Accept messages again (a supervisor restarting the owner)."""
        self._closed = False

    def fail_pending(self, error_factory: Callable[[], BaseException]) -> int:
        """Remove every waiting message, failing each pending ask with ``error_factory()``.

        Returns:
            how many messages were dropped.
        """
        dropped = 0
        while self.queue:
            item = self.queue.popleft()
            if type(item) is Ask:
                item.reply.set_error(error_factory())
            dropped += 1
        if self._writers is not None:
            self._writers.unpark_all()
        return dropped
