"""Clocks: wall time follows trio's mock clock; conversions between the two."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import trio

from turnstile.runtime.clock import MockWallClock, SystemClock, utc

START = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.mark.guard(2 * 86400)
async def test_mock_wall_clock_advances_with_trio_time(autojump_clock):
    clock = MockWallClock(START)
    assert clock.now() == START
    await trio.sleep(86400)
    assert clock.now() == START + timedelta(days=1)


async def test_monotonic_and_wall_conversions_are_inverse(autojump_clock):
    clock = MockWallClock(START)
    due = START + timedelta(hours=2)
    at = clock.monotonic_at(due)
    assert at - clock.monotonic() == 7200
    assert clock.wall_at(at) == due


async def test_system_clock_is_aware_utc():
    now = SystemClock().now()
    assert now.tzinfo is UTC


def test_utc_normalises_naive_and_offset_datetimes():
    assert utc(datetime(2026, 1, 1, 9)) == datetime(2026, 1, 1, 9, tzinfo=UTC)
    paris = timezone(timedelta(hours=1))
    assert utc(datetime(2026, 1, 1, 10, tzinfo=paris)) == datetime(2026, 1, 1, 9, tzinfo=UTC)
