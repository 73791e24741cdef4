"""The memory feature's queries: store operations (``ops.procedure``), one function per backend.

Every query takes the owner (the user the facts belong to) and filters on it; none takes a
fact's id, so no id can reach another user's fact. Times are passed in as the store stores
them (``store.db_time``); ``now`` is always an argument, so expiry follows the node's clock.

Search is lexical here, one function per backend, both over the same tokens
(``tokens.py``): each word of a fact glued to its owner's tag, written by every save
(``search_columns``, ``search_lexemes``), so an index lookup for a word returns only that
user's facts holding it. Words are case-folded and stripped of diacritics, and matched as
whole words or word starts (``it`` finds ``item``, never ``with``).

* SQLite: FTS5 (``schema.SEARCH_TABLE``), each word of the query a prefix term, ranked with
  ``bm25`` (key weighs double), computed for each word's ``RANK_WINDOW`` newest matches.
* PostgreSQL: a ``tsvector`` with a GIN index, in stages, each run only while fewer than
  ``limit`` were found: every word a whole word; every word the start of one (both newest
  first); some of the words (more matched first, among the ``CANDIDATES`` newest facts of
  each word); with pg_trgm, similar words (``word_similarity``, so a typo still finds, among
  the user's ``NEAR_MISS_WINDOW`` newest facts). Newest first is read from the owner's recency
  index (``RECENT_WINDOW`` facts at most: a common word stops early), else from the GIN index
  (a rare word's few matches). A plan is made per search (``plan_cache_mode``).

Facts written before the tokens (migration 5) are found too, until the start-up backfill
(``INDEX_UNINDEXED``) reaches them: a search reads its user's such facts and matches them
here, in Python, with the same words. ``docs/memory.md``, "Search at scale", has the figures.

The vector stage (``VECTOR_SEARCH``) compares the query's embedding with the facts' ones:
cosine in numpy over the owner's embedded facts on SQLite (kept in memory between searches,
``vector_cache``), pgvector's ``<=>`` on PostgreSQL: exactly over the owner's facts for a user
with few of them, through the HNSW index for a larger one with ``hnsw.ef_search`` sized to
the owner's share of the table (pgvector before 0.8 filters the owner after the index scan,
which returns at most ``ef_search`` rows; see ``EF_SEARCH_FIRST``).
Embeddings are passed in as float32 numpy vectors, already L2-normalised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, overload

import msgspec
import numpy as np

from turnstile.actors.memory.schema import (
    ENSURE_TRIGRAM,
    ENSURE_VECTOR,
    RECENT_INDEX,
    SEARCH_INDEX,
    SEARCH_TABLE,
    SEARCH_TEXT,
    UNINDEXED_INDEX,
    VECTOR_INDEX,
)
from turnstile.actors.memory.tokens import fact_tokens, fact_words, owner_tag, query_words
from turnstile.actors.memory.vector_cache import VectorCache, nearest
from turnstile.runtime.errors import LimitExceeded
from turnstile.runtime.store import ops

__all__ = [
    "DELETE_USER",
    "DETECT",
    "INDEX_UNINDEXED",
    "UNINDEXED",
    "EXTRACTED_AT",
    "FORGET",
    "GET_SUMMARY",
    "MISSING_EMBEDDINGS",
    "SET_EMBEDDINGS",
    "VECTOR_SEARCH",
    "VECTOR_SETUP",
    "VectorPath",
    "LIST",
    "MARK_EXTRACTED",
    "SAVE",
    "SEARCH",
    "SET_SUMMARY",
    "SORT_KEYS",
    "Fact",
    "SearchPath",
    "Summary",
    "search_columns",
    "search_lexemes",
    "search_terms",
]

SORT_KEYS = ("category", "key", "value", "source", "confidence", "created_at", "updated_at")
#: SQLite's ranked search (``docs/memory.md``, "Search at scale"): for each word of the query,
#: bm25 is computed for the ``RANK_WINDOW`` most recently created facts of the user holding it
#: (all of them, for a word with fewer matches); the candidates' scores are summed over the
#: words (bm25 is a sum over them), and the best are read from the table ``limit +
#: RANK_SLACK`` at a time, expired facts and another owner's (a colliding tag) dropped. When
#: that leaves fewer than ``limit`` and a word had more matches than its window, every match
#: is ranked.
RANK_WINDOW = 2000
RANK_SLACK = 16
#: The PostgreSQL search (``docs/memory.md``, "Search at scale"). A stage that wants the newest
#: matches first reads the owner's ``RECENT_WINDOW`` newest facts (the owner's recency index)
#: and, only when they hold too few, the word's matches from the GIN index. The "some of the
#: words" stage ranks the ``CANDIDATES`` newest facts holding each word. The similar-words
#: stage (pg_trgm only) reads the user's ``NEAR_MISS_WINDOW`` newest facts: no index serves a
#: similarity test cheaply (a trigram index would read the matches of a common trigram across
#: every user), so it is bounded by what it reads (~7 ms for 1,000 facts). Its threshold is
#: ``WORD_SIMILARITY`` (pg_trgm's default ``word_similarity_threshold``, fixed here so that a
#: server's setting does not change results). It runs for queries of at most
#: ``SIMILAR_MAX_WORDS`` words: it compares the whole query with each fact, and a longer one
#: reaches the threshold only against a fact holding most of its words, which the earlier
#: stages found (a question of eight words scored at most 0.18 here).
RECENT_WINDOW = 2000
CANDIDATES = 200
NEAR_MISS_WINDOW = 1000
WORD_SIMILARITY = 0.6
SIMILAR_MAX_WORDS = 3

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
EXACT_VECTOR_UP_TO = 2000
EF_SEARCH_FIRST = 100
EF_SEARCH_MAX = 1000
EF_SEARCH_MARGIN = 1.5

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


_COLUMNS = (
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


def _like(text: str) -> str:
    """``%text%`` with LIKE's wildcards escaped (``ESCAPE '\\'``)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@overload
