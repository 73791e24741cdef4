"""A turn's closure (``close_input``) and the reads around a turn, on both backends: the closure
is all or nothing, whatever the backend does to make it (SQLite a transaction in the writer's
group commit; PostgreSQL one statement, or a transaction with ``steps``), and PostgreSQL sends
one round trip where it says so (issue 26).
"""

from __future__ import annotations

import pytest

from tests.runtime.store._support import pg_schema
from tests.runtime.store.test_nodes import LEASE, take_over
from turnstile.runtime.errors import ConflictError, Fenced, NotFound, StoreError
from turnstile.runtime.store import ClosingStep, open_store, ops
from turnstile.runtime.store.postgres_stats import ENV as STATS_ENV

#: a step of the closing transaction, as a feature writes one (its run record, here the
#: session's metadata)
MARK = ops.execute(
    "test.mark", "UPDATE sessions SET metadata = :metadata::jsonb WHERE id = :session_id"
)
#: a step that fails: the whole closure must be rolled back
BROKEN = ops.execute("test.broken", "INSERT INTO no_such_table VALUES (1)")
#: a step that joins PostgreSQL's closing statement (a job's run record, here a key-value row)
NOTE = ClosingStep(
    "test.note",
    "INSERT INTO kv (namespace, key, value, updated_at)"
    " SELECT 'test', :key, :value::jsonb, :now WHERE {moved}",
)


def note(store, key: str, value) -> tuple:
    args = {"key": key, "value": store.db_json(value), "now": store.db_time(store.clock.now())}
    return (NOTE, args)


async def running(store, session_id: str = "s", text: str = "hi"):
    await store.enqueue_input(session_id, "user", {"content": text})
    item = await store.claim_next_input(session_id)
    assert item is not None and item.state == "running"
    return item


async def test_a_closure_appends_its_events_and_moves_its_input(store):
    await store.create_session("s", "ada")
    item = await running(store)
    await store.append_events("s", [("stream_start", {"input_id": item.id})])
    records, closed = await store.close_input(
        "s", [("token", {"text": "a"}), ("stream_end", {"status": "completed"})], item.id, "done"
    )
    assert [(r.seq, r.type, r.payload) for r in records] == [
        (2, "token", {"text": "a"}),
        (3, "stream_end", {"status": "completed"}),
    ]
    assert (closed.id, closed.state, closed.detail) == (item.id, "done", None)
    assert [(e.seq, e.type) for e in await store.read_events("s")] == [
        (1, "stream_start"),
        (2, "token"),
        (3, "stream_end"),
    ]
    assert await store.last_seq("s") == 3
    (stored,) = await store.list_inputs("s")
    assert stored.state == "done"


async def test_a_closure_without_events_only_moves_the_input(store):
    await store.create_session("s", "ada")
    item = await running(store)
    records, closed = await store.close_input("s", [], item.id, "failed", {"error": "boom"})
    assert records == []
    assert (closed.state, closed.detail) == ("failed", {"error": "boom"})
    assert await store.last_seq("s") == 0


async def test_a_closure_on_postgresql_says_whether_another_input_is_queued(store, backend):
    """The runner takes a closure's "none queued" as its next claim's answer (issue 26: the
    empty claim after each turn on PostgreSQL); SQLite, one node, is not asked."""
    await store.create_session("s", "ada")
    first = await running(store)
    await store.enqueue_input("s", "user", {"content": "next"})
    *_, queued = await store.close_input_peek("s", [("stream_end", {})], first.id, "done")
    assert queued is (True if backend.kind == "postgres" else None)
    second = await store.claim_next_input("s")
    assert second is not None
    *_, queued = await store.close_input_peek("s", [("stream_end", {})], second.id, "done")
    assert queued is (False if backend.kind == "postgres" else None)


