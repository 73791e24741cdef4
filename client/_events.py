"""Session events as the client receives them: the feature's own Struct, with the session, the
``seq`` and the time the node stamped on it.

Each event type is a Struct of the feature that emits it (``StreamDelta`` in
``turnstile.actors.sessions.event_types``, ``JobUpdate`` in ``turnstile.actors.scheduling
.events`` …). Those modules import nothing but msgspec, so the client decodes into them
without loading the server (an import contract checks it). An event type this client does
not know (a newer node, a feature of one's own) is still delivered, as ``UnknownEvent``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

# The features' event Structs (imported for their SessionEvent subclasses).
import turnstile.actors.execution.events
import turnstile.actors.notifications.events
import turnstile.actors.scheduling.events
import turnstile.actors.watchers.events
import turnstile.actors.webhooks.events  # noqa: F401
from turnstile.actors.sessions.event_types import SessionEvent, event_types

__all__ = ["Event", "UnknownEvent", "decode_event"]


class UnknownEvent(msgspec.Struct, frozen=True):
    """An event of a type this client has no Struct for (or one it could not read).

    Attributes:
        type: the event's ``type``.
        fields: every other field of the frame, as JSON values.
    """

    type: str
    fields: dict[str, Any]


class Event(msgspec.Struct, frozen=True):
    """One stored event of a session.

    Attributes:
        session_id: the session.
        seq: its place in the session's events: from 1, gap-free, increasing.
        ts: when it was stored (UTC).
        data: the event itself: the feature's Struct (``StreamDelta``, ``StreamEnd``,
            ``JobUpdate`` …), or ``UnknownEvent``.
    """

    session_id: str
    seq: int
    ts: datetime
    data: SessionEvent | UnknownEvent

    @property
    def type(self) -> str:
        """The event's ``type`` (``stream_delta`` …)."""
        if isinstance(self.data, UnknownEvent):
            return self.data.type
        tag = self.data.__struct_config__.tag
        return tag if isinstance(tag, str) else str(tag)


class _Stamp(msgspec.Struct):
    session_id: str
    seq: int
    ts: datetime


_types: dict[str, type[SessionEvent]] = {}


def _event_type(name: str) -> type[SessionEvent] | None:
    found = _types.get(name)
    if found is None:
        # an event Struct defined after the first look (an embedder's own) is found too
        _types.update(event_types())
        found = _types.get(name)
    return found


def decode_event(frame: dict[str, Any]) -> Event:
    """The ``Event`` of an event frame (a JSON object with ``type``, ``session_id``, ``seq``,
    ``ts`` and the event's fields).

    Raises:
        msgspec.ValidationError: the frame has no valid ``session_id``, ``seq`` or ``ts``.
    """
    stamp = msgspec.convert(frame, _Stamp)
    name = str(frame.get("type"))
    fields = {k: v for k, v in frame.items() if k not in ("type", "session_id", "seq", "ts")}
    kind = _event_type(name)
    data: SessionEvent | UnknownEvent
    if kind is None:
        data = UnknownEvent(name, fields)
    else:
        try:
            data = msgspec.convert(frame, kind)
        except msgspec.ValidationError:  # a newer node changed it: deliver it all the same
            data = UnknownEvent(name, fields)
    return Event(stamp.session_id, stamp.seq, stamp.ts, data)
