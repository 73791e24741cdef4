"""The WebSocket protocol's frames (version 1): JSON objects tagged by ``type``.

Client → server frames are strict (unknown fields are errors) and bounded; server → client
frames are built here too, so ``docs/protocol.md`` has one place to be checked against.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Annotated, Any

import msgspec

from turnstile.runtime.codec import MAX_JSON_DEPTH, ClientMessage, Codec
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
    "encode_event",
    "public_error",
    "is_server_error",
    "encode_topic_event",
    "TopicEvent",
    "encode_frame",
    "error_frame",
]

PROTOCOL_VERSION = 1

#: What a session id (and any id a client puts in a URL) may be: 1-128 of ``A-Z a-z 0-9 _ . : -``.
#: Anchored with ``\A`` and ``\Z``: msgspec applies patterns with ``re.search``, and ``$``
#: also matches before a trailing newline, which let ``"s1\n"`` through.
SESSION_ID_PATTERN = r"\A[A-Za-z0-9_.:-]{1,128}\Z"
_ID = re.compile(SESSION_ID_PATTERN)

#: The largest ``seq`` (the store's 64-bit signed integer).
MAX_SEQ = 2**63 - 1

SessionId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=SESSION_ID_PATTERN)]
ClientMsgId = Annotated[str, msgspec.Meta(max_length=128)]
#: A user topic's name (``runtime.gateway.topics``): a short lowercase word (``memory``).
TOPIC_PATTERN = r"\A[a-z][a-z0-9_.-]{0,63}\Z"
TopicName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=TOPIC_PATTERN)]
ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class AttachFrame(ClientMessage, tag="attach"):
    """Watch a session. With ``after_seq``, first replay every event after it."""

    session_id: SessionId
    after_seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)] | None = None


class DetachFrame(ClientMessage, tag="detach"):
    """Stop watching a session."""

    session_id: SessionId


class SendFrame(ClientMessage, tag="send"):
    """A user message; acknowledged with ``ack`` once it is stored."""

    session_id: SessionId
    content: str
    client_msg_id: ClientMsgId | None = None


class StopFrame(ClientMessage, tag="stop"):
    """Cancel the session's running turn (it closes as ``stopped``)."""

    session_id: SessionId


class CallFrame(ClientMessage, tag="call"):
    """Invoke a tool or primitive by name; answered by ``result`` with the same ``id``."""

    id: ClientMsgId
    session_id: SessionId
    tool: ToolName
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class SetPolicyFrame(ClientMessage, tag="set_policy"):
    """Set what happens to user messages sent during a turn."""

    session_id: SessionId
    policy: str


class ApproveFrame(ClientMessage, tag="approve"):
    """Approve a pending tool call (``approval_required``)."""

    session_id: SessionId
    approval_id: ClientMsgId


class DenyFrame(ClientMessage, tag="deny"):
    """Refuse a pending tool call."""

    session_id: SessionId
    approval_id: ClientMsgId


class SubscribeFrame(ClientMessage, tag="subscribe"):
    """Receive the user's events of a topic (``runtime.gateway.topics``). With ``after_seq``,
    first replay what the topic's log holds after it."""

    topic: TopicName
    after_seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)] | None = None


class UnsubscribeFrame(ClientMessage, tag="unsubscribe"):
    """Stop receiving a topic's events."""

    topic: TopicName


ClientFrame = (
    AttachFrame
    | DetachFrame
    | SendFrame
    | StopFrame
    | CallFrame
    | SetPolicyFrame
    | ApproveFrame
    | DenyFrame
    | SubscribeFrame
    | UnsubscribeFrame
)
CLIENT_FRAMES: Codec[ClientFrame] = Codec(ClientFrame, max_depth=MAX_JSON_DEPTH)


def is_valid_id(value: str) -> bool:
    """Whether ``value`` is a well-formed id (``SESSION_ID_PATTERN``)."""
    return _ID.search(value) is not None


_encoder = msgspec.json.Encoder()


def encode_frame(type_: str, **fields: Any) -> bytes:
    """A server frame: ``{"type": type_, **fields}`` as JSON bytes (None fields dropped)."""
    return _encoder.encode({"type": type_, **{k: v for k, v in fields.items() if v is not None}})


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
