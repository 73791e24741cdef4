"""The per-session watcher limit holds under concurrency (issue 23, "Limits that hold").

50 ``POST /sessions/s/watchers`` at once, the session one watcher below ``[watchers]
max_per_session``, end with exactly the limit: on one node (SQLite and PostgreSQL; the
watchers' actor counts what it holds and starts them one at a time) and through two nodes on
one PostgreSQL schema, where each node's actor counts the store's index and writes the new
watcher's rows in the same transaction. On the code before, the two nodes counted with a read
before the write, and both passed.
"""

from __future__ import annotations

import msgspec
import pytest

from tests.support.racing import PARALLEL, at_once, node_config, nodes
from turnstile.actors.watchers.settings import WatchersConfig

LIMIT = 5


class CountArgs(msgspec.Struct, forbid_unknown_fields=True):
    key: str


def steady(node) -> None:
    """Register ``probe.steady`` on ``node``: a watchable tool that always answers the same."""

    async def check(call, args: CountArgs):
        return {"steady": True}

    node.tools.register("probe.steady", CountArgs, check, "Answer the same.")


def config(url: str, node_id: str | None = None):
    return node_config(url, node_id, watchers=WatchersConfig(max_per_session=LIMIT))


async def start_at_once_and_check(clients) -> None:
    def start(i: int):
        body = {"tool": "probe.steady", "params": {"key": f"k{i}"}, "interval": 3600}
        return clients[i % len(clients)].post("/sessions/s/watchers", json=body)

    for i in range(LIMIT - 1):
        assert (await start(i)).status_code == 201
    answers = await at_once(PARALLEL, start)
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] + [429] * (PARALLEL - 1), codes
    refused = next(a for a in answers if a.status_code == 429).json()["error"]
    assert refused["code"] == "limit_exceeded"
    assert refused["message"] == (
        f"session already has {LIMIT} watchers (limit {LIMIT}); stop one with watch_stop first"
    )
    listed = (await clients[0].get("/sessions/s/watchers")).json()["watchers"]
    assert len(listed) == LIMIT


async def test_fifty_starts_at_one_below_the_limit_make_exactly_the_limit(store_url):
    async with nodes([config(store_url)]) as [(node, http)]:
        steady(node)
        await node.directory.create_session("ada", session_id="s")
        await start_at_once_and_check([http])


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_the_limit_holds_through_two_nodes(store_url):
    async with nodes([config(store_url, "a"), config(store_url, "b")]) as [(a, on_a), (b, on_b)]:
        steady(a)
        steady(b)
        await a.directory.create_session("ada", session_id="s")
        await start_at_once_and_check([on_a, on_b])
