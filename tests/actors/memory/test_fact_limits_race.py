"""The per-user fact limit holds under concurrency (issue 23, "Limits that hold").

``memory.save`` counts the user's facts and inserts in one transaction (PostgreSQL: under a
lock on the user); these tests pin that: 50 saves of new keys at once, the user one fact below
``[memory] max_facts_per_user``, end with exactly the limit, on one node (SQLite and
PostgreSQL) and through two nodes on one PostgreSQL schema, the saves from sessions of the same
user.
"""

from __future__ import annotations

import pytest

from tests.support.racing import PARALLEL, at_once, node_config, nodes
from turnstile.actors.memory.settings import MemoryConfig

LIMIT = 5


def config(url: str, node_id: str | None = None):
    return node_config(url, node_id, memory=MemoryConfig(max_facts_per_user=LIMIT))


async def save_at_once_and_check(directories) -> None:
    def save(i: int):
        arguments = {"category": "work", "key": f"k{i}", "value": f"fact {i}"}
        session = f"s{i % 2}"  # two sessions of the same user
        return directories[i % len(directories)].call_tool("ada", session, "memory.save", arguments)

    for i in range(LIMIT - 1):
        assert (await save(i)).ok
    results = await at_once(PARALLEL, lambda i: save(100 + i))
    refused = [r.error for r in results if not r.ok]
    assert len(refused) == PARALLEL - 1, [r for r in results if r.ok]
    assert {e["code"] for e in refused} == {"limit_exceeded"}
    assert {e["message"] for e in refused} == {f"memory holds at most {LIMIT} facts per user"}


async def test_fifty_saves_at_one_below_the_limit_make_exactly_the_limit(store_url):
    async with nodes([config(store_url)]) as [(node, _)]:
        for name in ("s0", "s1"):
            await node.directory.create_session("ada", session_id=name)
        await save_at_once_and_check([node.directory])


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_the_limit_holds_through_two_nodes(store_url):
    async with nodes([config(store_url, "a"), config(store_url, "b")]) as [(a, _), (b, _)]:
        for name in ("s0", "s1"):
            await a.directory.create_session("ada", session_id=name)
        await save_at_once_and_check([a.directory, b.directory])
