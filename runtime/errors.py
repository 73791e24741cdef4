"""Every exception Turnstile raises, in one place.

The hierarchy::

    TurnstileError
    ├── ActorError
    │   ├── MailboxFull            tell_nowait on a full mailbox (a WouldBlock for actors)
    │   ├── ActorStopped           the actor stopped before handling the message
    │   ├── ActorCrashed           the actor crashed and was given up on
    │   ├── PlacedElsewhere        another node holds the address's lease (HTTP 421)
    │   └── SupervisorEscalation   a supervisor exceeded its restart intensity
    ├── DecodeError                a malformed or unknown message; ``field`` names the culprit
    │   └── PayloadTooLarge        a request body over its route's limit (HTTP 413)
    ├── InvalidArgument            a well-formed request with a value out of bounds (``field``)
    ├── LimitExceeded              a configured limit was reached (sessions per user, queue depth)
    ├── Busy                       the target refuses work now (a session with policy reject)
    ├── Unauthorized               no valid token
    ├── Forbidden                  a valid token, but not allowed this (HTTP 403)
    ├── RequestTimeout             a client took too long to send its request (HTTP 408)
    ├── TimerError                 misuse of the timer wheel (past deadline, unknown handle)
    └── StoreError                        the store failed: the server's problem (HTTP 500)
        ├── StoreUnavailable              the store cannot be reached now (HTTP 503, Retry-After)
        ├── NotFound (also LookupError)   no row with that id
        ├── AlreadyExists                 a row with that id exists
        ├── ConflictError                 a compare-and-set lost, or a state transition is illegal
        │   ├── BlockedByAutomations      a session still has scheduled jobs bound to it
        │   ├── IdempotencyKeyReused      an idempotency key already names a different input
        │   ├── LeaseLost                 this node's row was taken over: it must stop serving
        │   └── Fenced                    a session write carried a lease epoch that moved on
        └── MigrationError                the schema could not be brought up to date

Each error carries a stable ``code`` so that it can cross the wire unchanged, and a ``field``:
the input at fault, for the errors that name one (None otherwise).
"""

from __future__ import annotations

from typing import Any


class TurnstileError(Exception):
    """Base of every error Turnstile raises on purpose."""

    code: str = "internal"
    #: the input at fault (a parameter, a header, a JSON path), for errors that name one
    field: str | None = None


class ActorError(TurnstileError):
    """Something went wrong delivering to, or running, an actor."""

    code = "actor_error"


class MailboxFull(ActorError):
    """``tell_nowait`` found the mailbox at capacity; await ``tell`` to wait instead."""

    code = "busy"


class ActorStopped(ActorError):
    """The actor stopped (or was never running) before it could handle the message."""

    code = "actor_stopped"


class ActorCrashed(ActorError):
    """The actor crashed more often than its supervisor allows and was given up on."""

    code = "actor_crashed"


class PlacedElsewhere(ActorError):
    """The registry's placement put this address on another node; nothing was activated here.

    The gateway answers it with HTTP 421 (Misdirected Request) naming the node and where it
    can be reached, so a client or a load balancer can go there.

    Attributes:
        address: the actor's address (``kind:key``).
        node: the id of the node that holds it, when the placement knows it.
        node_address: where that node can be reached (its gateway's URL), when it said.
    """

    code = "placed_elsewhere"

    def __init__(
        self, address: str, node: str | None = None, node_address: str | None = None
    ) -> None:
        where = f"node {node!r}" if node else "another node"
        if node_address:
            where += f" at {node_address}"
        super().__init__(f"{address} lives on {where}")
        self.address = address
        self.node = node
        self.node_address = node_address


class SupervisorEscalation(ActorError):
    """A supervisor exceeded its restart intensity and hands the failure to its parent.

    Attributes:
        supervisor: name of the supervisor that gave up.
        report: the crash report of the last failure.
    """

    code = "supervisor_escalation"

    def __init__(self, supervisor: str, report: object) -> None:
        super().__init__(f"supervisor {supervisor!r} exceeded its restart intensity: {report}")
        self.supervisor = supervisor
        self.report = report


class DecodeError(TurnstileError):
    """A message could not be decoded.

    Attributes:
        field: dotted path of the offending field (``"$.session_id"``), or None when the
            payload as a whole is malformed.
    """

    code = "bad_message"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class PayloadTooLarge(DecodeError):
    """A request body is (or says it is) larger than its route allows; answered 413."""

    code = "payload_too_large"


