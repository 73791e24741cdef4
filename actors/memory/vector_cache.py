"""The SQLite vector stage's per-user matrices, held in the node's memory.

SQLite has no vector index, so the vector stage compares the query with every embedding of
the user (``vector_queries.VECTOR_SEARCH``). Reading those embeddings is what costs: at
100,000 facts it is 150 MB of blobs per search, far over the 20 ms a search may take, while the
comparison itself (one matrix product) takes a few milliseconds. So the matrix is read once and
kept:

* ``memory_vector_version`` (migration 3, SQLite) holds a number per user that triggers on
  ``memory_facts`` raise in the same transaction as every insert, delete and change of an
  embedding or an expiry, whichever process writes (the node, ``turnstile memory backfill``).
* A search reads that number first (one primary-key lookup), then uses the kept matrix when
  it was built at that number, and otherwise reads the user's embeddings again. Reading the
  number before the rows means a matrix is never labelled newer than what it holds: a write
  in between only costs one more read at the next search.
* The matrices of all users together are held to ``max_bytes`` (``[memory]
  vector_cache_mb``); the least recently searched go first. A user whose matrix alone is
  larger is searched from the store every time, as before.

Expiry needs no new matrix: the few facts with an ``expires_at`` are kept aside and masked
out at search time, and a search then reads only its best rows by id (re-checking owner and
expiry, so a row deleted since is simply not returned).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where vectors are used (~0.1 s a process otherwise)
    import numpy as np

__all__ = ["CacheStatistics", "VectorCache", "nearest"]


@dataclass(frozen=True, slots=True)
class _Entry:
    version: int
    ids: np.ndarray  # int64, one per row of matrix
    matrix: np.ndarray  # float32, (rows, dimensions), L2-normalised
    expiring: tuple[tuple[int, str], ...]  # (row, expires_at) for rows that expire

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.matrix.nbytes


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    """What the cache did (tests, ``/metrics``)."""

    hits: int
    loads: int
    users: int
    bytes: int


class VectorCache:
    """Per-user embedding matrices, bounded by ``max_bytes``; safe to share between the
    store's reader threads."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._hits = 0
        self._loads = 0

    def statistics(self) -> CacheStatistics:
        with self._lock:
            return CacheStatistics(self._hits, self._loads, len(self._entries), self._bytes)

    def _get(self, key: tuple[str, int], version: int) -> _Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.version != version:
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return entry

    def _put(self, key: tuple[str, int], entry: _Entry) -> None:
        with self._lock:
            self._loads += 1
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if entry.nbytes > self.max_bytes:
                return
            self._entries[key] = entry
            self._bytes += entry.nbytes
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def load(self, conn: Any, owner: str, dimensions: int) -> _Entry:
        """The user's matrix at the store's current version: kept, or read now."""
        row = conn.execute(
            "SELECT version FROM memory_vector_version WHERE owner = ?", (owner,)
        ).fetchone()
        version = 0 if row is None else row[0]
        key = (owner, dimensions)
        entry = self._get(key, version)
        if entry is not None:
            return entry
        rows = conn.execute(
            "SELECT id, embedding, expires_at FROM memory_facts WHERE owner = ?"
            " AND length(embedding) = ?",
            (owner, 4 * dimensions),
        ).fetchall()
        import numpy as np

        if rows:
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(
                len(rows), dimensions
            )
        else:
            ids = np.empty(0, dtype=np.int64)
            matrix = np.empty((0, dimensions), dtype=np.float32)
        expiring = tuple((i, r[2]) for i, r in enumerate(rows) if r[2] is not None)
        entry = _Entry(version, ids, matrix, expiring)
        self._put(key, entry)
        return entry


def nearest(
    entry: _Entry, vector: np.ndarray, *, now: str, limit: int, max_distance: float
) -> list[tuple[int, float]]:
    """``(fact id, cosine distance)`` of the ``limit`` nearest unexpired rows within
    ``max_distance``, nearest first (ties in row order).

    What it costs is one pass over the matrix (float32 ``matrix @ vector``, BLAS's sgemv: at
    100,000 x 384 that is 154 MB read, about 3 ms here, bound by memory bandwidth); the rest
    (the cutoff, the partial sort of the few rows that pass it) is linear in the rows and
    small beside it.
    """
    if len(entry.ids) == 0 or limit <= 0:
        return []
    import numpy as np

    similarity = entry.matrix @ np.asarray(vector, dtype=np.float32)
    for row, expires_at in entry.expiring:
        if expires_at <= now:
            similarity[row] = -np.inf
    # within the cutoff: cosine distance 1 - similarity <= max_distance
    rows = np.flatnonzero(similarity >= np.float32(1.0 - max_distance))
    if len(rows) > limit:
        # argpartition finds the best `limit` in linear time; only they are sorted
        rows = rows[np.argpartition(-similarity[rows], limit - 1)[:limit]]
    rows = rows[np.lexsort((rows, -similarity[rows]))]
    distance = 1.0 - similarity[rows]
    return [
        (int(i), float(d))
        for i, d in zip(entry.ids[rows].tolist(), distance.tolist(), strict=True)
        if d <= max_distance
    ]
