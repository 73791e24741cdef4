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
from turnstile.runtime.errors import LeaseLost, StoreError, StoreUnavailable
from turnstile.runtime.membership import default_node_id, ended_by, open_membership
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


async def test_every_sweep_hands_its_view_to_the_after_sweep_hooks(store, autojump_clock):
    """A feature closes the work of ended incarnations there: the view shows the nodes this
    sweep declared dead as stopped, and a hook that fails ends neither the sweep nor the
    hooks after it."""
    dead, _ = await store.register_node("dead", lease_seconds=LEASE)
    seen: list[tuple[float, dict[str, str]]] = []
    async with open_membership(store, "b", lease_seconds=LEASE) as membership:

        async def failing(view) -> None:
            raise RuntimeError("a feature's bug")

        async def recording(view) -> None:
            seen.append((trio.current_time(), {n.id: n.state for n in view.nodes}))

        async def take_over(took) -> None:
            pass

        membership.on_takeover = take_over
        membership.after_sweep.extend([failing, recording])
        await trio.sleep(LEASE + 2 * membership.interval)
    assert seen[0] == (membership.interval, {"dead": "running", "b": "running"})
    assert [states for _, states in seen][-1] == {"dead": "stopped", "b": "running"}
    assert ended_by((await store.list_nodes()), dead.ref) is not None


async def test_an_incarnation_has_ended_once_stopped_or_superseded(store):
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    b1, _ = await store.register_node("b", lease_seconds=LEASE)
    before = await store.list_nodes()
    b2, _ = await store.register_node("b", lease_seconds=LEASE)
    await store.stop_node(a.ref)
    after = await store.list_nodes()
    assert ended_by(before, a.ref) is None and ended_by(after, a.ref).state == "stopped"
    assert ended_by(before, b1.ref) is None  # b's epoch 2 is not in that view yet
    assert ended_by(after, b1.ref).epoch == 2
    assert ended_by(after, b2.ref) is None
    assert ended_by(after, NodeRef("c", 1)) is None  # registered after the view was read


class Cuttable:
    """The store as one node reaches it: while ``cut``, every call raises as an unreachable
    database does (``StoreUnavailable``)."""

    def __init__(self, store) -> None:
        self.store = store
        self.cut = False

    def __getattr__(self, name):
        found = getattr(self.store, name)
        if not callable(found):
            return found

        async def call(*args, **kwargs):
            if self.cut:
                raise StoreUnavailable()
            return await found(*args, **kwargs)

        return call


async def nothing(taken) -> None:
    pass


async def test_nodes_that_lose_the_store_together_past_their_lease_all_serve_on(
    store, autojump_clock
):
    """An outage of the shared store longer than the lease, for every node at once: each one
    lost touch, so none declares another dead until it has been back for a lease, and by then
    every node that came back has renewed. Before, the first node to sweep after the outage
    declared the others dead and they stopped serving."""
    a_store, b_store = Cuttable(store), Cuttable(store)
    metrics = Metrics()
    async with open_membership(a_store, "a", lease_seconds=LEASE, metrics=metrics) as a:
        a.on_takeover = nothing
        await trio.sleep(a.interval / 2)  # b beats between a's beats: a sweeps first after
        async with open_membership(b_store, "b", lease_seconds=LEASE) as b:
            b.on_takeover = nothing
            await trio.sleep(a.interval)
            a_store.cut = b_store.cut = True
            await trio.sleep(2 * LEASE)
            assert await nodes(store) == {"a": (1, "running", False), "b": (1, "running", False)}
            a_store.cut = b_store.cut = False
            await trio.sleep(3 * LEASE)
            assert await nodes(store) == {"a": (1, "running", True), "b": (1, "running", True)}
            assert a.lost is None and b.lost is None
            assert metrics.snapshot()["turnstile_node_sweeps_deferred_total"] > 0
            assert metrics.snapshot()["turnstile_nodes_declared_dead_total"] == 0


async def test_a_node_that_alone_loses_the_store_past_its_lease_is_declared_dead(
    store, autojump_clock
):
    """Fencing holds: a node cut off alone (the others reach the store all along) is declared
    dead once its lease ran out, and stops serving when it reaches the store again."""
    b_store = Cuttable(store)
    metrics = Metrics()
    async with open_membership(store, "a", lease_seconds=LEASE, metrics=metrics) as a:
        a.on_takeover = nothing
        with pytest.raises(LeaseLost, match=r"^node 'b' epoch 1 was declared dead "):
            async with open_membership(b_store, "b", lease_seconds=LEASE) as b:
                b.on_takeover = nothing
                b_store.cut = True
                await trio.sleep(LEASE + 2 * a.interval)
                assert (await nodes(store))["b"] == (1, "stopped", False)
                b_store.cut = False
                await trio.sleep_forever()  # b's next heartbeat finds it declared dead
        assert metrics.snapshot()["turnstile_nodes_declared_dead_total"] == 1
        assert metrics.snapshot()["turnstile_node_sweeps_deferred_total"] == 0
