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

Every turn that starts ends with a visible closure: a ``stream_end`` event whose ``status`` is
``completed``, ``empty``, ``failed`` (with a short message; the traceback goes to the inbox
row's detail, not the transcript), ``stopped`` or ``interrupted``.

A turn decodes its inbox row's payload once, by source (``inputs.decode_input``: a
``UserMessage``, a ``CronTrigger``, a ``HeartbeatRun``…), and branches on the decoded type. A
payload that does not decode fails its turn like any other failure (``UNREADABLE_INPUT`` on
the stream and in history, the decoder's message in the inbox row's and the run's detail); the
inputs behind it run as usual. The agent still gets the payload as stored.

Events are appended to the session's log in the store, then offered to every attached
subscriber (``events.EventLog``); the transcript (``history``) is derived from the same log
(``history``). The rest lives beside this module: the messages (``messages``), what the node
hands every session (``services``), the turn's context for the agent (``turn``), the typed
turn inputs (``inputs``), and what a turn started by a job does besides (``scheduled``).

This module is over 400 lines because the actor's mailbox, inbox and turn runner share its
state (the running turn, the queue count, the runner flags); it re-exports the names other
modules imported from it before the split.
"""

from __future__ import annotations

import logging
import math
import traceback
from typing import Any

import msgspec
import trio

from turnstile.actors.sessions.agents.base import AgentError, HistoryEntry, TurnInput
from turnstile.actors.sessions.event_types import (
    InjectedMessage,
    SessionEvent,
    SessionSync,
    StreamEnd,
    StreamStart,
    TokenUsage,
    TurnQueued,
)
from turnstile.actors.sessions.events import MAX_UNSTORED_EVENTS, EventLog
from turnstile.actors.sessions.history import history_from_events, input_entry, load_history
from turnstile.actors.sessions.ids import public_id
from turnstile.actors.sessions.inputs import InputPayloadError, TurnPayload
from turnstile.actors.sessions.kinds import InputTurn, TurnOutcome
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
from turnstile.actors.sessions.services import (
    SessionLimits,
    SessionServices,
    ShapedTurn,
    ToolCaller,
    TurnShaper,
)
from turnstile.actors.sessions.slots import TurnSlots
from turnstile.actors.sessions.turn import Turn, TurnContext
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

#: How long closing a turn (its unstored events, final event, inbox state) may take when the
#: session itself is being cancelled (node shutdown), and otherwise. The closure is shielded
#: either way; the second bound only guards against a store that stopped answering, since a
#: closure given up leaves the input ``running`` until the next start-up's recovery.
CLOSE_GRACE_SECONDS = 5.0
CLOSE_TIMEOUT_SECONDS = 300.0

#: What a turn whose input's payload does not decode closes with (the stream and history see
#: this; the decoder's message goes to the inbox row's and the run's detail).
UNREADABLE_INPUT = "the input's payload could not be read"


class SessionActor(Actor):
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
            lambda: self.nursery,
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
                await self._emit(message.job_update)
                for event in message.events:
                    await self._emit(event)
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
            policy=self.session.policy,
            queued=self.queued,
            current_input_id=None if self.turn is None else self.turn.item.id,
        )

    def _status(self) -> SessionStatus:
        return SessionStatus(
            session_id=self.session_id,
            busy=self.runner_active,
            policy=self.session.policy,
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
        policy = self.session.policy
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
        item, created = await self._enqueue(msg.source, msg.content, msg.payload, key)
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
        self, source: str, content: str, payload: dict[str, Any], key: str | None = None
    ) -> tuple[InboxItem, bool]:
        """Store an input to run as a turn; with ``key``, unless the key is taken.

        Returns:
            the row, and whether this call stored it (False: the key's row, left as it is).
        """
        store = self.services.store
        stored = {**payload, "content": content}
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
        item, created = await self._enqueue(msg.source, msg.content, msg.payload, key)
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
        await self._emit(InjectedMessage.of(source, content, turn.item.id, payload))
        entry = HistoryEntry(role="user", content=content, source=source)
        turn.injections.append(entry)
        self._remember(entry)
        return Submitted(injected=True)

    async def _queued(self, input_id: int, source: str) -> None:
        """An input stored without this actor (a fire, another node's client) is in the inbox:
        say it is queued and run it. With leases the runner asks the store until it has
        nothing, so it may have claimed the input already: then its ``stream_start`` is out,
        and a ``turn_queued`` after it (with a count one too high) would be wrong."""
        if self._started(input_id):
            return
        self.queued += 1
        ahead = self.queued - 1 + (1 if self.turn is not None else 0)
        await self._emit(TurnQueued(input_id=input_id, source=source, ahead=ahead))
        self._ensure_runner()

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
        payload = {k: v for k, v in item.payload.items() if k != "content"}
        content = _raw_content(item)
        if self.turn is not turn:  # the turn closed while the row moved: a turn of its own
            await self._enqueue(item.source, content, {**payload, "was_injected": True})
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

    # -- the turn runner --

    def _ensure_runner(self) -> None:
        self.wakeup_pending = True
        if not self.runner_active and not self.deleting:
            self.runner_active = True
            self.runner_done = trio.Event()
            self.nursery.start_soon(self._drain, name=f"turns of session {self.session_id}")

    async def _drain(self) -> None:
        """Run queued inputs one at a time, oldest first, until none is left."""
        try:
            while not self.deleting and not self.fenced:
                self.wakeup_pending = False
                held = await self.slots.for_next()
                try:
                    # a node that is draining claims nothing more: what waits is left in the
                    # inbox for the nodes that stay
                    if self.deleting or self.fenced or self.services.running.draining:
                        return
                    try:
                        item = await self.services.store.claim_next_input(
                            self.session_id, fence=self.fence
                        )
                    except Fenced as exc:
                        self._lost_lease(exc)
                        return
                    if item is None:
                        if self.wakeup_pending:
                            continue  # something was enqueued while we looked
                        return
                    self.queued = max(0, self.queued - 1)
                    scheduled = self.services.input_kinds.scheduled(item.source)
                    if scheduled and not held:
                        # A slot was free when we looked, or the queue changed since: the
                        # input is claimed, so take the slot now (nearly always at once).
                        held = await self.slots.take()
                        if self.deleting:
                            return  # the delete takes the claimed input with the session
                    elif held and not scheduled:
                        self.slots.release()
                        held = False
                    await self._run_turn(item)
                finally:
                    if held:
                        self.slots.release()
                if self.queued == 0 and not self.wakeup_pending and self.services.remote is None:
                    # Nothing was enqueued here since (that counts, and every other way in
                    # -- Delivered, Wake -- sets wakeup_pending): spare the store a claim.
                    # With several nodes another node may have stored one (its announcement
                    # can be lost), so the store is asked until it has nothing.
                    return
        finally:
            self.runner_active = False
            self.runner_done.set()

    async def _run_turn(self, item: InboxItem) -> None:
        self.services.running.started()
        try:
            await self._run_turn_counted(item)
        finally:
            self.services.running.ended()

    async def _run_turn_counted(self, item: InboxItem) -> None:
        turn = Turn(item)
        self.turn = turn
        self.last_turn_id = item.id
        started = trio.current_time()
        #: Nobody watched the turn start (a recall, a cron run, an HTTP-only submit): clients
        #: that attach during or after it may have missed its beginning.
        headless = not self.subscribers
        host = _TurnHost(self, turn)
        # The agent gets the payload as stored (less ``content``), never the decoded Struct.
        payload = {k: v for k, v in item.payload.items() if k != "content"}
        outcome = TurnOutcome(status="interrupted")
        kinds = self.services.input_kinds
        kind = kinds.get(item.source)
        received: TurnPayload | None = None
        unreadable: InputPayloadError | None = None
        try:
            received = kinds.decode_item(item)
        except InputPayloadError as exc:
            unreadable = exc
        content = received.content if received is not None else _raw_content(item)
        turn_input = TurnInput(
            input_id=item.id, source=item.source, content=content, payload=payload
        )
        kind_turn: InputTurn | None = None
        try:
            kind_turn = await kind.open(item, received)
            if received is not None:
                turn_input = kind_turn.shape(turn, turn_input)
            reruns = (item.detail or {}).get("reruns")  # set by recovery: run again
            start = StreamStart(
                input_id=item.id,
                source=item.source,
                content=content,
                rerun=reruns if isinstance(reruns, int) and reruns > 0 else msgspec.UNSET,
                **kind_turn.start_fields(),
            )
            stored = await host.emit(start, durable=False)
            self._remember(input_entry(stored))
            history = [] if kind_turn.fresh_history else list(self.history[:-1])
            context = TurnContext(
                host, turn, turn_input, history, self.services.tools, self.services.on_usage
            )
            if received is None:
                # A visible failure like any other; the actor and the inputs behind go on.
                log.warning("turn %s of session %s: %s", item.id, self.session_id, unreadable)
                outcome = TurnOutcome(
                    status="failed",
                    error=UNREADABLE_INPUT,
                    detail={"payload_error": str(unreadable)},
                )
            else:
                with turn.scope:
                    try:
                        text = await kind_turn.respond(
                            host, context, lambda: self._run_agent(context, turn)
                        )
                        outcome = TurnOutcome(status="completed" if text else "empty", text=text)
                    except AgentError as exc:
                        outcome = TurnOutcome(status="failed", error=str(exc) or "the agent failed")
                    except Exception as exc:
                        log.exception("turn %s of session %s failed", item.id, self.session_id)
                        outcome = TurnOutcome(
                            status="failed",
                            error=f"the agent failed ({type(exc).__name__})",
                            detail={"exception": "".join(traceback.format_exception(exc))},
                        )
            if turn.scope.cancelled_caught:
                outcome = msgspec.structs.replace(outcome, status=turn.cancel_status)
        finally:
            self.turn = None
            if self.services.on_turn_closed is not None:
                self.services.on_turn_closed(
                    outcome.status, trio.current_time() - started, item.source
                )
            # A busy store can take seconds to commit what the turn streamed; only a session
            # that is itself being cancelled cuts its closure short.
            cancelled = trio.current_effective_deadline() == -math.inf
            bound = CLOSE_GRACE_SECONDS if cancelled else CLOSE_TIMEOUT_SECONDS
            with trio.move_on_after(bound, shield=True) as closing:
                closed = False
                try:
                    if kind_turn is not None:
                        outcome = await kind_turn.settle(host, turn, outcome)
                    await self._close_turn(turn, outcome)
                    closed = True
                except Fenced as exc:  # the new holder's recovery closes this turn
                    self._lost_lease(exc)
                if closed and kind_turn is not None:
                    await kind_turn.closed(outcome)
                if closed and headless:
                    # recall.md's finally: a run nobody started watching ends with a
                    # session_sync, so late observers re-read history and state at once.
                    # Same fields as the attach-time frame, plus which turn just ended.
                    sync = SessionSync(
                        busy=False,
                        policy=self.session.policy,
                        queued=self.queued,
                        input_id=item.id,
                        status=outcome.status,
                    )
                    await self._emit(sync)
            if closing.cancelled_caught:
                log.error(
                    "closing turn %s of session %s took over %g s and was given up; the input "
                    "stays running until the node's next start-up closes it",
                    item.id,
                    self.session_id,
                    bound,
                )

    async def _run_agent(self, context: TurnContext, turn: Turn) -> str:
        """Ask the agent: with the tools, default prompt and history the shaper chose, and the
        system messages the features add."""
        self._shape(context, turn)
        await self._add_context(context)
        return await self.services.agent.run_turn(context)

    async def _close_turn(self, turn: Turn, outcome: TurnOutcome) -> None:
        """Close the turn visibly (stream and history) and settle its inbox row."""
        usage = msgspec.UNSET
        if turn.usage is not None:
            prompt, completion = turn.usage.prompt_tokens, turn.usage.completion_tokens
            usage = TokenUsage(
                prompt_tokens=prompt,
                completion_tokens=completion,
                total_tokens=prompt + completion,
            )
        status, text, error = outcome.status, outcome.text, outcome.error
        if not outcome.suppressed:
            end = StreamEnd(
                input_id=turn.item.id,
                status=status,
                text=text,
                error=msgspec.UNSET if error is None else error,
                usage=usage,
            )
            await self._turn_emit(turn, end)
            self._remember(
                HistoryEntry(
                    role="assistant", content=text if text else (error or ""), status=status
                )
            )
        state = {"completed": "done", "empty": "done", "failed": "failed"}.get(
            status, "interrupted"
        )
        await self.services.store.finish_input(
            turn.item.id, state, {"status": status, **(outcome.detail or {})}, fence=self.fence
        )
        # Injections the agent never took are not lost: they become turns of their own.
        for entry in turn.injections:
            await self._enqueue(entry.source or "user", entry.content, {"was_injected": True})

    async def _turn_emit(
        self, turn: Turn, event: SessionEvent, *, durable: bool = True
    ) -> dict[str, Any]:
        """Emit an event of ``turn``: at once, or held back if the turn buffers (heartbeats).

        Returns:
            the event's payload as stored.
        """
        type_, payload = event.stored()
        await self._turn_emit_stored(turn, type_, payload, durable=durable)
        return payload

    async def _turn_emit_stored(
        self, turn: Turn, type_: str, payload: dict[str, Any], *, durable: bool = True
    ) -> None:
        """``_turn_emit`` for an event already as stored (the per-token deltas' fast path)."""
        if turn.buffer is not None:
            turn.buffer.append((type_, payload))
        else:
            await self.events.emit(type_, payload, durable=durable)

    def _shape(self, context: TurnContext, turn: Turn) -> None:
        """Give the turn the tools, default prompt and history the shaper chose."""
        shaper = self.services.shaper
        if shaper is None:
            return
        shaped = shaper.shape(self.session.metadata, context.input, context.history, turn.allowed)
        turn.allowed = shaped.allowed
        context.tools, context.history = shaped.tools, shaped.history
        context.input = msgspec.structs.replace(
            context.input,
            system_prompt=shaped.system_prompt,
            context_tokens=shaped.context_tokens,
        )

    async def _add_context(self, context: TurnContext) -> None:
        """Give the turn the system messages the features add (``hooks.turn_context``).

        A hook that fails is logged and left out: a feature's trouble costs the turn that
        message, never the turn itself.
        """
        messages: list[str] = []
        for hook in self.services.turn_context:
            try:
                message = await hook(self.session.owner, self.session_id)
            except Exception:
                log.exception("turn context for session %s failed", self.session_id)
                continue
            if message:
                messages.append(message)
        if messages:
            context.input = msgspec.structs.replace(
                context.input, system_messages=(*context.input.system_messages, *messages)
            )

    async def _emit(self, event: SessionEvent, *, durable: bool = True) -> None:
        """Append an event to the session's log (see ``EventLog.emit``), as the store keeps
        it: ``(type, payload)``, made once here (``SessionEvent.stored``)."""
        await self.events.emit(*event.stored(), durable=durable)

    def _remember(self, entry: HistoryEntry) -> None:
        self.history.append(entry)
        overflow = len(self.history) - self.services.limits.history_entries
        if overflow > 0:
            del self.history[:overflow]


def _stored(msg: Submit) -> dict[str, Any]:
    """The payload an input is stored with: its own keys and its ``content``."""
    return {**msg.payload, "content": msg.content}


def _replayed(item: InboxItem) -> Submitted:
    """What a submit whose key ``item`` already holds answers: what the first one did."""
    if item.state == "done" and "injected_into" in (item.detail or {}):
        return Submitted(injected=True, replayed=True)
    return Submitted(input_id=item.id, replayed=True)


def _raw_content(item: InboxItem) -> str:
    """The text of an input whose payload does not decode, for its (failed) turn's record."""
    content = item.payload.get("content")
    return content if isinstance(content, str) else ""


class _TurnHost:
    """A running turn's session as the turn and its input's kind see it (``turn.TurnHost``):
    the few things they may do to it, without the actor's private state."""

    __slots__ = ("_session", "_turn", "_mark", "session_id", "owner", "item")

    def __init__(self, session: SessionActor, turn: Turn) -> None:
        self._session = session
        self._turn = turn
        #: Where this turn's history begins (its input's entry is the next one).
        self._mark = len(session.history)
        self.session_id = session.session_id
        self.owner = session.session.owner
        self.item = turn.item

    async def emit(self, event: SessionEvent, *, durable: bool = True) -> dict[str, Any]:
        return await self._session._turn_emit(self._turn, event, durable=durable)

    async def emit_stored(
        self, type_: str, payload: dict[str, Any], *, durable: bool = True
    ) -> None:
        await self._session._turn_emit_stored(self._turn, type_, payload, durable=durable)

    async def publish(self, type_: str, payload: dict[str, Any]) -> None:
        await self._session.events.emit(type_, payload)

    async def enqueue(self, source: str, content: str, payload: dict[str, Any]) -> None:
        await self._session._enqueue(source, content, payload)

    def forget_turn(self) -> None:
        del self._session.history[self._mark :]

    def remember(self, entry: HistoryEntry) -> None:
        self._session._remember(entry)
