"""The memory feature's tables and queries on both backends (``actors/memory``): upsert and
the reference's confidence rules, expiry, search (FTS5 bm25 on SQLite, tsvector stages on
PostgreSQL, both over per-user tokens: tests/actors/memory/test_search.py has more),
forget, list, summary, extraction state, a user's data deleted, and per-user isolation
throughout."""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager

import pytest

from tests.runtime.store._support import T0, Backend, ManualClock, pg_run
from turnstile.actors.memory.queries import SearchPath
from turnstile.actors.memory.schema import MEMORY
from turnstile.actors.memory.service import Memory, merge
from turnstile.actors.memory.settings import MemoryConfig
from turnstile.runtime.errors import InvalidArgument, LimitExceeded
from turnstile.runtime.store import open_store


@asynccontextmanager
async def open_memory(backend: Backend, clock: ManualClock, **config):
    async with open_store(backend.url, clock=clock, migrations=[MEMORY]) as store:
        memory = Memory(store, clock, MemoryConfig(**config))
        await memory.start()
        yield memory


@pytest.fixture
async def memory(backend: Backend, clock: ManualClock):
    async with open_memory(backend, clock) as m:
        yield m


async def test_the_search_path_is_decided_at_start_up(memory, backend):
    if backend.kind == "sqlite":
        assert memory.search_path == SearchPath("fts5", indexed=True)
    else:  # this machine's PostgreSQL offers pg_trgm and the tests run as superuser
        path = memory.search_path
        assert path.kind == "tsvector" and path.indexed and path.trgm_schema is not None


async def test_save_inserts_then_replaces_with_the_reference_confidence_defaults(memory, clock):
    first = await memory.save("ada", category="prefs", key="drink", value="coffee")
    assert (first.source, first.confidence) == ("conversation", 70)
    assert first.created_at == first.updated_at == first.last_verified_at == T0
    for source, expected in (("tool_call", 95), ("auto_discovery", 95), ("user_explicit", 90)):
        fact = await memory.save("ada", category="c", key=source, value="v", source=source)
        assert fact.confidence == expected
    clock.advance(minutes=5)
    # the reference's upsert replaces: a lower confidence from another source wins too
    second = await memory.save(
        "ada",
        category=" prefs ",
        key="drink ",
        value="tea",
        source="tool_call",
        confidence=40,
        source_context="order history",
    )
    assert (second.value, second.source, second.confidence) == ("tea", "tool_call", 40)
    assert second.source_context == "order history"
    assert second.created_at == T0 and second.updated_at == second.last_verified_at != T0
    facts, total = await memory.list_facts("ada", search="prefs")
    assert total == 1 and [f.value for f in facts] == ["tea"]


async def test_save_refuses_bad_values_naming_the_field(memory):
    cases = [
        ({"category": " ", "key": "k", "value": "v"}, "category"),
        ({"category": "c", "key": "k", "value": "x" * 2001}, "value"),
        ({"category": "c", "key": "k", "value": "v", "source": "rumour"}, "source"),
        ({"category": "c", "key": "k", "value": "v", "confidence": 101}, "confidence"),
        ({"category": "c", "key": "k", "value": "v", "expires_days": 0}, "expires_days"),
    ]
    for args, field in cases:
        with pytest.raises(InvalidArgument) as info:
            await memory.save("ada", **args)
        assert info.value.field == field


async def test_expired_facts_are_never_returned_and_make_room(backend, clock):
    async with open_memory(backend, clock, max_facts_per_user=2) as memory:
        await memory.save("ada", category="trip", key="hotel", value="Lisbon", expires_days=2)
        await memory.save("ada", category="home", key="city", value="Porto")
        with pytest.raises(LimitExceeded, match="at most 2 facts per user"):
            await memory.save("ada", category="home", key="street", value="Rua Nova")
        # updating a key is always allowed, and other users have their own room
        await memory.save("ada", category="home", key="city", value="Porto, Portugal")
        await memory.save("bob", category="home", key="city", value="Oslo")
        assert [f.key for f in await memory.search("ada", "lisbon")] == ["hotel"]
        clock.advance(days=2)
        assert await memory.search("ada", "lisbon") == []
        assert (await memory.list_facts("ada"))[1] == 1
        await memory.save("ada", category="home", key="street", value="Rua Nova")
        assert (await memory.list_facts("ada"))[1] == 2


