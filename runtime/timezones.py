"""Time zones by name: IANA names and fixed UTC offsets (``"UTC+02:00"``).

Part of the kernel's notion of time: sessions keep a time zone, schedules are evaluated in one,
prompts show the local time; all of them resolve names here, with one error for a bad name.
"""

from __future__ import annotations

import re
from datetime import UTC, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from turnstile.runtime.errors import InvalidArgument

__all__ = ["MAX_OFFSET_MINUTES", "MIN_OFFSET_MINUTES", "fixed_offset_name", "resolve_timezone"]

MIN_OFFSET_MINUTES = -12 * 60
MAX_OFFSET_MINUTES = 14 * 60

_OFFSET_NAME = re.compile(r"UTC([+-])(\d{2}):(\d{2})")


def fixed_offset_name(minutes: int) -> str:
    """The canonical name of a fixed UTC offset: ``"UTC"``, ``"UTC+02:00"``, ``"UTC-05:30"``."""
    if minutes == 0:
        return "UTC"
    sign = "+" if minutes > 0 else "-"
    hours, mins = divmod(abs(minutes), 60)
    return f"UTC{sign}{hours:02d}:{mins:02d}"


def resolve_timezone(name: str) -> tzinfo:
    """The tzinfo for an IANA name or a fixed-offset name (``"UTC+02:00"``).

    Raises:
        InvalidArgument: (field ``timezone``) the name is unknown or the offset out of range.
    """
    if name == "UTC":
        return UTC
    m = _OFFSET_NAME.fullmatch(name)
    if m is not None:
        minutes = int(m[2]) * 60 + int(m[3])
        if m[1] == "-":
            minutes = -minutes
        if int(m[3]) > 59 or not MIN_OFFSET_MINUTES <= minutes <= MAX_OFFSET_MINUTES:
            raise InvalidArgument(
                f"timezone {name!r} is out of range: offsets go from -12:00 to +14:00",
                field="timezone",
            )
        return timezone(timedelta(minutes=minutes)) if minutes else UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidArgument(f"unknown timezone {name!r}", field="timezone") from None
