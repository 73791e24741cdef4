"""The per-user session limit holds under concurrency (issue 23, "Limits that hold").

50 requests at once, with the user one session below the limit, end with exactly the limit: on
one node over SQLite and over PostgreSQL, and through two nodes on one PostgreSQL schema, where
the limit is the user's across nodes. Dedicated heartbeat sessions count against the same limit
and are taken the same way (``set_heartbeat``). On the code before, the count was a read made
before the insert: 50 requests all read "one below" and all inserted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import httpx
import pytest
import trio

from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import Node, open_node
from turnstile.actors.settings import Limits

ADA = "limits-race-ada-token-0123456789"
PARALLEL = 50


def config(url: str, limit: int, node_id: str | None = None) -> Config:
    node = NodeConfig() if node_id is None else NodeConfig(id=node_id, placement="leases")
    return Config(store=url, limits=Limits(max_sessions_per_user=limit), node=node)


@asynccontextmanager
async def nodes(configs: list[Config]) -> AsyncIterator[list[tuple[Node, httpx.AsyncClient]]]:
    """A node per config, each with an HTTP client as ada."""
    async with AsyncExitStack() as stack:
        out = []
        for i, cfg in enumerate(configs):
            node = await stack.enter_async_context(open_node(cfg, tokens={ADA: "ada"}, serve=False))
            http = await stack.enter_async_context(
                httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=node.app),
                    base_url=f"http://n{i}",
                    headers={"Authorization": f"Bearer {ADA}"},
                )
            )
            out.append((node, http))
        yield out


async def create_at_once(clients: list[httpx.AsyncClient], n: int) -> list[httpx.Response]:
    """``n`` ``POST /sessions`` at once, spread over ``clients``."""
    answers: list[httpx.Response] = []

    async def create(i: int) -> None:
        answers.append(await clients[i % len(clients)].post("/sessions", json={"id": f"p{i}"}))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(create, i)
    return answers


def assert_exactly_one_more(answers: list[httpx.Response], limit: int) -> None:
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] + [429] * (len(answers) - 1), codes
    refused = next(a for a in answers if a.status_code == 429).json()
    assert refused["error"]["code"] == "limit_exceeded"
    assert refused["error"]["message"] == f"user 'ada' already has {limit} sessions (limit {limit})"


async def test_fifty_creations_at_one_below_the_limit_make_exactly_the_limit(store_url):
    limit = 5
    async with nodes([config(store_url, limit)]) as [(node, http)]:
        for i in range(limit - 1):
            await node.directory.create_session("ada", session_id=f"s{i}")
        answers = await create_at_once([http], PARALLEL)
        assert_exactly_one_more(answers, limit)
        assert len(await node.store.list_sessions(owner="ada")) == limit


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_the_limit_is_the_users_across_two_nodes(store_url):
    limit = 5
    cfgs = [config(store_url, limit, "a"), config(store_url, limit, "b")]
    async with nodes(cfgs) as [(a, on_a), (_, on_b)]:
        for i in range(limit - 1):
            await a.directory.create_session("ada", session_id=f"s{i}")
        answers = await create_at_once([on_a, on_b], PARALLEL)
        assert_exactly_one_more(answers, limit)
        assert len(await a.store.list_sessions(owner="ada")) == limit


async def test_fifty_dedicated_heartbeats_at_one_below_the_limit_make_exactly_the_limit(
    store_url,
):
    # ada has 50 sessions and a limit of 51: each set_heartbeat wants one dedicated session
    limit = PARALLEL + 1
    async with nodes([config(store_url, limit)]) as [(node, _)]:
        for i in range(PARALLEL):
            await node.directory.create_session("ada", session_id=f"s{i}")
        results = []

        async def heartbeat(i: int) -> None:
            arguments = {"enabled": True, "session": "dedicated", "interval_minutes": 60}
            results.append(
                await node.directory.call_tool("ada", f"s{i}", "set_heartbeat", arguments)
            )

        async with trio.open_nursery() as nursery:
            for i in range(PARALLEL):
                nursery.start_soon(heartbeat, i)
        refused = [r.error for r in results if not r.ok]
        assert len(refused) == PARALLEL - 1, [r for r in results if r.ok]
        assert {e["code"] for e in refused} == {"limit_exceeded"}
        assert {e["message"] for e in refused} == {
            f"user 'ada' already has {limit} sessions (limit {limit})"
        }
        assert len(await node.store.list_sessions(owner="ada", limit=1000)) == limit
