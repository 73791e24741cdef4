"""The session-bound ``cron`` tool (``action`` = add | list | remove) and the automations that
block a session's deletion (reference/cron-session-binding.md).

A cron job made here *belongs to the calling session*: it is a scheduler job of kind ``"cron"``
whose occurrences are ordinary turn inputs of that session (``source="cron"``), so a cron turn
reads and extends the same history the user sees. There is no delivery target and no unbound
job: a call without a session (an empty id, or a session that does not exist or is not the
caller's) is refused before anything is stored.

What the reference asks, and how it is met (better where noted):

* **Deferral while a turn runs.** The scheduler writes each occurrence into the session's
  durable inbox in the same transaction that consumes it; the session runs inbox rows one at a
  time and never folds a scheduled row into a running turn (only ``Inject`` does that). So a
  cron occurrence during an active turn waits for it to end whatever the session's policy, with
  no ``_cron_defer_until_session_idle`` flag to forget and no separate deferred queue that a
  crash could lose.
* **Trigger events in history.** The turn's content — what the agent sees and what the
  transcript keeps — is a readable trigger line naming the job and a versioned prompt
  reference, then the job's prompt::

      [CRON] job=3f2a9c0d1b7e prompt=daily-monitor@v1
      Check the deploy dashboard and report anything red.

  The ``stream_start`` event of that turn carries ``job_id``, ``run_id`` and ``label`` (the
  session adds them for every scheduled input); the input's payload also carries
  ``prompt_ref`` (``{"name", "version", "sha256", "template"}``) and ``cron_job_name``.
* **Prompt traceability.** The full rendered prompt lands in the run record
  (``JobRun.detail["prompt"]``, written by the scheduler in the fire transaction), next to the
  turn's outcome (``turn_completed`` / ``turn_failed`` with the error): a failed cron turn shows
  in the run record, not only in the transcript. The job spec stores the prompt once; run
  records do not copy the job.
* **Versioned prompt reference.** ``name`` identifies a job's prompt within its session
  (``daily-monitor``; derived from the prompt when not given). The version identifies the prompt
  *text*: 1 for a new name; re-adding a name after its job was removed keeps the version when
  the text is the same (same ``sha256``) and bumps it when the text changed. So ``name@vN``
  in a transcript always points at one exact prompt, and ``sha256`` proves it. Two live jobs
  of one session may not share a name (remove, then add, to change a prompt). The reference's
  ``template`` (``cron.trigger@v1``) names the wrapper format, versioned separately.
* **Limits.** The scheduler's limits come back as typed errors: ``limit_exceeded`` for jobs per
  session, ``invalid_argument`` (``field="schedule"``) for a schedule more frequent than the
  minimum interval or one that does not recur (cron jobs must recur; ``schedule_once`` and
  ``schedule_check`` are for one-shots).
* **Deleting a session.** ``bound_automations`` lists a session's pending user-created jobs
  (cron, check, once, … — not the agent's recalls nor heartbeats, which the reference does
  not count either) as small views, for ``DELETE /sessions/{id}`` to answer ``409`` with
  ``deleted: false``, ``blocked_by_automations: true`` and the list unless confirmed;
  ``cancel_bound_automations`` cancels every pending job of the session, those included,
  through the scheduler (so its timers go too) before the session is deleted.

It is over 400 lines because a quarter of it is the docstring above (what the reference asks and how
each point is met); the rest is the one tool and the automations that block a deletion, which share
its views of a job.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.scheduling.actor import AddJob, CancelJob
from turnstile.actors.scheduling.records import Job
from turnstile.actors.scheduling.spec import JobSpec, Schedule, job_spec
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.scheduling.timeexpr import When, parse_when
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import AlreadyExists, InvalidArgument, NotFound
from turnstile.runtime.store import Session, Store
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = [
    "CronArgs",
    "register_cron_tool",
    "bound_automations",
    "cancel_bound_automations",
    "automation_view",
    "UNBLOCKING_KINDS",
    "render_trigger",
    "require_session",
    "PENDING_STATES",
    "TRIGGER_TEMPLATE",
]

#: Job states that still fire or may fire again.
PENDING_STATES = ("active", "paused")
#: The wrapper that renders a cron prompt into a turn's content, with its format version.
TRIGGER_TEMPLATE = "cron.trigger@v1"
#: Characters of a prompt shown by ``cron list`` (the whole prompt is in the job).
SNIPPET_CHARS = 200

_NAME = re.compile(r"\w[\w.-]*")
#: The pattern is advertised in the schema but checked by hand, for a readable error.
Name = Annotated[
    str, msgspec.Meta(min_length=1, max_length=64, extra_json_schema={"pattern": r"^\w[\w.-]*$"})
]


class CronArgs(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``cron``.

    Attributes:
        action: ``add`` a job to this session, ``list`` its cron jobs, ``remove`` one.
        schedule: (add) a five-field cron expression or a recurring phrase
            (``"every weekday at 9am"``, ``"tous les lundis à 10h"``).
        prompt: (add) what the agent is asked at each occurrence.
        name: (add) the prompt's name, a slug (default: from the prompt's first words);
            (remove) the job to remove, instead of ``job_id``.
        timezone: (add) IANA zone the schedule is read in (default: the session's, else UTC).
        timezone_offset: (add) a fixed ``±HH:MM`` offset instead of ``timezone``.
        job_id: (remove) the job to remove.
    """

    action: Literal["add", "list", "remove"]
    schedule: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    prompt: Annotated[str, msgspec.Meta(max_length=4000)] | None = None
    name: Name | None = None
    timezone: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    timezone_offset: Annotated[str, msgspec.Meta(max_length=6)] | None = None
    job_id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render_trigger(job_id: str, name: str, version: int, prompt: str) -> str:
    """A cron turn's content: the trigger line (job and prompt reference), then the prompt."""
    return f"[CRON] job={job_id} prompt={name}@v{version}\n{prompt}"


