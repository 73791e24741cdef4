"""The memory feature's vector stage: set up, search and fill the facts' embeddings (store
operations, one function per backend).

``VECTOR_SEARCH`` compares the query's embedding with the facts' ones: cosine in numpy over the
owner's embedded facts on SQLite (kept in memory between searches, ``vector_cache``),
pgvector's ``<=>`` on PostgreSQL: exactly over the owner's facts for a user with few of them,
through the HNSW index for a larger one with ``hnsw.ef_search`` sized to the owner's share of
the table (pgvector before 0.8 filters the owner after the index scan, which returns at most
``ef_search`` rows; see ``EF_SEARCH_FIRST``). Embeddings are passed in as float32 numpy
vectors, already L2-normalised.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

from turnstile.actors.memory.queries import (
    FACT_COLUMNS,
    Fact,
    VectorPath,
    fact_from_postgres,
    fact_from_sqlite,
    pg_vector,
    quote_ident,
    vector_blob,
)
from turnstile.actors.memory.schema import (
    ENSURE_VECTOR,
    VECTOR_INDEX,
)
from turnstile.actors.memory.search_queries import AT_MOST, FACT_SELECT, SEARCH_SETTINGS
from turnstile.actors.memory.vector_cache import VectorCache, nearest
from turnstile.runtime.store import ops

if TYPE_CHECKING:  # numpy is imported where vectors are made (~0.1 s a process otherwise)
    import numpy as np

__all__ = [
    "EF_SEARCH_FIRST",
    "EF_SEARCH_MARGIN",
    "EF_SEARCH_MAX",
    "MISSING_EMBEDDINGS",
    "SET_EMBEDDINGS",
    "VECTOR_SEARCH",
    "VECTOR_SETUP",
]

#: PostgreSQL's vector stage (``docs/memory.md``, "Search at scale"). pgvector before 0.8 has no
#: iterative index scan: an HNSW scan returns at most ``hnsw.ef_search`` rows of all users,
#: and the owner's are kept after, so a user holding a small share of the facts would get
#: fewer than ``limit`` (or none). So: a user with at most ``VectorPath.exact_up_to`` facts is
#: compared with every one of them (exact, a few milliseconds); a larger one goes through the
#: index with ``ef_search`` sized to the owner's share of the table (``limit / share``, with
#: ``EF_SEARCH_MARGIN`` to spare): the share the planner's statistics give (``pg_stats``, for
#: the most common owners), else ``EF_SEARCH_FIRST`` and then the share of the owner's rows in
#: that first answer; at most ``EF_SEARCH_MAX``, pgvector's ceiling. A user whose share needs
#: more than that, or for whom the index fell short, is compared exactly.
EF_SEARCH_FIRST = 100
EF_SEARCH_MAX = 1000
EF_SEARCH_MARGIN = 1.5


# ---- embeddings -----------------------------------------------------------------------------


def _vector_setup_sqlite(conn: Any, *, dimensions: int | None) -> VectorPath:
    if dimensions is None:
        return VectorPath("none", why="no embedder configured")
    return VectorPath("numpy", dimensions)


async def _vector_setup_postgres(conn: Any, *, dimensions: int | None) -> VectorPath:
    await conn.execute(ENSURE_VECTOR)
    schema = await conn.fetchval(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'vector'"
    )
    current = await conn.fetchval(
        "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'memory_facts'::regclass"
        " AND attname = 'embedding' AND NOT attisdropped"
    )
    if schema is None:
        offered = await conn.fetchval("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        if offered:
            why = (
                "pgvector is on the server but this role cannot create it: CREATE EXTENSION vector"
            )
            return VectorPath("none", why=why)
        return VectorPath("none", why="no pgvector on this server")
    if dimensions is None:
        # the column (from an earlier run) stays; saves clear it so no vector goes stale
        return VectorPath(
            "none", schema=schema if current is not None else None, why="no embedder configured"
        )
    s = quote_ident(schema)
    reset = False
    async with conn.transaction():
        if current is not None and current != dimensions:
            # another model: its vectors mean nothing to the new one; backfill re-embeds
            await conn.execute("ALTER TABLE memory_facts DROP COLUMN embedding")
            current, reset = None, True
        if current is None:
            await conn.execute(
                f"ALTER TABLE memory_facts ADD COLUMN embedding {s}.vector({dimensions})"
            )
        indexed = dimensions <= 2000  # pgvector's HNSW limit for vector
        if indexed:
            await conn.execute(
                f"CREATE INDEX IF NOT EXISTS {VECTOR_INDEX} ON memory_facts"
                f" USING hnsw (embedding {s}.vector_cosine_ops)"
            )
    version = await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    return VectorPath("pgvector", dimensions, schema, indexed, reset, version=version)


#: ``(dimensions | None) -> VectorPath``: on PostgreSQL, creates pgvector if it can, then the
#: ``vector(dimensions)`` column and its HNSW index (replacing a column of another dimension).
VECTOR_SETUP = ops.procedure(
    "memory.vector_setup",
    sqlite=_vector_setup_sqlite,
    postgres=_vector_setup_postgres,
    writes=True,
)


def _vector_search_sqlite(
    conn: Any,
    *,
    owner: str,
    vector: np.ndarray,
    now: str,
    limit: int,
    max_distance: float,
    path: VectorPath,
) -> list[Fact]:
    cache = path.cache if path.cache is not None else VectorCache(0)  # 0: nothing is kept
    entry = cache.load(conn, owner, len(vector))
    best = nearest(entry, vector, now=now, limit=limit, max_distance=max_distance)
    if not best:
        return []
    ids = [fact_id for fact_id, _ in best]
    # by primary key only: `+` keeps the planner off the owner's indexes, which it would
    # otherwise choose and read every fact of the owner through (8 ms at 100,000)
    rows = conn.execute(
        f"SELECT id, {FACT_COLUMNS} FROM memory_facts WHERE id IN ({','.join('?' * len(ids))})"
        " AND +owner = ? AND (+expires_at IS NULL OR +expires_at > ?)",
        (*ids, owner, now),
    ).fetchall()
    by_id = {r[0]: r[1:] for r in rows}
    return [fact_from_sqlite(by_id[i]) for i in ids if i in by_id]


async def _vector_search_postgres(
    conn: Any,
    *,
    owner: str,
    vector: np.ndarray,
    now: datetime,
    limit: int,
    max_distance: float,
    path: VectorPath,
) -> list[Fact]:
    s = quote_ident(path.schema or "public")
    mine = (
        f"SELECT {FACT_SELECT}, f.embedding OPERATOR({s}.<=>) $2::text::{s}.vector AS distance"
        " FROM memory_facts f WHERE f.owner = $1 AND f.embedding IS NOT NULL"
        " AND (f.expires_at IS NULL OR f.expires_at > $3)"
    )
    args = (owner, pg_vector(vector), now, limit)
    rows: list[Any] | None = None
    async with conn.transaction(readonly=True):
        # the plan depends on the owner (the index for a large one), so one per search
        if not path.indexed:
            await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
            few, share = True, None
        else:
            # the owner's facts counted along the recency index, never by sorting all of them
            # (sort and JIT off for that query only); and the share of the owner among the
            # most common ones, which the planner's statistics know: one round trip
            await conn.execute(SEARCH_SETTINGS)
            few, share = await conn.fetchrow(
                f"SELECT ({AT_MOST}), (SELECT m.freq FROM pg_stats s,"
                " unnest(s.most_common_vals::text::text[], s.most_common_freqs)"
                " AS m(owner, freq) WHERE s.schemaname = current_schema()"
                " AND s.tablename = 'memory_facts' AND s.attname = 'owner' AND m.owner = $1)",
                owner,
                path.exact_up_to,
            )
        ef = EF_SEARCH_FIRST
        if not few and share:
            ef = min(max(math.ceil(limit / share * EF_SEARCH_MARGIN), ef), EF_SEARCH_MAX)
        reset = "RESET enable_sort; RESET jit; "
        while not few:
            # the index yields at most ef_search rows of every user, the owner's kept after
            await conn.execute(f"{reset}SET LOCAL hnsw.ef_search = {int(ef)}")
            reset = ""
            rows = await conn.fetch(f"{mine} ORDER BY distance LIMIT $4", *args)
            if len(rows) >= limit:
                break
            # the owner's share of what the index returned says how many rows it takes
            ef = math.ceil(limit * ef / max(len(rows), 1) * EF_SEARCH_MARGIN)
            if ef > EF_SEARCH_MAX:
                rows = None  # more than the index may return: the exact scan
                break
        if reset and path.indexed:
            await conn.execute(reset)  # a user with few facts: the exact scan, as planned
        if rows is None or len(rows) < limit:
            # every one of the owner's facts compared (OFFSET 0 keeps the index out of it)
            rows = await conn.fetch(
                f"SELECT * FROM ({mine} OFFSET 0) f ORDER BY distance LIMIT $4", *args
            )
    return [fact_from_postgres(r) for r in rows if r["distance"] <= max_distance]


#: ``(owner, vector, now, limit, max_distance, path) -> [Fact]``: the owner's facts within
#: ``max_distance`` (cosine) of ``vector``, nearest first, expired never.
VECTOR_SEARCH = ops.procedure(
    "memory.vector_search",
    sqlite=_vector_search_sqlite,
    postgres=_vector_search_postgres,
)


def _missing_sqlite(
    conn: Any,
    *,
    after: int,
    limit: int,
    dimensions: int,
    now: str,
    count: bool = False,
    everything: bool = False,
) -> Any:
    where = (
        "(embedding IS NULL OR length(embedding) != ? OR ?)"
        " AND (expires_at IS NULL OR expires_at > ?)"
    )
    if count:
        return conn.execute(
            f"SELECT count(*) FROM memory_facts WHERE {where}", (4 * dimensions, everything, now)
        ).fetchone()[0]
    rows = conn.execute(
        f"SELECT id, category, key, value FROM memory_facts WHERE {where} AND id > ?"
        " ORDER BY id LIMIT ?",
        (4 * dimensions, everything, now, after, limit),
    ).fetchall()
    return [tuple(r) for r in rows]


async def _missing_postgres(
    conn: Any,
    *,
    after: int,
    limit: int,
    dimensions: int,
    now: datetime,
    count: bool = False,
    everything: bool = False,
) -> Any:
    where = "(embedding IS NULL OR {all}) AND (expires_at IS NULL OR expires_at > $1)".format(
        all="TRUE" if everything else "FALSE"
    )
    if count:
        return await conn.fetchval(f"SELECT count(*) FROM memory_facts WHERE {where}", now)
    rows = await conn.fetch(
        f"SELECT id, category, key, value FROM memory_facts WHERE {where} AND id > $2"
        " ORDER BY id LIMIT $3",
        now,
        after,
        limit,
    )
    return [tuple(r) for r in rows]


#: ``(after, limit, dimensions, now, count=False, everything=False) -> [(id, category, key,
#: value)]`` of every user's unexpired facts without an embedding (of this dimension; with
#: ``everything``, all of them), by id after ``after``; with ``count=True``, how many.
MISSING_EMBEDDINGS = ops.procedure(
    "memory.missing_embeddings",
    sqlite=_missing_sqlite,
    postgres=_missing_postgres,
)


def _set_embeddings_sqlite(
    conn: Any, *, rows: list[tuple[int, str, np.ndarray]], path: VectorPath
) -> int:
    done = 0
    for fact_id, value, vector in rows:
        done += conn.execute(
            "UPDATE memory_facts SET embedding = ? WHERE id = ? AND value = ?",
            (vector_blob(vector), fact_id, value),
        ).rowcount
    return done


async def _set_embeddings_postgres(
    conn: Any, *, rows: list[tuple[int, str, np.ndarray]], path: VectorPath
) -> int:
    s = quote_ident(path.schema or "public")
    status = await conn.execute(
        f"UPDATE memory_facts f SET embedding = v.e::{s}.vector"
        " FROM unnest($1::bigint[], $2::text[], $3::text[]) AS v(id, value, e)"
        " WHERE f.id = v.id AND f.value = v.value",
        [r[0] for r in rows],
        [r[1] for r in rows],
        [pg_vector(r[2]) for r in rows],
    )
    return int(status.split()[-1])


#: ``(rows=[(id, value, vector)], path) -> updated``: store embeddings computed for facts, unless a
#: fact's value changed meanwhile (a save then stored its own).
SET_EMBEDDINGS = ops.procedure(
    "memory.set_embeddings",
    sqlite=_set_embeddings_sqlite,
    postgres=_set_embeddings_postgres,
    writes=True,
)
