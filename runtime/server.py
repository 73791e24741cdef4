"""``turnstile serve``: one node — the store, the actor system and the HTTP gateway.

Everything runs under one nursery: the supervisor that owns the actors, and hypercorn serving
the Starlette app on trio. Shutdown (Ctrl-C or cancellation) stops the gateway, then every
actor gracefully, then closes the store.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from runtime.gateway import build_app
from runtime.registry import Registry
from runtime.store import open_store
from runtime.supervisor import open_supervisor

__all__ = ["ServeSettings", "serve"]

log = logging.getLogger("turnstile.server")


def package_version() -> str:
    """The installed distribution's version."""
    try:
        return version("turnstile-runtime")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class ServeSettings:
    """What ``turnstile serve`` was asked to do.

    Attributes:
        host: the address to bind; 127.0.0.1 unless told otherwise.
        port: the TCP port (0 picks a free one).
        store: a store URL, ``sqlite:///path`` or ``postgresql://…``.
        idle_timeout: seconds before an idle virtual actor is passivated.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    store: str = "sqlite:///turnstile.db"
    idle_timeout: float = 300.0


async def serve(settings: ServeSettings, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run a node until cancelled; ``task_status.started`` gets the bound ``host:port`` list."""
    async with open_store(settings.store) as store:
        async with open_supervisor("root") as root:
            actors = await root.spawn_supervisor("actors")
            registry = Registry(actors, idle_timeout=settings.idle_timeout)

            def metrics() -> dict[str, float]:
                stats = registry.statistics()
                return {
                    "turnstile_actors_active": stats.active,
                    "turnstile_actor_activations_total": stats.activations,
                    "turnstile_actor_passivations_total": stats.passivations,
                    "turnstile_crashes_total": len(root.crash_reports) + len(actors.crash_reports),
                }

            app = build_app(health=store.ping, metrics=metrics, version=package_version())
            config = Config()
            config.bind = [f"{settings.host}:{settings.port}"]
            config.accesslog = None
            config.errorlog = None  # our own logging config reports what hypercorn says
            config.graceful_timeout = 5.0
            binds = await root._require_nursery().start(hypercorn_serve, app, config)
            log.info("turnstile %s serving on %s", package_version(), ", ".join(binds))
            task_status.started(binds)
            await trio.sleep_forever()