def _derive_name(prompt: str) -> str:
    """A slug from the prompt's first words (``"Check the deploy!"`` → ``check-the-deploy``)."""
    words = re.findall(r"\w+", prompt.lower())[:4]
    slug = "-".join(words)[:40].strip("-_")
    return slug or "cron"


async def require_session(store: Store, call: ToolCall, what: str) -> Session:
    """The calling session, which ``what`` belongs to.

    Raises:
        InvalidArgument: the call has no session (``field="session_id"``).
        NotFound: the session does not exist or is not the caller's.
    """
    if not call.session_id:
        raise InvalidArgument(
            f"{what} belongs to a session: call it from a session's turn", field="session_id"
        )
    try:
        session = await store.get_session(call.session_id)
    except NotFound:
        session = None
    if session is None or session.owner != call.owner:
        raise NotFound(f"no session with id {call.session_id!r}: {what} needs its session")
    return session


def _schedule_text(job: Job, spec: JobSpec) -> str:
    schedule = spec.schedule
    if schedule.type == "cron":
        return f"cron {schedule.cron} ({schedule.timezone})"
    if schedule.type == "interval":
        return f"every {schedule.interval_seconds or 0:g}s"
    return f"once at {_iso(job.next_fire_at)}" if job.next_fire_at else "once"


def _job_name(job: Job, spec: JobSpec) -> str:
    name = spec.prompt_name or spec.label
    if not name:
        text = spec.instructions or spec.prompt or job.kind
        name = text.split("\n", 1)[0][:80]
    return name


def _soonest_first(view: dict[str, Any]) -> tuple[bool, str, str]:
    when = view["next_run_at"]
    return (when is None, when or "", view.get("id") or view.get("job_id") or "")


def automation_view(job: Job) -> dict[str, Any]:
    """A job as a small view (what blocks a session's deletion, what ``list_schedule`` shows).

    ``id``, ``name`` and ``enabled`` are the reference's field names; ``kind``, ``state``,
    ``schedule`` and ``next_run_at`` say what it is and when it fires next.

    Raises:
        JobSpecError: the job's stored spec does not decode.
    """
    spec = job_spec(job)
    return {
        "id": job.id,
        "kind": job.kind,
        "name": _job_name(job, spec),
        "enabled": job.state == "active",
        "state": job.state,
        "schedule": _schedule_text(job, spec),
        "next_run_at": _iso(job.next_fire_at),
    }


