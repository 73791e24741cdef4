"""Membership in the store, on both backends: nodes register with epochs, heartbeat, expire, and
recovery takes over only the work of dead nodes.

Leases are judged by the database clock on PostgreSQL and by the store's clock on SQLite: the
tests move the store's ``ManualClock`` on SQLite, and the row's lease behind the store's back
on PostgreSQL (whose clock no test controls).
"""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
import trio

from tests.runtime.store._support import T0, Backend, pg_run
from turnstile.runtime.errors import InvalidArgument, LeaseLost
from turnstile.runtime.store import NodeRef

LEASE = 15.0


async def expire(store, backend, clock, node: NodeRef) -> None:
    """Let ``node``'s lease run out: by the store's clock on SQLite, by the database's on
    PostgreSQL (its row's lease moved into the database's past)."""
    if backend.kind == "sqlite":
        clock.advance(seconds=LEASE + 1)
    else:
        await backend.sql(
            "UPDATE nodes SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = $1 AND epoch = $2",
            node.id,
            node.epoch,
        )


async def take_over(store, backend, clock, session_id: str, holder: NodeRef, taker: NodeRef) -> int:
    """``holder``'s lease runs out (:func:`expire`) and ``taker`` acquires ``session_id``: the
    new lease epoch, against which ``holder``'s fence is stale. On SQLite the store's clock
    moved past ``taker``'s lease too, so it renews first."""
    await expire(store, backend, clock, holder)
    if backend.kind == "sqlite":
        await store.heartbeat_node(taker, lease_seconds=LEASE)
    return (await store.acquire_session(session_id, taker)).fence


async def run_as(store, node: NodeRef | None, session_id: str, payload: dict):
    """Enqueue an input and claim it as ``node`` would (its store stamps its claims)."""
    await store.enqueue_input(session_id, "user", payload)
    store.claimer = node
    try:
        return await store.claim_next_input(session_id)
    finally:
        store.claimer = None


async def test_register_gives_a_new_epoch_at_every_start(store):
    first, previous = await store.register_node("a", lease_seconds=LEASE)
    assert previous is None
    assert (first.id, first.epoch, first.state, first.address, first.alive) == (
        "a",
        1,
        "running",
        None,
        True,
    )
    assert first.lease_expires_at == first.heartbeat_at + timedelta(seconds=LEASE)
    assert first.started_at == first.heartbeat_at
    second, previous = await store.register_node("a", lease_seconds=LEASE, address="http://x")
    assert (second.epoch, second.address) == (2, "http://x")
    assert previous.epoch == 1 and previous.alive  # a takeover of a live epoch: the caller warns
    assert await store.stop_node(second.ref)
    third, previous = await store.register_node("a", lease_seconds=LEASE)
    assert third.epoch == 3 and not previous.alive  # epochs never go back, even after a stop
    other, _ = await store.register_node("b", lease_seconds=LEASE)
    assert other.epoch == 1  # per node id
    view = await store.list_nodes()
    assert [(n.id, n.epoch, n.state, n.alive) for n in view.nodes] == [
        ("a", 3, "running", True),
        ("b", 1, "running", True),
    ]
    assert [n.id for n in view.live] == ["a", "b"]


async def test_bad_arguments_are_refused_before_anything_is_written(store):
    with pytest.raises(InvalidArgument) as bad:
        await store.register_node("no spaces", lease_seconds=LEASE)
    assert bad.value.field == "id"
    with pytest.raises(InvalidArgument):
        await store.register_node("", lease_seconds=LEASE)
    with pytest.raises(ValueError, match="lease_seconds"):
        await store.register_node("a", lease_seconds=0)
    with pytest.raises(TypeError, match="lease_seconds"):
        await store.register_node("a", lease_seconds="15")
    assert (await store.list_nodes()).nodes == []


