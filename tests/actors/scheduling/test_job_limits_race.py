"""The per-session job limit holds under concurrency (issue 23, "Limits that hold").

50 ``schedule_cron`` calls at once, the session one job below ``[limits] max_jobs_per_session``,
end with exactly the limit: on one node over SQLite and over PostgreSQL, and through two nodes
on one PostgreSQL schema, each node's scheduler adding jobs to the same session. On the code
before, the scheduler counted with a read before the insert: one node's scheduler handles its
messages one at a time, but two nodes' schedulers both read "one below" and both inserted.
"""

from __future__ import annotations

import pytest

from tests.support.racing import PARALLEL, at_once, node_config, nodes
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.settings import Limits

LIMIT = 5


def config(url: str, node_id: str | None = None):
    return node_config(url, node_id, limits=Limits(max_jobs_per_session=LIMIT))


async def add_at_once_and_check(directories) -> None:
    def add(i: int):
        arguments = {"cron": "0 9 * * *", "prompt": f"job {i}"}
        return directories[i % len(directories)].call_tool("ada", "s", "schedule_cron", arguments)

    for i in range(LIMIT - 1):
        assert (await add(i)).ok
    results = await at_once(PARALLEL, add)
    refused = [r.error for r in results if not r.ok]
    assert len(refused) == PARALLEL - 1, [r for r in results if r.ok]
    assert {e["code"] for e in refused} == {"limit_exceeded"}
    assert {e["message"] for e in refused} == {
        f"session already has {LIMIT} scheduled jobs (limit {LIMIT})"
    }


async def test_fifty_adds_at_one_below_the_limit_make_exactly_the_limit(store_url):
    async with nodes([config(store_url)]) as [(node, _)]:
        await node.directory.create_session("ada", session_id="s")
        await add_at_once_and_check([node.directory])
        assert len(await JobStore(node.store).list_jobs(session_id="ada/s")) == LIMIT


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_the_limit_holds_through_two_nodes(store_url):
    async with nodes([config(store_url, "a"), config(store_url, "b")]) as [(a, _), (b, _)]:
        await a.directory.create_session("ada", session_id="s")
        await add_at_once_and_check([a.directory, b.directory])
        assert len(await JobStore(a.store).list_jobs(session_id="ada/s")) == LIMIT
