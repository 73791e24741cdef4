"""Summary injection with several nodes on one PostgreSQL (two nodes in-process, one schema,
session leases): what is written or deleted through one node is no longer injected by the
other. Each write of a summary, and each deletion, is announced (``pg_notify`` in its
transaction); the other node's memory hears it and tells its cache (``notices.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import pytest
import trio

from tests.actors.memory._support import ADA, RecordingAgent, auth
from turnstile.actors.config import Config, MemoryConfig, NodeConfig
from turnstile.actors.memory.injection import memory_message
from turnstile.actors.memory.notices import MemoryNotice, UserChanged
from turnstile.actors.memory.service import Memory
from turnstile.actors.node import Node, open_node

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)


def config(url: str, node_id: str) -> Config:
    node = NodeConfig(id=node_id, lease_seconds=600, placement="leases")
    return Config(store=url, node=node, memory=MemoryConfig(extraction=False))


class Heard:
    """What a node's memory tells its subscribers; ``until`` waits for one notice."""

    def __init__(self, memory: Memory) -> None:
        self.notices: list[MemoryNotice] = []
        self._changed = trio.Event()
        memory.subscribe(self)

    def __call__(self, notice: MemoryNotice) -> None:
        self.notices.append(notice)
        self._changed.set()

    async def until(self, notice: MemoryNotice) -> None:
        while notice not in self.notices:
            self._changed = trio.Event()
            await self._changed.wait()


def memory_of(node: Node) -> Memory:
    return node.features["memory"].memory


@asynccontextmanager
async def two_nodes(
    store_url: str,
) -> AsyncIterator[tuple[Node, RecordingAgent, Node, httpx.AsyncClient]]:
    """Node a (its agent records each turn's input) and node b on one store, each listening
    to the other's announcements; ada's session s created through a (a runs its turns); an
    HTTP client of b."""
    async with AsyncExitStack() as stack:
        agent = RecordingAgent()
        a = await stack.enter_async_context(
            open_node(config(store_url, "a"), tokens={ADA: "ada"}, agent=agent, serve=False)
        )
        b = await stack.enter_async_context(
            open_node(config(store_url, "b"), tokens={ADA: "ada"}, serve=False)
        )
        for node in (a, b):
            await memory_of(node).notices.listening.wait()
        await a.directory.create_session("ada", session_id="s")
        transport = httpx.ASGITransport(app=b.app)
        http = await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://b")
        )
        yield a, agent, b, http


async def test_a_summary_deleted_through_another_node_is_no_longer_injected(store_url):
    async with two_nodes(store_url) as (a, agent, b, on_b):
        summary = {"content": "Ada likes tea."}
        assert (await on_b.put("/memory/summary", json=summary, headers=auth(ADA))).is_success
        await a.directory.submit("ada", "s", "one")
        (first,) = await agent.turns(1)
        assert first.system_messages == (memory_message("Ada likes tea."),)  # a keeps it
        cache = a.features["memory"].summaries
        assert cache.statistics().cached == 1
        on_a = Heard(memory_of(a))

        assert (await on_b.delete("/memory", headers=auth(ADA))).status_code == 200
        origin = memory_of(b).notices.origin
        await on_a.until(UserChanged(owner="ada", what="deleted", origin=origin))
        await a.directory.submit("ada", "s", "two")
        assert (await agent.turns(2))[1].system_messages == ()  # read again: nothing
        assert cache.statistics().loads == 2


async def test_a_summary_set_through_another_node_is_injected_at_the_next_turn(store_url):
    async with two_nodes(store_url) as (a, agent, b, on_b):
        cache = a.features["memory"].summaries
        await memory_of(a).set_summary("ada", "Ada likes tea.")  # through a: told at once
        await a.directory.submit("ada", "s", "one")
        assert (await agent.turns(1))[0].system_messages == (memory_message("Ada likes tea."),)
        on_a = Heard(memory_of(a))
        before = cache.statistics()

        summary = {"content": "Ada likes coffee now."}
        assert (await on_b.put("/memory/summary", json=summary, headers=auth(ADA))).is_success
        origin = memory_of(b).notices.origin
        await on_a.until(UserChanged(owner="ada", what="summary", origin=origin))
        await a.directory.submit("ada", "s", "two")
        assert (await agent.turns(2))[1].system_messages == (
            memory_message("Ada likes coffee now."),
        )
        # a's own announcement came back before b's (one channel, in commit order) and was
        # not told twice: b's is the one invalidation since
        assert on_a.notices == [UserChanged(owner="ada", what="summary", origin=origin)]
        assert cache.statistics().invalidations - before.invalidations == 1
