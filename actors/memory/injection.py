"""Summary injection: every turn of a user's sessions starts with what memory remembers.

The reference's ``_memory_msg``: when the session's owner has a summary, the turn gets the
system message ``## What I remember about the user\\n\\n{summary}``, after the system prompt
and before the history. Here it is a ``SessionHooks.turn_context`` hook
(``SummaryCache.turn_context``); the session hands the text to the agent as one of
``TurnInput.system_messages``.

A turn start must not pay a query when nothing changed, so ``SummaryCache`` keeps each user's
message (or the fact that there is none) after the first turn reads it, and forgets it when
``Memory`` says the summary changed: the cache subscribes to the ``Memory`` it reads
(``Memory.subscribe``, ``notices.py``), which tells it after every write (``PUT
/memory/summary``, extraction, ``DELETE /memory``). A read that races a write never puts the
old text back (a generation count per user). The cache lives in one node's memory: a summary
written by another node sharing the database is seen there only after that node's own write
or restart.
"""

from __future__ import annotations

import msgspec

from turnstile.actors.memory.notices import MemoryNotice
from turnstile.actors.memory.service import Memory

__all__ = ["HEADING", "SummaryCache", "SummaryCacheStatistics", "memory_message"]

HEADING = "## What I remember about the user"


def memory_message(summary: str | None) -> str | None:
    """The reference's system message for ``summary``; None when there is nothing to say."""
    if not summary or not summary.strip():
        return None
    return f"{HEADING}\n\n{summary}"


class SummaryCacheStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a ``SummaryCache``.

    Attributes:
        loads: summaries read from the store (each a query).
        hits: turn starts answered from the cache (no query).
        cached: users whose summary (or its absence) is held.
        invalidations: notices that made an entry stale (a summary set, a user deleted).
    """

    loads: int
    hits: int
    cached: int
    invalidations: int = 0


class SummaryCache:
    """Each user's injected message, read once and kept until the summary changes.

    Args:
        memory: the feature's service: the cache reads summaries through it and subscribes to
            it at once, so it is told of every write; ``close`` ends the subscription.
    """

    def __init__(self, memory: Memory) -> None:
        self._memory = memory
        self._messages: dict[str, str | None] = {}
        self._generation: dict[str, int] = {}
        self._closed = False
        self._loads = 0
        self._hits = 0
        self._invalidations = 0
        self._unsubscribe = memory.subscribe(self.changed)

    def close(self) -> None:
        """Stop listening to ``memory``. Nothing would tell the cache of a write any more, so
        it is emptied and keeps nothing from then on (every call reads)."""
        self._unsubscribe()
        self._closed = True
        self._messages.clear()

    def changed(self, notice: MemoryNotice) -> None:
        """``Memory``'s subscriber: forget the user's entry when their summary was set or their
        memory deleted. Facts changing leave the summary as it is: only its own writes change
        it."""
        if notice.what in ("summary", "deleted"):
            self._invalidations += 1
            self.invalidate(notice.owner)

    def invalidate(self, owner: str) -> None:
        """Forget ``owner``'s entry; the next turn start reads the summary again."""
        self._messages.pop(owner, None)
        self._generation[owner] = self._generation.get(owner, 0) + 1

    async def message(self, owner: str) -> str | None:
        """``owner``'s injected message (None when they have no summary); a query only when
        the cache does not hold it."""
        try:
            message = self._messages[owner]
        except KeyError:
            pass
        else:
            self._hits += 1
            return message
        generation = self._generation.get(owner, 0)
        self._loads += 1
        summary = await self._memory.get_summary(owner)
        message = memory_message(summary.content if summary is not None else None)
        if not self._closed and self._generation.get(owner, 0) == generation:  # no write told
            self._messages[owner] = message
        return message

    async def turn_context(self, owner: str, session_key: str) -> str | None:
        """The ``SessionHooks.turn_context`` hook: the same message in every session of the
        owner."""
        return await self.message(owner)

    def statistics(self) -> SummaryCacheStatistics:
        """Loads, hits, entries and invalidations so far."""
        return SummaryCacheStatistics(
            loads=self._loads,
            hits=self._hits,
            cached=len(self._messages),
            invalidations=self._invalidations,
        )
