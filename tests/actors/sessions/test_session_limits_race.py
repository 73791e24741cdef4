"""The per-user session limit holds under concurrency (issue 23, "Limits that hold").

50 requests at once, with the user one session below the limit, end with exactly the limit: on
one node over SQLite and over PostgreSQL, and through two nodes on one PostgreSQL schema, where
the limit is the user's across nodes. Dedicated heartbeat sessions count against the same limit
and are taken the same way (``set_heartbeat``). On the code before, the count was a read made
before the insert: 50 requests all read "one below" and all inserted.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.racing import PARALLEL, at_once, node_config, nodes
from turnstile.actors.settings import Limits


def config(url: str, limit: int, node_id: str | None = None):
    return node_config(url, node_id, limits=Limits(max_sessions_per_user=limit))


async def create_at_once(clients: list[httpx.AsyncClient]) -> list[httpx.Response]:
    """``PARALLEL`` ``POST /sessions`` at once, spread over ``clients``."""
    return await at_once(
        PARALLEL, lambda i: clients[i % len(clients)].post("/sessions", json={"id": f"p{i}"})
    )


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
        assert_exactly_one_more(await create_at_once([http]), limit)
        assert len(await node.store.list_sessions(owner="ada")) == limit


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_the_limit_is_the_users_across_two_nodes(store_url):
    limit = 5
    async with nodes([config(store_url, limit, "a"), config(store_url, limit, "b")]) as [
        (a, on_a),
        (_, on_b),
    ]:
        for i in range(limit - 1):
            await a.directory.create_session("ada", session_id=f"s{i}")
        assert_exactly_one_more(await create_at_once([on_a, on_b]), limit)
        assert len(await a.store.list_sessions(owner="ada")) == limit


async def test_fifty_dedicated_heartbeats_at_one_below_the_limit_make_exactly_the_limit(
    store_url,
):
    # ada has 50 sessions and a limit of 51: each set_heartbeat wants one dedicated session
    limit = PARALLEL + 1
    async with nodes([config(store_url, limit)]) as [(node, _)]:
        for i in range(PARALLEL):
            await node.directory.create_session("ada", session_id=f"s{i}")
        arguments = {"enabled": True, "session": "dedicated", "interval_minutes": 60}
        results = await at_once(
            PARALLEL,
            lambda i: node.directory.call_tool("ada", f"s{i}", "set_heartbeat", arguments),
        )
        refused = [r.error for r in results if not r.ok]
        assert len(refused) == PARALLEL - 1, [r for r in results if r.ok]
        assert {e["code"] for e in refused} == {"limit_exceeded"}
        assert {e["message"] for e in refused} == {
            f"user 'ada' already has {limit} sessions (limit {limit})"
        }
        assert len(await node.store.list_sessions(owner="ada", limit=1000)) == limit
