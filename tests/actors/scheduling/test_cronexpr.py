"""Cron schedules: validation, DST rules checked against a minute-by-minute reference, caching."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from turnstile.actors.scheduling.cronexpr import (
    CronSchedule,
    fixed_offset_name,
    resolve_timezone,
    wall_to_utc,
)
from turnstile.runtime.errors import InvalidArgument

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)  # a Saturday
MINUTE = timedelta(minutes=1)


def z(text: str) -> datetime:
    """``"2026-03-29T01:00"`` as an aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def fires(schedule: CronSchedule, after: datetime, n: int) -> list[str]:
    out = []
    for _ in range(n):
        after = schedule.next_fire(after)
        out.append(after.strftime("%Y-%m-%dT%H:%MZ"))
    return out


# --- the DST cases the module docstring promises ------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [
        # Spring-forward gap: a fixed wall time in the gap fires once, when the clocks show 03:00.
        (
            "30 2 * * *",
            "Europe/Paris",
            "2026-03-27T12:00",
            ["2026-03-28T01:30Z", "2026-03-29T01:00Z", "2026-03-30T00:30Z"],
        ),
        (
            "30 2 * * *",
            "America/New_York",
            "2026-03-06T12:00",
            ["2026-03-07T07:30Z", "2026-03-08T07:00Z", "2026-03-09T06:30Z"],
        ),
        # Several wall times in the gap collapse into one fire.
        (
            "0,30 2 * * *",
            "Europe/Paris",
            "2026-03-28T12:00",
            ["2026-03-29T01:00Z", "2026-03-30T00:00Z", "2026-03-30T00:30Z"],
        ),
        # Autumn fold: a fixed wall time fires on its first occurrence only (croniter fires twice).
        (
            "30 2 * * *",
            "Europe/Paris",
            "2026-10-23T12:00",
            ["2026-10-24T00:30Z", "2026-10-25T00:30Z", "2026-10-26T01:30Z"],
        ),
        (
            "30 1 * * *",
            "America/New_York",
            "2026-10-30T12:00",
            ["2026-10-31T05:30Z", "2026-11-01T05:30Z", "2026-11-02T06:30Z"],
        ),
        # A wildcard minute counts as wildcard (cronie): both occurrences of 02:xx run.
        (
            "*/30 2 * * *",
            "Europe/Paris",
            "2026-10-24T23:00",
            ["2026-10-25T00:00Z", "2026-10-25T00:30Z", "2026-10-25T01:00Z", "2026-10-25T01:30Z"],
        ),
        # Hourly across the gap: one fire per real hour, 02:00 local never exists.
        (
            "0 * * * *",
            "Europe/Paris",
            "2026-03-28T23:30",
            ["2026-03-29T00:00Z", "2026-03-29T01:00Z", "2026-03-29T02:00Z"],
        ),
        # Hourly across the fold: 02:00 CEST and 02:00 CET both run; no real hour is skipped.
        (
            "0 * * * *",
            "Europe/Paris",
            "2026-10-24T22:30",
            ["2026-10-24T23:00Z", "2026-10-25T00:00Z", "2026-10-25T01:00Z", "2026-10-25T02:00Z"],
        ),
        (
            "0 * * * *",
            "America/New_York",
            "2026-11-01T04:30",
            ["2026-11-01T05:00Z", "2026-11-01T06:00Z", "2026-11-01T07:00Z"],
        ),
        # A wildcard wall time in the gap is not moved: 02:30 never shows on the clock.
        (
            "30 * * * *",
            "Europe/Paris",
            "2026-03-28T23:45",
            ["2026-03-29T00:30Z", "2026-03-29T01:30Z"],
        ),
        # Fixed offsets have no DST.
        ("0 9 * * *", "UTC+02:00", "2026-03-28T12:00", ["2026-03-29T07:00Z", "2026-03-30T07:00Z"]),
    ],
)
def test_dst_transitions(expr, tz, after, expected):
    assert fires(CronSchedule(expr, tz), z(after), len(expected)) == expected


def test_fixed_job_fires_exactly_once_on_each_transition_day():
    schedule = CronSchedule("30 2 * * *", "Europe/Paris")
    for day in ("2026-03-29", "2026-10-25"):
        start = z(f"{day}T00:00") - timedelta(hours=2)  # local midnight, both days
        assert len([f for f in fires(schedule, start, 3) if f.startswith(day)]) == 1


