"""``POST /mcp`` from the node's start, the MCP SDK only from its first request.

Importing the SDK (its pydantic models) costs about a second of CPU on a quiet box and many on a
loaded one, and most nodes never get an MCP request: a node that paid it at every start
started that much later (and each test that starts a node, and each crash-harness restart).
So the route is there from the start, and the first request to it loads the SDK in a worker
thread (the node goes on serving meanwhile), builds :class:`~turnstile.actors.mcp.endpoint.
McpEndpoint` and starts its session manager; that request and any arriving meanwhile wait for
it, later ones find it ready.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

import trio
from starlette.responses import JSONResponse, Response

from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute, Reply
from turnstile.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from turnstile.actors.mcp.endpoint import McpEndpoint

__all__ = ["EndpointOnFirstUse"]

log = logging.getLogger("turnstile.mcp")

#: the answer while the SDK could not be loaded (the node's log says why)
_UNAVAILABLE = {
    "error": {"code": "mcp_unavailable", "message": "the MCP endpoint could not be started"}
}


class EndpointOnFirstUse:
    """The ``/mcp`` route, and the task that builds its endpoint when it is first asked.

    Args: those of ``McpEndpoint``: the sessions' directory, the node's tool registry and the
        largest request body.
    """

    def __init__(self, directory: Any, tools: ToolRegistry, max_body: int) -> None:
        self._args = (directory, tools, max_body)
        self._wanted = trio.Event()
        self._ready = trio.Event()
        self.endpoint: McpEndpoint | None = None

    async def run(self) -> None:
        """Until cancelled: wait for the first request, then build the endpoint and serve
        (the SDK's session manager needs a task group of its own)."""
        await self._wanted.wait()
        try:
            module = await trio.to_thread.run_sync(
                importlib.import_module, "turnstile.actors.mcp.endpoint"
            )
            self.endpoint = module.McpEndpoint(*self._args)
        except Exception:  # a broken install: /mcp says so, the node serves on
            log.exception("/mcp cannot be served: the MCP SDK did not load")
            self._ready.set()
            return
        async with self.endpoint.manager.run():
            self._ready.set()
            await trio.sleep_forever()

    def routes(self) -> list[HttpRoute]:
        """``POST /mcp`` behind the gateway's token check. Stateless, the server opens no
        stream of its own and keeps no session, so ``GET`` and ``DELETE`` (MCP's stream and
        end of session) are not routes: the gateway answers them ``405``."""

        async def handle(request: ApiRequest) -> Response:
            self._wanted.set()
            await self._ready.wait()
            if self.endpoint is None:
                return JSONResponse(_UNAVAILABLE, status_code=503)
            return self.endpoint.answer(request)

        return [
            HttpRoute(
                "POST",
                "/mcp",
                handle,
                summary="The node's sessions as an MCP server (streamable HTTP; docs/mcp.md)",
                description="A JSON-RPC request or notification of the Model Context Protocol, "
                "answered by the SDK's server: tools to list, create and message the user's "
                "sessions and to call the scheduling, watcher and memory primitives in them.",
                body=dict[str, Any],
                responses={
                    200: Reply(dict[str, Any], "the JSON-RPC answer"),
                    202: Reply(None, "a notification or a response, accepted"),
                    503: Reply(dict[str, Any], "the MCP SDK did not load (see the log)"),
                },
                errors=(400, 404, 406, 409, 413, 415),
            )
        ]