@pytest.mark.parametrize("events", [[], [("stream_end", {"status": "completed"})]])
async def test_closing_an_input_that_is_not_running_writes_nothing(store, events):
    await store.create_session("s", "ada")
    done = await running(store, text="ran")
    await store.close_input("s", [("stream_end", {})], done.id, "done")
    queued = await store.enqueue_input("s", "user", {"content": "waiting"})
    before = (await store.last_seq("s"), await store.list_inputs("s"))
    with pytest.raises(ConflictError, match=rf"^cannot move input {done.id} from done to done$"):
        await store.close_input("s", events, done.id, "done")
    with pytest.raises(
        ConflictError, match=rf"^cannot move input {queued.id} from queued to failed$"
    ):
        await store.close_input("s", events, queued.id, "failed")
    with pytest.raises(NotFound, match=r"^no input with id 999$"):
        await store.close_input("s", events, 999, "done")
    assert (await store.last_seq("s"), await store.list_inputs("s")) == before
    # no seq was used up: the next event follows the last one
    (event,) = await store.append_events("s", [("note", {})])
    assert event.seq == before[0] + 1


async def test_closing_in_a_session_that_is_gone_is_not_found(store):
    await store.create_session("s", "ada")
    item = await running(store)
    await store.delete_session("s")
    with pytest.raises(NotFound, match=r"^no session with id 's'$"):
        await store.close_input("s", [("stream_end", {})], item.id, "done")
    with pytest.raises(NotFound, match=rf"^no input with id {item.id}$"):
        await store.close_input("s", [], item.id, "done")


async def test_a_closure_with_a_stale_fence_writes_nothing(store, backend, clock):
    await store.create_session("s", "ada")
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    b, _ = await store.register_node("b", lease_seconds=LEASE)
    old = (await store.acquire_session("s", a.ref)).fence
    await store.enqueue_input("s", "user", {"content": "one"})
    item = await store.claim_next_input("s", fence=old)
    new = await take_over(store, backend, clock, "s", a.ref, b.ref)
    for events in ([("stream_end", {})], []):
        with pytest.raises(Fenced) as refused:
            await store.close_input("s", events, item.id, "done", fence=old)
        assert (refused.value.fence, refused.value.current) == (old, new)
    assert await store.last_seq("s") == 0
    assert [i.state for i in await store.list_inputs("s")] == ["running"]
    # the new holder closes it
    records, closed = await store.close_input(
        "s", [("stream_end", {"status": "interrupted"})], item.id, "interrupted", fence=new
    )
    assert ([r.seq for r in records], closed.state) == ([1], "interrupted")


async def test_steps_commit_with_the_closure_or_not_at_all(store):
    await store.create_session("s", "ada")
    item = await running(store)
    with pytest.raises(StoreError):
        await store.close_input("s", [("stream_end", {})], item.id, "done", steps=[(BROKEN, {})])
    assert await store.last_seq("s") == 0
    assert [i.state for i in await store.list_inputs("s")] == ["running"]
    mark = (MARK, {"metadata": store.db_json({"closed": item.id}), "session_id": "s"})
    records, closed = await store.close_input(
        "s", [("stream_end", {})], item.id, "done", steps=[mark]
    )
    assert ([r.seq for r in records], closed.state) == ([1], "done")
    assert (await store.get_session("s")).metadata == {"closed": item.id}
    # a step of a closure refused for its input's state is not run either
    other = {"metadata": store.db_json({"closed": 0}), "session_id": "s"}
    with pytest.raises(ConflictError):
        await store.close_input("s", [("stream_end", {})], item.id, "done", steps=[(MARK, other)])
    assert (await store.get_session("s")).metadata == {"closed": item.id}
    assert await store.last_seq("s") == 1


