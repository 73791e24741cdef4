"""``TopicStream``: your events of a user topic over a WebSocket of its own
(``Client.subscribe``; ``docs/protocol.md``, "User topics"), read again from the last ``seq``
received after a drop, as a session's stream is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

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

__all__ = ["TopicEvent", "TopicReset", "TopicStream"]


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


class TopicStream(Stream):
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

    async def receive(self) -> TopicEvent | TopicReset:
        """The topic's next event (or a reset), waiting for it.

        Raises:
            ConnectionLost: the connection dropped and could not be opened again.
            anyio.ClosedResourceError: the stream was closed.
        """
        event: TopicEvent | TopicReset = await super().receive()
        return event

    async def __anext__(self) -> TopicEvent | TopicReset:
        event: TopicEvent | TopicReset = await super().__anext__()
        return event

    def _open_frame(self) -> ClientFrame:
        return SubscribeFrame(topic=self.topic, after_seq=self._last_seq)

    def _item(self, frame: dict[str, Any]) -> TopicEvent | None:
        if frame.get("topic") != self.topic:
            return None
        try:
            stamp = msgspec.convert(frame, _TopicStamp)
        except msgspec.ValidationError:
            return None
        fields = {k: v for k, v in frame.items() if k not in ("type", "topic", "seq", "ts")}
        return TopicEvent(self.topic, stamp.seq, stamp.ts, stamp.type, fields)

    def _mine(self, lagged: ErrorFrame) -> bool:
        return lagged.topic == self.topic

    def _note(self, answer: ServerFrame) -> bool:
        return isinstance(answer, TopicSync) and answer.topic == self.topic

    def _on_attached(self, answer: Attached | Subscribed) -> None:
        super()._on_attached(answer)
        if isinstance(answer, Subscribed) and answer.reset:
            self._on_item(TopicReset(self.topic, answer.last_seq))