def _sqlite_time(value: str) -> datetime: ...
@overload
def _sqlite_time(value: None) -> None: ...
def _sqlite_time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _fact_sqlite(row: Any) -> Fact:
    return Fact(
        owner=row[0],
        category=row[1],
        key=row[2],
        value=row[3],
        source=row[4],
        confidence=row[5],
        created_at=_sqlite_time(row[6]),
        updated_at=_sqlite_time(row[7]),
        last_verified_at=_sqlite_time(row[8]),
        expires_at=_sqlite_time(row[9]),
        source_context=row[10],
    )


def _fact_postgres(row: Any) -> Fact:
    return Fact(*tuple(row)[:11])


def _quote_ident(name: str) -> str:
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


def _blob(vector: np.ndarray | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype="<f4").tobytes()


def _pg_vector(vector: np.ndarray | None) -> str | None:
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
        f" RETURNING {_COLUMNS}",
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
            _blob(fact.get("embedding")),
            *search_columns(owner, fact["category"], fact["key"], fact["value"]),
        ),
    ).fetchone()
    return _fact_sqlite(row)


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
        embed_col, embed_val = ", embedding", f", $11::text::{_quote_ident(vector.schema)}.vector"
        extra = [_pg_vector(fact.get("embedding"))]
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
            + f" RETURNING {_COLUMNS}",
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
        return _fact_postgres(row)


def _full(max_facts: int) -> LimitExceeded:
    return LimitExceeded(f"memory holds at most {max_facts} facts per user", field="key")


#: ``(owner, fact={category, key, value, source, confidence, expires_at, source_context,
#: embedding}, now, max_facts, vector) -> Fact``: insert, or replace the value and metadata
#: of, ``(owner, category, key)``; the owner's expired facts go first; a new key beyond
#: ``max_facts`` is refused.
SAVE = ops.procedure("memory.save", sqlite=_save_sqlite, postgres=_save_postgres, writes=True)


# ---- search ---------------------------------------------------------------------------------


def _rank_unindexed(rows: list[Any], terms: list[str], limit: int) -> list[Any]:
    """The rows (without search tokens yet: written before migration 5) that match ``terms``,
    ranked as the PostgreSQL stages rank (every word whole, every word a start, more words),
    newest first within a rank, at most ``limit``. Rows are ``(id, owner, category, key,
    value, …, updated_at at 8)``: the fact's columns after its id."""
    ranked = []
    for row in rows:
        tokens = [w for column in fact_words(row[2], row[3], row[4]) for w in column]
        whole = set(tokens)
        starts = [any(t.startswith(term) for t in tokens) for term in terms]
        hits = sum(starts)
        if not hits:
            continue
        if all(term in whole for term in terms):
            stage = 0
        elif hits == len(terms):
            stage = 1
        else:
            stage = 2
        ranked.append((stage, -hits, row))
    ranked.sort(key=lambda r: (r[0], r[1]))  # stable: newest first within a rank, as read
    return [r[2] for r in ranked[:limit]]


