"""Summary injection: each turn of a user's sessions gets ``## What I remember about the user``
as a system message of its own (``TurnInput.system_messages``), read once and cached until the
summary changes; on both backends, through a node."""

from __future__ import annotations

from contextlib import asynccontextmanager

import httpx
import pytest
import trio
import trio.testing

from tests.actors.memory._support import T0, RecordingAgent, SetClock
from tests.support.agents import FakeTurn
from turnstile.actors.config import Config, MemoryConfig
from turnstile.actors.memory.injection import SummaryCache, memory_message
from turnstile.actors.memory.notices import AllChanged, Notices, UserChanged
from turnstile.actors.memory.schema import MEMORY
from turnstile.actors.memory.service import Memory
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.actors.sessions.agents.base import TurnInput
from turnstile.runtime.store import open_store

ADA, BOB = "ada-token-0123456789", "bob-token-0123456789"


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def node_with(store_url, agent):
    """A node with Ada's s1 and s2 and Bob's s1; on PostgreSQL once its memory listens to the
    other nodes (connecting tells the cache to forget everything: not in the middle of a test
    that counts its reads)."""
    config = Config(store=store_url, memory=MemoryConfig())
    async with open_node(config, tokens={ADA: "ada", BOB: "bob"}, agent=agent, serve=False) as node:
        if node.context.membership is not None:
            await node.features["memory"].memory.notices.listening.wait()
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            for token, name in ((ADA, "s1"), (ADA, "s2"), (BOB, "s1")):
                created = await http.post("/sessions", json={"id": name}, headers=auth(token))
                assert created.status_code == 201
            yield node, http


async def say(http, token: str, session: str, content: str) -> None:
    sent = await http.post(
        f"/sessions/{session}/messages", json={"content": content}, headers=auth(token)
    )
    assert sent.status_code == 202, sent.text


class CountingReads:
    """Wraps a store's ``run`` to count the memory summary reads."""

    def __init__(self, store) -> None:
        self.summary_reads = 0
        self._run = store.run
        store.run = self.run

    async def run(self, query, /, **args):
        if query.name == "memory.get_summary":
            self.summary_reads += 1
        return await self._run(query, **args)


async def test_every_turn_of_the_users_sessions_gets_the_summary_cached(store_url):
    agent = RecordingAgent()
    async with node_with(store_url, agent) as (node, http):
        reads = CountingReads(node.store)
        cache = node.features["memory"].summaries
        await say(http, ADA, "s1", "before")
        (first,) = await agent.turns(1)
        assert first.system_messages == ()  # no summary yet: nothing injected
        assert reads.summary_reads == 1
        put = await http.put(
            "/memory/summary", json={"content": "Ada likes dark roast."}, headers=auth(ADA)
        )
        assert put.status_code == 200
        await say(http, ADA, "s2", "in another session")
        second = (await agent.turns(2))[1]
        message = memory_message("Ada likes dark roast.")
        assert second.system_messages == (message,)
        assert reads.summary_reads == 2  # the write invalidated the cached "none"
        # the next turns of ada, in any session, pay no query
        await say(http, ADA, "s1", "again")
        await say(http, ADA, "s2", "and again")
        third, fourth = (await agent.turns(4))[2:]
        assert third.system_messages == fourth.system_messages == (message,)
        assert reads.summary_reads == 2
        assert cache.statistics().hits == 2
        # the history the agent got is the transcript only: the memory is not part of it
        # (s1's and s2's turns run concurrently: find s1's "again" turn by its content)
        s1_again = next(i for i, t in enumerate(agent.inputs) if t.content == "again")
        assert all(entry.content != message for entry in agent.histories[s1_again])
        assert [e.content for e in agent.histories[s1_again]] == ["before", "reply:before"]
        # bob has no summary; ada's is never his
        await say(http, BOB, "s1", "bob here")
        assert (await agent.turns(5))[4].system_messages == ()
        # ada deletes her memory: the next turn has nothing to inject
        assert (await http.delete("/memory", headers=auth(ADA))).status_code == 200
        await say(http, ADA, "s1", "forgotten?")
        assert (await agent.turns(6))[5].system_messages == ()
        assert (await http.get("/memory/summary", headers=auth(ADA))).json()["summary"] is None