async def test_search_finds_a_fact_by_a_word_of_its_value_best_first(memory):
    await memory.save("ada", category="preferences", key="coffee", value="dark roast, no sugar")
    await memory.save("ada", category="devices", key="laptop", value="ThinkPad with dark theme")
    await memory.save("ada", category="work", key="employer", value="Acme Robotics")
    assert [f.key for f in await memory.search("ada", "roast")] == ["coffee"]
    assert [f.key for f in await memory.search("ada", "ROBOTICS!")] == ["employer"]
    # two words matched rank above one
    ranked = await memory.search("ada", "dark roast")
    assert [f.key for f in ranked] == ["coffee", "laptop"]
    # prefixes and keys match; no word at all is no result
    assert [f.key for f in await memory.search("ada", "thinkp")] == ["laptop"]
    assert [f.key for f in await memory.search("ada", "employer")] == ["employer"]
    assert await memory.search("ada", "?!") == []
    assert await memory.search("ada", "nothing-like-it") == []


async def test_postgres_trigram_similarity_forgives_a_typo(memory, backend):
    await memory.save("ada", category="preferences", key="coffee", value="dark roast")
    typo = [f.key for f in await memory.search("ada", "cofee")]
    # FTS5 matches words and prefixes only; pg_trgm's word similarity also finds near misses
    assert typo == ([] if backend.kind == "sqlite" else ["coffee"])
    assert [f.key for f in await memory.search("ada", "cofee roast")] == ["coffee"]
    # the similar-words stage takes queries of at most three words
    # (search_queries.SIMILAR_MAX_WORDS)
    assert await memory.search("ada", "cofee in the morning") == []


async def test_search_limits(memory):
    for i in range(20):
        await memory.save("ada", category="notes", key=f"n{i}", value=f"note number {i}")
    assert len(await memory.search("ada", "note")) == 15
    assert len(await memory.search("ada", "note", limit=3)) == 3
    with pytest.raises(InvalidArgument, match="limit must be 1-50") as info:
        await memory.search("ada", "note", limit=51)
    assert info.value.field == "limit"


async def test_wildcards_in_words_match_only_themselves(memory):
    await memory.save("ada", category="c", key="pct", value="100% sure")
    await memory.save("ada", category="c", key="other", value="1000 apples")
    facts, total = await memory.list_facts("ada", search="0%")
    assert total == 1 and facts[0].key == "pct"
    facts, total = await memory.list_facts("ada", search="_")
    assert total == 0


async def test_one_user_never_reaches_anothers_facts(memory):
    await memory.save("alice", category="health", key="allergy", value="peanuts")
    await memory.set_summary("alice", "Alice is allergic to peanuts.")
    assert await memory.search("bob", "peanuts") == []
    assert await memory.list_facts("bob") == ([], 0)
    assert await memory.list_facts("bob", search="peanuts") == ([], 0)
    assert await memory.forget("bob", "allergy") == 0
    assert await memory.forget("bob", "allergy", "health") == 0
    assert await memory.get_summary("bob") is None
    # bob saving the same category and key makes a fact of his own
    await memory.save("bob", category="health", key="allergy", value="none")
    assert [f.value for f in await memory.search("alice", "allergy")] == ["peanuts"]
    assert [f.value for f in await memory.search("bob", "allergy")] == ["none"]
    everyone, total = await memory.list_facts(None, sort_by="value")
    assert total == 2 and {f.owner for f in everyone} == {"alice", "bob"}


