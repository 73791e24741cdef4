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
from turnstile.actors.notifications.events import Notification
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute

__all__ = ["BufferedNotifications", "notification_routes"]


class BufferedNotifications(msgspec.Struct):
    """``GET /sessions/{id}/notifications``: what waits for a client to attach.

    Attributes:
        notifications: oldest first, each as the ``notification`` event it becomes.
        dropped: how many overflowed the buffer since it was last delivered.
    """

    notifications: list[Notification]
    dropped: int


def notification_routes(node: NodeContext, notifier: Notifier) -> list[HttpRoute]:
    """The endpoint over ``notifier``'s buffers."""

    async def buffered(request: ApiRequest) -> Any:
        key = await node.directory.owned_key(request.user, request.path["id"])
        waiting, dropped = await notifier.buffered(key)
        return BufferedNotifications(notifications=waiting, dropped=dropped)

    return [
        HttpRoute(
            "GET",
            "/sessions/{id}/notifications",
            buffered,
            summary="A session's buffered notifications (read without delivering them)",
            response=BufferedNotifications,
            errors=(404,),
        )
    ]