def _unindexed_rows_sqlite(conn: Any, owner: str, now: str) -> list[Any]:
    return conn.execute(
        f"SELECT id, {_COLUMNS} FROM memory_facts INDEXED BY {UNINDEXED_INDEX}"
        " WHERE owner = ? AND search_value IS NULL AND (expires_at IS NULL OR expires_at > ?)"
        " ORDER BY updated_at DESC, id DESC",
        (owner, now),
    ).fetchall()


def _search_sqlite(
    conn: Any, *, owner: str, query: str, now: str, limit: int, path: SearchPath
) -> list[Fact]:
    terms = search_terms(query)
    if not terms:
        return []
    tag = owner_tag(owner)
    # The tokens carry the owner's tag, so FTS5 reads only this user's matches. bm25 costs
    # about a microsecond per match (the row's size is looked up for each), so per word it is
    # computed for its newest RANK_WINDOW matches only (FTS5 walks the word's list by rowid,
    # newest first, and stops): a rare word's matches are always all there, whatever else the
    # query asks. bm25 of the query is the sum of its words' (FTS5's bm25 adds a term per
    # phrase, with the same IDF and sizes), so a candidate's score is exact for every word
    # whose window holds it.
    per_word = " UNION ALL ".join(
        f"SELECT rowid, rank FROM (SELECT rowid, rank FROM {SEARCH_TABLE}"
        f" WHERE {SEARCH_TABLE} MATCH ?{i + 3} ORDER BY rowid DESC LIMIT ?1)"
        for i in range(len(terms))
    )
    # best first (bm25 is negative: lower is better), then the most recently created
    ranked_sql = (
        f"SELECT rowid, sum(rank) AS score FROM ({per_word}) GROUP BY rowid"
        " ORDER BY score, rowid DESC LIMIT ?2"
    )
    phrases = [f'"{tag}{term}"*' for term in terms]
    window, n = RANK_WINDOW, limit + RANK_SLACK
    while True:
        ranked = conn.execute(ranked_sql, (window, n, *phrases)).fetchall()
        found: list[Any] = []
        for start in range(0, len(ranked), 500):
            # the owner again (a colliding tag) and expiry; by primary key only: `+` keeps
            # the planner off the owner's indexes
            ids = [r[0] for r in ranked[start : start + 500]]
            rows = conn.execute(
                f"SELECT id, {_COLUMNS} FROM memory_facts"
                f" WHERE id IN ({','.join('?' * len(ids))}) AND +owner = ?"
                " AND (+expires_at IS NULL OR +expires_at > ?)",
                (*ids, owner, now),
            ).fetchall()
            by_id = {r[0]: r[1:] for r in rows}
            found += [by_id[i] for i in ids if i in by_id]
            if len(found) >= limit:
                break
        if len(found) >= limit:
            break
        if n > 0 and len(ranked) == n:
            n = -1  # every candidate of the windows
        elif window > 0 and len(ranked) >= window:
            # as many candidates as a window holds: some word may have more matches
            window = n = -1
        else:
            break
    found = found[:limit]
    if len(found) < limit:
        # facts written before migration 5 whose tokens the start-up backfill has not written
        # yet: none once it is done (an empty partial index answers at once)
        unindexed = _unindexed_rows_sqlite(conn, owner, now)
        if unindexed:
            found += [r[1:] for r in _rank_unindexed(unindexed, terms, limit - len(found))]
    return [_fact_sqlite(r) for r in found]


