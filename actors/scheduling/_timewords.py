"""The words and patterns of ``timeexpr``: English and French units, weekdays, months and
recurring phrases, the regular expressions built from them, and the readers of a weekday name
and of a time of day.

Internal to ``timeexpr`` (import from there). Every pattern applies to normalised text: lower
case, no accents, single spaces (``timeexpr._normalize``).
"""

from __future__ import annotations

import re
from fractions import Fraction

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
    ("d", r"days?|d|jours?|j|journees?"),
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

_AMPM = r"am|pm|a\.m\.|p\.m\."
_TIME = (
    # The fractional forms come first, so that "midi et demi demain" is not read as "midi".
    rf"(?:(?P<en_part>half\spast|(?:a\s)?quarter\s(?:past|after|to|till))"
    rf"\s(?P<en_h>noon|midnight|\d{{1,2}}(?:\s?(?:{_AMPM}))?)"
    r"|(?P<fr_h>midi|minuit|(?:\d{1,2}|une)\s?h(?:eures?)?)"
    r"\s(?P<fr_part>et\sdemie?|et\squart|moins\s(?:le\s)?quart)"
    r"|noon|midnight|midi|minuit"
    rf"|(?P<h1>\d{{1,2}})(?::(?P<m1>\d{{2}})(?::(?P<s1>\d{{2}}))?)?\s?(?P<ampm>{_AMPM})"
    r"|(?P<h2>\d{1,2}):(?P<m2>\d{2})(?::(?P<s2>\d{2}))?"
    r"|(?P<h3>\d{1,2}|une)\s?h(?:eures?)?(?:\s?(?P<m3>\d{2}))?)"
)
_AT = r"(?:(?:at|a|@|vers)\s)?"
_TIME_LAST = re.compile(rf"(?:^|\s|,){_AT}(?P<t>{_TIME})$")
_TIME_FIRST = re.compile(rf"^{_AT}(?P<t>{_TIME})(?:\s|,\s?)(?:on\s)?(?P<rest>.+)$")
_TIME_ANYWHERE = re.compile(rf"(?<![\w:])(?P<t>{_TIME})(?![\w:])")
# Said of clock times, but not the same time for everyone: refused rather than guessed.
_HALF_HOUR = re.compile(rf"(?:^|\s)(?P<said>half\s(?P<h>\d{{1,2}})(?:\s?(?:{_AMPM}))?)(?=$|\s|,)")
_QUARTER_OF = re.compile(
    rf"(?:^|\s)(?P<said>(?:a\s)?quarter\sof\s(?P<h>\d{{1,2}}(?:\s?(?:{_AMPM}))?|noon|midnight))"
    r"(?=$|\s|,)"
)

_REL_PREFIX = re.compile(r"^(?:in|dans|after|apres)\s")
_NUMBER = r"\d+(?:[.,]\d+)?"
# A decimal separator followed by three digits may be a thousands separator ("1,500 minutes").
_THOUSANDS = re.compile(r"[1-9]\d{0,2}[.,]\d{3}")
_FRACTION = (
    r"(?:(?:an?|one)\s)?half[\s-](?:an?\s)?"  # half an hour, a half hour, half-hour
    r"|(?:(?:an?|one)\s)?quarter[\s-](?:of\s)?(?:an?\s)?"  # a quarter of an hour
    r"|three[\s-]quarters\s(?:of\s)?(?:an?\s)?"  # three quarters of an hour
    r"|(?:une?\s)?demi[\s-]?"  # une demi-heure
    r"|(?:un\s)?quarts?\sd(?:'|\s)?"  # un quart d'heure, tous les quarts d'heure
    r"|trois\squarts\sd(?:'|\s)?"  # trois quarts d'heure
)
_AND_FRACTION = (
    r"and\sa\shalf|and\sa\squarter|and\sthree[\s-]quarters"  # an hour and a half
    r"|et\sdemie?|et\squart|(?:et\s)?trois\squarts"  # une heure et demie
)
# An amount of a unit: "5 minutes", "1.5 hours", "1,5 heure", "an hour", "an hour and a half",
# "2 and a half hours", "half an hour", "une demi-heure", "un quart d'heure"; and "hour" alone,
# which only intervals accept ("every hour").
_AMOUNT = (
    rf"(?:(?P<n>{_NUMBER}|an?|one|une?)(?:\s(?P<n_half>and\sa\shalf))?\s?"
    rf"|(?P<frac>{_FRACTION}))?"
    rf"(?:{_UNIT})(?![a-z])(?:\s(?P<extra>{_AND_FRACTION}))?"
)
_REL_PART = re.compile(rf"(?P<hhmm>(?P<hh>\d+)\s?h(?:eures?)?\s?(?P<mm>\d{{1,2}})$)|{_AMOUNT}")
_REL_SEP = re.compile(r"\s*(?:,|\band\b|\bet\b|\+)?\s*")

