"""The events the notifications feature adds to a session's log (``docs/protocol.md``).

A notification for the session (the ``llm_notification`` channel, or a fallback to it) is a
``Notification`` event; one kept while no client was attached arrives on the next attach with
``buffered: true``, after a ``NotificationsDropped`` if the buffer overflowed. Both are
``SessionEvent``s (see ``actors.sessions.event_types`` for how their fields are written).
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, UnsetType

from turnstile.actors.sessions.event_types import SessionEvent

__all__ = ["Notification", "NotificationsDropped"]


class Notification(SessionEvent, tag="notification", kw_only=True, frozen=True):
    """A notification for the session.

    The buffer keeps it as stored (without ``type``) and converts it back to publish it, so
    every field's type is what a stored row holds.

    Attributes:
        notification_id: its id.
        channel: the channel it was delivered on (``llm_notification``).
        title: its title; may be empty.
        message: its text.
        priority: ``low``, ``normal``, ``high`` or ``urgent``.
        tags: its tags.
        structured_data: data the sender attached.
        source: who sent it (``agent``, ``schedule``, ``watcher``, ``heartbeat``…).
        created_at: when it was made, ISO 8601.
        fallback: whether it was meant for another channel that failed.
        requested_channel: (``fallback``) the channel it was meant for.
        fallback_reason: (``fallback``) why that channel failed.
        buffered: (sent on attach) it was kept while no client was attached.
    """

    notification_id: str
    channel: str
    title: str | None
    message: str
    priority: str
    tags: list[str]
    structured_data: Any
    source: str | None
    created_at: str | None
    fallback: bool
    requested_channel: str | UnsetType = UNSET
    fallback_reason: str | UnsetType = UNSET
    buffered: bool | UnsetType = UNSET


class NotificationsDropped(SessionEvent, tag="notifications_dropped", kw_only=True, frozen=True):
    """Buffered notifications were dropped while nobody watched (sent on attach, first).

    Attributes:
        dropped: how many.
        max_buffered: the buffer's bound (``max_buffered``).
        message: a sentence saying so.
    """

    dropped: int
    max_buffered: int
    message: str
