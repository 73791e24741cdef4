"""LeasePlacement on a real store (SQLite): what its own node's activations wait for."""

from __future__ import annotations

import trio
import trio.testing

from turnstile.runtime.placement import LeasePlacement
from turnstile.runtime.store import open_store


async def test_an_activation_waits_while_its_node_closes_the_sessions_cut_off_turns(tmp_path):
    """A sweep leases the sessions of a dead node's cut-off turns to this node while it closes
    them; the lease is this node's, so only the placement can hold this node's own
    activation of such a session back until the closure is in the log (else the next turn's
    start could come before the cut-off turn's end)."""
    async with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        await store.create_session("s", "ada")
        me, _ = await store.register_node("me", lease_seconds=60)
        placement = LeasePlacement(store, lambda: me.ref, lambda a: a.partition(":")[2])
        claimed = trio.Event()

        async def activate() -> None:
            await placement.claim("session:s")
            claimed.set()

        async with trio.open_nursery() as nursery:
            async with placement.closing(["s"]):
                nursery.start_soon(activate)
                await trio.testing.wait_all_tasks_blocked()
                assert not claimed.is_set()  # held back while the closure is written
            await claimed.wait()
        assert placement.fence("session:s") == 1
