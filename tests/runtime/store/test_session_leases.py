"""Session leases in the store, on both backends: one holder at a time among live nodes, a new
lease epoch at every acquisition, and fenced writes that store nothing once the lease moved.

This is what makes one activation per session cluster-wide hold even for a node that was
paused past its lease (SIGSTOP, a long GC, a partition) and resumes believing it still owns
its sessions: every write it makes for a session carries the lease epoch it acquired, and the
store refuses it (``Fenced``) in the same statement as the write.
"""

from __future__ import annotations

import pytest
import trio

from tests.runtime.store._support import pg_schema
from tests.runtime.store.test_nodes import LEASE, expire, take_over
from turnstile.runtime.errors import Fenced, NotFound
from turnstile.runtime.store import open_store
from turnstile.runtime.store.postgres_stats import ENV as STATS_ENV


async def two_nodes(store):
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    b, _ = await store.register_node("b", lease_seconds=LEASE)
    return a.ref, b.ref


async def test_a_live_holder_keeps_the_lease_and_is_named(store):
    await store.create_session("s", "ada")
    a, b = await two_nodes(store)
    await store.heartbeat_node(a, lease_seconds=LEASE, address="http://a:1")
    first = await store.acquire_session("s", a)
    assert first.acquired and first.fence == 1 and first.holder is None
    refused = await store.acquire_session("s", b)
    assert not refused.acquired
    assert (refused.holder, refused.holder_epoch, refused.holder_address) == (
        "a",
        a.epoch,
        "http://a:1",
    )
    assert refused.holder_live
    # the holder acquiring again (a new activation after a passivation) gets a new epoch
    again = await store.acquire_session("s", a)
    assert again.fence == 2 and again.holder == "a" and again.holder_live


async def test_released_or_dead_holders_lose_the_lease_and_the_epoch_only_grows(
    store, backend, clock
):
    await store.create_session("s", "ada")
    a, b = await two_nodes(store)
    held = await store.acquire_session("s", a)
    assert await store.release_session("s", held.fence)
    assert not await store.release_session("s", held.fence)  # a release is idempotent
    taken = await store.acquire_session("s", b)
    assert taken.fence == held.fence + 1 and taken.holder is None
    # b's lease runs out without anyone declaring it dead: it is not live, a takes over
    await expire(store, backend, clock, b)
    if backend.kind == "sqlite":  # the store's clock moved for both: a renews
        await store.heartbeat_node(a, lease_seconds=LEASE)
    moved = await store.acquire_session("s", a)
    assert moved.fence == taken.fence + 1
    assert (moved.holder, moved.holder_live) == ("b", False)
    # b's late release of its old lease does nothing to a's
    assert not await store.release_session("s", taken.fence)
    assert not (await store.acquire_session("s", b)).acquired


async def test_a_stale_fence_writes_nothing(store, backend, clock):
    await store.create_session("s", "ada")
    a, b = await two_nodes(store)
    old = (await store.acquire_session("s", a)).fence
    await store.enqueue_input("s", "user", {"content": "one"})
    claimed = await store.claim_next_input("s", fence=old)
    assert claimed is not None
    await store.append_events("s", [("stream_start", {"input_id": claimed.id})], fence=old)
    # a pauses past its lease; b takes the session
    new = await take_over(store, backend, clock, "s", a, b)
    assert new == old + 1
    await store.enqueue_input("s", "user", {"content": "two"})
    last = await store.last_seq("s")
    # a resumes: every fenced write is refused, and nothing of it is stored
    with pytest.raises(Fenced) as refused:
        await store.append_events("s", [("token", {"text": "late"})], fence=old)
    assert (refused.value.fence, refused.value.current, refused.value.code) == (old, new, "fenced")
    with pytest.raises(Fenced):
        await store.claim_next_input("s", fence=old)
    with pytest.raises(Fenced):
        await store.finish_input(claimed.id, "done", fence=old)
    assert await store.last_seq("s") == last
    states = {i.payload["content"]: i.state for i in await store.list_inputs("s")}
    assert states == {"one": "running", "two": "queued"}
    # b's fenced writes go through
    assert (await store.claim_next_input("s", fence=new)).payload["content"] == "two"
    (event,) = await store.append_events("s", [("token", {"text": "b"})], fence=new)
    assert event.seq == last + 1


