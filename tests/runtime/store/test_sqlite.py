"""SQLite-only behaviour: the writer thread, group commit, durability settings."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import trio
import trio.lowlevel
import trio.testing

from turnstile.runtime.errors import AlreadyExists, NotFound, StoreError
from turnstile.runtime.store import SCHEMA_VERSION, open_store, ops


def _write(fn) -> ops.Operation:
    """An operation that runs ``fn(conn)`` in the writer's group commit."""
    return ops.procedure("test.write", sqlite=fn, postgres=None, writes=True)


def _read(fn) -> ops.Operation:
    """An operation that runs ``fn(conn)`` on a reader connection."""
    return ops.procedure("test.read", sqlite=fn, postgres=None)


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "turnstile-sqlite-writer"]


@pytest.fixture
async def sq(tmp_path):
    async with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        yield store


async def test_pragmas(tmp_path):
    def pragma(name):
        return lambda conn: conn.execute(f"PRAGMA {name}").fetchone()[0]

    async with open_store(f"sqlite:///{tmp_path}/a.db") as store:
        assert await store.run(_write(pragma("journal_mode"))) == "wal"
        assert await store.run(_write(pragma("synchronous"))) == 2  # FULL
        assert await store.run(_write(pragma("foreign_keys"))) == 1
    async with open_store(f"sqlite:///{tmp_path}/b.db?synchronous=normal") as store:
        assert await store.run(_write(pragma("synchronous"))) == 1  # NORMAL
    with pytest.raises(ValueError, match="unknown synchronous setting 'sometimes'"):
        async with open_store(f"sqlite:///{tmp_path}/c.db?synchronous=sometimes"):
            pass


async def test_group_commit(sq):
    await sq.create_session("s1", "ada")
    commits, requests = sq.commit_stats
    async with trio.open_nursery() as nursery:
        for i in range(100):
            nursery.start_soon(sq.enqueue_input, "s1", "user", {"i": i})
    commits2, requests2 = sq.commit_stats
    assert requests2 - requests == 100
    assert commits2 - commits < 50  # many writers shared each transaction (and its fsync)
    assert len(await sq.list_inputs("s1")) == 100


async def test_failure_in_a_batch_fails_only_that_request(sq):
    await sq.create_session("s1", "ada")
    outcomes: dict[str, object] = {}

    async def attempt(key, fn, *args):
        try:
            outcomes[key] = await fn(*args)
        except Exception as exc:
            outcomes[key] = exc

    async with trio.open_nursery() as nursery:
        for i in range(30):
            if i % 10 == 3:
                nursery.start_soon(attempt, i, sq.enqueue_input, "nope", "user", {"i": i})
            elif i % 10 == 7:
                nursery.start_soon(attempt, i, sq.create_session, "s1", "dup")
            else:
                nursery.start_soon(attempt, i, sq.enqueue_input, "s1", "user", {"i": i})
    for i, result in outcomes.items():
        if i % 10 == 3:
            assert isinstance(result, NotFound)
        elif i % 10 == 7:
            assert isinstance(result, AlreadyExists)
        else:
            assert result.payload == {"i": i}
    assert len(await sq.list_inputs("s1")) == 24
    assert (await sq.get_session("s1")).owner == "ada"


async def test_cancelled_while_queued_writes_nothing(sq):
    await sq.create_session("s1", "ada")
    started, gate = threading.Event(), threading.Event()

    def blocker(conn):
        started.set()
        gate.wait(10)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sq.run, _write(blocker))
        await trio.to_thread.run_sync(started.wait)
        with trio.move_on_after(0.05) as scope:
            await sq.enqueue_input("s1", "user", {})
        assert scope.cancelled_caught
        gate.set()
    assert await sq.list_inputs("s1") == []
    with trio.CancelScope() as scope:
        scope.cancel()
        await sq.enqueue_input("s1", "user", {})
    assert await sq.list_inputs("s1") == []


async def test_cancelled_while_running_still_gets_result(sq):
    started, gate = threading.Event(), threading.Event()
    seen: list[str] = []

    def slow(conn):
        started.set()
        gate.wait(10)
        return 42

    async def caller(task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            task_status.started(scope)
            seen.append(await sq.run(_write(slow)))
            await trio.lowlevel.checkpoint()  # the pending cancellation lands here
            seen.append("not reached")

    async with trio.open_nursery() as nursery:
        scope = await nursery.start(caller)
        await trio.to_thread.run_sync(started.wait)
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()  # the cancellation was tried and refused
        assert seen == []  # the committed write is not reported as cancelled
        gate.set()
    assert seen == [42]


async def test_sqlite_errors_become_store_errors(sq):
    with pytest.raises(StoreError, match="^sqlite: no such table: nope$"):
        await sq.run(_write(lambda conn: conn.execute("SELECT * FROM nope")))
    with pytest.raises(StoreError, match="^sqlite: no such table: nope$"):
        await sq.run(_read(lambda conn: conn.execute("SELECT * FROM nope")))
    with pytest.raises(StoreError, match="readonly"):
        await sq.run(_read(lambda conn: conn.execute("DELETE FROM sessions")))


async def test_close_stops_the_writer_thread(tmp_path):
    before = len(_writer_threads())
    async with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        assert len(_writer_threads()) == before + 1
        await store.create_session("s1", "ada")
    assert len(_writer_threads()) == before


async def test_close_finishes_queued_writes(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    started, gate = threading.Event(), threading.Event()

    def blocker(conn):
        started.set()
        gate.wait(10)

    async with open_store(url) as store:
        await store.create_session("s1", "ada")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run, _write(blocker))
            await trio.to_thread.run_sync(started.wait)
            for i in range(20):
                nursery.start_soon(store.enqueue_input, "s1", "user", {"i": i})
            await trio.testing.wait_all_tasks_blocked()  # all 20 queued behind the blocker
            nursery.start_soon(store.aclose)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        with pytest.raises(StoreError, match="^store is closed$"):
            await store.enqueue_input("s1", "user", {})
    async with open_store(url) as store:
        assert len(await store.list_inputs("s1")) == 20


async def test_memory_database():
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s1", "ada")
        await store.enqueue_input("s1", "user", {})
        await store.append_events("s1", [("a", {})])
        assert (await store.get_session("s1")).last_seq == 1
        assert len(await store.list_inputs("s1")) == 1
        assert [m.version for m in await store.migrations()] == list(range(1, SCHEMA_VERSION + 1))


async def test_unopenable_file(tmp_path):
    with pytest.raises(StoreError, match="cannot open"):
        async with open_store(f"sqlite:///{tmp_path}/missing/dir/s.db"):
            pass


async def test_file_is_plain_sqlite(tmp_path):
    async with open_store(f"sqlite:///{tmp_path}/s.db") as store:
        await store.create_session("s1", "ada", {"k": 1})
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        row = conn.execute("SELECT id, metadata, created_at FROM sessions").fetchone()
    finally:
        conn.close()
    assert row[0] == "s1" and row[1] == '{"k":1}' and row[2].endswith("Z")


async def test_memory_store_runs_inline_so_a_mock_clock_never_jumps(autojump_clock):
    from turnstile.runtime.store import open_store

    async with open_store("sqlite:///:memory:") as store:
        start = trio.current_time()
        with trio.fail_after(1):  # a thread wait would let the clock jump to this deadline
            await store.create_session("m", "ada")
            for i in range(50):
                await store.enqueue_input("m", "user", {"n": i})
            assert (await store.claim_next_input("m")).payload == {"n": 0}
        assert trio.current_time() == start