_NEWEST = "f.updated_at DESC, f.id DESC"
_FACT = ", ".join(f"f.{c.strip()}" for c in _COLUMNS.split(","))
#: The text the similar-words stage compares (pg_trgm's ``word_similarity``).
_TEXT = SEARCH_TEXT.replace("category", "f.category").replace("key", "f.key")
_TEXT = _TEXT.replace("value", "f.value")
_LIVE = "(f.expires_at IS NULL OR f.expires_at > $2) AND f.id <> ALL($3::bigint[])"
#: The lexical search's transaction settings. A plan per search: what is cheap depends on
#: the words. No sort where an index gives the order: with statistics that underestimate the
#: owner's facts (a table analysed before a bulk load, until autovacuum analyses it again)
#: the planner would rather read and sort all of them than walk the recency index and stop;
#: every query that does sort here has no other way. ``enable_sort = off`` prices a sort at
#: 10^10, which would make PostgreSQL compile the query (JIT, 70 ms here) for nothing: off.
_SEARCH_SETTINGS = (
    "SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL enable_sort = off;"
    " SET LOCAL jit = off"
)
#: ``$2`` or fewer facts of owner ``$1``? Counted along the owner's recency index, never by a
#: sequential scan that stops early: with synchronised scans (a table larger than a quarter
#: of shared_buffers) such a scan starts where the last one stopped and may read the whole
#: table before it wraps round to the owner's rows (100 ms here, every fiftieth search).
_AT_MOST = (
    "SELECT count(*) <= $2 FROM (SELECT 1 FROM memory_facts WHERE owner = $1"
    " ORDER BY updated_at DESC, id DESC LIMIT $2 + 1) AS mine"
)


def _source(how: Literal["recent", "tokens", "window"], where: str) -> str:
    """Where a PostgreSQL stage reads the owner's facts (``$1``) from, as ``f``:

    * ``recent``: the owner's ``RECENT_WINDOW`` newest facts (the owner's recency index,
      newest first, so a stage that needs few matches stops after them);
    * ``tokens``: the facts whose tokens match ``where``, from the GIN index alone (the
      tokens carry the owner's tag, so these are the owner's matches, and a colliding
      tag's, which the owner test drops); materialised so that the planner cannot swap it
      for a walk of all the owner's facts, which a rare word would read to the end;
    * ``window``: the owner's ``NEAR_MISS_WINDOW`` newest facts (a test no index serves).
    """
    if how == "tokens":
        return f"(SELECT * FROM memory_facts f WHERE {where} OFFSET 0) f"
    size = RECENT_WINDOW if how == "recent" else NEAR_MISS_WINDOW
    return f"(SELECT * FROM memory_facts f WHERE f.owner = $1 ORDER BY {_NEWEST} LIMIT {size}) f"


def _newest_sql(how: Literal["recent", "tokens"], where: str, columns: str) -> str:
    """The owner's (``$1``) unexpired facts matching ``where`` that no earlier stage returned
    (``$3``), newest first, at most ``$4``: ``columns`` of them."""
    return (
        f"SELECT {columns} FROM {_source(how, where)} WHERE f.owner = $1 AND {_LIVE}"
        f" AND {where} ORDER BY {_NEWEST} LIMIT $4"
    )


#: For each tsquery of ``$4`` (words rare among the owner's newest facts), the ids of the
#: ``CANDIDATES`` newest of the owner's (``$1``) unexpired facts matching it that no earlier
#: stage returned (``$3``), read from the GIN index (``_source("tokens")``), one word after
#: another in one query.
_RARE_WORDS_SQL = (
    "SELECT m.id FROM unnest($4::tsquery[]) AS w(q), LATERAL (SELECT f.id FROM"
    " (SELECT * FROM memory_facts f WHERE f.search_tokens @@ w.q OFFSET 0) f"
    f" WHERE f.owner = $1 AND {_LIVE} ORDER BY {_NEWEST} LIMIT {CANDIDATES}) AS m"
)


def _some_words_sql(words: int) -> str:
    """The facts of ids ``$5`` (the owner's, unexpired, not yet returned) ranked by how many
    of the ``words`` tsqueries ``$6``… they match, then newest first, at most ``$4``; ``id``
    first, then the fact's columns, then the rank."""
    hits = " + ".join(f"(f.search_tokens @@ ${6 + i}::tsquery)::int" for i in range(words))
    # the rows by primary key alone (OFFSET 0 keeps the owner test out of the inner query:
    # with statistics that underestimate the owner's facts, the planner read all of them
    # through the owner's index to intersect with the ids, 4 ms at 100,000)
    return (
        f"SELECT f.id, {_FACT}, {hits} AS rank"
        " FROM (SELECT * FROM memory_facts f WHERE f.id = ANY($5::bigint[]) OFFSET 0) f"
        f" WHERE f.owner = $1 AND {_LIVE} ORDER BY rank DESC, {_NEWEST} LIMIT $4"
    )


