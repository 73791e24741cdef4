"""The session actor's turn runner: it claims a session's inputs one at a time and runs each
as a turn.

``TurnRunner`` is the half of ``SessionActor`` that runs turns (the other half, in ``actor``,
answers the mailbox). A single runner task claims inputs from the inbox oldest first, so turns
never overlap and keep arrival order; a scheduled input waits for one of the node's
scheduled-turn slots (``slots``). Each turn decodes its input by source through the node's input
kinds (``kinds``): the kind of the input's source opens the turn's ``InputTurn``, which shapes the
agent's input, says what ``stream_start`` carries, answers (the agent, a scheduled tool, another
channel) and settles the turn; a payload that does not decode fails its turn visibly
(``UNREADABLE_INPUT``) and the inputs behind it run as usual. The turn and its kind work on the
session through ``_TurnHost`` (``turn.TurnHost``).

Every turn that starts ends with a visible closure: a ``stream_end`` whose ``status`` is
``completed``, ``empty``, ``failed`` (with a short message; the traceback goes to the inbox row's
detail, not the transcript), ``stopped`` or ``interrupted``; then its inbox row is settled.

A turn's run is one sequence (claim, slot, decode, start, answer, settle, close) whose failure
paths share its locals (hence the module's length). Its span is ``turn_tracing``'s.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
import trio

from turnstile.actors.sessions.agents.base import AgentError, HistoryEntry, TurnInput
from turnstile.actors.sessions.event_types import (
    SessionEvent,
    SessionSync,
    StreamEnd,
    StreamStart,
    TokenUsage,
)
from turnstile.actors.sessions.events import Closure, EventLog
from turnstile.actors.sessions.history import answer_entry, answer_origin, input_entry
from turnstile.actors.sessions.ids import public_id
from turnstile.actors.sessions.inputs import InputPayloadError, TurnPayload
from turnstile.actors.sessions.kinds import InputTurn, TurnOutcome
from turnstile.actors.sessions.services import SessionServices
from turnstile.actors.sessions.slots import TurnSlots
from turnstile.actors.sessions.turn import Turn, TurnContext
from turnstile.actors.sessions.turn_tracing import traced_turn
from turnstile.runtime import tracing
from turnstile.runtime.errors import ConflictError, Fenced, NotFound, StoreError, StoreUnavailable
from turnstile.runtime.gateway.backend import Subscriber
from turnstile.runtime.store import InboxItem, Session, Step

__all__ = ["CLOSE_GRACE_SECONDS", "CLOSE_TIMEOUT_SECONDS", "UNREADABLE_INPUT", "TurnRunner"]

log = logging.getLogger("turnstile.session")

STORE_RETRY_SECONDS = 1.0  # before the runner asks an unavailable store again

#: How long closing a turn (its unstored events, final event, inbox state) may take when the
#: session itself is being cancelled (node shutdown), and otherwise. The closure is shielded
#: either way; the second bound only guards against a store that stopped answering, since a
#: closure given up leaves the input ``running`` until the next start-up's recovery.
CLOSE_GRACE_SECONDS = 5.0
CLOSE_TIMEOUT_SECONDS = 300.0
#: The longest wait between two tries of a turn's closure that the store refused.
CLOSE_RETRY_MAX_SECONDS = 5.0
#: Tries again of a closure the store refused for another reason than an outage.
CLOSE_RETRIES = 5

#: What a turn whose input's payload does not decode closes with (the stream and history see
#: this; the decoder's message goes to the inbox row's and the run's detail).
UNREADABLE_INPUT = "the input's payload could not be read"


class TurnRunner:
    """The turns of a session: the runner task and one turn's run, start to closure.

    The state below is the session actor's (``SessionActor.__init__`` sets it); it is declared
    here so that each half is checked against the same attributes.
    """

    session_id: str
    services: SessionServices
    session: Session | None
    history: list[HistoryEntry]
    subscribers: set[Subscriber]
    turn: Turn | None
    last_turn_id: int | None
    runner_active: bool
    runner_done: trio.Event | None
    wakeup_pending: bool
    deleting: bool
    slots: TurnSlots
    queued: int
    fence: int | None
    fenced: bool
    events: EventLog
    nursery: trio.Nursery | None

    @property
    def _tasks(self) -> trio.Nursery:
        """The incarnation's nursery (``uses_nursery``), there while the actor runs."""
        nursery = self.nursery
        if nursery is None:
            raise RuntimeError("the session actor is not running")
        return nursery

    @property
    def _loaded(self) -> Session:
        """The session's row: there whenever a message or a turn is handled (``receive``
        answers those of a session that is gone on its own; a delete waits for the runner).
        Raises ``NotFound`` for a session that does not exist (or no longer does)."""
        session = self.session
        if session is None:
            raise NotFound(f"no session with id {public_id(self.session_id)!r}")
        return session

    def _lost_lease(self, exc: Fenced) -> None:
        """The session's lease moved to another node (``SessionActor``)."""
        raise NotImplementedError

    async def _enqueue(
        self,
        source: str,
        content: str,
        payload: dict[str, Any],
        key: str | None = None,
        trace: dict[str, str] | None = None,
    ) -> tuple[InboxItem, bool]:
        """Store an input to run as a turn (``SessionActor``)."""
        raise NotImplementedError

    def _ensure_runner(self) -> None:
        self.wakeup_pending = True
        if not self.runner_active and not self.deleting:
            self.runner_active = True
            done = self.runner_done = trio.Event()
            self._tasks.start_soon(self._drain, done, name=f"turns of session {self.session_id}")

    async def _drain(self, done: trio.Event) -> None:
        """Run queued inputs one at a time, oldest first, until none is left; then set
        ``done``."""
        #: when a claim the store did not answer was tried (its commit may have gone through)
        uncertain: datetime | None = None
        try:
            while not self.deleting and not self.fenced:
                self.wakeup_pending = False
                held = await self.slots.for_next()
                try:
                    # a node that is draining claims nothing more: what waits is left in the
                    # inbox for the nodes that stay
                    if self.deleting or self.fenced or self.services.running.draining:
                        return
                    tried = self.services.store.clock.now()
                    # when the claim began (epoch ns), for the turn's span: it starts there
                    claiming = time.time_ns() if tracing.active() else None
                    try:
                        item = None
                        if uncertain is not None:
                            item = await self._lost_claim(uncertain)
                        if item is None:
                            uncertain = None
                            # (one that needs a slot waits queued for it: TurnSlots.claim)
                            item = await self.slots.claim(
                                self.fence, before_wait=self.events.flush_deferred
                            )
                    except Fenced as exc:
                        self._lost_lease(exc)
                        return
                    except StoreUnavailable:
                        # the inputs wait in the inbox: look again once the store answers
                        # (the session stays up; a crash would fail whoever asks it meanwhile)
                        self.events.flush_deferred()
                        uncertain = tried if uncertain is None else uncertain
                        self.wakeup_pending = True
                        await trio.sleep(STORE_RETRY_SECONDS)
                        continue
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
                    self.events.queued_at_close = None
                    await self._run_turn(item, claiming)
                finally:
                    if held:
                        self.slots.release()
                if (
                    self.queued == 0
                    and not self.wakeup_pending
                    and (self.services.remote is None or self.events.queued_at_close is False)
                ):
                    # Nothing was enqueued here (Delivered, Wake set wakeup_pending): no claim.
                    # Another node may have stored one (its announcement lost): asked unless
                    # the closing statement said none is queued (later ones are announced).
                    return
        finally:
            self.events.flush_deferred()
            self.runner_active = False
            done.set()

    async def _lost_claim(self, tried: datetime) -> InboxItem | None:
        """The oldest input of the session that a claim tried since ``tried`` (by the store's
        clock) took although its answer was lost, or None.

        A claim is one commit; when the connection fails after it and before its answer
        (a stall, a reset, a half-open connection), the input is ``running``, claimed by this
        node, and no turn runs it: the next claim would take the input after it, and this one
        would stay ``running`` until the node's next start (found by a half-open connection
        in ``tests/e2e/test_store_outage.py``). It is the one ``running`` input of the session
        stamped with this node's incarnation and changed at or after ``tried``: an input's
        turn is never started without its claim's answer, so it has not run.
        """
        store = self.services.store
        running = await store.list_inputs(self.session_id, ["running"])
        for item in running:
            if item.claimed_by == store.claimer and item.updated_at >= tried:
                log.warning(
                    "session %s: input %s was claimed although the store's answer was lost;"
                    " its turn runs now",
                    self.session_id,
                    item.id,
                )
                return item
        return None

    async def _run_turn(self, item: InboxItem, claiming: int | None = None) -> None:
        self.services.running.started()
        try:
            if tracing.active():
                await traced_turn(
                    Turn(item),
                    self._run_turn_counted,
                    self.services,
                    session_id=self.session_id,
                    owner=self._loaded.owner,
                    claiming=claiming,
                )
            else:
                await self._run_turn_counted(Turn(item))
        finally:
            self.services.running.ended()

    async def _run_turn_counted(self, turn: Turn) -> TurnOutcome:
        """Run ``turn``, start to closure; returns how it ended."""
        item = turn.item
        self.turn = turn
        self.last_turn_id = item.id
        started = trio.current_time()
        #: Nobody watched the turn start (a recall, a cron run, an HTTP-only submit): clients
        #: that attach during or after it may have missed its beginning.
        headless = not self.subscribers
        host = _TurnHost(self, turn)
        # The agent gets the payload as stored (less ``content`` and the trace context it was
        # stored with), never the decoded Struct.
        payload = {k: v for k, v in item.payload.items() if k not in _NOT_FOR_AGENT}
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
            turn.origin = answer_origin(stored)
            history = [] if kind_turn.fresh_history else await self._history_before(item)
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
                try:
                    steps: Sequence[Step] = ()
                    if kind_turn is not None:
                        outcome = await kind_turn.settle(host, turn, outcome)
                        steps = kind_turn.closing(outcome)
                    # recall.md's finally: a run nobody started watching (or of a kind that
                    # asks, a recall) ends with a session_sync, so late observers re-read
                    # history and state at once
                    sync = headless or (kind_turn is not None and kind_turn.sync_after)
                    await self._close_turn(turn, outcome, steps, sync=sync)
                except Fenced as exc:  # the new holder's recovery closes this turn
                    self._lost_lease(exc)
            if closing.cancelled_caught:
                log.error(
                    "closing turn %s of session %s took over %g s and was given up; the input "
                    "stays running until the node's next start-up closes it",
                    item.id,
                    self.session_id,
                    bound,
                )
        return outcome

    async def _run_agent(self, context: TurnContext, turn: Turn) -> str:
        """Ask the agent: with the tools, default prompt and history the shaper chose, and the
        system messages the features add."""
        self._shape(context, turn)
        await self._add_context(context)
        return await self.services.agent.run_turn(context)

    async def _close_turn(
        self, turn: Turn, outcome: TurnOutcome, steps: Sequence[Step], *, sync: bool = False
    ) -> None:
        """Close the turn visibly (stream and history) and settle its inbox row and what its
        input's kind keeps (``steps``), all in one transaction (``EventLog.close``); with
        ``sync``, a ``session_sync`` after its ``stream_end`` in the same transaction (one
        commit, not two: issue 26), with the attach-time frame's fields and which turn ended.
        """
        usage: TokenUsage | msgspec.UnsetType = msgspec.UNSET
        if turn.usage is not None:
            prompt, completion = turn.usage.prompt_tokens, turn.usage.completion_tokens
            usage = TokenUsage(
                prompt_tokens=prompt,
                completion_tokens=completion,
                total_tokens=prompt + completion,
            )
        status, text, error = outcome.status, outcome.text, outcome.error
        events: list[tuple[str, dict[str, Any]]] = []
        answer: HistoryEntry | None = None
        if not outcome.suppressed:
            end = StreamEnd(
                input_id=turn.item.id,
                status=status,
                text=text,
                error=msgspec.UNSET if error is None else error,
                usage=usage,
                **turn.origin,
            ).stored()
            answer = answer_entry(end[1])
            if turn.buffer is not None:  # still held back: it goes with the buffer
                turn.buffer.append(end)
            else:
                events.append(end)
        if sync:  # (the injections the agent never took are queued right after the closure)
            policy, queued = self._loaded.policy, self.queued + len(turn.injections)
            sync_event = SessionSync(
                busy=False, policy=policy, queued=queued, input_id=turn.item.id, status=status
            )
            events.append(sync_event.stored())
        state = {"completed": "done", "empty": "done", "failed": "failed"}.get(
            status, "interrupted"
        )
        closure = Closure(
            input_id=turn.item.id,
            state=state,
            detail={"status": status, **(outcome.detail or {})},
            steps=tuple(steps),
        )
        # The stream_end, the input's state and the kind's settlement commit together: a
        # crash leaves all of them or none, so recovery never closes an ended turn again.
        await self._close_until_stored(events, closure)
        if answer is not None:
            self._remember(answer)
        # Injections the agent never took are not lost: they become turns of their own.
        for entry in turn.injections:
            await self._enqueue(entry.source or "user", entry.content, {"was_injected": True})

    async def _close_until_stored(
        self, events: list[tuple[str, dict[str, Any]]], closure: Closure
    ) -> None:
        """``EventLog.close``, tried again while the store refuses it (an outage, a failed
        commit), with a growing pause, within the caller's bound (``CLOSE_TIMEOUT_SECONDS``):
        while the store is unavailable, else ``CLOSE_RETRIES`` times.

        Before, one refused commit crashed the session actor and left the input ``running``
        until the node's next start (issue 23's crash harness with the fault ``fail:N``); now
        the turn closes once the store is back, and the session goes on with its next input.
        A try that finds the input closed already (``ConflictError`` after a refused try: the
        earlier commit went through and only its answer was lost) is the closure done.
        """
        delay = 0.2
        refused = 0
        while True:
            try:
                await self.events.close(events, closure)
                return
            except (Fenced, NotFound):
                raise
            except ConflictError:
                if not refused:
                    raise
                log.warning(
                    "closing turn %s of session %s: an earlier try was stored after all",
                    closure.input_id,
                    self.session_id,
                )
                return
            except StoreError as exc:
                refused += 1
                if refused > CLOSE_RETRIES and not isinstance(exc, StoreUnavailable):
                    raise  # not an outage: the same commit fails the same way
                log.warning(
                    "closing turn %s of session %s failed (%s); trying again in %g s",
                    closure.input_id,
                    self.session_id,
                    exc,
                    delay,
                )
                await trio.sleep(delay)
                delay = min(delay * 2, CLOSE_RETRY_MAX_SECONDS)

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
        loaded = self._loaded
        shaped = shaper.shape(
            loaded.metadata, context.input, context.history, turn.allowed, owner=loaded.owner
        )
        turn.allowed = shaped.allowed
        context.tools, context.history = shaped.tools, shaped.history
        context.input = msgspec.structs.replace(
            context.input,
            system_prompt=shaped.system_prompt,
            context_tokens=shaped.context_tokens,
        )

    async def _history_before(self, item: InboxItem) -> list[HistoryEntry]:
        """The history the turn of ``item`` sees: the session's own, or what
        ``services.turn_history`` gives instead (the ``unified_session`` mode). A hook that
        fails is logged and the session's own is used: the turn still runs."""
        own = list(self.history[:-1])
        unify = self.services.turn_history
        if unify is None:
            return own
        try:
            return await unify(self._loaded.owner, self.session_id, item.id)
        except Exception:
            log.exception("the history of session %s's turn failed", self.session_id)
            return own

    async def _add_context(self, context: TurnContext) -> None:
        """Give the turn the system messages the features add (``hooks.turn_context``).

        A hook that fails is logged and left out: a feature's trouble costs the turn that
        message, never the turn itself.
        """
        messages: list[str] = []
        for hook in self.services.turn_context:
            try:
                message = await hook(self._loaded.owner, self.session_id)
            except Exception:
                log.exception("turn context for session %s failed", self.session_id)
                continue
            if message:
                messages.append(message)
        if messages:
            context.input = msgspec.structs.replace(
                context.input, system_messages=(*context.input.system_messages, *messages)
            )

    async def _emit(
        self, event: SessionEvent, *, durable: bool = True, defer: bool = False
    ) -> None:
        """Append an event to the session's log (see ``EventLog.emit``), as the store keeps
        it: ``(type, payload)``, made once here (``SessionEvent.stored``)."""
        await self.events.emit(*event.stored(), durable=durable and not defer, defer=defer)

    def _remember(self, entry: HistoryEntry) -> None:
        self.history.append(entry)
        overflow = len(self.history) - self.services.limits.history_entries
        if overflow > 0:
            del self.history[:overflow]