async def test_a_heartbeat_extends_the_lease_by_the_stores_clock(store, backend, clock):
    node, _ = await store.register_node("a", lease_seconds=LEASE)
    if backend.kind == "sqlite":
        assert node.heartbeat_at == T0  # the store's clock
        clock.advance(seconds=10)
        beat = await store.heartbeat_node(node.ref, lease_seconds=LEASE)
        assert beat.heartbeat_at == T0 + timedelta(seconds=10)
    else:
        # The database's clock, not the store's: that one says 2030.
        (db_now,) = (await backend.sql("SELECT now()"))[0]
        assert abs(node.heartbeat_at - db_now) < timedelta(minutes=5)
        assert node.heartbeat_at < T0
        clock.advance(days=1)  # the store's clock moves a day: no lease is judged by it
        await trio.sleep(0.01)  # let the database's clock tick
        beat = await store.heartbeat_node(node.ref, lease_seconds=LEASE)
        assert node.heartbeat_at < beat.heartbeat_at < node.heartbeat_at + timedelta(minutes=5)
        assert (await store.list_nodes()).nodes[0].alive
    assert beat.lease_expires_at == beat.heartbeat_at + timedelta(seconds=LEASE)
    assert beat.lease_expires_at > node.lease_expires_at
    assert (beat.epoch, beat.started_at) == (node.epoch, node.started_at)
    advertised = await store.heartbeat_node(node.ref, lease_seconds=LEASE, address="http://a:1")
    assert advertised.address == "http://a:1"
    kept = await store.heartbeat_node(node.ref, lease_seconds=LEASE)
    assert kept.address == "http://a:1"  # a heartbeat without an address keeps it


async def test_an_expired_lease_makes_a_node_dead_for_everyone(store, backend, clock):
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    b, _ = await store.register_node("b", lease_seconds=LEASE)
    await expire(store, backend, clock, a.ref)
    if backend.kind == "sqlite":  # the store's clock moved for b too: b renews
        await store.heartbeat_node(b.ref, lease_seconds=LEASE)
    view = await store.list_nodes()
    assert {n.id: n.alive for n in view.nodes} == {"a": False, "b": True}
    assert view.nodes[0].state == "running"  # dead, though nobody declared it yet
    assert view.nodes[0].lease_expires_at <= view.now < view.nodes[1].lease_expires_at


async def test_a_lapsed_lease_renews_until_someone_declares_the_node_dead(store, backend, clock):
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    b, _ = await store.register_node("b", lease_seconds=LEASE)
    await expire(store, backend, clock, a.ref)
    renewed = await store.heartbeat_node(a.ref, lease_seconds=LEASE)  # nothing of a's moved
    assert renewed.alive
    await expire(store, backend, clock, a.ref)
    if backend.kind == "sqlite":
        await store.heartbeat_node(b.ref, lease_seconds=LEASE)
    taken = await store.take_over_dead_nodes(b.ref)
    assert [(n.id, n.epoch, n.state, n.alive) for n in taken.nodes] == [("a", 1, "stopped", False)]
    with pytest.raises(LeaseLost, match=r"^node 'a' epoch 1 was declared dead") as lost:
        await store.heartbeat_node(a.ref, lease_seconds=LEASE)
    assert (lost.value.node, lost.value.epoch) == ("a", 1)
    assert (await store.take_over_dead_nodes(b.ref)).nodes == []  # declared once


async def test_a_superseded_epoch_loses_its_lease(store):
    old, _ = await store.register_node("a", lease_seconds=LEASE)
    await store.register_node("a", lease_seconds=LEASE)
    with pytest.raises(LeaseLost, match=r"^node 'a' epoch 1 was taken over by epoch 2 "):
        await store.heartbeat_node(old.ref, lease_seconds=LEASE)
    assert not await store.stop_node(old.ref)  # and cannot stop the new epoch either
    assert (await store.list_nodes()).nodes[0].state == "running"
    with pytest.raises(LeaseLost, match="its row is gone"):
        await store.heartbeat_node(NodeRef("ghost", 1), lease_seconds=LEASE)


async def test_stop_makes_a_node_dead_at_once(store):
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    assert await store.stop_node(a.ref)
    assert not await store.stop_node(a.ref)
    (row,) = (await store.list_nodes()).nodes
    assert (row.state, row.alive) == ("stopped", False)
    assert row.lease_expires_at <= row.heartbeat_at
    with pytest.raises(LeaseLost):
        await store.heartbeat_node(a.ref, lease_seconds=LEASE)


async def test_claims_record_their_node(store):
    await store.create_session("s", "ada")
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    item = await run_as(store, a.ref, "s", {"n": 1})
    assert item.claimed_by == NodeRef("a", 1)
    assert (await store.list_inputs("s"))[0].claimed_by == NodeRef("a", 1)
    anonymous = await run_as(store, None, "s", {"n": 2})
    assert anonymous.claimed_by is None


