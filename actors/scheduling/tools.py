"""The scheduling primitives: schedule_once, schedule_cron, schedule_cancel, schedule_list,
schedule_status and remember (names, parameters and responses as in the execution-primitives
reference), and schedule_pause / schedule_resume.

A job's ``status`` is its state (``active``, ``paused``, ``completed``, ``cancelled``), except
that a job whose last run failed is ``failed`` (the reference's states: ``active``, ``paused``,
``completed``, ``failed``) while it is not paused or cancelled; ``next_run_at`` says whether it
fires again, and ``last_run_status`` gives its last run's own state.

Every tool works for the calling session only: a job of another session is "not found". Time
expressions are parsed deterministically (``timeexpr``) in the call's ``timezone`` /
``timezone_offset``, else the session's (``metadata.timezone``), else UTC; every response says
how the expression was understood (``understood``).

What a job delivers when it fires is a turn input of the session:

* ``llm_prompt`` — the prompt, as a turn the agent answers;
* ``notification`` — ``[SCHEDULED NOTIFICATION] …`` with the message, for the agent to relay;
* ``tool_call`` — the session runs the tool when the turn starts and hands the agent
  ``[SCHEDULED TOOL RESULT] …``.

``output_channel`` is ``llm_notification`` (into the session) or a channel from the config: a
``notification`` goes straight to it, a ``tool_call``'s result goes to it, and an
``llm_prompt``'s answer goes to it after the turn. A job created without one delivers to the
session's default channel (``[execution] default_channel``, or the session's
``metadata.execution.default_channel``), else into the session; ``remember`` always delivers
into the session (a recall is the agent's note to itself).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.scheduling.actor import AddJob, CancelJob, PauseJob, ResumeJob
from turnstile.actors.scheduling.records import Job, JobRun
from turnstile.actors.scheduling.spec import JobSpec, MisfirePolicy, Schedule, job_spec
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.scheduling.timeexpr import When, parse_when
from turnstile.actors.sessions.inputs import IN_SESSION
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument, NotFound
from turnstile.runtime.store import Store
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = ["register_scheduling_tools", "OUTPUT_CHANNELS"]

OUTPUT_CHANNELS = (IN_SESSION,)

Text = Annotated[str, msgspec.Meta(max_length=200)]
Prompt = Annotated[str, msgspec.Meta(max_length=8000)]
ActionType = Literal["notification", "llm_prompt", "tool_call"]


class _Common(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    action_type: ActionType = "notification"
    tool_name: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    tool_params: dict[str, Any] = msgspec.field(default_factory=dict)
    prompt: Prompt | None = None
    label: Text = ""
    #: None: the session's default channel (see the module docstring)
    output_channel: str | None = None
    output_config: dict[str, Any] = msgspec.field(default_factory=dict)
    timezone: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    timezone_offset: Annotated[str, msgspec.Meta(max_length=6)] | None = None
    misfire: MisfirePolicy = "coalesce"
    jitter_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 0.0


class ScheduleOnce(_Common, kw_only=True):
    """Arguments of ``schedule_once``."""

    when: Text


class ScheduleCron(_Common, kw_only=True):
    """Arguments of ``schedule_cron``."""

    cron: Text
    max_runs: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0


class JobRef(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments naming one job."""

    job_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


#: What ``schedule_list`` filters on: the reference's four, and ``cancelled``.
JobStatus = Literal["active", "paused", "completed", "failed", "cancelled"]


class ListJobs(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of ``schedule_list``: ``status`` filters on a job's status (see the module
    docstring: ``failed`` is a job whose last run failed)."""

    status: JobStatus | None = None


class Remember(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``remember``."""

    what: Prompt
    when: Text
    action: Literal["notification", "llm_prompt"] = "notification"
    timezone: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    timezone_offset: Annotated[str, msgspec.Meta(max_length=6)] | None = None


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


def _deliver(args: _Common, source: str, channel: str, check_channel=None) -> dict[str, Any]:
    """What the job delivers, to ``channel`` (the call's ``output_channel`` or the default)."""
    if check_channel is not None:
        check_channel(channel, args.output_config)  # UnknownChannel names them
    elif channel not in OUTPUT_CHANNELS:
        raise InvalidArgument(
            f"output channel {channel!r} is not configured "
            f"(available: {', '.join(OUTPUT_CHANNELS)})",
            field="output_channel",
        )
    if args.action_type == "tool_call":
        if not args.tool_name:
            raise InvalidArgument("tool_call needs tool_name", field="tool_name")
    elif not args.prompt:
        raise InvalidArgument(f"{args.action_type} needs a prompt", field="prompt")
    deliver: dict[str, Any] = {"action_type": args.action_type, "source": source}
    if args.prompt:
        deliver["prompt"] = args.prompt
    if args.action_type == "tool_call":
        deliver["tool_name"] = args.tool_name
        deliver["tool_params"] = args.tool_params
    deliver["output_channel"] = channel
    if args.output_config:
        deliver["output_config"] = args.output_config
    return deliver


