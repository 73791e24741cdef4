"""The forms ``timeexpr.parse_when`` tries, in order (``FORMS``), and the ``When`` they make.

Internal to ``timeexpr`` (import from there), whose docstring is the grammar. Each form takes
the parse's context and the normalised text, and returns a ``When``, or None when the text is
not of its form, or raises ``InvalidArgument`` when it is but means something unusable.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo
from decimal import Decimal
from fractions import Fraction
from typing import Literal

import msgspec

from turnstile.actors.scheduling._timewords import (
    _CRON_FIRST,
    _CRON_TOKEN,
    _DAILY_ALONE,
    _DATED,
    _DAY,
    _DAY_NAMES,
    _DAYS_WORDS,
    _EVERY,
    _HALF_HOUR,
    _INTERVAL,
    _ISO,
    _MONTH_DAY,
    _MONTH_DAY_SUFFIXED,
    _QUARTER_OF,
    _REL_PART,
    _REL_PREFIX,
    _REL_SEP,
    _TIME_ANYWHERE,
    _TIME_FIRST,
    _TIME_LAST,
    _UNIT_SECONDS,
    _WEEKDAY_LIST,
    _WEEKDAY_WORD,
    _amount,
    _time_of_day,
    _weekday,
)
from turnstile.actors.scheduling.cronexpr import CronSchedule, wall_to_utc
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.timezones import fixed_offset_name

__all__ = ["FORMS", "MAX_YEARS_AHEAD", "When"]

MAX_YEARS_AHEAD = 10

_NEEDS_TIME = "needs a time of day: add one, e.g. 'at 9am'"


class When(msgspec.Struct, frozen=True, kw_only=True):
    """How a time expression was understood.

    Attributes:
        kind: ``"once"`` (``run_at`` is set) or ``"cron"`` (``cron`` and ``next_run`` are set).
        description: the reading, for echoing back
            (``"every Monday at 10:00 Europe/Paris — next 2026-11-23T09:00:00Z"``).
        timezone: the zone wall times were read in: an IANA name, ``"UTC"`` or ``"UTC+02:00"``.
        run_at: the instant, aware UTC (``once``).
        cron: a five-field cron expression, to be evaluated in ``timezone`` (``cron``).
        next_run: the first fire after ``now``, aware UTC (``cron``).
    """

    kind: Literal["once", "cron"]
    description: str
    timezone: str
    run_at: datetime | None = None
    cron: str | None = None
    next_run: datetime | None = None


# --- helpers ------------------------------------------------------------------------------------


class _Context:
    __slots__ = ("raw", "now", "tz", "tz_name", "local_now")

    def __init__(self, raw: str, now: datetime, tz: tzinfo, tz_name: str) -> None:
        self.raw, self.now, self.tz, self.tz_name = raw, now, tz, tz_name
        self.local_now = now.astimezone(tz)

    def error(self, why: str) -> InvalidArgument:
        return InvalidArgument(f"{self.raw!r} {why}", field="when")

    def once(self, run_at: datetime, understood: str) -> When:
        """A one-off ``When``, refused if it is not in the future or too far in it."""
        run_at = run_at.astimezone(UTC)
        if run_at <= self.now:
            raise self.error(f"is in the past (now is {_iso_z(self.now)})")
        if run_at > _years_after(self.now, MAX_YEARS_AHEAD):
            raise self.error(f"is more than {MAX_YEARS_AHEAD} years away")
        return When(
            kind="once",
            run_at=run_at,
            timezone=self.tz_name,
            description=f"{understood} — {_iso_z(run_at)}",
        )

    def cron(self, expr: str) -> When:
        try:
            schedule = CronSchedule(expr, self.tz_name)
        except InvalidArgument as exc:
            raise InvalidArgument(str(exc), field="when") from None
        next_run = schedule.next_fire(self.now)
        return When(
            kind="cron",
            cron=schedule.expr,
            timezone=self.tz_name,
            next_run=next_run,
            description=f"{schedule.describe()} — next {_iso_z(next_run)}",
        )


def _iso_z(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _years_after(dt: datetime, years: int) -> datetime:
    try:
        return dt.replace(year=dt.year + years)
    except ValueError:  # 29 February
        return dt.replace(year=dt.year + years, day=28)


def _duration(seconds: int) -> str:
    """``8100`` -> ``"2h 15m"``."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts)


def _clock(t: tuple[int, int, int]) -> str:
    h, m, s = t
    return f"{h:02d}:{m:02d}" + (f":{s:02d}" if s else "")


