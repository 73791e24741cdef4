"""Heartbeats: recurring agent turns that check a checklist and stay quiet when all is well.

``set_heartbeat`` (as in the scheduling-heartbeats reference) configures one heartbeat per
session: every ``interval_minutes`` (15–1440) the scheduler delivers a ``heartbeat`` input.
Its turn gets the heartbeat system-prompt segment with the checklist, an optional model
override and token cap, and a restricted tool profile:

* ``heartbeat`` (default) — read-only: ``echo``, ``clock.now``, the listing and status tools,
  ``schedule_check`` and ``cancel_scheduled``;
* ``heartbeat_active`` — the above plus the tools that schedule work;
* ``full`` — every tool.

Where it runs: a **dedicated** session (default; ``<session>.heartbeat``, a session the runtime
derives from the parent: in the parent's owner's namespace, created only by the runtime,
counted against the owner's session limit, deleted with the parent; each heartbeat starts from a
clean context) or the **main** session (the heartbeat sees
the conversation). Outside ``active_hours`` no turn runs (the occurrence is recorded as
``outside_active_hours``). A short answer (under ``suppress_threshold`` characters) with no tool
call is suppressed: kept in the run record and the server log, not streamed, not in the
transcript. On error: ``skip`` (wait for the next one), ``retry_once`` (run it again at once,
once), ``disable`` (cancel the heartbeat and emit ``heartbeat_disabled``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import msgspec

from actors.scheduler import AddJob, CancelJob, Schedule
from actors.session_ids import derived_key, is_derived, public_id
from runtime.actor import ActorRef
from runtime.clock import Clock
from runtime.cronexpr import resolve_timezone
from runtime.errors import InvalidArgument
from runtime.store import Store
from tools.registry import ToolCall, ToolRegistry

__all__ = ["HEARTBEAT_PROFILES", "register_heartbeat_tools", "SetHeartbeat"]

_READ_ONLY = frozenset(
    {
        "echo",
        "clock.now",
        "schedule_list",
        "schedule_status",
        "list_schedule",
        "schedule_check",
        "cancel_scheduled",
    }
)
HEARTBEAT_PROFILES: dict[str, frozenset[str] | None] = {
    "heartbeat": _READ_ONLY,
    "heartbeat_active": _READ_ONLY
    | {"schedule_once", "schedule_cron", "schedule_cancel", "remember", "schedule_recall", "cron"},
    "full": None,
}

HHMM = Annotated[str, msgspec.Meta(pattern=r"^([01]\d|2[0-3]):[0-5]\d$")]


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


def heartbeat_params(defaults: dict[str, Any] | None = None) -> type[SetHeartbeat]:
    """``SetHeartbeat`` with the agent's configured defaults (its JSON schema shows them).

    Raises:
        InvalidArgument: a default is outside the setting's bounds (``field`` names it).
    """
    if not defaults:
        return SetHeartbeat
    fields = []
    for info in msgspec.structs.fields(SetHeartbeat):
        if info.name in defaults and info.name != "enabled":
            try:
                msgspec.convert({"enabled": True, info.name: defaults[info.name]}, SetHeartbeat)
            except msgspec.ValidationError as exc:
                raise InvalidArgument(
                    f"heartbeat.{info.name}: {exc}", field=f"heartbeat.{info.name}"
                ) from None
            fields.append((info.name, info.type, defaults[info.name]))
        elif info.required:
            fields.append((info.name, info.type))
        else:
            fields.append((info.name, info.type, info.default))
    return msgspec.defstruct(
        "SetHeartbeat", fields, kw_only=True, forbid_unknown_fields=True, bases=()
    )


SUFFIX = ".heartbeat"

#: ``async (parent key, suffix) -> derived key``: creates the derived session if need be
#: (``actors.directory.create_derived_session``, which applies the owner's session limit).
DeriveSession = Callable[[str, str], Awaitable[str]]


def register_heartbeat_tools(
    registry: ToolRegistry,
    scheduler: ActorRef,
    store: Store,
    clock: Clock,
    derive_session: DeriveSession,
    defaults: dict[str, Any] | None = None,
) -> None:
    """Register ``set_heartbeat``, bound to ``scheduler``; ``defaults`` are the agent's
    ``[heartbeat]`` settings, used for whatever a call leaves out; ``derive_session`` makes the
    dedicated heartbeat session."""

    async def current(session_id: str) -> list[Any]:
        found = []
        targets = [session_id]
        try:
            targets.append(derived_key(session_id, SUFFIX))
        except ValueError:
            pass  # too long a name for a dedicated session: only the main one can hold it
        for target in targets:
            for job in await store.list_jobs(session_id=target, states=["active", "paused"]):
                if job.kind == "heartbeat" and job.spec.get("heartbeat_of") == session_id:
                    found.append(job)
        return found

    async def set_heartbeat(call: ToolCall, args) -> dict[str, Any]:
        if is_derived(call.session_id):
            raise InvalidArgument("a heartbeat session cannot have a heartbeat of its own")
        window = None
        if (args.active_hours_start is None) != (args.active_hours_end is None):
            raise InvalidArgument(
                "give both active_hours_start and active_hours_end, or neither",
                field="active_hours_end" if args.active_hours_end is None else "active_hours_start",
            )
        tz = args.timezone or "UTC"
        resolve_timezone(tz)  # raises InvalidArgument naming the timezone
        if args.active_hours_start is not None:
            window = {
                "start": args.active_hours_start,
                "end": args.active_hours_end,
                "timezone": tz,
            }
        for job in await current(call.session_id):
            await scheduler.ask(CancelJob(job_id=job.id))
        if not args.enabled:
            return {"enabled": False, "session_id": public_id(call.session_id)}
        target = call.session_id
        if args.session == "dedicated":
            target = await derive_session(call.session_id, SUFFIX)
        config = {
            "checklist": args.checklist,
            "model_override": args.model_override,
            "tool_profile": args.tool_profile,
            "max_tokens": args.max_tokens,
            "suppress_threshold": args.suppress_threshold,
            "on_error": args.on_error,
            "dedicated": args.session == "dedicated",
        }
        understood = f"every {args.interval_minutes} minutes"
        if window:
            understood += f", {window['start']}–{window['end']} {tz}"
        job = await scheduler.ask(
            AddJob(
                session_id=target,
                kind="heartbeat",
                schedule=Schedule(type="interval", interval_seconds=args.interval_minutes * 60),
                deliver={
                    "source": "heartbeat",
                    "action_type": "heartbeat",
                    "prompt": "Run your heartbeat checklist.",
                    "heartbeat": config,
                },
                label="heartbeat",
                misfire="skip",  # a heartbeat that is late is simply the next one
                extra={
                    "heartbeat_of": call.session_id,
                    "active_hours": window,
                    "understood": understood,
                },
            )
        )
        return {
            "heartbeat_id": job.id,
            "enabled": True,
            "session_id": public_id(target),
            "interval_minutes": args.interval_minutes,
            "next_run_at": job.next_fire_at.isoformat().replace("+00:00", "Z"),
            "active_hours": window,
            "understood": understood,
            **{k: v for k, v in config.items() if k != "checklist"},
        }

    registry.register(
        "set_heartbeat",
        heartbeat_params(defaults),
        set_heartbeat,
        "Configure this session's recurring heartbeat: interval, checklist, active hours, "
        "model, tool profile, suppression and error policy.",
    )