_DAY = re.compile(
    rf"^(?:(?P<today>today|aujourd'hui|aujourdhui)"
    rf"|(?P<tomorrow>tomorrow|demain)"
    rf"|(?P<after>(?:the\s)?day after tomorrow|apres-demain|apres demain)"
    rf"|(?:(?P<next>next)\s|(?:on|this|ce)\s)?(?P<wd>{_WEEKDAY})(?:\s(?P<prochain>prochaine?))?"
    rf"|(?:on\s|le\s)?(?P<date>\d{{4}}-\d{{2}}-\d{{2}}))$"
)

_EVERY = r"(?:every|each|chaque|tous\sles|toutes\sles)"
_INTERVAL = re.compile(rf"^(?:{_EVERY}\s{_AMOUNT}|(?P<hourly>hourly))$")
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


def _fraction_of(words: str) -> Fraction:
    """3/4 for "three quarters", "trois quarts"; 1/4 for "quarter", "quart"; else 1/2."""
    if "three" in words or "trois" in words:
        return Fraction(3, 4)
    return Fraction(1, 4) if "quart" in words else Fraction(1, 2)


def _amount(m: re.Match) -> Fraction:
    """How many units an ``_AMOUNT`` match counts: 3/2 for ``1,5 heure`` or ``an hour and a
    half``, 1/4 for ``un quart d'heure``; 1 when no count is written (``every hour``).

    Raises:
        InvalidArgument: a decimal that may as well be a thousands separator (``1,500``).
    """
    if m["frac"] is not None:
        count = _fraction_of(m["frac"])
    elif m["n"] is None or m["n"] in _ONE:
        count = Fraction(1)
    elif _THOUSANDS.fullmatch(m["n"]):
        n = m["n"]
        whole, decimal = n.replace(n[-4], ""), n.replace(",", ".").rstrip("0").rstrip(".")
        decimal_hint = (
            "the decimal in a smaller unit"
            if _THOUSANDS.fullmatch(decimal)
            else f"{decimal!r} for the decimal"
        )
        raise InvalidArgument(
            f"{n!r} is ambiguous: {whole} or {decimal}? write {whole!r} without "
            f"a separator, or {decimal_hint}",
            field="when",
        )
    else:
        count = Fraction(m["n"].replace(",", "."))
    if m["n_half"]:
        count += Fraction(1, 2)
    if m["extra"]:
        count += _fraction_of(m["extra"])
    return count


def _hour(text: str, word: str) -> int:
    """The hour of ``noon``, ``minuit``, ``4pm``, ``16``, ``9 heures``, ``une heure``."""
    named = {"noon": 12, "midi": 12, "midnight": 0, "minuit": 0}
    if text in named:
        return named[text]
    m = re.match(rf"(\d{{1,2}}|une)\s?(?:(?P<ampm>{_AMPM})|h(?:eures?)?)?$", text)
    if m is None:  # the patterns that call this only give hours of these shapes
        raise AssertionError(f"not an hour: {text!r}")
    return _check_hour(1 if m[1] == "une" else int(m[1]), m["ampm"], word)


def _check_hour(h: int, ampm: str | None, word: str) -> int:
    """``h`` on the 24-hour clock, after am/pm if given; InvalidArgument for 25 and 13pm."""
    if ampm is not None:
        if not 1 <= h <= 12:
            raise InvalidArgument(
                f"{word!r} is not a valid time of day: with am/pm, hours go from 1 to 12",
                field="when",
            )
        return h % 12 + (12 if ampm.startswith("p") else 0)
    if h > 23:
        raise InvalidArgument(
            f"{word!r} is not a valid time of day: hours go from 0 to 23", field="when"
        )
    return h


def _time_of_day(m: re.Match) -> tuple[int, int, int]:
    """(hour, minute, second) from a ``_TIME`` match, or InvalidArgument for 25:00 and 13pm.

    An hour without am/pm is on the 24-hour clock, as in ``4:30``: ``half past 4`` and ``4
    heures et demie`` are 04:30. "A quarter to" an hour is 45 minutes into the hour before, on
    the same day: ``a quarter to midnight`` and ``minuit moins le quart`` are 23:45.
    """
    word = m["t"]
    if m["en_part"] is not None or m["fr_part"] is not None:
        part = m["en_part"] or m["fr_part"]
        h = _hour(m["en_h"] or m["fr_h"], word)
        if part.endswith(("to", "till")) or part.startswith("moins"):
            return (h - 1) % 24, 45, 0
        return h, 30 if part.startswith(("half", "et demi")) else 15, 0
    named = {"noon": 12, "midi": 12, "midnight": 0, "minuit": 0}
    if word in named:
        return named[word], 0, 0
    if m["h1"] is not None:
        h, mi, s = int(m["h1"]), int(m["m1"] or 0), int(m["s1"] or 0)
        h = _check_hour(h, m["ampm"], word)
    elif m["h2"] is not None:
        h, mi, s = _check_hour(int(m["h2"]), None, word), int(m["m2"]), int(m["s2"] or 0)
    else:
        h3 = 1 if m["h3"] == "une" else int(m["h3"])
        h, mi, s = _check_hour(h3, None, word), int(m["m3"] or 0), 0
    if mi > 59 or s > 59:
        raise InvalidArgument(
            f"{word!r} is not a valid time of day: minutes and seconds go from 0 to 59",
            field="when",
        )
    return h, mi, s
