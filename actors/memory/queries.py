"""The memory feature's queries: store operations (``ops.procedure``), one function per backend.

Every query takes the owner (the user the facts belong to) and filters on it; none takes a
fact's id, so no id can reach another user's fact. Times are passed in as the store stores
them (``store.db_time``); ``now`` is always an argument, so expiry follows the node's clock.

Search (``search_queries.py``) is lexical, one function per backend, both over the same tokens
(``tokens.py``): each word of a fact glued to its owner's tag, written by every save
(``search_columns``, ``search_lexemes``), so an index lookup for a word returns only that
user's facts holding it. Words are case-folded and stripped of diacritics, and matched as
whole words or word starts (``it`` finds ``item``, never ``with``).

Search is in ``search_queries.py``, the vector stage in ``vector_queries.py``, listing, the
summary, extraction state and a user's deletion in ``account_queries.py``; this module holds
the records, the tokens every save writes, start-up detection and backfill, save and forget.

It is over 400 lines because a fact's save (tokens, expiry, the limit, the embedding) is written
once per backend with its start-up detection and backfill beside it, which read the same columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, overload

import msgspec

from turnstile.actors.memory.schema import (
    ENSURE_TRIGRAM,
    RECENT_INDEX,
    SEARCH_INDEX,
    UNINDEXED_INDEX,
)
from turnstile.actors.memory.tokens import fact_tokens, query_words
from turnstile.actors.memory.vector_cache import VectorCache
from turnstile.runtime.errors import LimitExceeded
from turnstile.runtime.store import ops

if TYPE_CHECKING:  # numpy is imported where vectors are made (~0.1 s a process otherwise)
    import numpy as np

__all__ = [
    "DETECT",
    "INDEX_UNINDEXED",
    "UNINDEXED",
    "FORGET",
    "VectorPath",
    "SAVE",
    "SORT_KEYS",
    "Fact",
    "SearchPath",
    "Summary",
    "search_columns",
    "search_lexemes",
    "search_terms",
]

#: A user with at most this many embedded facts is compared with each (``vector_queries``).
EXACT_VECTOR_UP_TO = 2000
SORT_KEYS = ("category", "key", "value", "source", "confidence", "created_at", "updated_at")
Source = Literal["conversation", "tool_call", "auto_discovery", "user_explicit"]


class Fact(msgspec.Struct, frozen=True):
    """One stored fact."""

    #: the user it belongs to.
    owner: str
    category: str
    key: str
    value: str
    #: how it was learnt: conversation, tool_call, auto_discovery or user_explicit.
    source: str
    #: 0–100.
    confidence: int
    created_at: datetime
    updated_at: datetime
    #: when it was last stated or confirmed (every save sets it).
    last_verified_at: datetime | None = None
    #: after this it is never returned (None: never expires).
    expires_at: datetime | None = None
    #: where it came from, in a few words (a quote, a tool name).
    source_context: str | None = None


class Summary(msgspec.Struct, frozen=True):
    """A user's narrative summary."""

    content: str
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class SearchPath:
    """How this node searches by words, decided once at start-up (``DETECT``).

    Attributes:
        kind: ``fts5`` (SQLite) or ``tsvector`` (PostgreSQL: a GIN index on the facts'
            tokens, core PostgreSQL, on every server).
        trgm_schema: (``tsvector``) the schema pg_trgm lives in, when it is installed: then a
            last stage finds similar words (a typo); None: no such stage.
        indexed: the search's indexes exist (PostgreSQL: the GIN index on the tokens and the
            owner's recency index).
        missing: the names of those that do not (for the start-up log).
    """

    kind: Literal["fts5", "tsvector"]
    trgm_schema: str | None = None
    indexed: bool = False
    missing: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.kind == "fts5":
            return "SQLite FTS5, tokens per user, ranked with bm25"
        how = "indexed" if self.indexed else "missing " + ", ".join(self.missing)
        stages = "whole words, word starts, some of the words"
        if self.trgm_schema is None:
            return (
                f"PostgreSQL tsvector, tokens per user, {how}: {stages}"
                " (no pg_trgm: no similar-words stage)"
            )
        return (
            f"PostgreSQL tsvector, tokens per user, {how}: {stages}, then similar words"
            f" (pg_trgm, schema {self.trgm_schema})"
        )


