"""Scheduled checks: ``schedule_check``, ``list_schedule`` and ``cancel_scheduled``
(reference/scheduling-heartbeats.md, sections 1–2).

``schedule_check`` is "come back to this later": a one-shot scheduler job of kind ``"check"``
that, ``delay_minutes`` (1–1440) from now, becomes a turn input of the calling session with
``source="check"``. The turn's content says what it is, which check, when it was asked for and
what it is about, then the instructions::

    [SCHEDULED CHECK] id=3f2a9c0d1b7e requested_at=2026-11-21T12:00:00Z reference=https://…/pull/3
    Check CI status on PR #3. If it passed, report success; if it failed, fix it.

The input's payload also carries the reference's work-item fields (``type="scheduled_check"``,
``instructions``, ``reference``, ``requested_at``) and the scheduler's (``job_id``,
``scheduled_for``); the run record keeps the rendered prompt and, once the turn closes, its
outcome.

Where this does better than the reference:

* **No 30-second ticker.** The scheduler's timer wheel fires the check on its due instant, and
  the fire is one transaction (consume the job, write the run record, enqueue the input), so a
  check is delivered exactly once across crashes and several nodes. Due times are whole seconds
  (``delay_minutes`` may be fractional: 1.5 is 90 s).
* **Never lost, never interrupting.** A check due while the session is in a turn waits for the
  turn to end; a check missed while the node was down is delivered late (``coalesce``), with
  ``scheduled_for`` and the run's ``late_seconds`` saying how late.
* **Ownership.** ``list_schedule`` with ``session_only=false`` shows the pending items of every
  session of the caller's *owner* (the same user), never another user's; ``cancel_scheduled``
  cancels any item ``list_schedule`` can show, and an item of another user is "not found", not
  "forbidden", so ids cannot be probed.
* **One vocabulary for every kind.** ``list_schedule`` shows every pending job — checks, cron
  jobs, one-shots, reminders, recalls, heartbeats — with the reference's ``status`` words
  (``pending``, ``paused``), so the agent sees everything that will wake it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
from msgspec import UNSET

from turnstile.actors.scheduling.actor import AddJob, CancelJob
from turnstile.actors.scheduling.cron import PENDING_STATES, require_session
from turnstile.actors.scheduling.records import Job
from turnstile.actors.scheduling.spec import Schedule, job_spec
from turnstile.actors.scheduling.store import JobStore
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument, NotFound
from turnstile.runtime.store import Store
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = [
    "ScheduleCheck",
    "ListSchedule",
    "CancelScheduled",
    "register_check_tools",
    "render_check",
    "STATUS_WORDS",
]

#: Job states in the reference's words.
STATUS_WORDS = {
    "active": "pending",
    "paused": "paused",
    "completed": "fired",
    "cancelled": "cancelled",
    "failed": "failed",
}
#: Characters of an item's instructions shown by ``list_schedule``.
SNIPPET_CHARS = 120
#: At most this many items in one ``list_schedule`` answer (``total`` counts them all).
MAX_LISTED = 200


class ScheduleCheck(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``schedule_check``.

    Attributes:
        delay_minutes: minutes from now, 1 to 1440 (a day); fractions are rounded to seconds.
        instructions: what to check or do when the time comes.
        reference: a PR URL, check run URL, ticket…, on one line.
    """

    delay_minutes: Annotated[float, msgspec.Meta(ge=1, le=1440)]
    instructions: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
    reference: Annotated[str, msgspec.Meta(max_length=500)] | None = None


class ListSchedule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``list_schedule``.

    Attributes:
        session_only: only this session's items; otherwise those of every session of the
            same owner.
    """

    session_only: bool = False


class CancelScheduled(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``cancel_scheduled``."""

    scheduled_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


def _duration(seconds: int) -> str:
    """``5400`` → ``1h 30m``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h"] if hours else []
    if minutes:
        parts.append(f"{minutes}m")
    if secs:
        parts.append(f"{secs}s")
    return " ".join(parts)


def render_check(
    check_id: str, instructions: str, reference: str | None, requested_at: datetime
) -> str:
    """A check turn's content: the header line, then the instructions."""
    head = f"[SCHEDULED CHECK] id={check_id} requested_at={_iso(requested_at)}"
    if reference:
        head += f" reference={reference}"
    return f"{head}\n{instructions}"


def _item_view(job: Job) -> dict[str, Any]:
    spec = job_spec(job)
    text = spec.instructions or spec.prompt_text or spec.prompt
    if not text and spec.tool_name:
        text = f"tool {spec.tool_name}"
    view: dict[str, Any] = {
        "scheduled_id": job.id,
        "type": job.kind,
        "session_id": job.session_id,
        "status": STATUS_WORDS.get(job.state, job.state),
        "run_at": _iso(job.next_fire_at),
        "instructions": text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "…",
    }
    schedule = spec.schedule
    if schedule.type == "cron":
        view["recurrence"] = f"{schedule.cron} ({schedule.timezone})"
    elif schedule.type == "interval":
        view["recurrence"] = f"every {schedule.interval_seconds or 0:g}s"
    if spec.reference:
        view["reference"] = spec.reference
    if spec.label:
        view["label"] = spec.label
    return view