def test_hourly_job_runs_once_per_real_hour_on_transition_days():
    schedule = CronSchedule("0 * * * *", "Europe/Paris")
    # Local days: 2026-03-29 has 23 real hours, 2026-10-25 has 25.
    assert fires(schedule, z("2026-03-28T23:00") - MINUTE, 23)[-1] == "2026-03-29T21:00Z"
    assert schedule.next_fire(z("2026-03-29T21:00")) == z("2026-03-29T22:00")  # next local day
    assert fires(schedule, z("2026-10-24T22:00") - MINUTE, 25)[-1] == "2026-10-25T22:00Z"


# --- a minute-by-minute reference of the DST rules ---------------------------------------------


def _field(text: str, lo: int, hi: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step = part.partition("/")
        a, b = (lo, hi) if base == "*" else map(int, (base.split("-") * 2)[:2])
        if step and "-" not in base and base != "*":
            b = hi
        values.update(range(a, b + 1, int(step or 1)))
    return frozenset(values)


def _matcher(expr: str):
    minute, hour, dom, month, dow = expr.split()
    sets = (_field(minute, 0, 59), _field(hour, 0, 23), _field(dom, 1, 31), _field(month, 1, 12))
    dows = frozenset(d % 7 for d in _field(dow, 0, 7))

    def matches(w: datetime) -> bool:
        if w.minute not in sets[0] or w.hour not in sets[1] or w.month not in sets[3]:
            return False
        by_dom, by_dow = w.day in sets[2], (w.weekday() + 1) % 7 in dows
        if dom != "*" and dow != "*":
            return by_dom or by_dow
        return by_dom and by_dow

    return matches


@functools.cache
def _minutes(tz: str, start: datetime, end: datetime):
    """Every real minute in [start, end) with its wall time, fold and the wall times skipped."""
    zone, out = ZoneInfo(tz), []
    prev = (start - MINUTE).astimezone(zone).replace(tzinfo=None)
    t = start
    while t < end:
        local = t.astimezone(zone)
        wall = local.replace(tzinfo=None)
        skipped = []
        w = prev + MINUTE
        while w < wall:
            skipped.append(w)
            w += MINUTE
        out.append((t, wall, local.fold, skipped))
        prev, t = wall, t + MINUTE
    return out


def reference(expr: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    """The fires the module docstring describes, found by looking at every real minute."""
    matches = _matcher(expr)
    minute, hour = expr.split()[:2]
    fixed = not minute.startswith("*") and not hour.startswith("*")
    out = []
    for t, wall, fold, skipped in _minutes(tz, start, end):
        if fixed:
            fire = (matches(wall) and not fold) or any(matches(w) for w in skipped)
        else:
            fire = matches(wall)
        if fire:
            out.append(t)
    return out


WINDOWS = [
    ("Europe/Paris", z("2026-03-28T00:00"), z("2026-03-30T00:00")),
    ("Europe/Paris", z("2026-10-24T00:00"), z("2026-10-26T00:00")),
    ("America/New_York", z("2026-03-07T12:00"), z("2026-03-09T12:00")),
    ("America/New_York", z("2026-10-31T12:00"), z("2026-11-02T12:00")),
    ("Australia/Lord_Howe", z("2026-10-03T00:00"), z("2026-10-05T00:00")),  # 30-minute shift
    ("Australia/Lord_Howe", z("2026-04-04T00:00"), z("2026-04-06T00:00")),
]
EXPRS = [
    "30 2 * * *",
    "0 2 * * *",
    "45 1 * * *",
    "0,30 2 * * *",
    "15 1-3 * * *",
    "0 * * * *",
    "30 * * * *",
    "*/15 * * * *",
    "*/20 2 * * *",
    "0 */2 * * *",
    "0 2 * * 0",
]


@pytest.mark.parametrize("expr", EXPRS)
@pytest.mark.parametrize(("tz", "start", "end"), WINDOWS, ids=lambda v: str(v)[:16])
def test_next_fire_matches_the_reference(expr, tz, start, end):
    expected = reference(expr, tz, start, end)
    schedule = CronSchedule(expr, tz)
    chained, t = [], start - timedelta(seconds=1)
    while (t := schedule.next_fire(t)) < end:
        chained.append(t)
    assert chained == expected
    # From arbitrary instants (re-seeded, sometimes inside a fold), on a fresh schedule too.
    fresh = CronSchedule(expr, tz)
    for after in [start + timedelta(minutes=m, seconds=7) for m in range(0, 2880, 37)]:
        want = next((f for f in expected if f > after), None)
        if want is not None:
            assert schedule.next_fire(after) == want, after
            assert CronSchedule(expr, tz).next_fire(after) == want, after
            assert fresh.next_fire(after) == want, after


# --- caching ------------------------------------------------------------------------------------


def test_cached_iterator_gives_the_same_answers_in_any_order():
    schedule = CronSchedule("*/5 * * * *", "Europe/Paris")
    first = schedule.next_fire(NOW)
    assert first == z("2026-11-21T12:05")
    assert schedule.next_fire(first) == z("2026-11-21T12:10")  # the common, cached step
    assert schedule.next_fire(z("2026-11-21T12:07")) == z("2026-11-21T12:10")  # inside the window
    assert schedule.next_fire(z("2026-11-21T12:10")) == z("2026-11-21T12:15")  # one step ahead
    assert schedule.next_fire(z("2026-11-21T12:16")) == z("2026-11-21T12:20")  # just past
    assert schedule.next_fire(z("2026-11-21T15:00")) == z("2026-11-21T15:05")  # a jump
    assert schedule.next_fire(NOW) == first  # backwards
    assert schedule.next_fire(z("2026-11-21T12:04:59.999999")) == first


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (datetime(2026, 11, 22, 9, 0, tzinfo=UTC), "2026-11-23T09:00Z"),  # strictly after
        (datetime(2026, 11, 22, 9, 0, 0, 1, tzinfo=UTC), "2026-11-23T09:00Z"),
        (datetime(2026, 11, 22, 8, 59, 59, 999999, tzinfo=UTC), "2026-11-22T09:00Z"),
        (datetime(2026, 11, 22, 10, 0, tzinfo=timezone(timedelta(hours=1))), "2026-11-23T09:00Z"),
        (datetime(2026, 11, 22, 8, 0), "2026-11-22T09:00Z"),  # naive is UTC
    ],
)
def test_next_fire_is_strictly_after_and_utc(after, expected):
    fire = CronSchedule("0 9 * * *").next_fire(after)
    assert fire.tzinfo is UTC
    assert fire.strftime("%Y-%m-%dT%H:%MZ") == expected


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("", "it is empty"),
        ("0 9 * *", "expected 5 fields (minute hour day-of-month month day-of-week), got 4"),
        (
            "0 0 9 * * *",
            "expected 5 fields (minute hour day-of-month month day-of-week), got 6; "
            "seconds and years are not supported",
        ),
        ("61 * * * *", "minute 61 is out of range 0-59"),
        ("0 24 * * *", "hour 24 is out of range 0-23"),
        ("0 0 0 * *", "day of month 0 is out of range 1-31"),
        ("0 0 * 13 *", "month 13 is out of range 1-12"),
        ("0 0 * * 8", "day of week 8 is out of range 0-7"),
        ("*/0 * * * *", "minute step '0' must be a positive number"),
        ("a * * * *", "minute 'a' is not a number"),
        ("0 0 * foo *", "month 'foo' is not a number or a name"),
        ("0 0 ; * *", "day of month ';' has unexpected characters"),
        ("H * * * *", "hashed (H) and random (R) fields are not supported"),
        ("R 9 * * *", "hashed (H) and random (R) fields are not supported"),
        ("0 0 30 2 *", "it never fires"),
        ("@reboot", "unsupported macro (use @yearly, @monthly, @weekly, @daily or @hourly)"),
    ],
)
def test_bad_cron_expressions(expr, why):
    with pytest.raises(InvalidArgument) as info:
        CronSchedule(expr, "Europe/Paris")
    assert str(info.value) == f"bad cron expression {expr!r}: {why}"
    assert info.value.field == "cron"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Mars/Base", "unknown timezone 'Mars/Base'"),
        ("", "unknown timezone ''"),
        ("../../etc/passwd", "unknown timezone '../../etc/passwd'"),
        ("UTC+15:00", "timezone 'UTC+15:00' is out of range: offsets go from -12:00 to +14:00"),
    ],
)
def test_unknown_timezones(name, message):
    with pytest.raises(InvalidArgument) as info:
        CronSchedule("0 9 * * *", name)
    assert str(info.value) == message
    assert info.value.field == "timezone"


