"""The embedded SQLite backend: connections, threads and migrations.

It only runs operations (:mod:`runtime.store.ops`: an operation's SQLite side, in a thread);
the front (:mod:`runtime.store.front`) checks arguments and builds records.

Threads: no sqlite3 call ever runs on the trio thread.

* **Writes** go to one writer thread with group commit (:mod:`runtime.store.sqlite_writer`).
* **Reads** run on a small pool of read-only connections in trio worker threads; in WAL mode
  they never block the writer or each other and always see every committed write. A read that
  needs more than one statement runs in one read transaction (one snapshot).
* ``sqlite:///:memory:`` is supported: there is then only the writer's connection (separate
  connections would see separate databases), so reads are queued to the writer too, and the
  writer runs inline on the trio thread (no disk to wait for; exact under a mock clock).

Durability: ``journal_mode=WAL`` with ``synchronous=FULL`` by default, because the return of a
write (``enqueue_input`` above all) is the acknowledgement that it survives a power cut; WAL +
NORMAL only survives a process crash. Group commit amortises the fsync. Pass
``?synchronous=normal`` in the URL to trade that guarantee for latency.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import trio

from turnstile.runtime import tracing
from turnstile.runtime.errors import MigrationError, StoreError
from turnstile.runtime.store import _util as u
from turnstile.runtime.store import faults
from turnstile.runtime.store.migrations import (
    SQLITE_SCHEMA_TABLE,
    SQLITE_SCHEMA_TABLE_UPGRADE,
    MigrationSet,
    plan,
)
from turnstile.runtime.store.ops import Operation
from turnstile.runtime.store.outage import sqlite_error
from turnstile.runtime.store.sqlite_writer import InlineWriter, Writer

__all__ = ["SQLiteBackend"]

T = TypeVar("T")
R = TypeVar("R")

_MIN_SQLITE = (3, 37, 0)  # STRICT tables (RETURNING needs 3.35)
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
#: Seconds a statement waits for a lock another connection holds on the file (another
#: process's write) before it fails: then the store is unavailable (``503``, outage.py).
BUSY_TIMEOUT = 10.0


class SQLiteBackend:
    """Runs the store's queries on an SQLite file (see the module docstring).

    Use :func:`runtime.store.open_store` (``sqlite:///file.db``) rather than this class.

    Args:
        path: database file, or ``":memory:"``.
        synchronous: ``"FULL"`` (default: durable on power loss) or ``"NORMAL"``, ...
        readers: size of the read-connection pool.
        max_batch: most requests one group commit may hold.
    """

    kind = "sqlite"

    def __init__(
        self, path: str, *, synchronous: str = "FULL", readers: int = 4, max_batch: int = 256
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(f"unknown synchronous setting {synchronous!r}")
        self.path = path
        self._synchronous = synchronous.upper()
        self._memory = path == ":memory:"
        self._n_readers = 0 if self._memory else max(1, readers)
        self._max_batch = max_batch
        self._write_conn: sqlite3.Connection | None = None
        self._writer: Writer | None = None
        self._readers: list[sqlite3.Connection] = []
        self._reader_slots = trio.Semaphore(max(1, self._n_readers))
        self._closed = False
        self._fault: faults.StoreFault | None = None  # tests only (runtime.store.faults)

    def __repr__(self) -> str:
        return f"<SQLiteBackend {self.path!r}>"

    @staticmethod
    def db_time(value: datetime) -> str:
        return u.format_ts(value)

    # ---- lifecycle ----

    def _connect(self, *, read_only: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT
        )
        conn.row_factory = sqlite3.Row
        if read_only:
            conn.execute("PRAGMA query_only = ON")
        else:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def _open_sync(self, sets: Sequence[MigrationSet], now: str) -> None:
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise StoreError(
                f"sqlite {sqlite3.sqlite_version} is too old (need"
                f" {'.'.join(map(str, _MIN_SQLITE))})"
            )
        conn = self._connect(read_only=False)
        try:
            self._migrate(conn, sets, now)
            self._readers = [self._connect(read_only=True) for _ in range(self._n_readers)]
        except BaseException:
            conn.close()
            for r in self._readers:
                r.close()
            self._readers = []
            raise
        self._write_conn = conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection, sets: Sequence[MigrationSet], now: str) -> None:
        """Apply every pending step of ``sets`` in one transaction (see migrations.py)."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                columns = [r["name"] for r in conn.execute("PRAGMA table_info(schema_migrations)")]
                if columns and "set_name" not in columns:
                    for stmt in SQLITE_SCHEMA_TABLE_UPGRADE:
                        conn.execute(stmt)
                conn.execute(SQLITE_SCHEMA_TABLE)
                applied = conn.execute("SELECT set_name, version, name FROM schema_migrations")
                for step in plan(applied.fetchall(), sets, "sqlite"):
                    for stmt in step.statements:
                        conn.execute(stmt)
                    conn.execute(
                        "INSERT INTO schema_migrations (set_name, version, name, applied_at)"
                        " VALUES (?, ?, ?, ?)",
                        (step.set_name, step.version, step.name, now),
                    )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise MigrationError(f"sqlite: migration failed: {exc}") from exc

    async def open(self, sets: Sequence[MigrationSet], now: datetime) -> None:
        """Connect, apply ``sets``' pending migrations and start the writer thread."""
        self._fault = faults.from_environment()
        args = (sets, self.db_time(now))
        try:
            if self._memory:
                self._open_sync(*args)
            else:
                await trio.to_thread.run_sync(self._open_sync, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: cannot open {self.path!r}: {exc}") from exc
        assert self._write_conn is not None
        writer = InlineWriter if self._memory else Writer
        self._writer = writer(self._write_conn, self._max_batch, self._fault)
        self._writer.start()

    async def aclose(self) -> None:
        """Finish queued writes, stop the writer thread and close every connection."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            for _ in range(self._n_readers):  # wait for the reads in flight
                await self._reader_slots.acquire()
            readers, self._readers = self._readers, []
            for _ in range(self._n_readers):  # readers still waiting now see "closed"
                self._reader_slots.release()
            if readers:
                await trio.to_thread.run_sync(_close_all, readers)
            if self._writer is not None:
                await self._writer.stop()

    # ---- running queries ----

    async def notify(self, channel: str, payload: str) -> None:
        """Nothing: one SQLite file is one node's, and nobody else listens."""

    async def listen(self, channel: str, on_message: Callable[[str | None], None]) -> None:
        """No notifications on SQLite: ``on_message(None)`` once (look for what is there),
        then nothing, forever."""
        on_message(None)
        await trio.sleep_forever()

    async def run(self, op: Operation[R], /, **args: Any) -> R:
        """Run ``op``'s SQLite side: a write in the writer's next group commit (durable when
        this returns), a read on a reader connection in one read transaction; then its
        ``decode`` here."""
        fn = op.sqlite
        if op.writes:
            if self._fault is not None:  # tests only: count the write where the writer runs it
                fn = faults.counted(self._fault, op.name, fn)
            # a commit on a traced path (a turn's) is a span of its own; nothing elsewhere
            with tracing.db_span("sqlite", op.name):
                answer = await self._write(fn, args)
        else:
            answer = await self._read(fn, args)
        decode = op.decode
        return answer if decode is None else decode(answer)

    async def _write(self, fn: Callable[..., T], args: dict[str, Any]) -> T:
        """Run ``fn(conn, **args)`` in the writer thread, in the next group commit."""
        if self._closed or self._writer is None:
            raise StoreError("store is closed")
        return await self._writer.submit(fn, args)

    async def _read(self, fn: Callable[..., T], args: dict[str, Any]) -> T:
        """Run ``fn(conn, **args)`` on a reader connection, in one read transaction."""
        if self._closed or self._writer is None:
            raise StoreError("store is closed")
        if self._memory:
            return await self._writer.submit(fn, args)
        async with self._reader_slots:
            if not self._readers:
                raise StoreError("store is closed")
            conn = self._readers.pop()
            try:
                return await trio.to_thread.run_sync(_read_txn, conn, fn, args)
            finally:
                self._readers.append(conn)

    @property
    def commit_stats(self) -> tuple[int, int]:
        """(transactions committed, requests they held) by the writer: group commit at work."""
        w = self._writer
        return (w.commits, w.committed_requests) if w else (0, 0)


def _close_all(conns: list[sqlite3.Connection]) -> None:
    for conn in conns:
        conn.close()


def _read_txn(conn: sqlite3.Connection, fn: Callable[..., T], args: dict[str, Any]) -> T:
    """Run ``fn(conn, **args)`` in one read transaction (one snapshot) on a reader connection."""
    try:
        conn.execute("BEGIN")
        try:
            return fn(conn, **args)
        finally:
            conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise sqlite_error(exc) from exc
