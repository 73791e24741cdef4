"""The memory feature's lexical search: the ``memory.search`` store operation, one function
per backend, both over the same tokens (``tokens.py``; ``queries.py`` writes them).

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
reaches them: a search reads its user's such facts and matches them here, in Python, with the
same words. ``docs/memory.md``, "Search at scale", has the figures.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from turnstile.actors.memory.queries import (
    FACT_COLUMNS,
    Fact,
    SearchPath,
    fact_from_postgres,
    fact_from_sqlite,
    quote_ident,
    search_terms,
)
from turnstile.actors.memory.schema import (
    SEARCH_TABLE,
    SEARCH_TEXT,
    UNINDEXED_INDEX,
)
from turnstile.actors.memory.tokens import fact_words, owner_tag
from turnstile.runtime.store import ops

__all__ = [
    "AT_MOST",
    "CANDIDATES",
    "FACT_SELECT",
    "NEAR_MISS_WINDOW",
    "RANK_SLACK",
    "RANK_WINDOW",
    "RECENT_WINDOW",
    "SEARCH",
    "SEARCH_SETTINGS",
    "SIMILAR_MAX_WORDS",
    "WORD_SIMILARITY",
]

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
        f"SELECT id, {FACT_COLUMNS} FROM memory_facts INDEXED BY {UNINDEXED_INDEX}"
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
                f"SELECT id, {FACT_COLUMNS} FROM memory_facts"
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
    return [fact_from_sqlite(r) for r in found]


_NEWEST = "f.updated_at DESC, f.id DESC"
FACT_SELECT = ", ".join(f"f.{c.strip()}" for c in FACT_COLUMNS.split(","))
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
SEARCH_SETTINGS = (
    "SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL enable_sort = off;"
    " SET LOCAL jit = off"
)
#: ``$2`` or fewer facts of owner ``$1``? Counted along the owner's recency index, never by a
#: sequential scan that stops early: with synchronised scans (a table larger than a quarter
#: of shared_buffers) such a scan starts where the last one stopped and may read the whole
#: table before it wraps round to the owner's rows (100 ms here, every fiftieth search).
AT_MOST = (
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
        f"SELECT f.id, {FACT_SELECT}, {hits} AS rank"
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
        f"SELECT * FROM (SELECT f.id, {FACT_SELECT}, {similarity} AS rank"
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
            covered.append(await conn.fetchval(AT_MOST, owner, RECENT_WINDOW))
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
        await conn.execute(SEARCH_SETTINGS)
        every = "f.search_tokens @@ $5::tsquery"
        fact = f"f.id, {FACT_SELECT}"
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
                f"SELECT f.id, {FACT_SELECT} FROM memory_facts f WHERE f.owner = $1"
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
            s = quote_ident(path.trgm_schema)
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
    return [fact_from_postgres(tuple(r)[1:]) for r in found]


#: ``(owner, query, now, limit, path) -> [Fact]``, best first, expired facts never.
SEARCH = ops.procedure("memory.search", sqlite=_search_sqlite, postgres=_search_postgres)
