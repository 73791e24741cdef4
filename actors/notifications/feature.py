"""The notifications feature: the notifier (channels, buffering), the ``notify`` tool, and
what it gives other features: ``notify`` (watchers' and scheduled turns' output for another
channel) and ``check_channel`` (tools that name a channel validate it up front).

A session's buffered notifications are delivered when a client attaches and discarded when the
session is deleted; expired buffers are purged hourly. ``GET /sessions/{id}/notifications``
shows what waits without delivering it (``routes.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgspec
import trio

from turnstile.actors.feature import NodeContext
from turnstile.actors.notifications.actor import ChannelConfig, Notifier, NotifierConfig
from turnstile.actors.notifications.config import UserResolver
from turnstile.actors.notifications.routes import notification_routes
from turnstile.actors.notifications.settings import ChannelSettings, NotificationsConfig
from turnstile.actors.notifications.tools import guarded_webhook_post, register_notify_tools
from turnstile.runtime.gateway.routes import HttpRoute
from turnstile.runtime.store import Store
from turnstile.tools.netguard import NetPolicy

__all__ = ["NotificationsFeature", "make_notifier", "purge_expired"]

log = logging.getLogger("turnstile.notifications")


class NotificationsFeature:
    """``[notifications]`` and ``[channels.*]``. The features that take ``notify`` or
    ``check_channel`` in their ``start`` start ``after`` it."""

    name = "notifications"
    needs: tuple[str, ...] = ("sessions",)
    after: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.notifier: Notifier | None = None

    async def start(self, node: NodeContext) -> None:
        self.notifier = notifier = make_notifier(node)
        register_notify_tools(node.tools, notifier)
        node.notify = notifier.notify
        node.check_channel = notifier.check_channel
        node.hooks.on_attach.append(notifier.deliver_buffered)
        # an attach through a node that does not hold the session: delivered once it does,
        # within a few leases (the holder may have died: its lease then expires)
        notifier.spawn = node.start_soon
        notifier.elsewhere_seconds = 3 * node.config.node.lease_seconds
        node.hooks.on_session_end.append(notifier.discard_buffered)

    async def open(self, node: NodeContext) -> None:
        """Purge expired buffers now and then."""
        node.start_soon(purge_expired, node.store, name="notification buffers purge")

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        if self.notifier is None:
            return ()
        return notification_routes(node, self.notifier)


def make_notifier(node: NodeContext) -> Notifier:
    """The notifier with the node's ``[channels.*]`` and ``[notifications]``; webhooks go
    through the SSRF guard (``[modules.http]``'s allowed hosts and networks)."""

    def listed(struct: msgspec.Struct) -> dict[str, Any]:
        return {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in msgspec.structs.asdict(struct).items()
        }

    channels: dict[str, ChannelSettings] = node.section("channels", dict)
    settings = node.section("notifications", NotificationsConfig)
    http = node.config.modules.http
    return Notifier(
        node.store,
        node.clock,
        node.ask_session,
        NotifierConfig(
            channels=tuple(
                ChannelConfig(name=name, **listed(channel)) for name, channel in channels.items()
            ),
            **msgspec.structs.asdict(settings),
        ),
        webhook_post=guarded_webhook_post(
            NetPolicy(tuple(http.allowed_hosts), tuple(http.allowed_networks))
        ),
        tell_session=node.tell_session if node.placement is not None else None,
        user_resolver=users_email(node),
    )


def users_email(node: NodeContext) -> UserResolver:
    """The ``users`` resolver of email channels: a user's ``[[users]]`` ``email``."""
    addresses = {user.name: user.email for user in node.config.users if user.email}

    async def resolve(user: str) -> str | None:
        return addresses.get(user)

    return resolve


async def purge_expired(store: Store, every: float = 3600.0) -> None:
    """Delete expired key-value rows (notification buffers) now and then."""
    while True:
        await trio.sleep(every)
        try:
            await store.kv_purge_expired()
        except Exception:
            log.warning("purging expired rows failed", exc_info=True)
