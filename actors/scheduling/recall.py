"""Recalls: work an agent schedules for itself, to be picked up later without the user.

A recall is a self-instruction ("Read /tmp/build.log with filesystem; if it has errors, report
the last 50 lines") that comes back to the session as a turn of its own — in 30 minutes
(``once``), every N seconds (``recurring``) or as soon as the current turn ends
(``immediate``). Uses: check a build later, poll an API, hand heavy multi-tool work to a turn
of its own, carry on after a restart. Two tools, the design of ``recall.md``:

* ``schedule_recall(call_type, when, timezone_offset, interval_seconds, internal_comment,
  additional_context_message)``;
* ``manage_recall(action=cancel|skip|list, session_id)`` — ``session_id`` names another of
  the calling session's owner's sessions (default: the calling session), as in the reference;
  it is a name in the owner's namespace, so no value reaches another user's session: theirs is
  "not found", exactly like a name nobody uses.

And, for the HTTP layer (``GET``/``DELETE /sessions/{id}/recall``,
``POST /sessions/{id}/recall/skip``), the plain functions the tools use themselves:
:func:`get_recall`, :func:`cancel_recall`, :func:`skip_recall` (and :func:`list_recalls`).

How it is built — and where it does better than the reference design:

* **No recall loop of its own.** A recall is a scheduler job of kind ``"recall"``: it is
  durable, survives restarts, and is fired by the one timer wheel, exactly on time, in one
  store transaction that puts the turn input (``source="recall"``) into the session's inbox.
  The reference polls the table and sleeps up to 60 s between looks.
* **Busy sessions: no re-polling, no reordering.** The reference defers a recall that finds
  its session busy by +60 s, again and again, so it may run up to a minute after the turn
  ends, or after messages the user sent later. Here the input is committed to the inbox at
  its time and runs the moment the current turn ends, in arrival order, like any input;
  its run record says how late the turn started. ``immediate`` is the same mechanism: it is
  queued behind the turn that scheduled it, i.e. it runs right after.
* **One pending recall per session, enforced by the database on both backends** (the
  reference has the index on PostgreSQL only): migration 2 adds the unique partial index
  ``jobs_one_pending_recall_idx`` on ``jobs (session_id) WHERE kind = 'recall' AND state IN
  ('active', 'paused')``. There is no check-then-insert race, even with two nodes on one
  PostgreSQL: the insert itself fails, and the caller gets a ``ConflictError`` naming the
  pending recall and telling it to cancel it first.
* **Skip** moves a recurring recall to ``max(trigger_at, now) + interval_seconds`` (the
  reference's ``GREATEST``) through the scheduler, so its timer moves too; skipping a once or
  immediate recall is an error that says to cancel it instead (the reference leaves it
  undefined).
* **Recurring recalls may start later** than one interval from now: ``when`` gives the first
  trigger. ``when`` is parsed by :func:`actors.scheduling.timeexpr.parse_when` (relative delays,
  "tomorrow at 9am", ISO 8601; English and French) and echoed back as ``understood``; a
  repeating expression ("every 5 minutes") is refused for ``when`` rather than guessed.
  ``timezone`` (IANA) is accepted as well as ``timezone_offset``; with neither, the session's
  ``metadata.timezone`` is used, else UTC.
* A failed recall turn does not cancel the recall (the reference cancels a ``once`` recall
  whose run raised): the failure is on the job's run record (``turn_failed``), and a recurring
  recall keeps its schedule.
* ``recall_update`` events go to the session's event log after every change, so the banner
  and sidebar can follow: ``{...recall, "action": …}`` with ``action`` ``scheduled``,
  ``cancelled``, ``skipped``, ``fired`` (a once or immediate recall fired; it is done) or
  ``rescheduled`` (a recurring recall fired; ``trigger_at`` is its next occurrence). The last
  two come from the scheduler's fire (:func:`recall_fired_events`) with ``fired_at`` and
  ``run_id``, just before the turn's ``turn_queued``.

What the turn receives: as its user-role content, one trigger line (also its transcript
entry, with ``is_recall``; ``stream_start`` carries ``is_recall: true`` and ``instruction``)::

    [RECALL] recall_id=rc_4f2a… call_type=once note=check the build

and, as a system message for this turn (``TurnInput.system_segment``), the self-instruction
("Read /tmp/build.log with filesystem. If it has errors, report the last 50 lines.") under a
short preamble saying this is a self-scheduled turn (the design of recall.md: the
self-instruction is injected as a system message, never put in the user's mouth).
``payload`` carries ``recall_id``, ``is_recall: true`` and ``instruction``.

It is over 400 lines because a quarter of it is the design above, measured against the reference;
the two tools and the HTTP functions share one set of rules (one pending recall, the caller's own
session, skip).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.scheduling.actor import AddJob, CancelJob, RescheduleJob, SchedulerLimits
from turnstile.actors.scheduling.events import RecallUpdate
from turnstile.actors.scheduling.records import Job, JobRun
from turnstile.actors.scheduling.spec import RecallSpec, Schedule, job_spec
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.scheduling.timeexpr import parse_when
from turnstile.actors.sessions.actor import Publish
from turnstile.actors.sessions.event_types import SessionEvent
from turnstile.actors.sessions.ids import public_id, session_key
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import ConflictError, InvalidArgument, NotFound, StoreError
from turnstile.runtime.store import Store
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = [
    "CALL_TYPES",
    "RECALL_KIND",
    "ManageRecall",
    "ScheduleRecall",
    "cancel_recall",
    "get_recall",
    "list_recalls",
    "recall_fired_events",
    "recall_view",
    "register_recall_tools",
    "skip_recall",
]

log = logging.getLogger("turnstile.recall")

#: The scheduler job kind of a recall (the unique index of migration 2 is on it).
RECALL_KIND = "recall"
CALL_TYPES = ("once", "recurring", "immediate")
#: Bounds of a recurring recall's interval; the scheduler may enforce a longer minimum.
MIN_INTERVAL_SECONDS = int(SchedulerLimits().min_interval_seconds)
MAX_INTERVAL_SECONDS = 30 * 86400
#: ``manage_recall list`` returns at most this many recalls, the most recent ones.
MAX_LISTED = 50

#: Job state → recall status.
_STATUS = {"active": "pending", "paused": "paused", "completed": "fired", "cancelled": "cancelled"}
_PENDING_STATES = ["active", "paused"]

Publisher = Callable[[str, Any], Awaitable[None]]


class ScheduleRecall(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``schedule_recall``."""

    call_type: Literal["once", "recurring", "immediate"]
    additional_context_message: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=6000,
            description="the self-instruction, written as a todo: name the tools, files or "
            "URLs to use",
        ),
    ]
    when: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=200,
                description="once: when to fire ('30m', 'in 2h 15m', 'tomorrow at 09:00', ISO "
                "8601); recurring: the first trigger (default: one interval from now)",
            ),
        ]
        | None
    ) = None
    interval_seconds: (
        Annotated[
            int,
            msgspec.Meta(
                ge=MIN_INTERVAL_SECONDS,
                le=MAX_INTERVAL_SECONDS,
                description="recurring only: seconds between triggers",
            ),
        ]
        | None
    ) = None
    internal_comment: Annotated[
        str, msgspec.Meta(max_length=200, description="a short human-readable note")
    ] = ""
    timezone: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    timezone_offset: (
        Annotated[str, msgspec.Meta(max_length=6, description="±HH:MM, for absolute times")] | None
    ) = None