async def test_unfenced_writes_and_unknown_sessions(store):
    a, _ = await two_nodes(store)
    with pytest.raises(NotFound):
        await store.acquire_session("nope", a)
    await store.create_session("s", "ada")
    fence = (await store.acquire_session("s", a)).fence
    # recovery and single-node stores write without a fence, whoever holds the lease
    (event,) = await store.append_events("s", [("note", {})])
    assert event.seq == 1
    with pytest.raises(Fenced):
        await store.append_events("s", [("note", {})], fence=fence + 5)
    with pytest.raises(TypeError):
        await store.append_events("s", [("note", {})], fence="1")
    await store.delete_session("s")
    with pytest.raises(NotFound):
        await store.append_events("s", [("note", {})], fence=fence)


async def test_concurrent_acquisitions_give_one_holder(store):
    await store.create_session("s", "ada")
    nodes = []
    for name in ("a", "b", "c", "d"):
        node, _ = await store.register_node(name, lease_seconds=LEASE)
        nodes.append(node.ref)
    answers = []

    async def acquire(node):
        answers.append(await store.acquire_session("s", node))

    async with trio.open_nursery() as nursery:
        for node in nodes:
            nursery.start_soon(acquire, node)
    won = [answer for answer in answers if answer.acquired]
    assert len(won) == 1 and won[0].fence == 1
    assert all(answer.holder_live for answer in answers if not answer.acquired)


async def test_the_turns_a_dead_holder_left_are_closed_by_whoever_takes_the_session(
    store, backend, clock
):
    """A session's cut-off turn and the next turn must not interleave in its log: whoever
    interrupts the dead node's input (an acquisition, or a sweep) holds the session while it
    closes it."""
    for name in ("one", "two"):
        await store.create_session(name, "ada")
    a, b = await two_nodes(store)
    for name in ("one", "two"):
        await store.acquire_session(name, a)
        await store.enqueue_input(name, "user", {"content": "cut off"})
        store.claimer = a
        await store.claim_next_input(name)
        store.claimer = None
    await expire(store, backend, clock, a)
    if backend.kind == "sqlite":
        await store.heartbeat_node(b, lease_seconds=LEASE)
    # b acquires "one": a's running input is interrupted in the same transaction, for b
    taken = await store.acquire_session("one", b)
    assert [(i.session_id, i.state) for i in taken.interrupted] == [("one", "interrupted")]
    # b's sweep takes "two"'s input and leases "two" to b until it has closed it
    swept = await store.take_over_dead_nodes(b)
    assert [(i.session_id, i.state) for i in swept.inputs] == [("two", "interrupted")]
    assert list(swept.leases) == ["two"]
    c, _ = await store.register_node("c", lease_seconds=LEASE)
    held = await store.acquire_session("two", c.ref)
    assert not held.acquired and held.holder == "b"  # not before b has closed it
    assert await store.release_session("two", swept.leases["two"])
    assert (await store.acquire_session("two", c.ref)).acquired


@pytest.mark.postgres
async def test_a_refusal_on_postgresql_is_one_read(pg_dsn, monkeypatch):
    """With several nodes every message for a session another node holds asks for its lease
    first: a live holder refuses in one round trip, without the locking transaction (six round
    trips and a row lock against the holder's writes, issue 26). Taking the lease still
    re-reads the holder under the lock."""
    monkeypatch.setenv(STATS_ENV, "1")
    async with pg_schema(pg_dsn) as (url, _), open_store(url) as store:
        await store.create_session("s", "ada")
        a, b = await two_nodes(store)
        engine = store.engine

        async def trips(node) -> tuple[bool, int]:
            before = engine.statistics()
            lease = await store.acquire_session("s", node)
            spent = engine.statistics() - before
            return lease.acquired, spent.round_trips - spent.prepares

        acquired, taking = await trips(a)
        assert acquired and taking > 1  # the read, then the locking transaction
        assert await trips(b) == (False, 1)
        await store.release_session("s", (await store.acquire_session("s", a)).fence)
        acquired, _ = await trips(b)
        assert acquired  # released: b takes it