#: Job kinds that end with their session without blocking its deletion: the reference blocks
#: only on jobs the user created, not on system jobs (a heartbeat) nor on the agent's own
#: recalls (``ON DELETE CASCADE`` there).
UNBLOCKING_KINDS = frozenset({"recall", "heartbeat"})


async def bound_automations(store: Store, session_id: str) -> list[dict[str, Any]]:
    """The session's pending user-created jobs, soonest first, as ``automation_view`` dicts.

    These are what block ``DELETE /sessions/{id}`` (409 ``blocked_by_automations``) unless the
    caller confirms; recalls and heartbeats (``UNBLOCKING_KINDS``) do not block, and are
    cancelled with the session all the same (:func:`cancel_bound_automations`).
    """
    jobs = await JobStore(store).list_jobs(session_id=session_id, states=list(PENDING_STATES))
    views = [automation_view(job) for job in jobs if job.kind not in UNBLOCKING_KINDS]
    views.sort(key=_soonest_first)
    return views


async def cancel_bound_automations(
    scheduler: ActorRef, store: Store, session_id: str
) -> list[dict[str, Any]]:
    """Cancel every pending job of the session through the scheduler (recalls and heartbeats
    too); returns them, soonest first.

    Call this before deleting a session: cancelling through the scheduler drops the jobs'
    timers, which deleting their rows alone would leave behind.
    """
    jobs = await JobStore(store).list_jobs(session_id=session_id, states=list(PENDING_STATES))
    cancelled = []
    for view in sorted((automation_view(job) for job in jobs), key=_soonest_first):
        done = await scheduler.ask(CancelJob(job_id=view["id"], session_id=session_id))
        cancelled.append(automation_view(done))
    return cancelled


def _prompt_version(spec: JobSpec) -> int:
    """The version of the job's prompt; 1 when the spec does not say (not a ``cron`` one)."""
    return spec.prompt_version or 1


def _cron_view(job: Job) -> dict[str, Any]:
    spec = job_spec(job)
    schedule = spec.schedule
    prompt = spec.prompt_text or spec.prompt
    view: dict[str, Any] = {
        "job_id": job.id,
        "name": _job_name(job, spec),
        "session_id": job.session_id,
        "status": job.state,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "next_run_at": _iso(job.next_fire_at),
        "run_count": job.run_count,
    }
    if spec.prompt_name:
        view["prompt_ref"] = f"{spec.prompt_name}@v{_prompt_version(spec)}"
        view["prompt_sha256"] = spec.prompt_sha256 or None
    view["prompt"] = prompt if len(prompt) <= SNIPPET_CHARS else prompt[:SNIPPET_CHARS] + "…"
    if spec.understood:
        view["understood"] = spec.understood
    return view


