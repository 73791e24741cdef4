"""A session's hold on the node's slots for scheduled turns.

The node runs at most ``[limits] max_concurrent_scheduled_turns`` turns of scheduled input kinds
(``kinds.InputKind.scheduled``: cron, recall, heartbeat…) at once; user turns never take a slot.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from turnstile.actors.sessions.services import SessionServices
from turnstile.runtime.store import InboxItem

__all__ = ["TurnSlots"]


class TurnSlots:
    """One session's hold on the node's slots for turns started by a job.

    The node runs at most ``services.scheduled_turns`` job-started turns at once (None: no
    bound, and every method is a no-op). The session's runner holds at most one slot.
    """

    __slots__ = ("_services", "_session_id", "_wait", "_holding")

    def __init__(self, services: SessionServices, session_id: str) -> None:
        self._services = services
        self._session_id = session_id
        #: Set while the runner waits for a slot, so a delete can end the wait.
        self._wait: trio.CancelScope | None = None
        #: Whether the session holds a slot.
        self._holding = False

    async def for_next(self) -> bool:
        """Take a free slot for the session's next input, without waiting (the caller gives
        it back if the input turns out not to need it; :meth:`claim` waits for one when it
        does and none was free).

        Returns:
            whether a slot is now held for this session.
        """
        slots = self._services.scheduled_turns
        if slots is None:
            return False
        if self._holding:
            return True
        try:
            slots.acquire_on_behalf_of_nowait(self)
        except trio.WouldBlock:
            return False
        self._holding = True
        return True

    async def claim(
        self, fence: int | None, before_wait: Callable[[], None] | None = None
    ) -> InboxItem | None:
        """Claim the session's next input; one that needs a slot waits *queued* for one.

        Without a slot held, the claim leaves an oldest input of a scheduled kind queued and
        says so in the same statement (``Store.claim_next_input_unless``); then this waits for
        a slot and claims again. So such an input waits in the inbox (a crash meanwhile loses
        nothing), and everything behind it in this session waits too: the order stays that of
        the inbox. No read of the queue comes before the claim (issue 26: it was a store round
        trip a turn on a node whose slots were busy). A slot taken here is held on return
        when the claimed input needs one (the caller's :meth:`take` then answers at once) and
        given back otherwise.

        ``before_wait`` is called before such a wait (the runner writes what it held back for
        the turn: ``EventLog.flush_deferred``).

        Returns:
            the claimed input, or None (nothing queued, or the wait for a slot was ended by
            :meth:`cancel_wait`).

        Raises:
            as ``Store.claim_next_input``.
        """
        store = self._services.store
        kinds = self._services.input_kinds
        if self._services.scheduled_turns is None or self._holding:
            return await store.claim_next_input(self._session_id, fence=fence)
        answer = await store.claim_next_input_unless(
            self._session_id, kinds.scheduled_sources(), fence=fence
        )
        if not isinstance(answer, str):
            return answer
        # its next input needs a slot and none is held: it waits queued for one
        if before_wait is not None:
            before_wait()
        if not await self.take():
            return None
        try:
            item = await store.claim_next_input(self._session_id, fence=fence)
        except BaseException:
            self.release()
            raise
        if item is None or not kinds.scheduled(item.source):
            self.release()  # it was taken meanwhile (folded, deleted): no slot needed
        return item

    async def take(self) -> bool:
        """Take a slot, waiting for one; False if ``cancel_wait`` ended the wait. True at
        once when the session holds one already."""
        slots = self._services.scheduled_turns
        if slots is None:
            return False
        if self._holding:
            return True
        with trio.CancelScope() as scope:
            self._wait = scope
            try:
                await slots.acquire_on_behalf_of(self)
            finally:
                self._wait = None
        if scope.cancelled_caught:
            return False
        self._holding = True
        return True

    def release(self) -> None:
        """Give back the slot this session holds."""
        slots = self._services.scheduled_turns
        if slots is not None and self._holding:
            self._holding = False
            slots.release_on_behalf_of(self)

    def cancel_wait(self) -> None:
        """End a wait for a slot, if one is under way (the session is being deleted)."""
        if self._wait is not None:
            self._wait.cancel()
