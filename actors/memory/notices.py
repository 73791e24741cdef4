"""What ``Memory`` tells whoever keeps a copy of its data: which user's memory was written, and
what of it.

A cache of memory's rows (``injection.SummaryCache``) must forget an entry when the row
changes, whoever changed it: a route, a tool, extraction. ``Memory`` is the one place every
write goes through, so it is the one that says so: a subscriber registered with
``Memory.subscribe`` is called with a ``UserChanged`` after each write (committed, failed or
cancelled: telling too often costs a read, telling too little serves stale data).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import msgspec

__all__ = ["MemoryNotice", "Notices", "Subscriber", "UserChanged"]

log = logging.getLogger("turnstile.memory")


class UserChanged(msgspec.Struct, tag="user", frozen=True, kw_only=True):
    """One user's memory was written.

    Attributes:
        owner: whose memory.
        what: ``facts`` (a save or a forget, expired facts deleted with it), ``summary`` (set:
            ``PUT /memory/summary``, extraction) or ``deleted`` (everything, ``DELETE /memory``).
    """

    owner: str
    what: Literal["facts", "summary", "deleted"]


#: What a subscriber is told.
MemoryNotice = UserChanged

#: ``Memory.subscribe``'s callable: called in the task that wrote, it must not block; one that
#: raises is logged and the others are still told.
Subscriber = Callable[[MemoryNotice], None]


class Notices:
    """One ``Memory``'s subscribers, and how they are told."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Tell ``subscriber`` every notice from now on; returns what ends that."""
        self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

        return unsubscribe

    def tell(self, notice: MemoryNotice) -> None:
        """Call every subscriber with ``notice``; one that raises is logged, the rest are
        still told."""
        for subscriber in list(self._subscribers):
            try:
                subscriber(notice)
            except Exception:
                log.exception("memory: a subscriber failed on %r", notice)

    @contextmanager
    def telling(
        self, owner: str, what: Literal["facts", "summary", "deleted"]
    ) -> Iterator[UserChanged]:
        """Around one write of ``owner``'s memory: tell the subscribers once it ended, however
        it ended (a write that failed or was cancelled may still have committed; telling in
        vain costs a cache one read, not telling serves stale data). Yields the notice."""
        notice = UserChanged(owner=owner, what=what)
        try:
            yield notice
        finally:
            self.tell(notice)
