"""Which sessions exist, as this node last read them: the cache in front of
``SessionDirectory.owned_key``.

Every request that names a session asks first whether the caller has a session of that name.
The answer is a row of the store's ``sessions`` table, which any node may delete; so a copy
kept here may go stale, and one that does would let a request through for a session deleted
through another node (a binding, a job list answering ``200 []`` instead of ``404``, and
whatever it writes would outlive the session and reach a later one that reuses the name).

What keeps the copy honest:

* **Deletes are announced.** The node that deletes a session says so to every node
  (``g <key>`` on the sessions channel, ``remote.py``) once the row is gone; each node that
  hears it forgets the key (:meth:`OwnerCache.forget`).
* **A lost announcement is bounded.** After every (re)connection of the listener, when
  announcements may have been missed, every entry is forgotten; and an entry is kept at most
  :data:`OWNER_CACHE_SECONDS`, for an announcement lost otherwise (the deleting node died
  between its commit and its announcement, a node of an older release).
* **A read racing a forget keeps nothing.** A miss reads the store, and what it read is kept
  only if nothing was forgotten meanwhile (:meth:`OwnerCache.generation`), so a row read just
  before a delete cannot be put back after the delete's announcement was heard.
* **Writes need not trust it.** A request that would create rows under the session reads the
  store itself (``owned_key(..., fresh=True)``).

Only the existence of a session is cached: a session's owner never changes (its key is in its
owner's namespace), creating one is seen by the store read a miss makes (absence is never
kept), and everything else about it is read from the store or asked of its actor.
"""

from __future__ import annotations

import msgspec
import trio

__all__ = ["OWNER_CACHE_SECONDS", "OwnerCache", "OwnerCacheStatistics"]

#: How long a session's owner is kept before it is read again: the longest a delete through
#: another node goes unseen here when its announcement is lost.
OWNER_CACHE_SECONDS = 10.0
#: Entries kept at most; beyond it the cache starts again empty.
OWNER_CACHE_MAX = 100_000


class OwnerCacheStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of an ``OwnerCache`` (``OwnerCache.statistics``).

    Attributes:
        cached: entries held now (expired ones included until they are looked up).
        forgotten: forgets since the cache was made (a ``forget_all`` counts once).
    """

    cached: int
    forgotten: int


class OwnerCache:
    """Session keys to their owners, each kept ``seconds`` at most (trio's clock).

    Args:
        seconds: how long an entry is kept; 0 keeps nothing.
        max_entries: beyond it the cache is emptied before the next entry is kept.
    """

    def __init__(
        self, seconds: float = OWNER_CACHE_SECONDS, *, max_entries: int = OWNER_CACHE_MAX
    ) -> None:
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        self.seconds = seconds
        self.max_entries = max_entries
        self._entries: dict[str, tuple[str, float]] = {}
        self._generation = 0

    def get(self, key: str) -> str | None:
        """The owner of ``key`` as kept, or None (not kept, or kept too long)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        owner, until = entry
        if trio.current_time() >= until:
            del self._entries[key]
            return None
        return owner

    def generation(self) -> int:
        """A number that changes at every forget: take it before reading the store, and give
        it to :meth:`put` with what was read."""
        return self._generation

    def put(self, key: str, owner: str, generation: int) -> None:
        """Keep ``owner`` for ``key``, read from the store when :meth:`generation` answered
        ``generation``; nothing is kept if anything was forgotten since."""
        if generation != self._generation or self.seconds == 0:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (owner, trio.current_time() + self.seconds)

    def forget(self, key: str) -> None:
        """``key`` was deleted (here or through another node): read it again next time."""
        self._generation += 1
        self._entries.pop(key, None)

    def forget_all(self) -> None:
        """Deletes may have gone unheard (the listener reconnected): read every key again."""
        self._generation += 1
        self._entries.clear()

    def statistics(self) -> OwnerCacheStatistics:
        """How many entries are held and how many forgets there were."""
        return OwnerCacheStatistics(cached=len(self._entries), forgotten=self._generation)
