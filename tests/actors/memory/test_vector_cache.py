"""SQLite's vector stage keeps each user's embedding matrix between searches
(``actors/memory/vector_cache.py``): a search after a write from anywhere (this node, a
backfill in another process) sees the write; expiry and forgetting hold; the answer is the
same as comparing with every embedding; the memory budget is kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from turnstile.actors.memory.embeddings import fact_text
from turnstile.actors.memory.schema import MEMORY
from turnstile.actors.memory.service import Memory
from turnstile.actors.memory.settings import EmbeddingsConfig, MemoryConfig
from turnstile.actors.memory.vector_queries import VECTOR_SEARCH
from turnstile.runtime.clock import Clock, MockWallClock
from turnstile.runtime.store import open_store

DIMENSIONS = 16
CONFIG = MemoryConfig(embeddings=EmbeddingsConfig(max_distance=2.0), max_facts_per_user=1000)


class WordVectors:
    """An embedder for these tests: each word a fixed random direction, a text the normalised
    sum of its words (texts sharing words are near). The real model is tested in
    test_embeddings.py; here what matters is which stored vector is nearest."""

    dimensions = DIMENSIONS

    def __init__(self) -> None:
        self.words: dict[str, np.ndarray] = {}

    def describe(self) -> str:
        return "word vectors (test)"

    def _word(self, word: str) -> np.ndarray:
        if word not in self.words:
            seed = int.from_bytes(word.encode()[:8].ljust(8, b"\0"), "little")
            self.words[word] = np.random.default_rng(seed).normal(size=DIMENSIONS)
        return self.words[word]

    async def embed(self, texts):
        out = []
        for text in texts:
            v = sum(self._word(w) for w in text.replace("/", " ").replace(":", " ").split())
            out.append(v / np.linalg.norm(v))
        return np.asarray(out, dtype=np.float32)


async def _memory(url: str, clock=None) -> tuple[object, Memory]:
    store_cm = open_store(url, migrations=[MEMORY])
    store = await store_cm.__aenter__()
    memory = Memory(
        store, clock or MockWallClock(datetime(2026, 1, 1, tzinfo=UTC)), CONFIG, WordVectors()
    )
    await memory.start()
    return store_cm, memory


async def _vector_keys(memory: Memory, query: str, limit: int = 5) -> list[str]:
    vector = (await memory.embedder.embed([query]))[0]
    found = await memory.store.run(
        VECTOR_SEARCH,
        owner="ann",
        vector=vector,
        now=memory.store.db_time(memory.clock.now()),
        limit=limit,
        max_distance=2.0,
        path=memory.vector_path,
    )
    return [f.key for f in found]


async def test_a_kept_matrix_is_reused_and_a_write_from_another_process_is_seen(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    node_cm, node = await _memory(url)
    cli_cm, cli = await _memory(url)  # a second store on the same file: another process
    try:
        await node.save("ann", category="food", key="tea", value="green tea in the morning")
        await node.save("ann", category="music", key="violin", value="plays violin on friday")
        assert (await _vector_keys(node, "violin friday"))[0] == "violin"
        assert (await _vector_keys(node, "violin friday"))[0] == "violin"
        stats = node.vector_path.cache.statistics()
        assert (stats.loads, stats.hits) == (1, 1)

        await cli.save("ann", category="sport", key="cello", value="cello lessons sunday")
        assert (await _vector_keys(node, "cello lessons sunday"))[0] == "cello"
        assert node.vector_path.cache.statistics().loads == 2

        await cli.forget("ann", "cello", "sport")
        assert "cello" not in await _vector_keys(node, "cello lessons sunday")
        # another user's facts are never in ann's matrix
        await cli.save("bob", category="sport", key="cello", value="cello lessons sunday")
        assert "cello" not in await _vector_keys(node, "cello lessons sunday")
    finally:
        await cli_cm.__aexit__(None, None, None)
        await node_cm.__aexit__(None, None, None)


async def test_an_expired_fact_is_not_found_though_its_matrix_is_kept(tmp_path):
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    clock = Clock(lambda: now[0])
    cm, memory = await _memory(f"sqlite:///{tmp_path}/m.db", clock)
    try:
        await memory.save("ann", category="food", key="soup", value="tomato soup", expires_days=1)
        await memory.save("ann", category="food", key="tea", value="green tea")
        assert (await _vector_keys(memory, "tomato soup"))[0] == "soup"
        now[0] += timedelta(days=2)
        assert await _vector_keys(memory, "tomato soup") == ["tea"]
        assert memory.vector_path.cache.statistics().loads == 1  # expiry needed no new read
    finally:
        await cm.__aexit__(None, None, None)


async def test_the_nearest_are_those_a_full_comparison_finds(tmp_path):
    cm, memory = await _memory(f"sqlite:///{tmp_path}/m.db")
    words = "coffee tea violin piano garden river train boat winter summer sister friend".split()
    rng = np.random.default_rng(3)
    facts = {}
    try:
        for i in range(120):
            value = " ".join(rng.choice(words, size=3))
            await memory.save("ann", category="misc", key=f"k{i}", value=value)
            facts[f"k{i}"] = fact_text("misc", f"k{i}", value)
        query = "violin winter friend"
        q = (await memory.embedder.embed([query]))[0]
        keys = list(facts)
        vectors = await memory.embedder.embed([facts[k] for k in keys])
        distance = 1.0 - vectors @ q
        expected = [keys[i] for i in np.argsort(distance, kind="stable")[:7]]
        got = await _vector_keys(memory, query, limit=7)
        # ties may order either way; the distances must match position by position
        assert [round(float(distance[keys.index(k)]), 5) for k in got] == [
            round(float(distance[keys.index(k)]), 5) for k in expected
        ]
    finally:
        await cm.__aexit__(None, None, None)


async def test_a_matrix_over_the_budget_is_not_kept_and_search_still_answers(tmp_path):
    cm, memory = await _memory(f"sqlite:///{tmp_path}/m.db")
    try:
        memory.vector_path.cache.max_bytes = 10  # smaller than any matrix
        await memory.save("ann", category="food", key="tea", value="green tea")
        for _ in range(3):
            assert await _vector_keys(memory, "green tea") == ["tea"]
        stats = memory.vector_path.cache.statistics()
        assert (stats.loads, stats.hits, stats.users, stats.bytes) == (3, 0, 0, 0)
    finally:
        await cm.__aexit__(None, None, None)
