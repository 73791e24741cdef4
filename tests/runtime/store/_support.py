"""Helpers for the store suite: a manual clock, and raw SQL access behind the store's back."""

from __future__ import annotations

import atexit
import secrets
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import trio
import trio_asyncio

from turnstile.runtime.clock import Clock
from turnstile.runtime.store import open_store

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)


class ManualClock(Clock):
    """Wall time that only moves when told to."""

    def __init__(self, start: datetime = T0) -> None:
        self.t = start
        super().__init__(lambda: self.t)

    def advance(self, **delta: float) -> None:
        self.t += timedelta(**delta)


class Backend:
    """Which database a test runs against, and raw SQL access to it behind the store's back."""

    def __init__(self, kind: str, url: str, admin_dsn: str | None = None) -> None:
        self.kind = kind
        self.url = url
        self.admin_dsn = admin_dsn

    def __repr__(self) -> str:
        return f"<Backend {self.kind}>"

    def open(self, clock: Clock | None = None):
        return open_store(self.url, clock=clock)

    async def sql(self, query: str, *args: Any) -> list[tuple]:
        """Run one statement (``?`` placeholders for sqlite, ``$n`` for postgres)."""
        if self.kind == "sqlite":
            path = self.url.removeprefix("sqlite:///")

            def run() -> list[tuple]:
                conn = sqlite3.connect(path, isolation_level=None)
                try:
                    return [tuple(r) for r in conn.execute(query, args).fetchall()]
                finally:
                    conn.close()

            return await trio.to_thread.run_sync(run)
        rows = await pg_run(self.url, query, *args)
        return [tuple(r) for r in rows]

    async def count(self, table: str) -> int:
        return (await self.sql(f"SELECT count(*) FROM {table}"))[0][0]


async def pg_run(dsn: str, query: str, *args: Any) -> list[Any]:
    """One statement on a fresh connection (own trio-asyncio loop)."""
    return await _on_connection(dsn, "fetch", query, *args)


async def pg_script(dsn: str, statements: str) -> None:
    """Statements separated by ``;`` on a fresh connection, in one transaction (the simple
    query protocol's: ``fetch`` would prepare, which takes one statement)."""
    await _on_connection(dsn, "execute", statements)


async def _on_connection(dsn: str, method: str, query: str, *args: Any) -> Any:
    async with trio_asyncio.open_loop() as loop:
        aio = trio_asyncio.aio_as_trio

        conn = await aio(asyncpg.connect, loop=loop)(dsn)
        try:
            return await aio(getattr(conn, method), loop=loop)(query, *args)
        finally:
            await aio(conn.close, loop=loop)()


#: Schemas a block of :func:`pg_schema` is done with, by DSN, dropped by the next block's
#: statement on that DSN (or at exit): see :func:`pg_schema`.
_DONE: dict[str, list[str]] = {}


@asynccontextmanager
async def pg_schema(dsn: str) -> AsyncIterator[tuple[str, str]]:
    """A schema of its own on ``dsn`` for the block: ``(store URL, schema)``; the URL carries
    ``search_path`` (asyncpg passes unknown DSN parameters on as server settings, so every
    pooled connection lives in it).

    Dropped afterwards, whatever happened, but not at once: the schemas this process is done
    with are dropped by the statement that creates the next one (one connection and one commit
    for both, not a connection and a commit each) and the rest when the process exits. The
    suite makes about 400 of them; a drop of its own cost each about 50 ms of waiting and a
    connection's start (measured on the 2-core box). A test sees only its own schema, so one
    dropped a test later changes nothing it can see.
    """
    schema = f"t_{secrets.token_hex(6)}"
    done = _DONE.setdefault(dsn, [])
    drops = [f"DROP SCHEMA IF EXISTS {name} CASCADE;" for name in done]
    # one transaction (a simple query's statements are one), committed without waiting for
    # the WAL flush: a throw-away schema needs no durability
    await pg_script(
        dsn, f"SET LOCAL synchronous_commit = off; {' '.join(drops)} CREATE SCHEMA {schema}"
    )
    del done[: len(drops)]
    try:
        yield f"{dsn}{'&' if '?' in dsn else '?'}search_path={schema}", schema
    finally:
        done.append(schema)


def _drop_the_rest() -> None:
    """At exit: drop what :func:`pg_schema` left to the next block (``psql``, no event loop)."""
    for dsn, names in _DONE.items():
        if names:
            statement = " ".join(f"DROP SCHEMA IF EXISTS {name} CASCADE;" for name in names)
            try:
                subprocess.run(["psql", dsn, "-qc", statement], capture_output=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired):  # no psql: the schemas stay behind
                pass


atexit.register(_drop_the_rest)
