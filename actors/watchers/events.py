"""The event the watchers feature adds to a session's log (``docs/protocol.md``).

A ``WatcherUpdate`` follows each watcher of the session: when it starts, pauses, resumes or
stops (its settings and status), and when it escalates (the check and its outcome). A
``SessionEvent`` (see ``actors.sessions.event_types`` for how its fields are written): the two
shapes share one Struct, each leaving unset what it does not carry.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, UnsetType

from turnstile.actors.sessions.event_types import SessionEvent

__all__ = ["WatcherUpdate"]


class WatcherUpdate(SessionEvent, tag="watcher_update", kw_only=True, frozen=True):
    """A watcher of the session changed or escalated.

    Attributes:
        watcher_id: the watcher.
        what: ``started``, ``paused``, ``resumed``, ``stopped`` or ``escalated``.
        status: (lifecycle) its state now (``running``, ``paused``).
        label: its label; may be empty.
        tool_name: the tool it checks with.
        notify_when: its strategy (``on_change``, ``on_error``, ``on_threshold``, ``summary``,
            ``always``).
        interval: (lifecycle) seconds between checks.
        check: (escalated) the number of the check that escalated.
        notification_count: (escalated) its escalations so far, this one included.
        ok: (escalated) whether that check's tool call succeeded.
        result: (escalated, ``ok``) the result, cut to a short text.
        error: (escalated, not ``ok``) the error message, cut to a short text.
    """

    watcher_id: str
    what: str
    status: str | UnsetType = UNSET
    label: str
    tool_name: str
    notify_when: str
    interval: int | float | UnsetType = UNSET
    check: int | UnsetType = UNSET
    notification_count: int | UnsetType = UNSET
    ok: bool | UnsetType = UNSET
    result: Any = UNSET
    error: Any = UNSET
