"""The PostgreSQL backend, on asyncpg: the pool, the trio-asyncio loop and migrations.

It only runs queries (:mod:`runtime.store.postgres_queries`); the front
(:mod:`runtime.store.front`) checks arguments and builds records.

asyncpg is an asyncio library; it runs here on a trio-asyncio loop. :meth:`PostgresBackend.read`
and :meth:`~PostgresBackend.write` are trio-flavoured: they wrap an asyncio coroutine with
``trio_asyncio.aio_as_trio(..., loop=...)`` bound to the backend's own loop reference, so they
may be called from any trio task (even one started before the loop was opened).
:func:`open_postgres_backend` uses the trio-asyncio loop of the calling context when there is
one, and otherwise opens one for the lifetime of the store. asyncio is confined to this module
and its query module.

Migrations run at start-up in one transaction under ``pg_advisory_xact_lock`` keyed by the
current schema, so concurrent start-ups apply them once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import trio
import trio_asyncio

from turnstile.runtime.errors import MigrationError, StoreError
from turnstile.runtime.store import postgres_queries as queries
from turnstile.runtime.store.migrations import (
    POSTGRES_SCHEMA_TABLE,
    POSTGRES_SCHEMA_TABLE_UPGRADE,
    MigrationSet,
    plan,
)

__all__ = ["PostgresBackend", "open_postgres_backend"]

T = TypeVar("T")

log = logging.getLogger("turnstile.store")

_CLOSE_TIMEOUT = 10.0
#: how often a listening connection is checked with a query (a connection cut without a word,
#: which no termination callback reports), and how long to wait before connecting again
_LISTEN_PING = 5.0
_LISTEN_RETRY = 1.0


async def _migrate(conn: asyncpg.Connection, sets: Sequence[MigrationSet], now: datetime) -> None:
    """Apply every pending step of ``sets`` in one transaction (see migrations.py)."""
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock("
            "hashtext('turnstile.schema_migrations.' || coalesce(current_schema(), '')))"
        )
        columns = await conn.fetchval(
            "SELECT array_agg(attname::text) FROM pg_attribute"
            " WHERE attrelid = to_regclass('schema_migrations') AND attnum > 0"
            " AND NOT attisdropped"
        )
        if columns and "set_name" not in columns:
            for stmt in POSTGRES_SCHEMA_TABLE_UPGRADE:
                await conn.execute(stmt)
        await conn.execute(POSTGRES_SCHEMA_TABLE)
        applied = await conn.fetch("SELECT set_name, version, name FROM schema_migrations")
        for step in plan(applied, sets, "postgres"):
            for stmt in step.statements:
                await conn.execute(stmt)
            await conn.execute(
                "INSERT INTO schema_migrations (set_name, version, name, applied_at)"
                " VALUES ($1, $2, $3, $4)",
                step.set_name,
                step.version,
                step.name,
                now,
            )


class PostgresBackend:
    """Runs the store's queries on a PostgreSQL pool (see the module docstring).

    Use :func:`runtime.store.open_store` (``postgresql://...``) rather than this class.

    Args:
        dsn: an asyncpg DSN; extra query parameters become server settings
            (``?search_path=myschema``).
        min_size, max_size: connection pool bounds.
    """

    kind = "postgres"

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.dsn = dsn
        self._min_size = min_size
        self._max_size = max_size
        self._loop: trio_asyncio.TrioEventLoop | None = None
        self._pool: asyncpg.Pool | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<PostgresBackend {self.dsn!r}>"

    @staticmethod
    def db_time(value: datetime) -> datetime:
        return value

    # ---- lifecycle ----

    async def open(
        self, loop: trio_asyncio.TrioEventLoop, sets: Sequence[MigrationSet], now: datetime
    ) -> None:
        """Create the pool on ``loop`` and apply ``sets``' pending migrations."""
        self._loop = loop
        try:
            self._pool = await self._aio(asyncpg.create_pool)(
                self.dsn, min_size=self._min_size, max_size=self._max_size
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"postgres: cannot connect: {exc}") from exc
        try:
            await self._call(_migrate, sets, now)
        except MigrationError:
            await self.aclose()
            raise
        except BaseException as exc:
            await self.aclose()
            if isinstance(exc, StoreError):
                raise MigrationError(f"postgres: migration failed: {exc}") from exc
            raise

    async def aclose(self) -> None:
        """Close the pool (waiting for operations in flight, then terminating)."""
        if self._closed:
            return
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(_CLOSE_TIMEOUT) as scope:
                await self._aio(pool.close)()
            if scope.cancelled_caught:
                pool.terminate()

    # ---- running queries ----

    async def read(self, op: str, /, **args: Any) -> Any:
        return await self._call(getattr(queries, op), **args)

    write = read  # every operation manages its own transaction where it needs one

    async def run_read(self, fn: Callable[..., Awaitable[T]], /, **args: Any) -> T:
        """Run a feature's ``await fn(conn, **args)`` (see :mod:`runtime.store.tables`)."""
        return await self._call(fn, **args)

    run_write = run_read  # the query opens its own transaction where it needs one

    # ---- notifications ----

    async def notify(self, channel: str, payload: str) -> None:
        """``pg_notify(channel, payload)``: delivered to every listener once this commits."""
        await self._call(queries.notify, channel=channel, payload=payload)

    async def listen(self, channel: str, on_message: Callable[[str | None], None]) -> None:
        """Listen on ``channel`` forever, on a connection of its own (not the pool's).

        ``on_message(payload)`` is called for each notification, and ``on_message(None)`` after
        every connect: notifications sent while no connection listened are lost, so the
        caller must look for what it may have missed. A connection that closes, or stops
        answering the periodic check, is replaced after a pause. Never returns; cancel it.
        """
        while True:
            try:
                conn = await self._aio(asyncpg.connect)(
                    self.dsn, server_settings={"application_name": f"turnstile listen {channel}"}
                )
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("listen on %s: cannot connect (%s); retrying", channel, exc)
                await trio.sleep(_LISTEN_RETRY)
                continue
            closed = trio.Event()
            try:
                await self._aio(conn.add_listener)(
                    channel, lambda _conn, _pid, _channel, payload: on_message(payload)
                )
                conn.add_termination_listener(lambda _conn, closed=closed: closed.set())
                on_message(None)
                while not conn.is_closed():
                    with trio.move_on_after(_LISTEN_PING):
                        await closed.wait()
                    if closed.is_set() or conn.is_closed():
                        break
                    with trio.move_on_after(_LISTEN_PING) as ping:
                        await self._aio(conn.fetchval)("SELECT 1")
                    if ping.cancelled_caught:
                        break
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("listen on %s: connection lost (%s); reconnecting", channel, exc)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                    if not conn.is_closed():
                        try:
                            await self._aio(conn.close)()
                        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                            conn.terminate()
            log.warning("listen on %s: connection closed; reconnecting", channel)
            await trio.sleep(_LISTEN_RETRY)

    def _aio(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        return trio_asyncio.aio_as_trio(fn, loop=self._loop)

    async def _call(self, op: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        if self._pool is None:
            raise StoreError("store is closed")
        return await self._aio(self._with_conn)(self._pool, op, args, kwargs)

    @staticmethod
    async def _with_conn(
        pool: asyncpg.Pool, op: Callable[..., Awaitable[T]], args: tuple, kwargs: dict[str, Any]
    ) -> T:
        """asyncio side: run ``op`` on a pooled connection, map driver errors to StoreError."""
        try:
            async with pool.acquire() as conn:
                return await op(conn, *args, **kwargs)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
            raise StoreError(f"postgres: {exc}") from exc


@asynccontextmanager
async def open_postgres_backend(
    dsn: str, sets: Sequence[MigrationSet], now: datetime, **pool_options: Any
) -> AsyncIterator[PostgresBackend]:
    """Open a :class:`PostgresBackend`, on the current trio-asyncio loop or a new one.

    When it opens its own loop, the loop's nursery would wrap every exception raised inside
    the ``async with`` block (the caller's included) in an ``ExceptionGroup``; a group holding
    a single exception is unwrapped so that callers see ``MigrationError``, ``NotFound``... as
    they would with SQLite.
    """
    try:
        async with AsyncExitStack() as stack:
            loop = trio_asyncio.current_loop.get()
            if loop is None or loop.is_closed():
                loop = await stack.enter_async_context(trio_asyncio.open_loop())
            backend = PostgresBackend(dsn, **pool_options)
            await backend.open(loop, sets, now)
            stack.push_async_callback(backend.aclose)
            yield backend
    except BaseExceptionGroup as group:
        leaf = _only_exception(group)
        if leaf is None:
            raise
        raise leaf from leaf.__cause__


def _only_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The one exception in a (nested) group, or None when there are several."""
    while len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return None
