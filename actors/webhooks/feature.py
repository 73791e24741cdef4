"""The webhooks feature: events other systems send a node, delivered into sessions as turns
(``docs/github.md``).

It owns its tables (the ``webhooks`` migration set, ``schema.py``) and, when ``[webhooks]
enabled``, serves ``POST /webhooks/github`` (with a GitHub secret) and ``POST /webhooks/{name}``
(each declared hook with a secret) without a bearer token — the signature is their
authentication — plus the bindings and unrouted routes behind it; registers ``bind_source``,
``unbind_source`` and ``list_sources``; watches ``http.post`` for pull requests a session opens
(``ToolRegistry.observers``); ends a deleted session's bindings; and sweeps undelivered
deliveries once the node is open (``open``) and every ``redeliver_seconds`` after.

It is the writer of the sessions feature's ``webhook`` turn input (``inputs.WebhookEvent``),
through the sessions feature's own submission path (``Submit``).
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Sequence
from pathlib import Path

import trio

from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.kinds import PlainKind
from turnstile.actors.webhooks.inputs import WEBHOOK_SOURCE, WebhookEvent
from turnstile.actors.webhooks.routes import Receivers, SignedHook, webhook_routes
from turnstile.actors.webhooks.schema import WEBHOOKS
from turnstile.actors.webhooks.service import Ingress
from turnstile.actors.webhooks.settings import WebhooksConfig
from turnstile.actors.webhooks.spool import Replayer, Spool
from turnstile.actors.webhooks.template import RouteTemplate
from turnstile.actors.webhooks.tools import register_binding_tools
from turnstile.runtime.gateway.routes import HttpRoute

__all__ = ["WebhooksFeature"]

log = logging.getLogger("turnstile.webhooks")


class WebhooksFeature:
    """``[webhooks]``; uses the sessions feature's ``Submit`` and ``Publish``.

    Attributes:
        ingress: the service, once started (None before, or when disabled).
        github_secret: GitHub's secret (None: ``/webhooks/github`` is not served).
        hooks: the declared hooks that have a secret, by name.
    """

    name = "webhooks"
    needs: tuple[str, ...] = ("sessions",)
    after: tuple[str, ...] = ()
    migrations = [WEBHOOKS]

    def __init__(self) -> None:
        self.ingress: Ingress | None = None
        self.github_secret: bytes | None = None
        self.hooks: dict[str, SignedHook] = {}
        self.receivers: Receivers | None = None
        self.spool: Spool | None = None
        self.replayer: Replayer | None = None

    async def start(self, node: NodeContext) -> None:
        # Its inputs are read as its own even when ingress is off (rows stored earlier).
        node.hooks.input_kinds.register(PlainKind(WEBHOOK_SOURCE, WebhookEvent))
        config = node.section("webhooks", WebhooksConfig)
        if not config.enabled:
            return
        self.ingress = ingress = Ingress(
            node.store, node.clock, node.metrics, config, node.ask_session, node.tell_session
        )
        register_binding_tools(node.tools, ingress)
        node.tools.observers.append(ingress.observe_tool)
        node.hooks.on_session_end.append(ingress.end_session)
        self.github_secret = config.github.resolved_secret()
        if self.github_secret is None:
            log.info("webhooks: no GitHub secret ([webhooks.github] secret or env): not served")
        for name, hook in config.hooks.items():
            try:
                key = hook.resolved_secret()
            except ValueError as exc:  # the environment's secret is malformed; never quoted
                log.warning("webhooks: hook %s not served: %s", name, exc)
                continue
            if key is None:
                log.warning("webhooks: hook %s has no secret: not served", name)
                continue
            self.hooks[name] = SignedHook(hook, key, RouteTemplate.parse(hook.session))
        self.receivers = Receivers(config, ingress, self.hooks)
        where = spool_dir(config.spool_dir, node)
        if where is None:
            log.info("webhooks: an in-memory store: no spool (an outage's deliveries are 503)")
        elif config.spool_max_files > 0:
            self.spool = spool = Spool(where, config.spool_max_files)
            await trio.to_thread.run_sync(spool.open)
            self.replayer = replayer = Replayer(spool, self.receivers.deliver)
            self.receivers.spool, self.receivers.spooled = spool, replayer.nudge
            node.metrics.gauge(
                "turnstile_webhook_spool_files",
                lambda: float(spool.count()),
                "webhook deliveries spooled during a store outage, not yet ingested",
            )

    async def open(self, node: NodeContext) -> None:
        """The spool is replayed first (what an outage left on this node's disk is ingested
        before the node takes anything new, unless the store is still out: then the replayer
        keeps trying every few seconds); then the redelivery sweep begins: deliveries recorded
        and not yet in their sessions' inboxes (a crash between the two) go in now, then every
        ``redeliver_seconds``."""
        if self.replayer is not None:
            left = await self.replayer.replay()
            if left:
                log.warning("webhooks: %d spooled deliveries wait for the store", left)
            node.start_soon(self._replay, name="webhooks spool")
        if self.ingress is not None:
            node.start_soon(self.ingress.run, name="webhooks redelivery")

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        if self.ingress is None:
            return []
        assert self.receivers is not None
        return webhook_routes(node, self.receivers, self.github_secret)

    async def _replay(self) -> None:
        """The replayer's loop, for the node's life; the spool's lock goes with it."""
        assert self.replayer is not None
        try:
            await self.replayer.run()
        finally:
            self.replayer.spool.close()


def spool_dir(configured: str, node: NodeContext) -> Path | None:
    """Where this node spools (``[webhooks] spool_dir``, see ``WebhooksConfig``); None for an
    in-memory SQLite store, which keeps nothing past the process either."""
    if configured:
        return Path(configured)
    url = node.config.store
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://")[1:].partition("?")[0]
        if not path or path == ":memory:":
            return None
        return Path(path + ".webhook-spool")
    name = node.config.node.id
    if name is None:
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip(".-_") or "node"
        name = f"{host}-{node.config.port}"
    return Path("turnstile-spool") / name