# --- the forms, tried in order; each returns None when the text is not of its form -------------


def _iso(ctx: _Context, s: str) -> When | None:
    if not _ISO.fullmatch(ctx.raw):
        return None
    if len(ctx.raw) == 10:
        raise ctx.error(f"has no time of day: add one, e.g. '{ctx.raw}T09:00'")
    try:
        dt = datetime.fromisoformat(re.sub(r"\s(?=[Z+-])", "", ctx.raw.upper()))
    except ValueError as exc:
        raise ctx.error(f"is not a valid date: {exc}") from None
    wall = f"{dt:%Y-%m-%d} {_clock((dt.hour, dt.minute, dt.second))}"
    delta = dt.utcoffset()  # None exactly when the text gave no offset
    if delta is None:
        return ctx.once(wall_to_utc(dt, ctx.tz), f"{wall} {ctx.tz_name}")
    offset = int(delta.total_seconds() // 60)
    return ctx.once(dt, f"{wall} {fixed_offset_name(offset)}")


def _cron(ctx: _Context, s: str) -> When | None:
    tokens = ctx.raw.split(" ")
    if ctx.raw.startswith("@") and len(tokens) == 1:
        return ctx.cron(ctx.raw)
    if not 5 <= len(tokens) <= 7 or not _CRON_FIRST.fullmatch(tokens[0]):
        return None
    if not all(_CRON_TOKEN.fullmatch(t) for t in tokens):
        return None
    return ctx.cron(ctx.raw)


def _relative(ctx: _Context, s: str) -> When | None:
    body = _REL_PREFIX.sub("", s, count=1)
    total, pos, parts, bare, french = Fraction(0), 0, 0, False, False
    while pos < len(body):
        if parts:
            sep = _REL_SEP.match(body, pos)  # it also matches nothing: never None in practice
            pos = pos if sep is None else sep.end()
        m = _REL_PART.match(body, pos)
        if m is None:
            return None
        if m["hhmm"]:
            total += int(m["hh"]) * 3600 + int(m["mm"]) * 60
            bare = True  # "3h30" alone could be a delay or a time of day
        else:
            if m["n"] is None and m["frac"] is None:
                return None  # "hour" alone is no delay
            count = _amount(m)
            unit = next(key for key in _UNIT_SECONDS if m[key])
            total += count * _UNIT_SECONDS[unit]
            # "3h" alone could be a delay or a time of day, and so could "3 heures et demie"
            french = bool(m["extra"]) and m["extra"].startswith(("et", "trois"))
            plain_h = m["h"] == "h" and (m["n"] or "").isdigit() and not m["extra"]
            bare = bool(m["h"]) and (plain_h or french)
        pos, parts = m.end(), parts + 1
    if not parts:
        return None
    if parts == 1 and body == s and bare:
        at, in_ = ("à", "dans") if french else ("at", "in")
        raise ctx.error(
            f"is ambiguous: say '{in_} {ctx.raw}' for a delay or '{at} {ctx.raw}' for a time of day"
        )
    if total == 0:
        raise ctx.error("is a delay of zero: give a delay in the future, e.g. 'in 5m'")
    if total > (_years_after(ctx.now, MAX_YEARS_AHEAD) - ctx.now).total_seconds():
        raise ctx.error(f"is more than {MAX_YEARS_AHEAD} years away")  # before timedelta overflows
    if total.denominator != 1:
        exact = Decimal(total.numerator) / Decimal(total.denominator)
        raise ctx.error(
            f"is not a whole number of seconds ({exact}s): delays are counted in seconds"
        )
    seconds = int(total)
    return ctx.once(ctx.now + timedelta(seconds=seconds), f"in {_duration(seconds)}")


def _interval(ctx: _Context, s: str) -> When | None:
    m = _INTERVAL.fullmatch(s)
    if m is None:
        return None
    if m["hourly"]:
        return ctx.cron("0 * * * *")
    count = _amount(m)
    if count == 0:
        raise ctx.error("is not a valid interval: it must be at least 1")
    if m["s"]:
        raise ctx.error("is too frequent: a cron schedule fires at most once a minute")
    if (m["d"] or m["w"]) and count.denominator == 1:
        if m["n"] is None and m["frac"] is None and m["d"]:
            raise ctx.error(_NEEDS_TIME)
        raise ctx.error(
            "cannot be kept regular by cron: say which days, e.g. 'every Monday at 10am', "
            "or give a cron expression"
        )
    unit = next(key for key in _UNIT_SECONDS if m[key])
    seconds = count * _UNIT_SECONDS[unit]  # "every half hour", "every 0.5 days"...
    if seconds < 60:
        raise ctx.error("is too frequent: a cron schedule fires at most once a minute")
    if seconds % 60:
        raise ctx.error("is not a whole number of minutes: cron schedules fire on whole minutes")
    n = int(seconds // 60)
    if n < 60:
        if 60 % n:
            raise ctx.error(
                f"would drift at the hour: {n} does not divide 60; use a cron expression "
                f"(e.g. '*/{n} * * * *') if that is what you want"
            )
        return ctx.cron("* * * * *" if n == 1 else f"*/{n} * * * *")
    if n % 60:
        raise ctx.error(
            "cannot be kept regular by cron: use minutes that divide 60, hours that divide "
            "24, or a cron expression"
        )
    n //= 60
    if n == 1:
        return ctx.cron("0 * * * *")
    if n >= 24:
        raise ctx.error("is a day or more: say when, e.g. 'every day at 9am', or give a cron")
    if 24 % n:
        raise ctx.error(
            f"would drift at midnight: {n} does not divide 24; use a cron expression "
            f"(e.g. '0 */{n} * * *') if that is what you want"
        )
    return ctx.cron(f"0 */{n} * * *")


def _with_time(ctx: _Context, s: str) -> When | None:
    """Forms built of a day part (possibly empty or recurring) and a time of day."""
    m = _TIME_LAST.search(s)
    if m is not None:
        head = s[: m.start()].strip(" ,")
    else:
        m = _TIME_FIRST.match(s)
        head = m["rest"].strip(" ,") if m is not None else s
    if m is None:
        # No time of day: say so if the rest is a day we know, else let others try.
        if _DAY.fullmatch(head) or _recurring_days(head) is not None:
            raise ctx.error(_NEEDS_TIME)
        return None
    if head in ("", "at", "a", "@", "vers"):
        return _at_time(ctx, _time_of_day(m), None)
    day = _DAY.fullmatch(head)
    if day is not None:
        return _at_time(ctx, _time_of_day(m), day)
    days = _recurring_days(head)
    if days is not None:
        h, mi, sec = _time_of_day(m)
        if sec:
            raise ctx.error("has seconds: cron schedules fire on whole minutes")
        dom, dow = days
        return ctx.cron(f"{mi} {h} {dom} * {dow}")
    return None


def _recurring_days(head: str) -> tuple[str, str] | None:
    """(day-of-month, day-of-week) cron fields for "every Monday", "tous les jours"...; or None."""
    if head in _DAILY_ALONE:
        return "*", _DAILY_ALONE[head]
    m = _MONTH_DAY.fullmatch(head)
    if m is not None and (
        head.startswith(("every", "each", "chaque", "tous", "toutes", "monthly"))
        or _MONTH_DAY_SUFFIXED.search(head)
    ):
        dom = int(m["dom"])
        if not 1 <= dom <= 31:
            raise InvalidArgument(f"day {dom} is not a day of the month", field="when")
        if dom > 28:
            raise InvalidArgument(
                f"day {dom} is not in every month, so some months would be skipped: use a cron "
                f"expression (e.g. '0 9 {dom} * *') if that is what you want",
                field="when",
            )
        return str(dom), "*"
    m = re.fullmatch(rf"{_EVERY}\s(?P<what>.+)", head)
    if m is None:
        return None
    what = m["what"]
    if what in _DAYS_WORDS:
        return "*", _DAYS_WORDS[what]
    if _WEEKDAY_LIST.fullmatch(what):
        days = {_weekday(w) for w in _WEEKDAY_WORD.findall(what)}
        cron_days = sorted((d + 1) % 7 for d in days)
        return "*", ",".join(map(str, cron_days))
    return None


def _at_time(ctx: _Context, t: tuple[int, int, int], day: re.Match | None) -> When:
    """A one-off at time of day ``t`` on the day ``day`` names (None: the next such time)."""
    today = ctx.local_now.date()
    h, mi, sec = t

    def at(date) -> datetime:
        return wall_to_utc(datetime(date.year, date.month, date.day, h, mi, sec), ctx.tz)

    at_clock = f"at {_clock(t)} {ctx.tz_name}"
    if day is None:
        if at(today) > ctx.now:
            return ctx.once(at(today), f"today {at_clock}")
        return ctx.once(at(today + timedelta(days=1)), f"tomorrow {at_clock}")
    if day["today"]:
        return ctx.once(at(today), f"today {at_clock}")
    if day["tomorrow"]:
        return ctx.once(at(today + timedelta(days=1)), f"tomorrow {at_clock}")
    if day["after"]:
        return ctx.once(at(today + timedelta(days=2)), f"the day after tomorrow {at_clock}")
    if day["date"]:
        try:
            date = datetime.strptime(day["date"], "%Y-%m-%d").date()
        except ValueError as exc:
            raise ctx.error(f"is not a valid date: {exc}") from None
        return ctx.once(at(date), f"{date.isoformat()} {at_clock}")
    wd = _weekday(day["wd"])
    ahead = (wd - today.weekday()) % 7
    if day["next"] or day["prochain"]:
        ahead = ahead or 7
        return ctx.once(at(today + timedelta(days=ahead)), f"next {_DAY_NAMES[wd]} {at_clock}")
    if ahead == 0 and at(today) <= ctx.now:
        ahead = 7
    return ctx.once(at(today + timedelta(days=ahead)), f"{_DAY_NAMES[wd]} {at_clock}")


def _ambiguous(ctx: _Context, s: str) -> When | None:
    """Clock phrases that mean different times to different readers: refused, never guessed,
    when the rest of the text is a time expression (``tomorrow at half 4``)."""
    for pattern in (_HALF_HOUR, _QUARTER_OF):
        m = pattern.search(s)
        if m is None:
            continue
        said, start, end = m["said"], m.start("said"), m.end("said")
        if not _is_time_with(ctx, f"{s[:start]}noon{s[end:]}"):
            continue
        if pattern is _QUARTER_OF:
            h = m["h"]
            raise ctx.error(
                f"is ambiguous: '{said}' is a quarter to {h} in American English, and not to "
                f"every reader; say 'a quarter to {h}' or 'a quarter past {h}'"
            )
        # "half 4" is 4:30 in British English, 3:30 in German, Dutch or Scandinavian usage
        hour = said.removeprefix("half ")
        before = f"{(int(m['h']) - 1) % 24 or 12}{hour[len(m['h']) :]}"
        raise ctx.error(
            f"is ambiguous: '{said}' is half past {hour} in British English but half past "
            f"{before} in some other languages; say 'half past {hour}' or 'half past {before}'"
        )
    return None


def _is_time_with(ctx: _Context, s: str) -> bool:
    """Whether ``s`` (the text with a stand-in time of day) is a time expression."""
    if _DATED.search(s):
        return True
    try:
        return _with_time(ctx, s) is not None
    except InvalidArgument:  # a time, refused for another reason (today at noon, in the past)
        return True


def _dateparser(ctx: _Context, s: str) -> When | None:
    """Dates with a day number and a month name, through dateparser, guarded."""
    if not _DATED.search(s):
        return None
    time = _TIME_ANYWHERE.search(s)
    if time is None:
        raise ctx.error(f"has no time of day: add one, e.g. '{ctx.raw} at 9am'")
    import dateparser  # slow to import, and rarely needed

    # dateparser is given the time of day as we read it ("half past 4pm" -> "16:30"): it does
    # not know every form we do, and would drop what it does not know rather than fail.
    text, (start, end) = ctx.raw, time.span("t")
    clock = _clock(_time_of_day(time))
    if text[start:end].lower() == time["t"]:  # else normalising moved it: leave the text be
        text = f"{text[:start]}{clock}{text[end:]}"
    local_now = ctx.local_now.replace(tzinfo=None)
    found = dateparser.parse(
        text,
        languages=["en", "fr"],
        settings={
            "RELATIVE_BASE": local_now,
            "PREFER_DATES_FROM": "future",
            "RETURN_AS_TIMEZONE_AWARE": True,
            "TIMEZONE": ctx.tz_name,
        },
    )
    if found is None or found.replace(tzinfo=None) == local_now:
        return None
    wall = found.replace(tzinfo=None)
    understood = f"{wall:%Y-%m-%d} at {_clock((wall.hour, wall.minute, wall.second))}"
    delta = found.utcoffset()  # never None: RETURN_AS_TIMEZONE_AWARE
    # Read the wall time with our DST rules, unless the text named another zone.
    ours = {wall.replace(tzinfo=ctx.tz, fold=f).utcoffset() for f in (0, 1)}
    if delta is None or delta in ours:
        return ctx.once(wall_to_utc(wall, ctx.tz), f"{understood} {ctx.tz_name}")
    offset = int(delta.total_seconds() // 60)
    return ctx.once(found, f"{understood} {fixed_offset_name(offset)}")


#: Every form, in the order ``parse_when`` tries them.
FORMS = (_iso, _cron, _relative, _interval, _with_time, _ambiguous, _dateparser)
