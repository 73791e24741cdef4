"""A real node: hypercorn on loopback, the SQLite store, probed over HTTP."""

from __future__ import annotations

import httpx
import trio

from runtime.server import ServeSettings, serve


async def test_node_serves_health_and_metrics_and_json_404s(tmp_path):
    settings = ServeSettings(port=0, store=f"sqlite:///{tmp_path}/node.db")
    async with trio.open_nursery() as nursery:
        (bind,) = await nursery.start(serve, settings)
        assert bind.startswith("http://127.0.0.1:")  # loopback unless told otherwise
        async with httpx.AsyncClient(base_url=bind) as client:
            health = await client.get("/healthz")
            assert health.status_code == 200
            assert health.json()["status"] == "ok"

            metrics = await client.get("/metrics")
            assert metrics.status_code == 200
            assert "turnstile_actors_active 0" in metrics.text.splitlines()

            missing = await client.get("/nope")
            assert missing.status_code == 404
            assert missing.json() == {"error": {"code": "not_found", "message": "no route /nope"}}
        nursery.cancel_scope.cancel()
    assert (tmp_path / "node.db").exists()