#: The keys of a stored payload that the agent's ``TurnInput.payload`` leaves out.
_NOT_FOR_AGENT = frozenset({"content", *tracing.TRACE_KEYS})


def _raw_content(item: InboxItem) -> str:
    """The text of an input whose payload does not decode, for its (failed) turn's record."""
    content = item.payload.get("content")
    return content if isinstance(content, str) else ""


class _TurnHost:
    """A running turn's session as the turn and its input's kind see it (``turn.TurnHost``):
    the few things they may do to it, without the actor's private state."""

    __slots__ = ("_session", "_turn", "_mark", "session_id", "owner", "item")

    def __init__(self, session: TurnRunner, turn: Turn) -> None:
        self._session = session
        self._turn = turn
        #: Where this turn's history begins (its input's entry is the next one).
        self._mark = len(session.history)
        self.session_id = session.session_id
        self.owner = session._loaded.owner
        self.item = turn.item

    async def emit(self, event: SessionEvent, *, durable: bool = True) -> dict[str, Any]:
        return await self._session._turn_emit(self._turn, event, durable=durable)

    async def emit_stored(
        self, type_: str, payload: dict[str, Any], *, durable: bool = True
    ) -> None:
        await self._session._turn_emit_stored(self._turn, type_, payload, durable=durable)

    async def publish(self, type_: str, payload: dict[str, Any], *, durable: bool = True) -> None:
        await self._session.events.emit(type_, payload, durable=durable)

    async def enqueue(self, source: str, content: str, payload: dict[str, Any]) -> None:
        await self._session._enqueue(source, content, payload)

    def forget_turn(self) -> None:
        del self._session.history[self._mark :]

    def remember(self, entry: HistoryEntry) -> None:
        self._session._remember(entry)
