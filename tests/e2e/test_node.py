"""The node's operational surface: probes, metrics, JSON errors, loopback by default."""

from __future__ import annotations

import httpx

from tests.support.node import connect, new_session, running_node


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
        async with connect(node) as client, node.http() as http:
            await client.send(type="attach", session_id="m1")
            await client.expect("session_sync")
            assert (
                await http.post("/sessions/m1/messages", json={"content": "hi"})
            ).status_code == 202
            await client.expect("stream_end", status="completed")
            metrics = (await http.get("/metrics")).text.splitlines()
    assert "turnstile_sessions_active 1.0" in metrics
    assert "turnstile_inputs_total 1.0" in metrics
    assert 'turnstile_turns_total{status="completed"} 1.0' in metrics
    assert "# TYPE turnstile_turn_seconds histogram" in metrics
    assert (tmp_path / "node.db").exists()
