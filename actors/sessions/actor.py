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

Events are appended to the session's log in the store (which assigns the gap-free ``seq``)
and only then offered to every attached subscriber; offering never blocks the session, so a
slow client cannot stall a turn. They are stored in batches, in order: streamed deltas do not
wait for their commit (see ``_emit``). The transcript (``history``) is derived from the same log.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
import trio

from turnstile.actors.sessions.agents.base import (
    Agent,
    AgentError,
    HistoryEntry,
    ToolResult,
    ToolSpec,
    TurnInput,
    Usage,
)
from turnstile.actors.sessions.ids import public_id, public_result
from turnstile.runtime.actor import Actor
from turnstile.runtime.codec import Message
from turnstile.runtime.errors import Busy, InvalidArgument, LimitExceeded, NotFound
from turnstile.runtime.gateway.backend import Attached, Submitted, Subscriber
from turnstile.runtime.store import EventRecord, InboxItem, JobRun, Session, Store

__all__ = [
    "POLICIES",
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
    "job_run",
    "ShapedTurn",
    "TurnShaper",
]

log = logging.getLogger("turnstile.session")

POLICIES = ("enqueue", "reject", "interrupt", "inject")
Policy = Literal["enqueue", "reject", "interrupt", "inject"]

#: How long closing a turn (its unstored events, final event, inbox state) may take when the
#: session itself is being cancelled (node shutdown), and otherwise. The closure is shielded
#: either way; the second bound only guards against a store that stopped answering, since a
#: closure given up leaves the input ``running`` until the next start-up's recovery.
CLOSE_GRACE_SECONDS = 5.0
CLOSE_TIMEOUT_SECONDS = 300.0
RECALL_PROMPT = (
    "This turn is a recall you scheduled for yourself earlier; it runs on a timer, not in "
    "response to a user message, and the user may not be watching. Carry out your "
    "self-instruction with your tools, then report briefly what you did and found.\n\n"
    "Your self-instruction:\n"
    "{instruction}"
)
#: Characters of a heartbeat's answer kept in its run record (``GET …/heartbeat``).
HEARTBEAT_RESPONSE_CHARS = 2000
HEARTBEAT_PROMPT = (
    "This is a scheduled heartbeat check. You are running autonomously on a timer, not in "
    "response to a user message.\n\n"
    "Rules:\n"
    "- Follow your checklist strictly. Do NOT infer or repeat tasks from prior conversations.\n"
    "- If nothing on the checklist needs attention, respond briefly with what you checked and "
    "that everything looks good.\n"
    "- If something needs attention, take action (if your tools allow it) or alert via the "
    "appropriate channel.\n"
    "- Be concise. This is a check-in, not a conversation.\n\n"
    "Your checklist:\n"
    "{checklist}"
)

#: A scheduled tool's result is cut here before the agent sees it.
TOOL_RESULT_CHARS = 2000
#: Events an agent may stream ahead of the store before its next one waits for a commit.
MAX_UNSTORED_EVENTS = 256


# -- what the session needs from the rest of the node ---------------------------------------


class ToolCaller(Protocol):
    """Runs tools for a session's turns (the tool registry implements this)."""

    def specs(self) -> list[ToolSpec]:
        """The tools an agent may call, as function-calling specs."""
        ...

    async def call(
        self, session_id: str, owner: str, name: str, arguments: dict[str, Any]
    ) -> ToolResult:
        """Run ``name``; tool failures are returned, not raised."""
        ...


class ShapedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """What the model sees in one turn, as a ``TurnShaper`` chose it.

    Attributes:
        tools: the specs the turn carries.
        system_prompt: the runtime's default system prompt (``TurnInput.system_prompt``).
        history: the transcript fitted into the context budget.
        allowed: the tools the turn may call; None for every tool.
    """

    tools: list[ToolSpec]
    system_prompt: str | None
    history: list[HistoryEntry]
    allowed: frozenset[str] | None = None


class TurnShaper(Protocol):
    """Chooses a turn's tools, prompt and history (``tools.selection.TurnShaper``)."""

    def shape(
        self,
        metadata: dict[str, Any],
        turn_input: TurnInput,
        history: list[HistoryEntry],
        allowed: frozenset[str] | None,
    ) -> ShapedTurn:
        """What the model sees this turn; ``allowed`` is the turn's own profile, if any."""
        ...


@dataclass(frozen=True)
class SessionLimits:
    """Bounds on what one session may hold.

    Attributes:
        max_queued_inputs: inputs waiting in the inbox before ``submit`` answers ``Busy``.
        max_content_chars: longest accepted input text.
        history_entries: transcript entries kept in memory and given to the agent.
    """

    max_queued_inputs: int = 100
    max_content_chars: int = 32_000
    history_entries: int = 200


