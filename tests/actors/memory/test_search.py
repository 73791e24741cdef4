"""The lexical search over per-user tokens (``actors/memory/tokens.py``, migration 5 of the
memory set), on both backends: what a word is, what a search finds (whole words before word
starts, ``it`` never inside ``with``, case and diacritics ignored, expired never, the limit),
that the index is partitioned by user inside its tokens (another user's facts are not even in
the lists a search reads, and an owner whose tag collides is still filtered out), that every
write keeps the index in step, and that a database from before the tokens upgrades (the
start-up backfill, with searches working meanwhile)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime

import pytest

from tests.actors.memory._support import SetClock
from turnstile.actors.memory.queries import search_columns, search_lexemes
from turnstile.actors.memory.schema import MEMORY
from turnstile.actors.memory.service import Memory
from turnstile.actors.memory.settings import MemoryConfig
from turnstile.actors.memory.tokens import (
    MAX_TOKENS,
    MAX_WORD_CHARS,
    TAG_CHARS,
    fact_tokens,
    owner_tag,
    query_words,
    words,
)
from turnstile.runtime.errors import StoreError
from turnstile.runtime.store import MigrationSet, open_store, ops

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
#: two owners whose tags collide (the first 8 hex digits of their SHA-256 are c29dbc05)
TWINS = ("user90137", "user118756")


@asynccontextmanager
async def open_memory(url: str, clock: SetClock | None = None, **config):
    async with open_store(url, migrations=[MEMORY]) as store:
        memory = Memory(store, clock or SetClock(T0), MemoryConfig(**config))
        await memory.start()
        yield memory


async def keys(memory: Memory, owner: str, query: str, **kw) -> list[str]:
    return [f.key for f in await memory.search(owner, query, **kw)]


# ---- words and tokens -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Dark roast, no sugar!", ["dark", "roast", "no", "sugar"]),
        ("ThinkPad X1", ["thinkpad", "x1"]),
        ("Café crème", ["cafe", "creme"]),  # diacritics stripped
        ("CAFE\u0301", ["cafe"]),  # a combining accent too
        ("Straße", ["strasse"]),  # casefold, not lower
        ("İstanbul", ["istanbul"]),
        ("foo_bar-baz.qux", ["foo", "bar", "baz", "qux"]),  # not letters or digits: cut
        ("it's 100% ＡＢＣ", ["it", "s", "100", "abc"]),  # NFKD folds full-width letters
        ("東京 タワー", ["東京", "タワー"]),
        ("?! -- ...", []),
        ("x" * 100, ["x" * MAX_WORD_CHARS]),
    ],
)
def test_words_are_folded_and_cut_at_everything_but_letters_and_digits(text, expected):
    assert words(text) == expected


def test_query_words_are_distinct_and_bounded():
    assert query_words("Roast roast ROAST dark") == ["roast", "dark"]
    assert len(query_words(" ".join(f"w{i}" for i in range(40)))) == 16


def test_tokens_carry_the_owners_tag():
    tag = owner_tag("ada")
    assert len(tag) == TAG_CHARS and tag[0] == "o" and int(tag[1:], 16) >= 0
    assert owner_tag("ada") == tag != owner_tag("adam")
    assert fact_tokens("ada", "Drinks", "coffee", "Dark roast") == (
        f"{tag}drinks",
        f"{tag}coffee",
        f"{tag}dark {tag}roast",
    )
    # the twins really collide; they are used below
    assert owner_tag(TWINS[0]) == owner_tag(TWINS[1])
    # at most MAX_TOKENS per fact, the category and key first
    many = fact_tokens("ada", "c", "k", " ".join(["w"] * (2 * MAX_TOKENS)))
    assert sum(len(column.split()) for column in many) == MAX_TOKENS
    assert search_lexemes("ada", "c", "k", "w w v") == [f"{tag}c", f"{tag}k", f"{tag}w", f"{tag}v"]


# ---- what a search finds, on both backends --------------------------------------------------


async def test_whole_words_come_before_word_starts_and_never_inside_a_word(store_url):
    async with open_memory(store_url) as memory:
        await memory.save("ada", category="devices", key="laptop", value="ThinkPad with a dock")
        await memory.save("ada", category="notes", key="it", value="IT department on floor 3")
        await memory.save("ada", category="notes", key="item", value="an item to return")
        # "it" is a whole word of two facts and the start of "item": never inside "with"
        found = await keys(memory, "ada", "it")
        assert set(found) == {"it", "item"} and "laptop" not in found
        assert await keys(memory, "ada", "thinkp") == ["laptop"]
        assert await keys(memory, "ada", "ith") == []
        assert await keys(memory, "ada", "floor") == ["it"]


async def test_case_and_diacritics_do_not_matter(store_url):
    async with open_memory(store_url) as memory:
        await memory.save("ada", category="drinks", key="favourite", value="Café crème")
        await memory.save("ada", category="home", key="street", value="Hauptstrasse 5")
        for query in ("cafe", "CAFÉ", "Cafe\u0301", "creme"):
            assert await keys(memory, "ada", query) == ["favourite"], query
        assert await keys(memory, "ada", "Hauptstraße") == ["street"]


async def test_expired_facts_and_the_limit(store_url):
    clock = SetClock(T0)
    async with open_memory(store_url, clock) as memory:
        for i in range(20):
            await memory.save("ada", category="notes", key=f"n{i}", value=f"note {i}")
        await memory.save("ada", category="notes", key="soon", value="note gone", expires_days=1)
        assert len(await keys(memory, "ada", "note")) == 15
        assert len(await keys(memory, "ada", "note", limit=30)) == 21
        assert await keys(memory, "ada", "gone") == ["soon"]
        clock.at = T0.replace(day=3)
        assert await keys(memory, "ada", "gone") == []
        assert "soon" not in await keys(memory, "ada", "note", limit=30)


async def test_expired_facts_among_the_best_ranked_are_skipped_not_counted(store_url):
    """SQLite asks FTS5 for its best ``limit + RANK_SLACK`` first: when expired facts take
    those places, it asks again, and the search still returns ``limit`` live facts."""
    clock = SetClock(T0)
    async with open_memory(store_url, clock) as memory:
        for i in range(40):
            await memory.save("ada", category="c", key=f"old{i}", value="tea", expires_days=1)
        for i in range(5):
            await memory.save("ada", category="c", key=f"live{i}", value="tea and more words")
        clock.at = T0.replace(day=3)
        assert sorted(await keys(memory, "ada", "tea")) == [f"live{i}" for i in range(5)]


async def test_a_word_only_in_older_facts_is_found_past_the_newest(store_url, monkeypatch):
    """Both backends read a bounded number of the user's newest facts first (PostgreSQL's
    ``RECENT_WINDOW`` of its recency index, SQLite's ``RANK_WINDOW`` of a word's matches for
    bm25); a word those do not hold is still found, through the index."""
    from turnstile.actors.memory import search_queries as queries

    monkeypatch.setattr(queries, "RECENT_WINDOW", 4)
    monkeypatch.setattr(queries, "RANK_WINDOW", 4)
    clock = SetClock(T0)
    async with open_memory(store_url, clock) as memory:
        await memory.save("ada", category="zoo", key="old", value="zebra and lion")
        for i in range(10):
            clock.at = T0.replace(minute=i + 1)
            await memory.save("ada", category="zoo", key=f"new{i}", value="a lion")
        assert await keys(memory, "ada", "zebra") == ["old"]
        assert await keys(memory, "ada", "zebra lion", limit=1) == ["old"]  # every word
        assert await keys(memory, "ada", "zebra tiger") == ["old"]  # some of the words
        assert len(await keys(memory, "ada", "lion")) == 11
        if store_url.startswith("postgres"):  # newest first within a stage
            assert await keys(memory, "ada", "lion", limit=2) == ["new9", "new8"]


async def test_a_failing_stage_raises_the_stores_own_error(store_url):
    """The vector and lexical stages run at once (``Memory.search``); a failure comes out as
    the store's typed error, not wrapped in an exception group."""
    async with open_memory(store_url) as memory:
        await memory.save("ada", category="drinks", key="coffee", value="espresso")
    with pytest.raises(StoreError, match="store is closed"):
        await memory.search("ada", "espresso")