async def test_an_emptied_summary_injects_nothing(store_url):
    agent = RecordingAgent()
    async with node_with(store_url, agent) as (node, http):
        await http.put("/memory/summary", json={"content": "x"}, headers=auth(ADA))
        await say(http, ADA, "s1", "one")
        assert (await agent.turns(1))[0].system_messages == (memory_message("x"),)
        await http.put("/memory/summary", json={"content": "  "}, headers=auth(ADA))
        await say(http, ADA, "s1", "two")
        assert (await agent.turns(2))[1].system_messages == ()


async def test_a_failing_context_hook_costs_the_message_not_the_turn(store_url):
    agent = RecordingAgent()
    async with node_with(store_url, agent) as (node, http):

        async def broken(owner, session_key):
            raise RuntimeError("boom")

        node.features["sessions"].services.turn_context.insert(0, broken)
        await http.put("/memory/summary", json={"content": "still here"}, headers=auth(ADA))
        await say(http, ADA, "s1", "hello")
        (seen,) = await agent.turns(1)
        assert seen.system_messages == (memory_message("still here"),)


class SlowMemory:
    """What a ``SummaryCache`` uses of ``Memory`` (its reads and its notices), with reads that
    wait until the test lets them go."""

    def __init__(self) -> None:
        self.content = "old"
        self.notices = Notices()
        self.reading = trio.Event()
        self.release = trio.Event()

    def subscribe(self, subscriber):
        return self.notices.subscribe(subscriber)

    async def get_summary(self, owner):
        content = self.content
        self.reading.set()
        await self.release.wait()
        return type("S", (), {"content": content})()

    def set_summary(self, owner, content):
        with self.notices.telling(owner, "summary"):
            self.content = content


@pytest.mark.parametrize(
    "notice",
    [UserChanged(owner="ada", what="summary"), AllChanged(why="test")],
    ids=["user", "all"],
)
async def test_a_read_racing_a_notice_does_not_cache_the_old_summary(notice):
    memory = SlowMemory()
    cache = SummaryCache(memory)
    async with trio.open_nursery() as nursery:
        results = []

        async def read():
            results.append(await cache.message("ada"))

        nursery.start_soon(read)
        await memory.reading.wait()
        memory.content = "new"  # written while the read holds "old" …
        memory.notices.tell(notice)  # … and told
        memory.release.set()
    assert results == [memory_message("old")]  # that read answers what it read …
    assert cache.statistics().cached == 0  # … but did not keep it
    assert await cache.message("ada") == memory_message("new")
    assert await cache.message("ada") == memory_message("new")
    assert cache.statistics().loads == 2


async def test_facts_changing_leave_the_summary_cached_and_a_closed_cache_hears_nothing():
    memory = SlowMemory()
    memory.release.set()
    cache = SummaryCache(memory)
    await cache.message("ada")
    memory.notices.tell(UserChanged(owner="ada", what="facts"))
    memory.notices.tell(UserChanged(owner="bob", what="deleted"))
    assert cache.statistics().cached == 1
    cache.close()
    assert cache.statistics().cached == 0
    await cache.message("ada")
    memory.set_summary("ada", "new")
    assert cache.statistics().invalidations == 1  # (bob's) nothing after the close
    with pytest.raises(ValueError, match="^ttl must be >= 0$"):
        SummaryCache(memory, ttl=-1)


async def test_the_scripted_agent_shows_the_turns_system_messages():
    agent = ScriptedAgent()
    turn = FakeTurn("/context")
    assert await agent.run_turn(turn) == "No system messages for this turn."
    turn = FakeTurn("/context")
    turn.input = TurnInput(input_id=1, source="user", content="/context", system_messages=("a",))
    assert await agent.run_turn(turn) == "a"


