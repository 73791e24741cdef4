"""The WebSocket protocol's frames (version 1), as msgspec Structs tagged by ``type``.

This module is shared by the node (``turnstile.runtime.gateway``, which decodes the client
frames and builds the server's answers) and by ``turnstile.client``, which encodes the client
frames and decodes the answers. It imports nothing of Turnstile, so a client that uses it loads
no part of the server.

* **Client → server** frames (``AttachFrame`` … ``UnsubscribeFrame``, the ``ClientFrame``
  union) are strict: an unknown field is an error (``forbid_unknown_fields``), values are
  bounded in their types.
* **Server → client** answers (``Attached``, ``Ack``, ``Result``, ``ErrorFrame`` …, the
  ``ServerFrame`` union) are lenient: a client ignores fields it does not know, so the
  protocol can add optional fields without a new version.

Session events (``stream_delta``, ``job_update`` …) are not here: each is a Struct of the
feature that emits it (``docs/protocol.md``).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_SEQ",
    "SESSION_ID_PATTERN",
    "TOPIC_PATTERN",
    "SessionId",
    "ClientMsgId",
    "Traceparent",
    "Tracestate",
    "TopicName",
    "ToolName",
    "ClientFrameBase",
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
    "ServerFrameBase",
    "Attached",
    "SessionSyncFrame",
    "Ack",
    "CallError",
    "Result",
    "ErrorFrame",
    "Detached",
    "Stopping",
    "PolicySet",
    "ApprovalDecided",
    "Subscribed",
    "TopicSync",
    "Unsubscribed",
    "SessionDeleted",
    "ServerFrame",
]

PROTOCOL_VERSION = 1

#: What a session id (and any id a client puts in a URL) may be: 1-128 of ``A-Z a-z 0-9 _ . : -``.
#: Anchored with ``\A`` and ``\Z``: msgspec applies patterns with ``re.search``, and ``$``
#: also matches before a trailing newline, which let ``"s1\n"`` through.
SESSION_ID_PATTERN = r"\A[A-Za-z0-9_.:-]{1,128}\Z"

#: The largest ``seq`` (the store's 64-bit signed integer).
MAX_SEQ = 2**63 - 1

SessionId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=SESSION_ID_PATTERN)]
ClientMsgId = Annotated[str, msgspec.Meta(max_length=128)]
#: A W3C trace context ``traceparent`` (``00-<trace id>-<span id>-<flags>``); bounded here, and a
#: malformed one is ignored by the node (the turn starts a trace of its own), as W3C asks.
Traceparent = Annotated[str, msgspec.Meta(max_length=256)]
#: A W3C trace context ``tracestate`` (vendors' ``key=value`` entries, comma-separated), sent with
#: a ``traceparent``; bounded here, and kept by the node as W3C allows (at most 32 entries and
#: 512 characters, cut by whole entries), a malformed one dropped, never an error.
Tracestate = Annotated[str, msgspec.Meta(max_length=8192)]
#: A user topic's name: a short lowercase word (``memory``).
TOPIC_PATTERN = r"\A[a-z][a-z0-9_.-]{0,63}\Z"
TopicName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=TOPIC_PATTERN)]
ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]


# ---- client -> server ------------------------------------------------------------------------


class ClientFrameBase(
    msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """Base of the frames a client sends: tagged by ``type``; an unknown field is an error."""


class AttachFrame(ClientFrameBase, tag="attach"):
    """Watch a session. With ``after_seq``, first replay every event after it."""

    session_id: SessionId
    after_seq: Seq | None = None


class DetachFrame(ClientFrameBase, tag="detach"):
    """Stop watching a session."""

    session_id: SessionId


class SendFrame(ClientFrameBase, tag="send"):
    """A user message; acknowledged with ``ack`` once it is stored.

    ``client_msg_id`` is the message's idempotency key in its session: sent again with the same
    id, the same ``ack`` comes back and no second turn starts. ``traceparent`` (W3C trace
    context) makes the message's turn part of the caller's trace, when the node traces
    (``docs/tracing.md``); ``tracestate`` goes with it (without a ``traceparent`` it is
    ignored), stored with the message and carried into its turn."""

    session_id: SessionId
    content: str
    client_msg_id: ClientMsgId | None = None
    traceparent: Traceparent | None = None
    tracestate: Tracestate | None = None


class StopFrame(ClientFrameBase, tag="stop"):
    """Cancel the session's running turn (it closes as ``stopped``)."""

    session_id: SessionId


class CallFrame(ClientFrameBase, tag="call"):
    """Invoke a tool or primitive by name; answered by ``result`` with the same ``id``."""

    id: ClientMsgId
    session_id: SessionId
    tool: ToolName
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class SetPolicyFrame(ClientFrameBase, tag="set_policy"):
    """Set what happens to user messages sent during a turn."""

    session_id: SessionId
    policy: str