# ---- one user's tokens are theirs -----------------------------------------------------------


async def _lists_postgres(conn, *, token: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT owner FROM memory_facts WHERE search_tokens @@ $1::tsquery", f"'{token}'"
    )
    return sorted(r[0] for r in rows)


def _lists_sqlite_sync(conn, *, token: str) -> list[str]:
    rows = conn.execute(
        "SELECT f.owner FROM memory_facts_search s JOIN memory_facts f ON f.id = s.rowid"
        " WHERE memory_facts_search MATCH ?",
        (f'"{token}"',),
    ).fetchall()
    return sorted(r[0] for r in rows)


#: ``(token) -> [owner]``: whose facts the index lists under one token
INDEX_LIST = ops.procedure("test.index_list", sqlite=_lists_sqlite_sync, postgres=_lists_postgres)


async def test_a_search_reads_only_its_users_lists(store_url):
    async with open_memory(store_url) as memory:
        await memory.save("alice", category="health", key="allergy", value="peanuts")
        await memory.save("alice", category="drinks", key="coffee", value="espresso")
        await memory.save("bob", category="drinks", key="coffee", value="filter")
        store = memory.store
        # the index lists each word under each owner's own token
        assert await store.run(INDEX_LIST, token=owner_tag("bob") + "coffee") == ["bob"]
        assert await store.run(INDEX_LIST, token=owner_tag("alice") + "coffee") == ["alice"]
        assert await store.run(INDEX_LIST, token=owner_tag("bob") + "peanuts") == []
        assert await store.run(INDEX_LIST, token="peanuts") == []  # no untagged words
        assert await keys(memory, "bob", "peanuts") == []
        assert [f.value for f in await memory.search("bob", "coffee")] == ["filter"]