@dataclass(frozen=True, slots=True)
class VectorPath:
    """How this node stores and searches embeddings, decided once at start-up.

    Attributes:
        kind: ``numpy`` (SQLite), ``pgvector`` (PostgreSQL with the extension), ``none``.
        dimensions: the embedder's vector size (None: no embedder).
        schema: the schema pgvector lives in, whenever the ``embedding`` column exists
            (PostgreSQL; a save then always sets the column, NULL without a vector).
        indexed: the HNSW cosine index exists (``pgvector``).
        reset: the column was replaced at this start (the dimension changed): every
            embedding is gone until a backfill.
        why: for ``none``, the reason, for the log.
        cache: (``numpy``) the per-user matrices kept between searches (``vector_cache``);
            None reads them from the store at every search.
        version: (``pgvector``) the extension's version, for the log.
        exact_up_to: (``pgvector``) a user with at most this many facts is searched
            exactly, without the index (``EXACT_VECTOR_UP_TO``; tests lower it).
    """

    kind: Literal["numpy", "pgvector", "none"]
    dimensions: int | None = None
    schema: str | None = None
    indexed: bool = False
    reset: bool = False
    why: str = ""
    cache: VectorCache | None = field(default=None, compare=False, repr=False)
    version: str | None = None
    exact_up_to: int = EXACT_VECTOR_UP_TO

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.kind == "numpy":
            return f"SQLite, cosine in numpy over the user's facts ({self.dimensions} dims)"
        if self.kind == "pgvector":
            how = "with an HNSW cosine index" if self.indexed else "without an index"
            return (
                f"PostgreSQL pgvector {self.version} (schema {self.schema}) {how},"
                f" vector({self.dimensions})"
            )
        return f"none ({self.why}): lexical only"


FACT_COLUMNS = (
    "owner, category, key, value, source, confidence, created_at, updated_at,"
    " last_verified_at, expires_at, source_context"
)


def search_terms(query: str) -> list[str]:
    """The query's words as the index holds them (``tokens.query_words``): folded, first
    occurrences only, at most ``tokens.MAX_TERMS``."""
    return query_words(query)


def search_columns(owner: str, category: str, key: str, value: str) -> tuple[str, str, str]:
    """SQLite: what a write puts in ``search_category``, ``search_key`` and ``search_value``
    (``tokens.fact_tokens``). Every write of category, key or value must set them."""
    return fact_tokens(owner, category, key, value)


def search_lexemes(owner: str, category: str, key: str, value: str) -> list[str]:
    """PostgreSQL: the distinct tokens a write puts in ``search_tokens``
    (``array_to_tsvector`` of them). Every write of category, key or value must set it."""
    seen: dict[str, None] = {}
    for column in fact_tokens(owner, category, key, value):
        seen.update(dict.fromkeys(column.split()))
    return list(seen)


