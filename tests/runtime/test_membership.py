"""A node's membership on trio's MockClock: it heartbeats, stops serving when its row is taken
over, marks itself stopped on a clean exit, and its sweep takes over what dead nodes ran.

In-memory SQLite (it never waits on a thread, so the MockClock's autojump is exact) with a wall
clock that advances with trio's: SQLite judges leases by the store's clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import trio

from turnstile.runtime.clock import MockWallClock
from turnstile.runtime.errors import LeaseLost, StoreError
from turnstile.runtime.membership import default_node_id, open_membership
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.store import NodeRef, open_store

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
LEASE = 3.0


@pytest.fixture
async def store():
    async with open_store("sqlite:///:memory:", clock=MockWallClock(T0)) as store:
        yield store


async def nodes(store) -> dict[str, tuple[int, str, bool]]:
    return {n.id: (n.epoch, n.state, n.alive) for n in (await store.list_nodes()).nodes}


async def test_a_node_heartbeats_and_marks_itself_stopped_on_a_clean_exit(store, autojump_clock):
    metrics = Metrics()
    async with open_membership(store, "a", lease_seconds=LEASE, metrics=metrics) as membership:
        assert store.claimer == NodeRef("a", 1)
        first = membership.record
        await trio.sleep(10 * LEASE)  # ten leases: only the heartbeat keeps it alive
        assert await nodes(store) == {"a": (1, "running", True)}
        assert membership.record.heartbeat_at > first.heartbeat_at
        assert metrics.snapshot()["turnstile_node_epoch"] == 1
        assert metrics.snapshot()["turnstile_nodes_live"] == 1
    assert await nodes(store) == {"a": (1, "stopped", False)}
    assert store.claimer is None
    async with open_membership(store, "a", lease_seconds=LEASE) as membership:
        assert membership.ref == NodeRef("a", 2)  # the next start: the next epoch


async def test_a_node_whose_row_is_taken_over_stops_serving(store, autojump_clock):
    cancelled = trio.Event()
    with pytest.raises(LeaseLost, match=r"^node 'a' epoch 1 was taken over by epoch 2 "):
        async with open_membership(store, "a", lease_seconds=LEASE) as membership:
            started = trio.current_time()
            await store.register_node("a", lease_seconds=LEASE)  # another process, same id
            try:
                await trio.sleep_forever()  # what the node serves: cancelled by the heartbeat
            finally:
                cancelled.set()
                stopped_after = trio.current_time() - started
    assert cancelled.is_set() and stopped_after <= membership.interval
    assert membership.lost is not None
    assert await nodes(store) == {"a": (2, "running", True)}  # the newer epoch's row untouched


async def test_a_failed_heartbeat_is_counted_and_the_next_one_renews(store, autojump_clock):
    class Flaky:
        """The store, but its next heartbeats fail as an unreachable database would."""

        failures = 2

        def __getattr__(self, name):
            return getattr(store, name)

        async def heartbeat_node(self, node, **kwargs):
            if self.failures:
                self.failures -= 1
                raise StoreError("postgres: connection refused")
            return await store.heartbeat_node(node, **kwargs)

    metrics = Metrics()
    flaky = Flaky()
    async with open_membership(flaky, "a", lease_seconds=LEASE, metrics=metrics) as membership:
        await trio.sleep(membership.interval * 2.5)  # two beats, both failed
        assert membership.heartbeat_failures == 2
        assert metrics.snapshot()["turnstile_node_heartbeat_failures_total"] == 2
        before = membership.record.heartbeat_at
        await trio.sleep(membership.interval)
        assert membership.record.heartbeat_at > before  # it serves on and renews


async def test_the_sweep_takes_over_a_dead_nodes_running_inputs_within_its_lease(
    store, autojump_clock
):
    await store.create_session("s", "ada")
    dead, _ = await store.register_node("dead", lease_seconds=LEASE)
    await store.enqueue_input("s", "user", {"text": "cut off"})
    store.claimer = dead.ref
    claimed = await store.claim_next_input("s")
    store.claimer = None
    taken: list = []
    done = trio.Event()
    metrics = Metrics()
    async with open_membership(store, "b", lease_seconds=LEASE, metrics=metrics) as membership:

        async def on_takeover(took) -> None:
            taken.extend((item.id, item.state, trio.current_time()) for item in took.inputs)
            done.set()

        await trio.sleep(membership.interval * 1.5)
        assert metrics.snapshot()["turnstile_nodes_live"] == 2
        assert taken == []  # no handler yet: nothing is taken over
        membership.on_takeover = on_takeover
        await done.wait()
        await trio.sleep(membership.interval)  # the sweep counts live nodes after its handler
        assert metrics.snapshot()["turnstile_nodes_live"] == 1
    ((input_id, state, when),) = taken
    assert (input_id, state) == (claimed.id, "interrupted")
    assert when <= LEASE + membership.interval  # the dead node's last beat was at 0
    assert metrics.snapshot()["turnstile_inputs_taken_over_total"] == 1
    assert metrics.snapshot()["turnstile_nodes_declared_dead_total"] == 1
    assert (await nodes(store))["dead"] == (1, "stopped", False)


def test_default_node_ids():
    assert default_node_id("sqlite", port=8765) == "local"
    host_port = default_node_id("postgres", port=8765)
    assert host_port.endswith(":8765") and host_port == default_node_id("postgres", port=8765)
    first, second = default_node_id("postgres", port=0), default_node_id("postgres", port=None)
    assert first != second and ":" not in first  # generated: new at every start


async def test_a_private_store_needs_no_heartbeat(store, autojump_clock):
    """In-memory SQLite: no other process can see the node, so nothing runs on a timer (a
    MockClock test that sleeps for days does not wake every few seconds for it)."""
    metrics = Metrics()
    async with open_membership(
        store, "a", lease_seconds=LEASE, metrics=metrics, private=True
    ) as membership:
        assert store.claimer == NodeRef("a", 1)
        await trio.sleep(10 * LEASE)
        assert (await store.list_nodes()).nodes[0].heartbeat_at == membership.record.heartbeat_at
        assert metrics.snapshot()["turnstile_node_sweeps_total"] == 0
    assert await nodes(store) == {"a": (1, "stopped", False)}


async def test_a_failing_takeover_handler_is_logged_and_the_node_serves_on(store, autojump_clock):
    await store.create_session("s", "ada")
    dead, _ = await store.register_node("dead", lease_seconds=LEASE)
    await store.enqueue_input("s", "user", {})
    store.claimer = dead.ref
    await store.claim_next_input("s")
    store.claimer = None
    failed = trio.Event()
    async with open_membership(store, "b", lease_seconds=LEASE) as membership:

        async def on_takeover(took) -> None:
            failed.set()
            raise RuntimeError("the registry is gone")

        membership.on_takeover = on_takeover
        await failed.wait()
        before = membership.record.heartbeat_at
        await trio.sleep(2 * membership.interval)
        assert membership.record.heartbeat_at > before  # still heartbeating
    assert [i.state for i in await store.list_inputs("s")] == ["interrupted"]
