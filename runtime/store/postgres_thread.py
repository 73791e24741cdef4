"""The PostgreSQL backend's asyncio thread, and the bridge between it and trio.

asyncpg is an asyncio library. It runs on a plain asyncio event loop in a thread of its own
(:class:`AsyncioThread`), which the store starts when it opens and stops when it closes. A trio
task runs an operation by handing the coroutine to that loop (``call_soon_threadsafe``) and
sleeping until the loop hands the outcome back (``TrioToken.run_sync_soon``): two wake-ups per
operation, however many statements it sends, where trio-asyncio took about sixteen passes of its
loop per statement (``bench/scenarios/pgdriver.py`` measures both). Any trio task of the run
that opened the store may call it. asyncio is confined to the ``runtime/store/postgres*``
modules; the operations' PostgreSQL sides are coroutines they run, and nothing on the asyncio
side touches trio except through the run's token.

Cancellation: a trio task cancelled while its operation runs asks the loop to cancel it and
waits until it has ended, so no connection is left in use behind the caller. If the operation
finished first, its answer is returned and the cancellation is seen at the caller's next
checkpoint: a committed write is never reported as cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import outcome
import trio

from turnstile.runtime.errors import StoreError

__all__ = ["AsyncioThread", "open_asyncio_thread"]

T = TypeVar("T")

log = logging.getLogger("turnstile.store")

_CLOSE_TIMEOUT = 10.0


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

    #: the trio run that started the thread (set by :meth:`start`)
    _token: trio.lowlevel.TrioToken

    def __init__(self) -> None:
        # the loop's class, not asyncio.new_event_loop(): once trio-asyncio is imported (tests,
        # the bench's baseline), its policy would make a trio-asyncio loop
        self.loop: asyncio.AbstractEventLoop = asyncio.SelectorEventLoop()
        self._thread = threading.Thread(
            target=self._main, name="turnstile postgres (asyncio)", daemon=True
        )
        self._stopped = False
        # trio -> loop: callables to run on the loop, and whether a drain is scheduled there
        self._requests: deque[Callable[[], None]] = deque()
        self._requests_armed = False
        # loop -> trio: (task, outcome) to reschedule, and whether a drain is scheduled in trio
        self._outcomes: deque[tuple[trio.lowlevel.Task, outcome.Outcome[Any]]] = deque()
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

    def _reply(self, task: trio.lowlevel.Task, result: outcome.Outcome[Any]) -> None:  # asyncio
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

    async def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """``await fn(*args)`` on the loop; its answer or exception comes back here.

        Raises:
            StoreError: the loop is stopped, or the operation was cancelled on the loop's side.
        """
        if self._stopped:
            raise StoreError("store is closed")
        op = _Call(self, trio.lowlevel.current_task(), fn, args)
        self._request(op.begin)
        answer = await trio.lowlevel.wait_task_rescheduled(op.abort)
        if answer is _CANCELLED:
            await trio.lowlevel.checkpoint()  # raises Cancelled when the caller was cancelled
            raise StoreError("postgres: operation cancelled")
        return cast(T, answer)


class _Call:
    """One operation of :meth:`AsyncioThread.call`: what the loop runs and whom it answers.

    One object with bound methods rather than four closures and their cells: every store
    operation makes one, and fewer young objects mean fewer pauses of the cyclic GC.
    """

    __slots__ = ("_thread", "_task", "_fn", "_args", "_future")

    def __init__(
        self,
        thread: AsyncioThread,
        task: trio.lowlevel.Task,
        fn: Callable[..., Coroutine[Any, Any, Any]],
        args: tuple[Any, ...],
    ) -> None:
        self._thread = thread
        self._task = task
        self._fn = fn
        self._args = args
        self._future: asyncio.Task[Any] | None = None

    def begin(self) -> None:  # asyncio thread
        future = self._thread.loop.create_task(self._fn(*self._args))
        self._future = future
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Task[Any]) -> None:  # asyncio thread
        if future.cancelled():
            result: outcome.Outcome[Any] = outcome.Value(_CANCELLED)
        else:
            exc = future.exception()
            result = outcome.Value(future.result()) if exc is None else outcome.Error(exc)
        self._thread._reply(self._task, result)

    def _cancel(self) -> None:  # asyncio thread, after begin (requests run in order)
        future = self._future
        if future is not None:
            future.cancel()

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