def register_cron_tool(
    registry: ToolRegistry, scheduler: ActorRef, store: Store, clock: Clock
) -> None:
    """Register ``cron``, bound to ``scheduler``."""

    async def parse(session: Session, schedule: str, args: CronArgs) -> When:
        tz, offset = args.timezone, args.timezone_offset
        if tz is None and offset is None:
            found = session.metadata.get("timezone")
            tz = found if isinstance(found, str) else None
        try:
            return parse_when(schedule, now=clock.now(), timezone=tz, timezone_offset=offset)
        except InvalidArgument as exc:
            field = "schedule" if exc.field == "when" else exc.field
            raise InvalidArgument(str(exc), field=field) from None

    async def version_for(session_id: str, name: str, sha: str) -> int:
        """The prompt version of ``name`` with this text; refuses a live job with that name."""
        latest: JobSpec | None = None
        for job in await JobStore(store).list_jobs(session_id=session_id):
            if job.kind != "cron":
                continue
            spec = job_spec(job)
            if spec.prompt_name != name:
                continue
            if job.state in PENDING_STATES:
                raise AlreadyExists(
                    f"cron job {name!r} already exists in this session (job_id={job.id}): "
                    "remove it first, or choose another name"
                )
            if latest is None or _prompt_version(spec) > _prompt_version(latest):
                latest = spec
        if latest is None:
            return 1
        version = _prompt_version(latest)
        return version if latest.prompt_sha256 == sha else version + 1

    async def add(session: Session, args: CronArgs) -> dict[str, Any]:
        if not args.schedule or not args.schedule.strip():
            raise InvalidArgument("cron add needs a schedule", field="schedule")
        if not args.prompt or not args.prompt.strip():
            raise InvalidArgument("cron add needs a prompt", field="prompt")
        when = await parse(session, args.schedule, args)
        if when.kind != "cron":
            raise InvalidArgument(
                f"{args.schedule!r} happens once ({when.description}); a cron job must recur: "
                "use schedule_once or schedule_check for one-shots",
                field="schedule",
            )
        if args.name is not None and not _NAME.fullmatch(args.name):
            raise InvalidArgument(
                "name must be letters, digits, '_', '.' or '-', starting with a letter or digit "
                f"(e.g. 'daily-monitor'), got {args.name!r}",
                field="name",
            )
        name = args.name or _derive_name(args.prompt)
        sha = _sha256(args.prompt)
        version = await version_for(session.id, name, sha)
        job_id = uuid.uuid4().hex[:12]
        prompt_ref = {"name": name, "version": version, "sha256": sha, "template": TRIGGER_TEMPLATE}
        try:
            job = await scheduler.ask(
                AddJob(
                    session_id=session.id,
                    kind="cron",
                    schedule=Schedule(type="cron", cron=when.cron, timezone=when.timezone),
                    deliver={
                        "source": "cron",
                        "action_type": "llm_prompt",
                        "prompt": render_trigger(job_id, name, version, args.prompt),
                        "cron_job_name": name,
                        "prompt_ref": prompt_ref,
                    },
                    label=name,
                    job_id=job_id,
                    understood=when.description,
                    prompt_name=name,
                    prompt_version=version,
                    prompt_sha256=sha,
                    prompt_text=args.prompt,
                )
            )
        except InvalidArgument as exc:
            field = "schedule" if exc.field in ("cron", "when") else exc.field
            raise InvalidArgument(str(exc), field=field) from None
        return {**_cron_view(job), "understood": when.description}

    async def owned_cron_job(session: Session, args: CronArgs) -> Job:
        if args.job_id is not None:
            try:
                job = await JobStore(store).get_job(args.job_id)
            except NotFound:
                job = None
            if job is None or job.kind != "cron" or job.session_id != session.id:
                raise NotFound(f"no cron job with id {args.job_id!r} in this session")
            return job
        if args.name is not None:
            jobs = await JobStore(store).list_jobs(
                session_id=session.id, states=list(PENDING_STATES)
            )
            for job in jobs:
                if job.kind == "cron" and _job_name(job, job_spec(job)) == args.name:
                    return job
            raise NotFound(f"no cron job named {args.name!r} in this session")
        raise InvalidArgument("cron remove needs job_id or name", field="job_id")

    async def remove(session: Session, args: CronArgs) -> dict[str, Any]:
        job = await owned_cron_job(session, args)
        if job.state not in PENDING_STATES:
            raise InvalidArgument(f"cron job {job.id!r} is already {job.state}", field="job_id")
        job = await scheduler.ask(CancelJob(job_id=job.id, session_id=session.id))
        return {"job_id": job.id, "name": _job_name(job, job_spec(job)), "status": job.state}

    async def list_(session: Session) -> dict[str, Any]:
        jobs = await JobStore(store).list_jobs(session_id=session.id, states=list(PENDING_STATES))
        views = []
        for job in jobs:
            if job.kind != "cron":
                continue
            view = _cron_view(job)
            runs = await JobStore(store).list_runs(job.id, limit=1)
            if runs:
                run = runs[0]
                view["last_run"] = {
                    "run_id": run.id,
                    "scheduled_for": _iso(run.scheduled_for),
                    "state": run.state,
                }
            views.append(view)
        views.sort(key=_soonest_first)
        return {"session_id": session.id, "jobs": views, "total": len(views)}

    async def cron(call: ToolCall, args: CronArgs) -> dict[str, Any]:
        session = await require_session(store, call, "a cron job")
        if args.action == "add":
            return await add(session, args)
        if args.action == "remove":
            return await remove(session, args)
        return await list_(session)

    registry.register(
        "cron",
        CronArgs,
        cron,
        "Recurring prompts in this session: add (schedule as cron or 'every weekday at 9am', "
        "prompt, optional name and timezone), list, or remove (job_id or name). Each run is a "
        "turn of this session, after any turn in progress.",
    )