async def test_forget_by_key_optionally_in_one_category(memory):
    await memory.save("ada", category="home", key="city", value="Porto")
    await memory.save("ada", category="birth", key="city", value="Braga")
    await memory.save("ada", category="home", key="street", value="Rua Nova")
    assert await memory.forget("ada", "city", "birth") == 1
    assert [f.value for f in await memory.search("ada", "city")] == ["Porto"]
    assert await memory.forget("ada", " city ") == 1
    assert await memory.forget("ada", "city") == 0
    assert [f.key for f in (await memory.list_facts("ada"))[0]] == ["street"]
    # forgotten facts leave the search index too
    assert await memory.search("ada", "porto") == []


async def test_list_pages_sorts_and_filters(memory, clock):
    for i, (category, key) in enumerate([("b", "k1"), ("a", "k2"), ("c", "k3"), ("a", "k4")]):
        clock.advance(seconds=1)
        await memory.save("ada", category=category, key=key, value=f"value {i}")
    facts, total = await memory.list_facts("ada")
    assert total == 4 and [f.key for f in facts] == ["k3", "k1", "k2", "k4"]  # category desc
    page, total = await memory.list_facts("ada", sort_by="updated_at", limit=2, offset=1)
    assert total == 4 and [f.key for f in page] == ["k3", "k2"]
    asc, _ = await memory.list_facts("ada", sort_by="key", sort_order="asc")
    assert [f.key for f in asc] == ["k1", "k2", "k3", "k4"]
    assert [f.key for f in (await memory.list_facts("ada", search="VALUE 2"))[0]] == ["k3"]
    for args, field in (
        ({"sort_by": "owner"}, "sort_by"),
        ({"sort_order": "up"}, "sort_order"),
        ({"offset": -1}, "offset"),
        ({"limit": 0}, "limit"),
    ):
        with pytest.raises(InvalidArgument) as info:
            await memory.list_facts("ada", **args)
        assert info.value.field == field


async def test_summary_and_extraction_state(memory, clock):
    assert await memory.get_summary("ada") is None
    await memory.set_summary("ada", "Likes coffee.")
    clock.advance(hours=1)
    summary = await memory.set_summary("ada", "Likes dark roast coffee.")
    got = await memory.get_summary("ada")
    assert got == summary and got.content == "Likes dark roast coffee." and got.updated_at > T0
    with pytest.raises(InvalidArgument) as info:
        await memory.set_summary("ada", "x" * 8001)
    assert info.value.field == "content"

    assert await memory.extracted_at("ada/main") is None
    await memory.mark_extracted("ada/main")
    assert await memory.extracted_at("ada/main") == clock.now()
    await memory.mark_extracted("ada/main", at=T0)
    assert await memory.extracted_at("ada/main") == T0
    await memory.end_session("ada/main")
    assert await memory.extracted_at("ada/main") is None


async def test_deleting_a_users_data_removes_all_of_it_and_only_it(memory):
    for user in ("ada", "adam"):
        await memory.save(user, category="c", key="k", value=f"{user}'s value")
        await memory.set_summary(user, f"about {user}")
        await memory.mark_extracted(f"{user}/main")
    deleted = await memory.delete_user("ada")
    assert deleted == {"facts": 1, "summary": 1, "sessions": 1}
    assert await memory.list_facts("ada") == ([], 0)
    assert await memory.search("ada", "value") == []
    assert await memory.get_summary("ada") is None
    assert await memory.extracted_at("ada/main") is None
    # "adam" starts with "ada" and keeps everything
    assert (await memory.list_facts("adam"))[1] == 1
    assert await memory.get_summary("adam") is not None
    assert await memory.extracted_at("adam/main") is not None


async def test_rows_outlive_the_store_and_the_index_follows(backend, clock):
    async with open_memory(backend, clock) as memory:
        await memory.save("ada", category="pets", key="dog", value="a beagle called Rex")
    async with open_memory(backend, clock) as memory:
        assert [f.key for f in await memory.search("ada", "beagle")] == ["dog"]
        await memory.save("ada", category="pets", key="dog", value="a collie called Rex")
        assert await memory.search("ada", "beagle") == []
        assert [f.key for f in await memory.search("ada", "collie")] == ["dog"]