def like_pattern(text: str) -> str:
    """``%text%`` with LIKE's wildcards escaped (``ESCAPE '\\'``)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@overload
def sqlite_time(value: str) -> datetime: ...
@overload
def sqlite_time(value: None) -> None: ...
def sqlite_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def fact_from_sqlite(row: Any) -> Fact:
    return Fact(
        owner=row[0],
        category=row[1],
        key=row[2],
        value=row[3],
        source=row[4],
        confidence=row[5],
        created_at=sqlite_time(row[6]),
        updated_at=sqlite_time(row[7]),
        last_verified_at=sqlite_time(row[8]),
        expires_at=sqlite_time(row[9]),
        source_context=row[10],
    )


def fact_from_postgres(row: Any) -> Fact:
    return Fact(*tuple(row)[:11])


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# ---- start-up: which search path -----------------------------------------------------------


def _detect_sqlite(conn: Any) -> SearchPath:
    return SearchPath("fts5", indexed=True)


async def _detect_postgres(conn: Any) -> SearchPath:
    # pg_trgm, when it can be had: the list's substring search uses its per-column indexes,
    # and the search's similar-words stage its word_similarity (only if this role may use
    # the schema it lives in)
    await conn.execute(ENSURE_TRIGRAM)
    schema = await conn.fetchval(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'pg_trgm' AND has_schema_privilege(n.oid, 'USAGE')"
    )
    missing = await conn.fetchval(
        "SELECT coalesce(array_agg(i.name ORDER BY i.n), '{}') FROM unnest($1::text[])"
        " WITH ORDINALITY AS i(name, n) WHERE to_regclass(i.name) IS NULL",
        [SEARCH_INDEX, RECENT_INDEX],
    )
    return SearchPath("tsvector", schema, not missing, tuple(missing))


#: ``() -> SearchPath``; on PostgreSQL it first creates what it can (``schema.ENSURE_TRIGRAM``).
DETECT = ops.procedure(
    "memory.detect", sqlite=_detect_sqlite, postgres=_detect_postgres, writes=True
)


# ---- facts written before the search tokens (migration 5) ---------------------------------


def _unindexed_sqlite(conn: Any) -> int:
    (count,) = conn.execute(
        f"SELECT count(*) FROM memory_facts INDEXED BY {UNINDEXED_INDEX} WHERE search_value IS NULL"
    ).fetchone()
    return count


async def _unindexed_postgres(conn: Any) -> int:
    return await conn.fetchval("SELECT count(*) FROM memory_facts WHERE search_tokens IS NULL")


#: ``() -> int``: how many facts have no search tokens yet (a database from before migration
#: 5); read through ``schema.UNINDEXED_INDEX``, so nothing to count costs nothing.
UNINDEXED = ops.procedure(
    "memory.unindexed", sqlite=_unindexed_sqlite, postgres=_unindexed_postgres
)


def _index_unindexed_sqlite(conn: Any, *, after: int, limit: int) -> tuple[int, int | None]:
    rows = conn.execute(
        "SELECT id, owner, category, key, value FROM memory_facts"
        " WHERE id > ? AND search_value IS NULL ORDER BY id LIMIT ?",
        (after, limit),
    ).fetchall()
    conn.executemany(
        "UPDATE memory_facts SET search_category = ?, search_key = ?, search_value = ?"
        " WHERE id = ?",
        [(*search_columns(r[1], r[2], r[3], r[4]), r[0]) for r in rows],
    )
    return len(rows), (rows[-1][0] if len(rows) == limit else None)


async def _index_unindexed_postgres(conn: Any, *, after: int, limit: int) -> tuple[int, int | None]:
    async with conn.transaction():
        rows = await conn.fetch(
            "SELECT id, owner, category, key, value FROM memory_facts"
            " WHERE id > $1 AND search_tokens IS NULL ORDER BY id LIMIT $2",
            after,
            limit,
        )
        await conn.execute(
            "UPDATE memory_facts f SET search_tokens = array_to_tsvector(string_to_array(v.t, ' '))"
            " FROM unnest($1::bigint[], $2::text[]) AS v(id, t)"
            " WHERE f.id = v.id AND f.search_tokens IS NULL",
            [r[0] for r in rows],
            [" ".join(search_lexemes(r[1], r[2], r[3], r[4])) for r in rows],
        )
        if len(rows) < limit and (rows or after):
            # the last batch of a run that wrote tokens: the planner's statistics of them
            # (autovacuum would get there, later)
            await conn.execute("ANALYZE memory_facts")
    return len(rows), (rows[-1][0] if len(rows) == limit else None)


#: ``(after, limit) -> (done, next_after | None)``: writes the search tokens of up to ``limit``
#: facts without them, by id after ``after``, in one transaction; ``next_after`` is None when
#: there are no more (on PostgreSQL the table is then analysed).
INDEX_UNINDEXED = ops.procedure(
    "memory.index_unindexed",
    sqlite=_index_unindexed_sqlite,
    postgres=_index_unindexed_postgres,
    writes=True,
)


# ---- save -----------------------------------------------------------------------------------


def vector_blob(vector: np.ndarray | None) -> bytes | None:
    if vector is None:
        return None
    import numpy as np

    return np.asarray(vector, dtype="<f4").tobytes()


def pg_vector(vector: np.ndarray | None) -> str | None:
    """pgvector's text form, ``[0.1,0.2,…]`` (passed as text and cast: asyncpg has no codec)."""
    return None if vector is None else "[" + ",".join(map(repr, vector.tolist())) + "]"


def _save_sqlite(
    conn: Any,
    *,
    owner: str,
    fact: dict[str, Any],
    now: str,
    max_facts: int,
    vector: VectorPath,
) -> Fact:
    conn.execute(
        "DELETE FROM memory_facts WHERE owner = ? AND expires_at IS NOT NULL AND expires_at <= ?",
        (owner, now),
    )
    exists = conn.execute(
        "SELECT 1 FROM memory_facts WHERE owner = ? AND category = ? AND key = ?",
        (owner, fact["category"], fact["key"]),
    ).fetchone()
    if exists is None:
        (count,) = conn.execute(
            "SELECT count(*) FROM memory_facts WHERE owner = ?", (owner,)
        ).fetchone()
        if count >= max_facts:
            raise _full(max_facts)
    row = conn.execute(
        "INSERT INTO memory_facts (owner, category, key, value, source, confidence, expires_at,"
        " last_verified_at, source_context, created_at, updated_at, embedding,"
        " search_category, search_key, search_value)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (owner, category, key) DO UPDATE SET value = excluded.value,"
        " source = excluded.source, confidence = excluded.confidence,"
        " expires_at = excluded.expires_at, last_verified_at = excluded.last_verified_at,"
        " source_context = excluded.source_context, updated_at = excluded.updated_at,"
        " embedding = excluded.embedding, search_category = excluded.search_category,"
        " search_key = excluded.search_key, search_value = excluded.search_value"
        f" RETURNING {FACT_COLUMNS}",
        (
            owner,
            fact["category"],
            fact["key"],
            fact["value"],
            fact["source"],
            fact["confidence"],
            fact["expires_at"],
            now,
            fact["source_context"],
            now,
            now,
            vector_blob(fact.get("embedding")),
            *search_columns(owner, fact["category"], fact["key"], fact["value"]),
        ),
    ).fetchone()
    return fact_from_sqlite(row)


