"""PostgreSQL-only behaviour: the trio-asyncio loop, concurrent start-ups, connection errors."""

from __future__ import annotations

import secrets

import pytest
import trio
import trio_asyncio

from tests.runtime.store._support import pg_run
from turnstile.runtime.errors import StoreError
from turnstile.runtime.store import SCHEMA_VERSION, open_store

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg_url(pg_dsn):
    schema = f"t_{secrets.token_hex(6)}"
    await pg_run(pg_dsn, f"CREATE SCHEMA {schema}")
    try:
        yield f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}search_path={schema}"
    finally:
        with trio.CancelScope(shield=True):
            await pg_run(pg_dsn, f"DROP SCHEMA {schema} CASCADE")


async def test_opens_its_own_loop(pg_url):
    assert trio_asyncio.current_loop.get() is None
    async with open_store(pg_url) as store:
        assert store.engine._loop is not None
        await store.create_session("s1", "ada")
    assert trio_asyncio.current_loop.get() is None
    assert store.engine._loop.is_closed()


async def test_uses_the_running_loop(pg_url):
    async with trio_asyncio.open_loop() as loop:
        async with open_store(pg_url) as store:
            assert store.engine._loop is loop
            await store.create_session("s1", "ada")
        assert not loop.is_closed()


async def test_callable_from_tasks_started_before_the_loop(pg_url):
    send, receive = trio.open_memory_channel(1)
    done = trio.Event()

    async def worker():
        store = await receive.receive()  # this task's context has no trio-asyncio loop
        await store.create_session("s1", "ada")
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker)
        async with open_store(pg_url) as store:
            await send.send(store)
            await done.wait()
            assert [s.id for s in await store.list_sessions()] == ["s1"]


async def test_concurrent_start_ups_migrate_once(pg_url):
    counts = []

    async def start():
        async with open_store(pg_url) as store:
            counts.append(len(await store.migrations()))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(start)
    assert counts == [SCHEMA_VERSION] * 4
    rows = await pg_run(pg_url, "SELECT count(*) FROM schema_migrations")
    assert rows[0][0] == SCHEMA_VERSION


async def test_unreachable_server():
    with pytest.raises(StoreError, match="^postgres: cannot connect"):
        async with open_store("postgresql://postgres@127.0.0.1:1/test"):
            pass