class ApproveFrame(ClientFrameBase, tag="approve"):
    """Approve a pending tool call (``approval_required``)."""

    session_id: SessionId
    approval_id: ClientMsgId


class DenyFrame(ClientFrameBase, tag="deny"):
    """Refuse a pending tool call."""

    session_id: SessionId
    approval_id: ClientMsgId


class SubscribeFrame(ClientFrameBase, tag="subscribe"):
    """Receive the user's events of a topic. With ``after_seq``, first replay what the topic's
    log holds after it."""

    topic: TopicName
    after_seq: Seq | None = None


class UnsubscribeFrame(ClientFrameBase, tag="unsubscribe"):
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


# ---- server -> client (answers; session events are the features' Structs) --------------------


class ServerFrameBase(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Base of the frames the node answers with (fields a client does not know are ignored)."""


class Attached(ServerFrameBase, tag="attached"):
    """``attach`` succeeded; replayed events (with ``after_seq``) and ``session_sync`` follow.

    Attributes:
        session_id: the session.
        last_seq: the ``seq`` of its last stored event.
    """

    session_id: str
    last_seq: int


class SessionSyncFrame(ServerFrameBase, tag="session_sync"):
    """The end of an attach's replay: live events follow. (A stored ``session_sync`` event, which
    a headless turn ends with, has a ``ts`` and an ``input_id``; this frame has neither.)

    Attributes:
        session_id: the session.
        seq: the last event the client has now.
        busy: whether a turn runs.
        policy: what a message sent during a turn does.
        queued: inputs waiting.
        current_input_id: the running turn's input, when one runs.
    """

    session_id: str
    seq: int
    busy: bool
    policy: str
    queued: int
    current_input_id: int | None = None


class Ack(ServerFrameBase, tag="ack"):
    """A ``send`` is stored (durable).

    Attributes:
        session_id: the session.
        input_id: its inbox id; None when it was folded into the running turn.
        injected: true when folded into the running turn (policy ``inject``).
        client_msg_id: the ``send``'s ``client_msg_id``.
    """

    session_id: str
    input_id: int | None = None
    injected: bool = False
    client_msg_id: str | None = None


class CallError(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Why a tool call failed (``result.error``): ``unknown_tool``, ``bad_arguments``,
    ``blocked``, ``denied`` …, with the argument it is about."""

    code: str
    message: str = ""
    field: str | None = None


class Result(ServerFrameBase, tag="result"):
    """The answer to a ``call`` with the same ``id``: ``data`` when ``ok``, else ``error``."""

    id: str
    ok: bool
    data: Any = None
    error: CallError | None = None


class ErrorFrame(ServerFrameBase, tag="error"):
    """A refused frame, or news about the connection (``lagged``).

    Attributes:
        code: the stable error code (``docs/protocol.md``, "Error codes").
        message: what went wrong, for people.
        field: the offending field, when one is.
        session_id: the session it concerns.
        id: the ``call`` it answers.
        topic: the topic it concerns (a refused ``subscribe``, ``lagged`` on a topic).
        last_seq: (``lagged``) the last event sent: re-attach with ``after_seq`` set to it.
    """

    code: str
    message: str = ""
    field: str | None = None
    session_id: str | None = None
    id: str | None = None
    topic: str | None = None
    last_seq: int | None = None


class Detached(ServerFrameBase, tag="detached"):
    """``detach`` is done."""

    session_id: str


class Stopping(ServerFrameBase, tag="stopping"):
    """``stop`` is done; ``running`` says whether a turn was running (it ends ``stopped``)."""

    session_id: str
    running: bool


class PolicySet(ServerFrameBase, tag="policy"):
    """``set_policy`` is done."""

    session_id: str
    policy: str


class ApprovalDecided(ServerFrameBase, tag="approval"):
    """``approve`` or ``deny`` is done."""

    approval_id: str
    decision: str
    session_id: str


class Subscribed(ServerFrameBase, tag="subscribed"):
    """``subscribe`` succeeded; ``reset``: what followed ``after_seq`` is gone, reload."""

    topic: str
    last_seq: int
    reset: bool = False


class TopicSync(ServerFrameBase, tag="topic_sync"):
    """The end of a subscription's replay: live events follow."""

    topic: str
    seq: int


class Unsubscribed(ServerFrameBase, tag="unsubscribed"):
    """``unsubscribe`` is done."""

    topic: str


class SessionDeleted(ServerFrameBase, tag="session_deleted"):
    """The session was deleted; the client is detached from it (``last_seq``: the last event it
    was sent)."""

    session_id: str
    last_seq: int


ServerFrame = (
    Attached
    | SessionSyncFrame
    | Ack
    | Result
    | ErrorFrame
    | Detached
    | Stopping
    | PolicySet
    | ApprovalDecided
    | Subscribed
    | TopicSync
    | Unsubscribed
    | SessionDeleted
)
