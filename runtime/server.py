"""Serving an ASGI app with hypercorn's trio worker, the way a node needs it."""

from __future__ import annotations

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

__all__ = ["serve_app", "package_version"]


def package_version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turnstile-runtime")
    except PackageNotFoundError:
        return "0+unknown"


async def serve_app(
    app,
    *,
    host: str,
    port: int,
    max_frame_bytes: int,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until cancelled; ``task_status.started`` gets the bound URLs.

    WebSocket messages larger than ``max_frame_bytes`` are refused by hypercorn itself (close
    code 1009) before they are buffered.
    """
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # our logging reports what matters
    config.graceful_timeout = 5.0
    config.websocket_max_message_size = max_frame_bytes
    config.h11_max_incomplete_size = 64 * 1024
    await hypercorn_serve(app, config, task_status=task_status)
