"""The session actor: one agent session, one turn at a time.

A ``SessionActor`` is a virtual actor (``session:<id>``). Its mailbox takes control messages —
submit, attach, detach, stop, set_policy, inject, status, delete — and answers them at once, even
mid-turn, because the turn itself runs as a task in the actor's own nursery. Turn inputs are
durable: ``Submit`` writes the input to the session's inbox in the store *before* it answers,
so an acknowledged input survives a crash. A single runner task claims inputs from the inbox
oldest first and runs each as a turn, so turns never overlap and keep arrival order. Scheduled
inputs (cron, recall, heartbeat, …) are ordinary inbox rows: one that arrives during a turn
waits for the turn to end and is never folded into it.

User messages that arrive during a turn follow the session's policy:

* ``enqueue`` (default) — queue it; it runs after the current turn.
* ``reject`` — refuse it with ``Busy``.
* ``interrupt`` — queue it and cancel the running turn, which closes as ``interrupted``.
* ``inject`` — fold it into the running turn before its next model call.

Turns themselves are run by the actor's other half, ``runner.TurnRunner``: one runner task
claims the inbox's inputs oldest first and runs each as a turn, which its input's kind
(``kinds``, filled by the features) shapes, answers and settles; every turn that starts ends
with a visible closure.

Events are appended to the session's log in the store, then offered to every attached
subscriber (``events.EventLog``); the transcript (``history``) is derived from the same log
(``history``). The rest lives beside this module: the messages (``messages``), what the node
hands every session (``services``), the turn's context for the agent (``turn``), the input
kinds (``kinds``) and the sessions' own inputs (``inputs``), the scheduled-turn slots
(``slots``). This module re-exports the names other modules imported from it before the split.

It is over 400 lines because every message the mailbox answers (submit with its policies,
inject and fold, stop, hand-over, delete) reads and changes the same few fields of the running
session; splitting them further would pass that state around instead.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from turnstile.actors.sessions.agents.base import HistoryEntry
from turnstile.actors.sessions.event_types import (
    InjectedMessage,
    TurnQueued,
)
from turnstile.actors.sessions.events import MAX_UNSTORED_EVENTS, EventLog
from turnstile.actors.sessions.history import history_from_events, load_history
from turnstile.actors.sessions.ids import public_id
from turnstile.actors.sessions.messages import (
    POLICIES,
    Arrived,
    Attach,
    DeleteSession,
    Delivered,
    Detach,
    FoldInput,
    GetStatus,
    HandedOver,
    HandOver,
    Inject,
    Policy,
    Publish,
    SessionStatus,
    SetPolicy,
    StopInput,
    StopTurn,
    Submit,
    Wake,
)
from turnstile.actors.sessions.runner import (
    CLOSE_GRACE_SECONDS,
    CLOSE_TIMEOUT_SECONDS,
    UNREADABLE_INPUT,
    TurnRunner,
    _raw_content,
)
from turnstile.actors.sessions.services import (
    SessionLimits,
    SessionServices,
    ShapedTurn,
    ToolCaller,
    TurnShaper,
)
from turnstile.actors.sessions.slots import TurnSlots
from turnstile.actors.sessions.turn import Turn
from turnstile.runtime import tracing
from turnstile.runtime.actor import Actor
from turnstile.runtime.errors import (
    Busy,
    Fenced,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    PlacedElsewhere,
)
from turnstile.runtime.gateway.backend import Attached, Submitted, Subscriber
from turnstile.runtime.store import InboxItem, Session

# The names other modules import from here, from before this module was split: kept so that
# ``from turnstile.actors.sessions.actor import Submit`` and the like go on working.
__all__ = [
    "CLOSE_GRACE_SECONDS",
    "CLOSE_TIMEOUT_SECONDS",
    "UNREADABLE_INPUT",
    "POLICIES",
    "Policy",
    "MAX_UNSTORED_EVENTS",
    "SessionActor",
    "SessionServices",
    "SessionLimits",
    "ToolCaller",
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
    "Publish",
    "DeleteSession",
    "history_from_events",
    "load_history",
    "ShapedTurn",
    "TurnShaper",
]

log = logging.getLogger("turnstile.session")


class SessionActor(TurnRunner, Actor):
    """One session. Built by the registry from its id; see the module docstring."""

    uses_nursery = True

    def __init__(self, session_id: str, services: SessionServices) -> None:
        self.session_id = session_id
        #: The name the owner knows this session by: what its event frames carry.
        self.public_id = public_id(session_id)
        self.services = services
        self.session: Session | None = None
        self.history: list[HistoryEntry] = []
        self.subscribers: set[Subscriber] = set()
        self.turn: Turn | None = None
        #: the input of the last turn this activation started (requests from other nodes)
        self.last_turn_id: int | None = None
        self.runner_active = False
        self.runner_done: trio.Event | None = None
        self.wakeup_pending = False
        self.deleting = False
        #: This session's hold on the node's scheduled-turn slots.
        self.slots = TurnSlots(services, session_id)
        self.queued = 0
        #: The lease epoch this activation holds (several nodes; None on one): every claim,
        #: append and close carries it, and once the store refuses one (``Fenced``, the
        #: session moved to another node) this activation writes nothing more and stops.
        self.fence: int | None = None
        self.fenced = False
        self.events = EventLog(
            services.store,
            session_id,
            self.public_id,
            services.encode_event,
            self.subscribers,
            lambda: self._tasks,
        )
        self.events.on_fenced = self._lost_lease

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the session's last stored event."""
        return self.events.last_seq

    # -- lifecycle --

    async def on_start(self) -> None:
        store = self.services.store
        placement = self.services.placement
        if placement is not None:
            self.fence = self.events.fence = placement.fence(f"session:{self.session_id}")
        if self.services.remote is not None:  # other nodes' clients follow what is stored
            self.events.on_stored = self.services.remote.stored
        try:
            self.session = await store.get_session(self.session_id)
        except NotFound:
            self.session = None  # deleted under us: every message answers NotFound
            return
        self.events.last_seq = self.session.last_seq
        self.history = await load_history(
            store, self.session_id, self.services.limits.history_entries
        )
        self.queued = len(await store.list_inputs(self.session_id, states=["queued"]))
        if self.queued:
            self._ensure_runner()

    def can_passivate(self) -> bool:
        return not self.runner_active and not self.subscribers and self.events.idle

    async def on_stop(self) -> None:
        if self.turn is not None:
            self.turn.cancel("interrupted")

    def _lost_lease(self, exc: Fenced) -> None:
        """The store refused a write: the session's lease moved to another node (this node
        was paused or cut off past its lease). Nothing more is written from here: the turn
        under way is cancelled (its closure is the new holder's recovery), no input is
        claimed, and the activation stops; the next message finds where the session lives."""
        if self.fenced:
            return
        self.fenced = True
        log.warning("session %s: %s; this activation stops", self.session_id, exc)
        if self.services.placement is not None:
            self.services.placement.fenced()
        if self.turn is not None:
            self.turn.cancel("interrupted")
        self.ref.stop_nowait()

    # -- messages --

    async def receive(self, message: Any) -> Any:
        if self.session is None:
            return self._gone(message)
        if self.fenced:  # the session is another node's now: the caller goes there
            raise PlacedElsewhere(f"session:{self.session_id}")
        try:
            return await self._receive(message)
        except Fenced as exc:  # a write of this message was refused: the lease moved
            self._lost_lease(exc)
            raise PlacedElsewhere(f"session:{self.session_id}") from exc

    async def _receive(self, message: Any) -> Any:
        match message:
            case Submit():
                return await self._submit(message)
            case Attach(subscriber=subscriber):
                self.subscribers.add(subscriber)
                return self._attached()
            case Detach(subscriber=subscriber):
                self.subscribers.discard(subscriber)
                return None
            case StopTurn():
                if self.turn is None:
                    return False
                self.turn.cancel("stopped")
                return True
            case SetPolicy(policy=policy):
                return await self._set_policy(policy)
            case StopInput(input_id=input_id, status=status):
                if self.turn is not None and self.turn.item.id == input_id:
                    self.turn.cancel(status)
                    return True
                return self._ended(input_id)
            case FoldInput():
                return await self._fold_stored(message.input_id, message.into)
            case Inject():
                return await self._inject(message)
            case GetStatus():
                return self._status()
            case Wake():
                self._ensure_runner()
                return None
            case Delivered():
                defer = self._starts_at_once()  # (then they go in with the turn's first write)
                for event in (message.job_update, *message.events):
                    await self._emit(event, defer=defer)
                await self._queued(message.input_id, message.source)
                return None
            case Arrived():
                await self._queued(message.input_id, message.source)
                return None
            case Publish():
                await self._emit(message.event)
                return None
            case DeleteSession():
                return await self._delete()
            case HandOver():
                return self._hand_over()
        raise InvalidArgument(f"session cannot handle {type(message).__name__}")

    def _gone(self, message: Any) -> None:
        """Answer a message for a session that does not exist (any more).

        The actor stops, so a session created later under the same key starts afresh.
        Notices that nobody asked for (a background result, a watcher escalation, a wake-up
        arriving after a delete) have no one to reach: they are dropped, never raised, since a
        raise from a ``tell`` would be reported as a crash. Everything else is ``NotFound``.
        """
        self.ref.stop_nowait()
        if isinstance(message, (Inject, Wake, Delivered, Publish)):
            log.info(
                "dropped %s for session %s: it no longer exists",
                type(message).__name__,
                self.session_id,
            )
            return None
        raise NotFound(f"no session with id {self.public_id!r}")

    def _attached(self) -> Attached:
        return Attached(
            last_seq=self.last_seq,
            busy=self.turn is not None,
            policy=self._loaded.policy,
            queued=self.queued,
            current_input_id=None if self.turn is None else self.turn.item.id,
        )

    def _status(self) -> SessionStatus:
        return SessionStatus(
            session_id=self.session_id,
            busy=self.runner_active,
            policy=self._loaded.policy,
            queued=self.queued,
            current_input_id=None if self.turn is None else self.turn.item.id,
            subscribers=len(self.subscribers),
            last_seq=self.last_seq,
        )

    async def _set_policy(self, policy: str) -> str:
        if policy not in POLICIES:
            raise InvalidArgument(
                f"policy must be one of {', '.join(POLICIES)}, got {policy!r}", field="policy"
            )
        self.session = await self.services.store.update_session(self.session_id, policy=policy)
        return policy

    async def _submit(self, msg: Submit) -> Submitted:
        if msg.trace is None:
            return await self._take(msg)
        # the sender's trace goes on here, and on into the turn through the stored input
        with tracing.span("session submit", parent=msg.trace) as span:
            span.update(
                {
                    "turnstile.session.id": self.public_id,
                    "turnstile.session.owner": self._loaded.owner,
                    "turnstile.input.source": msg.source,
                }
            )
            submitted = await self._take(msg)
            span.update(
                {
                    "turnstile.input.id": submitted.input_id,
                    "turnstile.input.injected": submitted.injected,
                    "turnstile.input.replayed": submitted.replayed,
                }
            )
            return submitted

    async def _take(self, msg: Submit) -> Submitted:
        """``Submit``: refused, folded into the running turn, or stored (see the module
        docstring)."""
        limits = self.services.limits
        if len(msg.content) > limits.max_content_chars:
            raise InvalidArgument(
                f"content is longer than {limits.max_content_chars} characters", field="content"
            )
        # Decoded here only to be refused at the door: the inbox keeps what was sent.
        self.services.input_kinds.decode(msg.source, {**msg.payload, "content": msg.content})
        from_user = msg.source == "user"
        key = msg.idempotency_key
        busy = self.turn is not None  # a turn is running right now (not merely queued)
        if busy and from_user and self.services.remote is not None:
            # several nodes: the policy may have been changed through another node
            self.session = await self.services.store.get_session(self.session_id)
        policy = self._loaded.policy
        if busy and from_user:
            if policy == "reject":
                return await self._unless_sent_before(
                    msg, Busy("session is busy with a turn and its policy is reject")
                )
            if policy == "inject" and self.turn is not None:
                return await self._fold_in(self.turn, msg.source, msg.content, msg.payload, key)
        if self.queued >= limits.max_queued_inputs:
            return await self._unless_sent_before(
                msg,
                LimitExceeded(
                    f"session has {self.queued} queued inputs (limit {limits.max_queued_inputs})"
                ),
            )
        trace = tracing.current_trace()
        item, created = await self._enqueue(msg.source, msg.content, msg.payload, key, trace)
        if not created:
            return _replayed(item)
        if busy and from_user and policy == "interrupt" and self.turn is not None:
            self.turn.cancel("interrupted")
        return Submitted(input_id=item.id)

    async def _unless_sent_before(self, msg: Submit, refusal: Exception) -> Submitted:
        """Answer a keyed input that was stored before as then; refuse anything else.

        A refusal (busy, queue full) is for new inputs: a resend of one already taken (its turn
        is what keeps the session busy) gets its first answer. Only refusals pay this read:
        elsewhere the unique index in ``_enqueue`` and ``_fold_in`` answers resends.
        """
        if msg.idempotency_key is not None:
            earlier = await self.services.store.keyed_input(
                self.session_id, msg.idempotency_key, source=msg.source, payload=_stored(msg)
            )
            if earlier is not None:
                return _replayed(earlier)
        raise refusal

    async def _enqueue(
        self,
        source: str,
        content: str,
        payload: dict[str, Any],
        key: str | None = None,
        trace: dict[str, str] | None = None,
    ) -> tuple[InboxItem, bool]:
        """Store an input to run as a turn; with ``key``, unless the key is taken. ``trace``
        (W3C headers: ``traceparent``, ``tracestate``) is stored with it, for its turn to
        continue.

        Returns:
            the row, and whether this call stored it (False: the key's row, left as it is).
        """
        store = self.services.store
        stored = tracing.carry({**payload, "content": content}, trace)
        # the input and its turn_queued in one commit while the log is idle (a session between
        # turns); else two writes, the announcement in order behind the rest
        ahead = self.queued + (1 if self.runner_active else 0)
        _, announced = TurnQueued(input_id=0, source=source, ahead=ahead).stored()
        del announced["input_id"]  # the store's to fill in
        answer = await self.events.enqueue(source, stored, ("turn_queued", announced), key)
        if answer is not None:
            item, created = answer
            if created:
                self.queued += 1
                self._ensure_runner()
            return item, created
        if key is None:
            item, created = await store.enqueue_input(self.session_id, source, stored), True
        else:
            enqueued = await store.enqueue_keyed(self.session_id, source, stored, key)
            item, created = enqueued.item, enqueued.created
        if created:
            self.queued += 1
            ahead = self.queued - 1 + (1 if self.runner_active else 0)
            await self._emit(TurnQueued(input_id=item.id, source=source, ahead=ahead))
            self._ensure_runner()
        return item, created

    async def _inject(self, msg: Inject) -> Submitted:
        key = msg.idempotency_key
        if self.turn is not None:
            return await self._fold_in(self.turn, msg.source, msg.content, msg.payload, key)
        item, created = await self._enqueue(msg.source, msg.content, msg.payload, key, msg.trace)
        return Submitted(input_id=item.id) if created else _replayed(item)

    async def _fold_in(
        self,
        turn: Turn,
        source: str,
        content: str,
        payload: dict[str, Any],
        key: str | None = None,
    ) -> Submitted:
        """Record an input as part of the running turn; the agent takes it before its next call.

        With ``key``, the key is kept first, in an inbox row that is already ``done`` (it never
        runs as a turn of its own) and names the turn it went into; a key already taken answers
        what it was taken by, and nothing is folded in.
        """
        kept: int | None = None
        if key is not None:
            enqueued = await self.services.store.enqueue_keyed(
                self.session_id,
                source,
                {**payload, "content": content},
                key,
                state="done",
                detail={"injected_into": turn.item.id},
            )
            if not enqueued.created:
                return _replayed(enqueued.item)
            kept = enqueued.item.id
            if self.turn is not turn:  # the turn closed while the key was stored
                return await self._unfold(kept, source)
        await self._emit(InjectedMessage.of(source, content, turn.item.id, payload))
        if self.turn is not turn:  # it closed meanwhile, and would never take it
            if kept is not None:
                return await self._unfold(kept, source)
            return await self._own_turn(source, content, payload)
        entry = HistoryEntry(role="user", content=content, source=source)
        turn.injections.append(entry)
        self._remember(entry)
        return Submitted(injected=True)

    async def _unfold(self, input_id: int, source: str) -> Submitted:
        """A folded input's row (kept ``done`` under its key, or moved there from another
        node) whose turn closed before the agent took it: queued again, to run as a turn of its
        own in the same row. Before, a second row was stored for that turn, so the session was
        told twice of one background task (the crash harness, ``background`` with a refused
        commit on PostgreSQL)."""
        item = await self.services.store.unfold_input(input_id, fence=self.fence)
        if item is not None:
            self.queued += 1
            ahead = self.queued - 1 + (1 if self.runner_active else 0)
            await self._emit(TurnQueued(input_id=input_id, source=source, ahead=ahead))
            self._ensure_runner()
        return Submitted(input_id=input_id)

    async def _own_turn(self, source: str, content: str, payload: dict[str, Any]) -> Submitted:
        """An input meant for a turn that ended before it got there: a turn of its own, as the
        injections a closing turn never took become (issue 23's survivor crash runs: a
        background task's keyed notice folded into a turn that closed while its key was
        stored was never seen by the agent)."""
        item, _ = await self._enqueue(source, content, {**payload, "was_injected": True})
        return Submitted(input_id=item.id)

    async def _queued(self, input_id: int, source: str) -> None:
        """An input stored without this actor (a fire, another node's client) is in the inbox:
        say it is queued and run it. With leases the runner asks the store until it has
        nothing, so it may have claimed the input already: then its ``stream_start`` is out,
        and a ``turn_queued`` after it (with a count one too high) would be wrong."""
        if self._started(input_id):
            return self.events.flush_deferred()
        self.queued += 1
        ahead = self.queued - 1 + (1 if self.turn is not None else 0)
        queued = TurnQueued(input_id=input_id, source=source, ahead=ahead)
        await self._emit(queued, defer=self._starts_at_once())
        self._ensure_runner()

    def _starts_at_once(self) -> bool:
        """Whether a runner started now claims at once (no turn or runner, nothing written):
        then an input's announcement waits for its turn's first write (``defer``)."""
        events = self.events
        return not self.runner_active and self.turn is None and (events.idle or events.deferring)

    def _started(self, input_id: int) -> bool:
        """Whether the turn of ``input_id`` started here (turns start in id order)."""
        return self.last_turn_id is not None and self.last_turn_id >= input_id

    def _ended(self, input_id: int) -> bool:
        """Whether the turn of ``input_id`` ran here and ended (asked once the running turn
        was found to be another's)."""
        return self._started(input_id)

    async def _fold_stored(self, input_id: int, into: int) -> bool:
        """Fold an input another node stored (``FoldInput``) into the turn of ``into``."""
        turn = self.turn
        if turn is None or turn.item.id != into:
            return self._ended(into)  # it ended first: the input runs as a turn of its own
        item = await self.services.store.fold_input(
            input_id, {"injected_into": into}, fence=self.fence
        )
        if item is None:  # no longer queued: it runs (or ran) as a turn of its own
            return True
        payload = {k: v for k, v in tracing.without_trace(item.payload).items() if k != "content"}
        content = _raw_content(item)
        if self.turn is not turn:  # the turn closed while the row moved: a turn of its own
            await self._unfold(input_id, item.source)
            return True
        await self._emit(InjectedMessage.of(item.source, content, into, payload))
        entry = HistoryEntry(role="user", content=content, source=item.source)
        turn.injections.append(entry)
        self._remember(entry)
        return True

    def _hand_over(self) -> HandedOver | None:
        """Give the session up to another node (this one drains): only between turns, with
        every event stored and offered, so its clients can follow it from the store from
        ``last_seq`` on without a gap."""
        if self.runner_active or self.turn is not None or not self.events.idle:
            return None
        handed = HandedOver(tuple(self.subscribers), self.public_id, self.last_seq)
        self.subscribers.clear()
        self.ref.stop_nowait()  # its lease is released as it stops
        return handed

    async def _delete(self) -> None:
        self.deleting = True  # the runner takes no further input
        if self.turn is not None:
            self.turn.cancel("stopped")
        self.slots.cancel_wait()
        if self.runner_active and self.runner_done is not None:
            await self.runner_done.wait()  # let the turn close before its rows go
        await self.events.all_stored()
        await self.services.store.delete_session(self.session_id)
        for subscriber in list(self.subscribers):
            subscriber.deleted(self.public_id)
        self.subscribers.clear()
        self.session = None
        self.ref.stop_nowait()


def _stored(msg: Submit) -> dict[str, Any]:
    """The payload an input is stored with: its own keys and its ``content``."""
    return {**msg.payload, "content": msg.content}


def _replayed(item: InboxItem) -> Submitted:
    """What a submit whose key ``item`` already holds answers: what the first one did."""
    if item.state == "done" and "injected_into" in (item.detail or {}):
        return Submitted(injected=True, replayed=True)
    return Submitted(input_id=item.id, replayed=True)