async def test_every_writer_tells_the_cache_through_memory(store_url):
    """The routes, the code path (which extraction takes: ``test_extraction``) and the tools
    all write through ``Memory``, which tells its subscribers: the cache among them, and a
    test's. A summary set or a user deleted drops the user's entry; facts leave it."""
    async with node_with(store_url, RecordingAgent()) as (node, http):
        memory, cache = node.features["memory"].memory, node.features["memory"].summaries
        told = []
        memory.subscribe(lambda notice: told.append((notice.owner, notice.what)))
        origin = memory.notices.origin
        before = cache.statistics()

        async def loads_after_reading() -> int:
            await cache.message("ada")
            return cache.statistics().loads - before.loads

        assert await loads_after_reading() == 1
        put = await http.put("/memory/summary", json={"content": "one"}, headers=auth(ADA))
        assert put.status_code == 200
        assert await cache.message("ada") == memory_message("one")
        assert cache.statistics().loads - before.loads == 2
        fact = {"category": "c", "key": "k", "value": "v"}
        assert (await http.put("/memory/facts", json=fact, headers=auth(ADA))).status_code == 200
        assert (await node.directory.call_tool("ada", "s1", "memory.save", fact)).ok
        gone = await http.delete("/memory/facts", params={"key": "k"}, headers=auth(ADA))
        assert gone.status_code == 200
        assert await loads_after_reading() == 2  # facts are not the summary
        await memory.set_summary("ada", "two")  # as extraction does
        assert await cache.message("ada") == memory_message("two")
        assert (await http.delete("/memory", headers=auth(ADA))).status_code == 200
        assert await cache.message("ada") is None
        await memory.set_summary("ada", "three")
        assert await loads_after_reading() == 5
        await memory.delete_user("ada")  # the code path of DELETE /memory
        assert await cache.message("ada") is None
        assert cache.statistics().loads - before.loads == 6
        assert told == [
            ("ada", "summary"),
            ("ada", "facts"),
            ("ada", "facts"),
            ("ada", "facts"),
            ("ada", "summary"),
            ("ada", "deleted"),
            ("ada", "summary"),
            ("ada", "deleted"),
        ]
        assert cache.statistics().invalidations - before.invalidations == 5
        assert origin and memory.notices.origin == origin


@pytest.mark.guard(600)
async def test_an_entry_is_kept_at_most_ttl_seconds_when_nothing_tells(autojump_clock):
    """A write the cache is not told of (another node's, its notification lost; SQL typed by
    hand) is injected at most ``ttl`` seconds late; ``ttl=0`` keeps nothing."""
    async with open_store("sqlite:///:memory:", migrations=[MEMORY]) as store:
        here = Memory(store, SetClock(T0), MemoryConfig())
        elsewhere = Memory(store, SetClock(T0), MemoryConfig())  # its notices reach nobody here
        cache = SummaryCache(here, ttl=60)
        await elsewhere.set_summary("ada", "old")
        assert await cache.message("ada") == memory_message("old")
        await elsewhere.set_summary("ada", "new")
        await trio.sleep(59.5)
        assert await cache.message("ada") == memory_message("old")  # within the bound
        await trio.sleep(0.5)
        assert await cache.message("ada") == memory_message("new")
        assert await cache.message("ada") == memory_message("new")
        stats = cache.statistics()
        assert (stats.loads, stats.hits, stats.expired, stats.cached) == (2, 2, 1, 1)
        uncached = SummaryCache(here, ttl=0)
        for _ in range(2):
            assert await uncached.message("ada") == memory_message("new")
        assert (uncached.statistics().loads, uncached.statistics().cached) == (2, 0)


async def test_listening_anew_forgets_every_entry(tmp_path):
    """``Memory.listen`` tells ``AllChanged`` whenever it (re)connects, since what was
    announced meanwhile is lost; SQLite's listener says so once."""
    async with open_store(f"sqlite:///{tmp_path}/m.db", migrations=[MEMORY]) as store:
        memory = Memory(store, SetClock(T0), MemoryConfig())
        cache = SummaryCache(memory)
        await memory.set_summary("ada", "x")
        await cache.message("ada")
        told = []
        memory.subscribe(told.append)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(memory.listen)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        assert told == [AllChanged(why="listening anew: announcements may have been missed")]
        assert cache.statistics().cached == 0
        assert cache.statistics().invalidations == 2  # the summary set, then listening
