"""The node's operational surface: probes, metrics, JSON errors, loopback by default."""

from __future__ import annotations

import httpx

from tests.support.node import ALICE, new_session, running_node
from turnstile.client import StreamEnd, open_client


async def test_node_serves_health_metrics_and_json_404s_on_loopback(tmp_path):
    async with running_node(tmp_path) as node:
        assert node.url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
        async with httpx.AsyncClient(base_url=node.url) as anonymous:
            health = await anonymous.get("/healthz")
            assert health.status_code == 200
            assert health.json()["status"] == "ok" and health.json()["protocol"] == 1
            missing = await anonymous.get("/nope")
            assert missing.status_code == 404
            assert missing.json() == {"error": {"code": "not_found", "message": "no route /nope"}}
        await new_session(node, "m1")
        async with (
            open_client(node.url, ALICE) as client,
            client.attach("m1") as stream,
            node.http() as http,
        ):
            posted = await client.post_message("m1", "hi")  # 202, or it raises
            async for event in stream:
                if isinstance(event.data, StreamEnd):
                    assert (event.data.input_id, event.data.status) == (
                        posted.input_id,
                        "completed",
                    )
                    break
            metrics = (await http.get("/metrics")).text.splitlines()
    assert "turnstile_sessions_active 1.0" in metrics
    assert "turnstile_inputs_total 1.0" in metrics
    assert 'turnstile_turns_total{status="completed"} 1.0' in metrics
    assert "# TYPE turnstile_turn_seconds histogram" in metrics
    assert (tmp_path / "node.db").exists()
