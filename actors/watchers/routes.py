"""The watchers feature's HTTP endpoints: start and list a session's watchers; read, stop,
pause and resume one watcher. Another user's watcher is ``404`` like one that does not exist."""

from __future__ import annotations

from typing import Any

from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.ids import public_view
from turnstile.actors.watchers.tools import (
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


def watcher_routes(node: NodeContext, watchers: ActorRef) -> list[HttpRoute]:
    """The endpoints over the watcher actor ``watchers``."""

    async def create(request: ApiRequest) -> Any:
        spec = await request.body(_ANY)
        if not isinstance(spec, dict):
            raise DecodeError("expected a JSON object")
        key = await node.directory.owned_key(request.user, request.path["id"])
        return public_view(await start_watcher(watchers, node.tools, key, request.user, spec))

    async def listed(request: ApiRequest) -> Any:
        key = await node.directory.owned_key(request.user, request.path["id"])
        return public_view(await list_watchers(watchers, session_id=key, owner=request.user))

    def action(name: str):
        act = _ACTIONS[name]

        async def endpoint(request: ApiRequest) -> Any:
            return public_view(await act(watchers, request.path["id"], request.user))

        return endpoint

    return [
        HttpRoute("POST", "/sessions/{id}/watchers", create, status=201),
        HttpRoute("GET", "/sessions/{id}/watchers", listed),
        HttpRoute("GET", "/watchers/{id}", action("get")),
        HttpRoute("DELETE", "/watchers/{id}", action("stop")),
        HttpRoute("POST", "/watchers/{id}/pause", action("pause")),
        HttpRoute("POST", "/watchers/{id}/resume", action("resume")),
    ]