def register_check_tools(
    registry: ToolRegistry, scheduler: ActorRef, store: Store, clock: Clock
) -> None:
    """Register ``schedule_check``, ``list_schedule`` and ``cancel_scheduled``."""

    async def owned_item(call: ToolCall, scheduled_id: str) -> Job:
        """A job of one of the caller's owner's sessions, else "not found"."""
        owner = None
        try:
            job = await JobStore(store).get_job(scheduled_id)
            if job.session_id is not None:
                owner = (await store.get_session(job.session_id)).owner
        except NotFound:
            pass
        if owner is None or owner != call.owner:
            raise NotFound(f"no scheduled item with id {scheduled_id!r}")
        return job

    async def schedule_check(call: ToolCall, args: ScheduleCheck) -> dict[str, Any]:
        session = await require_session(store, call, "a scheduled check")
        instructions = args.instructions.strip()
        if not instructions:
            raise InvalidArgument("instructions are empty", field="instructions")
        reference = args.reference.strip() if args.reference else None
        if reference and any(c in reference for c in "\r\n"):
            raise InvalidArgument("reference must be one line", field="reference")
        seconds = round(args.delay_minutes * 60)
        now = clock.now()
        run_at = now + timedelta(seconds=seconds)
        understood = f"in {_duration(seconds)} — {_iso(run_at)}"
        check_id = uuid.uuid4().hex[:12]
        deliver: dict[str, Any] = {
            "source": "check",
            "action_type": "llm_prompt",
            "prompt": render_check(check_id, instructions, reference, now),
            "type": "scheduled_check",
            "instructions": instructions,
            "requested_at": _iso(now),
        }
        if reference:
            deliver["reference"] = reference
        job = await scheduler.ask(
            AddJob(
                session_id=session.id,
                kind="check",
                schedule=Schedule(type="once", run_at=run_at),
                deliver=deliver,
                label=instructions.split("\n", 1)[0][:80],
                job_id=check_id,
                instructions=instructions,
                understood=understood,
                reference=reference or UNSET,
            )
        )
        out: dict[str, Any] = {
            "scheduled_id": job.id,
            "type": "check",
            "session_id": session.id,
            "status": STATUS_WORDS[job.state],
            "run_at": _iso(job.next_fire_at),
            "understood": understood,
            "instructions": instructions,
        }
        if reference:
            out["reference"] = reference
        return out

    async def list_schedule(call: ToolCall, args: ListSchedule) -> dict[str, Any]:
        session = await require_session(store, call, "a schedule")
        if args.session_only:
            session_ids = [session.id]
        else:
            session_ids, after = [], None
            while True:
                page = await store.list_sessions(owner=call.owner, limit=500, after_id=after)
                session_ids.extend(s.id for s in page)
                if len(page) < 500:
                    break
                after = page[-1].id
        jobs: list[Job] = []
        for session_id in session_ids:
            jobs.extend(
                await JobStore(store).list_jobs(session_id=session_id, states=list(PENDING_STATES))
            )
        far = datetime.max.replace(tzinfo=UTC)
        jobs.sort(key=lambda j: (j.next_fire_at or far, j.id))
        out: dict[str, Any] = {
            "scope": "session" if args.session_only else "owner",
            "session_id": session.id,
            "items": [_item_view(job) for job in jobs[:MAX_LISTED]],
            "total": len(jobs),
        }
        if len(jobs) > MAX_LISTED:
            out["truncated"] = True
        return out

    async def cancel_scheduled(call: ToolCall, args: CancelScheduled) -> dict[str, Any]:
        await require_session(store, call, "a scheduled item")
        job = await owned_item(call, args.scheduled_id)
        if job.state not in PENDING_STATES:
            raise InvalidArgument(
                f"scheduled item {job.id!r} is {STATUS_WORDS.get(job.state, job.state)}, "
                "not pending",
                field="scheduled_id",
            )
        job = await scheduler.ask(CancelJob(job_id=job.id, session_id=job.session_id))
        return {
            "scheduled_id": job.id,
            "type": job.kind,
            "session_id": job.session_id,
            "status": STATUS_WORDS.get(job.state, job.state),
        }

    registry.register(
        "schedule_check",
        ScheduleCheck,
        schedule_check,
        "Schedule a future check-in on this session, delay_minutes (1-1440) from now: e.g. after "
        "pushing code, to poll CI, or to revisit a task later.",
    )
    registry.register(
        "list_schedule",
        ListSchedule,
        list_schedule,
        "List your pending scheduled items (checks, cron jobs, reminders, heartbeats): of this "
        "session only, or of all your sessions (default).",
    )
    registry.register(
        "cancel_scheduled",
        CancelScheduled,
        cancel_scheduled,
        "Cancel a pending scheduled item by its scheduled_id.",
    )
