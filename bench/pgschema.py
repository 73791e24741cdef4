"""A throw-away PostgreSQL schema for a scenario's PostgreSQL figures.

Scenarios run the store on ``PG_DSN`` (this machine's local server, as in the tests) in a
schema of their own, dropped afterwards, so a run leaves nothing behind in the database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import trio

from turnstile.runtime.store.postgres_thread import open_asyncio_thread

__all__ = ["PG_DSN", "PostgresUnavailable", "temporary_schema"]

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


class PostgresUnavailable(Exception):
    """No PostgreSQL figures: the message says why."""


def _ddl(sql: str) -> None:
    """Run one statement on its own connection, on an asyncio thread like the store's.

    Not through trio-asyncio: importing it replaces asyncio's running-loop lookups for the
    whole process with ones that ask trio first, which the store's asyncio thread then pays
    on every call (several per operation); a node never imports it, so neither does this.
    """
    import asyncpg

    async def run() -> None:
        with trio.fail_after(30):
            async with open_asyncio_thread() as aio:
                conn = await aio.call(partial(asyncpg.connect, PG_DSN, timeout=5))
                try:
                    await aio.call(conn.execute, sql)
                finally:
                    await aio.call(conn.close)

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