async def test_a_closing_step_commits_with_the_closure_or_not_at_all(store, backend, clock):
    """A ``ClosingStep`` (on PostgreSQL inside the closing statement): written with the
    closure; not written when the closure is refused (the input not running, the session gone,
    a stale fence), nor when another step of the closure fails; several join one closure."""
    await store.create_session("s", "ada")
    item = await running(store)
    with pytest.raises(StoreError):
        await store.close_input(
            "s",
            [("stream_end", {})],
            item.id,
            "done",
            steps=[note(store, "a", {"n": 1}), (BROKEN, {})],
        )
    assert await store.kv_get("test", "a") is None
    assert [i.state for i in await store.list_inputs("s")] == ["running"]
    steps = [note(store, "a", {"run": 1}), note(store, "b", {"n": 2})]
    records, closed = await store.close_input(
        "s", [("stream_end", {})], item.id, "done", steps=steps
    )
    assert ([r.seq for r in records], closed.state) == ([1], "done")
    assert (await store.kv_get("test", "a"), await store.kv_get("test", "b")) == (
        {"run": 1},
        {"n": 2},
    )
    for events in ([("stream_end", {})], []):
        with pytest.raises(ConflictError):  # not running any more
            await store.close_input(
                "s", events, item.id, "done", steps=[note(store, "c", {"n": 3})]
            )
    assert await store.kv_get("test", "c") is None
    # a stale fence
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    b, _ = await store.register_node("b", lease_seconds=LEASE)
    old = (await store.acquire_session("s", a.ref)).fence
    await store.enqueue_input("s", "user", {"content": "two"})
    second = await store.claim_next_input("s", fence=old)
    new = await take_over(store, backend, clock, "s", a.ref, b.ref)
    with pytest.raises(Fenced):
        await store.close_input(
            "s",
            [("stream_end", {})],
            second.id,
            "done",
            fence=old,
            steps=[note(store, "d", {"n": 4})],
        )
    assert await store.kv_get("test", "d") is None
    await store.close_input(
        "s", [("stream_end", {})], second.id, "done", fence=new, steps=[note(store, "d", {"n": 5})]
    )
    assert await store.kv_get("test", "d") == {"n": 5}
    # the session gone
    await store.enqueue_input("s", "user", {"content": "three"})
    third = await store.claim_next_input("s", fence=new)
    await store.delete_session("s")
    with pytest.raises(NotFound):
        await store.close_input(
            "s", [("stream_end", {})], third.id, "done", steps=[note(store, "e", {"n": 6})]
        )
    assert await store.kv_get("test", "e") is None


def test_a_closing_step_must_say_when_the_input_moved():
    with pytest.raises(ValueError, match=r"must say \{moved\}"):
        ClosingStep("test.bad", "UPDATE kv SET value = :value::jsonb WHERE key = :key")


async def test_an_empty_claim_and_an_empty_list_tell_no_session_from_none(store):
    await store.create_session("s", "ada")
    assert await store.claim_next_input("s") is None
    assert await store.list_inputs("s") == []
    assert await store.list_inputs("s", ["queued"]) == []
    item = await running(store)
    assert [i.id for i in await store.list_inputs("s", ["running"])] == [item.id]
    assert await store.list_inputs("s", ["queued"]) == []
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    fence = (await store.acquire_session("s", a.ref)).fence
    assert await store.claim_next_input("s", fence=fence) is None
    with pytest.raises(Fenced) as refused:
        await store.claim_next_input("s", fence=fence + 1)
    assert (refused.value.fence, refused.value.current) == (fence + 1, fence)
    for fenced in (None, fence):
        with pytest.raises(NotFound, match=r"^no session with id 'gone'$"):
            await store.claim_next_input("gone", fence=fenced)
    with pytest.raises(NotFound, match=r"^no session with id 'gone'$"):
        await store.list_inputs("gone", ["queued"])