def _similar_sql(similarity: str) -> str:
    """Among the owner's ``NEAR_MISS_WINDOW`` newest facts, the unexpired ones not yet returned
    whose ``similarity`` is at least ``$6``, closest then newest first, at most ``$4``; ``id``
    first, then the fact's columns, then the similarity."""
    # OFFSET 0: the inner query is not merged into the outer one, so the similarity is
    # computed once per fact, not again for the filter
    return (
        f"SELECT * FROM (SELECT f.id, {_FACT}, {similarity} AS rank"
        f" FROM {_source('window', 'TRUE')} WHERE f.owner = $1 AND {_LIVE} OFFSET 0) f"
        f" WHERE f.rank >= $6 ORDER BY f.rank DESC, {_NEWEST} LIMIT $4"
    )


def _tsquery(lexemes: list[str], op: str, *, prefix: bool) -> str:
    """A tsquery in its text form (cast with ``::tsquery``, which takes quoted lexemes as they
    are): the lexemes joined by ``op``, each a word start when ``prefix``. Lexemes are letters
    and digits (``tokens.py``), so quoting them needs no escape."""
    star = ":*" if prefix else ""
    return f" {op} ".join(f"'{lexeme}'{star}" for lexeme in lexemes)


async def _search_postgres(
    conn: Any, *, owner: str, query: str, now: datetime, limit: int, path: SearchPath
) -> list[Fact]:
    terms = search_terms(query)
    if not terms:
        return []
    tag = owner_tag(owner)
    lexemes = [tag + t for t in terms]
    found: list[Any] = []
    covered: list[bool] = []  # whether RECENT_WINDOW holds all the owner's facts (once asked)

    async def everything_recent() -> bool:
        if not covered:
            covered.append(await conn.fetchval(_AT_MOST, owner, RECENT_WINDOW))
        return covered[0]

    async def newest(where: str, wanted: int, columns: str, *args: Any) -> list[Any]:
        # the newest matches among the owner's newest facts: a word common in them stops
        # the walk early; if they hold too few, the GIN index reads all the word's matches,
        # which are then few (or the window was all the owner has)
        ids = [r[0] for r in found]
        head = (owner, now, ids, wanted)
        rows = await conn.fetch(_newest_sql("recent", where, columns), *head, *args)
        if len(rows) < wanted and not await everything_recent():
            rows = await conn.fetch(_newest_sql("tokens", where, columns), *head, *args)
        return rows

    async with conn.transaction(readonly=True):
        await conn.execute(_SEARCH_SETTINGS)
        every = "f.search_tokens @@ $5::tsquery"
        fact = f"f.id, {_FACT}"
        # 1. every word a whole word, 2. every word the start of one: newest first
        for prefix in (False, True):
            if len(found) < limit:
                tsquery = _tsquery(lexemes, "&", prefix=prefix)
                found += await newest(every, limit - len(found), fact, tsquery)
        # 3. some of the words (when two or more were asked): more words matched first,
        # then newest, among the CANDIDATES newest facts holding each word (so a rare word's
        # facts are among them, however many facts hold a common one)
        if len(terms) > 1 and len(found) < limit:
            each = [_tsquery([lexeme], "|", prefix=True) for lexeme in lexemes]
            # one walk of the owner's newest facts says which words each holds
            flags = ", ".join(f"f.search_tokens @@ ${4 + i}::tsquery" for i in range(len(each)))
            recent = await conn.fetch(
                f"SELECT f.id, {flags} FROM {_source('recent', 'TRUE')}"
                f" WHERE f.owner = $1 AND {_LIVE} AND ({' OR '.join(flags.split(', '))})"
                f" ORDER BY {_NEWEST}",
                owner,
                now,
                [r[0] for r in found],
                *each,
            )
            candidates: set[int] = set()
            rare = []
            for i, tsquery in enumerate(each):
                holding = [r[0] for r in recent if r[1 + i]][:CANDIDATES]
                if len(holding) < CANDIDATES and not await everything_recent():
                    rare.append(tsquery)
                else:
                    candidates.update(holding)
            if rare:
                # the words rare among the newest facts: their newest matches, from the index,
                # all in one query
                rows = await conn.fetch(_RARE_WORDS_SQL, owner, now, [r[0] for r in found], rare)
                candidates.update(r[0] for r in rows)
            if candidates:
                rows = await conn.fetch(
                    _some_words_sql(len(terms)),
                    owner,
                    now,
                    [r[0] for r in found],
                    limit - len(found),
                    list(candidates),
                    *each,
                )
                found += [tuple(r)[:-1] for r in rows]  # without the rank
        # facts written before migration 5 that the start-up backfill has not reached yet
        # (none once it is done: an empty partial index answers at once)
        if len(found) < limit:
            # no ORDER BY: nothing tempts the planner to walk all the owner's facts newest
            # first; the partial index holds exactly these rows, sorted here
            unindexed = await conn.fetch(
                f"SELECT f.id, {_FACT} FROM memory_facts f WHERE f.owner = $1"
                f" AND f.search_tokens IS NULL AND {_LIVE}",
                owner,
                now,
                [r[0] for r in found],
            )
            if unindexed:
                unindexed.sort(key=lambda r: (r["updated_at"], r["id"]), reverse=True)
                found += _rank_unindexed(unindexed, terms, limit - len(found))
        # 4. similar words (pg_trgm), among the owner's newest facts: closest first
        short = len(terms) <= SIMILAR_MAX_WORDS
        if path.trgm_schema is not None and short and len(found) < limit:
            s = _quote_ident(path.trgm_schema)
            rows = await conn.fetch(
                _similar_sql(f"{s}.word_similarity($5, {_TEXT})"),
                owner,
                now,
                [r[0] for r in found],
                limit - len(found),
                " ".join(terms),
                WORD_SIMILARITY,
            )
            found += [tuple(r)[:-1] for r in rows]  # without the similarity
    return [_fact_postgres(tuple(r)[1:]) for r in found]