async def test_an_owner_whose_tag_collides_is_still_filtered_out(store_url):
    first, second = TWINS
    async with open_memory(store_url) as memory:
        await memory.save(first, category="health", key="allergy", value="peanuts")
        for i in range(30):  # enough to fill a ranked first ask on SQLite
            await memory.save(first, category="notes", key=f"n{i}", value="shared word")
        await memory.save(second, category="notes", key="mine", value="shared word")
        tag_list = await memory.store.run(INDEX_LIST, token=owner_tag(first) + "peanuts")
        assert tag_list == [first]  # the same list serves both, so the owner test must hold
        assert await keys(memory, second, "peanuts") == []
        assert await keys(memory, second, "shared") == ["mine"]
        assert len(await keys(memory, first, "shared", limit=50)) == 30


# ---- every write keeps the index in step ----------------------------------------------------


def _check_sqlite(conn) -> list[tuple[str, str]]:
    # FTS5 compares its index with what the content table's columns say
    conn.execute(
        "INSERT INTO memory_facts_search (memory_facts_search, rank) VALUES ('integrity-check', 1)"
    )
    rows = conn.execute(
        "SELECT owner, category, key, value, search_category, search_key, search_value"
        " FROM memory_facts"
    ).fetchall()
    return [(r[0], r[2]) for r in rows if tuple(r[4:]) != search_columns(r[0], r[1], r[2], r[3])]


async def _check_postgres(conn) -> list[tuple[str, str]]:
    rows = await conn.fetch(
        "SELECT owner, category, key, value, search_tokens::text AS tokens FROM memory_facts"
    )
    stale = []
    for r in rows:
        expected = await conn.fetchval(
            "SELECT array_to_tsvector($1::text[])::text",
            search_lexemes(r["owner"], r["category"], r["key"], r["value"]),
        )
        if r["tokens"] != expected:
            stale.append((r["owner"], r["key"]))
    return stale


#: ``() -> [(owner, key)]`` of facts whose tokens do not say what their text says (SQLite:
#: after FTS5's own integrity check of the index against them)
STALE = ops.procedure("test.stale", sqlite=_check_sqlite, postgres=_check_postgres, writes=True)


