"""The notifications feature's HTTP endpoint: a session's buffered notifications.

``GET /sessions/{id}/notifications`` answers ``{"notifications": […], "dropped": n}``: what
waits in the session's buffer for a client to attach (oldest first, each as the
``notification`` event it becomes, with ``buffered: true``) and how many overflowed it. Reading
delivers nothing and forgets nothing: the next attach still gets them. Another user's session
is ``404`` like one that does not exist.
"""

from __future__ import annotations

from typing import Any

import msgspec

from turnstile.actors.feature import NodeContext
from turnstile.actors.notifications.actor import Notifier
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute

__all__ = ["notification_routes"]


def notification_routes(node: NodeContext, notifier: Notifier) -> list[HttpRoute]:
    """The endpoint over ``notifier``'s buffers."""

    async def buffered(request: ApiRequest) -> Any:
        key = await node.directory.owned_key(request.user, request.path["id"])
        waiting, dropped = await notifier.buffered(key)
        return {"notifications": [msgspec.to_builtins(n) for n in waiting], "dropped": dropped}

    return [HttpRoute("GET", "/sessions/{id}/notifications", buffered)]
