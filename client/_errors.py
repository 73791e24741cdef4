"""What can go wrong, as exceptions carrying the protocol's error codes (``docs/protocol.md``).

::

    TurnstileClientError            code, message, field, status
    ├── BadRequest                  bad_message, invalid_argument (400)
    ├── Unauthorized                unauthorized (401)
    ├── Forbidden                   forbidden (403)
    ├── NotFound (LookupError)      not_found (404)
    │   └── SessionDeleted          the attached session was deleted
    ├── Conflict                    busy, conflict, idempotency_key_reused,
    │                               blocked_by_automations (409)
    ├── PlacedElsewhere             placed_elsewhere (421): ``node``, ``node_address``
    ├── LimitExceeded               limit_exceeded (429)
    ├── ServerError                 internal, store_error (500)
    │   └── StoreUnavailable        store_unavailable (503): retry later
    ├── ToolError                   a ``call`` whose result is not ok (unknown_tool,
    │                               bad_arguments, blocked, denied, requires_approval …)
    └── ConnectionLost              the node could not be reached, or the connection dropped
                                    before the answer came (code ``connection_lost``)

A code this client does not know becomes a plain ``TurnstileClientError`` with that code, so a
newer node's errors are never lost.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TurnstileClientError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "SessionDeleted",
    "Conflict",
    "PlacedElsewhere",
    "LimitExceeded",
    "ServerError",
    "StoreUnavailable",
    "ToolError",
    "ConnectionLost",
]


class TurnstileClientError(Exception):
    """An error the node answered, or a failure to reach it.

    Attributes:
        code: the protocol's stable code (``not_found``, ``busy`` …).
        message: the node's message, for people.
        field: the field or header it is about, when one is.
        status: the HTTP status, for an answer over HTTP; None over the WebSocket.
        details: the rest of the error body (``automations`` of a blocked delete, ``node`` of
            ``placed_elsewhere``, ``last_seq`` …).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        field: str | None = None,
        status: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" + (f" (field {field})" if field else ""))
        self.code = code
        self.message = message
        self.field = field
        self.status = status
        self.details = details or {}


class BadRequest(TurnstileClientError):
    """The request was malformed or a value out of bounds (``field`` says which)."""


class Unauthorized(TurnstileClientError):
    """A missing or unknown token, or a refused origin."""


class Forbidden(TurnstileClientError):
    """A valid token whose user may not do this."""


class NotFound(TurnstileClientError, LookupError):
    """No such session, job, watcher … (or not yours: it answers the same)."""


class SessionDeleted(NotFound):
    """The session this stream was attached to was deleted."""


class Conflict(TurnstileClientError):
    """The session refuses work now (``busy``), the state forbids it (``conflict``), a
    ``client_msg_id`` was used for another message (``idempotency_key_reused``) …"""


class PlacedElsewhere(TurnstileClientError):
    """Another node holds the session (several nodes on one PostgreSQL)."""


class LimitExceeded(TurnstileClientError):
    """Too many sessions, queued inputs or calls in flight."""


class ServerError(TurnstileClientError):
    """The node failed (a bug, or its store); it logged why."""


class StoreUnavailable(ServerError):
    """The node's store cannot be reached now: the node's problem, retry later."""


class ToolError(TurnstileClientError):
    """A tool ``call`` answered ``ok: false`` (``unknown_tool``, ``bad_arguments``, ``blocked``,
    ``denied`` …)."""


class ConnectionLost(TurnstileClientError):
    """The node could not be reached, or the connection dropped before the answer came."""

    def __init__(self, message: str) -> None:
        super().__init__("connection_lost", message)


_BY_CODE: dict[str, type[TurnstileClientError]] = {
    "bad_message": BadRequest,
    "invalid_argument": BadRequest,
    "payload_too_large": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "busy": Conflict,
    "conflict": Conflict,
    "idempotency_key_reused": Conflict,
    "blocked_by_automations": Conflict,
    "placed_elsewhere": PlacedElsewhere,
    "limit_exceeded": LimitExceeded,
    "internal": ServerError,
    "store_error": ServerError,
    "store_unavailable": StoreUnavailable,
}


def error_for(
    code: str,
    message: str,
    *,
    field: str | None = None,
    status: int | None = None,
    details: dict[str, Any] | None = None,
) -> TurnstileClientError:
    """The exception for an error the node answered with ``code`` (a plain
    ``TurnstileClientError`` for a code this client does not know)."""
    kind = _BY_CODE.get(code)
    if kind is None:
        kind = ServerError if status is not None and status >= 500 else TurnstileClientError
    return kind(code, message, field=field, status=status, details=details)
