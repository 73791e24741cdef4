"""A draining node hands its sessions over as soon as it can (two nodes in-process on
PostgreSQL, with session leases): a session nobody watches there is passivated once its turn
ends, its lease is released, and the other node runs what waits in it while the draining node
still finishes its other turns; a session its clients watch is handed over too, and they
follow it from the store. Before, what waited stayed until the draining node stopped."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import pytest
import trio

from tests.support.agents import GatedAgent
from tests.support.polling import eventually
from tests.support.sessions import Recorder
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import open_node

TOKEN = "drain-handover-token-0123456789"


async def started(agent: GatedAgent, *contents: str) -> None:
    """Wait until ``agent`` began a turn for each of ``contents`` (on its node's own time)."""

    async def begun() -> bool:
        return set(contents) <= set(agent.running)

    await eventually(begun)  # eventually's hang guard: a loaded box starts a turn in seconds


async def draining(node) -> None:
    """Wait until ``node``'s drain has begun: its sessions claim no more inputs. (``drain``
    marks the node's row first, a store write: a turn ending before then is not one that
    ends while the node drains, and what waits behind it ran on the node itself.)"""
    running = node.features["sessions"].services.running

    async def begun() -> bool:
        return running.draining

    await eventually(begun)


def config(url: str, node_id: str) -> Config:
    return Config(store=url, node=NodeConfig(id=node_id, lease_seconds=3, placement="leases"))


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_draining_node_hands_a_session_over_when_its_turn_ends(store_url):
    a_agent, b_agent = GatedAgent(), GatedAgent()
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            open_node(config(store_url, "a"), tokens={TOKEN: "ada"}, agent=a_agent, serve=False)
        )
        await stack.enter_async_context(
            open_node(config(store_url, "b"), tokens={TOKEN: "ada"}, agent=b_agent, serve=False)
        )
        for name in ("s", "t"):
            await a.directory.create_session("ada", session_id=name)
            await a.directory.submit("ada", name, f"wait:{name}")
        await started(a_agent, "wait:s", "wait:t")  # both turns run on a
        await a.directory.submit("ada", "s", "after s")  # waits behind s's turn, on a
        drained: list[bool] = []
        async with trio.open_nursery() as nursery:

            async def drain() -> None:
                drained.append(await a.drain(30))

            nursery.start_soon(drain)
            await draining(a)
            a_agent.gate("wait:s").set()  # s's turn ends; t's still runs on a
            await started(b_agent, "after s")  # b takes s over and runs what waited in it
            assert b_agent.running == ["after s"]
            assert not drained  # a is still draining: t's turn runs
            assert not a.context.sessions.is_active("session:ada/s")
            a_agent.gate("wait:t").set()
        assert drained == [True]
        assert a_agent.running == ["wait:s", "wait:t"]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_watched_session_is_handed_over_and_its_client_follows_it(store_url):
    """A client of A watches s while A drains: once s's turn ends, A gives s up too, and the
    client, still connected to A, sees the turn B runs next, every event once and in order.

    A still runs t's turn meanwhile, so it is draining when s's turn ends and the client's
    node is up. (When the last turn ends, ``drain`` returns at once, maybe before s, whose
    runner and last events settle a moment later, could be handed over; the node then stops,
    which frees s's lease: test_sigterm_drains_a_node_its_turn_finishes_and_what_waits_moves
    in tests/e2e/test_cluster.py. Here that race made the test fail now and then.)"""
    a_agent, b_agent = GatedAgent(), GatedAgent()
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            open_node(config(store_url, "a"), tokens={TOKEN: "ada"}, agent=a_agent, serve=False)
        )
        await stack.enter_async_context(
            open_node(config(store_url, "b"), tokens={TOKEN: "ada"}, agent=b_agent, serve=False)
        )
        for name in ("s", "t"):
            await a.directory.create_session("ada", session_id=name)
        client = Recorder()
        await a.directory.attach("ada", "s", client)  # watched on a
        await a.directory.submit("ada", "s", "wait:s")
        await a.directory.submit("ada", "t", "wait:t")
        await started(a_agent, "wait:s", "wait:t")
        await a.directory.submit("ada", "s", "after s")  # waits behind it
        drained: list[bool] = []
        async with trio.open_nursery() as nursery:

            async def drain() -> None:
                drained.append(await a.drain(30))

            nursery.start_soon(drain)
            await draining(a)
            a_agent.gate("wait:s").set()
            await started(b_agent, "after s")  # b runs it: a gave s up, client and all
            with trio.fail_after(60):  # a hang guard, not a promise
                await client.until(b'"stream_end"', 2)  # ...and the client saw it end
            assert not drained  # a was draining all along: t's turn runs
            a_agent.gate("wait:t").set()
        assert drained == [True]
        assert b_agent.running == ["after s"]
        seen = [json.loads(frame) for frame in client.frames]
        assert [f["seq"] for f in seen] == list(range(seen[0]["seq"], seen[-1]["seq"] + 1))
        ends = [f["text"] for f in seen if f["type"] == "stream_end"]
        assert ends == ["reply:wait:s", "reply:after s"]
        await a.directory.detach("ada", "s", client)  # through the follower now
