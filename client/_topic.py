"""``TopicStream``: your events of a user topic over a WebSocket of its own
(``Client.subscribe``; ``docs/protocol.md``, "User topics"), read again from the last ``seq``
received after a drop, as a session's stream is.

A topic's events are Structs of the feature that logs them, as a session's are: the ``memory``
topic's are ``turnstile.actors.memory.events`` (``FactSaved`` …), which imports nothing but
msgspec. A topic or an event type this client does not know is still delivered, its
``data`` an ``UnknownEvent``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from turnstile.actors.memory.events import (
    FactForgotten,
    FactSaved,
    MemoryChange,
    MemoryDeleted,
    SummaryChanged,
)
from turnstile.client._events import UnknownEvent
from turnstile.client._stream import Stream
from turnstile.client._wire import Connector
from turnstile.protocol import (
    Attached,
    ClientFrame,
    ErrorFrame,
    ServerFrame,
    Subscribed,
    SubscribeFrame,
    TopicSync,
)

__all__ = ["TopicEvent", "TopicReset", "TopicStream", "decode_topic_event"]

#: Each topic's events, a union tagged by ``type``, by topic.
_TOPICS: dict[str, Any] = {"memory": FactSaved | FactForgotten | SummaryChanged | MemoryDeleted}


class TopicEvent(msgspec.Struct, frozen=True):
    """One event of a user topic (``docs/protocol.md``, "User topics").

    Attributes:
        topic: the topic (``memory``).
        seq: its place in your log of the topic: increasing, with gaps (a later event can make
            an earlier one moot).
        ts: when it was recorded (UTC).
        type: what happened (``fact_saved`` …).
        fields: the event's other fields, as JSON values.
    """

    topic: str
    seq: int
    ts: datetime
    type: str
    fields: dict[str, Any]

    @property
    def data(self) -> MemoryChange | UnknownEvent:
        """The event as its feature's Struct (``memory``: ``FactSaved``, ``FactForgotten``,
        ``SummaryChanged``, ``MemoryDeleted``); ``UnknownEvent`` for a topic or a type this
        client does not know, or fields it cannot read (a newer node's)."""
        kind = _TOPICS.get(self.topic)
        if kind is not None:
            try:
                data: MemoryChange = msgspec.convert({"type": self.type, **self.fields}, kind)
            except msgspec.ValidationError:
                pass
            else:
                return data
        return UnknownEvent(self.type, self.fields)


class TopicReset(msgspec.Struct, frozen=True):
    """The topic's log no longer holds everything after the ``seq`` the stream resumed from
    (or it is another database's): nothing was replayed. Reload the state (for ``memory``:
    ``Client.facts()``, ``memory_summary()``); the events after ``last_seq`` follow.
    """

    topic: str
    last_seq: int


class _TopicStamp(msgspec.Struct):
    topic: str
    seq: int
    ts: datetime
    type: str


class TopicStream(Stream[TopicEvent | TopicReset]):
    """Your events of a user topic over a WebSocket of its own (``Client.subscribe``), read
    again from the last ``seq`` received after a drop. Iterate it: ``TopicEvent``s, and a
    ``TopicReset`` when what was missed is no longer all in the log.
    """

    def __init__(
        self,
        connect: Connector,
        topic: str,
        *,
        after_seq: int | None,
        max_buffer: int,
        reconnect_attempts: int,
    ) -> None:
        super().__init__(
            connect,
            topic,
            after_seq=after_seq,
            max_buffer=max_buffer,
            reconnect_attempts=reconnect_attempts,
        )
        self.topic = topic

    def _open_frame(self) -> ClientFrame:
        return SubscribeFrame(topic=self.topic, after_seq=self._last_seq)

    def _item(self, frame: dict[str, Any]) -> TopicEvent | None:
        if frame.get("topic") != self.topic:
            return None
        try:
            return decode_topic_event(frame)
        except msgspec.ValidationError:
            return None

    def _mine(self, lagged: ErrorFrame) -> bool:
        return lagged.topic == self.topic

    def _note(self, answer: ServerFrame) -> bool:
        return isinstance(answer, TopicSync) and answer.topic == self.topic

    def _on_attached(self, answer: Attached | Subscribed) -> None:
        super()._on_attached(answer)
        if isinstance(answer, Subscribed) and answer.reset:
            self._on_item(TopicReset(self.topic, answer.last_seq))


def decode_topic_event(frame: dict[str, Any]) -> TopicEvent:
    """The ``TopicEvent`` of a user topic's event frame (a JSON object with ``type``,
    ``topic``, ``seq``, ``ts`` and the event's fields: what the WebSocket sends, and what
    ``Client.memory_changes()`` lists).

    Raises:
        msgspec.ValidationError: the frame has no valid ``topic``, ``seq``, ``ts`` or ``type``.
    """
    stamp = msgspec.convert(frame, _TopicStamp)
    fields = {k: v for k, v in frame.items() if k not in ("type", "topic", "seq", "ts")}
    return TopicEvent(stamp.topic, stamp.seq, stamp.ts, stamp.type, fields)
