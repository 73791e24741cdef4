"""A throw-away PostgreSQL schema for a scenario's PostgreSQL figures.

Scenarios run the store on ``PG_DSN`` (this machine's local server, as in the tests) in a
schema of their own, dropped afterwards, so a run leaves nothing behind in the database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import trio

__all__ = ["PG_DSN", "PostgresUnavailable", "temporary_schema"]

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


class PostgresUnavailable(Exception):
    """No PostgreSQL figures: the message says why."""


def _ddl(sql: str) -> None:
    """Run one statement on its own connection and trio-asyncio loop, as the store tests do."""
    import asyncpg
    import trio_asyncio

    async def run() -> None:
        with trio.fail_after(30):
            async with trio_asyncio.open_loop() as loop:
                aio = trio_asyncio.aio_as_trio
                conn = await aio(asyncpg.connect, loop=loop)(PG_DSN, timeout=5)
                try:
                    await aio(conn.execute, loop=loop)(sql)
                finally:
                    await aio(conn.close, loop=loop)()

    trio.run(run)


@contextmanager
def temporary_schema() -> Iterator[str]:
    """A store URL on a new schema, dropped on exit; call outside any ``trio.run``.

    Raises:
        PostgresUnavailable: asyncpg is missing or the server does not answer.
    """
    try:
        import asyncpg
    except ImportError:
        raise PostgresUnavailable("asyncpg is not installed") from None
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        _ddl(f"CREATE SCHEMA {schema}")
    except (OSError, asyncpg.PostgresError, TimeoutError, trio.TooSlowError) as exc:
        raise PostgresUnavailable(f"PostgreSQL at {PG_DSN} is not reachable ({exc!r})") from None
    try:
        yield f"{PG_DSN}?search_path={schema}"
    finally:
        _ddl(f"DROP SCHEMA {schema} CASCADE")
