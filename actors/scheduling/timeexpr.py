"""A deterministic parser of time expressions, in English and French; no model involved.

``parse_when(text, now=..., timezone=...)`` turns what a user or an agent wrote into a ``When``:
either one instant (``kind="once"``, ``run_at`` in UTC) or a cron schedule (``kind="cron"``,
with ``next_run``), plus a ``description`` that says how the text was understood, so it can be
echoed back (``"tomorrow at 09:00 UTC — 2026-11-22T09:00:00Z"``). It never reads the clock:
``now`` is always given. Input is matched case- and accent-insensitively.

Grammar (``T`` is a time of day: ``9am``, ``9:30pm``, ``17:30``, ``9h``, ``17h30``,
``9 heures``, ``noon``, ``midnight``, ``midi``, ``minuit``, and half or a quarter past or to
one of those: ``half past 4``, ``a quarter to 9pm``, ``quarter past noon``, ``9 heures et
demie``, ``3 heures et quart``, ``9 heures moins le quart``, ``midi et demi``, ``minuit moins le
quart``; ``D`` a weekday: ``monday``/``mon``/``lundi``...)

==================================  =====================================================
form                                examples
==================================  =====================================================
relative delay                      ``in 5m``, ``5m``, ``2h 15m``, ``in 2h15m``, ``in 3 hours``,
                                    ``in 90 seconds``, ``in 2 weeks``, ``in an hour``,
                                    ``dans 30 minutes``, ``dans 1 jour``, ``dans 1h30``
halves, quarters, decimals          ``in half an hour``, ``in a quarter of an hour``,
                                    ``in an hour and a half``, ``in 2 and a half hours``,
                                    ``in 1.5 hours``, ``dans une demi-heure``,
                                    ``dans un quart d'heure``, ``dans une heure et demie``,
                                    ``dans 2 heures et quart``, ``dans 1,5 heure``
day and time                        ``tomorrow at 9am``, ``tomorrow 9:30``, ``today at 17:30``,
                                    ``next Monday at 10am``, ``on Friday at 8pm``,
                                    ``demain à 9h30``, ``aujourd'hui à 18h``,
                                    ``lundi prochain à 10h``, ``2026-11-22 at 9am``,
                                    ``9am tomorrow``
time alone                          ``at 17:30``, ``17:30``, ``à 17h30``, ``at half past 4pm``,
                                    ``à midi et demi``, ``à 9 heures moins le quart``
ISO 8601                            ``2026-11-22T09:00:00Z``, ``2026-11-22T09:00:00+01:00``,
                                    ``2026-11-22T09:00``, ``2026-11-22 09:00``
a date with a month name            ``November 22 at 9am``, ``le 22 novembre à 9h``
                                    (through ``dateparser``, guarded; see below)
every N minutes / hours             ``every 5 minutes``, ``every hour``, ``every 2 hours``,
                                    ``hourly``, ``every half hour``, ``every quarter hour``,
                                    ``every 0.5 hours``, ``toutes les 5 minutes``,
                                    ``toutes les heures``, ``toutes les demi-heures``,
                                    ``tous les quarts d'heure``
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
* An hour without am/pm is on the 24-hour clock, as in ``4:30``: ``half past 4`` and ``à 4
  heures et demie`` are 04:30 (the echo says so); ``half past 4pm`` or ``half past 16`` is
  16:30. A bare hour (``at 4``) is still not a time.
* Half past, a quarter past and a quarter to are clock readings on the day named: ``a quarter
  to midnight`` and ``minuit moins le quart`` are 23:45 of that day (while ``midnight`` alone
  is 00:00 at its start, as before).
* Refused as ambiguous, saying why: ``9 heures et demie``, ``une heure et demie`` or ``9h et
  quart`` with no ``dans`` or ``à`` (a delay or a time of day); ``half 4`` (4:30 in British
  English, 3:30 in German or Dutch usage) and ``quarter of 9`` (8:45 in American English), when
  the rest of the text is a time; a decimal separator followed by three digits (``1,500``,
  ``1.500``: thousands or a decimal?). ``0.125`` is not ambiguous.
* Delays count whole seconds: halves, quarters and decimals are exact (``in 1.5 hours`` is 5,400
  seconds, ``in 0.125 hours`` 7m 30s), and a delay that does not come to whole seconds
  (``in half a second``, ``in 1.23456 hours``) is refused, never rounded. Numbers are digits,
  ``a``/``an``/``one``/``un``/``une``: ``two and a half hours`` is not read.
* A time alone (``at 17:30``) means today if that is still in the future, else tomorrow.
  ``today at T`` in the past is an error, not tomorrow.
* ``on Friday``/``Friday`` means today if today is Friday and the time is still ahead, else the
  coming Friday; ``next Friday``/``vendredi prochain`` is the first Friday after today.
* Days and weeks in delays are exact multiples of 24 hours, whatever DST does.
* ``every N minutes`` needs N to divide 60 and ``every N hours`` N to divide 24, otherwise the
  runs would drift at the hour or at midnight; such schedules need an explicit cron. A
  fractional interval is converted first and follows the same rules: ``every half hour`` is
  every 30 minutes, ``every 1.5 hours`` is refused as ``every 90 minutes`` is, and one that is
  not whole minutes (``every 2.5 minutes``) is refused.
* Errors are ``InvalidArgument`` with ``field="when"`` (``"timezone"`` or
  ``"timezone_offset"`` for those arguments) and say why: empty or over-long text, a time of
  day that does not exist (``25:00``), a zero delay, an instant in the past or more than ten
  years away. Nothing silently becomes "now".

Time zones: ``timezone`` (an IANA name) or ``timezone_offset`` (``"+02:00"``, ``"-05:30"``,
from -12:00 to +14:00, named ``"UTC+02:00"``), never both; neither means UTC. Wall times (days,
times of day, ISO without an offset, cron fields) are read in that zone; an ISO offset or ``Z``
wins over it. A wall time that does not exist (spring forward) means the first instant after
the gap, and one that happens twice (autumn back) its first occurrence: the rules of
fixed-time cron jobs, which ``actors.scheduling.cronexpr`` documents with the rest of cron's DST
behaviour.

``dateparser`` is only a fallback for dates written with a day number and a month name, which
the grammar above does not cover. It is called with ``RELATIVE_BASE`` set to ``now`` (so it
never reads the clock either) and its answer is rejected when the text has no time of day,
or when it is ``now`` itself or in the past, which is what it returns for much garbage. It is
given the time of day as this module reads it (``November 22 at half past 4pm`` goes to it as
``November 22 at 16:30``): it does not know every form above, and drops what it does not know
rather than failing.

This module is the public surface; the words and patterns are in ``_timewords``, the forms
(tried in the order of the table above, ISO and cron first) in ``_timeforms``.
"""

from __future__ import annotations

import unicodedata
from datetime import datetime, tzinfo

from turnstile.actors.scheduling._timeforms import FORMS, When, _Context
from turnstile.actors.scheduling._timewords import _NOW_WORDS, _OFFSET
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

HINT = "try 'in 5m', 'tomorrow at 9am', 'every Monday at 10am', a cron expression or ISO 8601"


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
    for parse in FORMS:
        found = parse(ctx, s)
        if found is not None:
            return found
    raise InvalidArgument(f"could not understand {raw!r} as a time: {HINT}", field="when")


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