@dataclass
class SessionServices:
    """Everything a session actor uses, shared by all sessions of a node."""

    store: Store
    agent: Agent
    tools: ToolCaller
    limits: SessionLimits
    encode_event: Callable[[str, EventRecord], bytes]
    on_turn_closed: Callable[[str, float], None] | None = None
    #: Called with each model call's token counts as the agent reports them (for /metrics).
    on_usage: Callable[[Usage], None] | None = None
    #: Tool profiles by name (heartbeats pick one); None as a value allows every tool.
    tool_profiles: dict[str, frozenset[str] | None] = field(default_factory=lambda: {"full": None})
    #: Stops a heartbeat job, keeping its settings (a heartbeat whose ``on_error`` is
    #: ``disable``).
    disable_job: Callable[[str], Awaitable[None]] | None = None
    #: The notifier's ``notify``: where scheduled output bound for another channel goes.
    notify: Callable[..., Awaitable[dict[str, Any]]] | None = None
    #: Chooses each turn's tools, default prompt and history budget; None hands the agent
    #: every tool (or its profile's) and the whole kept history, with no default prompt.
    shaper: TurnShaper | None = None
    #: Node-wide slots for turns started by a job (``[limits] max_concurrent_scheduled_turns``);
    #: None runs them without a bound. User turns never take a slot.
    scheduled_turns: trio.CapacityLimiter | None = None


# -- messages ---------------------------------------------------------------------------------


