"""The memory feature's config section: ``[memory]``, long-term facts about each user.

Example::

    [memory]
    enabled = true
    search_limit = 15          # what memory.search returns when no limit is given
    max_search_limit = 50      # the most a search or a page may ask for
    max_facts_per_user = 10000
    max_value_chars = 2000
    max_summary_chars = 8000
    admins = ["ada"]           # users with memory.read_all: may list every user's facts
    extraction = true          # learn facts from idle sessions (needs a model server)
    stale_after_minutes = 30   # a session idle this long is extracted
    extraction_interval_seconds = 300  # how often idle sessions are looked for
"""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = [
    "HARD_MAX_LIMIT",
    "HARD_MAX_SUMMARY_CHARS",
    "HARD_MAX_VALUE_CHARS",
    "MemoryConfig",
]

#: Bounds the config itself cannot exceed (the tool's parameter types carry them too).
HARD_MAX_LIMIT = 500
HARD_MAX_VALUE_CHARS = 8000
HARD_MAX_SUMMARY_CHARS = 64_000


class MemoryConfig(msgspec.Struct, forbid_unknown_fields=True):
    """``[memory]``.

    Attributes:
        enabled: register the memory tools and routes (the tables are created either way, so
            turning it off and on again loses nothing).
        search_limit: results of a search that names no limit (the reference's 15).
        max_search_limit: the most results a search, or facts a page of the list, may ask for.
        max_facts_per_user: facts one user may have; saving a new key beyond it is refused
            (``limit_exceeded``); updating an existing key always works.
        max_value_chars: the longest fact value.
        max_summary_chars: the longest per-user summary.
        admins: user names holding ``memory.read_all``: they may list every user's facts
            (``GET /memory/facts?all_users=true``). Nobody else ever sees another's facts.
        extraction: extract facts from sessions idle for ``stale_after_minutes``
            (``extraction.py``); off anyway without a model server.
        stale_after_minutes: how long a session must be idle before it is extracted.
        extraction_interval_seconds: seconds between two looks for idle sessions.
    """

    enabled: bool = True
    search_limit: Annotated[int, msgspec.Meta(ge=1, le=HARD_MAX_LIMIT)] = 15
    max_search_limit: Annotated[int, msgspec.Meta(ge=1, le=HARD_MAX_LIMIT)] = 50
    max_facts_per_user: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 10_000
    max_value_chars: Annotated[int, msgspec.Meta(ge=1, le=HARD_MAX_VALUE_CHARS)] = 2000
    max_summary_chars: Annotated[int, msgspec.Meta(ge=1, le=HARD_MAX_SUMMARY_CHARS)] = 8000
    admins: list[str] = msgspec.field(default_factory=list)
    extraction: bool = True
    stale_after_minutes: Annotated[int, msgspec.Meta(ge=1, le=10_080)] = 30
    extraction_interval_seconds: Annotated[float, msgspec.Meta(ge=1, le=86_400)] = 300.0

    def __post_init__(self) -> None:
        if self.search_limit > self.max_search_limit:
            raise ValueError("search_limit must be <= max_search_limit")