class InvalidArgument(TurnstileError, ValueError):
    """A value is out of bounds or not allowed.

    Attributes:
        field: the offending field's name, if there is one.
    """

    code = "invalid_argument"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class LimitExceeded(TurnstileError):
    """A configured limit was reached; the message names the limit."""

    code = "limit_exceeded"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Busy(TurnstileError):
    """The target cannot take this work right now; retry later."""

    code = "busy"


class Unauthorized(TurnstileError):
    """The request carries no valid token."""

    code = "unauthorized"


class Forbidden(TurnstileError):
    """A valid token whose user may not do this (an admin-only option): HTTP 403.

    Attributes:
        field: the option at fault (``all_users``), when one is.
    """

    code = "forbidden"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RequestTimeout(TurnstileError):
    """A client did not send its whole request in time (``limits.body_timeout_seconds``)."""

    code = "request_timeout"


class TimerError(TurnstileError):
    """The timer wheel was used in a way it does not allow."""

    code = "timer_error"


class StoreError(TurnstileError):
    """A store operation failed."""

    code = "store_error"


class StoreUnavailable(StoreError):
    """The store cannot be reached now: the database refuses or drops connections, stalls
    past the operation's bound, is shutting down or out of connections, or (SQLite) stays
    locked past its timeout or fails to read or write its files.

    The server's problem, never the request's: HTTP ``503`` with ``Retry-After``, an ``error``
    frame with this code on the WebSocket (the connection stays open). The message is always
    the same sentence: the database's host, port, SQL and driver text stay in the node's log.
    The node recovers on its own once the store answers again.

    Attributes:
        retry_after: seconds after which a client may try again (``Retry-After``).
    """

    code = "store_unavailable"
    retry_after: int = 5

    def __init__(self, message: str = "the store is unavailable; retry in a few seconds") -> None:
        super().__init__(message)


class NotFound(StoreError, LookupError):
    """No row with the given id."""

    code = "not_found"


class AlreadyExists(StoreError):
    """A row with the given id already exists."""

    code = "already_exists"


class ConflictError(StoreError):
    """A compare-and-set lost, or a state transition is not allowed from the current state.

    Attributes:
        field: the input that conflicts with what is stored (``source``), when one does.
    """

    code = "conflict"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class BlockedByAutomations(ConflictError):
    """Deleting a session that still has scheduled jobs needs confirmation.

    Attributes:
        automations: the bound jobs, as small views.
    """

    code = "blocked_by_automations"

    def __init__(self, message: str, automations: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.automations = automations


class IdempotencyKeyReused(ConflictError):
    """An idempotency key was sent again with a different input than the one it names.

    The first input under a key is the one kept; a retry must repeat it exactly. A conflict
    like any other over HTTP (``409``, with this code and the field), an ``error`` frame with
    this code over the WebSocket.

    Attributes:
        field: the field that carried the key (``idempotency_key``, ``client_msg_id``,
            ``Idempotency-Key``).
    """

    code = "idempotency_key_reused"

    def __init__(self, message: str, field: str | None = "idempotency_key") -> None:
        super().__init__(message)
        self.field = field


class LeaseLost(ConflictError):
    """This node may no longer serve: its row in ``nodes`` belongs to a newer epoch (another
    process started with the same node id), or it was declared dead (its lease expired and
    another node took its work over, or it was stopped).

    Raised by the heartbeat (``runtime.membership``); the node's serve loop ends with it.

    Attributes:
        node: the node id.
        epoch: the epoch that lost its lease.
    """

    code = "lease_lost"

    def __init__(self, message: str, *, node: str, epoch: int) -> None:
        super().__init__(message)
        self.node = node
        self.epoch = epoch


class Fenced(ConflictError):
    """A session write carried a lease epoch that is no longer the session's: the lease moved
    to another activation (this node was paused past its lease, or declared dead, and another
    node took the session), so the write was refused and nothing of it was stored.

    Raised by the store's fenced writes (claim an input, finish it, append events); the
    activation that gets it must stop: it is no longer the session's.

    Attributes:
        session_id: the session.
        fence: the lease epoch the write carried.
        current: the session's lease epoch now.
    """

    code = "fenced"

    def __init__(self, session_id: str, fence: int, current: int) -> None:
        super().__init__(
            f"session {session_id!r} moved: this write carried lease epoch {fence},"
            f" the session is at {current}"
        )
        self.session_id = session_id
        self.fence = fence
        self.current = current


class MigrationError(StoreError):
    """The schema could not be migrated (for example, it is newer than this code)."""

    code = "migration_error"
