"""The SQLite backend's writer: one thread, group commit, savepoint per request.

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
* ``:memory:`` databases use :class:`InlineWriter`: the same transaction, on the trio thread.
* **Faults** (tests only, :mod:`runtime.store.faults`): with a ``fault``, the commit of the
  batch holding the N-th write request is crashed before or after, failed or delayed; without
  one (always outside tests) a batch pays one ``is not None`` check.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import trio

from turnstile.runtime.errors import StoreError
from turnstile.runtime.store.faults import StoreFault
from turnstile.runtime.store.outage import sqlite_error

__all__ = ["Writer", "InlineWriter", "wrap_error"]

T = TypeVar("T")

_PENDING, _TAKEN, _CANCELLED = 0, 1, 2
_STOP = object()


class _Request:
    """One write: ``fn(conn, **args)``, the task waiting for it, and how it went."""

    __slots__ = ("fn", "args", "task", "state", "result", "error")

    def __init__(
        self, fn: Callable[..., Any], args: dict[str, Any], task: trio.lowlevel.Task | None
    ) -> None:
        self.fn = fn
        self.args = args
        self.task = task
        self.state = _PENDING
        self.result: Any = None
        self.error: BaseException | None = None


def wrap_error(exc: BaseException) -> BaseException:
    """sqlite3 errors become StoreError (StoreUnavailable for a database locked past its
    timeout or an I/O error: :mod:`runtime.store.outage`); our own errors (NotFound, ...) pass
    through."""
    if isinstance(exc, sqlite3.Error):
        return sqlite_error(exc)
    return exc


class Writer:
    """The single writer thread, with group commit (see the module docstring)."""

    def __init__(
        self, conn: sqlite3.Connection, max_batch: int, fault: StoreFault | None = None
    ) -> None:
        self._conn = conn
        self._max_batch = max_batch
        self._fault = fault
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

    async def submit(self, fn: Callable[..., T], args: dict[str, Any]) -> T:
        """Run ``fn(conn, **args)`` in the next group commit; its answer once committed."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._accepting:
            raise StoreError("store is closed")
        req = _Request(fn, args, trio.lowlevel.current_task())

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
        return cast(T, req.result)

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
        task = req.task
        assert task is not None  # (only InlineWriter's requests have none, and wake no one)
        try:
            self._token.run_sync_soon(trio.lowlevel.reschedule, task)
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
                    req.result, req.error = None, sqlite_error(exc, "sqlite: transaction failed")
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
                req.result = req.fn(conn, **req.args)
            except Exception as exc:
                req.result, req.error = None, wrap_error(exc)
                if conn.in_transaction:
                    conn.execute("ROLLBACK TO request")
                    conn.execute("RELEASE request")
            else:
                conn.execute("RELEASE request")
                uncommitted.append(req)
        if conn.in_transaction:
            fault = self._fault
            if fault is not None:  # tests only: crash, fail or delay this commit
                fault.before_commit(sqlite3.OperationalError)
            conn.execute("COMMIT")
            self.commits += 1
            self.committed_requests += len(uncommitted)
            if fault is not None:
                fault.after_commit()
        else:
            self._fail(uncommitted, "transaction rolled back")

    @staticmethod
    def _fail(reqs: list[_Request], why: str) -> None:
        for req in reqs:
            req.result, req.error = None, StoreError(f"sqlite: {why}")


class InlineWriter(Writer):
    """The writer for ``:memory:`` databases: statements run on the trio thread itself.

    An in-memory database has no disk to wait for, so a thread buys nothing; running inline
    also keeps ``MockClock(autojump_threshold=0)`` tests exact: no task ever waits on a
    thread, so the mock clock never jumps while the store is working.
    """

    def start(self) -> None:
        pass

    async def submit(self, fn: Callable[..., T], args: dict[str, Any]) -> T:
        await trio.lowlevel.checkpoint()
        if not self._accepting:
            raise StoreError("store is closed")
        req = _Request(fn, args, None)
        req.state = _TAKEN
        try:
            self._transact([req])
        except Exception as exc:  # BEGIN or COMMIT failed: nothing committed
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            req.error = sqlite_error(exc, "sqlite: transaction failed")
        if req.error is not None:
            raise req.error
        return cast(T, req.result)

    async def stop(self) -> None:
        if self._accepting:
            self._accepting = False
            self._conn.close()
