"""The runtime's one source of time.

Two kinds of time are kept apart on purpose:

* **monotonic** time (``trio.current_time()``) drives timeouts, the timer wheel and
  latency measurements. Under ``trio.testing.MockClock`` it jumps, so "a day later" is instant.
* **wall** time (an aware UTC ``datetime``) is what gets persisted: schedules, run records,
  event timestamps. It comes from an injected function so tests can pin it.

``MockWallClock`` ties the two together for tests: wall time advances exactly as trio's
(mock) clock does, so a scheduled job due "tomorrow at 9am" fires when the mock clock says so.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import trio

__all__ = ["Clock", "SystemClock", "MockWallClock", "utc"]


def utc(dt: datetime) -> datetime:
    """Return ``dt`` as an aware UTC datetime; naive input is taken to be UTC already."""
    if dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


class Clock:
    """Monotonic and wall time, read through one object so both can be injected.

    Args:
        wall: a zero-argument function returning the current aware UTC datetime.
    """

    __slots__ = ("_wall",)

    def __init__(self, wall: Callable[[], datetime]) -> None:
        self._wall = wall

    def monotonic(self) -> float:
        """Seconds on trio's clock (mockable); only meaningful inside ``trio.run``."""
        return trio.current_time()

    def now(self) -> datetime:
        """The current wall time as an aware UTC datetime."""
        return utc(self._wall())

    def wall_at(self, monotonic: float) -> datetime:
        """The wall time at which trio's clock will read ``monotonic``."""
        return self.now() + timedelta(seconds=monotonic - self.monotonic())

    def monotonic_at(self, wall: datetime) -> float:
        """The trio-clock reading at which the wall clock will show ``wall``."""
        return self.monotonic() + (utc(wall) - self.now()).total_seconds()


class SystemClock(Clock):
    """The real clock: trio's monotonic time and the system's UTC wall time."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(lambda: datetime.now(UTC))


class MockWallClock(Clock):
    """Wall time that advances with trio's clock, starting at ``start``.

    Create it inside ``trio.run`` (it reads ``trio.current_time()`` as its origin). With
    ``MockClock(autojump_threshold=0)`` both clocks jump together when every task sleeps.
    """

    __slots__ = ("_origin_wall", "_origin_mono")

    def __init__(self, start: datetime) -> None:
        self._origin_wall = utc(start)
        self._origin_mono = trio.current_time()
        super().__init__(self._read)

    def _read(self) -> datetime:
        return self._origin_wall + timedelta(seconds=trio.current_time() - self._origin_mono)
