"""``frame(event)``: the bytes a client receives for a session event, as the gateway sends it.

The event goes the way every event goes: ``SessionEvent.stored()`` (what the store keeps),
then the gateway's ``encode_event``, with a fixed ``seq`` and ``ts`` so that tests can compare
against literal frames.
"""

from __future__ import annotations

from datetime import UTC, datetime

from turnstile.actors.sessions.event_types import SessionEvent
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.store import EventRecord

__all__ = ["TS", "frame"]

#: The ``ts`` every ``frame`` carries: ``"2025-01-01T00:00:00Z"``.
TS = datetime(2025, 1, 1, tzinfo=UTC)


def frame(event: SessionEvent, *, session_id: str = "s1", seq: int = 1) -> bytes:
    """The frame a client attached to ``session_id`` gets for ``event`` stored as ``seq``."""
    type_, payload = event.stored()
    record = EventRecord(
        session_id="ada/" + session_id, seq=seq, type=type_, payload=payload, ts=TS
    )
    return encode_event(session_id, record)
