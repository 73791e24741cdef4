"""A deterministic parser of time expressions, in English and French; no model involved.

``parse_when(text, now=..., timezone=...)`` turns what a user or an agent wrote into a ``When``:
either one instant (``kind="once"``, ``run_at`` in UTC) or a cron schedule (``kind="cron"``,
with ``next_run``), plus a ``description`` that says how the text was understood, so it can be
echoed back (``"tomorrow at 09:00 UTC — 2026-11-22T09:00:00Z"``). It never reads the clock:
``now`` is always given. Input is matched case- and accent-insensitively.

Grammar (``T`` is a time of day: ``9am``, ``9:30pm``, ``17:30``, ``9h``, ``17h30``, ``noon``,
``midnight``, ``midi``, ``minuit``; ``D`` a weekday: ``monday``/``mon``/``lundi``...)

==================================  =====================================================
form                                examples
==================================  =====================================================
relative delay                      ``in 5m``, ``5m``, ``2h 15m``, ``in 2h15m``, ``in 3 hours``,
                                    ``in 90 seconds``, ``in 2 weeks``, ``in an hour``,
                                    ``dans 30 minutes``, ``dans 1 jour``, ``dans 1h30``
day and time                        ``tomorrow at 9am``, ``tomorrow 9:30``, ``today at 17:30``,
                                    ``next Monday at 10am``, ``on Friday at 8pm``,
                                    ``demain à 9h30``, ``aujourd'hui à 18h``,
                                    ``lundi prochain à 10h``, ``2026-11-22 at 9am``,
                                    ``9am tomorrow``
time alone                          ``at 17:30``, ``17:30``, ``à 17h30``
ISO 8601                            ``2026-11-22T09:00:00Z``, ``2026-11-22T09:00:00+01:00``,
                                    ``2026-11-22T09:00``, ``2026-11-22 09:00``
a date with a month name            ``November 22 at 9am``, ``le 22 novembre à 9h``
                                    (through ``dateparser``, guarded; see below)
every N minutes / hours             ``every 5 minutes``, ``every hour``, ``every 2 hours``,
                                    ``hourly``, ``toutes les 5 minutes``, ``toutes les heures``
every day / weekday / D at T        ``every day at 9am``, ``daily at 9am``,
                                    ``every weekday at 8:30``, ``every weekend at 10am``,
                                    ``every Monday and Thursday at 10am``,
                                    ``tous les jours à 9h``, ``tous les lundis à 10h``,
                                    ``chaque lundi à 10h``, ``en semaine à 8h30``
every month on day N at T           ``every month on the 1st at 9am``, ``monthly on the 15th
                                    at 9am``, ``tous les mois le 1er à 9h``,
                                    ``le 1er de chaque mois à 9h``
raw cron (five fields)              ``0 9 * * *``, ``*/15 9-17 * * 1-5``, ``@daily``
==================================  =====================================================

Choices worth knowing:

* A bare ``9h`` or ``17h30`` is refused as ambiguous (a delay in English, a time of day in
  French): ``in 9h``/``dans 9h`` is a delay, ``at 9h``/``à 9h`` a time. ``5m`` and ``2h 15m``
  are delays.
* A time alone (``at 17:30``) means today if that is still in the future, else tomorrow.
  ``today at T`` in the past is an error, not tomorrow.
* ``on Friday``/``Friday`` means today if today is Friday and the time is still ahead, else the
  coming Friday; ``next Friday``/``vendredi prochain`` is the first Friday after today.
* Days and weeks in delays are exact multiples of 24 hours, whatever DST does.
* ``every N minutes`` needs N to divide 60 and ``every N hours`` N to divide 24, otherwise the
  runs would drift at the hour or at midnight; such schedules need an explicit cron.
* Errors are ``InvalidArgument`` with ``field="when"`` (``"timezone"`` or
  ``"timezone_offset"`` for those arguments) and say why: empty or over-long text, a time of
  day that does not exist (``25:00``), a zero delay, an instant in the past or more than ten
  years away. Nothing silently becomes "now".

Time zones: ``timezone`` (an IANA name) or ``timezone_offset`` (``"+02:00"``, ``"-05:30"``,
from -12:00 to +14:00, named ``"UTC+02:00"``), never both; neither means UTC. Wall times (days,
times of day, ISO without an offset, cron fields) are read in that zone; an ISO offset or ``Z``
wins over it. A wall time that does not exist (spring forward) means the first instant after
the gap, and one that happens twice (autumn back) its first occurrence: the rules of
fixed-time cron jobs, which ``runtime.cronexpr`` documents with the rest of cron's DST
behaviour.

``dateparser`` is only a fallback for dates written with a day number and a month name, which
the grammar above does not cover. It is called with ``RELATIVE_BASE`` set to ``now`` (so it
never reads the clock either) and its answer is rejected when the text has no time of day,
or when it is ``now`` itself or in the past, which is what it returns for much garbage.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Literal

import msgspec

from turnstile.actors.scheduling.cronexpr import CronSchedule, wall_to_utc
from turnstile.runtime.clock import utc
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.timezones import (
    MAX_OFFSET_MINUTES,
    MIN_OFFSET_MINUTES,
    fixed_offset_name,
    resolve_timezone,
)

__all__ = ["When", "parse_when", "MAX_LENGTH"]

MAX_LENGTH = 200
MAX_YEARS_AHEAD = 10

_NEEDS_TIME = "needs a time of day: add one, e.g. 'at 9am'"
HINT = "try 'in 5m', 'tomorrow at 9am', 'every Monday at 10am', a cron expression or ISO 8601"


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


# --- vocabulary ---------------------------------------------------------------------------------

_UNIT_SECONDS = {
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
}
_UNITS = (
    ("w", r"weeks?|wks?|w|semaines?|sem"),
    ("d", r"days?|d|jours?|j"),
    ("h", r"hours?|hrs?|h|heures?"),
    ("m", r"minutes?|mins?|mn|m"),
    ("s", r"seconds?|secs?|s|secondes?"),
)
_UNIT = "|".join(f"(?P<{key}>{alt})" for key, alt in _UNITS)
_ONE = {"a": 1, "an": 1, "one": 1, "un": 1, "une": 1}
_WEEKDAYS = {
    # name: Python weekday (Monday is 0)
    "monday": 0, "mon": 0, "lundi": 0,
    "tuesday": 1, "tue": 1, "tues": 1, "mardi": 1,
    "wednesday": 2, "wed": 2, "mercredi": 2,
    "thursday": 3, "thu": 3, "thur": 3, "thurs": 3, "jeudi": 3,
    "friday": 4, "fri": 4, "vendredi": 4,
    "saturday": 5, "sat": 5, "samedi": 5,
    "sunday": 6, "sun": 6, "dimanche": 6,
}  # fmt: skip
_DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_WEEKDAY = "(?:" + "|".join(sorted(_WEEKDAYS, key=len, reverse=True)) + ")s?"
_MONTHS = (
    r"jan(?:uary|vier)?|feb(?:ruary)?|fevr?(?:ier)?|mar(?:ch|s)?|apr(?:il)?|avr(?:il)?|may|mai"
    r"|june?|juin|july?|juil(?:let)?|aug(?:ust)?|aout|sept?(?:ember|embre)?|oct(?:ober|obre)?"
    r"|nov(?:ember|embre)?|dec(?:ember|embre)?"
)

# --- patterns (on normalised text: lower case, no accents, single spaces) ----------------------

_TIME = (
    r"(?:noon|midnight|midi|minuit"
    r"|(?P<h1>\d{1,2})(?::(?P<m1>\d{2})(?::(?P<s1>\d{2}))?)?\s?(?P<ampm>am|pm|a\.m\.|p\.m\.)"
    r"|(?P<h2>\d{1,2}):(?P<m2>\d{2})(?::(?P<s2>\d{2}))?"
    r"|(?P<h3>\d{1,2})\s?h(?:\s?(?P<m3>\d{2}))?)"
)
_AT = r"(?:(?:at|a|@|vers)\s)?"
_TIME_LAST = re.compile(rf"(?:^|\s|,){_AT}(?P<t>{_TIME})$")
_TIME_FIRST = re.compile(rf"^{_AT}(?P<t>{_TIME})(?:\s|,\s?)(?:on\s)?(?P<rest>.+)$")
_TIME_ANYWHERE = re.compile(rf"(?<![\w:]){_TIME}(?![\w:])")

_REL_PREFIX = re.compile(r"^(?:in|dans|after|apres)\s")
_REL_PART = re.compile(
    rf"(?P<hhmm>(?P<hh>\d+)\s?h(?:eures?)?\s?(?P<mm>\d{{1,2}})$)"
    rf"|(?P<n>\d+|an?|one|une?)\s?(?:{_UNIT})(?![a-z])"
)
_REL_SEP = re.compile(r"\s*(?:,|\band\b|\bet\b|\+)?\s*")

_DAY = re.compile(
    rf"^(?:(?P<today>today|aujourd'hui|aujourdhui)"
    rf"|(?P<tomorrow>tomorrow|demain)"
    rf"|(?P<after>(?:the\s)?day after tomorrow|apres-demain|apres demain)"
    rf"|(?:(?P<next>next)\s|(?:on|this|ce)\s)?(?P<wd>{_WEEKDAY})(?:\s(?P<prochain>prochaine?))?"
    rf"|(?:on\s|le\s)?(?P<date>\d{{4}}-\d{{2}}-\d{{2}}))$"
)

_EVERY = r"(?:every|each|chaque|tous\sles|toutes\sles)"
_INTERVAL = re.compile(
    rf"^(?:{_EVERY}\s(?:(?P<n>\d+)\s?)?(?:{_UNIT})|(?P<hourly>hourly))$",
)
_DAYS_WORDS = {
    "day": "*", "days": "*", "jour": "*", "jours": "*",
    "weekday": "1-5", "weekdays": "1-5", "working day": "1-5", "working days": "1-5",
    "business day": "1-5", "business days": "1-5", "jour ouvre": "1-5", "jours ouvres": "1-5",
    "jours ouvrables": "1-5", "jours de semaine": "1-5", "jours de la semaine": "1-5",
    "weekend": "0,6", "weekends": "0,6", "weekend day": "0,6", "weekend days": "0,6",
    "week-end": "0,6", "week-ends": "0,6",
}  # fmt: skip
_DAILY_ALONE = {
    "daily": "*",
    "weekdays": "1-5",
    "on weekdays": "1-5",
    "en semaine": "1-5",
    "du lundi au vendredi": "1-5",
    "on weekends": "0,6",
    "le week-end": "0,6",
    "le weekend": "0,6",
}
_WEEKDAY_LIST = re.compile(rf"^{_WEEKDAY}(?:\s?(?:,|\band\b|\bet\b|&)\s?{_WEEKDAY})*$")
_WEEKDAY_WORD = re.compile(_WEEKDAY)
_MONTH_DAY = re.compile(
    rf"^(?:{_EVERY}\smonth\son\s(?:the\s)?(?:day\s)?|monthly\son\s(?:the\s)?(?:day\s)?"
    rf"|(?:{_EVERY}\smois|chaque\smois)\sle\s|le\s|the\s)"
    rf"(?P<dom>\d{{1,2}})(?:st|nd|rd|th|er|e|eme)?"
    rf"(?:\s(?:de\schaque\smois|of\s(?:every|each|the)\smonth))?$"
)
_MONTH_DAY_SUFFIXED = re.compile(r"\b(?:de\schaque\smois|of\s(?:every|each|the)\smonth)$")

_ISO = re.compile(
    r"\d{4}-\d{2}-\d{2}"
    r"(?:[Tt ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:\s?(?:[Zz]|[+-]\d{2}:?\d{2}))?)?"
)
_CRON_FIRST = re.compile(r"[\d*/,\-]+")
_CRON_TOKEN = re.compile(r"[\d*/,\-#?LW]+|[A-Za-z]{3}(?:[,\-][A-Za-z]{3})*")
_NOW_WORDS = {"now", "right now", "immediately", "maintenant", "tout de suite", "immediatement"}
_OFFSET = re.compile(r"([+-])(\d{2}):?(\d{2})")
_DATED = re.compile(
    rf"\b\d{{1,2}}(?:st|nd|rd|th|er)?\s(?:of\s)?(?:{_MONTHS})\b"
    rf"|\b(?:{_MONTHS})\.?\s\d{{1,2}}(?:st|nd|rd|th)?\b"
)


def parse_when(
    text: str,
    *,
    now: datetime,
    timezone: str | None = None,
    timezone_offset: str | None = None,
) -> When:
    """Understand ``text`` as one instant or a cron schedule; see the module docstring.

    Args:
        text: what was written, in English or French.
        now: the current instant (aware; naive is taken as UTC). Never read from the clock.
        timezone: an IANA zone for wall times; exclusive with ``timezone_offset``.
        timezone_offset: a fixed ``±HH:MM`` offset for wall times.

    Raises:
        InvalidArgument: the text cannot be understood, or means a time that cannot be used.
    """
    tz, tz_name = _resolve(timezone, timezone_offset)
    raw = " ".join(text.split())
    if not raw:
        raise InvalidArgument("time expression is empty", field="when")
    if len(raw) > MAX_LENGTH:
        raise InvalidArgument(
            f"time expression is too long ({len(raw)} characters, max {MAX_LENGTH})", field="when"
        )
    ctx = _Context(raw, utc(now), tz, tz_name)
    s = _normalize(raw)
    if s in _NOW_WORDS:
        raise ctx.error("is not in the future: give a delay, e.g. 'in 1m'")
    for parse in (_iso, _cron, _relative, _interval, _with_time, _dateparser):
        found = parse(ctx, s)
        if found is not None:
            return found
    raise InvalidArgument(f"could not understand {raw!r} as a time: {HINT}", field="when")


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


def _resolve(timezone: str | None, offset: str | None) -> tuple[tzinfo, str]:
    if timezone is not None and offset is not None:
        raise InvalidArgument("give timezone or timezone_offset, not both", field="timezone")
    if offset is not None:
        m = _OFFSET.fullmatch(offset.strip())
        if m is None:
            raise InvalidArgument(
                f"timezone offset {offset!r} is not ±HH:MM (e.g. '+02:00')",
                field="timezone_offset",
            )
        minutes = (int(m[2]) * 60 + int(m[3])) * (-1 if m[1] == "-" else 1)
        if int(m[3]) > 59 or not MIN_OFFSET_MINUTES <= minutes <= MAX_OFFSET_MINUTES:
            raise InvalidArgument(
                f"timezone offset {offset!r} is out of range: offsets go from -12:00 to +14:00",
                field="timezone_offset",
            )
        name = fixed_offset_name(minutes)
        return resolve_timezone(name), name
    name = "UTC" if timezone is None else timezone
    return resolve_timezone(name), name


def _normalize(text: str) -> str:
    """Lower case, accents and curly quotes gone, a trailing full stop dropped."""
    decomposed = unicodedata.normalize("NFKD", text.lower().replace("’", "'").replace("‘", "'"))
    return "".join(c for c in decomposed if not unicodedata.combining(c)).rstrip(".!")


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


def _time_of_day(ctx: _Context, m: re.Match) -> tuple[int, int, int]:
    """(hour, minute, second) from a ``_TIME`` match, or InvalidArgument for 25:00 and 13pm."""
    word = m["t"]
    named = {"noon": 12, "midi": 12, "midnight": 0, "minuit": 0}
    if word in named:
        return named[word], 0, 0
    if m["h1"] is not None:
        h, mi, s = int(m["h1"]), int(m["m1"] or 0), int(m["s1"] or 0)
        if not 1 <= h <= 12:
            raise InvalidArgument(
                f"{word!r} is not a valid time of day: with am/pm, hours go from 1 to 12",
                field="when",
            )
        h = h % 12 + (12 if m["ampm"].startswith("p") else 0)
    elif m["h2"] is not None:
        h, mi, s = int(m["h2"]), int(m["m2"]), int(m["s2"] or 0)
    else:
        h, mi, s = int(m["h3"]), int(m["m3"] or 0), 0
    if h > 23:
        raise InvalidArgument(
            f"{word!r} is not a valid time of day: hours go from 0 to 23", field="when"
        )
    if mi > 59 or s > 59:
        raise InvalidArgument(
            f"{word!r} is not a valid time of day: minutes and seconds go from 0 to 59",
            field="when",
        )
    return h, mi, s


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
    if dt.tzinfo is None:
        return ctx.once(wall_to_utc(dt, ctx.tz), f"{wall} {ctx.tz_name}")
    offset = int(dt.utcoffset().total_seconds() // 60)
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
    seconds, pos, parts = 0, 0, 0
    while pos < len(body):
        pos = _REL_SEP.match(body, pos).end() if parts else pos
        m = _REL_PART.match(body, pos)
        if m is None:
            return None
        if m["hhmm"]:
            seconds += int(m["hh"]) * 3600 + int(m["mm"]) * 60
        else:
            n = _ONE.get(m["n"]) or int(m["n"])
            unit = next(key for key in _UNIT_SECONDS if m[key])
            seconds += n * _UNIT_SECONDS[unit]
        pos, parts = m.end(), parts + 1
    if not parts:
        return None
    if parts == 1 and body == s and (m["hhmm"] or m["h"] == "h"):
        raise ctx.error(
            f"is ambiguous: say 'in {ctx.raw}' for a delay or 'at {ctx.raw}' for a time of day"
        )
    if seconds == 0:
        raise ctx.error("is a delay of zero: give a delay in the future, e.g. 'in 5m'")
    if seconds > (_years_after(ctx.now, MAX_YEARS_AHEAD) - ctx.now).total_seconds():
        raise ctx.error(f"is more than {MAX_YEARS_AHEAD} years away")  # before timedelta overflows
    return ctx.once(ctx.now + timedelta(seconds=seconds), f"in {_duration(seconds)}")


def _interval(ctx: _Context, s: str) -> When | None:
    m = _INTERVAL.fullmatch(s)
    if m is None:
        return None
    if m["hourly"]:
        return ctx.cron("0 * * * *")
    n = int(m["n"]) if m["n"] is not None else 1
    if n == 0:
        raise ctx.error("is not a valid interval: it must be at least 1")
    if m["s"]:
        raise ctx.error("is too frequent: a cron schedule fires at most once a minute")
    if m["m"]:
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
    elif not m["h"]:
        if m["n"] is None and m["d"]:
            raise ctx.error(_NEEDS_TIME)
        raise ctx.error(
            "cannot be kept regular by cron: say which days, e.g. 'every Monday at 10am', "
            "or give a cron expression"
        )
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
        return _at_time(ctx, _time_of_day(ctx, m), None)
    day = _DAY.fullmatch(head)
    if day is not None:
        return _at_time(ctx, _time_of_day(ctx, m), day)
    days = _recurring_days(head)
    if days is not None:
        h, mi, sec = _time_of_day(ctx, m)
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


def _weekday(word: str) -> int:
    """Python weekday of ``"monday"``, ``"lundis"``, ``"tues"``..."""
    return _WEEKDAYS[word] if word in _WEEKDAYS else _WEEKDAYS[word[:-1]]


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


def _dateparser(ctx: _Context, s: str) -> When | None:
    """Dates with a day number and a month name, through dateparser, guarded."""
    if not _DATED.search(s):
        return None
    if not _TIME_ANYWHERE.search(s):
        raise ctx.error(f"has no time of day: add one, e.g. '{ctx.raw} at 9am'")
    import dateparser  # slow to import, and rarely needed

    local_now = ctx.local_now.replace(tzinfo=None)
    found = dateparser.parse(
        ctx.raw,
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
    # Read the wall time with our DST rules, unless the text named another zone.
    if found.utcoffset() in {wall.replace(tzinfo=ctx.tz, fold=f).utcoffset() for f in (0, 1)}:
        return ctx.once(wall_to_utc(wall, ctx.tz), f"{understood} {ctx.tz_name}")
    offset = int(found.utcoffset().total_seconds() // 60)
    return ctx.once(found, f"{understood} {fixed_offset_name(offset)}")
