"""Opening, migrating, closing and reopening the store, on both backends."""

from __future__ import annotations

import pytest
import trio

from tests.runtime.store._support import T0, ManualClock
from turnstile.runtime.errors import MigrationError, NotFound, StoreError
from turnstile.runtime.store import SCHEMA_VERSION, Store, open_store


async def test_store_satisfies_protocol(store, backend):
    assert isinstance(store, Store)
    assert store.backend == backend.kind


async def test_migrations_recorded_and_idempotent(backend, clock):
    async with backend.open(clock) as store:
        first = await store.migrations()
    assert [(m.version, m.name) for m in first] == [
        (1, "initial"),
        (2, "one_pending_recall"),
        (3, "kv"),
        (4, "inbox_idempotency_key"),
        (5, "nodes"),
        (6, "session_leases"),
    ]
    assert first[-1].version == SCHEMA_VERSION and first[0].applied_at == T0
    async with backend.open(ManualClock(T0.replace(year=2031))) as store:
        assert await store.migrations() == first  # nothing re-applied
    assert await backend.count("schema_migrations") == SCHEMA_VERSION


async def test_newer_schema_is_refused(backend):
    async with backend.open():
        pass
    await backend.sql(
        "INSERT INTO schema_migrations (version, name, applied_at)"
        " VALUES (7, 'future', '2030-01-01T00:00:00.000000Z')"
    )
    with pytest.raises(
        MigrationError, match=rf"^schema version 7 is newer than this code \({SCHEMA_VERSION}\)$"
    ):
        async with backend.open():
            pass
    assert await backend.count("schema_migrations") == SCHEMA_VERSION + 1


async def test_reopen_keeps_everything(backend, clock):
    async with backend.open(clock) as store:
        await store.create_session("s1", "ada", {"k": "v"})
        item = await store.enqueue_input("s1", "user", {"text": "hi"})
        await store.claim_next_input("s1")
        queued = await store.enqueue_input("s1", "user", {"text": "later"})
        await store.append_events("s1", [("a", {"x": 1}), ("b", {})])
        before = (
            await store.get_session("s1"),
            await store.list_inputs("s1"),
            await store.read_events("s1"),
        )
    async with backend.open(clock) as store:
        after = (
            await store.get_session("s1"),
            await store.list_inputs("s1"),
            await store.read_events("s1"),
        )
        assert after == before
        # crash recovery after a restart
        assert [i.id for i in await store.interrupt_running()] == [item.id]
        assert await store.sessions_with_queued_inputs() == ["s1"]
        # ids keep growing across restarts
        newer = await store.enqueue_input("s1", "user", {})
        assert newer.id > queued.id
        (e,) = await store.append_events("s1", [("c", {})])
        assert e.seq == 3


async def test_errors_inside_the_block_propagate_unchanged(backend):
    with pytest.raises(NotFound, match=r"^no session with id 'x'$"):
        async with backend.open() as store:
            await store.get_session("x")
    with trio.move_on_after(0.01) as scope:
        async with backend.open() as store:
            await trio.sleep_forever()
    assert scope.cancelled_caught


async def test_closed_store_refuses(backend):
    async with backend.open() as store:
        await store.ping()
        await store.create_session("s1", "ada")
    with pytest.raises(StoreError, match=r"^store is closed$"):
        await store.ping()
    with pytest.raises(StoreError, match=r"^store is closed$"):
        await store.get_session("s1")
    with pytest.raises(StoreError, match=r"^store is closed$"):
        await store.create_session("s2", "ada")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://localhost/db", "unsupported store url scheme 'mysql'"),
        ("sqlite://relative.db", "bad sqlite url"),
        ("sqlite:///x.db?journal=off", "unknown sqlite option 'journal'"),
        # refused before any connection is tried: no server needed
        ("postgresql://u@127.0.0.1:1/db?pool_size=0", "pool_size must be a whole number"),
        ("postgresql://u@127.0.0.1:1/db?pool_size=501", "from 1 to 500, not '501'"),
        ("postgresql://u@127.0.0.1:1/db?a=b&pool_size=2.5", "not '2.5'"),
        ("postgres://u@127.0.0.1:1/db?pool_size=", "not ''"),
    ],
)
async def test_bad_urls(url, message):
    with pytest.raises(ValueError, match=message):
        async with open_store(url):
            pass


def test_a_postgres_store_prints_without_its_password():
    """A store's repr (in a traceback, a log line, a debugger) names its database but never
    its password, given in the URL's user part or as ``?password=``."""
    from turnstile.runtime.store.postgres import PostgresBackend

    for url in (
        "postgresql://ann:s3cret-pw@db.example:5432/app?search_path=x",
        "postgresql://ann@db.example/app?password=s3cret-pw&search_path=x",
    ):
        shown = repr(PostgresBackend(url))
        assert "s3cret-pw" not in shown
        assert "db.example" in shown and "search_path=x" in shown and "***" in shown
