"""PostgreSQL's side of the store's fault seam (tests only; :mod:`runtime.store.faults`).

A write operation commits when its PostgreSQL side returns (one statement, or the transaction
it opened), on the store's asyncio thread. With a fault, :func:`faulty` wraps a write's side
there: it counts the write and, when it is the fault's, stops the process before it runs
(nothing of it is kept) or right after it returned (kept, its caller not told), fails it as a
lost connection would, or makes it wait first. The backend wraps only when a fault is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from turnstile.runtime.store.faults import StoreFault

__all__ = ["faulty"]

T = TypeVar("T")


def _lost_connection(message: str) -> BaseException:
    return asyncpg.exceptions.ConnectionDoesNotExistError(message)


def faulty(
    fault: StoreFault, name: str, fn: Callable[..., Awaitable[T]]
) -> Callable[..., Awaitable[T]]:
    """``fn`` (a write's PostgreSQL side, called ``name``), counted in ``fault`` and struck
    when it is the fault's write."""

    async def write(conn: Any, **args: Any) -> T:
        if not fault.count(name):
            return await fn(conn, **args)
        if fault.kind == "delay":
            fault.say_delayed()
            await asyncio.sleep(fault.seconds)  # this write waits, not the whole loop
        else:
            fault.strike_before(_lost_connection)
        answer = await fn(conn, **args)
        fault.strike_after()
        return answer

    return write
