"""A session's hold on the node's slots for scheduled turns.

The node runs at most ``[limits] max_concurrent_scheduled_turns`` turns of scheduled input kinds
(``kinds.InputKind.scheduled``: cron, recall, heartbeat…) at once; user turns never take a slot.
"""

from __future__ import annotations

import trio

from turnstile.actors.sessions.services import SessionServices

__all__ = ["TurnSlots"]


class TurnSlots:
    """One session's hold on the node's slots for turns started by a job.

    The node runs at most ``services.scheduled_turns`` job-started turns at once (None: no
    bound, and every method is a no-op). The session's runner holds at most one slot.
    """

    __slots__ = ("_services", "_session_id", "_wait", "_scheduled")

    def __init__(self, services: SessionServices, session_id: str) -> None:
        self._services = services
        self._session_id = session_id
        #: Set while the runner waits for a slot, so a delete can end the wait.
        self._wait: trio.CancelScope | None = None
        #: Inputs of a scheduled kind the session knows to be queued (stored through its
        #: actor, announced to it, or found when it started), less those its runner claimed.
        #: Counted high rather than low: it only lets ``for_next`` skip its read of the queue.
        self._scheduled = 0

    def queued(self, source: str) -> None:
        """An input from ``source`` is queued in the session (its actor stored it, was told
        of it, or found it when it started)."""
        if self._services.scheduled_turns is not None:
            if self._services.input_kinds.scheduled(source):
                self._scheduled += 1

    def claimed(self, scheduled: bool) -> None:
        """The runner claimed an input (``scheduled``: of a scheduled kind)."""
        if scheduled and self._scheduled:
            self._scheduled -= 1

    async def for_next(self) -> bool:
        """Wait for a slot if the session's next input needs one and none is free.

        The input waits *queued* in the inbox (a crash meanwhile loses nothing), and everything
        behind it in this session waits too, so the order stays that of the inbox. A free slot
        is taken before the claim, without waiting (the caller gives it back if the input turns
        out not to need it); only when none is free does this read the queue, so an uncontended
        node pays nothing; and only when the session knows of a scheduled input waiting in it
        (:meth:`queued`), or shares its store with other nodes (whose inputs it may not have
        been told of), so user turns on a node whose slots are busy do not read their queue
        first (a store round trip a turn, issue 26). An input stored without the session
        having heard of it yet (a fire whose announcement is on its way) is claimed and then
        waits for its slot ``running``, as when the queue changes between the read and the
        claim.

        Returns:
            whether a slot is now held for this session.
        """
        slots = self._services.scheduled_turns
        if slots is None:
            return False
        try:
            slots.acquire_on_behalf_of_nowait(self)
            return True
        except trio.WouldBlock:
            pass
        if not self._scheduled and self._services.remote is None:
            return False  # nothing waiting here needs a slot
        source = await self._services.store.next_queued_source(self._session_id)
        if source is None or not self._services.input_kinds.scheduled(source):
            return False
        return await self.take()

    async def take(self) -> bool:
        """Take a slot, waiting for one; False if ``cancel_wait`` ended the wait."""
        slots = self._services.scheduled_turns
        if slots is None:
            return False
        with trio.CancelScope() as scope:
            self._wait = scope
            try:
                await slots.acquire_on_behalf_of(self)
            finally:
                self._wait = None
        return not scope.cancelled_caught

    def release(self) -> None:
        """Give back the slot this session holds."""
        slots = self._services.scheduled_turns
        if slots is not None:
            slots.release_on_behalf_of(self)

    def cancel_wait(self) -> None:
        """End a wait for a slot, if one is under way (the session is being deleted)."""
        if self._wait is not None:
            self._wait.cancel()