#: The run state of a run whose turn failed (``records.RUN_STATES``).
FAILED_RUN = "turn_failed"


def job_status(job: Job, last_run: JobRun | None) -> str:
    """A job's status as the tools show it: its state, or ``failed`` when its last run failed
    and it is neither paused nor cancelled."""
    if (
        last_run is not None
        and last_run.state == FAILED_RUN
        and job.state
        in (
            "active",
            "completed",
        )
    ):
        return "failed"
    return job.state


def _job_view(
    job: Job, spec: JobSpec | None = None, last_run: JobRun | None = None
) -> dict[str, Any]:
    """A job as the scheduling tools show it (``spec``: the job's, if already decoded;
    ``last_run``: its latest run record, if it has one)."""
    spec = spec or job_spec(job)
    schedule = spec.schedule
    view: dict[str, Any] = {
        "job_id": job.id,
        "schedule_type": schedule.type,
        "label": spec.label,
        "status": job_status(job, last_run),
        "run_count": job.run_count,
        "action_type": spec.action_type,
        "output_channel": spec.output_channel,
    }
    if schedule.type == "cron":
        view["cron"] = schedule.cron
        view["timezone"] = schedule.timezone
    if job.next_fire_at is not None:
        view["next_run_at"] = _iso(job.next_fire_at)
    if spec.tool_name:
        view["tool_name"] = spec.tool_name
    if spec.understood:
        view["understood"] = spec.understood
    if last_run is not None:
        view["last_run_at"] = _iso(last_run.scheduled_for)
        view["last_run_status"] = last_run.state
    return view


