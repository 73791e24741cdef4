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
from collections.abc import Sequence

from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.kinds import PlainKind
from turnstile.actors.webhooks.inputs import WEBHOOK_SOURCE, WebhookEvent
from turnstile.actors.webhooks.routes import SignedHook, webhook_routes
from turnstile.actors.webhooks.schema import WEBHOOKS
from turnstile.actors.webhooks.service import Ingress
from turnstile.actors.webhooks.settings import WebhooksConfig
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

    async def open(self, node: NodeContext) -> None:
        """The redelivery sweep begins: deliveries recorded and not yet in their sessions'
        inboxes (a crash between the two) go in now, then every ``redeliver_seconds``."""
        if self.ingress is not None:
            node.start_soon(self.ingress.run, name="webhooks redelivery")

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        if self.ingress is None:
            return []
        return webhook_routes(node, self.ingress, self.github_secret, self.hooks)
