"""The WebSocket protocol's frames (version 1): JSON objects tagged by ``type``.

The frames' Structs live in ``turnstile.protocol`` (shared with ``turnstile.client``, which
must not load the server) and are re-exported here; this module adds what only the node does:
decoding client frames with the codec's limits, and encoding events, answers and errors.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any

import msgspec

from turnstile.protocol.frames import (
    MAX_SEQ,
    PROTOCOL_VERSION,
    SESSION_ID_PATTERN,
    TOPIC_PATTERN,
    ApproveFrame,
    AttachFrame,
    CallFrame,
    ClientFrame,
    ClientMsgId,
    DenyFrame,
    DetachFrame,
    SendFrame,
    ServerFrameBase,
    SessionId,
    SetPolicyFrame,
    StopFrame,
    SubscribeFrame,
    UnsubscribeFrame,
)
from turnstile.runtime.codec import MAX_JSON_DEPTH, Codec
from turnstile.runtime.errors import (
    AlreadyExists,
    ConflictError,
    NotFound,
    StoreError,
    StoreUnavailable,
    TurnstileError,
)
from turnstile.runtime.store import EventRecord

__all__ = [
    "PROTOCOL_VERSION",
    "SessionId",
    "ClientMsgId",
    "MAX_SEQ",
    "SESSION_ID_PATTERN",
    "TOPIC_PATTERN",
    "is_valid_id",
    "AttachFrame",
    "DetachFrame",
    "SendFrame",
    "StopFrame",
    "CallFrame",
    "SetPolicyFrame",
    "ApproveFrame",
    "DenyFrame",
    "SubscribeFrame",
    "UnsubscribeFrame",
    "ClientFrame",
    "CLIENT_FRAMES",
    "encode_answer",
    "encode_event",
    "public_error",
    "is_server_error",
    "encode_topic_event",
    "TopicEvent",
    "encode_frame",
    "error_frame",
]

_ID = re.compile(SESSION_ID_PATTERN)

CLIENT_FRAMES: Codec[ClientFrame] = Codec(ClientFrame, max_depth=MAX_JSON_DEPTH)


def is_valid_id(value: str) -> bool:
    """Whether ``value`` is a well-formed id (``SESSION_ID_PATTERN``)."""
    return _ID.search(value) is not None


_encoder = msgspec.json.Encoder()


def encode_frame(type_: str, **fields: Any) -> bytes:
    """A server frame: ``{"type": type_, **fields}`` as JSON bytes (None fields dropped)."""
    return _encoder.encode({"type": type_, **{k: v for k, v in fields.items() if v is not None}})


def encode_answer(frame: ServerFrameBase) -> bytes:
    """A server answer (``turnstile.protocol``'s Struct) as JSON bytes: the Struct the client
    decodes it with is the one it was built from."""
    return _encoder.encode(frame)


def encode_event(session_id: str, event: EventRecord) -> bytes:
    """A session event frame: the event's payload plus ``type``, ``session_id``, ``seq``, ``ts``."""
    return _encoder.encode(
        {
            **event.payload,
            "type": event.type,
            "session_id": session_id,
            "seq": event.seq,
            "ts": event.ts,
        }
    )


class TopicEvent(msgspec.Struct, frozen=True):
    """One event of a user's topic, as its log stores it (``runtime.gateway.topics``, which
    exports it; defined here, with the frame it becomes, so that frames never imports topics).

    Attributes:
        seq: its place in the user's log: greater than every earlier one (gaps allowed).
        type: what happened (``fact_saved``); the frame's ``type``.
        ts: when it was recorded (UTC).
        payload: the event's fields; they become the frame's fields.
    """

    seq: int
    type: str
    ts: datetime
    payload: dict[str, Any]


def encode_topic_event(topic: str, event: TopicEvent) -> bytes:
    """A user topic's event frame: its payload plus ``type``, ``topic``, ``seq``, ``ts``."""
    return _encoder.encode(
        {**event.payload, "type": event.type, "topic": topic, "seq": event.seq, "ts": event.ts}
    )


log = logging.getLogger("turnstile.gateway")

#: The store's errors that a request causes: an id it names is unknown, a name it asks for is
#: taken, what it asks conflicts with what is stored. Any other StoreError is the server's.
_REQUEST_STORE_ERRORS = (NotFound, AlreadyExists, ConflictError)
#: What a client is told of a store failure that is not its fault (the log has the rest).
STORE_FAILED = "the store failed to answer this request; the node's log has the details"


def is_server_error(error: BaseException) -> bool:
    """Whether ``error`` is the server's fault rather than the request's: anything not a
    ``TurnstileError`` (a bug), and a ``StoreError`` that the request did not cause (the store
    unavailable, a database error no rule expected)."""
    if not isinstance(error, TurnstileError):
        return True
    return isinstance(error, StoreError) and not isinstance(error, _REQUEST_STORE_ERRORS)


def public_error(error: BaseException) -> tuple[str, str, str | None]:
    """What a client may see of ``error``: its code, message and field.

    A request's own error is shown as it is. ``StoreUnavailable`` keeps its code and its fixed
    message. Any other server error is ``internal`` (a bug) or ``store_error`` with a fixed
    message, and is logged here with its traceback: a database's text (host, port, SQL) never
    reaches a client.
    """
    if isinstance(error, StoreUnavailable):
        return error.code, str(error), None
    if not is_server_error(error):
        assert isinstance(error, TurnstileError)
        return error.code, str(error), error.field
    if isinstance(error, StoreError):
        log.error("a store operation failed: %s", error, exc_info=error)
        return StoreError.code, STORE_FAILED, None
    return "internal", "internal error", None


def error_frame(
    error: BaseException,
    *,
    session_id: str | None = None,
    id: str | None = None,
    topic: str | None = None,
) -> bytes:
    """An ``error`` frame for ``error``: its stable code, message and offending field, and the
    session, call or topic it concerns."""
    code, message, field = public_error(error)
    return encode_frame(
        "error",
        code=code,
        message=message,
        field=field,
        session_id=session_id,
        id=id,
        topic=topic,
    )
