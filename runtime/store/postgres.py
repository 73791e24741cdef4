"""The PostgreSQL backend, on asyncpg: the pool, the asyncio thread and migrations.

It only runs queries (:mod:`runtime.store.postgres_queries`); the front
(:mod:`runtime.store.front`) checks arguments and builds records.

asyncpg is an asyncio library. It runs here on a plain asyncio event loop in a thread of its
own (:class:`AsyncioThread`), which the store starts when it opens and stops when it closes. A
trio task runs an operation by handing the coroutine to that loop (``call_soon_threadsafe``) and
sleeping until the loop hands the outcome back (``TrioToken.run_sync_soon``): two wake-ups
per operation, however many statements it sends, where trio-asyncio took about sixteen passes
of its loop per statement (``bench/scenarios/pgdriver.py`` measures both). Any trio task of
the run that opened the store may call it. asyncio is confined to this module and its query
module; nothing on the asyncio side touches trio except through the run's token.

Cancellation: a trio task cancelled while its operation runs asks the loop to cancel it and
waits until it has ended, so no connection is left in use behind the caller (asyncpg's pool
resets or closes a connection whose query was interrupted). If the operation finished first,
its answer is returned and the cancellation is seen at the caller's next checkpoint: a
committed write is never reported as cancelled.

Migrations run at start-up in one transaction under ``pg_advisory_xact_lock`` keyed by the
current schema, so concurrent start-ups apply them once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import outcome
import trio

from turnstile.runtime.errors import MigrationError, StoreError
from turnstile.runtime.store import postgres_queries as queries
from turnstile.runtime.store.migrations import (
    POSTGRES_SCHEMA_TABLE,
    POSTGRES_SCHEMA_TABLE_UPGRADE,
    MigrationSet,
    plan,
)

__all__ = ["AsyncioThread", "PostgresBackend", "open_asyncio_thread", "open_postgres_backend"]

T = TypeVar("T")

log = logging.getLogger("turnstile.store")

_CLOSE_TIMEOUT = 10.0
#: how often a listening connection is checked with a query (a connection cut without a word,
#: which no termination callback reports), and how long to wait before connecting again
_LISTEN_PING = 5.0
_LISTEN_RETRY = 1.0
_DRIVER_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


class _Cancelled:
    """The outcome of an operation the loop cancelled."""


_CANCELLED = _Cancelled()


class AsyncioThread:
    """A plain asyncio event loop running in a thread of its own, callable from trio.

    Started and stopped by :func:`open_asyncio_thread` (the store does it); :meth:`call` runs a
    coroutine function on the loop from any task of the trio run that started it.

    Both directions are batched: requests wait in a deque that the loop drains in one callback,
    and outcomes in a deque that trio drains in one callback, so a burst of operations costs
    one wake-up each way, not one per operation. A wake-up is a byte written to the other
    side's socket, and every such system call makes the writing thread give up the GIL and
    wait for it again while the other thread computes (up to ``sys.getswitchinterval()``).
    """

    def __init__(self) -> None:
        # the loop's class, not asyncio.new_event_loop(): once trio-asyncio is imported (tests,
        # the bench's baseline), its policy would make a trio-asyncio loop
        self.loop: asyncio.AbstractEventLoop = asyncio.SelectorEventLoop()
        self._thread = threading.Thread(
            target=self._main, name="turnstile postgres (asyncio)", daemon=True
        )
        self._token: trio.lowlevel.TrioToken | None = None
        self._stopped = False
        # trio -> loop: callables to run on the loop, and whether a drain is scheduled there
        self._requests: deque[Callable[[], None]] = deque()
        self._requests_armed = False
        # loop -> trio: (task, outcome) to reschedule, and whether a drain is scheduled in trio
        self._outcomes: deque[tuple[trio.lowlevel.Task, outcome.Outcome]] = deque()
        self._outcomes_armed = False

    def _main(self) -> None:
        loop = self.loop
        try:
            loop.run_forever()
        finally:
            # stop() is only asked once the store has closed its pool; whatever is left (a
            # task still ending) is cancelled and given a pass to finish
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())

    def start(self) -> None:
        """Start the loop's thread; later calls come from this trio run."""
        self._token = trio.lowlevel.current_trio_token()
        self._thread.start()

    async def stop(self) -> None:
        """Stop the loop, wait for its thread and close it (bounded; shielded)."""
        if self._stopped:
            return
        self._stopped = True
        if not self._thread.is_alive():
            self.loop.close()
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
            await trio.to_thread.run_sync(self._thread.join, abandon_on_cancel=True)
        if self._thread.is_alive():
            log.warning("postgres: the asyncio thread did not stop; leaving it")
        else:
            self.loop.close()

    # The flags are cleared before their deque is drained and set after an append is made:
    # an item appended while a drain runs is either seen by it or schedules the next one.

    def _request(self, fn: Callable[[], None]) -> None:  # trio thread
        self._requests.append(fn)
        if not self._requests_armed:
            self._requests_armed = True
            try:
                self.loop.call_soon_threadsafe(self._drain_requests)
            except RuntimeError:  # pragma: no cover - the loop is closed: nothing runs there
                pass

    def _drain_requests(self) -> None:  # asyncio thread
        self._requests_armed = False
        requests = self._requests
        while requests:
            requests.popleft()()

    def _reply(self, task: trio.lowlevel.Task, result: outcome.Outcome) -> None:  # asyncio
        self._outcomes.append((task, result))
        if not self._outcomes_armed:
            self._outcomes_armed = True
            try:
                self._token.run_sync_soon(self._drain_outcomes)
            except trio.RunFinishedError:  # pragma: no cover - the trio run is gone
                pass

    def _drain_outcomes(self) -> None:  # trio thread
        self._outcomes_armed = False
        outcomes = self._outcomes
        reschedule = trio.lowlevel.reschedule
        while outcomes:
            reschedule(*outcomes.popleft())

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``await fn(*args, **kwargs)`` on the loop; its answer or exception comes back here.

        Raises:
            StoreError: the loop is stopped, or the operation was cancelled on the loop's side.
        """
        if self._stopped:
            raise StoreError("store is closed")
        op = _Call(self, trio.lowlevel.current_task(), fn, args, kwargs)
        self._request(op.begin)
        answer = await trio.lowlevel.wait_task_rescheduled(op.abort)
        if answer is _CANCELLED:
            await trio.lowlevel.checkpoint()  # raises Cancelled when the caller was cancelled
            raise StoreError("postgres: operation cancelled")
        return answer


class _Call:
    """One operation of :meth:`AsyncioThread.call`: what the loop runs and whom it answers.

    One object with bound methods rather than four closures and their cells: every store
    operation makes one, and fewer young objects mean fewer pauses of the cyclic GC.
    """

    __slots__ = ("_thread", "_task", "_fn", "_args", "_kwargs", "_future")

    def __init__(
        self,
        thread: AsyncioThread,
        task: trio.lowlevel.Task,
        fn: Callable[..., Awaitable[Any]],
        args: tuple,
        kwargs: dict[str, Any],
    ) -> None:
        self._thread = thread
        self._task = task
        self._fn = fn
        self._args = args
        self._kwargs = kwargs
        self._future: asyncio.Task | None = None

    def begin(self) -> None:  # asyncio thread
        future = self._thread.loop.create_task(self._fn(*self._args, **self._kwargs))
        self._future = future
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Task) -> None:  # asyncio thread
        if future.cancelled():
            result: outcome.Outcome = outcome.Value(_CANCELLED)
        else:
            exc = future.exception()
            result = outcome.Value(future.result()) if exc is None else outcome.Error(exc)
        self._thread._reply(self._task, result)

    def _cancel(self) -> None:  # asyncio thread, after begin (requests run in order)
        self._future.cancel()

    def abort(self, _raise_cancel: Any) -> trio.lowlevel.Abort:  # trio thread
        # wait for the operation to end: its connection goes back to the pool before the
        # caller moves on; the answer (if it finished first) is still the caller's
        self._thread._request(self._cancel)
        return trio.lowlevel.Abort.FAILED


@asynccontextmanager
async def open_asyncio_thread() -> AsyncIterator[AsyncioThread]:
    """An :class:`AsyncioThread`, started for the block and stopped after it."""
    thread = AsyncioThread()
    thread.start()
    try:
        yield thread
    finally:
        await thread.stop()


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


#: Operations served before the others waiting for a connection: firing a job occurrence is
#: the scheduler's promise to be on time (its lateness is measured due -> commit), and it is one
#: short statement among the many a busy node's sessions queue (a thousand sessions can hold
#: a thousand operations in the queue; behind them a fire waited hundreds of milliseconds).
#: Among themselves they are served in the order they came (the oldest fire is the latest).
_FIRST = frozenset({"fire_job", "fire_jobs"})


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

    def __init__(self, dsn: str, min_size: int, max_size: int) -> None:
        self._dsn = dsn
        self._min_size = min_size
        self._max_size = max_size
        self._idle: list[asyncpg.Connection] = []
        self._size = 0  # connections open or being opened
        self._in_use = 0
        # operations waiting for a connection: first those served first (fires), each queue
        # in the order they came
        self._first_waiters: deque[asyncio.Future[None]] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False  # no new operations
        self._finished = False  # every connection closed: one coming back is terminated
        self._returned: asyncio.Event | None = None

    async def open(self) -> None:
        conns = await asyncio.gather(
            *(asyncpg.connect(self._dsn) for _ in range(self._min_size)), return_exceptions=True
        )
        errors = [c for c in conns if isinstance(c, BaseException)]
        opened = [c for c in conns if not isinstance(c, BaseException)]
        if errors:
            for conn in opened:
                conn.terminate()
            raise errors[0]
        self._idle.extend(opened)
        self._size = len(opened)

    async def acquire(self, first: bool = False) -> asyncpg.Connection:
        """A connection for one operation; ``first`` puts it ahead of those waiting."""
        while True:
            if self._closed:
                raise StoreError("store is closed")
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    self._in_use += 1
                    return conn
                self._size -= 1
            if self._size < self._max_size:
                self._size += 1
                try:
                    conn = await asyncpg.connect(self._dsn)
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
        self._aio: AsyncioThread | None = None
        self._pool: _Pool | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<PostgresBackend {self.dsn!r}>"

    @staticmethod
    def db_time(value: datetime) -> datetime:
        return value

    # ---- lifecycle ----

    async def open(self, aio: AsyncioThread, sets: Sequence[MigrationSet], now: datetime) -> None:
        """Create the pool on ``aio``'s loop and apply ``sets``' pending migrations."""
        self._aio = aio
        try:
            pool = _Pool(self.dsn, self._min_size, self._max_size)
            await aio.call(pool.open)
        except _DRIVER_ERRORS as exc:
            raise StoreError(f"postgres: cannot connect: {exc}") from exc
        self._pool = pool
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
        if pool is None or self._aio is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT + 1):
            await self._aio.call(pool.close)

    # ---- running queries ----

    async def read(self, op: str, /, **args: Any) -> Any:
        return await self._call(getattr(queries, op), **args)

    async def write(self, op: str, /, **args: Any) -> Any:
        # every operation manages its own transaction where it needs one
        if op in _FIRST:
            return await self._call_first(getattr(queries, op), **args)
        return await self._call(getattr(queries, op), **args)

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
                conn = await aio.call(
                    asyncpg.connect,
                    self.dsn,
                    server_settings={"application_name": f"turnstile listen {channel}"},
                )
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

    async def _call(self, op: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        if self._pool is None or self._aio is None:
            raise StoreError("store is closed")
        return await self._aio.call(_with_conn, self._pool, op, args, kwargs)

    async def _call_first(self, op: Callable[..., Awaitable[T]], **kwargs: Any) -> T:
        if self._pool is None or self._aio is None:
            raise StoreError("store is closed")
        return await self._aio.call(_with_conn, self._pool, op, (), kwargs, True)


async def _with_conn(
    pool: _Pool,
    op: Callable[..., Awaitable[T]],
    args: tuple,
    kwargs: dict[str, Any],
    first: bool = False,
) -> T:
    """asyncio side: run ``op`` on a pooled connection, map driver errors to StoreError."""
    try:
        conn = await pool.acquire(first)
    except _DRIVER_ERRORS as exc:
        raise StoreError(f"postgres: {exc}") from exc
    # kept unless the link may be unusable: a query cut off by cancellation, or an error of the
    # connection itself rather than the server's answer (release also drops a connection that
    # is closed or still inside a transaction)
    clean = True
    try:
        return await op(conn, *args, **kwargs)
    except asyncio.CancelledError:
        clean = False
        raise
    except _DRIVER_ERRORS as exc:
        clean = isinstance(exc, asyncpg.PostgresError)
        raise StoreError(f"postgres: {exc}") from exc
    finally:
        pool.release(conn, clean)


async def _subscribe(
    conn: asyncpg.Connection,
    channel: str,
    notified: Callable[..., None],
    terminated: Callable[..., None],
) -> None:
    await conn.add_listener(channel, notified)
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