def register_scheduling_tools(
    registry: ToolRegistry,
    scheduler: ActorRef,
    store: Store,
    clock: Clock,
    check_channel=None,
    default_channel: Callable[[str], Awaitable[str]] | None = None,
) -> None:
    """Register the scheduling primitives, bound to ``scheduler``.

    ``check_channel(channel, output_config)`` (the notifier's) validates ``output_channel``;
    without it only ``llm_notification`` is accepted. ``default_channel(session_key)`` is where
    a job created without ``output_channel`` delivers (``NodeContext.output_channel``); without
    it, into the session.
    """

    async def session_timezone(call: ToolCall) -> str | None:
        session = await store.get_session(call.session_id)
        tz = session.metadata.get("timezone")
        return tz if isinstance(tz, str) else None

    async def parse(call: ToolCall, text: str, args) -> When:
        tz, offset = args.timezone, args.timezone_offset
        if tz is None and offset is None:
            tz = await session_timezone(call)
        return parse_when(text, now=clock.now(), timezone=tz, timezone_offset=offset)

    async def owned_job(call: ToolCall, job_id: str) -> Job:
        try:
            job = await JobStore(store).get_job(job_id)
        except NotFound:
            job = None
        if job is None or job.session_id != call.session_id:
            raise NotFound(f"no job with id {job_id!r}")
        return job

    async def add(call, args, when: When, kind: str, max_runs: int = 0) -> Job:
        channel = args.output_channel
        if channel is None:
            channel = (
                IN_SESSION if default_channel is None else await default_channel(call.session_id)
            )
        if when.kind == "once":
            schedule = Schedule(type="once", run_at=when.run_at, timezone=when.timezone)
        else:
            schedule = Schedule(type="cron", cron=when.cron, timezone=when.timezone)
        return await scheduler.ask(
            AddJob(
                session_id=call.session_id,
                kind=kind,
                schedule=schedule,
                deliver=_deliver(
                    args, "cron" if when.kind == "cron" else "schedule", channel, check_channel
                ),
                label=args.label,
                misfire=args.misfire,
                max_runs=max_runs,
                jitter_seconds=args.jitter_seconds,
                understood=when.description,
            )
        )

    async def schedule_once(call: ToolCall, args: ScheduleOnce) -> dict[str, Any]:
        when = await parse(call, args.when, args)
        if when.kind != "once":
            raise InvalidArgument(
                f"{args.when!r} repeats ({when.description}); use schedule_cron", field="when"
            )
        job = await add(call, args, when, "once")
        return {**_job_view(job), "run_at": _iso(when.run_at), "understood": when.description}

    async def schedule_cron(call: ToolCall, args: ScheduleCron) -> dict[str, Any]:
        when = await parse(call, args.cron, args)
        if when.kind != "cron":
            raise InvalidArgument(
                f"{args.cron!r} happens once ({when.description}); use schedule_once",
                field="cron",
            )
        job = await add(call, args, when, "cron", args.max_runs)
        return {**_job_view(job), "max_runs": args.max_runs, "understood": when.description}

    async def schedule_cancel(call: ToolCall, args: JobRef) -> dict[str, Any]:
        await owned_job(call, args.job_id)
        job = await scheduler.ask(CancelJob(job_id=args.job_id, session_id=call.session_id))
        return {"job_id": job.id, "status": job.state}

    async def last_run(job: Job) -> JobRun | None:
        """The job's latest run record; none read for a job that never delivered a turn."""
        if not job.run_count:
            return None
        runs = await JobStore(store).list_runs(job.id, limit=1)
        return runs[0] if runs else None

    async def schedule_list(call: ToolCall, args: ListJobs) -> dict[str, Any]:
        jobs = await JobStore(store).list_jobs(session_id=call.session_id)
        views = []
        for job in jobs:
            if args.status is not None and args.status not in (job.state, "failed"):
                continue  # the job's state rules it out before its runs are read
            view = _job_view(job, last_run=await last_run(job))
            if args.status is not None and view["status"] != args.status:
                continue
            views.append(view)
        counts: dict[str, int] = {}
        for view in views:
            counts[view["status"]] = counts.get(view["status"], 0) + 1
        return {"jobs": views, "total": len(views), **counts}

    async def schedule_pause(call: ToolCall, args: JobRef) -> dict[str, Any]:
        await owned_job(call, args.job_id)
        job = await scheduler.ask(PauseJob(job_id=args.job_id, session_id=call.session_id))
        return _job_view(job, last_run=await last_run(job))

    async def schedule_resume(call: ToolCall, args: JobRef) -> dict[str, Any]:
        await owned_job(call, args.job_id)
        job = await scheduler.ask(ResumeJob(job_id=args.job_id, session_id=call.session_id))
        return _job_view(job, last_run=await last_run(job))

    async def schedule_status(call: ToolCall, args: JobRef) -> dict[str, Any]:
        job = await owned_job(call, args.job_id)
        runs = await JobStore(store).list_runs(job.id, limit=20)
        spec = job_spec(job)
        view = _job_view(job, spec, runs[0] if runs else None)
        view["max_runs"] = spec.max_runs
        view["misfire"] = spec.misfire
        view["created_at"] = _iso(job.created_at)
        if spec.prompt:
            view["prompt"] = spec.prompt
        view["recent_runs"] = [
            {
                "run_id": run.id,
                "scheduled_for": _iso(run.scheduled_for),
                "state": run.state,
                "late_seconds": (run.detail or {}).get("late_seconds"),
                "error": (run.detail or {}).get("error"),
            }
            for run in runs
        ]
        return view

    async def remember(call: ToolCall, args: Remember) -> dict[str, Any]:
        when = await parse(call, args.when, args)
        common = _Common(
            action_type=args.action,
            prompt=args.what,
            label=args.what[:200],
            output_channel=IN_SESSION,  # a recall is the agent's own note: into the session
            timezone=args.timezone,
            timezone_offset=args.timezone_offset,
        )
        job = await add(call, common, when, "remember" if when.kind == "once" else "cron")
        out = {**_job_view(job), "understood": when.description}
        if when.kind == "once":
            out["run_at"] = _iso(when.run_at)
        return out

    registry.register(
        "schedule_once",
        ScheduleOnce,
        schedule_once,
        "Schedule a one-shot job at a time or after a delay ('in 5m', 'tomorrow at 9am', ISO).",
    )
    registry.register(
        "schedule_cron",
        ScheduleCron,
        schedule_cron,
        "Schedule a recurring job: a 5-field cron or 'every Monday at 10am', in a timezone.",
    )
    registry.register("schedule_cancel", JobRef, schedule_cancel, "Cancel an active job.")
    registry.register(
        "schedule_pause",
        JobRef,
        schedule_pause,
        "Pause a job: it fires nothing until resumed (keeps its runs).",
    )
    registry.register(
        "schedule_resume",
        JobRef,
        schedule_resume,
        "Resume a paused job from its next occurrence (what fell due while paused is not run).",
    )
    registry.register(
        "schedule_list",
        ListJobs,
        schedule_list,
        "List this session's jobs, by status (active, paused, completed, failed: the last run "
        "failed, cancelled).",
    )
    registry.register(
        "schedule_status",
        JobRef,
        schedule_status,
        "A job's details and its recent runs (late, missed and coalesced ones included).",
    )
    registry.register(
        "remember",
        Remember,
        remember,
        "Remind me: deliver 'what' at 'when' (natural language or cron).",
    )
