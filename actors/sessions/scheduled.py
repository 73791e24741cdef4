"""What a turn started by a job does beyond an ordinary turn.

A scheduled input (cron, recall, heartbeat, check, …) carries its job's ``job_id`` and
``run_id`` in its payload. Its turn says which job and run it came from, settles that run's
record when it closes, and — by kind — gets a system segment (a recall's self-instruction, a
heartbeat's checklist), runs a tool before the agent does (``action_type: tool_call``), sends
its output to another channel, or (a heartbeat) holds its events back until it is known
whether anything worth forwarding happened.

The functions here take the input decoded (``inputs``: ``RecallFiring``, ``HeartbeatRun``,
``ScheduledAction``…), except ``job_run`` and ``is_scheduled``, which read the stored payload
as it is: they run before the payload is decoded, and must work for one that does not decode
(its run record still gets the failure).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from turnstile.actors.sessions.agents.base import TurnInput
from turnstile.actors.sessions.event_types import HeartbeatDisabled, HeartbeatSuppressed
from turnstile.actors.sessions.history import tool_result_text
from turnstile.actors.sessions.inputs import (
    IN_SESSION,
    CronTrigger,
    HeartbeatRun,
    HeartbeatSettings,
    InboxInput,
    RecallFiring,
    ScheduledAction,
    ScheduledCheck,
)
from turnstile.actors.sessions.services import SessionServices
from turnstile.actors.sessions.turn import Turn, TurnContext, tool_call_key
from turnstile.runtime.errors import NotFound
from turnstile.runtime.store import InboxItem, JobRun, Store

if TYPE_CHECKING:
    from turnstile.actors.sessions.actor import SessionActor

__all__ = [
    "RECALL_PROMPT",
    "HEARTBEAT_PROMPT",
    "HEARTBEAT_RESPONSE_CHARS",
    "TOOL_RESULT_CHARS",
    "job_run",
    "is_scheduled",
    "TurnSlots",
    "scheduled_input",
    "start_fields",
    "scheduled_tool_call",
    "to_channel",
    "finish_run",
    "settle_heartbeat",
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


def is_scheduled(item: InboxItem) -> bool:
    """Whether a job (cron, recall, heartbeat, …) started this input: it needs a slot."""
    return isinstance(item.payload.get("job_id"), str)


class TurnSlots:
    """One session's hold on the node's slots for turns started by a job.

    The node runs at most ``services.scheduled_turns`` job-started turns at once (None: no
    bound, and every method is a no-op). The session's runner holds at most one slot.
    """

    __slots__ = ("_services", "_session_id", "_wait")

    def __init__(self, services: SessionServices, session_id: str) -> None:
        self._services = services
        self._session_id = session_id
        #: Set while the runner waits for a slot, so a delete can end the wait.
        self._wait: trio.CancelScope | None = None

    async def for_next(self) -> bool:
        """Wait for a slot if the session's next input needs one and none is free.

        The input waits *queued* in the inbox (a crash meanwhile loses nothing), and everything
        behind it in this session waits too, so the order stays that of the inbox. A free slot
        is taken before the claim, without waiting (the caller gives it back if the input turns
        out not to need it); only when none is free does this read the queue, so an uncontended
        node pays nothing.

        Returns:
            whether a slot is now held for this session.
        """
        slots = self._services.scheduled_turns
        if slots is None:
            return False
        try:
            slots.acquire_on_behalf_of_nowait(self)
            return True
        except trio.WouldBlock:
            pass
        queued = await self._services.store.list_inputs(self._session_id, states=["queued"])
        if not queued or not is_scheduled(queued[0]):
            return False
        return await self.take()

    async def take(self) -> bool:
        """Take a slot, waiting for one; False if ``cancel_wait`` ended the wait."""
        slots = self._services.scheduled_turns
        if slots is None:
            return False
        with trio.CancelScope() as scope:
            self._wait = scope
            try:
                await slots.acquire_on_behalf_of(self)
            finally:
                self._wait = None
        return not scope.cancelled_caught

    def release(self) -> None:
        """Give back the slot this session holds."""
        self._services.scheduled_turns.release_on_behalf_of(self)

    def cancel_wait(self) -> None:
        """End a wait for a slot, if one is under way (the session is being deleted)."""
        if self._wait is not None:
            self._wait.cancel()


def scheduled_input(
    turn: Turn,
    turn_input: TurnInput,
    received: InboxInput,
    tool_profiles: dict[str, frozenset[str] | None],
) -> TurnInput:
    """Fit a turn to the job that started it: a heartbeat's or a recall's system segment.

    A heartbeat's turn also buffers its events (it may turn out to be suppressed) and may call
    only its tool profile's tools.

    Args:
        turn: the turn, whose ``buffer`` and ``allowed`` a heartbeat sets.
        turn_input: the input as an ordinary turn would see it.
        received: the input, decoded.
        tool_profiles: the node's tool profiles by name.

    Returns:
        the turn input the agent gets.
    """
    match received:
        case HeartbeatRun(heartbeat=HeartbeatSettings() as settings):
            turn.buffer = []
            turn.allowed = tool_profiles.get(settings.tool_profile, frozenset())
            return msgspec.structs.replace(
                turn_input,
                system_segment=HEARTBEAT_PROMPT.format(checklist=settings.checklist),
                model=settings.model_override,
                max_tokens=settings.max_tokens,
            )
        case RecallFiring(instruction=instruction) if instruction:
            # The self-instruction is the agent's own note to itself: a system message, not
            # words put in the user's mouth. The user-role entry is the trigger line.
            return msgspec.structs.replace(
                turn_input, system_segment=RECALL_PROMPT.format(instruction=instruction)
            )
    return turn_input


def start_fields(run: JobRun | None, received: InboxInput | None) -> dict[str, Any]:
    """What a turn's ``stream_start`` says about the job and run that started it, if any:
    ``StreamStart``'s optional fields, by name.

    Args:
        run: the run record the input belongs to, if any.
        received: the input, decoded; None when its payload does not decode (the run is
            still named, so the failure can be traced to it).
    """
    start: dict[str, Any] = {}
    if run is not None:  # a scheduled input: say which job and run it came from
        start["job_id"] = run.job_id
        start["run_id"] = run.id
        if isinstance(received, ScheduledAction):
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
    return start


async def scheduled_tool_call(context: TurnContext, action: ScheduledAction) -> TurnInput:
    """Run a scheduled job's tool, then hand the agent its result."""
    name = action.tool_name or ""
    result = await context.call_tool(name, action.tool_params)
    body = tool_result_text(result)
    if len(body) > TOOL_RESULT_CHARS:
        body = body[:TOOL_RESULT_CHARS] + f"… (truncated at {TOOL_RESULT_CHARS} chars)"
    head = f"job_id={action.job_id} tool={name} ok={str(result.ok).lower()}"
    return TurnInput(
        input_id=context.input.input_id,
        source=context.input.source,
        content=f"[SCHEDULED TOOL RESULT] {head}\n{body}",
        payload=context.input.payload,
    )


