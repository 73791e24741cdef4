"""What the gateway needs from the sessions behind it, and what it gives them.

The gateway (HTTP + WebSocket) knows nothing about session actors: it talks to a
``SessionBackend`` (implemented by the sessions feature's directory) and hands each attached
client to sessions as a ``Subscriber``. Every backend call takes the authenticated user's name;
a session owned by someone else is ``NotFound`` — never "forbidden" — so ids do not leak.

A client's message may carry an id of its own (the WebSocket ``send`` frame's
``client_msg_id``, HTTP's ``Idempotency-Key`` header): ``submit_from_client`` makes it the
input's idempotency key, so a resend (after a reconnect, a timeout) answers the input already
stored instead of starting a second turn.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import msgspec

from turnstile.runtime.errors import IdempotencyKeyReused, InvalidArgument
from turnstile.runtime.store import EventRecord

__all__ = [
    "CLIENT_KEY_PREFIX",
    "MAX_CLIENT_KEY_CHARS",
    "Attached",
    "CallResult",
    "SessionBackend",
    "Submitted",
    "Subscriber",
    "client_key",
    "submit_from_client",
]

#: What a client's message id becomes in the session's key space (shared with other ingress,
#: which names its own keys: ``github:<delivery id>``), so no client id can take another's key.
CLIENT_KEY_PREFIX = "client:"
#: The longest message id a client may send (``client_msg_id``, ``Idempotency-Key``).
MAX_CLIENT_KEY_CHARS = 128
_VISIBLE_ASCII = re.compile(r"[!-~]+")


class CallResult(Protocol):
    """The outcome of a ``call`` frame as the gateway answers it (the tool system's
    ``ToolResult`` has this shape; the gateway does not import it). Read-only, so that a
    frozen Struct such as ``ToolResult`` has it."""

    @property
    def ok(self) -> bool:
        """Whether the tool succeeded."""
        ...

    @property
    def data(self) -> Any:
        """The tool's result when ``ok``."""
        ...

    @property
    def error(self) -> dict[str, Any] | None:
        """``{"code": …, "message": …, "field"?: …}`` when not ``ok``."""
        ...


class Submitted(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The acknowledgement of a turn input: it is durable.

    Attributes:
        input_id: the inbox id; None when the input was folded into the running turn.
        injected: True when folded into the running turn (policy ``inject``).
        replayed: True when the input's idempotency key was already taken: this is the
            answer the first submit got, and nothing new was stored or started.
    """

    input_id: int | None = None
    injected: bool = False
    replayed: bool = False


class Attached(msgspec.Struct, frozen=True, kw_only=True):
    """A session's state at the moment a client attached."""

    last_seq: int
    busy: bool
    policy: str
    queued: int
    current_input_id: int | None


class Subscriber(Protocol):
    """An attached client, as a session sees it."""

    def offer(self, session_id: str, seq: int, frame: bytes) -> bool:
        """Queue an encoded event without blocking; False means the client fell behind."""
        ...

    def lagged(self, session_id: str, last_seq: int) -> None:
        """The session dropped this client because it fell behind; ``last_seq`` is the last
        event it was offered in order, to re-attach from."""
        ...

    def deleted(self, session_id: str) -> None:
        """The session was deleted: it drops every client and will offer nothing more."""
        ...


class SessionBackend(Protocol):
    """Sessions as the WebSocket protocol reaches them. Every method checks that ``user`` owns
    the session. (HTTP routes, sessions' included, are mounted by the features themselves.)"""

    async def ping(self) -> None:
        """Raise if the node cannot serve (the store does not answer)."""
        ...

    async def submit(
        self,
        user: str,
        session_id: str,
        content: str,
        payload: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Submitted:
        """Store a user message as a turn input. With ``idempotency_key``, at most once per
        session: a key already taken answers the first submit's ``Submitted`` with
        ``replayed=True``; a key already taken by a different input is
        ``IdempotencyKeyReused``."""
        ...

    async def stop(self, user: str, session_id: str) -> bool: ...

    async def set_policy(self, user: str, session_id: str, policy: str) -> str: ...

    async def attach(self, user: str, session_id: str, subscriber: Subscriber) -> Attached: ...

    async def detach(self, user: str, session_id: str, subscriber: Subscriber) -> None: ...

    async def read_events(
        self, user: str, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[EventRecord]: ...

    async def call_tool(
        self, user: str, session_id: str, tool: str, arguments: dict[str, Any]
    ) -> CallResult: ...

    async def resolve_approval(self, user: str, approval_id: str, approved: bool) -> dict[str, Any]:
        """Approve or deny a pending tool call of one of ``user``'s sessions."""
        ...


def client_key(client_id: str | None, field: str) -> str | None:
    """The idempotency key for a client's message id: ``client:<id>``, or None without one.

    Raises:
        InvalidArgument: the id is not 1 to :data:`MAX_CLIENT_KEY_CHARS` visible ASCII
            characters (``!`` to ``~``); ``field`` names where it came from.
    """
    if client_id is None:
        return None
    if not 1 <= len(client_id) <= MAX_CLIENT_KEY_CHARS or not _VISIBLE_ASCII.fullmatch(client_id):
        raise InvalidArgument(
            f"{field} must be 1 to {MAX_CLIENT_KEY_CHARS} visible ASCII characters"
            " (no spaces or control characters)",
            field=field,
        )
    return CLIENT_KEY_PREFIX + client_id


async def submit_from_client(
    backend: SessionBackend,
    user: str,
    session_id: str,
    content: str,
    client_id: str | None,
    field: str,
) -> Submitted:
    """``backend.submit`` for a client's message, ``client_id`` as its idempotency key.

    Raises:
        InvalidArgument: ``client_id`` is malformed (see ``client_key``).
        IdempotencyKeyReused: ``client_id`` already names another message of the session;
            ``field`` names where the id came from.
    """
    key = client_key(client_id, field)
    try:
        return await backend.submit(user, session_id, content, idempotency_key=key)
    except IdempotencyKeyReused:
        raise IdempotencyKeyReused(
            f"{field} {client_id!r} was already used for another message of this session;"
            " a resend must repeat the message exactly",
            field=field,
        ) from None
