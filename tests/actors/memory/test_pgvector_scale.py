"""pgvector with many users: one user's facts are a small share of the table, and a vector search
for that user still returns its ``limit`` nearest (``vector_queries.VECTOR_SEARCH`` on PostgreSQL).

pgvector before 0.8 (pgserver bundles 0.6.2) filters the owner after the HNSW scan, and a scan
yields at most ``hnsw.ef_search`` rows (40 by default) of all users: with 5% of the facts, a
user got two or three of its fifteen nearest. The vectors are synthetic (16 dimensions, fixed
seed), written straight into the table, and the truth is computed here in numpy.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.support.pgvector import pgvector_server
from turnstile.actors.memory.schema import MEMORY, VECTOR_INDEX
from turnstile.actors.memory.vector_queries import VECTOR_SEARCH, VECTOR_SETUP
from turnstile.runtime.clock import SystemClock
from turnstile.runtime.store import open_store, ops

DIMENSIONS = 16
LIMIT = 15
#: (owner, facts): ``ada`` holds about 5% of the facts, ``bob`` 0.1%
OWNERS = [("ada", 1000), ("bob", 20)] + [(f"u{i}", 100) for i in range(190)]


@pytest.fixture(scope="module")
def pgvector():
    yield from pgvector_server()


def _unit(rng: np.random.Generator, count: int) -> np.ndarray:
    vectors = rng.standard_normal((count, DIMENSIONS)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _text(vector: np.ndarray) -> str:
    return "[" + ",".join(map(repr, vector.tolist())) + "]"


async def _load(conn, *, owners: list[str], keys: list[str], vectors: list[str]) -> None:
    await conn.execute(f"DROP INDEX IF EXISTS {VECTOR_INDEX}")  # built again after, faster
    await conn.execute(
        "INSERT INTO memory_facts (owner, category, key, value, source, confidence,"
        " created_at, updated_at, embedding)"
        " SELECT o, 'c', k, 'v', 'conversation', 70, now(), now(), e::vector"
        " FROM unnest($1::text[], $2::text[], $3::text[]) AS r(o, k, e)",
        owners,
        keys,
        vectors,
    )


async def _analyze(conn) -> None:
    await conn.execute("ANALYZE memory_facts")  # the planner knows who holds many facts


LOAD = ops.procedure("test.load", sqlite=None, postgres=_load, writes=True)
ANALYZE = ops.procedure("test.analyze", sqlite=None, postgres=_analyze, writes=True)


@pytest.mark.parametrize("analyzed", [True, False], ids=["with-statistics", "without"])
async def test_a_user_with_a_small_share_gets_its_limit_nearest(pgvector, analyzed):
    """With the planner's statistics, the owner's share sizes ``ef_search`` at once; without
    them, the share of the owner's rows in a first answer does."""
    rng = np.random.default_rng(12)
    rows = [(owner, f"{owner}-{i}") for owner, count in OWNERS for i in range(count)]
    vectors = _unit(rng, len(rows))
    async with pgvector.database() as url, open_store(url, migrations=[MEMORY]) as store:
        # building the index of these rows took longer than an operation's 20 s at load 8
        store.engine.operation_timeout = 300.0
        await store.run(VECTOR_SETUP, dimensions=DIMENSIONS)
        await store.run(
            LOAD,
            owners=[o for o, _ in rows],
            keys=[k for _, k in rows],
            vectors=[_text(v) for v in vectors],
        )
        path = await store.run(VECTOR_SETUP, dimensions=DIMENSIONS)
        assert path.indexed and path.version
        if analyzed:
            await store.run(ANALYZE)
        now = store.db_time(SystemClock().now())

        async def search(owner: str, query: np.ndarray, path=path) -> list[str]:
            facts = await store.run(
                VECTOR_SEARCH,
                owner=owner,
                vector=query,
                now=now,
                limit=LIMIT,
                max_distance=2.0,
                path=path,
            )
            assert all(f.owner == owner for f in facts)
            return [f.key for f in facts]

        def nearest(owner: str, query: np.ndarray) -> list[str]:
            mine = [i for i, (o, _) in enumerate(rows) if o == owner]
            distance = 1.0 - vectors[mine] @ query
            return [rows[mine[i]][1] for i in np.argsort(distance, kind="stable")[:LIMIT]]

        # through the index (a user above the exact scan's threshold): all fifteen, and the
        # right ones (HNSW is approximate: allow one miss in fifteen)
        large = dataclasses.replace(path, exact_up_to=100)
        for query in _unit(rng, 5):
            found = await search("ada", query, large)
            assert len(found) == LIMIT
            assert len(set(found) & set(nearest("ada", query))) >= LIMIT - 1
        # compared exactly (below the threshold): exactly the nearest, nearest first
        for owner in ("ada", "bob"):
            for query in _unit(rng, 3):
                assert await search(owner, query) == nearest(owner, query)