@pytest.mark.parametrize(
    ("name", "offset"),
    [
        ("UTC", timedelta(0)),
        ("UTC+02:00", timedelta(hours=2)),
        ("UTC-05:30", timedelta(hours=-5, minutes=-30)),
        ("Asia/Kolkata", timedelta(hours=5, minutes=30)),
    ],
)
def test_resolve_timezone(name, offset):
    assert resolve_timezone(name).utcoffset(datetime(2026, 1, 1)) == offset


@pytest.mark.parametrize(
    ("minutes", "name"), [(0, "UTC"), (120, "UTC+02:00"), (-330, "UTC-05:30"), (840, "UTC+14:00")]
)
def test_fixed_offset_name(minutes, name):
    assert fixed_offset_name(minutes) == name


@pytest.mark.parametrize(
    ("wall", "tz", "expected"),
    [
        ("2026-11-21T09:00", "Europe/Paris", "2026-11-21T08:00"),
        ("2026-03-29T02:30", "Europe/Paris", "2026-03-29T01:00"),  # gap: end of the gap
        ("2026-10-25T02:30", "Europe/Paris", "2026-10-25T00:30"),  # fold: first occurrence
        ("2026-03-08T02:15", "America/New_York", "2026-03-08T07:00"),
        ("2026-10-04T02:10", "Australia/Lord_Howe", "2026-10-03T15:30"),  # 30-minute gap
        ("2026-11-21T09:00", "UTC-05:30", "2026-11-21T14:30"),
    ],
)
def test_wall_to_utc(wall, tz, expected):
    assert wall_to_utc(datetime.fromisoformat(wall), resolve_timezone(tz)) == z(expected)


