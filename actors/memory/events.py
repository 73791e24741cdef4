"""What a change to a user's memory looks like on the ``memory`` topic (``docs/memory.md``).

One Struct per event type, tagged by ``type``. The change log (``changes.py``) stores each as
``(type, payload)`` and the gateway sends it as ``{"type", ...payload, "topic": "memory",
"seq", "ts"}`` (``docs/protocol.md``), live and on replay alike.

It imports nothing but msgspec, so ``turnstile.client`` decodes the topic's frames into these
Structs without loading the feature (an import contract checks it).

Each event also names the *subject* it is about (one fact, the summary, or everything), so the
log can drop an event a later one about the same subject makes moot: a fact's value once
forgotten is gone from the log too, and the log holds about one event per fact.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

__all__ = [
    "EVERYTHING",
    "FactForgotten",
    "FactSaved",
    "MemoryChange",
    "MemoryDeleted",
    "SummaryChanged",
    "fact_subject",
]

#: The subject of ``MemoryDeleted``: every earlier event of the user is moot.
EVERYTHING = "*"


def fact_subject(category: str, key: str) -> str:
    """The subject of the events about one fact (unambiguous whatever the text holds)."""
    return msgspec.json.encode(["fact", category, key]).decode()


class MemoryChange(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """Base of every memory event."""

    @property
    def subject(self) -> str:
        """What the event is about; a later event about the same subject supersedes it."""
        raise NotImplementedError

    def stored(self) -> tuple[str, dict[str, Any]]:
        """The event as the log keeps it: ``(type, payload)``, the payload JSON-ready."""
        payload = msgspec.to_builtins(self)
        return payload.pop("type"), payload


class FactSaved(MemoryChange, tag="fact_saved", kw_only=True, frozen=True):
    """A fact was saved: new, or replacing the one with the same category and key.

    Attributes:
        fact: the fact as ``GET /memory/facts`` shows it (no ``owner``).
        created: True for a new key, False when an existing fact was replaced.
    """

    fact: dict[str, Any]
    created: bool

    @property
    def subject(self) -> str:
        return fact_subject(self.fact["category"], self.fact["key"])


class FactForgotten(MemoryChange, tag="fact_forgotten", kw_only=True, frozen=True):
    """A fact is gone.

    Attributes:
        category: its category.
        key: its key.
        reason: ``forgotten`` (``memory.forget``, ``DELETE /memory/facts``) or ``expired``
            (past its ``expires_at``, deleted at the user's next save).
    """

    category: str
    key: str
    reason: Literal["forgotten", "expired"] = "forgotten"

    @property
    def subject(self) -> str:
        return fact_subject(self.category, self.key)


class SummaryChanged(MemoryChange, tag="summary_changed", kw_only=True, frozen=True):
    """The user's summary was written (``PUT /memory/summary``, extraction).

    Attributes:
        summary: the new text.
        updated_at: when.
    """

    summary: str
    updated_at: datetime

    @property
    def subject(self) -> str:
        return "summary"


class MemoryDeleted(MemoryChange, tag="memory_deleted", kw_only=True, frozen=True):
    """Everything memory held about the user was deleted (``DELETE /memory``): facts,
    summary, their sessions' extraction state. The log keeps no earlier event of theirs.

    Attributes:
        deleted: rows deleted by kind (``facts``, ``summary``, ``sessions``).
    """

    deleted: dict[str, int]

    @property
    def subject(self) -> str:
        return EVERYTHING
