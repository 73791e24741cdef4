"""The PostgreSQL backend, on asyncpg: the pool, migrations and notifications.

It only runs operations (:mod:`runtime.store.ops`: an operation's PostgreSQL side, on a pooled
connection, on the store's asyncio thread, :mod:`runtime.store.postgres_thread`); the front
(:mod:`runtime.store.front`) checks arguments and builds records.

Cancellation: a trio task cancelled while its operation runs waits until the operation has
ended on the loop (see :mod:`runtime.store.postgres_thread`), and a connection whose query was
cut off is dropped, not reused.

Migrations run at start-up in one transaction under ``pg_advisory_xact_lock`` keyed by the
current schema, so concurrent start-ups apply them once.

It is over 400 lines because the pool, the backend and ``listen`` share one lifecycle (opened,
drained and closed together) and the pool's rules (no reset, some operations first) are the
backend's; the bridge to trio, which knows nothing of PostgreSQL, is a module of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from functools import partial
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import trio

from turnstile.runtime import tracing
from turnstile.runtime.errors import MigrationError, StoreError, StoreUnavailable
from turnstile.runtime.store import faults, ops, postgres_text
from turnstile.runtime.store.migrations import (
    POSTGRES_SCHEMA_TABLE,
    POSTGRES_SCHEMA_TABLE_UPGRADE,
    MigrationSet,
    plan,
)
from turnstile.runtime.store.ops import Operation
from turnstile.runtime.store.outage import is_postgres_outage, postgres_error
from turnstile.runtime.store.postgres_faults import faulty
from turnstile.runtime.store.postgres_stats import (
    CountingConnection,
    PostgresStatistics,
    StatsCounter,
    counted,
    enabled_by_environment,
)
from turnstile.runtime.store.postgres_thread import AsyncioThread, open_asyncio_thread

__all__ = ["AsyncioThread", "PostgresBackend", "open_asyncio_thread", "open_postgres_backend"]

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("turnstile.store")

_CLOSE_TIMEOUT = 10.0
#: how often a listening connection is checked with a query (a connection cut without a word,
#: which no termination callback reports), and how long to wait before connecting again
_LISTEN_PING = 5.0
_LISTEN_RETRY = 1.0
_DRIVER_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)
#: The longest an operation may wait for a connection, and then run on it, before it fails as
#: ``StoreUnavailable``: a database that stalls (accepts and answers nothing), or a pool that
#: stays exhausted, is an outage to the caller rather than a request that hangs. A connection
#: whose operation was cut off by it is dropped. (``PostgresBackend(operation_timeout=)``.)
OPERATION_TIMEOUT = 20.0


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
        for step in plan(cast(list[tuple[str, int, str]], applied), sets, "postgres"):
            # a step's statements in one round trip (the simple query protocol takes several;
            # they run inside this transaction): a fresh schema's start-up is 20-odd fewer
            if step.statements:  # (an empty query is asyncpg's AttributeError)
                await conn.execute(";\n".join(step.statements))
            await conn.execute(
                "INSERT INTO schema_migrations (set_name, version, name, applied_at)"
                " VALUES ($1, $2, $3, $4)",
                step.set_name,
                step.version,
                step.name,
                now,
            )


#: ``pg_notify``: delivered to every listener of the channel in this schema once it commits.
_NOTIFY = ops.execute(
    "notify", postgres=f"SELECT pg_notify({ops.scoped_channel_sql(':channel')}, :payload)"
)


class _Pool:
    """asyncio side: up to ``max_size`` asyncpg connections, one operation at a time each.

    Lighter than ``asyncpg.Pool``, whose acquire and release (a shielded task, holders,
    proxies, an idle timer re-armed each time, and by default a reset query sending
    ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``) cost as much CPU as the
    query they wrap. No reset is needed: nothing the store or a feature runs leaves session
    state behind (``SET LOCAL`` and ``pg_advisory_xact_lock`` end with their transaction;
    ``listen`` has a connection of its own). A connection is dropped (terminated, and replaced
    on demand) when it is closed, left inside a transaction, or its operation was cancelled
    mid-query.
    """

    def __init__(
        self,
        dsn: str,
        min_size: int,
        max_size: int,
        application_name: str | None = None,
        counter: StatsCounter | None = None,
    ) -> None:
        self._dsn = dsn
        self._application_name = application_name
        self._counter = counter
        self._min_size = min_size
        self._max_size = max_size
        self._idle: list[asyncpg.Connection] = []
        self._size = 0  # connections open or being opened
        self._in_use = 0
        # operations waiting for a connection: first those served first (``Operation.first``:
        # a short write whose caller promised to be on time, among the many a busy node's
        # sessions queue; behind a thousand of them one waited hundreds of milliseconds), each
        # queue in the order they came (the oldest waiting is the latest)
        self._first_waiters: deque[asyncio.Future[None]] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False  # no new operations
        self._finished = False  # every connection closed: one coming back is terminated
        self._returned: asyncio.Event | None = None

    async def open(self) -> None:
        conns = await asyncio.gather(
            *(self._connect() for _ in range(self._min_size)), return_exceptions=True
        )
        errors = [c for c in conns if isinstance(c, BaseException)]
        opened = [c for c in conns if not isinstance(c, BaseException)]
        if errors:
            for conn in opened:
                conn.terminate()
            raise errors[0]
        self._idle.extend(opened)
        self._size = len(opened)

    async def _connect(self) -> asyncpg.Connection:
        counter = self._counter
        if counter is None:
            return await postgres_text.connect(self._dsn, self._application_name)
        conn = cast(
            CountingConnection,
            await postgres_text.connect(self._dsn, self._application_name, CountingConnection),
        )
        conn.counter = counter  # (the connection's opening is its own, not counted)
        return conn

    def acquire_idle(self) -> asyncpg.Connection | None:
        """An idle connection for one operation at once, or None when there is none (then
        :meth:`acquire` may open one or wait); as :meth:`acquire` would take it."""
        if self._closed:
            raise StoreError("store is closed")
        while self._idle:
            conn = self._idle.pop()
            if not conn.is_closed():
                self._in_use += 1
                return conn
            self._size -= 1
        return None

    async def acquire(self, first: bool = False) -> asyncpg.Connection:
        """A connection for one operation; ``first`` puts it ahead of those waiting."""
        while True:
            conn = self.acquire_idle()  # StoreError once the store is closed
            if conn is not None:
                return conn
            if self._size < self._max_size:
                self._size += 1
                try:
                    conn = await self._connect()
                except BaseException:
                    self._size -= 1
                    self._wake()
                    raise
                self._in_use += 1
                return conn
            waiter = asyncio.get_running_loop().create_future()
            (self._first_waiters if first else self._waiters).append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # it was woken for a connection: pass the turn on
                raise

    @property
    def full(self) -> bool:
        """Whether every connection the pool may open is open and in use."""
        return self._size >= self._max_size and not self._idle

    def exhausted(self, waited: float | None) -> StoreUnavailable:
        """The error of an operation that found no connection free for ``waited`` seconds:
        unavailable to the caller (503, try again), and said apart from a database outage in
        the log, since raising ``?pool_size=`` is the cure rather than the database."""
        log.warning(
            "postgres: no pooled connection came free within %g s: all %d are in use "
            "(the node is busier than its pool; raise the store URL's ?pool_size=)",
            waited,
            self._max_size,
        )
        return StoreUnavailable()

    def release(self, conn: asyncpg.Connection, clean: bool) -> None:
        self._in_use -= 1
        if clean and not self._finished and not conn.is_closed() and not conn.is_in_transaction():
            self._idle.append(conn)  # (during close too: close() closes it gracefully)
        else:
            conn.terminate()
            self._size -= 1
        self._wake()
        if self._in_use == 0 and self._returned is not None:
            self._returned.set()

    def _wake(self) -> None:
        for waiters in (self._first_waiters, self._waiters):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return

    async def close(self) -> None:
        """Refuse new operations, let those in flight end (bounded), close every connection."""
        self._closed = True
        for waiters in (self._first_waiters, self._waiters):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
        if self._in_use:
            self._returned = asyncio.Event()
            try:
                await asyncio.wait_for(self._returned.wait(), _CLOSE_TIMEOUT)
            except TimeoutError:
                log.warning("postgres: %d operations still running at close", self._in_use)
        idle, self._idle = self._idle, []
        self._finished = True
        await asyncio.gather(*(_close_conn(conn) for conn in idle))


class PostgresBackend:
    """Runs the store's operations on a PostgreSQL pool (see the module docstring).

    Use :func:`runtime.store.open_store` (``postgresql://...``) rather than this class.

    Args:
        dsn: an asyncpg DSN; extra query parameters become server settings
            (``?search_path=myschema``).
        min_size, max_size: connection pool bounds.
        count: count round trips per operation (:meth:`statistics`; tests and benchmarks);
            also turned on by ``TURNSTILE_STORE_STATS=1`` when the store opens.
        name: who holds the store (a node's id): its connections' ``application_name``, as
            ``pg_stat_activity`` shows them, is ``turnstile <name>`` (``turnstile`` without
            one, the DSN's own ``application_name`` if it sets one) and a listener's
            ``<that> listen <channel>``, so an operator (or a test) can tell whose they are.
    """

    kind = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        operation_timeout: float | None = None,
        name: str | None = None,
        count: bool = False,
    ) -> None:
        self.dsn = dsn
        #: every connection's ``application_name`` (a listener's adds ``listen <channel>``)
        self.application_name = _application_name(dsn, name)
        self._min_size = min_size
        self._max_size = max_size
        #: seconds an operation may wait for a connection and run (None: ``OPERATION_TIMEOUT``)
        self.operation_timeout = operation_timeout
        self._aio: AsyncioThread | None = None
        self._pool: _Pool | None = None
        self._closed = False
        self._fault: faults.StoreFault | None = None  # tests only (runtime.store.faults)
        self._count = count
        self._counter: StatsCounter | None = None  # tests and benchmarks only

    def __repr__(self) -> str:
        parts = urlsplit(self.dsn)  # the password stays out of whatever prints this
        if parts.password is not None:
            host = parts.netloc.rpartition("@")[2]
            parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
        query = parse_qsl(parts.query, keep_blank_values=True)
        if any(key == "password" for key, _ in query):
            masked = [(k, "***" if k == "password" else v) for k, v in query]
            parts = parts._replace(query=urlencode(masked, safe="*"))
        return f"<PostgresBackend {urlunsplit(parts)!r}>"

    @staticmethod
    def db_time(value: datetime) -> datetime:
        return value

    # ---- lifecycle ----

    async def open(self, aio: AsyncioThread, sets: Sequence[MigrationSet], now: datetime) -> None:
        """Create the pool on ``aio``'s loop and apply ``sets``' pending migrations."""
        self._fault = faults.from_environment()
        if self._count or enabled_by_environment():
            self._counter = StatsCounter()
        self._aio = aio
        try:
            pool = _Pool(
                self.dsn, self._min_size, self._max_size, self.application_name, self._counter
            )
            await aio.call(pool.open)
        except _DRIVER_ERRORS as exc:
            raise StoreError(f"postgres: cannot connect: {exc}") from exc
        self._pool = pool
        try:
            await aio.call(_with_conn, pool, _migrate, {"sets": sets, "now": now}, False, None)
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
        if pool is None or self._aio is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT + 1):
            await self._aio.call(pool.close)

    # ---- running operations ----

    async def run(self, op: Operation[R], /, **args: Any) -> R:
        """Run ``op``'s PostgreSQL side on a pooled connection on the asyncio thread (it opens
        a transaction itself where it needs one), then its ``decode`` here."""
        fn = op.postgres
        pool, aio = self._pool, self._aio
        if pool is None or aio is None:
            raise StoreError("store is closed")
        if self._fault is not None and op.writes:  # tests only: count, maybe strike, the write
            fn = faulty(self._fault, op.name, fn)
        if self._counter is not None:  # tests and benchmarks only
            fn = counted(self._counter, op.name, op.writes, fn)
        bound = self.operation_timeout
        bound = OPERATION_TIMEOUT if bound is None else bound
        if op.writes:  # a commit on a traced path (a turn's) is a span of its own
            with tracing.db_span("postgresql", op.name):
                answer = await aio.call(_with_conn, pool, fn, args, op.first, bound)
        else:
            answer = await aio.call(_with_conn, pool, fn, args, op.first, bound)
        decode = op.decode
        return answer if decode is None else decode(answer)

    def statistics(self) -> PostgresStatistics:
        """What the backend has sent since it opened: round trips, per operation too
        (:mod:`runtime.store.postgres_stats`); all 0, ``counting`` False, unless it counts."""
        counter = self._counter
        return PostgresStatistics() if counter is None else counter.snapshot()

    # ---- notifications ----

    async def notify(self, channel: str, payload: str) -> None:
        """``pg_notify(channel, payload)``: delivered to every listener of ``channel`` on this
        store's schema once this commits (:data:`runtime.store.ops.CHANNEL_SUFFIX_SQL`)."""
        await self.run(_NOTIFY, channel=channel, payload=payload)

    async def listen(self, channel: str, on_message: Callable[[str | None], None]) -> None:
        """Listen on ``channel`` forever, on a connection of its own (not the pool's).

        ``on_message(payload)`` is called (in the trio thread, in the order they arrived) for
        each notification, and ``on_message(None)`` after every connect: notifications sent
        while no connection listened are lost, so the caller must look for what it may have
        missed. A connection that closes, or stops answering the periodic check, is replaced
        after a pause. Never returns; cancel it.
        """
        aio = self._aio
        if aio is None or self._closed:
            raise StoreError("store is closed")
        token = trio.lowlevel.current_trio_token()
        settings = {"application_name": f"{self.application_name} listen {channel}"}

        def deliver(payload: str | None) -> None:  # trio thread
            try:
                on_message(payload)
            except Exception:
                log.exception("listen on %s: the handler failed", channel)

        def notified(_conn: Any, _pid: int, _channel: str, payload: str) -> None:  # asyncio
            try:
                token.run_sync_soon(deliver, payload)
            except trio.RunFinishedError:  # pragma: no cover - the trio run is gone
                pass

        while True:
            try:
                conn = await aio.call(partial(asyncpg.connect, self.dsn, server_settings=settings))
            except _DRIVER_ERRORS as exc:
                log.warning("listen on %s: cannot connect (%s); retrying", channel, exc)
                await trio.sleep(_LISTEN_RETRY)
                continue
            closed = trio.Event()

            def terminated(_conn: Any, closed: trio.Event = closed) -> None:  # asyncio thread
                try:
                    token.run_sync_soon(closed.set)
                except trio.RunFinishedError:  # pragma: no cover
                    pass

            try:
                await aio.call(_subscribe, conn, channel, notified, terminated)
                deliver(None)
                while not conn.is_closed():
                    with trio.move_on_after(_LISTEN_PING):
                        await closed.wait()
                    if closed.is_set() or conn.is_closed():
                        break
                    with trio.move_on_after(_LISTEN_PING) as ping:
                        await aio.call(conn.fetchval, "SELECT 1")
                    if ping.cancelled_caught:
                        break
            except (*_DRIVER_ERRORS, asyncpg.exceptions.InternalClientError) as exc:
                # (asyncpg's "another operation is in progress", seen when the connection is
                # cut in the middle of LISTEN: the listener reconnects, never ends the node)
                log.warning("listen on %s: connection lost (%s); reconnecting", channel, exc)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                    await aio.call(_close_conn, conn)
            log.warning("listen on %s: connection closed; reconnecting", channel)
            await trio.sleep(_LISTEN_RETRY)


def _application_name(dsn: str, name: str | None) -> str:
    """The ``application_name`` of a store's connections: the DSN's own if it sets one, else
    ``turnstile <name>`` (``turnstile`` without a name)."""
    given = parse_qs(urlsplit(dsn).query).get("application_name")
    if given:
        return given[-1]
    return "turnstile" if name is None else f"turnstile {name}"


async def _with_conn(
    pool: _Pool,
    fn: Callable[..., Awaitable[T]],
    args: dict[str, Any],
    first: bool,
    bound: float | None,
) -> T:
    """asyncio side: run ``fn(conn, **args)`` on a pooled connection (``first``: ahead of the
    operations waiting for one), waiting for it and then running at most ``bound`` seconds
    each (None: unbounded); map driver errors to StoreError (``StoreUnavailable`` for an
    outage: :mod:`runtime.store.outage`)."""
    # an idle connection is taken without a bound to arm: asyncio.timeout, set and cancelled,
    # is some 10 us of this thread's CPU an operation (issue 26), and nothing waits here
    conn = pool.acquire_idle()
    if conn is None:
        try:
            async with asyncio.timeout(bound):  # (TimeoutError: an OSError, a driver error)
                conn = await pool.acquire(first)
        except TimeoutError as exc:
            if pool.full:  # not the database: every connection stayed busy with other work
                raise pool.exhausted(bound) from exc
            raise postgres_error(exc) from exc
        except _DRIVER_ERRORS as exc:
            raise postgres_error(exc) from exc
    # kept unless the link may be unusable: a query cut off by cancellation or the bound, or
    # an error of the connection itself rather than the server's answer (release also drops a
    # connection that is closed or still inside a transaction)
    clean = True
    try:
        async with asyncio.timeout(bound):
            return await fn(conn, **args)
    except asyncio.CancelledError:
        clean = False
        raise
    except _DRIVER_ERRORS as exc:
        clean = isinstance(exc, asyncpg.PostgresError) and not is_postgres_outage(exc)
        raise postgres_error(exc) from exc
    finally:
        pool.release(conn, clean)


async def _subscribe(
    conn: asyncpg.Connection,
    channel: str,
    notified: Callable[..., None],
    terminated: Callable[..., None],
) -> None:
    scoped = await conn.fetchval(f"SELECT {ops.scoped_channel_sql('$1')}", channel)
    await conn.add_listener(scoped, notified)
    conn.add_termination_listener(terminated)


async def _close_conn(conn: asyncpg.Connection) -> None:
    if conn.is_closed():
        return
    try:
        await asyncio.wait_for(conn.close(), _CLOSE_TIMEOUT)
    except (TimeoutError, *_DRIVER_ERRORS):
        conn.terminate()


@asynccontextmanager
async def open_postgres_backend(
    dsn: str, sets: Sequence[MigrationSet], now: datetime, **pool_options: Any
) -> AsyncIterator[PostgresBackend]:
    """Open a :class:`PostgresBackend` with an asyncio thread of its own, for the block.

    The thread is started before the pool is created and stopped after it is closed.
    """
    async with open_asyncio_thread() as aio:
        backend = PostgresBackend(dsn, **pool_options)
        await backend.open(aio, sets, now)
        try:
            yield backend
        finally:
            await backend.aclose()
