"""Heartbeats: recurring agent turns that check a checklist and stay quiet when all is well.

``set_heartbeat`` (as in the scheduling-heartbeats reference) configures one heartbeat per
session: every ``interval_minutes`` (15–1440) the scheduler delivers a ``heartbeat`` input.
Its turn gets the heartbeat system-prompt segment with the checklist, an optional model
override and token cap, and a restricted tool profile (the reference's):

* ``heartbeat`` (default) — look and report: ``filesystem.read``/``list``, ``http.get``, the
  reference's read-only shell commands (``shell.read``: an allowlist of commands that only
  look, every argument checked, no shell), the listing and status tools (schedules, watchers,
  background tasks), ``schedule_check``, ``cancel_scheduled`` and ``send_notification``;
  nothing that writes or runs any other command;
* ``heartbeat_active`` — the above plus writes (``filesystem.write``, ``http.post``,
  ``http.download``) and the tools that schedule work;
* ``full`` — every tool.

``run_parallel`` and ``background_run`` are in no restricted profile: their nested actions would
step around it. A profile narrows what a turn may call; each tool's policy still applies (a write
that needs approval waits for one).

The settings are kept per session (``kv`` namespace ``heartbeat``): ``enabled: false`` stops
the heartbeat and keeps them, so ``set_heartbeat(enabled=true)`` resumes it as it was; a call
changes only the settings it names (the rest come from the kept ones, else the agent's
``[heartbeat]`` defaults). They end with the session.

Where it runs: a **dedicated** session (default; ``<session>.heartbeat``, a session the runtime
derives from the parent: in the parent's owner's namespace, created only by the runtime,
counted against the owner's session limit, deleted with the parent; each heartbeat starts from a
clean context) or the **main** session (the heartbeat sees
the conversation). Outside ``active_hours`` no turn runs (the occurrence is recorded as
``outside_active_hours``). A short answer (under ``suppress_threshold`` characters) with no tool
call is suppressed: kept in the run record and the server log, not streamed, not in the
transcript. On error: ``skip`` (wait for the next one), ``retry_once`` (run it again at once,
once), ``disable`` (stop the heartbeat, keeping its settings, emit ``heartbeat_disabled`` and
alert through ``alert_channel``, by default a notification in the parent session).
``heartbeat_view`` is what ``GET /sessions/{id}/heartbeat`` shows: the settings and the recent
runs (when, the state, whether it was suppressed, what it answered).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.scheduling.actor import AddJob, CancelJob
from turnstile.actors.scheduling.cronexpr import resolve_timezone
from turnstile.actors.scheduling.spec import HHMM, ActiveHours, Schedule, job_spec
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.sessions.ids import derived_key, is_derived, public_id
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument, NotFound
from turnstile.runtime.store import Store
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = [
    "HEARTBEAT_PROFILES",
    "KV_NAMESPACE",
    "SetHeartbeat",
    "disable_heartbeat",
    "heartbeat_view",
    "register_heartbeat_tools",
]

#: Where each session's heartbeat settings are kept (key: the session's key).
KV_NAMESPACE = "heartbeat"
#: Characters of a heartbeat's answer kept in its run record.
RESPONSE_CHARS = 2000

_LOOK_AND_REPORT = frozenset(
    {
        "echo",
        "clock.now",
        "filesystem.read",
        "filesystem.list",
        "http.get",
        "shell.read",
        "schedule_list",
        "schedule_status",
        "list_schedule",
        "schedule_check",
        "cancel_scheduled",
        "watch_list",
        "watch_status",
        "watch_history",
        "background_list",
        "background_status",
        "background_result",
        "send_notification",
    }
)
HEARTBEAT_PROFILES: dict[str, frozenset[str] | None] = {
    "heartbeat": _LOOK_AND_REPORT,
    "heartbeat_active": _LOOK_AND_REPORT
    | {
        "filesystem.write",
        "http.post",
        "http.download",
        "schedule_once",
        "schedule_cron",
        "schedule_cancel",
        "remember",
        "schedule_recall",
        "cron",
    },
    "full": None,
}


class SetHeartbeat(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``set_heartbeat``."""

    enabled: bool
    interval_minutes: Annotated[int, msgspec.Meta(ge=15, le=1440)] = 30
    checklist: Annotated[str, msgspec.Meta(max_length=4000)] = ""
    active_hours_start: HHMM | None = None
    active_hours_end: HHMM | None = None
    timezone: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    model_override: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    tool_profile: Literal["heartbeat", "heartbeat_active", "full"] = "heartbeat"
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=32_000)] = 4096
    suppress_threshold: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 300
    on_error: Literal["skip", "retry_once", "disable"] = "skip"
    session: Literal["dedicated", "main"] = "dedicated"
    #: Where ``on_error: disable`` sends its alert: a configured output channel.
    alert_channel: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "llm_notification"


def _builtin_defaults() -> dict[str, Any]:
    return {
        info.name: info.default
        for info in msgspec.structs.fields(SetHeartbeat)
        if not info.required
    }


