"""What the gateway needs from the sessions behind it, and what it gives them.

The gateway (HTTP + WebSocket) knows nothing about session actors: it talks to a
``SessionBackend`` (implemented by the sessions feature's directory) and hands each attached
client to sessions as a ``Subscriber``. Every backend call takes the authenticated user's name;
a session owned by someone else is ``NotFound`` — never "forbidden" — so ids do not leak.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from turnstile.runtime.store import EventRecord

__all__ = ["Attached", "CallResult", "SessionBackend", "Submitted", "Subscriber"]


class CallResult(Protocol):
    """The outcome of a ``call`` frame as the gateway answers it (the tool system's
    ``ToolResult`` has this shape; the gateway does not import it)."""

    ok: bool
    data: Any
    error: dict[str, Any] | None


class Submitted(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The acknowledgement of a turn input: it is durable.

    Attributes:
        input_id: the inbox id; None when the input was folded into the running turn.
        injected: True when folded into the running turn (policy ``inject``).
    """

    input_id: int | None = None
    injected: bool = False


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

    def metrics(self) -> dict[str, float]:
        """Prometheus samples by name (labels inline, e.g. ``turns_total{status="failed"}``)."""
        ...

    async def submit(
        self, user: str, session_id: str, content: str, payload: dict[str, Any] | None = None
    ) -> Submitted: ...

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
