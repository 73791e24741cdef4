"""What a turn started by a job does beyond an ordinary turn: scheduling's input kinds.

A job's occurrence is an inbox row whose payload (``inputs``: ``CronTrigger``,
``RecallFiring``, ``HeartbeatRun``…) names its job and run. Its kind (:class:`ScheduledKind`,
one per source, registered with the sessions feature's input kinds when scheduling starts)
makes the turn say which job and run it came from, settles that run's record when the turn
closes — or when the node's recovery closes a turn a crash cut off —, and, by input, gives it
a system segment (a recall's self-instruction, a heartbeat's checklist), runs a tool before the
agent does (``action_type: tool_call``), sends its output to another channel, or (a heartbeat)
holds its events back until it is known whether anything worth forwarding happened.

Only scheduling's own sources are read this way: a row of another source that happens to carry
a ``run_id`` (a GitHub webhook's CI run) never reaches a job's run record. And a run is settled
only if it is the run of that very input (``JobRun.input_id``).

It is over 400 lines because a scheduled turn's steps (shape, start, answer, settle, and a
heartbeat's held-back events) share its decoded payload and its run: they are one kind's sequence,
read together.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import msgspec

from turnstile.actors.scheduling.inputs import (
    SCHEDULED_INPUTS,
    CronTrigger,
    HeartbeatRun,
    HeartbeatSettings,
    JobRef,
    RecallFiring,
    ScheduledAction,
    ScheduledCheck,
)
from turnstile.actors.scheduling.queries import SETTLE_RUN
from turnstile.actors.scheduling.records import JobRun
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.agents.base import TurnInput
from turnstile.actors.sessions.event_types import HeartbeatDisabled, HeartbeatSuppressed
from turnstile.actors.sessions.history import tool_result_text
from turnstile.actors.sessions.inputs import IN_SESSION, TurnPayload
from turnstile.actors.sessions.kinds import InputKinds, InputTurn, TurnOutcome
from turnstile.actors.sessions.turn import Turn, TurnContext, TurnHost, tool_call_key
from turnstile.runtime.errors import NotFound
from turnstile.runtime.store import InboxItem, Step, Store

__all__ = [
    "HEARTBEAT_PROMPT",
    "HEARTBEAT_RESPONSE_CHARS",
    "RECALL_PROMPT",
    "TOOL_RESULT_CHARS",
    "ScheduledKind",
    "ScheduledTurn",
    "job_run",
    "register_scheduled_kinds",
]

log = logging.getLogger("turnstile.session")

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

#: Inputs fired before the store put ``run_id`` in their payload: how far back to look.
_LEGACY_RUN_SCAN = 50

Notify = Callable[..., Awaitable[dict[str, Any]]]


async def job_run(store: Store, item: InboxItem) -> JobRun | None:
    """The run record of ``item``, an input of one of scheduling's sources, or None (not
    from a job, gone, or not this input's run).

    The scheduler's fire transaction writes the run's id into the input's payload
    (``run_id``), so the run is read by id: a fire that recorded many missed occurrences after
    the delivered one (a long outage) cannot push it out of sight. Inputs stored before that
    carry only ``job_id`` and are looked up among the job's latest runs, as they used to be.
    A payload whose job fields do not decode names no run.
    """
    try:
        ref = msgspec.convert(item.payload, JobRef)
    except msgspec.ValidationError:
        log.warning("input %s (%r) names no readable job run", item.id, item.source)
        return None
    try:
        if ref.run_id is not None:
            run = await JobStore(store).get_run(ref.run_id)
            # The run of this input and no other: a payload can name any id.
            return run if run.input_id == item.id else None
        if ref.job_id is None:
            return None
        runs = await JobStore(store).list_runs(ref.job_id, limit=_LEGACY_RUN_SCAN)
    except NotFound:
        return None
    return next((r for r in runs if r.input_id == item.id), None)


class ScheduledKind:
    """The input kind of one of scheduling's sources.

    Args:
        source: the inbox source (``cron``, ``recall``…).
        payload: its Struct (``inputs.SCHEDULED_INPUTS``).
        store: the node's store (run records).
        tool_profiles: the node's tool profiles (a heartbeat names one), read when a turn
            needs them (features may add profiles as they start).
        notify: the notifier's ``notify`` when the node has one (output to another channel),
            read when a turn needs it.
        disable_job: stops a heartbeat's job, keeping its settings (``on_error: disable``).
    """

    scheduled = True

    def __init__(
        self,
        source: str,
        payload: type[ScheduledAction],
        store: Store,
        *,
        tool_profiles: Callable[[], Mapping[str, frozenset[str] | None]],
        notify: Callable[[], Notify | None],
        disable_job: Callable[[str], Awaitable[None]] | None,
    ) -> None:
        self.source = source
        self.payload: type[TurnPayload] = payload
        self.store = store
        self.tool_profiles = tool_profiles
        self.notify = notify
        self.disable_job = disable_job

    async def open(self, item: InboxItem, received: TurnPayload | None) -> InputTurn:
        run = await job_run(self.store, item)
        action = received if isinstance(received, ScheduledAction) else None
        return ScheduledTurn(self, item, action, run)

    async def interrupted(self, item: InboxItem) -> None:
        run = await job_run(self.store, item)
        if run is not None:  # its run record says what happened
            note = {**(run.detail or {}), "status": "interrupted"}
            await JobStore(self.store).update_run(run.id, "turn_interrupted", note)

    def __repr__(self) -> str:
        return f"ScheduledKind({self.source!r}, {self.payload.__name__})"


class ScheduledTurn(InputTurn):
    """One scheduled input's turn.

    Attributes:
        kind: its kind.
        item: its inbox row.
        action: its payload, decoded; None when it does not decode (the turn fails, and the
            run still gets the failure).
        run: the run record it belongs to, if any.
    """

    def __init__(
        self,
        kind: ScheduledKind,
        item: InboxItem,
        action: ScheduledAction | None,
        run: JobRun | None,
    ) -> None:
        self.kind = kind
        self.item = item
        self.action = action
        self.run = run
        #: A heartbeat and its settings (without them, it runs as an ordinary turn).
        self.beat: tuple[HeartbeatRun, HeartbeatSettings] | None = None
        if isinstance(action, HeartbeatRun) and action.heartbeat is not None:
            self.beat = (action, action.heartbeat)
        self.fresh_history = self.beat is not None and self.beat[1].dedicated
        #: recall.md: every recall run ends with a session_sync, watched or not
        self.sync_after = kind.payload is RecallFiring

    def shape(self, turn: Turn, turn_input: TurnInput) -> TurnInput:
        """A heartbeat's or a recall's system segment. A heartbeat's turn also buffers its
        events (it may turn out to be suppressed) and may call only its profile's tools."""
        match self.action:
            case HeartbeatRun(heartbeat=HeartbeatSettings() as settings):
                turn.buffer = []
                profiles = self.kind.tool_profiles()
                turn.allowed = profiles.get(settings.tool_profile, frozenset())
                return msgspec.structs.replace(
                    turn_input,
                    system_segment=HEARTBEAT_PROMPT.format(checklist=settings.checklist),
                    model=settings.model_override,
                    max_tokens=settings.max_tokens,
                )
            case RecallFiring(instruction=instruction) if instruction:
                # The self-instruction is the agent's own note to itself: a system message,
                # not words put in the user's mouth. The user-role entry is the trigger line.
                return msgspec.structs.replace(
                    turn_input, system_segment=RECALL_PROMPT.format(instruction=instruction)
                )
        if self._notice():
            return msgspec.structs.replace(turn_input, notice=True)
        return turn_input

    def _notice(self) -> bool:
        """A job's notification or tool result reaches the model as a system message, as the
        execution-primitives reference delivers them; a prompt is for the agent to answer."""
        action = self.action
        return (
            action is not None
            and action.action_type in ("notification", "tool_call")
            and not isinstance(action, (RecallFiring, HeartbeatRun))
        )

    def start_fields(self) -> dict[str, Any]:
        """Which job and run the turn came from, and what kind of occurrence it is."""
        start: dict[str, Any] = {}
        received, run = self.action, self.run
        if run is not None:
            start["job_id"] = run.job_id
            start["run_id"] = run.id
            if received is not None:
                if received.label:
                    start["label"] = received.label
                if received.kind:
                    start["kind"] = received.kind
            match received:
                case CronTrigger(prompt_ref=ref) if ref is not None:
                    start["prompt_ref"] = msgspec.to_builtins(ref)
                case ScheduledCheck(reference=reference) if reference:
                    start["reference"] = reference
        if isinstance(received, RecallFiring):
            start["is_recall"] = True
            if received.instruction:
                start["instruction"] = received.instruction
        if self._notice():
            start["notice"] = True
        return start

    async def respond(
        self, host: TurnHost, context: TurnContext, run_agent: Callable[[], Awaitable[str]]
    ) -> str:
        """Run a scheduled tool first, then ask the agent, or send a scheduled notification or
        tool result straight to another channel."""
        action = self.action
        assert action is not None, "a turn whose payload did not decode is not answered"
        if action.action_type == "tool_call":
            context.input = await _scheduled_tool_call(context, action)
        # the sender to the job's channel, when its output goes elsewhere and this node sends
        elsewhere = self.kind.notify() if action.channel != IN_SESSION else None
        if elsewhere is not None and action.action_type in ("notification", "tool_call"):
            # output bound for another channel: no model turn, straight there
            return await self._to_channel(elsewhere, host, context.input.content, action)
        text = await run_agent()
        if elsewhere is not None and text:
            await self._to_channel(elsewhere, host, text, action)
        return text

    async def _to_channel(
        self, notify: Notify, host: TurnHost, text: str, action: ScheduledAction
    ) -> str:
        """Deliver the job's output to its channel; returns what the turn closes with."""
        result = await notify(
            host.session_id,
            host.owner,
            action.channel,
            text,
            output_config=action.output_config,
            title=action.label,
            source="schedule",
            truncate=True,
            # Position 0: the turn's own output, sent once per run like its tool calls' effects.
            idempotency_key=tool_call_key(self.item, 0),
        )
        where = result.get("channel", action.channel)
        note = (
            " (fallback: " + str(result.get("fallback_reason")) + ")"
            if result.get("fallback")
            else ""
        )
        return f"delivered to {where}{note}"

    async def settle(self, host: TurnHost, turn: Turn, outcome: TurnOutcome) -> TurnOutcome:
        if self.beat is None:
            return outcome
        beat, settings = self.beat
        return await self._settle_heartbeat(host, turn, beat, settings, outcome)

    def closing(self, outcome: TurnOutcome) -> Sequence[Step]:
        """Settle the run record with the turn, in its closing transaction:
        ``turn_completed`` or ``turn_failed``."""
        run = self.run
        if run is None:
            return ()
        ok = outcome.status in ("completed", "empty")
        note = {**(run.detail or {}), "status": outcome.status}
        if outcome.error is not None:
            note["error"] = outcome.error
        detail = {**note, **(outcome.detail or {})}
        store = self.kind.store
        args = {
            "run_id": run.id,
            "state": "turn_completed" if ok else "turn_failed",
            "detail": store.db_json(detail),
            "now": store.db_time(store.clock.now()),
        }
        return ((SETTLE_RUN, args),)

    async def _settle_heartbeat(
        self,
        host: TurnHost,
        turn: Turn,
        beat: HeartbeatRun,
        settings: HeartbeatSettings,
        outcome: TurnOutcome,
    ) -> TurnOutcome:
        """Suppress a short, action-free heartbeat, or forward it; apply ``on_error``."""
        status, text = outcome.status, outcome.text
        detail = dict(outcome.detail or {})
        threshold = settings.suppress_threshold
        quiet = status in ("completed", "empty") and turn.tool_calls == 0 and len(text) < threshold
        buffered, turn.buffer = turn.buffer or [], None
        if quiet:
            # Logged, not forwarded: the run record keeps the answer, the transcript does not.
            host.forget_turn()
            detail.update(suppressed=True, response=text)
            log.info("heartbeat %s of session %s suppressed", turn.item.id, host.session_id)
            await host.emit(HeartbeatSuppressed(input_id=turn.item.id, chars=len(text)))
            return msgspec.structs.replace(outcome, detail=detail, suppressed=True)
        # already as stored; not one commit each: they go in with the closure, in one
        for type_, payload in buffered:
            await host.publish(type_, payload, durable=False)
        detail["response"] = text[:HEARTBEAT_RESPONSE_CHARS]  # what it found, for the run list
        if status == "failed":
            policy = settings.on_error
            if policy == "retry_once" and not beat.retry:
                # The stored payload is copied as it is (never re-encoded from ``beat``).
                retry = {k: v for k, v in turn.item.payload.items() if k != "content"}
                await host.enqueue("heartbeat", beat.content, {**retry, "retry": True})
                detail["on_error"] = "retried"
            elif policy == "disable" and self.kind.disable_job is not None:
                job_id = beat.job_id
                if job_id is not None:
                    error = outcome.error or "failed"
                    await self.kind.disable_job(job_id)
                    await host.emit(HeartbeatDisabled(job_id=job_id, error=error))
                    detail["on_error"] = "disabled"
                    await self._alert_disabled(host, settings, job_id, error)
        return msgspec.structs.replace(outcome, detail=detail)

    async def _alert_disabled(
        self, host: TurnHost, settings: HeartbeatSettings, job_id: str, error: str
    ) -> None:
        """Tell the heartbeat's owner through its ``alert_channel`` (by default a notification
        in the parent session) that it was switched off; a failed alert is logged, not fatal."""
        notify = self.kind.notify()
        if notify is None:
            return
        target = settings.heartbeat_of or host.session_id
        channel = settings.alert_channel or IN_SESSION
        message = (
            f"The heartbeat {job_id} failed ({error}) and was disabled (on_error: disable). "
            "Its settings are kept: set_heartbeat(enabled=true) turns it back on."
        )
        try:
            await notify(
                target,
                host.owner,
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


async def _scheduled_tool_call(context: TurnContext, action: ScheduledAction) -> TurnInput:
    """Run a scheduled job's tool, then hand the agent its result."""
    name = action.tool_name or ""
    result = await context.call_tool(name, action.tool_params)
    body = tool_result_text(result)
    if len(body) > TOOL_RESULT_CHARS:
        body = body[:TOOL_RESULT_CHARS] + f"… (truncated at {TOOL_RESULT_CHARS} chars)"
    head = f"job_id={action.job_id} tool={name} ok={str(result.ok).lower()}"
    # the input as shaped (its notice flag included), with the result as its content
    return msgspec.structs.replace(context.input, content=f"[SCHEDULED TOOL RESULT] {head}\n{body}")


def register_scheduled_kinds(
    kinds: InputKinds,
    store: Store,
    *,
    tool_profiles: Callable[[], Mapping[str, frozenset[str] | None]],
    notify: Callable[[], Notify | None],
    disable_job: Callable[[str], Awaitable[None]] | None,
) -> None:
    """Register a :class:`ScheduledKind` for every source scheduling writes."""
    for source, payload in SCHEDULED_INPUTS.items():
        kinds.register(
            ScheduledKind(
                source,
                payload,
                store,
                tool_profiles=tool_profiles,
                notify=notify,
                disable_job=disable_job,
            )
        )
