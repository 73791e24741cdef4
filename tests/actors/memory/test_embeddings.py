"""Embeddings and vector search, for real: a stand-in server serves all-MiniLM-L6-v2
(``tests/support/embedding_server.py``), SQLite compares in numpy, and a throw-away PostgreSQL
16 with pgvector (``pgserver``) runs the pgvector path; the machine's PostgreSQL, which has no
pgvector, runs the lexical-only path.

MiniLM is far smaller than the reference's nomic-embed-text, so its cosine distances are
larger: the tests set ``max_distance`` to 0.7 rather than the default 0.3.
"""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager

import httpx
import numpy as np
import pytest
import trio

from tests.runtime.store._support import ManualClock, pg_run, pg_schema
from tests.support.embedding_server import MODEL, minilm, start_embedding_server
from tests.support.pgvector import pgvector_server
from turnstile.actors.cli import main
from turnstile.actors.memory.embeddings import (
    BadEmbedding,
    Embedder,
    EmbedderRejected,
    EmbedderUnavailable,
    fact_text,
    resolve_embedder,
)
from turnstile.actors.memory.schema import MEMORY
from turnstile.actors.memory.service import Memory
from turnstile.actors.memory.settings import EmbeddingsConfig, MemoryConfig
from turnstile.actors.memory.vector_queries import MISSING_EMBEDDINGS, VECTOR_SEARCH, VECTOR_SETUP
from turnstile.runtime.clock import Clock, SystemClock
from turnstile.runtime.store import open_store

CUTOFF = 0.7
QUERY = "which drink does she like?"
#: (category, key, value); the coffee fact shares no word with QUERY.
FACTS = [
    ("preferences", "coffee", "dark roast, no sugar"),
    ("preferences", "favourite colour", "blue"),
    ("work", "works at", "a bakery"),
    ("home", "lives in", "Lyon"),
    ("health", "allergic to", "peanuts"),
]


@pytest.fixture(scope="session")
def pgvector():
    yield from pgvector_server()


@pytest.fixture
async def server(nursery):
    return await start_embedding_server(nursery)


@pytest.fixture(params=["sqlite", "pgvector"])
async def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/memory.db"
        return
    async with request.getfixturevalue("pgvector").database() as db_url:
        yield db_url


def config_for(server, kind: str = "openai", **embeddings) -> MemoryConfig:
    base = server.base_url + ("/v1" if kind == "openai" else "")
    settings = {"kind": kind, "base_url": base, "model": MODEL, "max_distance": CUTOFF}
    return MemoryConfig(embeddings=EmbeddingsConfig(**(settings | embeddings)))


@asynccontextmanager
async def open_memory(url: str, config: MemoryConfig, clock: Clock | None = None):
    clock = clock or SystemClock()
    async with open_store(url, migrations=[MEMORY], clock=clock) as store:
        memory = Memory(store, clock, config, resolve_embedder(config.embeddings, None))
        await memory.start()
        yield memory


async def save_all(memory: Memory, owner: str = "ada") -> None:
    for category, key, value in FACTS:
        await memory.save(owner, category=category, key=key, value=value)


async def vector_stage(memory: Memory, query: str, owner: str = "ada") -> list[str]:
    (vector,) = await memory.embedder.embed([query])
    facts = await memory.store.run(
        VECTOR_SEARCH,
        owner=owner,
        vector=vector,
        now=memory.store.db_time(memory.clock.now()),
        limit=15,
        max_distance=CUTOFF,
        path=memory.vector_path,
    )
    return [f.key for f in facts]


def within_cutoff(query: str) -> list[str]:
    """The facts' keys the model itself puts within CUTOFF of ``query``, nearest first."""
    model = minilm()
    distance = 1 - model.encode([fact_text(*f) for f in FACTS]) @ model.encode([query])[0]
    order = np.argsort(distance, kind="stable")
    return [FACTS[i][1] for i in order if distance[i] <= CUTOFF]


