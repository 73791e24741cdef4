"""The words and patterns of ``timeexpr``: English and French units, weekdays, months and
recurring phrases, the regular expressions built from them, and the readers of a weekday name
and of a time of day.

Internal to ``timeexpr`` (import from there). Every pattern applies to normalised text: lower
case, no accents, single spaces (``timeexpr._normalize``).
"""

from __future__ import annotations

import re

from turnstile.runtime.errors import InvalidArgument

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


def _weekday(word: str) -> int:
    """Python weekday of ``"monday"``, ``"lundis"``, ``"tues"``..."""
    return _WEEKDAYS[word] if word in _WEEKDAYS else _WEEKDAYS[word[:-1]]


def _time_of_day(m: re.Match) -> tuple[int, int, int]:
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
