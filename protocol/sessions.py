"""The sessions' HTTP answers (``docs/protocol.md``, "HTTP"), shared by the node's routes
(``actors/sessions/routes.py``) and ``turnstile.client``.

They are the wire format: the OpenAPI document (``/openapi.json``) is generated from these
Structs, and the client decodes the node's answers with them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

__all__ = [
    "Activity",
    "SessionView",
    "ListedSession",
    "SessionList",
    "MessageAccepted",
    "Stopped",
]


class SessionView(msgspec.Struct, kw_only=True):
    """A session, as its owner sees it: named, never keyed.

    Attributes:
        id: its name in the owner's namespace.
        owner: the user it belongs to.
        metadata: the JSON object given at creation.
        policy: what a message sent during a turn does (``docs/protocol.md``).
        created_at: when it was created (UTC).
        updated_at: when it last changed, appends to its event log included.
        last_seq: the ``seq`` of its last event (0: none yet).
    """

    id: str
    owner: str
    metadata: dict[str, Any]
    policy: str
    created_at: datetime
    updated_at: datetime
    last_seq: int


#: What a session is doing: ``running`` a turn, ``queued`` inputs waiting, or ``idle``.
Activity = Literal["running", "queued", "idle"]


class ListedSession(SessionView, kw_only=True):
    """A session in ``GET /sessions``: the session, its pending recall and its activity.

    Attributes:
        has_recall: whether a recall is pending.
        recall_trigger_at: the pending recall's trigger (ISO 8601), or null.
        status: ``running`` a turn, ``queued`` inputs waiting, or ``idle``.
        queued: inputs waiting in its inbox.
    """

    has_recall: bool
    recall_trigger_at: str | None
    status: Activity
    queued: int


class SessionList(msgspec.Struct):
    """``GET /sessions``: the caller's sessions, by id."""

    sessions: list[ListedSession]


class MessageAccepted(msgspec.Struct, omit_defaults=True):
    """``POST /sessions/{id}/messages``: the message is stored (durable).

    Attributes:
        input_id: its inbox id; null when it was folded into the running turn.
        injected: true when folded into the running turn (policy ``inject``).
        client_msg_id: the ``client_msg_id`` the body gave.
    """

    input_id: int | None
    injected: bool = False
    client_msg_id: str | None = None


class Stopped(msgspec.Struct):
    """``POST /sessions/{id}/stop``: whether a turn was running (it closes ``stopped``)."""

    stopped: bool
