"""A session's lease is handed over when its activation ends (idle passivation, delete): the
node releases it, counts the handover (``turnstile_leases_released_total``), and another node
activates the session at once, without waiting for the first node's lease to run out and
without counting a move (``turnstile_leases_moved_total`` is for leases taken from a node that
was not live)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import open_node
from turnstile.runtime.errors import PlacedElsewhere

TOKEN = "handover-token-0123456789"
#: a hang guard (real clock), not a promise: generous for a 2-core box at load 8
WAIT = 60


class Spy:
    """The store, with some of its methods replaced."""

    def __init__(self, store: object, **methods: object) -> None:
        self._store, self._methods = store, methods

    def __getattr__(self, name: str) -> object:
        return self._methods.get(name) or getattr(self._store, name)


def config(url: str, node_id: str) -> Config:
    node = NodeConfig(id=node_id, lease_seconds=600, placement="leases")
    return Config(store=url, node=node)


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_an_ended_activation_hands_its_lease_over_and_another_node_takes_it(store_url):
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            open_node(config(store_url, "a"), tokens={TOKEN: "ada"}, serve=False)
        )
        b = await stack.enter_async_context(
            open_node(config(store_url, "b"), tokens={TOKEN: "ada"}, serve=False)
        )
        await a.directory.create_session("ada", session_id="s")
        await a.context.sessions.resolve("session:ada/s")  # active on a: b is refused
        with pytest.raises(PlacedElsewhere):
            await b.context.sessions.resolve("session:ada/s")
        assert a.metrics.value("turnstile_leases_released_total") == 0
        placement, released = a.context.placement, trio.Event()
        release = placement.store.release_session

        async def releasing(session_id: str, fence: int) -> bool:
            done = await release(session_id, fence)
            released.set()
            return done

        placement.store = Spy(placement.store, release_session=releasing)
        await a.context.sessions.deactivate("session:ada/s")
        with trio.fail_after(WAIT):  # released in the background
            await released.wait()
        assert a.metrics.value("turnstile_leases_released_total") == 1
        await b.context.sessions.resolve("session:ada/s")  # a is live: only a handover lets b
        assert b.context.placement.fence("session:ada/s") is not None
        assert b.metrics.value("turnstile_leases_moved_total") == 0