#: ``(owner, query, now, limit, path) -> [Fact]``, best first, expired facts never.
SEARCH = ops.procedure("memory.search", sqlite=_search_sqlite, postgres=_search_postgres)


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
    s = _quote_ident(schema)
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
        f"SELECT id, {_COLUMNS} FROM memory_facts WHERE id IN ({','.join('?' * len(ids))})"
        " AND +owner = ? AND (+expires_at IS NULL OR +expires_at > ?)",
        (*ids, owner, now),
    ).fetchall()
    by_id = {r[0]: r[1:] for r in rows}
    return [_fact_sqlite(by_id[i]) for i in ids if i in by_id]


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
    s = _quote_ident(path.schema or "public")
    mine = (
        f"SELECT {_FACT}, f.embedding OPERATOR({s}.<=>) $2::text::{s}.vector AS distance"
        " FROM memory_facts f WHERE f.owner = $1 AND f.embedding IS NOT NULL"
        " AND (f.expires_at IS NULL OR f.expires_at > $3)"
    )
    args = (owner, _pg_vector(vector), now, limit)
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
            await conn.execute(_SEARCH_SETTINGS)
            few, share = await conn.fetchrow(
                f"SELECT ({_AT_MOST}), (SELECT m.freq FROM pg_stats s,"
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
    return [_fact_postgres(r) for r in rows if r["distance"] <= max_distance]


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
            (_blob(vector), fact_id, value),
        ).rowcount
    return done


