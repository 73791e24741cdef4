"""Watcher tools — ``watch_start``, ``watch_stop``, ``watch_pause``, ``watch_resume``,
``watch_status``, ``watch_list``, ``watch_history`` (execution-primitives reference,
"Watchers") — and the same operations as plain functions for the HTTP API.

The tools drive the watcher actor (``actor.py``) and are scoped to the calling session:
another session's watcher is "not found". The HTTP functions are scoped to the owner (another
user's watcher is "not found", so ids cannot be probed). Both go through the same functions
below, so validation and responses are identical.

Security: a watcher runs its tool unattended, so only ``AUTO`` tools can be watched. ``BLOCK``
and ``APPROVE`` tools are refused at start with ``UnwatchableTool`` (code
``unwatchable_tool``, naming the tool and its policy); and ``watch_runner`` re-checks the policy
on every check, so a tool whose policy becomes APPROVE later fails its checks (an error, which
``on_error`` reports) instead of asking a person for approval every few seconds. The execution
primitives and the watch tools themselves cannot be watched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.actors.watchers.actor import (
    DEFAULT_INTERVAL,
    HISTORY_SIZE,
    MAX_BATCH_SIZE,
    MAX_COOLDOWN_SECONDS,
    MAX_DEBOUNCE,
    MAX_INTERVAL,
    MAX_LABEL_CHARS,
    MIN_INTERVAL,
    GetWatcher,
    ListWatchers,
    PauseWatcher,
    ResumeWatcher,
    StartWatcher,
    StopWatcher,
    WatcherHistory,
)
from turnstile.actors.watchers.cluster import settled
from turnstile.actors.watchers.safeexpr import MAX_EXPRESSION_CHARS
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.codec import Codec
from turnstile.runtime.errors import DecodeError, InvalidArgument
from turnstile.tools.policy import Policy
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = [
    "WATCH_TOOLS",
    "UnwatchableTool",
    "WatchStart",
    "NotifyConfig",
    "register_watch_tools",
    "watch_runner",
    "start_watcher",
    "list_watchers",
    "get_watcher",
    "stop_watcher",
    "pause_watcher",
    "resume_watcher",
    "watcher_history",
]

WATCH_TOOLS = frozenset(
    {
        "watch_start",
        "watch_stop",
        "watch_pause",
        "watch_resume",
        "watch_status",
        "watch_list",
        "watch_history",
    }
)

ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
WatcherId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class UnwatchableTool(InvalidArgument):
    """The tool's policy does not allow unattended use (BLOCK or APPROVE).

    Attributes:
        tool: the tool's name.
        policy: its policy.
    """

    code = "unwatchable_tool"

    def __init__(self, tool: str, policy: Policy) -> None:
        super().__init__(
            f"{tool} cannot be watched: its policy is {policy.value} (watchers run "
            "unattended, so only AUTO tools can be watched)",
            field="tool",
        )
        self.tool = tool
        self.policy = policy


#: ``async (session_key) -> channel``: where a watcher's escalations go when none is named.
DefaultChannel = Callable[[str], Awaitable[str]]


class NotifyConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Options of the escalation strategy."""

    expression: Annotated[str, msgspec.Meta(max_length=MAX_EXPRESSION_CHARS)] | None = None
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_BATCH_SIZE)] | None = None
    debounce: Annotated[int, msgspec.Meta(ge=1, le=MAX_DEBOUNCE)] | None = None
    cooldown_seconds: Annotated[float, msgspec.Meta(ge=0, le=MAX_COOLDOWN_SECONDS)] | None = None
    #: Where escalations go: ``llm_notification`` (into the session) or a configured channel.
    output_channel: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    output_config: dict[str, Any] | None = None


