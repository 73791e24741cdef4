"""The embedded SQLite backend.

Threads: no sqlite3 call ever runs on the trio thread.

* **One writer thread** (a plain ``threading.Thread``) owns the write connection and takes
  requests from a queue. It implements **group commit**: it blocks for one request, then drains
  whatever else is queued (up to ``max_batch``) and runs the whole batch in a single
  ``BEGIN IMMEDIATE ... COMMIT``, so many concurrent writers share one fsync. Each request runs
  inside its own ``SAVEPOINT``: a request that raises is rolled back to its savepoint and fails
  alone, the rest of the batch commits. Each caller parks on
  ``trio.lowlevel.wait_task_rescheduled`` and the thread wakes it through the trio token once
  the batch has committed (or failed).
* **Cancellation** of a caller is honoured while its request is still queued (the writer then
  skips it: nothing was written). Once the writer has taken the request the caller waits for the
  outcome, and gets it, so a write that committed is never reported as cancelled; the
  cancellation is delivered at the caller's next checkpoint.
* **Reads** run on a small pool of read-only connections in trio worker threads; in WAL mode
  they never block the writer or each other and always see every committed write. A read that
  needs more than one statement runs in one read transaction (one snapshot).
* ``sqlite:///:memory:`` is supported: there is then only the writer's connection (separate
  connections would see separate databases), so reads are queued to the writer too.

Durability: ``journal_mode=WAL`` with ``synchronous=FULL`` by default, because the return of a
write (``enqueue_input`` above all) is the acknowledgement that it survives a power cut; WAL +
NORMAL only survives a process crash. Group commit amortises the fsync. Pass
``?synchronous=normal`` in the URL to trade that guarantee for latency.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import trio
from msgspec import UNSET, UnsetType

from turnstile.runtime.clock import Clock, SystemClock
from turnstile.runtime.errors import AlreadyExists, ConflictError, MigrationError, StoreError
from turnstile.runtime.store import _util as u
from turnstile.runtime.store.migrations import SQLITE_BOOTSTRAP, SQLITE_MIGRATIONS, pending
from turnstile.runtime.store.records import (
    EventRecord,
    FireResult,
    InboxItem,
    Job,
    JobRun,
    MigrationRecord,
    Session,
)

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_MIN_SQLITE = (3, 37, 0)  # STRICT tables (RETURNING needs 3.35)
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


# -- the writer thread ------------------------------------------------------------------------

_PENDING, _TAKEN, _CANCELLED = 0, 1, 2
_STOP = object()


class _Request:
    __slots__ = ("fn", "task", "state", "result", "error")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], task: trio.lowlevel.Task) -> None:
        self.fn = fn
        self.task = task
        self.state = _PENDING
        self.result: Any = None
        self.error: BaseException | None = None


def _wrap(exc: BaseException) -> BaseException:
    """sqlite3 errors become StoreError; our own errors (NotFound, ...) pass through."""
    if isinstance(exc, sqlite3.Error):
        err = StoreError(f"sqlite: {exc}")
        err.__cause__ = exc
        return err
    return exc


class _Writer:
    """The single writer thread, with group commit (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, max_batch: int) -> None:
        self._conn = conn
        self._max_batch = max_batch
        self._token = trio.lowlevel.current_trio_token()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _Request.state between the threads
        self._thread = threading.Thread(
            target=self._main, name="turnstile-sqlite-writer", daemon=True
        )
        self._accepting = True
        #: How many transactions committed and how many requests they held (for tests/bench).
        self.commits = 0
        self.committed_requests = 0

    def start(self) -> None:
        self._thread.start()

    async def submit(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._accepting:
            raise StoreError("store is closed")
        req = _Request(fn, trio.lowlevel.current_task())

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            with self._lock:
                if req.state == _PENDING:
                    req.state = _CANCELLED
                    return trio.lowlevel.Abort.SUCCEEDED
            return trio.lowlevel.Abort.FAILED  # taken: the writer will wake us with the outcome

        # No checkpoint between put() and the wait: the wake-up cannot come before we park.
        self._queue.put(req)
        await trio.lowlevel.wait_task_rescheduled(abort)
        if req.error is not None:
            error, req.error = req.error, None
            raise error
        return req.result

    async def stop(self) -> None:
        """Finish every request already queued, close the connection, join the thread."""
        if self._accepting:
            self._accepting = False
            self._queue.put(_STOP)
        await trio.to_thread.run_sync(self._thread.join)

    # ---- in the writer thread ----

    def _main(self) -> None:
        try:
            stop = False
            while not stop:
                item = self._queue.get()
                if item is _STOP:
                    break
                batch = [item]
                while len(batch) < self._max_batch:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stop = True
                        break
                    batch.append(item)
                self._run_batch(batch)
        finally:
            self._accepting = False
            try:
                self._conn.close()
            finally:
                self._fail_leftovers()

    def _fail_leftovers(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP and self._take(item):
                item.error = StoreError("store is closed")
                self._wake(item)

    def _take(self, req: _Request) -> bool:
        with self._lock:
            if req.state == _CANCELLED:
                return False
            req.state = _TAKEN
            return True

    def _wake(self, req: _Request) -> None:
        try:
            self._token.run_sync_soon(trio.lowlevel.reschedule, req.task)
        except trio.RunFinishedError:  # pragma: no cover - the store outlived trio.run
            pass

    def _run_batch(self, batch: list[_Request]) -> None:
        live = [req for req in batch if self._take(req)]
        if not live:
            return
        try:
            self._transact(live)
        except Exception as exc:  # BEGIN, SAVEPOINT or COMMIT failed: nothing committed
            if self._conn.in_transaction:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            for req in live:
                if req.error is None:
                    req.result, req.error = None, StoreError(f"sqlite: transaction failed: {exc}")
        finally:
            for req in live:
                self._wake(req)

    def _transact(self, live: list[_Request]) -> None:
        """One transaction for the whole batch, one savepoint per request."""
        conn = self._conn
        uncommitted: list[_Request] = []
        conn.execute("BEGIN IMMEDIATE")
        for req in live:
            if not conn.in_transaction:  # SQLite rolled everything back (e.g. disk full)
                self._fail(uncommitted, "transaction rolled back")
                uncommitted = []
                conn.execute("BEGIN IMMEDIATE")
            conn.execute("SAVEPOINT request")
            try:
                req.result = req.fn(conn)
            except Exception as exc:
                req.result, req.error = None, _wrap(exc)
                if conn.in_transaction:
                    conn.execute("ROLLBACK TO request")
                    conn.execute("RELEASE request")
            else:
                conn.execute("RELEASE request")
                uncommitted.append(req)
        if conn.in_transaction:
            conn.execute("COMMIT")
            self.commits += 1
            self.committed_requests += len(uncommitted)
        else:
            self._fail(uncommitted, "transaction rolled back")

    @staticmethod
    def _fail(reqs: list[_Request], why: str) -> None:
        for req in reqs:
            req.result, req.error = None, StoreError(f"sqlite: {why}")


# -- row conversion ---------------------------------------------------------------------------


class _InlineWriter(_Writer):
    """The writer for ``:memory:`` databases: statements run on the trio thread itself.

    An in-memory database has no disk to wait for, so a thread buys nothing; running inline
    also keeps ``MockClock(autojump_threshold=0)`` tests exact: no task ever waits on a
    thread, so the mock clock never jumps while the store is working.
    """

    def start(self) -> None:
        pass

    async def submit(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        await trio.lowlevel.checkpoint()
        if not self._accepting:
            raise StoreError("store is closed")
        req = _Request(fn, None)  # type: ignore[arg-type]
        req.state = _TAKEN
        try:
            self._transact([req])
        except Exception as exc:  # BEGIN or COMMIT failed: nothing committed
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            req.error = StoreError(f"sqlite: transaction failed: {exc}")
        if req.error is not None:
            raise req.error
        return req.result

    async def stop(self) -> None:
        if self._accepting:
            self._accepting = False
            self._conn.close()


def _session(row: sqlite3.Row) -> Session:
    return Session(
        id=row["id"],
        owner=row["owner"],
        metadata=u.decode_json(row["metadata"]),
        policy=row["policy"],
        created_at=u.parse_ts(row["created_at"]),
        updated_at=u.parse_ts(row["updated_at"]),
        last_seq=row["last_seq"],
    )


def _input(row: sqlite3.Row) -> InboxItem:
    return InboxItem(
        id=row["id"],
        session_id=row["session_id"],
        source=row["source"],
        payload=u.decode_json(row["payload"]),
        state=row["state"],
        created_at=u.parse_ts(row["created_at"]),
        updated_at=u.parse_ts(row["updated_at"]),
        detail=u.decode_optional_json(row["detail"]),
    )


def _event(row: sqlite3.Row) -> EventRecord:
    return EventRecord(
        session_id=row["session_id"],
        seq=row["seq"],
        type=row["type"],
        payload=u.decode_json(row["payload"]),
        ts=u.parse_ts(row["ts"]),
    )


def _job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        session_id=row["session_id"],
        kind=row["kind"],
        spec=u.decode_json(row["spec"]),
        state=row["state"],
        next_fire_at=u.parse_optional_ts(row["next_fire_at"]),
        created_at=u.parse_ts(row["created_at"]),
        updated_at=u.parse_ts(row["updated_at"]),
        run_count=row["run_count"],
    )


def _run(row: sqlite3.Row) -> JobRun:
    return JobRun(
        id=row["id"],
        job_id=row["job_id"],
        scheduled_for=u.parse_ts(row["scheduled_for"]),
        state=row["state"],
        input_id=row["input_id"],
        detail=u.decode_optional_json(row["detail"]),
        created_at=u.parse_ts(row["created_at"]),
        updated_at=u.parse_ts(row["updated_at"]),
    )


# -- operations (each runs in a thread, inside a transaction the caller manages) ----------------


def _require_session(conn: sqlite3.Connection, session_id: str) -> None:
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        raise u.no_session(session_id)


def _require_job(conn: sqlite3.Connection, job_id: str) -> None:
    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
        raise u.no_job(job_id)


def _insert_input(
    conn: sqlite3.Connection, session_id: str, source: str, payload: str, now: str
) -> sqlite3.Row:
    return conn.execute(
        "INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at)"
        " VALUES (?, ?, ?, 'queued', ?, ?) RETURNING *",
        (session_id, source, payload, now, now),
    ).fetchone()


def _op_ping(conn: sqlite3.Connection) -> None:
    conn.execute("SELECT 1").fetchone()


def _op_migrations(conn: sqlite3.Connection) -> list[MigrationRecord]:
    rows = conn.execute("SELECT * FROM schema_migrations ORDER BY version").fetchall()
    return [
        MigrationRecord(
            version=r["version"], name=r["name"], applied_at=u.parse_ts(r["applied_at"])
        )
        for r in rows
    ]


def _op_create_session(
    conn: sqlite3.Connection, id: str, owner: str, metadata: str, policy: str, now: str
) -> Session:
    try:
        row = conn.execute(
            "INSERT INTO sessions (id, owner, metadata, policy, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?) RETURNING *",
            (id, owner, metadata, policy, now, now),
        ).fetchone()
    except sqlite3.IntegrityError:
        raise AlreadyExists(f"session {id!r} already exists") from None
    return _session(row)


def _op_get_session(conn: sqlite3.Connection, id: str) -> Session:
    row = conn.execute("SELECT * FROM sessions WHERE id = ?", (id,)).fetchone()
    if row is None:
        raise u.no_session(id)
    return _session(row)


def _op_list_sessions(
    conn: sqlite3.Connection, owner: str | None, limit: int, after_id: str | None
) -> list[Session]:
    rows = conn.execute(
        "SELECT * FROM sessions WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR id > ?2)"
        " ORDER BY id LIMIT ?3",
        (owner, after_id, limit),
    ).fetchall()
    return [_session(r) for r in rows]


def _op_update_session(
    conn: sqlite3.Connection, id: str, sets: dict[str, Any], now: str
) -> Session:
    cols = ", ".join(f"{c} = ?" for c in sets)
    row = conn.execute(
        f"UPDATE sessions SET {cols}, updated_at = ? WHERE id = ? RETURNING *",
        (*sets.values(), now, id),
    ).fetchone()
    if row is None:
        raise u.no_session(id)
    return _session(row)


def _op_delete_session(conn: sqlite3.Connection, id: str) -> None:
    if conn.execute("DELETE FROM sessions WHERE id = ?", (id,)).rowcount == 0:
        raise u.no_session(id)


def _op_enqueue_input(
    conn: sqlite3.Connection, session_id: str, source: str, payload: str, now: str
) -> InboxItem:
    _require_session(conn, session_id)
    return _input(_insert_input(conn, session_id, source, payload, now))


def _op_claim_next_input(conn: sqlite3.Connection, session_id: str, now: str) -> InboxItem | None:
    row = conn.execute(
        "UPDATE inbox SET state = 'running', updated_at = ?"
        " WHERE id = (SELECT id FROM inbox WHERE session_id = ? AND state = 'queued'"
        " ORDER BY id LIMIT 1) RETURNING *",
        (now, session_id),
    ).fetchone()
    if row is None:
        _require_session(conn, session_id)
        return None
    return _input(row)


def _op_finish_input(
    conn: sqlite3.Connection, input_id: int, state: str, detail: str | None, now: str
) -> InboxItem:
    row = conn.execute("SELECT state FROM inbox WHERE id = ?", (input_id,)).fetchone()
    if row is None:
        raise u.no_input(input_id)
    if not u.finish_allowed(row["state"], state):
        raise u.transition_error(input_id, row["state"], state)
    row = conn.execute(
        "UPDATE inbox SET state = ?, detail = ?, updated_at = ? WHERE id = ? RETURNING *",
        (state, detail, now, input_id),
    ).fetchone()
    return _input(row)


def _op_list_inputs(
    conn: sqlite3.Connection, session_id: str, states: list[str] | None
) -> list[InboxItem]:
    _require_session(conn, session_id)
    sql, args = "SELECT * FROM inbox WHERE session_id = ?", [session_id]
    if states is not None:
        if not states:
            return []
        sql += f" AND state IN ({', '.join('?' * len(states))})"
        args += states
    return [_input(r) for r in conn.execute(sql + " ORDER BY id", args).fetchall()]


def _op_interrupt_running(conn: sqlite3.Connection, now: str) -> list[InboxItem]:
    rows = conn.execute(
        "UPDATE inbox SET state = 'interrupted', updated_at = ? WHERE state = 'running'"
        " RETURNING *",
        (now,),
    ).fetchall()
    return sorted((_input(r) for r in rows), key=lambda item: item.id)


def _op_sessions_with_queued_inputs(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT DISTINCT session_id FROM inbox WHERE state = 'queued' ORDER BY session_id"
    ).fetchall()
    return [r[0] for r in rows]


def _op_append_events(
    conn: sqlite3.Connection, session_id: str, events: list[tuple[str, str]], now: str
) -> list[EventRecord]:
    row = conn.execute(
        "UPDATE sessions SET last_seq = last_seq + ?, updated_at = ? WHERE id = ?"
        " RETURNING last_seq",
        (len(events), now, session_id),
    ).fetchone()
    if row is None:
        raise u.no_session(session_id)
    first = row[0] - len(events) + 1
    rows = [(session_id, first + i, t, p, now) for i, (t, p) in enumerate(events)]
    conn.executemany(
        "INSERT INTO events (session_id, seq, type, payload, ts) VALUES (?, ?, ?, ?, ?)", rows
    )
    ts = u.parse_ts(now)
    return [
        EventRecord(session_id=session_id, seq=seq, type=t, payload=u.decode_json(p), ts=ts)
        for (_, seq, t, p, _) in rows
    ]


def _op_read_events(
    conn: sqlite3.Connection, session_id: str, after_seq: int, limit: int
) -> list[EventRecord]:
    _require_session(conn, session_id)
    rows = conn.execute(
        "SELECT * FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (session_id, after_seq, limit),
    ).fetchall()
    return [_event(r) for r in rows]


def _op_last_seq(conn: sqlite3.Connection, session_id: str) -> int:
    row = conn.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise u.no_session(session_id)
    return row[0]


def _op_create_job(
    conn: sqlite3.Connection,
    id: str,
    kind: str,
    spec: str,
    session_id: str | None,
    next_fire_at: str | None,
    state: str,
    now: str,
) -> Job:
    if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (id,)).fetchone() is not None:
        raise AlreadyExists(f"job {id!r} already exists")
    if session_id is not None:
        _require_session(conn, session_id)
    try:
        row = conn.execute(
            "INSERT INTO jobs (id, session_id, kind, spec, state, next_fire_at, created_at,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING *",
            (id, session_id, kind, spec, state, next_fire_at, now, now),
        ).fetchone()
    except sqlite3.IntegrityError as exc:  # a unique rule on kinds (one pending recall)
        raise ConflictError(f"job {id!r} conflicts with an existing job: {exc}") from None
    return _job(row)


def _op_get_job(conn: sqlite3.Connection, id: str) -> Job:
    row = conn.execute("SELECT * FROM jobs WHERE id = ?", (id,)).fetchone()
    if row is None:
        raise u.no_job(id)
    return _job(row)


def _op_list_jobs(
    conn: sqlite3.Connection, session_id: str | None, states: list[str] | None
) -> list[Job]:
    # Build the WHERE clause to fit: "(? IS NULL OR session_id = ?)" keeps SQLite from using
    # jobs_session_idx (3.6 ms instead of 0.03 ms per query at 20k jobs).
    sql, args = "SELECT * FROM jobs WHERE 1", []
    if session_id is not None:
        sql += " AND session_id = ?"
        args.append(session_id)
    if states is not None:
        if not states:
            return []
        sql += f" AND state IN ({', '.join('?' * len(states))})"
        args += states
    return [_job(r) for r in conn.execute(sql + " ORDER BY created_at, id", args).fetchall()]


def _op_update_job(conn: sqlite3.Connection, id: str, sets: dict[str, Any], now: str) -> Job:
    cols = ", ".join(f"{c} = ?" for c in sets)
    row = conn.execute(
        f"UPDATE jobs SET {cols}, updated_at = ? WHERE id = ? RETURNING *",
        (*sets.values(), now, id),
    ).fetchone()
    if row is None:
        raise u.no_job(id)
    return _job(row)


def _op_delete_job(conn: sqlite3.Connection, id: str) -> None:
    if conn.execute("DELETE FROM jobs WHERE id = ?", (id,)).rowcount == 0:
        raise u.no_job(id)


def _op_due_jobs(conn: sqlite3.Connection, before: str, limit: int) -> list[Job]:
    rows = conn.execute(
        "SELECT * FROM jobs WHERE state = 'active' AND next_fire_at IS NOT NULL"
        " AND next_fire_at <= ? ORDER BY next_fire_at, id LIMIT ?",
        (before, limit),
    ).fetchall()
    return [_job(r) for r in rows]


def _op_list_runs(conn: sqlite3.Connection, job_id: str, limit: int) -> list[JobRun]:
    _require_job(conn, job_id)
    rows = conn.execute(
        "SELECT * FROM job_runs WHERE job_id = ? ORDER BY id DESC LIMIT ?", (job_id, limit)
    ).fetchall()
    return [_run(r) for r in rows]


def _op_get_run(conn: sqlite3.Connection, run_id: int) -> JobRun:
    row = conn.execute("SELECT * FROM job_runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise u.no_run(run_id)
    return _run(row)


def _op_update_run(
    conn: sqlite3.Connection, run_id: int, state: str, detail: str | None, now: str
) -> JobRun:
    row = conn.execute(
        "UPDATE job_runs SET state = ?, detail = coalesce(?, detail), updated_at = ?"
        " WHERE id = ? RETURNING *",
        (state, detail, now, run_id),
    ).fetchone()
    if row is None:
        raise u.no_run(run_id)
    return _run(row)


def _op_fire_job(
    conn: sqlite3.Connection,
    job_id: str,
    expected: str,
    new: str | None,
    run_state: str,
    input: tuple[str, str] | None,
    detail: str | None,
    now: str,
    counts: bool = True,
    extra_runs: list[tuple[str, str, str | None]] = (),
) -> FireResult | None:
    row = conn.execute(
        "UPDATE jobs SET next_fire_at = ?1,"
        " state = CASE WHEN ?1 IS NULL THEN 'completed' ELSE state END,"
        " run_count = run_count + ?5, updated_at = ?2"
        " WHERE id = ?3 AND state = 'active' AND next_fire_at = ?4 RETURNING *",
        (new, now, job_id, expected, 1 if counts else 0),
    ).fetchone()
    if row is None:
        _require_job(conn, job_id)
        return None
    job = _job(row)
    item = None
    if input is not None:
        if job.session_id is None:
            raise ConflictError(f"job {job_id!r} has no session")
        item = _input(_insert_input(conn, job.session_id, input[0], input[1], now))
    run = conn.execute(
        "INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail, created_at,"
        " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING *",
        (job_id, expected, run_state, item.id if item else None, detail, now, now),
    ).fetchone()
    if item is not None:  # the input names its run, so its turn finds it without a search
        item = _input(
            conn.execute(
                "UPDATE inbox SET payload = json_set(payload, '$.run_id', ?) WHERE id = ?"
                " RETURNING *",
                (run["id"], item.id),
            ).fetchone()
        )
    if extra_runs:
        conn.executemany(
            "INSERT INTO job_runs (job_id, scheduled_for, state, input_id, detail, created_at,"
            " updated_at) VALUES (?, ?, ?, NULL, ?, ?, ?)",
            [(job_id, when, state, data, now, now) for when, state, data in extra_runs],
        )
    return FireResult(job=job, run=_run(run), input=item)


def _op_kv_put(conn, namespace: str, rows: list[tuple[str, str, str | None]], now: str) -> None:
    conn.executemany(
        "INSERT INTO kv (namespace, key, value, expires_at, updated_at) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
        " expires_at = excluded.expires_at, updated_at = excluded.updated_at",
        [(namespace, key, value, expires, now) for key, value, expires in rows],
    )


def _op_kv_get(conn, namespace: str, key: str, now: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT value FROM kv WHERE namespace = ? AND key = ?"
        " AND (expires_at IS NULL OR expires_at > ?)",
        (namespace, key, now),
    ).fetchone()
    return None if row is None else u.decode_json(row["value"])


def _op_kv_delete(conn, namespace: str, keys: list[str]) -> int:
    total = 0
    for key in keys:
        total += conn.execute(
            "DELETE FROM kv WHERE namespace = ? AND key = ?", (namespace, key)
        ).rowcount
    return total


def _op_kv_list(conn, namespace: str, after: str, limit: int, now: str):
    rows = conn.execute(
        "SELECT key, value FROM kv WHERE namespace = ? AND key > ?"
        " AND (expires_at IS NULL OR expires_at > ?) ORDER BY key LIMIT ?",
        (namespace, after, now, limit),
    ).fetchall()
    return [(r["key"], u.decode_json(r["value"])) for r in rows]


def _op_kv_purge(conn, now: str) -> int:
    return conn.execute(
        "DELETE FROM kv WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)
    ).rowcount


# -- the store --------------------------------------------------------------------------------


class SQLiteStore:
    """The SQLite backend of :class:`~runtime.store.base.Store`.

    Use :func:`runtime.store.open_store` (``sqlite:///file.db``) rather than this class.

    Args:
        path: database file, or ``":memory:"``.
        clock: stamps every row (default: the system clock).
        synchronous: ``"FULL"`` (default: durable on power loss) or ``"NORMAL"``, ...
        readers: size of the read-connection pool.
        max_batch: most requests one group commit may hold.
    """

    backend = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        clock: Clock | None = None,
        synchronous: str = "FULL",
        readers: int = 4,
        max_batch: int = 256,
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(f"unknown synchronous setting {synchronous!r}")
        self.path = path
        self.clock = clock if clock is not None else SystemClock()
        self._synchronous = synchronous.upper()
        self._memory = path == ":memory:"
        self._n_readers = 0 if self._memory else max(1, readers)
        self._max_batch = max_batch
        self._write_conn: sqlite3.Connection | None = None
        self._writer: _Writer | None = None
        self._readers: list[sqlite3.Connection] = []
        self._reader_slots = trio.Semaphore(max(1, self._n_readers))
        self._closed = False

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r}>"

    # ---- lifecycle ----

    def _connect(self, *, read_only: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=10.0
        )
        conn.row_factory = sqlite3.Row
        if read_only:
            conn.execute("PRAGMA query_only = ON")
        else:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def _open_sync(self) -> None:
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise StoreError(
                f"sqlite {sqlite3.sqlite_version} is too old (need"
                f" {'.'.join(map(str, _MIN_SQLITE))})"
            )
        conn = self._connect(read_only=False)
        try:
            self._migrate(conn)
            self._readers = [self._connect(read_only=True) for _ in range(self._n_readers)]
        except BaseException:
            conn.close()
            for r in self._readers:
                r.close()
            self._readers = []
            raise
        self._write_conn = conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        now = u.format_ts(self.clock.now())
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(SQLITE_BOOTSTRAP)
                applied = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
                for m in pending(applied, SQLITE_MIGRATIONS):
                    for stmt in m.statements:
                        conn.execute(stmt)
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, applied_at)"
                        " VALUES (?, ?, ?)",
                        (m.version, m.name, now),
                    )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise MigrationError(f"sqlite: migration failed: {exc}") from exc

    async def open(self) -> None:
        """Connect, apply migrations and start the writer thread (inline for ``:memory:``)."""
        try:
            if self._memory:
                self._open_sync()
            else:
                await trio.to_thread.run_sync(self._open_sync)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: cannot open {self.path!r}: {exc}") from exc
        assert self._write_conn is not None
        writer = _InlineWriter if self._memory else _Writer
        self._writer = writer(self._write_conn, self._max_batch)
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
                await trio.to_thread.run_sync(lambda: [r.close() for r in readers])
            if self._writer is not None:
                await self._writer.stop()

    # ---- plumbing ----

    def _now_str(self) -> str:
        return u.format_ts(self.clock.now())

    async def _write(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Run ``fn(conn, **kwargs)`` in the writer thread, in the next group commit."""
        if self._closed or self._writer is None:
            raise StoreError("store is closed")
        return await self._writer.submit(partial(fn, **kwargs) if kwargs else fn)

    async def _read(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Run ``fn(conn, **kwargs)`` on a reader connection, in one read transaction."""
        if self._closed or self._writer is None:
            raise StoreError("store is closed")
        if kwargs:
            fn = partial(fn, **kwargs)
        if self._memory:
            return await self._writer.submit(fn)
        async with self._reader_slots:
            if not self._readers:
                raise StoreError("store is closed")
            conn = self._readers.pop()
            try:
                return await trio.to_thread.run_sync(_read_txn, conn, fn)
            finally:
                self._readers.append(conn)

    @property
    def commit_stats(self) -> tuple[int, int]:
        """(transactions committed, requests they held) by the writer: group commit at work."""
        w = self._writer
        return (w.commits, w.committed_requests) if w else (0, 0)

    # ---- schema ----

    async def ping(self) -> None:
        await self._read(_op_ping)

    async def migrations(self) -> list[MigrationRecord]:
        return await self._read(_op_migrations)

    # ---- sessions ----

    async def create_session(
        self,
        id: str,
        owner: str,
        metadata: dict[str, Any] | None = None,
        policy: str = "enqueue",
    ) -> Session:
        u.check_text(id, "id")
        u.check_text(owner, "owner")
        u.check_text(policy, "policy")
        meta = u.encode_json({} if metadata is None else metadata, "metadata")
        return await self._write(
            _op_create_session,
            id=id,
            owner=owner,
            metadata=meta,
            policy=policy,
            now=self._now_str(),
        )

    async def get_session(self, id: str) -> Session:
        return await self._read(_op_get_session, id=id)

    async def list_sessions(
        self, owner: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Session]:
        u.check_limit(limit)
        return await self._read(_op_list_sessions, owner=owner, limit=limit, after_id=after_id)

    async def update_session(
        self,
        id: str,
        *,
        metadata: dict[str, Any] | UnsetType = UNSET,
        policy: str | UnsetType = UNSET,
    ) -> Session:
        sets: dict[str, Any] = {}
        if metadata is not UNSET:
            sets["metadata"] = u.encode_json(metadata, "metadata")  # type: ignore[arg-type]
        if policy is not UNSET:
            sets["policy"] = u.check_text(policy, "policy")
        if not sets:
            return await self.get_session(id)
        return await self._write(_op_update_session, id=id, sets=sets, now=self._now_str())

    async def delete_session(self, id: str) -> None:
        await self._write(_op_delete_session, id=id)

    # ---- inbox ----

    async def enqueue_input(
        self, session_id: str, source: str, payload: dict[str, Any]
    ) -> InboxItem:
        u.check_text(session_id, "session_id")
        u.check_text(source, "source")
        data = u.encode_json(payload)
        return await self._write(
            _op_enqueue_input,
            session_id=session_id,
            source=source,
            payload=data,
            now=self._now_str(),
        )

    async def claim_next_input(self, session_id: str) -> InboxItem | None:
        return await self._write(_op_claim_next_input, session_id=session_id, now=self._now_str())

    async def finish_input(
        self, input_id: int, state: str, detail: dict[str, Any] | None = None
    ) -> InboxItem:
        u.check_int(input_id, "input_id")
        u.check_input_state(state)
        data = u.encode_optional_json(detail)
        return await self._write(
            _op_finish_input, input_id=input_id, state=state, detail=data, now=self._now_str()
        )

    async def list_inputs(
        self, session_id: str, states: Sequence[str] | None = None
    ) -> list[InboxItem]:
        wanted = u.check_input_states(states)
        return await self._read(_op_list_inputs, session_id=session_id, states=wanted)

    async def interrupt_running(self) -> list[InboxItem]:
        return await self._write(_op_interrupt_running, now=self._now_str())

    async def sessions_with_queued_inputs(self) -> list[str]:
        return await self._read(_op_sessions_with_queued_inputs)

    # ---- events ----

    async def append_events(
        self, session_id: str, events: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[EventRecord]:
        encoded = u.check_events(events)
        if not encoded:
            await self.last_seq(session_id)  # still NotFound for an unknown session
            return []
        return await self._write(
            _op_append_events, session_id=session_id, events=encoded, now=self._now_str()
        )

    async def read_events(
        self, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        u.check_int(after_seq, "after_seq")
        u.check_limit(limit)
        return await self._read(
            _op_read_events, session_id=session_id, after_seq=after_seq, limit=limit
        )

    async def last_seq(self, session_id: str) -> int:
        return await self._read(_op_last_seq, session_id=session_id)

    # ---- key-value ----

    async def kv_put(self, namespace, items) -> None:
        u.check_text(namespace, "namespace")
        rows = [
            (
                u.check_text(key, "key"),
                u.encode_json(value, "value"),
                None if expires is None else u.format_ts(u.check_time(expires, "expires_at")),
            )
            for key, value, expires in items
        ]
        if rows:
            await self._write(_op_kv_put, namespace=namespace, rows=rows, now=self._now_str())

    async def kv_get(self, namespace: str, key: str) -> dict[str, Any] | None:
        return await self._read(_op_kv_get, namespace=namespace, key=key, now=self._now_str())

    async def kv_delete(self, namespace: str, keys) -> int:
        return await self._write(_op_kv_delete, namespace=namespace, keys=list(keys))

    async def kv_list(self, namespace: str, *, after_key: str | None = None, limit: int = 1000):
        return await self._read(
            _op_kv_list,
            namespace=namespace,
            after=after_key or "",
            limit=limit,
            now=self._now_str(),
        )

    async def kv_purge_expired(self) -> int:
        return await self._write(_op_kv_purge, now=self._now_str())

    # ---- jobs ----

    async def create_job(
        self,
        id: str,
        *,
        kind: str,
        spec: dict[str, Any],
        session_id: str | None = None,
        next_fire_at: datetime | None = None,
        state: str = "active",
    ) -> Job:
        u.check_text(id, "id")
        u.check_text(kind, "kind")
        u.check_job_state(state)
        if session_id is not None:
            u.check_text(session_id, "session_id")
        data = u.encode_json(spec, "spec")
        nfa = None if next_fire_at is None else u.check_time(next_fire_at, "next_fire_at")
        return await self._write(
            _op_create_job,
            id=id,
            kind=kind,
            spec=data,
            session_id=session_id,
            next_fire_at=u.format_optional_ts(nfa),
            state=state,
            now=self._now_str(),
        )

    async def get_job(self, id: str) -> Job:
        return await self._read(_op_get_job, id=id)

    async def list_jobs(
        self, session_id: str | None = None, states: Sequence[str] | None = None
    ) -> list[Job]:
        wanted = u.check_job_states(states)
        return await self._read(_op_list_jobs, session_id=session_id, states=wanted)

    async def update_job(
        self,
        id: str,
        *,
        kind: str | UnsetType = UNSET,
        spec: dict[str, Any] | UnsetType = UNSET,
        state: str | UnsetType = UNSET,
        next_fire_at: datetime | None | UnsetType = UNSET,
    ) -> Job:
        sets: dict[str, Any] = {}
        if kind is not UNSET:
            sets["kind"] = u.check_text(kind, "kind")
        if spec is not UNSET:
            sets["spec"] = u.encode_json(spec, "spec")  # type: ignore[arg-type]
        if state is not UNSET:
            sets["state"] = u.check_job_state(state)
        if next_fire_at is not UNSET:
            sets["next_fire_at"] = (
                None
                if next_fire_at is None
                else u.format_ts(u.check_time(next_fire_at, "next_fire_at"))
            )
        if not sets:
            return await self.get_job(id)
        return await self._write(_op_update_job, id=id, sets=sets, now=self._now_str())

    async def delete_job(self, id: str) -> None:
        await self._write(_op_delete_job, id=id)

    async def due_jobs(self, before: datetime, limit: int = 100) -> list[Job]:
        b = u.format_ts(u.check_time(before, "before"))
        u.check_limit(limit)
        return await self._read(_op_due_jobs, before=b, limit=limit)

    async def list_runs(self, job_id: str, limit: int = 100) -> list[JobRun]:
        u.check_limit(limit)
        return await self._read(_op_list_runs, job_id=job_id, limit=limit)

    async def get_run(self, run_id: int) -> JobRun:
        u.check_int(run_id, "run_id")
        return await self._read(_op_get_run, run_id=run_id)

    async def update_run(
        self, run_id: int, state: str, detail: dict[str, Any] | None = None
    ) -> JobRun:
        u.check_int(run_id, "run_id")
        u.check_text(state, "state")
        data = u.encode_optional_json(detail)
        return await self._write(
            _op_update_run, run_id=run_id, state=state, detail=data, now=self._now_str()
        )

    async def fire_job(
        self,
        job_id: str,
        expected_next_fire_at: datetime,
        new_next_fire_at: datetime | None,
        run_state: str = "queued",
        input: tuple[str, dict[str, Any]] | None = None,
        detail: dict[str, Any] | None = None,
        counts: bool = True,
        extra_runs: Sequence[tuple[datetime, str, dict[str, Any] | None]] = (),
    ) -> FireResult | None:
        expected = u.format_ts(u.check_time(expected_next_fire_at, "expected_next_fire_at"))
        new = (
            None
            if new_next_fire_at is None
            else u.format_ts(u.check_time(new_next_fire_at, "new_next_fire_at"))
        )
        u.check_text(run_state, "run_state")
        inp = u.check_fire_input(input)
        data = u.encode_optional_json(detail)
        return await self._write(
            _op_fire_job,
            job_id=job_id,
            expected=expected,
            new=new,
            run_state=run_state,
            input=inp,
            detail=data,
            now=self._now_str(),
            counts=counts,
            extra_runs=[
                (
                    u.format_ts(u.check_time(when, "extra_runs")),
                    state,
                    u.encode_optional_json(extra),
                )
                for when, state, extra in extra_runs
            ],
        )


def _read_txn(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` in one read transaction (one snapshot) on a reader connection."""
    try:
        conn.execute("BEGIN")
        try:
            return fn(conn)
        finally:
            conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise StoreError(f"sqlite: {exc}") from exc
