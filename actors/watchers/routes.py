"""The watchers feature's HTTP endpoints: list the caller's watchers (all, or a session's),
start one in a session; read, stop, pause and resume one watcher. Another user's watcher is
``404`` like one that does not exist. Each route describes its answers for the API document
(``/openapi.json``) with the Structs below."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.ids import public_view
from turnstile.actors.watchers.tools import (
    WatchStart,
    get_watcher,
    list_watchers,
    pause_watcher,
    resume_watcher,
    start_watcher,
    stop_watcher,
)
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.codec import MAX_JSON_DEPTH, Codec
from turnstile.runtime.errors import DecodeError
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute

__all__ = ["watcher_routes"]

_ANY = Codec(Any, max_depth=MAX_JSON_DEPTH)

_ACTIONS = {"get": get_watcher, "stop": stop_watcher, "pause": pause_watcher}
_ACTIONS["resume"] = resume_watcher


class WatcherStarted(msgspec.Struct):
    """A watcher just started (``watch_start``'s answer)."""

    watcher_id: str
    tool_name: str
    label: str
    status: str
    interval: float
    notify_when: str
    notify_config: dict[str, Any]
    hint: str


class WatcherSummary(msgspec.Struct, kw_only=True):
    """A watcher: what it checks, how often, and how it went.

    Attributes:
        status: ``running`` or ``paused`` (``stopped`` once stopped).
        interval: seconds between checks.
        consecutive_errors: failed checks in a row.
        last_check_at, next_check_at: ISO 8601, or null.
    """

    watcher_id: str
    session_id: str
    tool_name: str
    label: str
    status: str
    interval: float
    notify_when: str
    check_count: int
    notification_count: int
    consecutive_errors: int
    last_check_at: str | None
    next_check_at: str | None


class WatcherStopped(WatcherSummary, kw_only=True):
    """A watcher stopped and forgotten (its history too)."""

    message: str


class WatcherCheck(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One check: ``result`` when it succeeded, ``error`` when not."""

    check: int
    at: str | None
    ok: bool
    result: Any | UnsetType = UNSET
    error: Any | UnsetType = UNSET
    escalated: bool
    duration_ms: float


class WatcherStatus(WatcherSummary, kw_only=True):
    """``GET /watchers/{id}``: the watcher, its configuration and its recent checks."""

    params: dict[str, Any]
    notify_config: dict[str, Any]
    owner: str
    created_at: str | None
    current_interval: float
    error_count: int
    suppressed_count: int
    last_result: dict[str, Any] | None
    recent_history: list[WatcherCheck]


class WatcherList(msgspec.Struct):
    """Watchers, with how many run and how many are paused."""

    watchers: list[WatcherSummary]
    total: int
    running: int
    paused: int


_ANSWERS = {
    "get": WatcherStatus,
    "stop": WatcherStopped,
    "pause": WatcherSummary,
    "resume": WatcherSummary,
}


def watcher_routes(node: NodeContext, watchers: ActorRef) -> list[HttpRoute]:
    """The endpoints over the watcher actor ``watchers``."""

    async def create(request: ApiRequest) -> Any:
        spec = await request.body(_ANY)
        if not isinstance(spec, dict):
            raise DecodeError("expected a JSON object")
        key = await node.directory.owned_key(request.user, request.path["id"], fresh=True)
        started = await start_watcher(
            watchers, node.tools, key, request.user, spec, default_channel=node.output_channel
        )
        return msgspec.convert(public_view(started), WatcherStarted)

    async def listed(request: ApiRequest) -> Any:
        key = await node.directory.owned_key(request.user, request.path["id"])
        found = await list_watchers(watchers, session_id=key, owner=request.user)
        return msgspec.convert(public_view(found), WatcherList)

    async def every(request: ApiRequest) -> Any:
        found = await list_watchers(watchers, owner=request.user)
        return msgspec.convert(public_view(found), WatcherList)

    def action(name: str):
        act, answer = _ACTIONS[name], _ANSWERS[name]

        async def endpoint(request: ApiRequest) -> Any:
            view = await act(watchers, request.path["id"], request.user)
            return msgspec.convert(public_view(view), answer)

        return endpoint

    def watcher_route(method: str, path: str, name: str, summary: str) -> HttpRoute:
        return HttpRoute(
            method,
            path,
            action(name),
            summary=summary,
            response=_ANSWERS[name],
            errors=(404,),
        )

    return [
        HttpRoute(
            "GET",
            "/watchers",
            every,
            summary="Your watchers, every session's",
            response=WatcherList,
        ),
        HttpRoute(
            "POST",
            "/sessions/{id}/watchers",
            create,
            status=201,
            summary="Start a watcher in a session (as the watch_start tool)",
            body=WatchStart,
            response=WatcherStarted,
            errors=(404, 429),
            description="400 for a tool that cannot be watched (unknown, an execution "
            "primitive, or not AUTO) or params it refuses; 429 at the watchers limit.",
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/watchers",
            listed,
            summary="A session's watchers",
            response=WatcherList,
            errors=(404,),
        ),
        watcher_route("GET", "/watchers/{id}", "get", "A watcher with its recent checks"),
        watcher_route("DELETE", "/watchers/{id}", "stop", "Stop a watcher and forget it"),
        watcher_route("POST", "/watchers/{id}/pause", "pause", "Pause a watcher: no checks"),
        watcher_route("POST", "/watchers/{id}/resume", "resume", "Resume a paused watcher"),
    ]