class WatchStart(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of ``watch_start`` (and the body of ``POST /sessions/{id}/watchers``).

    ``tool`` names the tool to check; ``name`` is accepted for it too (the reference's
    spelling). Exactly one of them must be given.
    """

    tool: ToolName | None = None
    name: ToolName | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    interval: Annotated[float, msgspec.Meta(ge=MIN_INTERVAL, le=MAX_INTERVAL)] = DEFAULT_INTERVAL
    label: Annotated[str, msgspec.Meta(max_length=MAX_LABEL_CHARS)] = ""
    notify_when: Literal["on_change", "on_error", "on_threshold", "summary", "always"] = "on_change"
    notify_config: NotifyConfig = msgspec.field(default_factory=NotifyConfig)


class WatcherRef(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments naming one watcher."""

    watcher_id: WatcherId


class HistoryArgs(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of ``watch_history``."""

    watcher_id: WatcherId
    last_n: Annotated[int, msgspec.Meta(ge=1, le=HISTORY_SIZE)] = 10


class NoArgs(msgspec.Struct, forbid_unknown_fields=True):
    """No arguments."""


_start_codec = Codec(WatchStart)


def watch_runner(registry: ToolRegistry):
    """``run_tool`` for ``WatcherActor``: the registry's call, refusing non-AUTO tools.

    A tool whose policy became BLOCK or APPROVE after the watcher started fails its checks with
    ``unwatchable_tool`` rather than asking for approval on every check.
    """

    async def run(session_id: str, owner: str, tool: str, params: dict[str, Any]) -> ToolResult:
        try:
            policy = registry.policy_of(tool)
        except KeyError:
            policy = Policy.AUTO  # unknown tools: the registry answers unknown_tool
        if policy is not Policy.AUTO:
            exc = UnwatchableTool(tool, policy)
            return ToolResult(ok=False, error={"code": exc.code, "message": str(exc)})
        return await registry.call(session_id, owner, tool, params)

    return run


def _watchable(registry: ToolRegistry, tool: str) -> None:
    if tool in WATCH_TOOLS or tool in registry.composite:
        raise InvalidArgument(f"{tool} cannot be watched (it is an execution primitive)", "tool")
    try:
        policy = registry.policy_of(tool)
    except KeyError:
        raise InvalidArgument(f"no tool named {tool!r}", field="tool") from None
    if policy is not Policy.AUTO:
        raise UnwatchableTool(tool, policy)


async def _start(
    ref: ActorRef,
    registry: ToolRegistry,
    session_id: str,
    owner: str,
    args: WatchStart,
    default_channel: DefaultChannel | None = None,
) -> dict[str, Any]:
    if not session_id:
        raise InvalidArgument(
            "a watcher belongs to a session: call watch_start from a session's turn",
            field="session_id",
        )
    given = [t for t in (args.tool, args.name) if t is not None]
    if len(given) != 1:
        raise InvalidArgument("give the tool to watch as tool (or name), once", field="tool")
    tool = given[0]
    _watchable(registry, tool)
    _check_params(registry, tool, args.params)
    notify_config = msgspec.to_builtins(args.notify_config)
    if args.notify_config.output_channel is None and default_channel is not None:
        # escalations go to the session's default channel (``[execution] default_channel``)
        notify_config["output_channel"] = await default_channel(session_id)
    return await ref.ask(
        StartWatcher(
            session_id=session_id,
            owner=owner,
            tool=tool,
            params=args.params,
            interval=args.interval,
            label=args.label,
            notify_when=args.notify_when,
            notify_config=notify_config,
        )
    )


def _check_params(registry: ToolRegistry, tool: str, params: dict[str, Any]) -> None:
    """Refuse params the tool would refuse on every check (they are validated once, here)."""
    try:
        registry.validate(tool, params)
    except KeyError:
        return  # unknown tools are refused by _watchable
    except DecodeError as exc:
        raise InvalidArgument(f"params do not fit {tool}: {exc}", field="params") from None


# -- the HTTP functions ------------------------------------------------------------------------


async def start_watcher(
    ref: ActorRef,
    registry: ToolRegistry,
    session_id: str,
    owner: str,
    spec: dict[str, Any],
    default_channel: DefaultChannel | None = None,
) -> dict[str, Any]:
    """``POST /sessions/{session_id}/watchers``: start a watcher; answers the start view.

    The caller must already have checked that ``session_id`` belongs to ``owner``.
    ``default_channel(session_id)``: where escalations go when ``notify_config`` names no
    ``output_channel`` (``NodeContext.output_channel``); without it, into the session.

    Raises:
        DecodeError: ``spec`` is malformed (``field`` names the culprit).
        InvalidArgument / UnwatchableTool / ExprError / LimitExceeded: refused.
    """
    args = _start_codec.convert(spec)
    return await _start(ref, registry, session_id, owner, args, default_channel)


async def list_watchers(
    ref: ActorRef, *, session_id: str | None = None, owner: str | None = None
) -> dict[str, Any]:
    """``GET /sessions/{session_id}/watchers`` (pass both) or an owner's watchers (``owner``)."""
    views = await ref.ask(ListWatchers(session_id=session_id, owner=owner))
    running = sum(1 for v in views if v["status"] == "running")
    return {
        "watchers": views,
        "total": len(views),
        "running": running,
        "paused": len(views) - running,
    }


async def get_watcher(
    ref: ActorRef,
    watcher_id: str,
    owner: str | None = None,
    *,
    session_id: str | None = None,
    history: int = HISTORY_SIZE,
) -> dict[str, Any]:
    """``GET /watchers/{watcher_id}``: status, configuration and the last ``history`` checks.

    Raises:
        NotFound: no such watcher, or not ``owner``'s (or not ``session_id``'s).
    """
    return await ref.ask(
        GetWatcher(watcher_id=watcher_id, owner=owner, session_id=session_id, history=history)
    )


async def stop_watcher(
    ref: ActorRef, watcher_id: str, owner: str | None = None, *, session_id: str | None = None
) -> dict[str, Any]:
    """``DELETE /watchers/{watcher_id}``: stop and forget it (history too)."""
    view = await settled(
        await ref.ask(StopWatcher(watcher_id=watcher_id, owner=owner, session_id=session_id))
    )
    return {**view, "message": f"Watcher {watcher_id} stopped after {view['check_count']} checks."}


async def pause_watcher(
    ref: ActorRef, watcher_id: str, owner: str | None = None, *, session_id: str | None = None
) -> dict[str, Any]:
    """``POST /watchers/{watcher_id}/pause``: no checks until resumed (history kept)."""
    return await settled(
        await ref.ask(PauseWatcher(watcher_id=watcher_id, owner=owner, session_id=session_id))
    )


async def resume_watcher(
    ref: ActorRef, watcher_id: str, owner: str | None = None, *, session_id: str | None = None
) -> dict[str, Any]:
    """``POST /watchers/{watcher_id}/resume``: checks again, the next one an interval from now."""
    return await settled(
        await ref.ask(ResumeWatcher(watcher_id=watcher_id, owner=owner, session_id=session_id))
    )


async def watcher_history(
    ref: ActorRef,
    watcher_id: str,
    last_n: int = 10,
    owner: str | None = None,
    *,
    session_id: str | None = None,
) -> dict[str, Any]:
    """The last ``last_n`` (1–100) checks, oldest first."""
    return await ref.ask(
        WatcherHistory(watcher_id=watcher_id, owner=owner, session_id=session_id, last_n=last_n)
    )


# -- the tools ---------------------------------------------------------------------------------


def register_watch_tools(
    registry: ToolRegistry, watcher_ref: ActorRef, default_channel: DefaultChannel | None = None
) -> None:
    """Register the seven ``watch_*`` tools, driving ``watcher_ref``; ``default_channel`` as
    for :func:`start_watcher`."""

    async def watch_start(call: ToolCall, args: WatchStart) -> dict[str, Any]:
        return await _start(
            watcher_ref, registry, call.session_id, call.owner, args, default_channel
        )

    async def watch_stop(call: ToolCall, args: WatcherRef) -> dict[str, Any]:
        return await stop_watcher(watcher_ref, args.watcher_id, session_id=call.session_id)

    async def watch_pause(call: ToolCall, args: WatcherRef) -> dict[str, Any]:
        return await pause_watcher(watcher_ref, args.watcher_id, session_id=call.session_id)

    async def watch_resume(call: ToolCall, args: WatcherRef) -> dict[str, Any]:
        return await resume_watcher(watcher_ref, args.watcher_id, session_id=call.session_id)

    async def watch_status(call: ToolCall, args: WatcherRef) -> dict[str, Any]:
        return await get_watcher(
            watcher_ref, args.watcher_id, session_id=call.session_id, history=5
        )

    async def watch_list(call: ToolCall, args: NoArgs) -> dict[str, Any]:
        return await list_watchers(watcher_ref, session_id=call.session_id)

    async def watch_history(call: ToolCall, args: HistoryArgs) -> dict[str, Any]:
        return await watcher_history(
            watcher_ref, args.watcher_id, args.last_n, session_id=call.session_id
        )

    registry.register(
        "watch_start",
        WatchStart,
        watch_start,
        "Watch a tool: run it every `interval` seconds (5-3600) in the background and get "
        "notified only when it matters (notify_when: on_change, on_error, on_threshold with "
        "notify_config.expression, summary with notify_config.batch_size, always; "
        "notify_config.debounce and cooldown_seconds reduce noise). Only AUTO tools.",
    )
    registry.register(
        "watch_stop", WatcherRef, watch_stop, "Stop a watcher (history is discarded)."
    )
    registry.register(
        "watch_pause", WatcherRef, watch_pause, "Pause a watcher (no checks; history is kept)."
    )
    registry.register("watch_resume", WatcherRef, watch_resume, "Resume a paused watcher.")
    registry.register(
        "watch_status",
        WatcherRef,
        watch_status,
        "A watcher's counts, last result, recent history and configuration.",
    )
    registry.register("watch_list", NoArgs, watch_list, "This session's watchers, running first.")
    registry.register(
        "watch_history",
        HistoryArgs,
        watch_history,
        "A watcher's last N checks (1-100, default 10), oldest first.",
    )