async def test_updates_and_deletes_keep_the_index_in_step(store_url):
    clock = SetClock(T0)
    async with open_memory(store_url, clock, max_facts_per_user=3) as memory:
        await memory.save("ada", category="pets", key="dog", value="a beagle called Rex")
        await memory.save("ada", category="pets", key="cat", value="a tabby")
        await memory.save("ada", category="trip", key="hotel", value="Lisbon", expires_days=1)
        await memory.save("ada", category="pets", key="dog", value="a collie called Rex")
        assert await keys(memory, "ada", "beagle") == []
        assert await keys(memory, "ada", "collie") == ["dog"]
        assert await memory.forget("ada", "cat") == 1
        assert await keys(memory, "ada", "tabby") == []
        clock.at = T0.replace(day=3)  # the hotel expires; the next save deletes it
        await memory.save("ada", category="pets", key="fish", value="a goldfish")
        assert await keys(memory, "ada", "lisbon") == []
        assert await memory.store.run(STALE) == []
        await memory.save("bob", category="pets", key="dog", value="a beagle")
        await memory.delete_user("ada")
        assert await keys(memory, "ada", "collie") == []
        assert await keys(memory, "bob", "beagle") == ["dog"]
        assert await memory.store.run(STALE) == []


# ---- a database from before the tokens -----------------------------------------------------

#: The memory set as it was before migration 5 (FTS5 over the text on SQLite, the trigram
#: regex search on PostgreSQL).
BEFORE_TOKENS = MigrationSet("memory", MEMORY.migrations[:4])


def _old_rows_sqlite(conn, *, rows: list[tuple[str, str, str, str]], now: str) -> None:
    conn.executemany(
        "INSERT INTO memory_facts (owner, category, key, value, source, confidence,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, 'conversation', 70, ?, ?)",
        [(*r, now, now) for r in rows],
    )


async def _old_rows_postgres(conn, *, rows: list[tuple[str, str, str, str]], now) -> None:
    await conn.executemany(
        "INSERT INTO memory_facts (owner, category, key, value, source, confidence,"
        " created_at, updated_at) VALUES ($1, $2, $3, $4, 'conversation', 70, $5, $5)",
        [(*r, now) for r in rows],
    )


OLD_ROWS = ops.procedure(
    "test.old_rows", sqlite=_old_rows_sqlite, postgres=_old_rows_postgres, writes=True
)


async def test_an_old_database_upgrades_and_searches_meanwhile(store_url, caplog):
    rows = [("ada", "notes", f"n{i}", f"note number {i}") for i in range(25)]
    rows += [("ada", "drinks", "coffee", "Café crème"), ("bob", "drinks", "coffee", "tea")]
    async with open_store(store_url, migrations=[BEFORE_TOKENS]) as store:
        await store.run(OLD_ROWS, rows=rows, now=store.db_time(T0))
    caplog.set_level("INFO", logger="turnstile.memory")
    async with open_memory(store_url) as memory:
        assert memory.unindexed == 27
        assert "27 facts from before the search tokens" in caplog.text
        # not indexed yet: the search reads the user's such facts, and finds the same
        assert await keys(memory, "ada", "cafe") == ["coffee"]
        assert await keys(memory, "ada", "caf") == ["coffee"]
        assert await keys(memory, "bob", "cafe") == []
        assert len(await keys(memory, "ada", "note")) == 15
        # a save meanwhile writes its own tokens
        await memory.save("ada", category="drinks", key="tea", value="green tea")
        assert await memory.index_unindexed(batch_size=10) == 27
        assert "indexed 27 facts from before the search tokens" in caplog.text
        assert await memory.index_unindexed() == 0  # safe to run again
        assert await memory.store.run(STALE) == []
    async with open_memory(store_url) as memory:
        assert memory.unindexed == 0
        assert await keys(memory, "ada", "cafe") == ["coffee"]
        assert await keys(memory, "ada", "tea") == ["tea"]
        assert await keys(memory, "bob", "tea") == ["coffee"]
        assert len(await keys(memory, "ada", "note")) == 15
