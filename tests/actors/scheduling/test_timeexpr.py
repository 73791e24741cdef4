"""Time expressions: every form of the grammar, time zones, DST and the errors, table-driven."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from turnstile.actors.scheduling.timeexpr import When, parse_when
from turnstile.runtime.errors import InvalidArgument

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)  # a Saturday
HINT = "try 'in 5m', 'tomorrow at 9am', 'every Monday at 10am', a cron expression or ISO 8601"
PARIS = {"timezone": "Europe/Paris"}


def z(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# --- one-off instants ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kwargs", "run_at", "description"),
    [
        # relative
        ("in 5m", {}, "2026-11-21T12:05", "in 5m"),
        ("5m", {}, "2026-11-21T12:05", "in 5m"),
        ("30m", {}, "2026-11-21T12:30", "in 30m"),
        ("2h 15m", {}, "2026-11-21T14:15", "in 2h 15m"),
        ("in 2h15m", {}, "2026-11-21T14:15", "in 2h 15m"),
        ("in 3 hours", {}, "2026-11-21T15:00", "in 3h"),
        ("In 90 Seconds", {}, "2026-11-21T12:01:30", "in 1m 30s"),
        ("in 1 day", {}, "2026-11-22T12:00", "in 1d"),
        ("in 2 weeks", {}, "2026-12-05T12:00", "in 14d"),
        ("in an hour", {}, "2026-11-21T13:00", "in 1h"),
        ("in 1 hour and 5 minutes", {}, "2026-11-21T13:05", "in 1h 5m"),
        ("in 9h", {}, "2026-11-21T21:00", "in 9h"),
        ("2 hours", {}, "2026-11-21T14:00", "in 2h"),
        ("dans 30 minutes", {}, "2026-11-21T12:30", "in 30m"),
        ("dans 2 heures", {}, "2026-11-21T14:00", "in 2h"),
        ("dans 1 jour", {}, "2026-11-22T12:00", "in 1d"),
        ("dans 1h30", {}, "2026-11-21T13:30", "in 1h 30m"),
        ("dans une heure", {}, "2026-11-21T13:00", "in 1h"),
        ("dans 2 semaines", {}, "2026-12-05T12:00", "in 14d"),
        # halves, quarters and decimals in delays
        ("in half an hour", {}, "2026-11-21T12:30", "in 30m"),
        ("in a half hour", {}, "2026-11-21T12:30", "in 30m"),
        ("in a half-hour", {}, "2026-11-21T12:30", "in 30m"),
        ("half an hour", {}, "2026-11-21T12:30", "in 30m"),
        ("in a quarter of an hour", {}, "2026-11-21T12:15", "in 15m"),
        ("in a quarter hour", {}, "2026-11-21T12:15", "in 15m"),
        ("in three quarters of an hour", {}, "2026-11-21T12:45", "in 45m"),
        ("in an hour and a half", {}, "2026-11-21T13:30", "in 1h 30m"),
        ("an hour and a half", {}, "2026-11-21T13:30", "in 1h 30m"),
        ("in 2 hours and a quarter", {}, "2026-11-21T14:15", "in 2h 15m"),
        ("in one and a half hours", {}, "2026-11-21T13:30", "in 1h 30m"),
        ("in 2 and a half hours", {}, "2026-11-21T14:30", "in 2h 30m"),
        ("in 1.5 hours", {}, "2026-11-21T13:30", "in 1h 30m"),
        ("1.5h", {}, "2026-11-21T13:30", "in 1h 30m"),  # not a time of day: no ambiguity
        ("half h", {}, "2026-11-21T12:30", "in 30m"),
        ("in 0.5 minutes", {}, "2026-11-21T12:00:30", "in 30s"),
        ("in 0.125 hours", {}, "2026-11-21T12:07:30", "in 7m 30s"),
        ("in 2.5 days", {}, "2026-11-24T00:00", "in 2d 12h"),
        ("in half a day", {}, "2026-11-22T00:00", "in 12h"),
        ("in 1.5 hours and 10 minutes", {}, "2026-11-21T13:40", "in 1h 40m"),
        ("dans une demi-heure", {}, "2026-11-21T12:30", "in 30m"),
        ("dans une demi heure", {}, "2026-11-21T12:30", "in 30m"),
        ("dans un quart d'heure", {}, "2026-11-21T12:15", "in 15m"),
        ("dans un quart d’heure", {}, "2026-11-21T12:15", "in 15m"),
        ("dans trois quarts d'heure", {}, "2026-11-21T12:45", "in 45m"),
        ("dans une heure et demie", {}, "2026-11-21T13:30", "in 1h 30m"),
        ("dans 2 heures et quart", {}, "2026-11-21T14:15", "in 2h 15m"),
        ("dans une heure trois quarts", {}, "2026-11-21T13:45", "in 1h 45m"),
        ("dans 1,5 heure", {}, "2026-11-21T13:30", "in 1h 30m"),
        ("dans 0,75 heure", {}, "2026-11-21T12:45", "in 45m"),
        ("dans une demi-journée", {}, "2026-11-22T00:00", "in 12h"),
        # a day and a time
        ("tomorrow at 9am", {}, "2026-11-22T09:00", "tomorrow at 09:00 UTC"),
        ("tomorrow 9:30", {}, "2026-11-22T09:30", "tomorrow at 09:30 UTC"),
        ("Tomorrow at 9:30 PM", {}, "2026-11-22T21:30", "tomorrow at 21:30 UTC"),
        ("tomorrow at 12am", {}, "2026-11-22T00:00", "tomorrow at 00:00 UTC"),
        ("tomorrow at noon", {}, "2026-11-22T12:00", "tomorrow at 12:00 UTC"),
        ("tomorrow at midnight", {}, "2026-11-22T00:00", "tomorrow at 00:00 UTC"),
        ("9am tomorrow", {}, "2026-11-22T09:00", "tomorrow at 09:00 UTC"),
        ("today at 17:30", {}, "2026-11-21T17:30", "today at 17:30 UTC"),
        (
            "the day after tomorrow at 8am",
            {},
            "2026-11-23T08:00",
            "the day after tomorrow at 08:00 UTC",
        ),
        ("demain à 9h", {}, "2026-11-22T09:00", "tomorrow at 09:00 UTC"),
        ("demain a 9h30", {}, "2026-11-22T09:30", "tomorrow at 09:30 UTC"),
        ("demain à midi", {}, "2026-11-22T12:00", "tomorrow at 12:00 UTC"),
        ("à 9h demain", {}, "2026-11-22T09:00", "tomorrow at 09:00 UTC"),
        ("aujourd'hui à 18h", {}, "2026-11-21T18:00", "today at 18:00 UTC"),
        ("aujourd’hui à 18h", {}, "2026-11-21T18:00", "today at 18:00 UTC"),
        ("après-demain à 7h", {}, "2026-11-23T07:00", "the day after tomorrow at 07:00 UTC"),
        # a time alone: today if still ahead, else tomorrow
        ("at 17:30", {}, "2026-11-21T17:30", "today at 17:30 UTC"),
        ("17:30", {}, "2026-11-21T17:30", "today at 17:30 UTC"),
        ("at 11:00", {}, "2026-11-22T11:00", "tomorrow at 11:00 UTC"),
        ("at 12:00", {}, "2026-11-22T12:00", "tomorrow at 12:00 UTC"),  # now is not the future
        ("à 17h30", {}, "2026-11-21T17:30", "today at 17:30 UTC"),
        # weekdays: "on Saturday" may be today, "next Saturday" never is
        ("next Monday at 10am", {}, "2026-11-23T10:00", "next Monday at 10:00 UTC"),
        ("lundi prochain à 10h", {}, "2026-11-23T10:00", "next Monday at 10:00 UTC"),
        ("on Friday at 8pm", {}, "2026-11-27T20:00", "Friday at 20:00 UTC"),
        ("vendredi à 20h", {}, "2026-11-27T20:00", "Friday at 20:00 UTC"),
        ("on Saturday at 8pm", {}, "2026-11-21T20:00", "Saturday at 20:00 UTC"),
        ("Saturday at 11am", {}, "2026-11-28T11:00", "Saturday at 11:00 UTC"),
        ("next Saturday at 8pm", {}, "2026-11-28T20:00", "next Saturday at 20:00 UTC"),
        ("ce dimanche à 10h", {}, "2026-11-22T10:00", "Sunday at 10:00 UTC"),
        # half past, a quarter past / to; without am/pm an hour is on the 24-hour clock, as in
        # 4:30, and the echo says which it was
        ("at half past 4", {}, "2026-11-22T04:30", "tomorrow at 04:30 UTC"),
        ("at half past 4pm", {}, "2026-11-21T16:30", "today at 16:30 UTC"),
        ("half past 4 pm", {}, "2026-11-21T16:30", "today at 16:30 UTC"),
        ("today at half past 16", {}, "2026-11-21T16:30", "today at 16:30 UTC"),
        ("at a quarter to 9", {}, "2026-11-22T08:45", "tomorrow at 08:45 UTC"),
        ("tomorrow at a quarter to 9pm", {}, "2026-11-22T20:45", "tomorrow at 20:45 UTC"),
        ("at quarter past noon", {}, "2026-11-21T12:15", "today at 12:15 UTC"),
        ("at a quarter past 3", {}, "2026-11-22T03:15", "tomorrow at 03:15 UTC"),
        ("at a quarter after 5pm", {}, "2026-11-21T17:15", "today at 17:15 UTC"),
        ("at a quarter till 5pm", {}, "2026-11-21T16:45", "today at 16:45 UTC"),
        ("at half past 12am", {}, "2026-11-22T00:30", "tomorrow at 00:30 UTC"),
        ("at a quarter to 1am", {}, "2026-11-22T00:45", "tomorrow at 00:45 UTC"),
        ("at a quarter past midnight", {}, "2026-11-22T00:15", "tomorrow at 00:15 UTC"),
        # "a quarter to midnight" is 23:45 of the day named, as "minuit moins le quart"
        ("at a quarter to midnight", {}, "2026-11-21T23:45", "today at 23:45 UTC"),
        ("tomorrow at a quarter to midnight", {}, "2026-11-22T23:45", "tomorrow at 23:45 UTC"),
        ("a quarter to noon tomorrow", {}, "2026-11-22T11:45", "tomorrow at 11:45 UTC"),
        ("at half past 4 tomorrow", {}, "2026-11-22T04:30", "tomorrow at 04:30 UTC"),
        ("next Monday at half past 9am", {}, "2026-11-23T09:30", "next Monday at 09:30 UTC"),
        ("2026-11-22 at half past 9", {}, "2026-11-22T09:30", "2026-11-22 at 09:30 UTC"),
        ("à 4 heures et demie", {}, "2026-11-22T04:30", "tomorrow at 04:30 UTC"),
        ("à 16 heures et demie", {}, "2026-11-21T16:30", "today at 16:30 UTC"),
        ("à 9 heures moins le quart", {}, "2026-11-22T08:45", "tomorrow at 08:45 UTC"),
        ("à 9 heures moins quart", {}, "2026-11-22T08:45", "tomorrow at 08:45 UTC"),
        ("à 3 heures et quart", {}, "2026-11-22T03:15", "tomorrow at 03:15 UTC"),
        ("à 17h et quart", {}, "2026-11-21T17:15", "today at 17:15 UTC"),
        ("à une heure et demie", {}, "2026-11-22T01:30", "tomorrow at 01:30 UTC"),
        ("à midi et demi", {}, "2026-11-21T12:30", "today at 12:30 UTC"),
        ("à midi et demie", {}, "2026-11-21T12:30", "today at 12:30 UTC"),
        ("midi et quart", {}, "2026-11-21T12:15", "today at 12:15 UTC"),
        ("à midi moins le quart", {}, "2026-11-22T11:45", "tomorrow at 11:45 UTC"),
        ("à minuit et demi", {}, "2026-11-22T00:30", "tomorrow at 00:30 UTC"),
        ("à minuit moins le quart", {}, "2026-11-21T23:45", "today at 23:45 UTC"),
        ("demain à minuit moins le quart", {}, "2026-11-22T23:45", "tomorrow at 23:45 UTC"),
        ("demain à 9 heures et demie", {}, "2026-11-22T09:30", "tomorrow at 09:30 UTC"),
        ("à 9 heures et demie demain", {}, "2026-11-22T09:30", "tomorrow at 09:30 UTC"),
        ("9 heures moins le quart", {}, "2026-11-22T08:45", "tomorrow at 08:45 UTC"),  # no delay
        ("lundi prochain à 10 heures et quart", {}, "2026-11-23T10:15", "next Monday at 10:15 UTC"),
        # "heures" written out, as "h"
        ("à 9 heures", {}, "2026-11-22T09:00", "tomorrow at 09:00 UTC"),
        ("à 9 heures 30", {}, "2026-11-22T09:30", "tomorrow at 09:30 UTC"),
        ("à une heure", {}, "2026-11-22T01:00", "tomorrow at 01:00 UTC"),
        # ISO 8601 and dates
        ("2026-11-22T09:00:00Z", {}, "2026-11-22T09:00", "2026-11-22 09:00 UTC"),
        ("2026-11-22T09:00:00+01:00", PARIS, "2026-11-22T08:00", "2026-11-22 09:00 UTC+01:00"),
        ("2026-11-22T09:00:00-05:30", {}, "2026-11-22T14:30", "2026-11-22 09:00 UTC-05:30"),
        ("2026-11-22T09:00", PARIS, "2026-11-22T08:00", "2026-11-22 09:00 Europe/Paris"),
        ("2026-11-22 09:00", {}, "2026-11-22T09:00", "2026-11-22 09:00 UTC"),
        ("2026-11-22 09:00:30", {}, "2026-11-22T09:00:30", "2026-11-22 09:00:30 UTC"),
        ("2026-11-22 at 9am", {}, "2026-11-22T09:00", "2026-11-22 at 09:00 UTC"),
        # month names, through dateparser
        ("November 22 at 9am", PARIS, "2026-11-22T08:00", "2026-11-22 at 09:00 Europe/Paris"),
        ("le 22 novembre à 9h", PARIS, "2026-11-22T08:00", "2026-11-22 at 09:00 Europe/Paris"),
        (
            "Sunday, November 22nd, 2026 at 9:00 am",
            {},
            "2026-11-22T09:00",
            "2026-11-22 at 09:00 UTC",
        ),
        ("November 20 at 9am", {}, "2027-11-20T09:00", "2027-11-20 at 09:00 UTC"),
        (
            "November 22 at half past 4pm",
            PARIS,
            "2026-11-22T15:30",
            "2026-11-22 at 16:30 Europe/Paris",
        ),
        (
            "le 22 novembre à 9 heures et demie",
            PARIS,
            "2026-11-22T08:30",
            "2026-11-22 at 09:30 Europe/Paris",
        ),
        ("le 22 novembre à midi et quart", {}, "2026-11-22T12:15", "2026-11-22 at 12:15 UTC"),
        ("November 22 at a quarter to 9", {}, "2026-11-22T08:45", "2026-11-22 at 08:45 UTC"),
        # time zones
        ("tomorrow at 9am", PARIS, "2026-11-22T08:00", "tomorrow at 09:00 Europe/Paris"),
        (
            "tomorrow at 9am",
            {"timezone_offset": "+02:00"},
            "2026-11-22T07:00",
            "tomorrow at 09:00 UTC+02:00",
        ),
        (
            "tomorrow at 9am",
            {"timezone_offset": "-05:30"},
            "2026-11-22T14:30",
            "tomorrow at 09:00 UTC-05:30",
        ),
        (
            "tomorrow at 9am",
            {"timezone_offset": "+00:00"},
            "2026-11-22T09:00",
            "tomorrow at 09:00 UTC",
        ),
        (
            "at half past 9pm",
            {"timezone_offset": "-05:30"},
            "2026-11-22T03:00",
            "today at 21:30 UTC-05:30",
        ),
        (
            "à minuit moins le quart",
            PARIS,
            "2026-11-21T22:45",
            "today at 23:45 Europe/Paris",
        ),
        (
            "today at half past 9",
            {"timezone": "Pacific/Kiritimati"},
            "2026-11-21T19:30",
            "today at 09:30 Pacific/Kiritimati",
        ),
        # "today" is the local date: it is already 02:00 on the 22nd in Kiritimati (UTC+14)
        (
            "today at 9am",
            {"timezone": "Pacific/Kiritimati"},
            "2026-11-21T19:00",
            "today at 09:00 Pacific/Kiritimati",
        ),
    ],
)
def test_once(text, kwargs, run_at, description):
    when = parse_when(text, now=NOW, **kwargs)
    assert when.kind == "once"
    assert when.run_at == z(run_at)
    assert when.run_at.tzinfo is UTC
    assert when.description == f"{description} — {z(run_at):%Y-%m-%dT%H:%M:%SZ}"
    assert when.cron is None and when.next_run is None


# --- recurring, to cron -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kwargs", "cron", "next_run", "description"),
    [
        ("every day at 9am", {}, "0 9 * * *", "2026-11-22T09:00", "every day at 09:00 UTC"),
        ("daily at 9am", {}, "0 9 * * *", "2026-11-22T09:00", "every day at 09:00 UTC"),
        (
            "every Monday at 10am",
            PARIS,
            "0 10 * * 1",
            "2026-11-23T09:00",
            "every Monday at 10:00 Europe/Paris",
        ),
        (
            "every weekday at 8:30",
            {},
            "30 8 * * 1-5",
            "2026-11-23T08:30",
            "every weekday at 08:30 UTC",
        ),
        (
            "every weekend at 10am",
            {},
            "0 10 * * 0,6",
            "2026-11-22T10:00",
            "every Saturday and Sunday at 10:00 UTC",
        ),
        (
            "every Monday and Thursday at 10am",
            {},
            "0 10 * * 1,4",
            "2026-11-23T10:00",
            "every Monday and Thursday at 10:00 UTC",
        ),
        (
            "every mon, wed and fri at 9am",
            {},
            "0 9 * * 1,3,5",
            "2026-11-23T09:00",
            "every Monday, Wednesday and Friday at 09:00 UTC",
        ),
        ("at 9am every day", {}, "0 9 * * *", "2026-11-22T09:00", "every day at 09:00 UTC"),
        ("every 5 minutes", {}, "*/5 * * * *", "2026-11-21T12:05", "every 5 minutes"),
        ("every minute", {}, "* * * * *", "2026-11-21T12:01", "every minute"),
        ("every 60 minutes", {}, "0 * * * *", "2026-11-21T13:00", "every hour"),
        ("every hour", {}, "0 * * * *", "2026-11-21T13:00", "every hour"),
        ("hourly", {}, "0 * * * *", "2026-11-21T13:00", "every hour"),
        ("every 2 hours", {}, "0 */2 * * *", "2026-11-21T14:00", "every 2 hours"),
        ("every 120 minutes", {}, "0 */2 * * *", "2026-11-21T14:00", "every 2 hours"),
        ("tous les jours à 9h", {}, "0 9 * * *", "2026-11-22T09:00", "every day at 09:00 UTC"),
        (
            "tous les lundis à 10h",
            {},
            "0 10 * * 1",
            "2026-11-23T10:00",
            "every Monday at 10:00 UTC",
        ),
        ("chaque lundi à 10h", {}, "0 10 * * 1", "2026-11-23T10:00", "every Monday at 10:00 UTC"),
        ("en semaine à 8h30", {}, "30 8 * * 1-5", "2026-11-23T08:30", "every weekday at 08:30 UTC"),
        ("toutes les 5 minutes", {}, "*/5 * * * *", "2026-11-21T12:05", "every 5 minutes"),
        ("toutes les heures", {}, "0 * * * *", "2026-11-21T13:00", "every hour"),
        ("every half hour", {}, "*/30 * * * *", "2026-11-21T12:30", "every 30 minutes"),
        ("every half an hour", {}, "*/30 * * * *", "2026-11-21T12:30", "every 30 minutes"),
        ("every quarter hour", {}, "*/15 * * * *", "2026-11-21T12:15", "every 15 minutes"),
        (
            "every quarter of an hour",
            {},
            "*/15 * * * *",
            "2026-11-21T12:15",
            "every 15 minutes",
        ),
        ("every 0.5 hours", {}, "*/30 * * * *", "2026-11-21T12:30", "every 30 minutes"),
        ("every half day", {}, "0 */12 * * *", "2026-11-22T00:00", "every 12 hours"),
        ("toutes les demi-heures", {}, "*/30 * * * *", "2026-11-21T12:30", "every 30 minutes"),
        ("tous les quarts d'heure", {}, "*/15 * * * *", "2026-11-21T12:15", "every 15 minutes"),
        ("toutes les 0,5 heures", {}, "*/30 * * * *", "2026-11-21T12:30", "every 30 minutes"),
        (
            "every day at half past 8",
            {},
            "30 8 * * *",
            "2026-11-22T08:30",
            "every day at 08:30 UTC",
        ),
        (
            "every weekday at a quarter to 9am",
            {},
            "45 8 * * 1-5",
            "2026-11-23T08:45",
            "every weekday at 08:45 UTC",
        ),
        (
            "tous les jours à midi et quart",
            {},
            "15 12 * * *",
            "2026-11-21T12:15",
            "every day at 12:15 UTC",
        ),
        (
            "chaque lundi à 8 heures moins le quart",
            {},
            "45 7 * * 1",
            "2026-11-23T07:45",
            "every Monday at 07:45 UTC",
        ),
        (
            "tous les jours à minuit moins le quart",
            PARIS,
            "45 23 * * *",
            "2026-11-21T22:45",
            "every day at 23:45 Europe/Paris",
        ),
        (
            "every month on the 1st at 9am",
            {},
            "0 9 1 * *",
            "2026-12-01T09:00",
            "every month on the 1st at 09:00 UTC",
        ),
        (
            "monthly on the 15th at 9am",
            {},
            "0 9 15 * *",
            "2026-12-15T09:00",
            "every month on the 15th at 09:00 UTC",
        ),
        (
            "tous les mois le 1er à 9h",
            {},
            "0 9 1 * *",
            "2026-12-01T09:00",
            "every month on the 1st at 09:00 UTC",
        ),
        (
            "le 1er de chaque mois à 9h",
            {},
            "0 9 1 * *",
            "2026-12-01T09:00",
            "every month on the 1st at 09:00 UTC",
        ),
        (
            "every day at 9am",
            {"timezone_offset": "+02:00"},
            "0 9 * * *",
            "2026-11-22T07:00",
            "every day at 09:00 UTC+02:00",
        ),
        # raw cron
        ("0 9 * * *", PARIS, "0 9 * * *", "2026-11-22T08:00", "every day at 09:00 Europe/Paris"),
        (
            "*/15 9-17 * * 1-5",
            {},
            "*/15 9-17 * * 1-5",
            "2026-11-23T09:00",
            "cron '*/15 9-17 * * 1-5' in UTC",
        ),
        (
            "0  9 * * mon-fri",
            {},
            "0 9 * * mon-fri",
            "2026-11-23T09:00",
            "every weekday at 09:00 UTC",
        ),
        ("@daily", {}, "0 0 * * *", "2026-11-22T00:00", "every day at 00:00 UTC"),
    ],
)
def test_cron(text, kwargs, cron, next_run, description):
    when = parse_when(text, now=NOW, **kwargs)
    assert when.kind == "cron"
    assert when.cron == cron
    assert when.next_run == z(next_run)
    assert when.timezone == kwargs.get("timezone", "UTC+02:00" if kwargs else "UTC")
    assert when.description == f"{description} — next {z(next_run):%Y-%m-%dT%H:%M:%SZ}"
    assert when.run_at is None


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "time expression is empty"),
        ("   ", "time expression is empty"),
        ("x" * 201, "time expression is too long (201 characters, max 200)"),
        ("blorp", f"could not understand 'blorp' as a time: {HINT}"),
        ("at 9", f"could not understand 'at 9' as a time: {HINT}"),
        ("may I go at 9am", f"could not understand 'may I go at 9am' as a time: {HINT}"),
        ("now", "'now' is not in the future: give a delay, e.g. 'in 1m'"),
        ("9h", "'9h' is ambiguous: say 'in 9h' for a delay or 'at 9h' for a time of day"),
        (
            "17h30",
            "'17h30' is ambiguous: say 'in 17h30' for a delay or 'at 17h30' for a time of day",
        ),
        (
            "2020-01-01T00:00:00Z",
            "'2020-01-01T00:00:00Z' is in the past (now is 2026-11-21T12:00:00Z)",
        ),
        (
            "2026-11-21T12:00:00Z",
            "'2026-11-21T12:00:00Z' is in the past (now is 2026-11-21T12:00:00Z)",
        ),
        ("today at 9am", "'today at 9am' is in the past (now is 2026-11-21T12:00:00Z)"),
        (
            "November 20 2026 at 9am",
            "'November 20 2026 at 9am' is in the past (now is 2026-11-21T12:00:00Z)",
        ),
        ("2037-01-01T00:00:00Z", "'2037-01-01T00:00:00Z' is more than 10 years away"),
        ("in 600 weeks", "'in 600 weeks' is more than 10 years away"),
        (
            "in 99999999999999999999 days",
            "'in 99999999999999999999 days' is more than 10 years away",
        ),
        ("in 0m", "'in 0m' is a delay of zero: give a delay in the future, e.g. 'in 5m'"),
        ("at 25:00", "'25:00' is not a valid time of day: hours go from 0 to 23"),
        ("demain à 24h", "'24h' is not a valid time of day: hours go from 0 to 23"),
        (
            "tomorrow at 13pm",
            "'13pm' is not a valid time of day: with am/pm, hours go from 1 to 12",
        ),
        ("at 9:75", "'9:75' is not a valid time of day: minutes and seconds go from 0 to 59"),
        (
            "2026-02-30T09:00:00Z",
            "'2026-02-30T09:00:00Z' is not a valid date: day is out of range for month",
        ),
        ("2026-11-22", "'2026-11-22' has no time of day: add one, e.g. '2026-11-22T09:00'"),
        ("22 novembre", "'22 novembre' has no time of day: add one, e.g. '22 novembre at 9am'"),
        ("tomorrow", "'tomorrow' needs a time of day: add one, e.g. 'at 9am'"),
        ("every day", "'every day' needs a time of day: add one, e.g. 'at 9am'"),
        ("every Monday", "'every Monday' needs a time of day: add one, e.g. 'at 9am'"),
        ("tous les jours", "'tous les jours' needs a time of day: add one, e.g. 'at 9am'"),
        (
            "every 7 minutes",
            "'every 7 minutes' would drift at the hour: 7 does not divide 60; "
            "use a cron expression (e.g. '*/7 * * * *') if that is what you want",
        ),
        (
            "every 5 hours",
            "'every 5 hours' would drift at midnight: 5 does not divide 24; "
            "use a cron expression (e.g. '0 */5 * * *') if that is what you want",
        ),
        (
            "every 90 minutes",
            "'every 90 minutes' cannot be kept regular by cron: use minutes that divide 60, "
            "hours that divide 24, or a cron expression",
        ),
        (
            "every 2 days",
            "'every 2 days' cannot be kept regular by cron: say which days, "
            "e.g. 'every Monday at 10am', or give a cron expression",
        ),
        (
            "every 24 hours",
            "'every 24 hours' is a day or more: say when, e.g. 'every day at 9am', or give a cron",
        ),
        (
            "every 30 seconds",
            "'every 30 seconds' is too frequent: a cron schedule fires at most once a minute",
        ),
        ("every 0 minutes", "'every 0 minutes' is not a valid interval: it must be at least 1"),
        (
            "every day at 9:00:30",
            "'every day at 9:00:30' has seconds: cron schedules fire on whole minutes",
        ),
        (
            "every month on the 31st at 9am",
            "day 31 is not in every month, so some months would be skipped: "
            "use a cron expression (e.g. '0 9 31 * *') if that is what you want",
        ),
        ("every month on the 32nd at 9am", "day 32 is not a day of the month"),
        # halves, quarters and decimals
        (
            "une heure et demie",
            "'une heure et demie' is ambiguous: say 'dans une heure et demie' for a delay or "
            "'à une heure et demie' for a time of day",
        ),
        (
            "9 heures et quart",
            "'9 heures et quart' is ambiguous: say 'dans 9 heures et quart' for a delay or "
            "'à 9 heures et quart' for a time of day",
        ),
        (
            "at half 4",
            "'at half 4' is ambiguous: 'half 4' is half past 4 in British English but half past "
            "3 in some other languages; say 'half past 4' or 'half past 3'",
        ),
        (
            "tomorrow at half 1pm",
            "'tomorrow at half 1pm' is ambiguous: 'half 1pm' is half past 1pm in British English "
            "but half past 12pm in some other languages; say 'half past 1pm' or 'half past 12pm'",
        ),
        (
            "every day at a quarter of 9",
            "'every day at a quarter of 9' is ambiguous: 'a quarter of 9' is a quarter to 9 in "
            "American English, and not to every reader; say 'a quarter to 9' or 'a quarter past 9'",
        ),
        # not a time at all, only words around one: not understood, rather than ambiguous
        ("at half 4 to stretch", f"could not understand 'at half 4 to stretch' as a time: {HINT}"),
        (
            "in 1,500 minutes",
            "'1,500' is ambiguous: 1500 or 1.5? write '1500' without a separator, or '1.5' for "
            "the decimal",
        ),
        (
            "dans 2.125 heures",
            "'2.125' is ambiguous: 2125 or 2.125? write '2125' without a separator, or the "
            "decimal in a smaller unit",
        ),
        (
            "in 1.23456 hours",
            "'in 1.23456 hours' is not a whole number of seconds (4444.416s): delays are counted "
            "in seconds",
        ),
        (
            "in half a second",
            "'in half a second' is not a whole number of seconds (0.5s): delays are counted in "
            "seconds",
        ),
        (
            "in 0.0 hours",
            "'in 0.0 hours' is a delay of zero: give a delay in the future, e.g. 'in 5m'",
        ),
        ("in 0.5 days and 9999 weeks", "'in 0.5 days and 9999 weeks' is more than 10 years away"),
        ("at half past 25", "'half past 25' is not a valid time of day: hours go from 0 to 23"),
        (
            "at a quarter to 13pm",
            "'a quarter to 13pm' is not a valid time of day: with am/pm, hours go from 1 to 12",
        ),
        (
            "à 24 heures et demie",
            "'24 heures et demie' is not a valid time of day: hours go from 0 to 23",
        ),
        (
            "every 1.5 hours",
            "'every 1.5 hours' cannot be kept regular by cron: use minutes that divide 60, "
            "hours that divide 24, or a cron expression",
        ),
        (
            "every hour and a half",
            "'every hour and a half' cannot be kept regular by cron: use minutes that divide 60, "
            "hours that divide 24, or a cron expression",
        ),
        (
            "every 0.75 hours",
            "'every 0.75 hours' would drift at the hour: 45 does not divide 60; "
            "use a cron expression (e.g. '*/45 * * * *') if that is what you want",
        ),
        (
            "every 2.5 minutes",
            "'every 2.5 minutes' is not a whole number of minutes: cron schedules fire on whole "
            "minutes",
        ),
        (
            "every half minute",
            "'every half minute' is too frequent: a cron schedule fires at most once a minute",
        ),
        (
            "every 1.5 days",
            "'every 1.5 days' is a day or more: say when, e.g. 'every day at 9am', or give a cron",
        ),
        (
            "toutes les 2,0 semaines",
            "'toutes les 2,0 semaines' cannot be kept regular by cron: say which days, "
            "e.g. 'every Monday at 10am', or give a cron expression",
        ),
        ("61 9 * * *", "bad cron expression '61 9 * * *': minute 61 is out of range 0-59"),
        (
            "0 0 9 * * *",
            "bad cron expression '0 0 9 * * *': expected 5 fields (minute hour day-of-month "
            "month day-of-week), got 6; seconds and years are not supported",
        ),
    ],
)
def test_errors(text, message):
    with pytest.raises(InvalidArgument) as info:
        parse_when(text, now=NOW)
    assert str(info.value) == message
    assert info.value.field == "when"


@pytest.mark.parametrize(
    ("kwargs", "message", "field"),
    [
        ({"timezone": "Mars/Base"}, "unknown timezone 'Mars/Base'", "timezone"),
        (
            {"timezone": "UTC", "timezone_offset": "+01:00"},
            "give timezone or timezone_offset, not both",
            "timezone",
        ),
        (
            {"timezone_offset": "2"},
            "timezone offset '2' is not ±HH:MM (e.g. '+02:00')",
            "timezone_offset",
        ),
        (
            {"timezone_offset": "+15:00"},
            "timezone offset '+15:00' is out of range: offsets go from -12:00 to +14:00",
            "timezone_offset",
        ),
        (
            {"timezone_offset": "-12:30"},
            "timezone offset '-12:30' is out of range: offsets go from -12:00 to +14:00",
            "timezone_offset",
        ),
        (
            {"timezone_offset": "+02:60"},
            "timezone offset '+02:60' is out of range: offsets go from -12:00 to +14:00",
            "timezone_offset",
        ),
    ],
)
def test_timezone_errors(kwargs, message, field):
    with pytest.raises(InvalidArgument) as info:
        parse_when("in 5m", now=NOW, **kwargs)
    assert str(info.value) == message
    assert info.value.field == field


# --- DST ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "now", "run_at"),
    [
        # Wall times in the spring-forward gap mean the first instant after it (03:00 CEST).
        ("tomorrow at 2:30am", "2026-03-28T12:00", "2026-03-29T01:00"),
        ("2026-03-29T02:30", "2026-03-28T12:00", "2026-03-29T01:00"),
        # Wall times in the autumn fold mean their first occurrence (CEST).
        ("tomorrow at 2:30am", "2026-10-24T12:00", "2026-10-25T00:30"),
        ("2026-10-25 02:30", "2026-10-24T12:00", "2026-10-25T00:30"),
        # Either side of a transition, the offset of that day applies.
        ("tomorrow at 9am", "2026-03-28T12:00", "2026-03-29T07:00"),
        ("tomorrow at 9am", "2026-10-24T12:00", "2026-10-25T08:00"),
        # A day in a delay is 24 real hours, DST or not.
        ("in 1 day", "2026-03-28T12:00", "2026-03-29T12:00"),
        # Half past and a quarter to follow the same rules: in the gap, 03:00 CEST; in the
        # fold, the first 02:30 (CEST).
        ("tomorrow at half past 2", "2026-03-28T12:00", "2026-03-29T01:00"),
        ("demain à 2 heures et demie", "2026-10-24T12:00", "2026-10-25T00:30"),
        ("demain à 3 heures moins le quart", "2026-10-24T12:00", "2026-10-25T00:45"),
        ("tomorrow at a quarter past 3", "2026-03-28T12:00", "2026-03-29T01:15"),
        # A delay is real time: 90 minutes across the spring or autumn change are 90 minutes.
        ("in an hour and a half", "2026-03-29T00:30", "2026-03-29T02:00"),
        ("dans une heure et demie", "2026-10-25T00:30", "2026-10-25T02:00"),
        ("in 1.5 days", "2026-03-28T12:00", "2026-03-30T00:00"),
    ],
)
def test_dst_once_in_paris(text, now, run_at):
    assert parse_when(text, now=z(now), **PARIS).run_at == z(run_at)


@pytest.mark.parametrize(
    ("text", "tz", "now", "next_run"),
    [
        ("every day at 2:30am", "Europe/Paris", "2026-03-28T12:00", "2026-03-29T01:00"),
        ("every day at 2:30am", "Europe/Paris", "2026-10-24T12:00", "2026-10-25T00:30"),
        ("every day at 2:30am", "Europe/Paris", "2026-10-25T00:30", "2026-10-26T01:30"),  # once
        ("every day at 2:30am", "America/New_York", "2026-03-07T12:00", "2026-03-08T07:00"),
        ("every day at half past 2", "Europe/Paris", "2026-03-28T12:00", "2026-03-29T01:00"),
        (
            "tous les jours à 2 heures et quart",
            "Europe/Paris",
            "2026-10-25T00:15",
            "2026-10-26T01:15",
        ),  # once, on the first 02:15
        ("every half hour", "Europe/Paris", "2026-10-25T00:30", "2026-10-25T01:00"),
        ("every hour", "Europe/Paris", "2026-10-25T00:00", "2026-10-25T01:00"),  # 02:00 twice
        ("every hour", "America/New_York", "2026-11-01T05:00", "2026-11-01T06:00"),
    ],
)
def test_dst_cron(text, tz, now, next_run):
    assert parse_when(text, now=z(now), timezone=tz).next_run == z(next_run)


# --- properties ---------------------------------------------------------------------------------


def test_never_reads_the_clock():
    past = datetime(2001, 1, 6, 12, 0, tzinfo=UTC)  # a Saturday too, long ago
    assert parse_when("tomorrow at 9am", now=past).run_at == datetime(2001, 1, 7, 9, tzinfo=UTC)
    assert parse_when("in 5m", now=past).run_at == past + timedelta(minutes=5)
    assert parse_when("every day at 9am", now=past).next_run == datetime(2001, 1, 7, 9, tzinfo=UTC)
    assert parse_when("2001-01-08T09:00:00Z", now=past).run_at == datetime(
        2001, 1, 8, 9, tzinfo=UTC
    )


def test_naive_now_is_utc_and_results_are_stable():
    naive = NOW.replace(tzinfo=None)
    assert parse_when("tomorrow at 9am", now=naive) == parse_when("tomorrow at 9am", now=NOW)


def test_when_is_frozen_and_encodes():
    when = parse_when("every Monday at 10am", now=NOW, **PARIS)
    with pytest.raises(AttributeError):
        when.cron = "* * * * *"
    decoded = msgspec.json.decode(msgspec.json.encode(when), type=When)
    assert decoded == when