# ---- search by meaning ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "ollama"])
async def test_a_query_finds_a_fact_by_meaning(url, server, kind):
    async with open_memory(url, config_for(server, kind)) as memory:
        expected_path = "numpy" if url.startswith("sqlite") else "pgvector"
        assert memory.vector_path.kind == expected_path
        assert memory.vector_path.dimensions == 384
        assert memory.vector_path.indexed == (expected_path == "pgvector")
        await save_all(memory)
        await memory.save("bob", category="preferences", key="tea", value="green, no milk")
        # the start asked the dimension (none configured); every fact was embedded as it
        # was saved, one request each
        assert [r["input"] for r in server.requests] == [["dimension probe"]] + [
            [fact_text(*f)] for f in FACTS
        ] + [["preferences / tea: green, no milk"]]

        # the vector stage alone: exactly the facts within the cutoff, nearest first, and the
        # coffee fact is first although it shares no word with the query
        assert within_cutoff(QUERY)[0] == "coffee"
        found = await vector_stage(memory, QUERY)
        assert found == within_cutoff(QUERY)
        assert found[0] == "coffee"
        assert {"favourite colour", "works at", "lives in", "allergic to"}.isdisjoint(found)

        # the whole search: the vector stage first, then the lexical one, each fact once;
        # bob's tea is never ada's
        results = await memory.search("ada", QUERY)
        assert results[0].key == "coffee"
        assert len({r.key for r in results}) == len(results)
        assert all(r.owner == "ada" for r in results)
        # and a lexical hit is still found after the vector ones
        merged = await memory.search("ada", "roast bakery")
        assert "works at" in [r.key for r in merged] and "coffee" in [r.key for r in merged]


async def test_expired_facts_are_never_found_by_vector(url, server):
    clock = ManualClock()
    async with open_memory(url, config_for(server), clock) as memory:
        await memory.save("ada", category="preferences", key="coffee", value="dark roast")
        await memory.save("ada", category="preferences", key="tea", value="green", expires_days=1)
        # the fact's own text is at distance 0: found while it lives, never after
        assert (await vector_stage(memory, "preferences / tea: green"))[0] == "tea"
        clock.advance(days=2)
        assert "tea" not in await vector_stage(memory, "preferences / tea: green")
        assert "tea" not in [f.key for f in await memory.search("ada", "preferences / tea")]


# ---- a failing embedder -----------------------------------------------------------------------


async def test_a_down_embedder_fails_neither_save_nor_search(url, server, caplog):
    caplog.set_level("INFO", logger="turnstile.memory")
    async with open_memory(url, config_for(server)) as memory:
        server.down = True
        hits = server.hits
        saved = await memory.save("ada", category="preferences", key="coffee", value="dark roast")
        assert saved.value == "dark roast"
        # search falls back to the lexical stage
        assert [f.key for f in await memory.search("ada", "roast")] == ["coffee"]
        assert await memory.search("ada", QUERY) == []
        # after the failure, saves and searches leave the embedder alone for a while
        assert server.hits == hits + 1
        # one warning when it starts failing, not one per call; one line when it is back
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1
        assert warnings[0].startswith("memory embeddings: fact saved without a vector")
        # the fact waits for a backfill; once the embedder is back, meaning finds it
        server.down = False
        assert await memory.backfill() == {"embedded": 1, "remaining": 0}
        assert [f.key for f in await memory.search("ada", QUERY)] == ["coffee"]
        assert "the embedder answers again" in caplog.text


async def test_an_unreachable_embedder_at_start_leaves_lexical_search(url, caplog):
    config = MemoryConfig(
        embeddings=EmbeddingsConfig(base_url="http://127.0.0.1:9/v1", model=MODEL)
    )
    async with open_memory(url, config) as memory:
        assert memory.vector_path.kind == "none" and memory.embedder is None
        assert "cannot ask the embedder its dimension" in caplog.text
        await memory.save("ada", category="preferences", key="coffee", value="dark roast")
        assert [f.key for f in await memory.search("ada", "coffee")] == ["coffee"]