async def to_channel(session: SessionActor, text: str, action: ScheduledAction) -> str:
    """Deliver a scheduled job's output to its channel; returns what the turn closes with."""
    channel = action.channel
    turn = session.turn
    result = await session.services.notify(
        session.session_id,
        session.session.owner,
        channel,
        text,
        output_config=action.output_config,
        title=action.label,
        source="schedule",
        truncate=True,
        # Position 0: the turn's own output, sent once per run like its tool calls' effects.
        idempotency_key=None if turn is None else tool_call_key(turn.item, 0),
    )
    where = result.get("channel", channel)
    note = (
        " (fallback: " + str(result.get("fallback_reason")) + ")" if result.get("fallback") else ""
    )
    return f"delivered to {where}{note}"


async def finish_run(
    store: Store, run: JobRun, status: str, error: str | None, detail: dict[str, Any] | None
) -> None:
    """Settle the run record of a closed turn: ``turn_completed`` or ``turn_failed``."""
    outcome = "turn_completed" if status in ("completed", "empty") else "turn_failed"
    note = {**(run.detail or {}), "status": status}
    if error is not None:
        note["error"] = error
    await store.update_run(run.id, outcome, {**note, **(detail or {})})


async def settle_heartbeat(
    session: SessionActor,
    turn: Turn,
    beat: HeartbeatRun,
    status: str,
    text: str,
    error: str | None,
    detail: dict[str, Any] | None,
    history_mark: int,
) -> dict[str, Any]:
    """Suppress a short, action-free heartbeat, or forward it; apply ``on_error``.

    Args:
        beat: the heartbeat's input, decoded, with its settings (``beat.heartbeat``).

    Returns the inbox/run detail, with ``suppressed`` set when nothing was forwarded.
    """
    settings = beat.heartbeat
    detail = dict(detail or {})
    threshold = settings.suppress_threshold
    quiet = status in ("completed", "empty") and turn.tool_calls == 0 and len(text) < threshold
    buffered, turn.buffer = turn.buffer or [], None
    if quiet:
        # Logged, not forwarded: the run record keeps the answer, the transcript does not.
        del session.history[history_mark:]
        detail.update(suppressed=True, response=text)
        log.info("heartbeat %s of session %s suppressed", turn.item.id, session.session_id)
        await session._emit(HeartbeatSuppressed(input_id=turn.item.id, chars=len(text)))
        return detail
    for type_, payload in buffered:  # already as stored (``SessionActor._turn_emit``)
        await session.events.emit(type_, payload)
    detail["response"] = text[:HEARTBEAT_RESPONSE_CHARS]  # what it found, for the run list
    if status == "failed":
        services = session.services
        policy = settings.on_error
        if policy == "retry_once" and not beat.retry:
            # The stored payload is copied as it is (never re-encoded from ``beat``).
            retry = {k: v for k, v in turn.item.payload.items() if k != "content"}
            await session._enqueue("heartbeat", beat.content, {**retry, "retry": True})
            detail["on_error"] = "retried"
        elif policy == "disable" and services.disable_job is not None:
            job_id = beat.job_id
            if job_id is not None:
                await services.disable_job(job_id)
                await session._emit(HeartbeatDisabled(job_id=job_id, error=error or "failed"))
                detail["on_error"] = "disabled"
                await _alert_heartbeat_disabled(
                    services,
                    session.session_id,
                    session.session.owner,
                    settings,
                    job_id,
                    error or "failed",
                )
    return detail


async def _alert_heartbeat_disabled(
    services: SessionServices,
    session_id: str,
    owner: str,
    settings: HeartbeatSettings,
    job_id: str,
    error: str,
) -> None:
    """Tell the heartbeat's owner through its ``alert_channel`` (by default a notification
    in the parent session) that it was switched off; a failed alert is logged, not fatal."""
    if services.notify is None:
        return
    target = settings.heartbeat_of or session_id
    channel = settings.alert_channel or IN_SESSION
    message = (
        f"The heartbeat {job_id} failed ({error}) and was disabled (on_error: disable). "
        "Its settings are kept: set_heartbeat(enabled=true) turns it back on."
    )
    try:
        await services.notify(
            target,
            owner,
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