async def _save_postgres(
    conn: Any,
    *,
    owner: str,
    fact: dict[str, Any],
    now: datetime,
    max_facts: int,
    vector: VectorPath,
) -> Fact:
    # the column exists only with pgvector; when it does, a save always sets it (NULL when
    # the embedder failed or is not configured), so a changed value never keeps a stale vector
    embed_col, embed_val, extra = "", "", []
    if vector.schema is not None:
        embed_col, embed_val = ", embedding", f", $11::text::{quote_ident(vector.schema)}.vector"
        extra = [pg_vector(fact.get("embedding"))]
    lexemes = search_lexemes(owner, fact["category"], fact["key"], fact["value"])
    async with conn.transaction():
        # one writer per owner at a time, so two new keys cannot both pass the count
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('memory:' || $1))", owner)
        await conn.execute(
            "DELETE FROM memory_facts WHERE owner = $1 AND expires_at <= $2", owner, now
        )
        exists = await conn.fetchval(
            "SELECT 1 FROM memory_facts WHERE owner = $1 AND category = $2 AND key = $3",
            owner,
            fact["category"],
            fact["key"],
        )
        if exists is None:
            count = await conn.fetchval("SELECT count(*) FROM memory_facts WHERE owner = $1", owner)
            if count >= max_facts:
                raise _full(max_facts)
        row = await conn.fetchrow(
            "INSERT INTO memory_facts (owner, category, key, value, source, confidence,"
            " expires_at, last_verified_at, source_context, created_at, updated_at,"
            f" search_tokens{embed_col})"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $8, $8,"
            f" array_to_tsvector($10::text[]){embed_val})"
            " ON CONFLICT (owner, category, key) DO UPDATE SET value = excluded.value,"
            " source = excluded.source, confidence = excluded.confidence,"
            " expires_at = excluded.expires_at, last_verified_at = excluded.last_verified_at,"
            " source_context = excluded.source_context, updated_at = excluded.updated_at,"
            " search_tokens = excluded.search_tokens"
            + (", embedding = excluded.embedding" if embed_col else "")
            + f" RETURNING {FACT_COLUMNS}",
            owner,
            fact["category"],
            fact["key"],
            fact["value"],
            fact["source"],
            fact["confidence"],
            fact["expires_at"],
            now,
            fact["source_context"],
            lexemes,
            *extra,
        )
        return fact_from_postgres(row)


def _full(max_facts: int) -> LimitExceeded:
    return LimitExceeded(f"memory holds at most {max_facts} facts per user", field="key")


#: ``(owner, fact={category, key, value, source, confidence, expires_at, source_context,
#: embedding}, now, max_facts, vector) -> Fact``: insert, or replace the value and metadata
#: of, ``(owner, category, key)``; the owner's expired facts go first; a new key beyond
#: ``max_facts`` is refused.
SAVE = ops.procedure("memory.save", sqlite=_save_sqlite, postgres=_save_postgres, writes=True)


# ---- forget ---------------------------------------------------------------------------------


def _forget_sqlite(conn: Any, *, owner: str, key: str, category: str | None) -> int:
    if category is None:
        cur = conn.execute("DELETE FROM memory_facts WHERE owner = ? AND key = ?", (owner, key))
    else:
        cur = conn.execute(
            "DELETE FROM memory_facts WHERE owner = ? AND key = ? AND category = ?",
            (owner, key, category),
        )
    return cur.rowcount


async def _forget_postgres(conn: Any, *, owner: str, key: str, category: str | None) -> int:
    status = await conn.execute(
        "DELETE FROM memory_facts WHERE owner = $1 AND key = $2"
        " AND ($3::text IS NULL OR category = $3)",
        owner,
        key,
        category,
    )
    return int(status.split()[-1])


#: ``(owner, key, category=None) -> deleted``: the owner's facts with that key (in that
#: category, if given).
FORGET = ops.procedure(
    "memory.forget", sqlite=_forget_sqlite, postgres=_forget_postgres, writes=True
)