async def test_no_embedder_is_lexical_only_and_said_once(url, caplog):
    caplog.set_level("INFO", logger="turnstile.memory")
    async with open_memory(url, MemoryConfig()) as memory:
        assert memory.embedder is None and memory.vector_path.kind == "none"
        await memory.save("ada", category="preferences", key="coffee", value="dark roast")
        assert [f.key for f in await memory.search("ada", "coffee")] == ["coffee"]
    lines = [r.message for r in caplog.records if "embeddings" in r.message]
    assert lines == ["memory embeddings: no embedder configured: lexical search only"]


# ---- backfill ---------------------------------------------------------------------------------


async def test_backfill_embeds_what_has_none_and_is_safe_twice(url, server):
    async with open_memory(url, config_for(server, batch_size=2)) as memory:
        server.down = True
        await save_all(memory)
        server.down = False
        server.requests.clear()
        assert await memory.backfill() == {"embedded": 5, "remaining": 0}
        assert [len(r["input"]) for r in server.requests] == [2, 2, 1]
        assert await memory.backfill() == {"embedded": 0, "remaining": 0}
        assert len(server.requests) == 3
        assert (await vector_stage(memory, QUERY))[0] == "coffee"
        # everything anew (a model of the same dimension): every fact, once more
        assert await memory.backfill(everything=True) == {"embedded": 5, "remaining": 0}
        assert [len(r["input"]) for r in server.requests[4:]] == [2, 2, 1]


async def test_a_changed_value_replaces_its_embedding(url, server):
    async with open_memory(url, config_for(server)) as memory:
        await memory.save("ada", category="preferences", key="coffee", value="dark roast")
        server.down = True
        await memory.save("ada", category="preferences", key="coffee", value="oat milk latte")
        # the old vector is gone with the old value: the fact waits for a backfill
        pending = await memory.store.run(
            MISSING_EMBEDDINGS,
            after=0,
            limit=10,
            dimensions=384,
            now=memory.store.db_time(memory.clock.now()),
        )
        assert [row[3] for row in pending] == ["oat milk latte"]


async def test_the_cli_backfills(tmp_path, server, capsys):
    db = f"sqlite:///{tmp_path}/node.db"
    async with open_memory(db, MemoryConfig()) as memory:  # saved while no embedder
        await save_all(memory)
    config = tmp_path / "turnstile.toml"
    config.write_text(
        f'store = "{db}"\n[openai]\nbase_url = "{server.base_url}/v1"\n'
        f'[memory.embeddings]\nmodel = "{MODEL}"\nmax_distance = {CUTOFF}\n'
    )
    argv = ["memory", "backfill", "--config", str(config), "--batch-size", "2"]
    assert await trio.to_thread.run_sync(main, argv) == 0
    assert "embedded 5 facts; 0 without an embedding" in capsys.readouterr().out
    assert await trio.to_thread.run_sync(main, argv) == 0
    assert "embedded 0 facts; 0 without an embedding" in capsys.readouterr().out
    assert await trio.to_thread.run_sync(main, [*argv, "--all"]) == 0
    assert "embedded 5 facts; 0 without an embedding" in capsys.readouterr().out
    # no embedder configured: a clear refusal
    config.write_text(f'store = "{db}"\n')
    assert await trio.to_thread.run_sync(main, ["memory", "backfill", "--config", str(config)]) == 2
    assert "no embedder configured" in capsys.readouterr().err


# ---- PostgreSQL: without pgvector, and a changed dimension -----------------------------------


@pytest.fixture
async def plain_pg_url(pg_dsn):
    async with pg_schema(pg_dsn) as url_and_schema:
        yield url_and_schema


