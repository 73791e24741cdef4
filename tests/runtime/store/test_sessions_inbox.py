"""Sessions and their durable inboxes, on both backends."""

from __future__ import annotations

import pytest
import trio

from tests.runtime.store._support import T0
from turnstile.runtime.errors import AlreadyExists, ConflictError, NotFound, StoreError
from turnstile.runtime.store import InboxItem, Session

# -- sessions ---------------------------------------------------------------------------------


async def test_create_and_get_session(store, clock):
    s = await store.create_session("s1", "ada", {"title": "hello", "n": [1, 2]})
    assert s == Session(
        id="s1",
        owner="ada",
        metadata={"title": "hello", "n": [1, 2]},
        policy="enqueue",
        created_at=T0,
        updated_at=T0,
        last_seq=0,
    )
    assert s.created_at.tzinfo is not None and s.created_at.utcoffset().total_seconds() == 0
    assert await store.get_session("s1") == s
    bare = await store.create_session("s2", "bob", policy="interrupt")
    assert bare.metadata == {} and bare.policy == "interrupt"


async def test_create_session_twice(store):
    await store.create_session("s1", "ada")
    with pytest.raises(AlreadyExists, match=r"^session 's1' already exists$"):
        await store.create_session("s1", "bob")
    assert (await store.get_session("s1")).owner == "ada"


async def test_get_missing_session(store):
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$") as info:
        await store.get_session("nope")
    assert isinstance(info.value, LookupError) and isinstance(info.value, StoreError)


async def test_session_argument_checks(store):
    with pytest.raises(ValueError, match="id must not be empty"):
        await store.create_session("", "ada")
    with pytest.raises(TypeError, match="metadata must be a dict"):
        await store.create_session("s1", "ada", metadata=[1])
    with pytest.raises(TypeError, match="metadata is not JSON-encodable"):
        await store.create_session("s1", "ada", metadata={"x": object()})
    assert await store.list_sessions() == []


async def test_list_sessions_filter_and_pages(store):
    for i in range(7):
        await store.create_session(f"s{i}", "ada" if i % 2 == 0 else "bob")
    assert [s.id for s in await store.list_sessions()] == [f"s{i}" for i in range(7)]
    assert [s.id for s in await store.list_sessions(owner="ada")] == ["s0", "s2", "s4", "s6"]
    assert [s.id for s in await store.list_sessions(owner="carol")] == []
    page1 = await store.list_sessions(limit=3)
    page2 = await store.list_sessions(limit=3, after_id=page1[-1].id)
    page3 = await store.list_sessions(limit=3, after_id=page2[-1].id)
    assert [s.id for s in page1 + page2 + page3] == [f"s{i}" for i in range(7)]
    assert [s.id for s in await store.list_sessions(owner="bob", after_id="s1")] == ["s3", "s5"]
    with pytest.raises(ValueError, match="limit must be positive"):
        await store.list_sessions(limit=0)


async def test_list_sessions_byte_order(store):
    for sid in ["b", "B", "a", "A", "_"]:
        await store.create_session(sid, "ada")
    assert [s.id for s in await store.list_sessions()] == ["A", "B", "_", "a", "b"]


async def test_update_session(store, clock):
    await store.create_session("s1", "ada", {"a": 1})
    clock.advance(seconds=5)
    s = await store.update_session("s1", metadata={"b": 2})
    assert s.metadata == {"b": 2} and s.policy == "enqueue"
    assert s.created_at == T0 and (s.updated_at - T0).total_seconds() == 5
    s = await store.update_session("s1", policy="reject")
    assert s.metadata == {"b": 2} and s.policy == "reject"
    assert await store.get_session("s1") == s
    clock.advance(seconds=5)
    assert await store.update_session("s1") == s  # nothing to set: nothing changes
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.update_session("nope", policy="x")


