"""The load balancer's probes: ``/healthz`` says the node can serve, ``/readyz`` whether it
should be sent new clients (not while it drains, nor while its store does not answer)."""

from __future__ import annotations

import httpx

from turnstile.runtime.gateway import Auth, ConnectionLimits, build_app

TOKEN = "probe-token-0123456789abcdef"


class Backend:
    """A session backend whose store answers or not (only ``ping`` is probed)."""

    def __init__(self) -> None:
        self.down: Exception | None = None

    async def ping(self) -> None:
        if self.down is not None:
            raise self.down


async def test_readyz_is_503_draining_while_the_node_drains_and_healthz_stays_ok():
    backend, draining = Backend(), [False]
    app = build_app(
        backend=backend,
        auth=Auth({TOKEN: "ada"}),
        limits=ConnectionLimits(),
        version="1",
        draining=lambda: draining[0],
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://n") as c:
        ready = await c.get("/readyz")  # no token: a probe
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        draining[0] = True
        answer = await c.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["status"] == "draining"
        assert answer.json()["error"]["code"] == "draining"
        assert (await c.get("/healthz")).status_code == 200  # it still serves who is attached
        draining[0] = False
        backend.down = ConnectionError("connection refused")
        answer = await c.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["status"] == "unhealthy"
        assert "connection refused" in answer.json()["error"]["message"]
