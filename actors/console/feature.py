"""The console feature: a web console for people, served by the node at ``/console``.

It is static files and nothing else: an HTML page, a style sheet and one small ES module per
view, shipped inside this package (``static/``) and read once when the node starts. In the
browser they call the HTTP API and the WebSocket protocol every other client uses
(docs/protocol.md) with the token the person types, kept in the tab's ``sessionStorage``. So the
feature owns no actor, no table, no tool and no hook, and the node's data reaches the console
only through the same front door, with the same checks, as ``curl``.

Why no server-side templates and no front-end build: see docs/console.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from turnstile.actors.console.routes import Assets, console_routes, load_assets
from turnstile.actors.console.settings import ConsoleConfig
from turnstile.actors.feature import NodeContext
from turnstile.runtime.gateway.routes import HttpRoute

__all__ = ["ConsoleFeature"]


class ConsoleFeature:
    """``[console]``; needs nothing from the other features, and gives them nothing."""

    name = "console"
    needs: tuple[str, ...] = ()  # static files: it calls the node's API from the browser
    after: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.assets: Assets | None = None

    async def start(self, node: NodeContext) -> None:
        if node.section("console", ConsoleConfig).enabled:
            self.assets = load_assets()

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        if self.assets is None:
            return ()
        return console_routes(self.assets)