def test_merge_keeps_the_first_occurrence_of_each_fact():
    from turnstile.actors.memory.queries import Fact

    def fact(key: str, value: str) -> Fact:
        return Fact("ada", "c", key, value, "conversation", 70, T0, T0)

    merged = merge([[fact("a", "1"), fact("b", "2")], [fact("b", "3"), fact("c", "4")]], 10)
    assert [(f.key, f.value) for f in merged] == [("a", "1"), ("b", "2"), ("c", "4")]
    assert len(merge([[fact("a", "1")], [fact("b", "2")]], 1)) == 1


@pytest.mark.postgres
async def test_postgres_without_pg_trgm_searches_without_the_similar_words_stage(pg_dsn, clock):
    """A role that may not create extensions: the migration still succeeds, no trigram index
    exists, and search uses the tsvector index (core PostgreSQL) without the similar-words
    stage (the decision is made at start-up)."""
    suffix = secrets.token_hex(4)
    schema, role = f"t_{suffix}", f"memory_noext_{suffix}"
    installed = await pg_run(pg_dsn, "SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
    await pg_run(pg_dsn, f"CREATE ROLE {role} LOGIN")
    await pg_run(pg_dsn, f"CREATE SCHEMA {schema} AUTHORIZATION {role}")
    try:
        host = pg_dsn.split("@", 1)[1]
        url = f"postgresql://{role}@{host}?search_path={schema}"
        async with open_memory(Backend("postgres", url), clock) as memory:
            if installed:  # another schema holds it; this role may not be able to use it
                assert memory.search_path.kind == "tsvector" and memory.search_path.indexed
            else:
                # the search's indexes need no extension
                assert memory.search_path == SearchPath("tsvector", indexed=True)
                assert "no similar-words stage" in memory.search_path.describe()
            await memory.save("ada", category="drinks", key="coffee", value="dark roast")
            assert [f.key for f in await memory.search("ada", "ROAST")] == ["coffee"]
            assert await memory.search("bob", "roast") == []
        indexes = await pg_run(
            pg_dsn,
            "SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND indexname LIKE '%trgm'",
            schema,
        )
        assert indexes == [] or installed
    finally:
        await pg_run(pg_dsn, f"DROP SCHEMA {schema} CASCADE")
        await pg_run(pg_dsn, f"DROP ROLE {role}")


@pytest.mark.postgres
async def test_dropping_another_deployments_schema_leaves_pg_trgm_and_this_ones_search(
    pg_dsn, clock
):
    """Two deployments in two schemas of one database: the first to start creates pg_trgm
    (in ``public``, not in its own schema), so dropping that deployment's schema does not take
    the extension, the other's trigram indexes, or its typo-forgiving search with it. A
    database of its own, so that the extension is created here, whatever the suite's
    database holds."""
    database = f"t_ext_{secrets.token_hex(4)}"
    await pg_run(pg_dsn, f"CREATE DATABASE {database}")
    try:
        base = pg_dsn.rsplit("/", 1)[0] + f"/{database}"
        for schema in ("first", "second"):
            await pg_run(base, f"CREATE SCHEMA {schema}")
        first = Backend("postgres", f"{base}?search_path=first")
        second = Backend("postgres", f"{base}?search_path=second")
        async with open_memory(first, clock):
            pass  # creates pg_trgm
        async with open_memory(second, clock) as memory:
            await memory.save("ada", category="drinks", key="coffee", value="dark roast")
        await pg_run(base, "DROP SCHEMA first CASCADE")
        indexes = await pg_run(
            base,
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'second'"
            " AND indexname LIKE '%trgm' ORDER BY 1",
        )
        assert [r[0] for r in indexes] == [
            "memory_facts_category_trgm",
            "memory_facts_key_trgm",
            "memory_facts_value_trgm",
        ]
        async with open_memory(second, clock) as memory:
            assert memory.search_path.trgm_schema == "public"
            assert [f.key for f in await memory.search("ada", "cofee")] == ["coffee"]
    finally:
        await pg_run(pg_dsn, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
