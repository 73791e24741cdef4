"""``enqueue_announced``: an input and the event that announces it in one transaction, on both
backends (issue 26: a message's ``turn_queued`` was a commit and a PostgreSQL round trip of its
own)."""

from __future__ import annotations

import pytest
import trio

from tests.runtime.store._support import pg_schema
from tests.runtime.store.test_nodes import LEASE, take_over
from turnstile.runtime.errors import Fenced, IdempotencyKeyReused, NotFound
from turnstile.runtime.store import open_store
from turnstile.runtime.store.postgres_stats import ENV as STATS_ENV

QUEUED = ("turn_queued", {"source": "user", "ahead": 0})


async def test_the_input_and_its_announcement_are_stored_together(store):
    await store.create_session("s", "ada")
    await store.append_events("s", [("note", {})])
    item, record = await store.enqueue_announced("s", "user", {"content": "hi"}, QUEUED)
    assert (item.session_id, item.source, item.payload, item.state) == (
        "s",
        "user",
        {"content": "hi"},
        "queued",
    )
    assert (record.seq, record.type) == (2, "turn_queued")
    assert record.payload == {"input_id": item.id, "source": "user", "ahead": 0}
    assert list(record.payload) == ["input_id", "source", "ahead"]  # as TurnQueued orders them
    (stored,) = await store.read_events("s", after_seq=1)
    assert (stored.seq, stored.type, stored.payload) == (2, "turn_queued", record.payload)
    assert [i.id for i in await store.list_inputs("s", ["queued"])] == [item.id]
    assert await store.last_seq("s") == 2
    # an empty payload gets the id alone; the next event follows
    _, bare = await store.enqueue_announced("s", "cron", {"content": "x"}, ("turn_queued", {}))
    assert (bare.seq, list(bare.payload)) == (3, ["input_id"])


async def test_no_session_and_a_stale_fence_store_nothing(store, backend, clock):
    with pytest.raises(NotFound, match=r"^no session with id 'gone'$"):
        await store.enqueue_announced("gone", "user", {"content": "hi"}, QUEUED)
    await store.create_session("s", "ada")
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    b, _ = await store.register_node("b", lease_seconds=LEASE)
    old = (await store.acquire_session("s", a.ref)).fence
    new = await take_over(store, backend, clock, "s", a.ref, b.ref)
    with pytest.raises(Fenced) as refused:
        await store.enqueue_announced("s", "user", {"content": "hi"}, QUEUED, fence=old)
    assert (refused.value.fence, refused.value.current) == (old, new)
    assert await store.list_inputs("s") == []
    assert await store.last_seq("s") == 0
    with pytest.raises(Fenced):
        await store.enqueue_announced(
            "s", "user", {"content": "hi"}, QUEUED, idempotency_key="k", fence=old
        )
    assert await store.list_inputs("s") == []
    item, record = await store.enqueue_announced("s", "user", {"content": "hi"}, QUEUED, fence=new)
    assert (record.seq, record.payload["input_id"]) == (1, item.id)


async def test_under_a_key_an_input_is_stored_and_announced_once(store):
    """As ``enqueue_keyed``: a key already taken stores nothing and announces nothing (no seq
    used up), answers the key's row, and refuses another input under it."""
    await store.create_session("s", "ada")
    item, record = await store.enqueue_announced(
        "s", "user", {"content": "hi"}, QUEUED, idempotency_key="client:1"
    )
    assert (item.idempotency_key, record.seq, record.payload["input_id"]) == (
        "client:1",
        1,
        item.id,
    )
    again, none = await store.enqueue_announced(
        "s", "user", {"content": "hi"}, QUEUED, idempotency_key="client:1"
    )
    assert (again.id, none) == (item.id, None)
    with pytest.raises(IdempotencyKeyReused):
        await store.enqueue_announced(
            "s", "user", {"content": "other"}, QUEUED, idempotency_key="client:1"
        )
    # the plain keyed enqueue sees the same key
    assert (
        await store.enqueue_keyed("s", "user", {"content": "hi"}, "client:1")
    ).item.id == item.id
    assert await store.last_seq("s") == 1
    assert [i.id for i in await store.list_inputs("s")] == [item.id]
    _, second = await store.enqueue_announced(
        "s", "user", {"content": "hi"}, QUEUED, idempotency_key="client:2"
    )
    assert second.seq == 2


async def test_concurrent_sends_under_one_key_store_and_announce_one(store):
    await store.create_session("s", "ada")
    answers = []

    async def send() -> None:
        answers.append(
            await store.enqueue_announced(
                "s", "user", {"content": "hi"}, QUEUED, idempotency_key="client:1"
            )
        )

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(send)
    assert len({item.id for item, _ in answers}) == 1
    assert sum(record is not None for _, record in answers) == 1
    assert [e.type for e in await store.read_events("s")] == ["turn_queued"]


async def test_an_announcement_may_not_name_its_input(store):
    await store.create_session("s", "ada")
    with pytest.raises(ValueError, match="input_id"):
        await store.enqueue_announced("s", "user", {}, ("turn_queued", {"input_id": 5}))
    assert await store.list_inputs("s") == []


@pytest.mark.postgres
async def test_on_postgresql_it_is_one_round_trip(pg_dsn, monkeypatch):
    monkeypatch.setenv(STATS_ENV, "1")
    async with pg_schema(pg_dsn) as (url, _), open_store(url) as store:
        await store.create_session("s", "ada")
        a, _ = await store.register_node("a", lease_seconds=LEASE)
        fence = (await store.acquire_session("s", a.ref)).fence
        engine = store.engine
        for key in (None, None, "k1", "k2"):  # (a first may prepare its statement)
            before = engine.statistics()
            await store.enqueue_announced(
                "s", "user", {"content": "x"}, QUEUED, idempotency_key=key, fence=fence
            )
            spent = engine.statistics() - before
            assert (spent.operations, spent.round_trips - spent.prepares) == (1, 1)