@pytest.mark.postgres
async def test_postgres_without_pgvector_is_lexical_only(plain_pg_url, pg_dsn, server, caplog):
    url, schema = plain_pg_url
    available = await pg_run(pg_dsn, "SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
    assert available == [], "this test needs a PostgreSQL without pgvector"
    caplog.set_level("INFO", logger="turnstile.memory")
    async with open_memory(url, config_for(server, dimensions=384)) as memory:
        assert memory.vector_path.kind == "none" and memory.embedder is None
        await memory.save("ada", category="preferences", key="coffee", value="dark roast")
        assert [f.key for f in await memory.search("ada", "roast")] == ["coffee"]
        assert server.requests == []  # nothing to store vectors in: the embedder is not called
    columns = await pg_run(
        pg_dsn,
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = $1 AND table_name = 'memory_facts' AND column_name = 'embedding'",
        schema,
    )
    assert columns == []
    assert "vector search: none (no pgvector on this server): lexical only" in caplog.text


async def test_pgvector_dimension_change_replaces_the_column(pgvector, server, caplog):
    async with pgvector.database() as url:
        async with open_memory(url, config_for(server)) as memory:
            await save_all(memory)
            path = await memory.store.run(VECTOR_SETUP, dimensions=384)
            assert not path.reset  # same dimension: nothing happens
            path = await memory.store.run(VECTOR_SETUP, dimensions=8)
            assert path.reset and path.dimensions == 8
        (typmod,) = await pg_run(
            url,
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'memory_facts'::regclass"
            " AND attname = 'embedding' AND NOT attisdropped",
        )
        assert typmod[0] == 8
        # back to the model's 384: the column is replaced again, the start says so, and a
        # backfill embeds every fact anew
        async with open_memory(url, config_for(server)) as memory:
            assert memory.vector_path.reset
            assert "run `turnstile memory backfill`" in caplog.text
            assert await memory.backfill() == {"embedded": 5, "remaining": 0}
            assert (await vector_stage(memory, QUERY))[0] == "coffee"


# ---- the client and the stand-in's rules ------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"input": "hi"}, 400),
        ({"model": "", "input": "hi"}, 400),
        ({"model": MODEL}, 400),
        ({"model": MODEL, "input": []}, 400),
        ({"model": MODEL, "input": ["ok", 3]}, 400),
        ({"model": MODEL, "input": [""]}, 400),
        ({"model": "nomic-embed-text", "input": "hi"}, 404),
        ({"model": MODEL, "input": "hi"}, 200),
        ({"model": MODEL, "input": ["a", "b"]}, 200),
    ],
)
async def test_the_standin_enforces_the_request_rules(server, path, body, status):
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        response = await http.post(path, json=body)
    assert response.status_code == status, response.text


async def test_the_client_reads_both_shapes_and_normalises(server):
    texts = ["dark roast", "blue", "a bakery"]
    for kind, base in (("openai", f"{server.base_url}/v1"), ("ollama", f"{server.base_url}/v1")):
        embedder = Embedder(kind=kind, base_url=base, model=MODEL, batch_size=2)
        vectors = await embedder.embed(texts)
        assert vectors.shape == (3, 384) and vectors.dtype == np.float32
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert np.allclose(vectors, minilm().encode(texts), atol=1e-5)
        assert embedder.dimensions == 384
    assert [r["path"] for r in server.requests] == ["/v1/embeddings"] * 2 + ["/api/embed"] * 2


async def test_the_client_raises_typed_errors_and_never_shows_the_key(server):
    key = "sk-secret-key-123"
    wrong = Embedder(kind="openai", base_url=f"{server.base_url}/v1", model="nope", api_key=key)
    with pytest.raises(EmbedderRejected, match="refused the request \\(404\\)") as rejected:
        await wrong.embed(["x"])
    server.down = True
    right = Embedder(kind="ollama", base_url=server.base_url, model=MODEL, api_key=key)
    with pytest.raises(EmbedderUnavailable, match="answered 503") as unavailable:
        await right.embed(["x"])
    gone = Embedder(kind="openai", base_url="http://127.0.0.1:9/v1", model=MODEL, api_key=key)
    with pytest.raises(EmbedderUnavailable, match="cannot reach the embedder"):
        await gone.embed(["x"])
    server.down = False
    other = Embedder(kind="openai", base_url=f"{server.base_url}/v1", model=MODEL, dimensions=768)
    with pytest.raises(BadEmbedding, match="returned 384 dimensions, expected 768"):
        await other.embed(["x"])
    for shown in (str(rejected.value), str(unavailable.value), repr(right), right.describe()):
        assert key not in shown