def heartbeat_defaults(defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every setting's default: the built-in ones with the agent's ``[heartbeat]`` over them.

    Raises:
        InvalidArgument: a default is outside the setting's bounds (``field`` names it).
    """
    effective = _builtin_defaults()
    for name, value in (defaults or {}).items():
        if name not in effective:
            raise InvalidArgument(f"heartbeat.{name} is not a setting", field=f"heartbeat.{name}")
        try:
            msgspec.convert({"enabled": True, name: value}, SetHeartbeat)
        except msgspec.ValidationError as exc:
            raise InvalidArgument(f"heartbeat.{name}: {exc}", field=f"heartbeat.{name}") from None
        effective[name] = value
    return effective


def heartbeat_params(defaults: dict[str, Any] | None = None) -> type:
    """The arguments of ``set_heartbeat``: every setting but ``enabled`` may be left out
    (``UNSET``), so a call changes only what it names; the JSON schema shows each default.

    Raises:
        InvalidArgument: a default is outside the setting's bounds (``field`` names it).
    """
    effective = heartbeat_defaults(defaults)
    fields: list[tuple] = []
    for info in msgspec.structs.fields(SetHeartbeat):
        if info.required:
            fields.append((info.name, info.type))
            continue
        shown = msgspec.Meta(extra_json_schema={"default": effective[info.name]})
        fields.append((info.name, Annotated[info.type | msgspec.UnsetType, shown], msgspec.UNSET))
    return msgspec.defstruct(
        "SetHeartbeat", fields, kw_only=True, forbid_unknown_fields=True, bases=()
    )


def resolve_settings(args: Any, base: dict[str, Any]) -> SetHeartbeat:
    """The settings a ``set_heartbeat`` call asks for: what it names, ``base`` for the rest.

    Raises:
        InvalidArgument: the merged settings do not validate (``field`` names the setting).
    """
    merged: dict[str, Any] = {"enabled": args.enabled}
    for info in msgspec.structs.fields(SetHeartbeat):
        if info.required:
            continue
        given = getattr(args, info.name)
        merged[info.name] = base.get(info.name, info.default) if given is msgspec.UNSET else given
    try:
        return msgspec.convert(merged, SetHeartbeat)
    except msgspec.ValidationError as exc:
        raise InvalidArgument(f"kept heartbeat settings no longer valid: {exc}") from None


def _settings_of(settings: SetHeartbeat) -> dict[str, Any]:
    out = msgspec.structs.asdict(settings)
    del out["enabled"]
    return out


def _iso(when) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")


async def _jobs_of(store: Store, session_key: str, states: list[str] | None) -> list[Any]:
    """The heartbeat jobs of ``session_key`` (in it, or in its dedicated session)."""
    found = []
    targets = [session_key]
    try:
        targets.append(derived_key(session_key, SUFFIX))
    except ValueError:
        pass  # too long a name for a dedicated session: only the main one can hold it
    for target in targets:
        for job in await JobStore(store).list_jobs(session_id=target, states=states):
            if job.kind == "heartbeat" and job_spec(job).heartbeat_of == session_key:
                found.append(job)
    return found


async def disable_heartbeat(store: Store, scheduler: ActorRef, job_id: str) -> str | None:
    """Stop the heartbeat job ``job_id`` and mark its kept settings disabled (``on_error:
    disable``); returns the key of the session whose heartbeat it was, if known."""
    await scheduler.ask(CancelJob(job_id=job_id))
    try:
        job = await JobStore(store).get_job(job_id)
    except NotFound:
        return None
    owner_key = job_spec(job).heartbeat_of
    if not owner_key:
        return None
    kept = await store.kv_get(KV_NAMESPACE, owner_key)
    if kept is not None:
        await store.kv_put(KV_NAMESPACE, [(owner_key, {**kept, "enabled": False}, None)])
    return owner_key


async def heartbeat_view(store: Store, session_key: str, runs: int = 50) -> dict[str, Any]:
    """What ``GET /sessions/{id}/heartbeat`` answers: the kept settings (or None), where the
    heartbeat runs and when next, and its latest ``runs`` runs, newest first."""
    kept = await store.kv_get(KV_NAMESPACE, session_key)
    jobs = await _jobs_of(store, session_key, None)
    active = [j for j in jobs if j.state in ("active", "paused")]
    heartbeat: dict[str, Any] | None = None
    if kept is not None:
        heartbeat = {"enabled": bool(kept.get("enabled")), **kept.get("settings", {})}
        if active:
            heartbeat["heartbeat_id"] = active[0].id
            heartbeat["session_id"] = active[0].session_id
            heartbeat["next_run_at"] = _iso(active[0].next_fire_at)
    records = []
    for job in jobs:
        records.extend(await JobStore(store).list_runs(job.id, limit=runs))
    records.sort(key=lambda r: (r.scheduled_for, r.id), reverse=True)
    return {
        "heartbeat": heartbeat,
        "runs": [
            {
                "run_id": run.id,
                "heartbeat_id": run.job_id,
                "scheduled_for": _iso(run.scheduled_for),
                "state": run.state,
                "suppressed": bool((run.detail or {}).get("suppressed")),
                "response": (run.detail or {}).get("response"),
                "error": (run.detail or {}).get("error"),
            }
            for run in records[:runs]
        ],
    }


SUFFIX = ".heartbeat"

#: ``async (parent key, suffix) -> derived key``: creates the derived session if need be
#: (``actors.sessions.directory.create_derived_session``, which applies the owner's session limit).
DeriveSession = Callable[[str, str], Awaitable[str]]


def register_heartbeat_tools(
    registry: ToolRegistry,
    scheduler: ActorRef,
    store: Store,
    clock: Clock,
    derive_session: DeriveSession,
    defaults: dict[str, Any] | None = None,
    check_channel: Callable[[str, dict[str, Any]], None] | None = None,
) -> None:
    """Register ``set_heartbeat``, bound to ``scheduler``; ``defaults`` are the agent's
    ``[heartbeat]`` settings, used for whatever a call leaves out; ``derive_session`` makes the
    dedicated heartbeat session; ``check_channel`` (the notifier's) vets ``alert_channel``."""
    effective_defaults = heartbeat_defaults(defaults)

    async def set_heartbeat(call: ToolCall, args) -> dict[str, Any]:
        if is_derived(call.session_id):
            raise InvalidArgument("a heartbeat session cannot have a heartbeat of its own")
        kept = await store.kv_get(KV_NAMESPACE, call.session_id)
        base = {**effective_defaults, **((kept or {}).get("settings") or {})}
        settings = resolve_settings(args, base)
        window: ActiveHours | None = None
        if (settings.active_hours_start is None) != (settings.active_hours_end is None):
            raise InvalidArgument(
                "give both active_hours_start and active_hours_end, or neither",
                field="active_hours_end"
                if settings.active_hours_end is None
                else "active_hours_start",
            )
        tz = settings.timezone or "UTC"
        resolve_timezone(tz)  # raises InvalidArgument naming the timezone
        if check_channel is not None:
            try:
                check_channel(settings.alert_channel, {})
            except InvalidArgument as exc:
                raise InvalidArgument(str(exc), field="alert_channel") from None
        start, end = settings.active_hours_start, settings.active_hours_end
        if start is not None and end is not None:  # both or neither (checked above)
            window = ActiveHours(start=start, end=end, timezone=tz)
        for job in await _jobs_of(store, call.session_id, ["active", "paused"]):
            await scheduler.ask(CancelJob(job_id=job.id))
        kept_settings = _settings_of(settings)
        await store.kv_put(
            KV_NAMESPACE,
            [(call.session_id, {"enabled": settings.enabled, "settings": kept_settings}, None)],
        )
        if not settings.enabled:
            return {
                "enabled": False,
                "session_id": public_id(call.session_id),
                "kept": kept_settings,
            }
        target = call.session_id
        if settings.session == "dedicated":
            target = await derive_session(call.session_id, SUFFIX)
        config = {
            "checklist": settings.checklist,
            "model_override": settings.model_override,
            "tool_profile": settings.tool_profile,
            "max_tokens": settings.max_tokens,
            "suppress_threshold": settings.suppress_threshold,
            "on_error": settings.on_error,
            "dedicated": settings.session == "dedicated",
            "alert_channel": settings.alert_channel,
            "heartbeat_of": call.session_id,
        }
        understood = f"every {settings.interval_minutes} minutes"
        if window:
            understood += f", {window.start}–{window.end} {tz}"
        job = await scheduler.ask(
            AddJob(
                session_id=target,
                kind="heartbeat",
                schedule=Schedule(type="interval", interval_seconds=settings.interval_minutes * 60),
                deliver={
                    "source": "heartbeat",
                    "action_type": "heartbeat",
                    "prompt": "Run your heartbeat checklist.",
                    "heartbeat": config,
                },
                label="heartbeat",
                misfire="skip",  # a heartbeat that is late is simply the next one
                heartbeat_of=call.session_id,
                active_hours=window,
                understood=understood,
            )
        )
        return {
            "heartbeat_id": job.id,
            "enabled": True,
            "session_id": public_id(target),
            "interval_minutes": settings.interval_minutes,
            "next_run_at": job.next_fire_at.isoformat().replace("+00:00", "Z"),
            "active_hours": None if window is None else msgspec.to_builtins(window),
            "understood": understood,
            **{k: v for k, v in config.items() if k not in ("checklist", "heartbeat_of")},
        }

    registry.register(
        "set_heartbeat",
        heartbeat_params(defaults),
        set_heartbeat,
        "Configure this session's recurring heartbeat: interval, checklist, active hours, "
        "model, tool profile, suppression and error policy. enabled=false pauses it and keeps "
        "the settings; a later call changes only the settings it names.",
    )
