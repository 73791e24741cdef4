"""A feature's own tables: its migration set creates them and its operations run on them with the
store's guarantees, on both backends, the same way the kernel's do."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.runtime.store._support import T0, ManualClock
from turnstile.runtime.errors import StoreError
from turnstile.runtime.store import Migration, MigrationSet, open_store, ops

NOTES = MigrationSet(
    "notes",
    [
        Migration(
            1,
            "notes",
            sqlite=(
                "CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT NOT NULL,"
                " written_at TEXT NOT NULL, tags TEXT NOT NULL DEFAULT '[]') STRICT",
            ),
            postgres=(
                'CREATE TABLE notes (id text COLLATE "C" PRIMARY KEY, body text NOT NULL,'
                " written_at timestamptz NOT NULL, tags jsonb NOT NULL DEFAULT '[]')",
            ),
        )
    ],
)


class Note(msgspec.Struct, frozen=True):
    id: str
    body: str
    tags: list[str]


def _note(row: Any) -> Note:
    return Note(row["id"], row["body"], msgspec.json.decode(row["tags"]))


# SQL written once for both backends: named placeholders, a cast PostgreSQL needs
ADD = ops.row(
    "notes.add",
    "INSERT INTO notes (id, body, written_at, tags) VALUES (:id, :body, :at, :tags::jsonb)"
    " ON CONFLICT (id) DO NOTHING RETURNING id, body, tags",
    decode=_note,
    writes=True,
)
ALL = ops.rows("notes.all", "SELECT id, body, tags FROM notes ORDER BY id", decode=_note)
COUNT = ops.value("notes.count", "SELECT count(*) FROM notes WHERE body LIKE :pattern")
DROP = ops.count("notes.drop", "DELETE FROM notes WHERE id = :id")
EXISTS = ops.found("notes.exists", "SELECT 1 FROM notes WHERE id = :id")

# several statements in one transaction: a function per backend
_INSERT = ops.Statement(
    "INSERT INTO notes (id, body, written_at) VALUES (:id, :body, :at)",
    params=("id", "body", "at"),
)


def _put_sqlite(conn, notes, at):
    for note_id, body in notes:
        conn.execute(_INSERT.sqlite, (note_id, body, at))
    return len(notes)


async def _put_postgres(conn, notes, at):
    async with conn.transaction():
        for note_id, body in notes:
            await conn.execute(_INSERT.postgres, note_id, body, at)
    return len(notes)


PUT = ops.procedure("notes.put", sqlite=_put_sqlite, postgres=_put_postgres, writes=True)


async def test_a_features_operations_run_on_its_own_tables(backend):
    clock = ManualClock()
    async with open_store(backend.url, clock=clock, migrations=[NOTES]) as store:
        at = store.db_time(T0)
        assert await store.run(PUT, notes=[("a", "one"), ("b", "two")], at=at) == 2
        assert await store.run(ALL) == [Note("a", "one", []), Note("b", "two", [])]
        # a write that fails is undone whole, and reaches the caller as StoreError
        with pytest.raises(StoreError):
            await store.run(PUT, notes=[("c", "three"), ("a", "again")], at=at)
        assert [n.id for n in await store.run(ALL)] == ["a", "b"]
        # the other shapes
        added = await store.run(ADD, id="c", body="three", at=at, tags='["x"]')
        assert added == Note("c", "three", ["x"])
        assert await store.run(ADD, id="c", body="again", at=at, tags="[]") is None
        assert await store.run(COUNT, pattern="t%") == 2
        assert await store.run(EXISTS, id="c") is True
        assert await store.run(DROP, id="c") == 1
        assert await store.run(DROP, id="c") == 0
        assert await store.run(EXISTS, id="c") is False
    # durable: the rows are there after the store is closed and opened again
    async with open_store(backend.url, clock=clock, migrations=[NOTES]) as store:
        assert [n.id for n in await store.run(ALL)] == ["a", "b"]
    assert await backend.count("notes") == 2


async def test_only_operations_run_and_arguments_are_checked(backend):
    async with open_store(backend.url, migrations=[NOTES]) as store:
        with pytest.raises(TypeError, match="expected an Operation, got function"):
            await store.run(_put_sqlite)
        with pytest.raises(TypeError, match="operation 'notes.count' needs the argument 'pattern'"):
            await store.run(COUNT)
        with pytest.raises(TypeError, match="time must be a datetime"):
            store.db_time("2026-11-25T12:00:00Z")
        # as every stored time: UTC, a naive one taken to be UTC
        assert store.db_time(T0.replace(tzinfo=None)) == store.db_time(T0)
        # an operation for one backend only
        other = "postgres" if backend.kind == "sqlite" else "sqlite"
        one = ops.procedure("notes.one", **{backend.kind: None, other: _put_sqlite}, writes=True)
        with pytest.raises(
            TypeError, match=f"operation 'notes.one' does not run on {backend.kind}"
        ):
            await store.run(one, notes=[], at=None)