async def _set_embeddings_postgres(
    conn: Any, *, rows: list[tuple[int, str, np.ndarray]], path: VectorPath
) -> int:
    s = _quote_ident(path.schema or "public")
    status = await conn.execute(
        f"UPDATE memory_facts f SET embedding = v.e::{s}.vector"
        " FROM unnest($1::bigint[], $2::text[], $3::text[]) AS v(id, value, e)"
        " WHERE f.id = v.id AND f.value = v.value",
        [r[0] for r in rows],
        [r[1] for r in rows],
        [_pg_vector(r[2]) for r in rows],
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


# ---- list -----------------------------------------------------------------------------------


def _list_where(
    owner: str | None, category: str | None, search: str | None, sigil: str
) -> tuple[str, list[Any]]:
    """The WHERE clause of a list and its arguments after ``now`` (always the first).

    Placeholders are numbered on both backends (``?2`` on SQLite, ``$2`` on PostgreSQL), so
    the search pattern is passed once for its three columns.
    """
    clauses, args = [f"(expires_at IS NULL OR expires_at > {sigil}1)"], []
    if owner is not None:
        args.append(owner)
        clauses.append(f"owner = {sigil}{1 + len(args)}")
    if category is not None:
        args.append(category)
        clauses.append(f"category = {sigil}{1 + len(args)}")
    if search:
        args.append(_like(search))
        m = f"{sigil}{1 + len(args)}"
        like = "LIKE" if sigil == "?" else "ILIKE"  # SQLite's LIKE ignores ASCII case
        clauses.append(
            "("
            + " OR ".join(f"{c} {like} {m} ESCAPE '\\'" for c in ("category", "key", "value"))
            + ")"
        )
    return " AND ".join(clauses), args


def _order(sort_by: str, sort_order: str) -> str:
    if sort_by not in SORT_KEYS or sort_order not in ("asc", "desc"):
        raise ValueError(f"cannot sort by {sort_by!r} {sort_order!r}")
    return f"{sort_by} {sort_order.upper()}, owner, category, key"


def _list_sqlite(
    conn: Any,
    *,
    owner: str | None,
    now: str,
    limit: int,
    offset: int,
    search: str | None,
    sort_by: str,
    sort_order: str,
    category: str | None = None,
) -> tuple[list[Fact], int]:
    where, args = _list_where(owner, category, search, "?")
    n = 2 + len(args)
    (total,) = conn.execute(
        f"SELECT count(*) FROM memory_facts WHERE {where}", (now, *args)
    ).fetchone()
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM memory_facts WHERE {where}"
        f" ORDER BY {_order(sort_by, sort_order)} LIMIT ?{n} OFFSET ?{n + 1}",
        (now, *args, limit, offset),
    ).fetchall()
    return [_fact_sqlite(r) for r in rows], total


async def _list_postgres(
    conn: Any,
    *,
    owner: str | None,
    now: datetime,
    limit: int,
    offset: int,
    search: str | None,
    sort_by: str,
    sort_order: str,
    category: str | None = None,
) -> tuple[list[Fact], int]:
    where, args = _list_where(owner, category, search, "$")
    n = 2 + len(args)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        total = await conn.fetchval(f"SELECT count(*) FROM memory_facts WHERE {where}", now, *args)
        rows = await conn.fetch(
            f"SELECT {_COLUMNS} FROM memory_facts WHERE {where}"
            f" ORDER BY {_order(sort_by, sort_order)} LIMIT ${n} OFFSET ${n + 1}",
            now,
            *args,
            limit,
            offset,
        )
    return [_fact_postgres(r) for r in rows], total


#: ``(owner | None, now, limit, offset, search, sort_by, sort_order) -> ([Fact], total)``;
#: ``owner=None`` is every user's (admins only: the caller checks). ``search`` is a
#: case-insensitive substring of category, key or value; ``category`` (optional) keeps that
#: category's facts only (exact, as saved).
LIST = ops.procedure("memory.list", sqlite=_list_sqlite, postgres=_list_postgres)


# ---- summary --------------------------------------------------------------------------------


def _get_summary_sqlite(conn: Any, *, owner: str) -> Summary | None:
    row = conn.execute(
        "SELECT content, updated_at FROM memory_summary WHERE owner = ?", (owner,)
    ).fetchone()
    return None if row is None else Summary(row[0], _sqlite_time(row[1]))


async def _get_summary_postgres(conn: Any, *, owner: str) -> Summary | None:
    row = await conn.fetchrow(
        "SELECT content, updated_at FROM memory_summary WHERE owner = $1", owner
    )
    return None if row is None else Summary(row[0], row[1])


def _set_summary_sqlite(conn: Any, *, owner: str, content: str, now: str) -> Summary:
    conn.execute(
        "INSERT INTO memory_summary (owner, content, updated_at) VALUES (?, ?, ?)"
        " ON CONFLICT (owner) DO UPDATE SET content = excluded.content,"
        " updated_at = excluded.updated_at",
        (owner, content, now),
    )
    return Summary(content, _sqlite_time(now))


async def _set_summary_postgres(conn: Any, *, owner: str, content: str, now: datetime) -> Summary:
    await conn.execute(
        "INSERT INTO memory_summary (owner, content, updated_at) VALUES ($1, $2, $3)"
        " ON CONFLICT (owner) DO UPDATE SET content = excluded.content,"
        " updated_at = excluded.updated_at",
        owner,
        content,
        now,
    )
    return Summary(content, now)


