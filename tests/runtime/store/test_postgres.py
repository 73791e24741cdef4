"""PostgreSQL-only behaviour: the asyncio thread, cancellation, concurrent start-ups, connection
errors."""

from __future__ import annotations

import secrets
import threading

import pytest
import trio
import trio.testing
import trio_asyncio

from tests.runtime.store._support import T0, pg_run
from turnstile.runtime.errors import StoreError, StoreUnavailable
from turnstile.runtime.store import SCHEMA_VERSION, open_store, ops
from turnstile.runtime.store.kernel import KERNEL
from turnstile.runtime.store.postgres import open_postgres_backend

pytestmark = pytest.mark.postgres

#: a hang guard (real clock), not a promise: generous for a loaded 2-core box
WAIT = 60


def _on_postgres(fn) -> ops.Operation:
    """An operation that runs ``await fn(conn)`` on a pooled connection."""
    return ops.procedure("test.hold", sqlite=None, postgres=fn, writes=True)


async def test_runs_its_own_asyncio_thread(pg_store):
    async with open_store(pg_store) as store:
        aio = store.engine._aio
        assert aio._thread.is_alive()
        assert aio._thread is not threading.current_thread()
        await store.create_session("s1", "ada")
    assert not aio._thread.is_alive()
    assert aio.loop.is_closed()
    with pytest.raises(StoreError, match="^store is closed$"):
        await store.create_session("s2", "ada")


async def test_works_beside_a_trio_asyncio_loop(pg_store):
    # the tests and the bench's baseline import trio-asyncio, whose policy patches asyncio
    async with trio_asyncio.open_loop():
        async with open_store(pg_store) as store:
            await store.create_session("s1", "ada")
            assert [s.id for s in await store.list_sessions()] == ["s1"]


async def test_a_cancelled_query_gives_its_connection_back(pg_store):
    started = threading.Event()

    async def slow(conn):  # asyncio side
        started.set()
        await conn.execute("SELECT pg_sleep(30)")

    async def quick(conn):
        return await conn.fetchval("SELECT 41 + 1")

    async with open_postgres_backend(pg_store, [KERNEL], T0, max_size=1) as backend:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(backend.run, _on_postgres(slow))
                await trio.to_thread.run_sync(started.wait)
                scope.cancel()
        assert scope.cancelled_caught
        with trio.fail_after(WAIT):  # the pool has its one connection again (a new one)
            assert await backend.run(_on_postgres(quick)) == 42


async def test_an_answer_comes_back_even_when_cancelled_meanwhile(pg_store):
    started, release = threading.Event(), threading.Event()

    async def write(conn):  # asyncio side
        await conn.execute("CREATE TABLE marks (n int)")
        await conn.execute("INSERT INTO marks VALUES (1)")
        started.set()
        release.wait(5)  # holds the loop: the cancellation reaches it only after the return
        return "written"

    async with open_postgres_backend(pg_store, [KERNEL], T0) as backend:
        answers = []

        async def caller():
            answers.append(await backend.run(_on_postgres(write)))
            await trio.lowlevel.checkpoint()
            answers.append("not cancelled")

        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(caller)
                await trio.to_thread.run_sync(started.wait)
                scope.cancel()
                release.set()
        assert scope.cancelled_caught
        assert answers == ["written"]  # a committed write is not reported as cancelled
        assert [tuple(r) for r in await pg_run(pg_store, "SELECT n FROM marks")] == [(1,)]


async def test_callable_from_tasks_started_before_the_store(pg_store):
    send, receive = trio.open_memory_channel(1)
    done = trio.Event()

    async def worker():
        store = await receive.receive()  # a task the store was not opened in
        await store.create_session("s1", "ada")
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker)
        async with open_store(pg_store) as store:
            await send.send(store)
            await done.wait()
            assert [s.id for s in await store.list_sessions()] == ["s1"]


async def test_concurrent_start_ups_migrate_once(pg_store):
    counts = []

    async def start():
        async with open_store(pg_store) as store:
            counts.append(len(await store.migrations()))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(start)
    assert counts == [SCHEMA_VERSION] * 4
    rows = await pg_run(pg_store, "SELECT count(*) FROM schema_migrations")
    assert rows[0][0] == SCHEMA_VERSION


async def test_pool_size_in_the_url_bounds_the_connections(pg_store, caplog):
    """``?pool_size=N`` (docs/operations.md): the store opens at most N connections, the option
    does not reach the server as a setting, and an operation that finds all N busy past its
    bound is ``StoreUnavailable`` with a log line that names the pool, not the database."""
    name = f"p-{secrets.token_hex(4)}"
    started, release = threading.Semaphore(0), threading.Event()

    async def hold(conn):  # asyncio side: keep the connection until the test lets go
        started.release()
        while not release.is_set():
            await conn.execute("SELECT pg_sleep(0.01)")

    async with open_store(f"{pg_store}&pool_size=2", name=name) as store:
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(store.engine.run, _on_postgres(hold))
            for _ in range(2):
                await trio.to_thread.run_sync(started.acquire)
            rows = await pg_run(
                pg_store,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                f"turnstile {name}",
            )
            assert rows[0][0] == 2
            store.engine.operation_timeout = 0.5  # (the holds keep the default bound)
            with pytest.raises(StoreUnavailable):
                await store.create_session("s1", "ada")
            release.set()
        assert "all 2 are in use" in caplog.text
        assert "?pool_size=" in caplog.text
        store.engine.operation_timeout = None
        await store.create_session("s1", "ada")  # free again


async def test_unreachable_server():
    with pytest.raises(StoreError, match="^postgres: cannot connect"):
        async with open_store("postgresql://postgres@127.0.0.1:1/test"):
            pass


async def test_a_named_store_names_its_connections_and_listeners(pg_store):
    """``pg_stat_activity`` tells whose a connection is: a node's pool is ``turnstile <id>``, its
    listener ``turnstile <id> listen <channel>`` (docs/operations.md), so an operator or a test
    can act on one node's connections without touching another's; a URL's own
    ``application_name`` replaces ``turnstile <id>``."""
    name = f"n-{secrets.token_hex(4)}"

    async def names(prefix: str) -> list[str]:
        rows = await pg_run(
            pg_store,
            "SELECT application_name FROM pg_stat_activity"
            " WHERE application_name = $1 OR application_name LIKE $2 ORDER BY 1",
            prefix,
            prefix + " %",
        )
        return sorted(set(r[0] for r in rows))

    for url, base in [
        (pg_store, f"turnstile {name}"),
        (f"{pg_store}&application_name=ops-{name}", f"ops-{name}"),
    ]:
        async with open_store(url, name=name) as store:
            connected = trio.Event()

            def heard(payload: str | None, connected: trio.Event = connected) -> None:
                if payload is None:  # (re)connected
                    connected.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.listen, "t_named", heard)
                with trio.fail_after(WAIT):
                    await connected.wait()
                assert await names(base) == [base, f"{base} listen t_named"]
                nursery.cancel_scope.cancel()