async def test_recovery_takes_only_the_work_of_dead_nodes(store, backend, clock):
    """The running inputs of a live node stay running; a dead node's, a stopped node's and this
    node's own earlier epoch's are interrupted; rows with no claimer only when asked."""
    for name in ("live", "dead", "stopped", "mine-old", "mine", "none"):
        await store.create_session(name, "ada")
    live, _ = await store.register_node("live", lease_seconds=LEASE)
    dead, _ = await store.register_node("dead", lease_seconds=LEASE)
    stopped, _ = await store.register_node("stopped", lease_seconds=LEASE)
    old_me, _ = await store.register_node("me", lease_seconds=LEASE)
    running = {
        "live": await run_as(store, live.ref, "live", {}),
        "dead": await run_as(store, dead.ref, "dead", {}),
        "stopped": await run_as(store, stopped.ref, "stopped", {}),
        "mine-old": await run_as(store, old_me.ref, "mine-old", {}),
        "none": await run_as(store, None, "none", {}),
    }
    me, _ = await store.register_node("me", lease_seconds=LEASE)  # a restart: epoch 2
    running["mine"] = await run_as(store, me.ref, "mine", {})
    await store.stop_node(stopped.ref)
    await expire(store, backend, clock, dead.ref)
    if backend.kind == "sqlite":  # the clock moved for everyone: the live ones renew
        for node in (live, me):
            await store.heartbeat_node(node.ref, lease_seconds=LEASE)
    for name in ("live", "dead"):  # more work waits behind the running inputs
        await store.enqueue_input(name, "user", {"behind": True})

    sweep = await store.take_over_dead_nodes(me.ref)  # a live node's periodic sweep
    assert [n.id for n in sweep.nodes] == ["dead"]
    assert [i.id for i in sweep.inputs] == sorted(
        running[k].id for k in ("dead", "stopped", "mine-old")
    )
    assert all(i.state == "interrupted" for i in sweep.inputs)
    assert sweep.inputs[0].claimed_by == NodeRef("dead", 1)  # the claim is kept on the row

    start_up = await store.take_over_dead_nodes(me.ref, unclaimed=True)
    assert [i.id for i in start_up.inputs] == [running["none"].id]
    assert start_up.nodes == []
    assert (await store.take_over_dead_nodes(me.ref, unclaimed=True)).inputs == []

    for name in ("live", "mine"):
        (item,) = await store.list_inputs(name, ["running"])
        assert item.id == running[name].id
    # Start-up wakes the sessions with queued inputs, but not those another live node runs.
    assert await store.sessions_with_queued_inputs(node=me.ref) == ["dead"]
    assert await store.sessions_with_queued_inputs() == ["dead", "live"]


@pytest.mark.postgres
async def test_concurrent_sweeps_take_each_input_once(pg_dsn, clock):
    """Three nodes sweep at once, each through its own pool: every input of the dead node is
    interrupted by exactly one of them, and the node is declared dead once."""
    schema = f"t_{secrets.token_hex(6)}"
    await pg_run(pg_dsn, f"CREATE SCHEMA {schema}")
    backend = Backend("postgres", f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}search_path={schema}")
    try:
        async with backend.open(clock) as setup:
            dead, _ = await setup.register_node("dead", lease_seconds=LEASE)
            for i in range(40):
                await setup.create_session(f"s{i}", "ada")
                await run_as(setup, dead.ref, f"s{i}", {})
            await expire(setup, backend, clock, dead.ref)
            sweepers = [
                (await setup.register_node(name, lease_seconds=LEASE))[0]
                for name in ("x", "y", "z")
            ]
        results = {}

        async def sweep(node) -> None:
            async with backend.open(clock) as store:
                results[node.id] = await store.take_over_dead_nodes(node.ref)

        async with trio.open_nursery() as nursery:
            for node in sweepers:
                nursery.start_soon(sweep, node)
    finally:
        with trio.CancelScope(shield=True):
            await pg_run(pg_dsn, f"DROP SCHEMA {schema} CASCADE")
    taken = [item.id for result in results.values() for item in result.inputs]
    assert len(taken) == len(set(taken)) == 40
    assert sum(len(result.nodes) for result in results.values()) == 1  # declared dead once