# --- describe -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "text"),
    [
        ("0 9 * * *", "Europe/Paris", "every day at 09:00 Europe/Paris"),
        ("@daily", "UTC", "every day at 00:00 UTC"),
        ("0 9,17 * * *", "UTC", "every day at 09:00 and 17:00 UTC"),
        ("0 10 * * 1", "UTC", "every Monday at 10:00 UTC"),
        ("0 10 * * MON", "UTC", "every Monday at 10:00 UTC"),
        ("0 0 * * 7", "UTC", "every Sunday at 00:00 UTC"),
        ("30 8 * * 1-5", "UTC+02:00", "every weekday at 08:30 UTC+02:00"),
        ("0 9 * * 0,6", "UTC", "every Saturday and Sunday at 09:00 UTC"),
        ("0 9 * * 5,1,3", "UTC", "every Monday, Wednesday and Friday at 09:00 UTC"),
        ("0 9 1 * *", "UTC", "every month on the 1st at 09:00 UTC"),
        ("0 9 22 * *", "UTC", "every month on the 22nd at 09:00 UTC"),
        ("0 9 13 * *", "UTC", "every month on the 13th at 09:00 UTC"),
        ("* * * * *", "UTC", "every minute"),
        ("*/5 * * * *", "Europe/Paris", "every 5 minutes"),
        ("0 * * * *", "UTC", "every hour"),
        ("15 * * * *", "UTC", "every hour at :15"),
        ("0 */2 * * *", "UTC", "every 2 hours"),
        ("30 */6 * * *", "UTC", "every 6 hours at :30"),
        ("*/15 9-17 * * 1-5", "Europe/Paris", "cron '*/15 9-17 * * 1-5' in Europe/Paris"),
        ("0 9 1 1 *", "UTC", "cron '0 9 1 1 *' in UTC"),
        ("0 9 * * 1#2", "UTC", "cron '0 9 * * 1#2' in UTC"),
    ],
)
def test_describe(expr, tz, text):
    assert CronSchedule(expr, tz).describe() == text


def test_equality_and_normalisation():
    assert CronSchedule(" 0  9 * * * ", "UTC") == CronSchedule("0 9 * * *", "UTC")
    assert CronSchedule("@hourly").expr == "0 * * * *"
    assert CronSchedule("0 9 * * *", "UTC") != CronSchedule("0 9 * * *", "Europe/Paris")
    assert len({CronSchedule("0 9 * * *"), CronSchedule("0 9 * * *")}) == 1
    assert (
        repr(CronSchedule("0 9 * * *", "Europe/Paris"))
        == "CronSchedule('0 9 * * *', 'Europe/Paris')"
    )
