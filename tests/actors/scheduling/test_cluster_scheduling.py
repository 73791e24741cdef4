"""Scheduling across nodes (PostgreSQL, two nodes in-process, real time with a 3 s lease):
each job is fired by one live node, chosen by its id, whichever node created it; a node that
leaves hands its jobs to the others; every occurrence fires once (the fire's compare-and-set).

Nothing here is an event of the test's own: the nodes' schedulers progress on their own
clocks, so the test looks at the store every 50 ms, with a deadline.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import timedelta

import pytest

from tests.support.mock_node import once
from tests.support.polling import eventually
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import open_node
from turnstile.actors.scheduling.actor import AddJob
from turnstile.actors.scheduling.store import JobStore
from turnstile.runtime.membership import owner_of

TOKEN = "cluster-sched-token-0123456789"


def config(url: str, node_id: str) -> Config:
    return Config(store=url, node=NodeConfig(id=node_id, lease_seconds=3, placement="leases"))


async def fired(node, job_ids) -> dict[str, int]:
    return {job_id: len(await JobStore(node.store).list_runs(job_id)) for job_id in job_ids}


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_jobs_are_fired_once_by_their_node_and_move_when_a_node_leaves(store_url):
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            open_node(config(store_url, "a"), tokens={TOKEN: "ada"}, serve=False)
        )
        b_stack = await stack.enter_async_context(AsyncExitStack())
        b = await b_stack.enter_async_context(
            open_node(config(store_url, "b"), tokens={TOKEN: "ada"}, serve=False)
        )
        for node in (a, b):  # both have seen both
            await node.membership.sweep()
        await a.membership.sweep()
        assert a.membership.live_ids == b.membership.live_ids == ("a", "b")
        scheduler = a.features["scheduling"].scheduler
        jobs = []
        for s in range(4):
            await a.directory.create_session("ada", session_id=f"s{s}")
            for j in range(5):
                job = await scheduler.ask(
                    AddJob(
                        session_id=f"ada/s{s}",
                        kind="once",
                        # due soon after it is added (each add is its own "now": on a box
                        # at load 8 a shared one fell behind while the twenty were added)
                        schedule=once(a.context.clock.now() + timedelta(seconds=1.5)),
                        deliver={"prompt": f"job {s}.{j}"},
                    )
                )
                jobs.append(job.id)
        owners = {job_id: owner_of(job_id, ("a", "b")) for job_id in jobs}
        assert set(owners.values()) == {"a", "b"}  # 20 ids: both get some

        async def all_fired() -> bool:
            return all(n == 1 for n in (await fired(a, jobs)).values())

        await eventually(all_fired)
        fires = "turnstile_scheduler_fires_total"
        assert a.metrics.value(fires) == sum(1 for o in owners.values() if o == "a")
        assert b.metrics.value(fires) == sum(1 for o in owners.values() if o == "b")

        # b leaves (a clean stop: dead for everyone at once); its share of new jobs moves to a
        await b_stack.aclose()
        await a.membership.sweep()
        assert a.membership.live_ids == ("a",)
        later = []
        for j in range(6):
            job = await scheduler.ask(
                AddJob(
                    session_id="ada/s0",
                    kind="once",
                    schedule=once(a.context.clock.now() + timedelta(seconds=1.5)),
                    deliver={"prompt": f"later {j}"},
                    job_id=f"later-{j}",
                )
            )
            later.append(job.id)

        async def later_fired() -> bool:
            return all(n == 1 for n in (await fired(a, later)).values())

        await eventually(later_fired)
        assert any(owner_of(job_id, ("a", "b")) == "b" for job_id in later)
        assert all(n == 1 for n in (await fired(a, jobs)).values())  # nothing fired twice
