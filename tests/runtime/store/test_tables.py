"""A feature's own tables: its migration set creates them and its ``TableQuery`` objects run on
them with the store's guarantees, on both backends."""

from __future__ import annotations

import pytest

from tests.runtime.store._support import T0, ManualClock
from turnstile.runtime.errors import StoreError
from turnstile.runtime.store import Migration, MigrationSet, TableQuery, open_store

NOTES = MigrationSet(
    "notes",
    [
        Migration(
            1,
            "notes",
            sqlite=(
                "CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT NOT NULL,"
                " written_at TEXT NOT NULL) STRICT",
            ),
            postgres=(
                'CREATE TABLE notes (id text COLLATE "C" PRIMARY KEY, body text NOT NULL,'
                " written_at timestamptz NOT NULL)",
            ),
        )
    ],
)


def _put_sqlite(conn, notes, at):
    for note_id, body in notes:
        conn.execute("INSERT INTO notes VALUES (?, ?, ?)", (note_id, body, at))
    return len(notes)


async def _put_postgres(conn, notes, at):
    async with conn.transaction():
        for note_id, body in notes:
            await conn.execute("INSERT INTO notes VALUES ($1, $2, $3)", note_id, body, at)
    return len(notes)


def _all_sqlite(conn):
    return [tuple(r) for r in conn.execute("SELECT id, body FROM notes ORDER BY id")]


async def _all_postgres(conn):
    return [tuple(r) for r in await conn.fetch("SELECT id, body FROM notes ORDER BY id")]


PUT = TableQuery("notes.put", sqlite=_put_sqlite, postgres=_put_postgres)
ALL = TableQuery("notes.all", sqlite=_all_sqlite, postgres=_all_postgres)


async def test_a_features_queries_run_on_its_own_tables(backend):
    clock = ManualClock()
    async with open_store(backend.url, clock=clock, migrations=[NOTES]) as store:
        at = store.db_time(T0)
        assert await store.run_write(PUT, notes=[("a", "one"), ("b", "two")], at=at) == 2
        assert await store.run_read(ALL) == [("a", "one"), ("b", "two")]
        # a write that fails is undone whole, and reaches the caller as StoreError
        with pytest.raises(StoreError):
            await store.run_write(PUT, notes=[("c", "three"), ("a", "again")], at=at)
        assert await store.run_read(ALL) == [("a", "one"), ("b", "two")]
    # durable: the rows are there after the store is closed and opened again
    async with open_store(backend.url, clock=clock, migrations=[NOTES]) as store:
        assert await store.run_read(ALL) == [("a", "one"), ("b", "two")]
    assert await backend.count("notes") == 2


async def test_only_table_queries_run_and_times_are_checked(backend):
    async with open_store(backend.url, migrations=[NOTES]) as store:
        with pytest.raises(TypeError, match="expected a TableQuery"):
            await store.run_read(_all_sqlite)
        with pytest.raises(TypeError, match="time must be a datetime"):
            store.db_time("2026-11-25T12:00:00Z")
        # as every stored time: UTC, a naive one taken to be UTC
        assert store.db_time(T0.replace(tzinfo=None)) == store.db_time(T0)