async def test_delete_session(store):
    await store.create_session("s1", "ada")
    await store.delete_session("s1")
    with pytest.raises(NotFound, match=r"^no session with id 's1'$"):
        await store.get_session("s1")
    with pytest.raises(NotFound, match=r"^no session with id 's1'$"):
        await store.delete_session("s1")
    await store.create_session("s1", "bob")  # the id is free again
    assert (await store.get_session("s1")).owner == "bob"


async def test_delete_session_cascades(store, backend):
    await store.create_session("s1", "ada")
    await store.create_session("s2", "ada")
    for sid in ("s1", "s2"):
        await store.enqueue_input(sid, "user", {"t": sid})
        await store.enqueue_input(sid, "user", {"u": sid})
        await store.append_events(sid, [("a", {}), ("b", {})])

    await store.delete_session("s1")

    for table, left in [("inbox", 2), ("events", 2)]:
        assert await backend.count(table) == left, table
    with pytest.raises(NotFound):
        await store.list_inputs("s1")
    assert len(await store.list_inputs("s2")) == 2
    assert await store.last_seq("s2") == 2


# -- inbox ------------------------------------------------------------------------------------


async def test_enqueue_claim_finish(store, clock):
    await store.create_session("s1", "ada")
    a = await store.enqueue_input("s1", "user", {"text": "one"})
    b = await store.enqueue_input("s1", "cron", {"text": "two"})
    assert a == InboxItem(
        id=a.id,
        session_id="s1",
        source="user",
        payload={"text": "one"},
        state="queued",
        created_at=T0,
        updated_at=T0,
        detail=None,
    )
    assert b.id > a.id

    clock.advance(seconds=1)
    claimed = await store.claim_next_input("s1")
    assert claimed.id == a.id and claimed.state == "running"
    assert claimed.created_at == T0 and claimed.updated_at > T0

    done = await store.finish_input(a.id, "done", {"tokens": 12})
    assert done.state == "done" and done.detail == {"tokens": 12}
    assert (await store.claim_next_input("s1")).id == b.id
    failed = await store.finish_input(b.id, "failed")
    assert failed.state == "failed" and failed.detail is None
    assert await store.claim_next_input("s1") is None

    assert [(i.id, i.state) for i in await store.list_inputs("s1")] == [
        (a.id, "done"),
        (b.id, "failed"),
    ]
    assert [i.id for i in await store.list_inputs("s1", states=["failed"])] == [b.id]
    assert await store.list_inputs("s1", states=[]) == []


async def test_inbox_is_per_session(store):
    await store.create_session("s1", "ada")
    await store.create_session("s2", "ada")
    x = await store.enqueue_input("s1", "user", {})
    y = await store.enqueue_input("s2", "user", {})
    assert (await store.claim_next_input("s2")).id == y.id
    assert await store.claim_next_input("s2") is None
    assert (await store.claim_next_input("s1")).id == x.id


async def test_inbox_unknown_session(store):
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.enqueue_input("nope", "user", {})
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.claim_next_input("nope")
    with pytest.raises(NotFound, match=r"^no session with id 'nope'$"):
        await store.list_inputs("nope")


async def test_inbox_argument_checks(store):
    await store.create_session("s1", "ada")
    with pytest.raises(TypeError, match="payload must be a dict, not str"):
        await store.enqueue_input("s1", "user", "hello")
    with pytest.raises(ValueError, match="source must not be empty"):
        await store.enqueue_input("s1", "", {})
    with pytest.raises(ValueError, match="unknown input state 'bogus'"):
        await store.list_inputs("s1", states=["bogus"])
    assert await store.list_inputs("s1") == []


