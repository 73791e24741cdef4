"""The session actor's messages: what its mailbox takes, and the snapshot it answers with.

Control messages (``Attach``, ``StopTurn``, ``SetPolicy``, …) are answered at once, even
mid-turn. ``Submit`` and ``Inject`` carry turn inputs; ``Delivered`` and ``Publish`` come from
other features (the scheduler put an input straight into the inbox; an event to append).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from turnstile.actors.sessions.event_types import SessionEvent
from turnstile.runtime.codec import Message
from turnstile.runtime.tracing import current_trace

__all__ = [
    "POLICIES",
    "Policy",
    "Submit",
    "Attach",
    "Detach",
    "StopTurn",
    "SetPolicy",
    "Inject",
    "GetStatus",
    "SessionStatus",
    "Wake",
    "Delivered",
    "Arrived",
    "StopInput",
    "FoldInput",
    "Publish",
    "DeleteSession",
    "HandOver",
    "HandedOver",
]

POLICIES = ("enqueue", "reject", "interrupt", "inject")
Policy = Literal["enqueue", "reject", "interrupt", "inject"]


class Submit(Message, tag="submit", kw_only=True):
    """A turn input: store it, then run it (or fold it in, by policy).

    ``payload`` (with ``content``) must decode as the input ``source`` names
    (``inputs.decode_payload``); one that does not is refused with ``InputPayloadError``
    before anything is stored. Only a ``user`` input follows the session's policy.

    ``idempotency_key`` makes the submit happen at most once per session and key, whoever sends
    it and however often (a client's resend, a webhook redelivered, concurrent duplicates, a
    restart in between): the first stores the input; every later one answers what the first
    did (``Submitted`` with the same ``input_id``, or ``injected``) with ``replayed=True`` and
    stores or starts nothing. The same key with a different ``source``, ``content`` or
    ``payload`` is refused (``IdempotencyKeyReused``). A key is 1 to 255 visible ASCII
    characters, unique per session, kept as long as the input's inbox row (rows go with their
    session), and namespaced by whoever makes it: ``client:<id>`` for clients' message ids,
    ``github:<X-GitHub-Delivery>`` for GitHub deliveries and so on.

    ``trace``: the span the submit was made in (W3C headers: its ``traceparent``, and the
    trace's ``tracestate`` if it has one; taken when the message is made; None when the node
    does not trace): the input is stored with it, and its turn continues that trace.
    """

    source: str = "user"
    content: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    idempotency_key: str | None = None
    trace: dict[str, str] | None = msgspec.field(default_factory=current_trace)


class Attach(Message, tag="attach"):
    """Start offering live events to ``subscriber``."""

    subscriber: Any


class Detach(Message, tag="detach"):
    """Stop offering events to ``subscriber``."""

    subscriber: Any


class StopTurn(Message, tag="stop_turn"):
    """Cancel the running turn, if any; it closes as ``stopped``. Returns whether one ran."""


class SetPolicy(Message, tag="set_policy"):
    """Change what happens to user messages that arrive during a turn."""

    policy: str


class Inject(Message, tag="inject", kw_only=True):
    """A notification for the session: into the running turn, or a turn of its own.

    ``idempotency_key``: as ``Submit``'s (an input folded into the running turn keeps its key
    too, in an inbox row that never runs). ``trace``: as ``Submit``'s.
    """

    source: str = "notification"
    content: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    idempotency_key: str | None = None
    trace: dict[str, str] | None = msgspec.field(default_factory=current_trace)


class GetStatus(Message, tag="get_status"):
    """Ask for a ``SessionStatus``."""


class SessionStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of a session actor."""

    session_id: str
    busy: bool
    policy: str
    queued: int
    current_input_id: int | None
    subscribers: int
    last_seq: int


class Wake(Message, tag="wake"):
    """Run whatever is queued (sent at start-up to sessions with queued inputs)."""


class Delivered(Message, tag="delivered", kw_only=True):
    """The scheduler put a turn input straight into the inbox (in its fire transaction).

    Attributes:
        input_id: the inbox row.
        source: its source (``cron``, ``recall``, …).
        job_update: the scheduler's ``job_update`` event about the fire.
        events: more events about the fire, emitted after ``job_update`` and before
            ``turn_queued`` (a recall's ``recall_update``).
    """

    input_id: int
    source: str
    job_update: SessionEvent
    events: list[SessionEvent] = msgspec.field(default_factory=list)


class Arrived(Message, tag="arrived", kw_only=True):
    """Another node stored an input of this session in the inbox (a client of that node sent
    it; ``actors.sessions.remote``): say it is queued and run it.

    Attributes:
        input_id: the inbox row.
        source: its source.
    """

    input_id: int
    source: str


class StopInput(Message, tag="stop_input", kw_only=True):
    """Another node recorded a stop (or an ``interrupt`` message) for the turn of one input
    (``actors.sessions.remote``): cancel that turn if it is the one running. Answers True
    once the request is settled (done, or that turn ended: the next one is never stopped),
    False while that turn has not started here yet.

    Attributes:
        input_id: the input whose turn to stop.
        status: what the turn closes as: ``stopped`` or ``interrupted``.
    """

    input_id: int
    status: str = "stopped"


class FoldInput(Message, tag="fold_input", kw_only=True):
    """Another node stored a user message while the turn of ``into`` ran and the session's
    policy was ``inject``: fold the stored input into that turn if it still runs (otherwise
    it runs as a turn of its own). Answers as ``StopInput``.

    Attributes:
        input_id: the stored (queued) input.
        into: the input whose turn was running when it was stored.
    """

    input_id: int
    into: int


class Publish(Message, tag="publish", kw_only=True):
    """Append an event to the session's log and offer it to attached clients.

    Attributes:
        event: the event; its feature defines its Struct (``event_types.SessionEvent``).
    """

    event: SessionEvent


class HandOver(Message, tag="hand_over"):
    """A draining node gives the session up (several nodes): when no turn runs and every
    event is stored (and so offered), answer a ``HandedOver`` and stop, which releases the
    lease; otherwise answer None and go on."""


class HandedOver(msgspec.Struct, frozen=True):
    """The clients a session watched by, which now follow it from the store.

    Attributes:
        subscribers: its attached clients (no longer attached to it).
        public_id: the session id they know it by.
        last_seq: the last event offered to them.
    """

    subscribers: tuple[Any, ...]
    public_id: str
    last_seq: int


class DeleteSession(Message, tag="delete_session"):
    """Stop the running turn, drop every subscriber, delete the session from the store."""
