"""The watchers feature: the watcher actor, the ``watch_*`` tools, the watcher endpoints.

A watcher polls a tool and escalates into its session only on change, error, recovery,
threshold or batch. Its escalations can also go out through the notifications feature when that
is on the node. A deleted session's watchers stop with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from turnstile.actors.feature import NodeContext
from turnstile.actors.watchers.actor import BeginChecks, DropSessionWatchers, WatcherActor
from turnstile.actors.watchers.cluster import settled
from turnstile.actors.watchers.routes import watcher_routes
from turnstile.actors.watchers.settings import WatchersConfig
from turnstile.actors.watchers.tools import WATCH_TOOLS, register_watch_tools, watch_runner
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.gateway.routes import HttpRoute

__all__ = ["WatchersFeature"]


class WatchersFeature:
    """Its actor takes the notifications feature's ``notify`` when it starts, hence ``after``.
    Like every feature's actors it stops before the sessions (``open_node`` spawns their
    supervisor first; children stop newest first), so the watcher saves its state and
    delivers what is pending while sessions still run."""

    name = "watchers"
    needs: tuple[str, ...] = ("sessions",)
    after: tuple[str, ...] = ("notifications",)

    def __init__(self) -> None:
        self.watchers: ActorRef | None = None
        self.opened = False

    async def start(self, node: NodeContext) -> None:
        tools = node.tools
        settings = node.section("watchers", WatchersConfig)
        self.watchers = watchers = await node.supervisor.spawn(
            lambda: WatcherActor(
                watch_runner(tools),
                node.tell_session,
                node.store,
                node.clock,
                max_watchers_per_session=settings.max_per_session,
                persist_interval=settings.persist_interval,
                max_concurrent_checks=settings.max_concurrent_checks,
                notify=node.notify,
                share=node.membership,  # several nodes: each watcher is checked by one
                # it loads the watchers now and checks from ``open``; an incarnation restarted
                # after a crash once the node is open checks from its start
                held=not self.opened,
            ),
            name="watchers",
        )
        register_watch_tools(tools, watchers, default_channel=node.output_channel)
        tools.composite |= WATCH_TOOLS

        async def drop(key: str) -> None:
            await settled(await watchers.ask(DropSessionWatchers(session_id=key)))

        node.hooks.on_session_end.append(drop)

    async def open(self, node: NodeContext) -> None:
        """Checks run from now on (each watcher on its grid)."""
        assert self.watchers is not None, "open() after start()"
        self.opened = True
        await self.watchers.ask(BeginChecks())

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        assert self.watchers is not None, "routes() after start()"
        return watcher_routes(node, self.watchers)