async def test_finish_input_illegal_transitions(store):
    await store.create_session("s1", "ada")
    item = await store.enqueue_input("s1", "user", {})
    n = item.id
    with pytest.raises(ConflictError, match=rf"^cannot move input {n} from queued to done$"):
        await store.finish_input(n, "done")
    await store.claim_next_input("s1")
    with pytest.raises(ConflictError, match=rf"^cannot move input {n} from running to queued$"):
        await store.finish_input(n, "queued")
    with pytest.raises(ConflictError, match=rf"^cannot move input {n} from running to running$"):
        await store.finish_input(n, "running")
    with pytest.raises(ValueError, match=r"^unknown input state 'bogus'$"):
        await store.finish_input(n, "bogus")
    await store.finish_input(n, "interrupted", {"why": "restart"})
    with pytest.raises(ConflictError, match=rf"^cannot move input {n} from interrupted to done$"):
        await store.finish_input(n, "done")
    with pytest.raises(NotFound, match=r"^no input with id 99999$"):
        await store.finish_input(99999, "done")
    (stored,) = await store.list_inputs("s1")
    assert stored.state == "interrupted" and stored.detail == {"why": "restart"}


async def test_interrupt_running_and_recovery_queries(store):
    for sid in ("s1", "s2", "s3"):
        await store.create_session(sid, "ada")
    a = await store.enqueue_input("s1", "user", {})
    await store.enqueue_input("s1", "user", {})
    c = await store.enqueue_input("s2", "user", {})
    d = await store.enqueue_input("s3", "user", {})
    await store.claim_next_input("s1")
    await store.claim_next_input("s2")
    await store.claim_next_input("s3")
    await store.finish_input(d.id, "done")
    assert await store.sessions_with_queued_inputs() == ["s1"]

    interrupted = await store.interrupt_running()
    assert [(i.id, i.state) for i in interrupted] == [(a.id, "interrupted"), (c.id, "interrupted")]
    assert await store.interrupt_running() == []
    assert [i.state for i in await store.list_inputs("s1")] == ["interrupted", "queued"]
    assert (await store.list_inputs("s3"))[0].state == "done"
    await store.enqueue_input("s3", "user", {})
    assert await store.sessions_with_queued_inputs() == ["s1", "s3"]


# -- concurrency ------------------------------------------------------------------------------


async def test_concurrent_enqueue(store):
    await store.create_session("s1", "ada")
    ids: list[int] = []

    async def one(i: int) -> None:
        ids.append((await store.enqueue_input("s1", "user", {"i": i})).id)

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(one, i)
    assert len(set(ids)) == 50
    items = await store.list_inputs("s1")
    assert sorted(ids) == [i.id for i in items]
    assert sorted(i.payload["i"] for i in items) == list(range(50))


async def test_concurrent_claims_never_share(store, backend):
    """Two store instances, many claimers: every input is handed out exactly once."""
    await store.create_session("s1", "ada")
    enqueued = {(await store.enqueue_input("s1", "user", {"i": i})).id for i in range(40)}
    claimed: list[int] = []

    async def claimer(s) -> None:
        while (item := await s.claim_next_input("s1")) is not None:
            claimed.append(item.id)

    async with backend.open() as other:
        async with trio.open_nursery() as nursery:
            for s in (store, other) * 5:
                nursery.start_soon(claimer, s)
    assert sorted(claimed) == sorted(enqueued)
    assert {i.state for i in await store.list_inputs("s1")} == {"running"}


async def test_requeue_moves_an_interrupted_input_back_to_run_first(store, clock):
    await store.create_session("s1", "ada")
    cut = await store.enqueue_input("s1", "user", {"content": "cut"})
    behind = await store.enqueue_input("s1", "user", {"content": "behind"})
    await store.claim_next_input("s1")
    (interrupted,) = await store.interrupt_running()
    assert interrupted.id == cut.id
    clock.advance(seconds=1)
    again = await store.requeue_input(cut.id, {"reruns": 1})
    assert (again.state, again.detail, again.created_at) == ("queued", {"reruns": 1}, T0)
    assert await store.sessions_with_queued_inputs() == ["s1"]
    assert (await store.claim_next_input("s1")).id == cut.id  # it keeps its place
    with pytest.raises(
        ConflictError, match=rf"^cannot move input {cut.id} from running to queued$"
    ):
        await store.requeue_input(cut.id)
    with pytest.raises(ConflictError, match="from queued to queued"):
        await store.requeue_input(behind.id)
    with pytest.raises(NotFound, match=r"^no input with id 999$"):
        await store.requeue_input(999)
