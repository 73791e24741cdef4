"""Waiting on what no event of the test's own signals: other nodes' progress (in-process nodes
with their own clocks and tasks, or other processes), looked at in the store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T]], seconds: float = 60, every: float = 0.05
) -> T:
    """Look at ``await check()`` every ``every`` seconds until it is true, and return it.

    ``seconds`` is a hang guard, not a promise: generous, so that a loaded machine (load 8 on
    2 cores) passes; a bound on how fast something happens is a bench scenario's to measure.

    Raises:
        AssertionError: still false after ``seconds`` (naming the check).
    """
    with trio.move_on_after(seconds):
        while True:
            found = await check()
            if found:
                return found
            await trio.sleep(every)
    name = getattr(check, "__name__", repr(check))
    raise AssertionError(f"{name}: still false after {seconds} s")
