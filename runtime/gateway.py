"""The HTTP surface of a running node (Starlette on hypercorn's trio worker).

For now it serves what operations need from day one: ``GET /healthz`` (is the store
answering?) and ``GET /metrics`` (Prometheus text). Sessions, the WebSocket ``/ws`` protocol and
the REST resources are built on this app by the session/gateway work.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["build_app"]


def build_app(
    *,
    health: Callable[[], object],
    metrics: Callable[[], dict[str, float]],
    version: str,
) -> Starlette:
    """Build the ASGI app.

    Args:
        health: an async callable that raises when the node is unhealthy (e.g. store ping).
        metrics: returns gauge/counter values by Prometheus name.
        version: reported by ``/healthz``.
    """

    async def healthz(_: Request) -> Response:
        try:
            await health()
        except Exception as exc:  # report, don't crash: this is the probe
            return JSONResponse(
                {"status": "unhealthy", "error": {"code": "unhealthy", "message": str(exc)}},
                status_code=503,
            )
        return JSONResponse({"status": "ok", "version": version})

    async def metrics_endpoint(_: Request) -> Response:
        lines = []
        for name, value in sorted(metrics().items()):
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {value}")
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            {"error": {"code": "not_found", "message": f"no route {request.url.path}"}},
            status_code=404,
        )

    return Starlette(
        routes=[Route("/healthz", healthz), Route("/metrics", metrics_endpoint)],
        exception_handlers={404: not_found},
    )