class Submit(Message, tag="submit", kw_only=True):
    """A turn input: store it, then run it (or fold it in, by policy)."""

    source: str = "user"
    content: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)


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
    """A notification for the session: into the running turn, or a turn of its own."""

    source: str = "notification"
    content: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)


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
        job_update: the ``job_update`` event's payload.
        events: more ``(type, payload)`` events about the fire, emitted after ``job_update``
            and before ``turn_queued`` (a recall's ``recall_update``).
    """

    input_id: int
    source: str
    job_update: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = msgspec.field(default_factory=list)


class Publish(Message, tag="publish", kw_only=True):
    """Append an event to the session's log and offer it to attached clients."""

    event: str
    payload: dict[str, Any]


class DeleteSession(Message, tag="delete_session"):
    """Stop the running turn, drop every subscriber, delete the session from the store."""


# -- the actor ---------------------------------------------------------------------------------


class _EventBatch:
    """Events stored together; ``done`` is set once they are stored and offered, or failed."""

    __slots__ = ("events", "done", "error")

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.done = trio.Event()
        self.error: BaseException | None = None


class _Turn:
    __slots__ = (
        "item",
        "scope",
        "injections",
        "cancel_status",
        "buffer",
        "tool_calls",
        "allowed",
        "usage",
    )

    def __init__(self, item: InboxItem) -> None:
        self.item = item
        self.scope = trio.CancelScope()
        self.injections: list[HistoryEntry] = []
        self.cancel_status = "stopped"
        #: Events held back until the turn ends (a heartbeat may turn out to be suppressed).
        self.buffer: list[tuple[str, dict[str, Any]]] | None = None
        self.tool_calls = 0
        #: Tools this turn may call (a heartbeat's tool profile); None allows every tool.
        self.allowed: frozenset[str] | None = None
        #: Tokens the turn's model calls used, summed; None when the agent reported none.
        self.usage: Usage | None = None

    def cancel(self, status: str) -> None:
        self.cancel_status = status
        self.scope.cancel()


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
        self.turn: _Turn | None = None
        self.runner_active = False
        self.runner_done: trio.Event | None = None
        self.wakeup_pending = False
        self.deleting = False
        #: Set while the runner waits for a scheduled-turn slot, so a delete can end the wait.
        self._slot_wait: trio.CancelScope | None = None
        self.queued = 0
        self.last_seq = 0
        #: Events emitted but not yet handed to the store, and the batch being stored.
        self._batch: _EventBatch | None = None
        self._storing: _EventBatch | None = None
        self._flushing = False

    # -- lifecycle --

    async def on_start(self) -> None:
        store = self.services.store
        try:
            self.session = await store.get_session(self.session_id)
        except NotFound:
            self.session = None  # deleted under us: every message answers NotFound
            return
        self.last_seq = self.session.last_seq
        self.history = await load_history(
            store, self.session_id, self.services.limits.history_entries
        )
        self.queued = len(await store.list_inputs(self.session_id, states=["queued"]))
        if self.queued:
            self._ensure_runner()

    def can_passivate(self) -> bool:
        return (
            not self.runner_active
            and not self.subscribers
            and self._batch is None
            and self._storing is None
            and not self._flushing
        )

    async def on_stop(self) -> None:
        if self.turn is not None:
            self.turn.cancel("interrupted")

    # -- messages --

    async def receive(self, message: Any) -> Any:
        if self.session is None:
            return self._gone(message)
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
            case Inject():
                return await self._inject(message)
            case GetStatus():
                return self._status()
            case Wake():
                self._ensure_runner()
                return None
            case Delivered():
                self.queued += 1
                await self._emit("job_update", message.job_update)
                for type_, payload in message.events:
                    await self._emit(type_, payload)
                ahead = self.queued - 1 + (1 if self.turn is not None else 0)
                await self._emit(
                    "turn_queued",
                    {"input_id": message.input_id, "source": message.source, "ahead": ahead},
                )
                self._ensure_runner()
                return None
            case Publish():
                await self._emit(message.event, message.payload)
                return None
            case DeleteSession():
                return await self._delete()
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
        busy = self.turn is not None  # a turn is running right now (not merely queued)
        policy = self.session.policy
        if busy and msg.source == "user":
            if policy == "reject":
                raise Busy("session is busy with a turn and its policy is reject")
            if policy == "inject" and self.turn is not None:
                await self._fold_in(self.turn, msg.source, msg.content, msg.payload)
                return Submitted(injected=True)
        if self.queued >= limits.max_queued_inputs:
            raise LimitExceeded(
                f"session has {self.queued} queued inputs (limit {limits.max_queued_inputs})"
            )
        item = await self._enqueue(msg.source, msg.content, msg.payload)
        if busy and msg.source == "user" and policy == "interrupt" and self.turn is not None:
            self.turn.cancel("interrupted")
        return Submitted(input_id=item.id)

    async def _enqueue(self, source: str, content: str, payload: dict[str, Any]) -> InboxItem:
        item = await self.services.store.enqueue_input(
            self.session_id, source, {**payload, "content": content}
        )
        self.queued += 1
        ahead = self.queued - 1 + (1 if self.runner_active else 0)
        await self._emit("turn_queued", {"input_id": item.id, "source": source, "ahead": ahead})
        self._ensure_runner()
        return item

    async def _inject(self, msg: Inject) -> Submitted:
        if self.turn is not None:
            await self._fold_in(self.turn, msg.source, msg.content, msg.payload)
            return Submitted(injected=True)
        item = await self._enqueue(msg.source, msg.content, msg.payload)
        return Submitted(input_id=item.id)

    async def _fold_in(
        self, turn: _Turn, source: str, content: str, payload: dict[str, Any]
    ) -> None:
        """Record an input as part of the running turn; the agent takes it before its next call."""
        await self._emit(
            "user_message",
            {"source": source, "content": content, "injected_into": turn.item.id, **payload},
        )
        entry = HistoryEntry(role="user", content=content, source=source)
        turn.injections.append(entry)
        self._remember(entry)

    async def _delete(self) -> None:
        self.deleting = True  # the runner takes no further input
        if self.turn is not None:
            self.turn.cancel("stopped")
        if self._slot_wait is not None:
            self._slot_wait.cancel()
        if self.runner_active and self.runner_done is not None:
            await self.runner_done.wait()  # let the turn close before its rows go
        await self._events_stored()
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
            while not self.deleting:
                self.wakeup_pending = False
                held = await self._slot_for_next()
                try:
                    if self.deleting:
                        return
                    item = await self.services.store.claim_next_input(self.session_id)
                    if item is None:
                        if self.wakeup_pending:
                            continue  # something was enqueued while we looked
                        return
                    self.queued = max(0, self.queued - 1)
                    if _is_scheduled(item) and not held:
                        # A slot was free when we looked, or the queue changed since: the
                        # input is claimed, so take the slot now (nearly always at once).
                        held = await self._take_slot()
                        if self.deleting:
                            return  # the delete takes the claimed input with the session
                    elif held and not _is_scheduled(item):
                        self._release_slot()
                        held = False
                    await self._run_turn(item)
                finally:
                    if held:
                        self._release_slot()
                if self.queued == 0 and not self.wakeup_pending:
                    # Nothing was enqueued here since (that counts, and every other way in
                    # -- Delivered, Wake -- sets wakeup_pending): spare the store a claim.
                    return
        finally:
            self.runner_active = False
            self.runner_done.set()

    async def _slot_for_next(self) -> bool:
        """Wait for a scheduled-turn slot if the next input needs one and none is free.

        The node runs at most ``scheduled_turns`` job-started turns at once. The input waits
        *queued* in the inbox (a crash meanwhile loses nothing), and everything behind it in
        this session waits too, so the order stays that of the inbox. A free slot is taken
        before the claim, without waiting (the caller gives it back if the input turns out not
        to need it); only when none is free does this read the queue, so an uncontended node
        pays nothing.

        Returns:
            whether a slot is now held for this runner.
        """
        slots = self.services.scheduled_turns
        if slots is None:
            return False
        try:
            slots.acquire_on_behalf_of_nowait(self)
            return True
        except trio.WouldBlock:
            pass
        queued = await self.services.store.list_inputs(self.session_id, states=["queued"])
        if not queued or not _is_scheduled(queued[0]):
            return False
        return await self._take_slot()

    async def _take_slot(self) -> bool:
        """Take a scheduled-turn slot, waiting for one; False if a delete ended the wait."""
        slots = self.services.scheduled_turns
        if slots is None:
            return False
        with trio.CancelScope() as scope:
            self._slot_wait = scope
            try:
                await slots.acquire_on_behalf_of(self)
            finally:
                self._slot_wait = None
        return not scope.cancelled_caught

    def _release_slot(self) -> None:
        self.services.scheduled_turns.release_on_behalf_of(self)

    async def _run_turn(self, item: InboxItem) -> None:
        turn = _Turn(item)
        self.turn = turn
        started = trio.current_time()
        #: Nobody watched the turn start (a recall, a cron run, an HTTP-only submit): clients
        #: that attach during or after it may have missed its beginning.
        headless = not self.subscribers
        payload = dict(item.payload)
        content = str(payload.pop("content", ""))
        status, text, error, detail = "interrupted", "", None, None
        run = await self._job_run(item)
        heartbeat = payload.get("heartbeat") if item.source == "heartbeat" else None
        history_mark = len(self.history)
        turn_input = TurnInput(
            input_id=item.id, source=item.source, content=content, payload=payload
        )
        if isinstance(heartbeat, dict):
            turn.buffer = []
            turn.allowed = self.services.tool_profiles.get(
                heartbeat.get("tool_profile", "heartbeat"), frozenset()
            )
            turn_input = TurnInput(
                input_id=item.id,
                source=item.source,
                content=content,
                payload=payload,
                system_segment=HEARTBEAT_PROMPT.format(checklist=heartbeat.get("checklist", "")),
                model=heartbeat.get("model_override"),
                max_tokens=heartbeat.get("max_tokens"),
            )
        instruction = payload.get("instruction") if payload.get("is_recall") else None
        if isinstance(instruction, str) and instruction:
            # The self-instruction is the agent's own note to itself: a system message, not
            # words put in the user's mouth. The user-role entry is the trigger line.
            turn_input = msgspec.structs.replace(
                turn_input, system_segment=RECALL_PROMPT.format(instruction=instruction)
            )
        try:
            start: dict[str, Any] = {
                "input_id": item.id,
                "source": item.source,
                "content": content,
            }
            if run is not None:  # a scheduled input: say which job and run it came from
                start["job_id"] = run.job_id
                start["run_id"] = run.id
                for key in ("label", "kind", "prompt_ref", "reference"):
                    if payload.get(key):
                        start[key] = payload[key]
            if payload.get("is_recall"):
                start["is_recall"] = True
                if isinstance(instruction, str) and instruction:
                    start["instruction"] = instruction
            await self._turn_emit(turn, "stream_start", start, durable=False)
            self._remember(_input_entry(start))
            context = _TurnContext(self, turn, turn_input)
            if isinstance(heartbeat, dict) and heartbeat.get("dedicated", True):
                context.history = []  # a dedicated heartbeat starts from a clean context
            with turn.scope:
                try:
                    if payload.get("action_type") == "tool_call":
                        context.input = await self._scheduled_tool_call(context, payload)
                    channel = payload.get("output_channel") or "llm_notification"
                    elsewhere = channel != "llm_notification" and self.services.notify
                    if elsewhere and payload.get("action_type") in ("notification", "tool_call"):
                        # output bound for another channel: no model turn, straight there
                        text = await self._to_channel(channel, context.input.content, payload)
                    else:
                        self._shape(context, turn)
                        text = await self.services.agent.run_turn(context)
                        if elsewhere and text:
                            await self._to_channel(channel, text, payload)
                    status = "completed" if text else "empty"
                except AgentError as exc:
                    status, error = "failed", str(exc) or "the agent failed"
                except Exception as exc:
                    log.exception("turn %s of session %s failed", item.id, self.session_id)
                    status, error = "failed", f"the agent failed ({type(exc).__name__})"
                    detail = {"exception": "".join(traceback.format_exception(exc))}
            if turn.scope.cancelled_caught:
                status = turn.cancel_status
        finally:
            self.turn = None
            if self.services.on_turn_closed is not None:
                self.services.on_turn_closed(status, trio.current_time() - started)
            # A busy store can take seconds to commit what the turn streamed; only a session
            # that is itself being cancelled cuts its closure short.
            cancelled = trio.current_effective_deadline() == -math.inf
            bound = CLOSE_GRACE_SECONDS if cancelled else CLOSE_TIMEOUT_SECONDS
            with trio.move_on_after(bound, shield=True) as closing:
                if isinstance(heartbeat, dict):
                    detail = await self._settle_heartbeat(
                        turn, heartbeat, status, text, error, detail, history_mark
                    )
                await self._close_turn(turn, status, text, error, detail)
                if run is not None:
                    outcome = (
                        "turn_completed" if status in ("completed", "empty") else "turn_failed"
                    )
                    note = {**(run.detail or {}), "status": status}
                    if error is not None:
                        note["error"] = error
                    await self.services.store.update_run(
                        run.id, outcome, {**note, **(detail or {})}
                    )
                if headless:
                    # recall.md's finally: a run nobody started watching ends with a
                    # session_sync, so late observers re-read history and state at once.
                    # Same fields as the attach-time frame, plus which turn just ended.
                    sync = {
                        "busy": False,
                        "policy": self.session.policy,
                        "queued": self.queued,
                        "input_id": item.id,
                        "status": status,
                    }
                    await self._emit("session_sync", sync)
            if closing.cancelled_caught:
                log.error(
                    "closing turn %s of session %s took over %g s and was given up; the input "
                    "stays running until the node's next start-up closes it",
                    item.id,
                    self.session_id,
                    bound,
                )

    async def _close_turn(
        self,
        turn: _Turn,
        status: str,
        text: str,
        error: str | None,
        detail: dict[str, Any] | None,
    ) -> None:
        """Close the turn visibly (stream and history) and settle its inbox row."""
        end: dict[str, Any] = {"input_id": turn.item.id, "status": status, "text": text}
        if error is not None:
            end["error"] = error
        if turn.usage is not None:
            prompt, completion = turn.usage.prompt_tokens, turn.usage.completion_tokens
            end["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        suppressed = turn.buffer is not None and (detail or {}).get("suppressed")
        if not suppressed:
            await self._turn_emit(turn, "stream_end", end)
            self._remember(
                HistoryEntry(
                    role="assistant", content=text if text else (error or ""), status=status
                )
            )
        state = {"completed": "done", "empty": "done", "failed": "failed"}.get(
            status, "interrupted"
        )
        await self.services.store.finish_input(
            turn.item.id, state, {"status": status, **(detail or {})}
        )
        # Injections the agent never took are not lost: they become turns of their own.
        for entry in turn.injections:
            await self._enqueue(entry.source or "user", entry.content, {"was_injected": True})

    async def _turn_emit(
        self, turn: _Turn, type_: str, payload: dict[str, Any], *, durable: bool = True
    ) -> None:
        """Emit an event of ``turn``: at once, or held back if the turn buffers (heartbeats)."""
        if turn.buffer is not None:
            turn.buffer.append((type_, payload))
        else:
            await self._emit(type_, payload, durable=durable)

    async def _settle_heartbeat(
        self,
        turn: _Turn,
        heartbeat: dict[str, Any],
        status: str,
        text: str,
        error: str | None,
        detail: dict[str, Any] | None,
        history_mark: int,
    ) -> dict[str, Any]:
        """Suppress a short, action-free heartbeat, or forward it; apply ``on_error``.

        Returns the inbox/run detail, with ``suppressed`` set when nothing was forwarded.
        """
        detail = dict(detail or {})
        threshold = int(heartbeat.get("suppress_threshold", 300))
        quiet = status in ("completed", "empty") and turn.tool_calls == 0 and len(text) < threshold
        buffered, turn.buffer = turn.buffer or [], None
        if quiet:
            # Logged, not forwarded: the run record keeps the answer, the transcript does not.
            del self.history[history_mark:]
            detail.update(suppressed=True, response=text)
            log.info("heartbeat %s of session %s suppressed", turn.item.id, self.session_id)
            await self._emit("heartbeat_suppressed", {"input_id": turn.item.id, "chars": len(text)})
            return detail
        for type_, payload in buffered:
            await self._emit(type_, payload)
        detail["response"] = text[:HEARTBEAT_RESPONSE_CHARS]  # what it found, for the run list
        if status == "failed":
            policy = heartbeat.get("on_error", "skip")
            if policy == "retry_once" and not turn.item.payload.get("retry"):
                retry = {k: v for k, v in turn.item.payload.items() if k != "content"}
                await self._enqueue(
                    "heartbeat", turn.item.payload.get("content", ""), {**retry, "retry": True}
                )
                detail["on_error"] = "retried"
            elif policy == "disable" and self.services.disable_job is not None:
                job_id = turn.item.payload.get("job_id")
                if isinstance(job_id, str):
                    await self.services.disable_job(job_id)
                    await self._emit(
                        "heartbeat_disabled", {"job_id": job_id, "error": error or "failed"}
                    )
                    detail["on_error"] = "disabled"
                    await self._alert_heartbeat_disabled(heartbeat, job_id, error or "failed")
        return detail

    async def _alert_heartbeat_disabled(
        self, heartbeat: dict[str, Any], job_id: str, error: str
    ) -> None:
        """Tell the heartbeat's owner through its ``alert_channel`` (by default a notification
        in the parent session) that it was switched off; a failed alert is logged, not fatal."""
        if self.services.notify is None:
            return
        parent = heartbeat.get("heartbeat_of")
        target = parent if isinstance(parent, str) else self.session_id
        channel = str(heartbeat.get("alert_channel") or "llm_notification")
        message = (
            f"The heartbeat {job_id} failed ({error}) and was disabled (on_error: disable). "
            "Its settings are kept: set_heartbeat(enabled=true) turns it back on."
        )
        try:
            await self.services.notify(
                target,
                self.session.owner,
                channel,
                message,
                title="Heartbeat disabled",
                priority="high",
                source="heartbeat",
                truncate=True,
            )
        except Exception:
            log.warning(
                "alerting that heartbeat %s was disabled (channel %s) failed",
                job_id,
                channel,
                exc_info=True,
            )

    def _shape(self, context: _TurnContext, turn: _Turn) -> None:
        """Give the turn the tools, default prompt and history the shaper chose."""
        shaper = self.services.shaper
        if shaper is None:
            return
        shaped = shaper.shape(self.session.metadata, context.input, context.history, turn.allowed)
        turn.allowed = shaped.allowed
        context.tools, context.history = shaped.tools, shaped.history
        context.input = msgspec.structs.replace(context.input, system_prompt=shaped.system_prompt)

    async def _to_channel(self, channel: str, text: str, payload: dict[str, Any]) -> str:
        """Deliver a scheduled job's output to ``channel``; returns what the turn closes with."""
        result = await self.services.notify(
            self.session_id,
            self.session.owner,
            channel,
            text,
            output_config=payload.get("output_config") or {},
            title=payload.get("label") or "",
            source="schedule",
            truncate=True,
        )
        where = result.get("channel", channel)
        note = (
            " (fallback: " + str(result.get("fallback_reason")) + ")"
            if result.get("fallback")
            else ""
        )
        return f"delivered to {where}{note}"

    async def _scheduled_tool_call(self, context: _TurnContext, payload: dict[str, Any]):
        """Run a scheduled job's tool, then hand the agent its result."""
        name = str(payload.get("tool_name"))
        params = payload.get("tool_params") or {}
        result = await context.call_tool(name, params if isinstance(params, dict) else {})
        body = _json_text(result)
        if len(body) > TOOL_RESULT_CHARS:
            body = body[:TOOL_RESULT_CHARS] + f"… (truncated at {TOOL_RESULT_CHARS} chars)"
        head = f"job_id={payload.get('job_id')} tool={name} ok={str(result.ok).lower()}"
        return TurnInput(
            input_id=context.input.input_id,
            source=context.input.source,
            content=f"[SCHEDULED TOOL RESULT] {head}\n{body}",
            payload=payload,
        )

    async def _job_run(self, item: InboxItem):
        """The run record a scheduled input belongs to, if it came from a job."""
        return await job_run(self.services.store, item)

    # -- events and history --

    async def _emit(self, type_: str, payload: dict[str, Any], *, durable: bool = True) -> None:
        """Append an event to the session's log; once stored, offer it to every subscriber.

        Events are stored in batches, in order, one batch at a time: while one is being
        written the next one fills. ``durable`` waits until this event is stored (and offered),
        writing its batch from the caller's own task when no write is under way, so a shielded
        caller (a turn closing at shutdown) still gets its event stored; it raises if storing
        failed. Otherwise the caller goes on at once and a background task stores the batch:
        an agent streaming deltas is not held up by a commit per delta, and a client gets a
        burst of them in one write. Only once ``MAX_UNSTORED_EVENTS`` wait does it wait too.
        An event is never offered before it is stored, so a client never sees a ``seq`` that
        a crash could take back.
        """
        batch = self._batch
        if batch is None:
            batch = self._batch = _EventBatch()
        batch.events.append((type_, payload))
        if durable or len(batch.events) >= MAX_UNSTORED_EVENTS:
            await self._until_stored(batch)
        elif not self._flushing:
            self._flushing = True
            self.nursery.start_soon(self._flush, name=f"events of session {self.session_id}")

    async def _until_stored(self, batch: _EventBatch) -> None:
        """Wait until ``batch`` is stored, storing it from this task if nobody else is."""
        await self._wait_stored(batch)
        if batch.error is not None:
            raise batch.error

    async def _wait_stored(self, batch: _EventBatch) -> None:
        while not batch.done.is_set():
            storing = self._storing
            if storing is None:
                await self._store_next()  # the oldest waiting batch: ``batch`` or one before
            else:
                await storing.done.wait()

    async def _events_stored(self) -> None:
        """Wait until every event emitted so far is stored (or failed to be)."""
        batch = self._batch or self._storing
        if batch is not None:
            await self._wait_stored(batch)

    async def _flush(self) -> None:
        """The background writer of events nobody waits for."""
        try:
            while (batch := self._batch) is not None:
                await self._wait_stored(batch)
        finally:
            self._flushing = False

    async def _store_next(self) -> None:
        """Store the oldest waiting batch and offer its events. Never raises ``Exception``:
        an error is kept on the batch for whoever waits for it."""
        batch, self._batch = self._batch, None
        self._storing = batch
        try:
            records = await self.services.store.append_events(self.session_id, batch.events)
            self._offer(records)
        except Exception as exc:
            batch.error = exc
            log.error(
                "storing %d events of session %s failed: %r",
                len(batch.events),
                self.session_id,
                exc,
            )
        except BaseException:
            batch.error = RuntimeError("the session stopped before its events were stored")
            raise
        finally:
            self._storing = None
            batch.done.set()

    def _offer(self, records: list[EventRecord]) -> None:
        """Offer stored events to every subscriber, dropping those that fell too far behind."""
        self.last_seq = records[-1].seq
        subscribers = self.subscribers
        if not subscribers:
            return
        encode = self.services.encode_event
        name = self.public_id
        for record in records:
            frame = encode(name, record)
            for subscriber in list(subscribers):
                if not subscriber.offer(name, record.seq, frame):
                    subscribers.discard(subscriber)
                    subscriber.lagged(name, record.seq - 1)

    def _remember(self, entry: HistoryEntry) -> None:
        self.history.append(entry)
        overflow = len(self.history) - self.services.limits.history_entries
        if overflow > 0:
            del self.history[:overflow]


class _TurnContext:
    """The ``TurnContext`` a session hands its agent for one turn."""

    __slots__ = ("_session", "_turn", "session_id", "input", "history", "tools")

    def __init__(self, session: SessionActor, turn: _Turn, turn_input: TurnInput) -> None:
        self._session = session
        self._turn = turn
        self.session_id = session.session_id
        self.input = turn_input
        self.history = list(session.history[:-1])  # everything before this turn's input
        allowed = turn.allowed
        self.tools = session.services.tools.specs()
        if allowed is not None:
            self.tools = [spec for spec in self.tools if spec.name in allowed]

    async def emit(self, type: str, text: str) -> None:
        if type not in ("stream_delta", "thinking_delta"):
            raise InvalidArgument(f"agents emit stream_delta or thinking_delta, not {type!r}")
        await self._session._turn_emit(
            self._turn, type, {"input_id": self.input.input_id, "text": text}, durable=False
        )

    async def call_tool(
        self, name: str, arguments: dict[str, Any], call_id: str | None = None
    ) -> ToolResult:
        session = self._session
        common: dict[str, Any] = {"input_id": self.input.input_id, "tool": name}
        if call_id is not None:
            common["call_id"] = call_id
        turn = self._turn
        turn.tool_calls += 1
        await session._turn_emit(turn, "tool_started", {**common, "arguments": arguments})
        if turn.allowed is not None and name not in turn.allowed:
            result = ToolResult(
                ok=False,
                error={
                    "code": "not_allowed",
                    "message": f"tool {name!r} is not allowed in this turn's tool profile",
                },
            )
        else:
            result = public_result(
                await session.services.tools.call(
                    session.session_id, session.session.owner, name, arguments
                )
            )
        outcome = {"ok": result.ok}
        if result.ok:
            outcome["result"] = result.data
        else:
            outcome["error"] = result.error
        await session._turn_emit(turn, "tool_call", {**common, "arguments": arguments, **outcome})
        session._remember(
            HistoryEntry(
                role="tool",
                content=_json_text(result),
                tool=name,
                arguments=arguments,
                call_id=call_id,
            )
        )
        return result

    def take_injections(self) -> list[HistoryEntry]:
        taken, self._turn.injections = self._turn.injections, []
        return taken

    def add_usage(self, usage: Usage) -> None:
        before = self._turn.usage or Usage()
        self._turn.usage = Usage(
            prompt_tokens=before.prompt_tokens + usage.prompt_tokens,
            completion_tokens=before.completion_tokens + usage.completion_tokens,
        )
        if self._session.services.on_usage is not None:
            self._session.services.on_usage(usage)


def _json_text(result: ToolResult) -> str:
    body = result.data if result.ok else {"error": result.error}
    return msgspec.json.encode(body).decode()


#: Inputs fired before the store put ``run_id`` in their payload: how far back to look.
_LEGACY_RUN_SCAN = 50


async def job_run(store: Store, item: InboxItem) -> JobRun | None:
    """The run record a scheduled input belongs to, or None (not from a job, or gone).

    The scheduler's fire transaction writes the run's id into the input's payload
    (``run_id``), so the run is read by id: a fire that recorded many missed occurrences after
    the delivered one (a long outage) cannot push it out of sight. Inputs stored before that
    carry only ``job_id`` and are looked up among the job's latest runs, as they used to be.
    """
    run_id = item.payload.get("run_id")
    try:
        if isinstance(run_id, int) and not isinstance(run_id, bool):
            return await store.get_run(run_id)
        job_id = item.payload.get("job_id")
        if not isinstance(job_id, str):
            return None
        runs = await store.list_runs(job_id, limit=_LEGACY_RUN_SCAN)
    except NotFound:
        return None
    return next((r for r in runs if r.input_id == item.id), None)


async def load_history(store: Store, session_id: str, keep: int) -> list[HistoryEntry]:
    """Rebuild the last ``keep`` transcript entries from the session's event log."""
    entries: list[HistoryEntry] = []
    after = 0
    while True:
        page = await store.read_events(session_id, after_seq=after, limit=1000)
        if not page:
            break
        entries.extend(history_from_events(page))
        if len(entries) > keep:
            del entries[: len(entries) - keep]
        after = page[-1].seq
    return entries


def _is_scheduled(item: InboxItem) -> bool:
    """Whether a job (cron, recall, heartbeat, …) started this input: it needs a slot."""
    return isinstance(item.payload.get("job_id"), str)


def _input_entry(start: dict[str, Any]) -> HistoryEntry:
    """The transcript entry of a turn's input, from its ``stream_start`` payload.

    A scheduled input keeps what triggered it: ``is_recall`` for a recall, else the job, its
    run and (cron) its prompt reference as ``cron_job_id``, ``cron_run_id``,
    ``cron_prompt_ref`` (cron-session-binding.md), so a later turn and the history route
    know which firing the entry stands for.
    """
    job_id, run_id, ref = start.get("job_id"), start.get("run_id"), start.get("prompt_ref")
    from_job = isinstance(job_id, str) and not start.get("is_recall")
    return HistoryEntry(
        role="user",
        content=start.get("content", ""),
        source=start.get("source"),
        is_recall=bool(start.get("is_recall")),
        cron_job_id=job_id if from_job else None,
        cron_run_id=run_id if from_job and isinstance(run_id, int) else None,
        cron_prompt_ref=ref if from_job and isinstance(ref, dict) else None,
    )


def history_from_events(events: list[EventRecord]) -> list[HistoryEntry]:
    """The transcript entries that a list of events stands for, in order."""
    out: list[HistoryEntry] = []
    for event in events:
        p = event.payload
        if event.type == "stream_start":
            out.append(_input_entry(p))
        elif event.type == "user_message":
            out.append(
                HistoryEntry(role="user", content=p.get("content", ""), source=p.get("source"))
            )
        elif event.type == "tool_call":
            body = p.get("result") if p.get("ok") else {"error": p.get("error")}
            out.append(
                HistoryEntry(
                    role="tool",
                    content=msgspec.json.encode(body).decode(),
                    tool=p.get("tool"),
                    arguments=p.get("arguments"),
                    call_id=p.get("call_id"),
                )
            )
        elif event.type == "stream_end":
            out.append(
                HistoryEntry(
                    role="assistant",
                    content=p.get("text") or p.get("error") or "",
                    status=p.get("status"),
                )
            )
    return out