async def test_a_claim_unless_leaves_an_input_that_needs_a_slot_queued(store):
    """``claim_next_input_unless``: the claim of a session whose next input may need a
    scheduled-turn slot it does not hold (``actors/sessions/slots.py``)."""
    await store.create_session("s", "ada")
    assert await store.claim_next_input_unless("s", ["cron"]) is None
    with pytest.raises(NotFound, match=r"^no session with id 'gone'$"):
        await store.claim_next_input_unless("gone", ["cron"])
    tick = await store.enqueue_input("s", "cron", {"content": "tick"})
    await store.enqueue_input("s", "user", {"content": "hi"})
    # the oldest needs a slot: nothing is claimed, not even the input behind it
    for _ in range(2):
        assert await store.claim_next_input_unless("s", ["cron", "recall"]) == "cron"
    assert [i.state for i in await store.list_inputs("s")] == ["queued", "queued"]
    a, _ = await store.register_node("a", lease_seconds=LEASE)
    fence = (await store.acquire_session("s", a.ref)).fence
    with pytest.raises(Fenced):
        await store.claim_next_input_unless("s", ["cron"], fence=fence + 1)
    claimed = await store.claim_next_input_unless("s", [], fence=fence)
    assert (claimed.id, claimed.state) == (tick.id, "running")
    claimed = await store.claim_next_input_unless("s", ["cron"], fence=fence)
    assert (claimed.payload["content"], claimed.state) == ("hi", "running")
    assert await store.claim_next_input_unless("s", ["cron"], fence=fence) is None


@pytest.mark.postgres
async def test_a_turn_on_postgresql_takes_one_round_trip_per_operation(pg_dsn, monkeypatch):
    """The round trips of a turn's operations (issue 26): each is one, found or not."""
    monkeypatch.setenv(STATS_ENV, "1")
    async with pg_schema(pg_dsn) as (url, _), open_store(url) as store:
        engine = store.engine

        async def trips(call, operations: int = 1) -> int:
            """The round trips of ``call`` (less the preparations of a statement the
            connection meets for the first time, which its cache then holds)."""
            before = engine.statistics()
            try:
                await call
            except (NotFound, ConflictError):  # (Fenced is a ConflictError)
                pass
            spent = engine.statistics() - before
            assert spent.operations == operations
            return spent.round_trips - spent.prepares

        await store.create_session("s", "ada")
        a, _ = await store.register_node("a", lease_seconds=LEASE)
        fence = (await store.acquire_session("s", a.ref)).fence
        assert await trips(store.enqueue_input("s", "user", {"content": "x"})) == 1
        assert await trips(store.list_inputs("s", ["queued"])) == 1
        assert await trips(store.claim_next_input("s", fence=fence)) == 1
        item = (await store.list_inputs("s", ["running"]))[0]
        assert await trips(store.claim_next_input("s", fence=fence)) == 1  # none queued
        assert await trips(store.claim_next_input("gone")) == 1
        assert await trips(store.list_inputs("s", ["queued"])) == 1  # none
        assert await trips(store.list_inputs("gone")) == 1
        assert await trips(store.claim_next_input_unless("s", ["cron"], fence=fence)) == 1
        assert await trips(store.claim_next_input_unless("gone", ["cron"])) == 1
        assert await trips(store.append_events("s", [("token", {})], fence=fence)) == 1
        closing = store.close_input("s", [("stream_end", {})], item.id, "done", fence=fence)
        assert await trips(closing) == 1
        # a job's turn: its run record joins the closing statement (a ClosingStep)
        await store.enqueue_input("s", "cron", {"content": "y"})
        item = await store.claim_next_input("s", fence=fence)
        steps = [note(store, "run", {"state": "turn_completed"})]
        closing = store.close_input(
            "s", [("stream_end", {})], item.id, "done", fence=fence, steps=steps
        )
        assert await trips(closing) == 1
        assert await store.kv_get("test", "run") == {"state": "turn_completed"}
        # refused: the closure's one, then the read that says why
        again = store.close_input("s", [("stream_end", {})], item.id, "done")
        assert await trips(again, operations=2) == 2
        assert engine.statistics().counting
