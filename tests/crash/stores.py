"""The store a crash run uses, and reading it back behind the node's back, read-only.

A :class:`Target` is one fresh store per run: a SQLite file in a directory of its own, or a
PostgreSQL schema of its own (``?search_path=``, dropped afterwards). :meth:`Target.snapshot`
reads the tables the invariants look at, whole, into plain dicts: the same code checks both
backends (JSON columns decoded, times left as the driver gives them).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

#: the tables read, with their JSON columns (a table a node's features did not create is empty)
TABLES: dict[str, tuple[str, ...]] = {
    "sessions": ("metadata",),
    "inbox": ("payload", "detail"),
    "events": ("payload",),
    "jobs": ("spec",),
    "job_runs": ("detail",),
    "kv": ("value",),
    "webhook_deliveries": (),
    "webhook_targets": (),
    "webhook_bindings": (),
    "background_tasks": ("args", "result"),
    "approvals": (),
    "memory_facts": (),
}


@dataclass
class Snapshot:
    """The rows of :data:`TABLES`, each a dict by column name."""

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __getitem__(self, table: str) -> list[dict[str, Any]]:
        return self.tables.get(table, [])


def _decode(table: str, row: dict[str, Any]) -> dict[str, Any]:
    for column in TABLES[table]:
        value = row.get(column)
        if isinstance(value, str):
            try:
                row[column] = json.loads(value)
            except ValueError:
                pass
    return row


class Target:
    """One store for one run (see the module docstring); ``url`` is what ``serve`` gets."""

    kind: str
    url: str

    async def snapshot(self) -> Snapshot:  # pragma: no cover - the subclasses'
        raise NotImplementedError

    async def make_jobs_due(self) -> int:  # pragma: no cover - the subclasses'
        """Move every active job's next occurrence to now, while no node runs (a scenario's
        setup made it for later: a heartbeat is 15 minutes away at least); answers how many."""
        raise NotImplementedError


class SQLiteTarget(Target):
    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"

    def _read(self) -> Snapshot:
        # read-only, and no WAL checkpoint of our own: the node's files are left as they are
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
        conn.row_factory = sqlite3.Row
        try:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            snap = Snapshot()
            conn.execute("BEGIN")
            for table in TABLES:
                if table in names:
                    rows = conn.execute(f"SELECT * FROM {table}").fetchall()  # noqa: S608
                    snap.tables[table] = [_decode(table, dict(r)) for r in rows]
            conn.execute("COMMIT")
            return snap
        finally:
            conn.close()

    async def snapshot(self) -> Snapshot:
        if not self.path.exists():
            return Snapshot()
        return await trio.to_thread.run_sync(self._read)

    def _make_due(self) -> int:
        from turnstile.runtime.store.sqlite import SQLiteBackend

        now = SQLiteBackend.db_time(datetime.now(UTC))
        conn = sqlite3.connect(self.path, timeout=10)
        try:
            with conn:
                cursor = conn.execute(
                    "UPDATE jobs SET next_fire_at = ?"
                    " WHERE state = 'active' AND next_fire_at IS NOT NULL",
                    (now,),
                )
            return cursor.rowcount
        finally:
            conn.close()

    async def make_jobs_due(self) -> int:
        return await trio.to_thread.run_sync(self._make_due)


class PostgresTarget(Target):
    kind = "postgres"

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.url = f"{dsn}{'&' if '?' in dsn else '?'}search_path={schema}"

    async def snapshot(self) -> Snapshot:
        import asyncpg
        import trio_asyncio

        async with trio_asyncio.open_loop() as loop:
            aio = trio_asyncio.aio_as_trio
            conn = await aio(asyncpg.connect, loop=loop)(
                self.dsn,
                server_settings={
                    "search_path": self.schema,
                    "default_transaction_read_only": "on",
                },
            )
            try:
                names = {
                    r["tablename"]
                    for r in await aio(conn.fetch, loop=loop)(
                        "SELECT tablename FROM pg_tables WHERE schemaname = $1", self.schema
                    )
                }
                snap = Snapshot()
                # one snapshot of every table, as SQLite's BEGIN gives: read table by table
                # outside a transaction, a commit between two reads (a fire's input and its
                # job) showed the job completed and no input waiting, so the harness took
                # the scenario for settled and stopped the node with the input queued (the
                # ``--fault delay`` run, ``once`` on PostgreSQL)
                await aio(conn.execute, loop=loop)(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                )
                for table in TABLES:
                    if table in names:
                        rows = await aio(conn.fetch, loop=loop)(f"SELECT * FROM {table}")  # noqa: S608
                        snap.tables[table] = [_decode(table, dict(r)) for r in rows]
                await aio(conn.execute, loop=loop)("COMMIT")
                return snap
            finally:
                await aio(conn.close, loop=loop)()

    async def make_jobs_due(self) -> int:
        from tests.runtime.store._support import pg_run

        rows = await pg_run(
            self.url,
            "WITH moved AS (UPDATE jobs SET next_fire_at = now()"
            " WHERE state = 'active' AND next_fire_at IS NOT NULL RETURNING 1)"
            " SELECT count(*) FROM moved",
        )
        return rows[0][0]


@asynccontextmanager
async def fresh_target(kind: str, workdir: Path, pg_dsn: str | None) -> AsyncIterator[Target]:
    """A new empty store of ``kind`` for one run; a PostgreSQL schema is dropped afterwards."""
    if kind == "sqlite":
        directory = workdir / f"run-{secrets.token_hex(4)}"
        directory.mkdir(parents=True)
        yield SQLiteTarget(directory / "store.db")
        return
    if pg_dsn is None:
        raise ValueError("a postgres run needs a DSN (TURNSTILE_TEST_PG_DSN)")
    from tests.runtime.store._support import pg_run

    schema = f"crash_{secrets.token_hex(5)}"
    await pg_run(pg_dsn, f"CREATE SCHEMA {schema}")
    try:
        yield PostgresTarget(pg_dsn, schema)
    finally:
        with trio.CancelScope(shield=True):
            await pg_run(pg_dsn, f"DROP SCHEMA {schema} CASCADE")