def test_the_embedder_falls_back_to_the_chat_servers_address():
    chat = "http://chat:11434/v1"
    assert resolve_embedder(EmbeddingsConfig(), chat) is None  # no model: none
    assert resolve_embedder(EmbeddingsConfig(model="m"), None) is None  # no address: none
    embedder = resolve_embedder(EmbeddingsConfig(model="m"), chat)
    assert embedder.url == "http://chat:11434/v1/embeddings"
    ollama = resolve_embedder(EmbeddingsConfig(kind="ollama", model="m"), chat)
    assert ollama.url == "http://chat:11434/api/embed"
    own = resolve_embedder(EmbeddingsConfig(model="m", base_url="http://emb:8080/v1/"), chat)
    assert own.url == "http://emb:8080/v1/embeddings"


# ---- in a node --------------------------------------------------------------------------------


async def test_a_node_embeds_through_the_chat_servers_address(url, server, caplog):
    """``[memory.embeddings]`` names only the model: the embedder is found at ``[openai]
    base_url``, and the ``memory.*`` tools search by meaning."""
    from turnstile.actors.config import Config
    from turnstile.actors.node import open_node
    from turnstile.actors.sessions.agents import ScriptedAgent

    caplog.set_level("INFO", logger="turnstile.memory")
    config = Config(
        store=url,
        openai={"base_url": f"{server.base_url}/v1"},
        memory=MemoryConfig(
            embeddings=EmbeddingsConfig(model=MODEL, dimensions=384, max_distance=CUTOFF)
        ),
    )
    agent = ScriptedAgent(token_delay=0)
    async with open_node(config, tokens={"t" * 20: "ada"}, agent=agent, serve=False) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            created = await http.post(
                "/sessions", json={"id": "s1"}, headers={"Authorization": "Bearer " + "t" * 20}
            )
            assert created.status_code == 201
        call = node.directory.call_tool
        for category, key, value in FACTS:
            saved = await call(
                "ada", "s1", "memory.save", {"category": category, "key": key, "value": value}
            )
            assert saved.ok, saved.error
        found = await call("ada", "s1", "memory.search", {"query": QUERY})
        assert found.data["facts"][0]["key"] == "coffee"
    assert f"openai model '{MODEL}' at {server.base_url}/v1, 384 dimensions" in caplog.text


async def test_pgvector_a_role_that_may_not_create_it_gets_lexical_search(pgvector, server, caplog):
    """pgvector is on the server but not trusted: a database owner without superuser cannot
    create it; the migration goes through (a notice) and search is lexical, saying why."""
    role, database = f"r_{secrets.token_hex(4)}", f"d_{secrets.token_hex(4)}"
    await pg_run(pgvector.admin_url, f"CREATE ROLE {role} LOGIN")
    await pg_run(pgvector.admin_url, f"CREATE DATABASE {database} OWNER {role}")
    url = pgvector.url(database).replace("postgres:@", f"{role}:@", 1)
    caplog.set_level("INFO", logger="turnstile.memory")
    try:
        async with open_memory(url, config_for(server, dimensions=384)) as memory:
            assert memory.vector_path.kind == "none" and memory.embedder is None
            await memory.save("ada", category="preferences", key="coffee", value="dark roast")
            assert [f.key for f in await memory.search("ada", "roast")] == ["coffee"]
        assert "this role cannot create it: CREATE EXTENSION vector" in caplog.text
    finally:
        with trio.CancelScope(shield=True):
            await pg_run(pgvector.admin_url, f"DROP DATABASE {database} WITH (FORCE)")
            await pg_run(pgvector.admin_url, f"DROP ROLE {role}")


async def test_the_embedder_is_tried_again_after_the_pause(server, tmp_path, monkeypatch, caplog):
    from turnstile.actors.memory import service

    monkeypatch.setattr(service, "RETRY_AFTER", 0.0)
    caplog.set_level("INFO", logger="turnstile.memory")
    async with open_memory(f"sqlite:///{tmp_path}/m.db", config_for(server)) as memory:
        server.down = True
        await memory.save("ada", category="preferences", key="tea", value="green")
        server.down = False
        await memory.save("ada", category="preferences", key="coffee", value="dark roast")
        assert await vector_stage(memory, QUERY) == ["coffee"]  # tea waits for a backfill
        assert "the embedder answers again" in caplog.text