#: ``(owner) -> Summary | None``.
GET_SUMMARY = ops.procedure(
    "memory.get_summary",
    sqlite=_get_summary_sqlite,
    postgres=_get_summary_postgres,
)
#: ``(owner, content, now) -> Summary``: replaces the owner's summary.
SET_SUMMARY = ops.procedure(
    "memory.set_summary",
    sqlite=_set_summary_sqlite,
    postgres=_set_summary_postgres,
    writes=True,
)


# ---- extraction state -----------------------------------------------------------------------


def _mark_sqlite(conn: Any, *, session_key: str, at: str) -> None:
    conn.execute(
        "INSERT INTO memory_session_state (session_key, extracted_at) VALUES (?, ?)"
        " ON CONFLICT (session_key) DO UPDATE SET extracted_at = excluded.extracted_at",
        (session_key, at),
    )


async def _mark_postgres(conn: Any, *, session_key: str, at: datetime) -> None:
    await conn.execute(
        "INSERT INTO memory_session_state (session_key, extracted_at) VALUES ($1, $2)"
        " ON CONFLICT (session_key) DO UPDATE SET extracted_at = excluded.extracted_at",
        session_key,
        at,
    )


def _extracted_sqlite(conn: Any, *, session_key: str) -> datetime | None:
    row = conn.execute(
        "SELECT extracted_at FROM memory_session_state WHERE session_key = ?", (session_key,)
    ).fetchone()
    return None if row is None else _sqlite_time(row[0])


async def _extracted_postgres(conn: Any, *, session_key: str) -> datetime | None:
    return await conn.fetchval(
        "SELECT extracted_at FROM memory_session_state WHERE session_key = $1", session_key
    )


def _end_session_sqlite(conn: Any, *, session_key: str) -> None:
    conn.execute("DELETE FROM memory_session_state WHERE session_key = ?", (session_key,))


async def _end_session_postgres(conn: Any, *, session_key: str) -> None:
    await conn.execute("DELETE FROM memory_session_state WHERE session_key = $1", session_key)


#: ``(session_key, at)``: the session was processed by extraction at ``at``.
MARK_EXTRACTED = ops.procedure(
    "memory.mark_extracted", sqlite=_mark_sqlite, postgres=_mark_postgres, writes=True
)
#: ``(session_key) -> datetime | None``.
EXTRACTED_AT = ops.procedure(
    "memory.extracted_at",
    sqlite=_extracted_sqlite,
    postgres=_extracted_postgres,
)
#: ``(session_key)``: forget a deleted session's extraction state.
END_SESSION = ops.procedure(
    "memory.end_session",
    sqlite=_end_session_sqlite,
    postgres=_end_session_postgres,
    writes=True,
)


# ---- a user's data --------------------------------------------------------------------------


def _delete_user_sqlite(conn: Any, *, owner: str) -> dict[str, int]:
    facts = conn.execute("DELETE FROM memory_facts WHERE owner = ?", (owner,)).rowcount
    summary = conn.execute("DELETE FROM memory_summary WHERE owner = ?", (owner,)).rowcount
    sessions = conn.execute(
        "DELETE FROM memory_session_state WHERE substr(session_key, 1, ?) = ?",
        (len(owner) + 1, owner + "/"),
    ).rowcount
    return {"facts": facts, "summary": summary, "sessions": sessions}


async def _delete_user_postgres(conn: Any, *, owner: str) -> dict[str, int]:
    async with conn.transaction():
        counts = [
            await conn.execute("DELETE FROM memory_facts WHERE owner = $1", owner),
            await conn.execute("DELETE FROM memory_summary WHERE owner = $1", owner),
            await conn.execute(
                "DELETE FROM memory_session_state WHERE starts_with(session_key, $1 || '/')",
                owner,
            ),
        ]
    facts, summary, sessions = (int(s.split()[-1]) for s in counts)
    return {"facts": facts, "summary": summary, "sessions": sessions}


#: ``(owner) -> {"facts", "summary", "sessions"}`` rows deleted: everything memory holds about
#: a user, in one transaction (their sessions' keys are ``<owner>/<name>``).
DELETE_USER = ops.procedure(
    "memory.delete_user",
    sqlite=_delete_user_sqlite,
    postgres=_delete_user_postgres,
    writes=True,
)
