"""The load balancer's probes: ``/healthz`` says the node's process is alive (liveness),
``/readyz`` whether it should be sent new clients (not while it drains, nor while its store
does not answer: asked at most once a second, within 2 s)."""

from __future__ import annotations

import httpx
import trio

from turnstile.runtime.errors import StoreError, StoreUnavailable
from turnstile.runtime.gateway import Auth, ConnectionLimits, build_app
from turnstile.runtime.gateway.app import READY_CACHE_SECONDS, READY_PING_SECONDS

TOKEN = "probe-token-0123456789abcdef"


class Backend:
    """A session backend whose store answers or not (only ``ping`` is probed)."""

    def __init__(self) -> None:
        self.down: Exception | None = None
        self.stalled = False
        self.pings = 0

    async def ping(self) -> None:
        self.pings += 1
        if self.stalled:
            await trio.sleep_forever()
        if self.down is not None:
            raise self.down


def probe_app(backend: Backend, draining: list[bool] | None = None) -> httpx.AsyncClient:
    app = build_app(
        backend=backend,
        auth=Auth({TOKEN: "ada"}),
        limits=ConnectionLimits(),
        version="1",
        draining=(lambda: draining[0]) if draining is not None else None,
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://n")


async def test_readyz_is_503_draining_while_the_node_drains_and_healthz_stays_ok(autojump_clock):
    backend, draining = Backend(), [False]
    async with probe_app(backend, draining) as c:
        ready = await c.get("/readyz")  # no token: a probe
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        draining[0] = True
        answer = await c.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["status"] == "draining"
        assert answer.json()["error"]["code"] == "draining"
        assert (await c.get("/healthz")).status_code == 200  # it still serves who is attached


async def test_readyz_follows_the_store_and_healthz_stays_liveness(autojump_clock):
    backend = Backend()
    async with probe_app(backend) as c:
        assert (await c.get("/readyz")).status_code == 200
        backend.down = StoreUnavailable()
        assert (await c.get("/readyz")).status_code == 200  # the answer of a moment ago
        await trio.sleep(READY_CACHE_SECONDS)
        answer = await c.get("/readyz")
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "5"
        assert answer.json() == {
            "status": "unhealthy",
            "error": {
                "code": "store_unavailable",
                "message": "the store is unavailable; retry in a few seconds",
            },
        }
        health = await c.get("/healthz")  # liveness: an outage is no reason to restart
        assert (health.status_code, health.json()["status"]) == (200, "ok")
        pings = backend.pings
        for _ in range(5):  # a balancer probing often costs one ping a second
            assert (await c.get("/readyz")).status_code == 503
        assert backend.pings == pings

        await trio.sleep(READY_CACHE_SECONDS)
        backend.down = StoreError("postgres: connection to 10.0.0.7:5432 failed: SELECT 1")
        answer = await c.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "store_error"
        assert "10.0.0.7" not in answer.text and "SELECT" not in answer.text

        await trio.sleep(READY_CACHE_SECONDS)
        backend.down, backend.stalled = None, True  # a store that never answers
        start = trio.current_time()
        answer = await c.get("/readyz")
        assert trio.current_time() - start == READY_PING_SECONDS
        assert (answer.status_code, answer.json()["error"]["code"]) == (503, "store_unavailable")

        await trio.sleep(READY_CACHE_SECONDS)
        backend.stalled = False
        assert (await c.get("/readyz")).json() == {"status": "ready"}
