"""Cron schedules evaluated in a time zone, pure and DST-correct.

A ``CronSchedule`` is a standard five-field cron expression (``minute hour day-of-month month
day-of-week``, or one of ``@yearly @annually @monthly @weekly @daily @midnight @hourly``) read
as *wall-clock* time in one time zone: an IANA name (``"Europe/Paris"``, through ``zoneinfo``)
or a fixed offset (``"UTC"``, ``"UTC+02:00"``, ``"UTC-05:30"``, which never shift). Seconds
(six or seven fields), hashed ``H`` and random ``R`` fields are refused: a schedule must be
deterministic and minute-grained. ``next_fire`` takes and returns aware UTC datetimes.

Daylight saving time
--------------------
Twice a year some wall-clock times do not exist (spring forward) and some happen twice
(autumn back). The rules are cronie's (Vixie cron's), decided by the minute and hour fields:

==================  ==============================  ====================================
kind of job         wall time skipped (the gap)     wall time repeated (the fold)
==================  ==============================  ====================================
fixed-time          fires once, at the first        fires once, on its first occurrence
                    instant after the gap           (summer time)
wildcard            does not fire: that wall time   fires on both occurrences (they are
                    never shows on the clock        distinct instants)
==================  ==============================  ====================================

A job is *fixed-time* when its minute and hour fields are both explicit (``30 2 * * *``,
``0,30 9-17 * * 1-5``), and *wildcard* when either starts with ``*`` (``0 * * * *``,
``*/15 * * * *``, ``*/20 2 * * *``).

So a wildcard job runs once per real matching instant and never loses a real hour, and a
fixed-time job runs exactly once on a transition day. In Europe/Paris, 2026:

* ``30 2 * * *`` on 2026-03-29 (02:00 -> 03:00): once, at 03:00 CEST = 01:00Z.
* ``30 2 * * *`` on 2026-10-25 (03:00 -> 02:00): once, at 02:30 CEST = 00:30Z (not at 01:30Z).
* ``0 * * * *`` on 2026-03-29: ..., 00:00Z (01:00 CET), 01:00Z (03:00 CEST), ...: 23 runs, one
  per real hour; on 2026-10-25: 00:00Z (02:00 CEST) and 01:00Z (02:00 CET): 25 runs.
* ``30 * * * *`` on 2026-03-29: 00:30Z (01:30 CET), then 01:30Z (03:30 CEST); 02:30 never exists.

croniter 7 already moves fixed-time jobs out of the gap and fires wildcard jobs on both sides
of the fold. What it gets wrong, and is corrected here: it fires fixed-time jobs twice in the
fold (the second occurrence is dropped), and it moves a wildcard job with an explicit hour out
of the gap (``*/20 2 * * *`` would fire at 03:00; it is dropped, as cronie does).
``wall_to_utc`` applies the fixed-time rules to a single wall time.

Caching
-------
A schedule keeps one croniter iterator and the last two fires it produced. Asking for the next
fire after the previous one (the common case) or after any instant up to the next fire costs
one ``get_next``; the iterator is re-seeded only when ``after`` moves backwards or jumps
ahead by more than one fire. A schedule is therefore cheap to keep, but not to share between
threads (the runtime is single-threaded, on trio).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

from croniter import croniter
from croniter.croniter import CroniterBadDateError, CroniterError

from turnstile.runtime.clock import utc
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.timezones import (
    fixed_offset_name,
    resolve_timezone,
)

__all__ = ["CronSchedule", "resolve_timezone", "fixed_offset_name", "wall_to_utc"]

_FIELD = re.compile(r"[0-9A-Za-z*/,\-#?]+")
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_RANGES: tuple[tuple[str, int, int], ...] = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
_NAMES = {
    "month": {"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"},
    "day of week": {"sun", "mon", "tue", "wed", "thu", "fri", "sat"},
}
_DAY_NAMES = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
# A reference instant for validating expressions, so that construction never reads the clock.
_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)
_MAX_SKIPS = 100


def wall_to_utc(wall: datetime, tz: tzinfo) -> datetime:
    """The UTC instant at which the clocks of ``tz`` show the naive ``wall`` time.

    With the same rules as fixed-time cron jobs: a repeated wall time means its first
    occurrence, and a skipped one the first instant after the gap (``2026-03-29 02:30`` in
    Europe/Paris is 01:00Z, when the clocks show 03:00).
    """
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # In the gap: the two folds straddle the transition; find it to the second.
    other = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    lo, hi = min(first, other), max(first, other)
    after = hi.astimezone(tz).utcoffset()
    lo_s, hi_s = 0, int((hi - lo).total_seconds())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if (lo + timedelta(seconds=mid)).astimezone(tz).utcoffset() == after:
            hi_s = mid
        else:
            lo_s = mid
    return lo + timedelta(seconds=hi_s)


def _bad(expr: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"bad cron expression {expr!r}: {why}", field="cron")


def _normalize(expr: str) -> str:
    """``expr`` as five single-spaced fields, or InvalidArgument saying why it cannot be."""
    text = " ".join(expr.split())
    if not text:
        raise _bad(expr, "it is empty")
    if text.startswith("@"):
        if text.lower() not in _MACROS:
            raise _bad(
                expr, "unsupported macro (use @yearly, @monthly, @weekly, @daily or @hourly)"
            )
        return _MACROS[text.lower()]
    fields = text.split(" ")
    if len(fields) != 5:
        why = f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}"
        if len(fields) in (6, 7):
            why += "; seconds and years are not supported"
        raise _bad(expr, why)
    for field, (name, lo, hi) in zip(fields, _RANGES, strict=True):
        if not _FIELD.fullmatch(field):
            raise _bad(expr, f"{name} {field!r} has unexpected characters")
        if field[0] in "HhRr":
            raise _bad(expr, "hashed (H) and random (R) fields are not supported")
        wrong = _check_field(field, name, lo, hi)
        if wrong:
            raise _bad(expr, wrong)
    return text


def _check_field(field: str, name: str, lo: int, hi: int) -> str | None:
    """Why one field is wrong, for the mistakes people make; croniter catches the rest."""
    for part in field.split(","):
        base, _, step = part.partition("/")
        if step and not (step.isdigit() and int(step) > 0):
            return f"{name} step {step!r} must be a positive number"
        for token in base.split("#")[0].split("-"):
            if token in ("*", "?", "") or token.upper() == "L":
                continue
            if token.isdigit():
                if not lo <= int(token) <= hi:
                    return f"{name} {token} is out of range {lo}-{hi}"
            elif token.lower() not in _NAMES.get(name, ()):
                return f"{name} {token!r} is not a number" + (
                    " or a name" if name in _NAMES else ""
                )
    return None


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class CronSchedule:
    """A five-field cron expression in a time zone; see the module docstring for DST.

    Args:
        expr: the cron expression (``"0 9 * * 1-5"``, ``"@daily"``).
        timezone: an IANA name or a fixed-offset name (``"UTC+02:00"``); defaults to UTC.

    Raises:
        InvalidArgument: field ``cron`` for a bad expression (including one that never
            fires), field ``timezone`` for an unknown zone.
    """

    __slots__ = (
        "expr",
        "timezone",
        "tzinfo",
        "_fields",
        "_fixed",
        "_dst",
        "_minutes",
        "_hours",
        "_it",
        "_prev",
        "_cur",
    )

    def __init__(self, expr: str, timezone: str = "UTC") -> None:
        self.expr = _normalize(expr)
        self.timezone = timezone
        self.tzinfo = resolve_timezone(timezone)
        try:
            it = croniter(self.expr, _REFERENCE.astimezone(self.tzinfo))
            it.get_next(datetime)
        except CroniterBadDateError:
            raise _bad(expr, "it never fires") from None
        except (CroniterError, ValueError, KeyError) as exc:
            why = re.sub(r"^\[[^\]]*\]\s*", "", str(exc)).rstrip(".") or type(exc).__name__
            if why.startswith("is "):
                why = "it " + why
            raise _bad(expr, why[0].lower() + why[1:]) from None
        self._fields: list[list] = it.expanded
        minute, hour = self.expr.split(" ")[:2]
        self._fixed = not minute.startswith("*") and not hour.startswith("*")
        # Only a zone with transitions has gaps and folds; fixed offsets skip the checks.
        self._dst = isinstance(self.tzinfo, ZoneInfo)
        self._minutes = frozenset(range(60)) if minute == "*" else frozenset(self._fields[0])
        self._hours = frozenset(range(24)) if hour == "*" else frozenset(self._fields[1])
        self._it: croniter | None = None
        self._prev: datetime | None = None
        self._cur: datetime | None = None

    def __repr__(self) -> str:
        return f"CronSchedule({self.expr!r}, {self.timezone!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronSchedule):
            return NotImplemented
        return self.expr == other.expr and self.timezone == other.timezone

    def __hash__(self) -> int:
        return hash((self.expr, self.timezone))

    def next_fire(self, after: datetime) -> datetime:
        """The first fire strictly after ``after`` (aware; naive is taken as UTC), in UTC."""
        after = utc(after)
        it, prev, cur = self._it, self._prev, self._cur
        if it is not None and prev is not None and cur is not None:
            if after < cur:
                if after >= prev:
                    return cur
            else:
                nxt = self._advance(it, cur)
                if after < nxt:
                    return nxt
        # Backwards, more than one fire ahead, or the first call: start again from ``after``
        # (forgetting the last fire first, so that a stuck iterator leaves nothing half-set).
        self._prev = self._cur = None
        self._it = it = croniter(self.expr, after.astimezone(self.tzinfo))
        return self._advance(it, after)

    def _advance(self, it: croniter, cur: datetime) -> datetime:
        """Step ``it``, whose last fire (or start) is ``cur``, to the next fire the DST rules
        allow, and remember both."""
        for _ in range(_MAX_SKIPS):
            fire = it.get_next(datetime).astimezone(UTC)
            if fire <= cur:
                continue  # several wall times moved to the same end of a gap
            if self._dst:
                local = fire.astimezone(self.tzinfo)
                if self._fixed:
                    if local.fold:
                        continue  # the repeat of a fixed wall time in the autumn fold
                elif local.minute not in self._minutes or local.hour not in self._hours:
                    continue  # a wildcard wall time croniter moved out of the gap
            self._prev, self._cur = cur, fire
            return fire
        raise RuntimeError(f"croniter is stuck on {self.expr!r} after {cur.isoformat()}")

    def describe(self) -> str:
        """A short English rendering (``"every day at 09:00 Europe/Paris"``), or the raw cron."""
        minute, hour, dom, month, dow = self.expr.split(" ")
        ex_hour, ex_dow = self._fields[1], self._fields[4]
        every_day = dom in ("*", "?") and month == "*"
        if every_day and dow in ("*", "?"):
            if hour == "*":
                if minute == "*":
                    return "every minute"
                step = re.fullmatch(r"\*/(\d+)", minute)
                if step:
                    n = int(step[1])
                    return "every minute" if n == 1 else f"every {n} minutes"
                if minute.isdigit():
                    return "every hour" if int(minute) == 0 else f"every hour at :{minute:0>2}"
            step = re.fullmatch(r"\*/(\d+)", hour)
            if step and minute.isdigit():
                n, m = int(step[1]), int(minute)
                text = "every hour" if n == 1 else f"every {n} hours"
                return text + (f" at :{m:02d}" if m else "")
        if not (minute.isdigit() and re.fullmatch(r"\d+(,\d+)*", hour)):
            return self._raw()
        times = " and ".join(f"{h:02d}:{int(minute):02d}" for h in ex_hour)
        at = f"at {times} {self.timezone}"
        if every_day and dow in ("*", "?"):
            return f"every day {at}"
        if every_day and "#" not in dow and "l" not in dow.lower():
            days = sorted({int(d) % 7 for d in ex_dow}, key=lambda d: (d + 6) % 7)  # Monday first
            if days == [1, 2, 3, 4, 5]:
                return f"every weekday {at}"
            names = [_DAY_NAMES[d] for d in days]
            joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            return f"every {joined} {at}"
        if dom.isdigit() and month == "*" and dow in ("*", "?"):
            return f"every month on the {_ordinal(int(dom))} {at}"
        return self._raw()

    def _raw(self) -> str:
        return f"cron {self.expr!r} in {self.timezone}"