class ManageRecall(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``manage_recall``."""

    action: Literal["cancel", "skip", "list"]
    #: another of the calling session's owner's sessions, by name (default: the calling one)
    session_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


def _recall_of(job: Job) -> RecallSpec | None:
    """The recall settings in the job's spec; None if it has none (not written as a recall).

    Raises:
        JobSpecError: the job's stored spec does not decode.
    """
    return job_spec(job).recall or None


def recall_view(job: Job) -> dict[str, Any]:
    """A recall job as the tools, the events and the HTTP API show it.

    Raises:
        JobSpecError: the job's stored spec does not decode.
    """
    recall = _recall_of(job)
    return {
        "recall_id": job.id,
        "call_type": recall.call_type if recall else None,
        "status": _STATUS.get(job.state, job.state),
        "trigger_at": _iso(job.next_fire_at),
        "interval_seconds": recall.interval_seconds if recall else None,
        "internal_comment": recall.internal_comment if recall else "",
        "additional_context_message": recall.additional_context_message if recall else "",
        "fired_count": job.run_count,
        "created_at": _iso(job.created_at),
        "updated_at": _iso(job.updated_at),
    }


def _trigger(recall_id: str, call_type: str, interval: int | None, note: str) -> str:
    """The content of the turn a recall starts: one line naming the recall.

    The self-instruction is not part of it: it travels as ``instruction`` in the input's
    payload and the session hands it to the agent as a system message.
    """
    head = f"[RECALL] recall_id={recall_id} call_type={call_type}"
    if interval is not None:
        head += f" every={interval}s"
    note = " ".join(note.split())
    if note:
        head += f" note={note}"
    return head


def recall_fired_events(job: Job, run: JobRun) -> list[SessionEvent]:
    """The events a recall's firing adds to its session's log (the scheduler's hook).

    A ``recall_update`` with ``action`` ``"fired"`` (a once or immediate recall: it is done)
    or ``"rescheduled"`` (a recurring one: ``trigger_at`` is its next occurrence), and
    ``fired_at`` (the occurrence that fired) and ``run_id``. Nothing for other jobs.
    """
    if job.kind != RECALL_KIND:
        return []
    action = "rescheduled" if job.state == "active" else "fired"
    update = RecallUpdate(
        **recall_view(job), action=action, fired_at=_iso(run.scheduled_for), run_id=run.id
    )
    return [update]


async def _pending_job(store: Store, session_id: str) -> Job | None:
    for job in await JobStore(store).list_jobs(session_id=session_id, states=_PENDING_STATES):
        if job.kind == RECALL_KIND:
            return job
    return None


async def _require_pending(store: Store, session_id: str) -> Job:
    job = await _pending_job(store, session_id)
    if job is None:
        raise NotFound("session has no pending recall")
    return job


async def _announce(
    publish: Publisher | None, session_id: str, view: dict[str, Any], action: str, **extra: Any
) -> dict[str, Any]:
    """Append a ``recall_update`` event to the session's log; the store has the truth anyway.

    Returns:
        the event's payload (what the tool and the HTTP route answer with).
    """
    event = RecallUpdate(**view, action=action, **extra)
    update = event.stored()[1]
    if publish is not None:
        try:
            await publish(session_id, Publish(event=event))
        except Exception:  # the session is gone or broken: not the caller's failure
            log.warning("could not tell session %s about its recall", session_id, exc_info=True)
    return update


# -- the functions the tools and the HTTP layer share ------------------------------------------


async def get_recall(store: Store, session_id: str) -> dict[str, Any] | None:
    """The session's pending recall, or None."""
    job = await _pending_job(store, session_id)
    return None if job is None else recall_view(job)


async def list_recalls(store: Store, session_id: str) -> list[dict[str, Any]]:
    """Every recall of the session (pending, fired, cancelled), oldest first."""
    jobs = await JobStore(store).list_jobs(session_id=session_id)
    return [recall_view(job) for job in jobs if job.kind == RECALL_KIND]


async def cancel_recall(
    scheduler: ActorRef, store: Store, session_id: str, publish: Publisher | None
) -> dict[str, Any]:
    """Cancel the session's pending recall; answers it with ``"action": "cancelled"``.

    Raises:
        NotFound: ``session has no pending recall``.
        ConflictError: it fired (a once recall) while being cancelled.
    """
    job = await _require_pending(store, session_id)
    job = await scheduler.ask(CancelJob(job_id=job.id, session_id=session_id))
    if job.state != "cancelled":
        raise ConflictError(f"recall {job.id} has already fired; there is nothing to cancel")
    return await _announce(publish, session_id, recall_view(job), "cancelled")


async def skip_recall(
    scheduler: ActorRef, store: Store, clock: Clock, session_id: str, publish: Publisher | None
) -> dict[str, Any]:
    """Move a recurring recall to ``max(trigger_at, now) + interval_seconds``.

    Answers the recall with ``"action": "skipped"`` and ``skipped_trigger_at``.

    Raises:
        NotFound: ``session has no pending recall``.
        InvalidArgument: the pending recall is not recurring (or is paused).
    """
    job = await _require_pending(store, session_id)
    recall = _recall_of(job)
    call_type = recall.call_type if recall else None
    if recall is None or recall.call_type != "recurring" or recall.interval_seconds is None:
        raise InvalidArgument(
            f"skip only applies to recurring recalls; recall {job.id} is {call_type}: "
            "cancel it instead"
        )
    now = clock.now()
    base = now if job.next_fire_at is None else max(job.next_fire_at, now)
    target = base + timedelta(seconds=recall.interval_seconds)
    moved = await scheduler.ask(
        RescheduleJob(job_id=job.id, next_fire_at=target, session_id=session_id)
    )
    return await _announce(
        publish,
        session_id,
        recall_view(moved),
        "skipped",
        skipped_trigger_at=_iso(job.next_fire_at),
    )


# -- the tools ---------------------------------------------------------------------------------


def register_recall_tools(
    registry: ToolRegistry,
    scheduler: ActorRef,
    store: Store,
    clock: Clock,
    publish: Publisher | None,
) -> None:
    """Register ``schedule_recall`` and ``manage_recall``, bound to ``scheduler``.

    Args:
        publish: ``async (session_id, message)`` that tells the session actor (the node's
            ``tell_session``); ``recall_update`` events go through it.
    """

    async def parse_first(call: ToolCall, args: ScheduleRecall) -> tuple[datetime, str]:
        tz, offset = args.timezone, args.timezone_offset
        if tz is None and offset is None:
            session = await store.get_session(call.session_id)
            found = session.metadata.get("timezone")
            tz = found if isinstance(found, str) else None
        when = parse_when(args.when or "", now=clock.now(), timezone=tz, timezone_offset=offset)
        if when.kind != "once":
            raise InvalidArgument(
                f"{args.when!r} repeats ({when.description}); 'when' is one instant: for a "
                "repeating recall use call_type 'recurring' with interval_seconds",
                field="when",
            )
        assert when.run_at is not None, "a once When has its run_at"
        return when.run_at, when.description

    def check(args: ScheduleRecall) -> str:
        call_type = args.call_type
        if call_type != "recurring" and args.interval_seconds is not None:
            raise InvalidArgument(
                "interval_seconds only applies to call_type 'recurring'", field="interval_seconds"
            )
        if call_type == "recurring" and args.interval_seconds is None:
            raise InvalidArgument(
                "call_type 'recurring' needs interval_seconds", field="interval_seconds"
            )
        if call_type == "once" and args.when is None:
            raise InvalidArgument(
                "call_type 'once' needs when, e.g. '30m' or 'tomorrow at 09:00'", field="when"
            )
        if call_type == "immediate" and args.when is not None:
            raise InvalidArgument(
                "call_type 'immediate' fires right after this turn: leave out when", field="when"
            )
        text = args.additional_context_message.strip()
        if not text:
            raise InvalidArgument(
                "additional_context_message must not be blank", field="additional_context_message"
            )
        return text

    async def schedule_recall(call: ToolCall, args: ScheduleRecall) -> dict[str, Any]:
        text = check(args)
        first = understood = None
        if args.when is not None:
            first, understood = await parse_first(call, args)
        call_type, interval = args.call_type, args.interval_seconds
        recall_id = f"rc_{uuid.uuid4().hex[:12]}"
        if call_type == "recurring":
            schedule = Schedule(type="interval", interval_seconds=interval)
        else:
            schedule = Schedule(type="once", run_at=first or clock.now())
        deliver = {
            "source": "recall",
            "action_type": "llm_prompt",
            "prompt": _trigger(recall_id, call_type, interval, args.internal_comment),
            "instruction": text,
            "recall_id": recall_id,
            "is_recall": True,
        }
        add = AddJob(
            session_id=call.session_id,
            kind=RECALL_KIND,
            schedule=schedule,
            deliver=deliver,
            label=args.internal_comment,
            job_id=recall_id,
            immediate=call_type == "immediate",
            recall=RecallSpec(
                call_type=call_type,
                interval_seconds=interval,
                internal_comment=args.internal_comment,
                additional_context_message=text,
            ),
        )
        for attempt in (1, 2):
            try:
                job = await scheduler.ask(add)
                break
            except NotFound:
                raise
            except StoreError as exc:  # the unique index, whatever the backend calls it
                pending = await _pending_job(store, call.session_id)
                if pending is not None:
                    raise ConflictError(
                        f"session already has a pending recall (id {pending.id}); cancel it "
                        "first with manage_recall"
                    ) from exc
                if attempt == 2:
                    raise
                # The recall in the way fired or was cancelled since: its slot is free now.
            except InvalidArgument as exc:
                if exc.field != "prompt":
                    raise
                raise InvalidArgument(str(exc), field="additional_context_message") from None
        if call_type == "recurring" and first is not None:
            job = await scheduler.ask(
                RescheduleJob(job_id=job.id, next_fire_at=first, session_id=call.session_id)
            )
        update = await _announce(publish, call.session_id, recall_view(job), "scheduled")
        if understood is not None:
            update["understood"] = understood
        return update

    async def target(call: ToolCall, name: str | None) -> str:
        """The key of the caller's owner's session ``name`` (None: the calling session)."""
        if name is None or name == public_id(call.session_id):
            return call.session_id
        try:
            key = session_key(call.owner, name)
            owner = (await store.get_session(key)).owner
        except (ValueError, NotFound):
            owner = None
        if owner != call.owner:  # a key is in its owner's namespace; this only guards it
            raise NotFound(f"no session with id {name!r}")
        return key

    async def manage_recall(call: ToolCall, args: ManageRecall) -> dict[str, Any]:
        session_id = await target(call, args.session_id)
        if args.action == "cancel":
            return await cancel_recall(scheduler, store, session_id, publish)
        if args.action == "skip":
            return await skip_recall(scheduler, store, clock, session_id, publish)
        views = await list_recalls(store, session_id)
        pending = next((v["recall_id"] for v in views if v["status"] == "pending"), None)
        return {
            "recalls": views[-MAX_LISTED:],
            "total": len(views),
            "truncated": len(views) > MAX_LISTED,
            "pending_recall_id": pending,
        }

    registry.register(
        "schedule_recall",
        ScheduleRecall,
        schedule_recall,
        "Schedule work for yourself, done later in a turn of its own without the user: "
        "call_type 'once' (when: '30m', 'in 2h 15m', 'tomorrow at 09:00'), 'recurring' "
        f"(interval_seconds, {MIN_INTERVAL_SECONDS} to {MAX_INTERVAL_SECONDS}; optional first "
        "'when') or 'immediate' (right after this turn). One pending recall per session: "
        "cancel the current one first with manage_recall. Write additional_context_message as "
        "a todo that names the tools, files or URLs to use, e.g. 'Read /tmp/build.log with "
        "filesystem; if it has errors, report the last 50 lines', not 'tell the user 2 hours "
        "have passed'.",
    )
    registry.register(
        "manage_recall",
        ManageRecall,
        manage_recall,
        "Manage a session's recall: 'cancel' the pending one, 'skip' the next occurrence "
        "of a recurring one, or 'list' every recall (pending, fired, cancelled). session_id: "
        "another of the user's sessions, by name (default: this session).",
    )
