"""Scheduling through the real gateway: call, job endpoints, ownership, deletion blocking."""

from __future__ import annotations

from tests.e2e.conftest import BOB, connect, new_session, running_node


async def test_jobs_over_the_wire_and_deleting_a_session_with_automations(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "ops")
        async with connect(node) as client:
            await client.send(
                type="call",
                id="c",
                session_id="ops",
                tool="schedule_cron",
                arguments={"cron": "every day at 9am", "timezone": "Europe/Paris",
                           "action_type": "llm_prompt", "prompt": "daily report"},
            )  # fmt: skip
            result = await client.expect("result", id="c")
            assert result["ok"] is True, result
            job_id = result["data"]["job_id"]
            assert result["data"]["cron"] == "0 9 * * *"
            assert result["data"]["understood"].startswith("every day at 09:00 Europe/Paris")
        async with node.http() as http, node.http(BOB) as bob:
            jobs = (await http.get("/sessions/ops/jobs")).json()["jobs"]
            assert [j["id"] for j in jobs] == [job_id]
            detail = (await http.get(f"/jobs/{job_id}")).json()
            assert detail["job"]["state"] == "active" and detail["runs"] == []
            assert (await bob.get(f"/jobs/{job_id}")).status_code == 404

            blocked = await http.delete("/sessions/ops")
            assert blocked.status_code == 409
            body = blocked.json()
            assert body["error"]["code"] == "blocked_by_automations"
            assert [a["id"] for a in body["automations"]] == [job_id]
            assert (await http.get("/sessions/ops")).status_code == 200  # still there

            assert (await http.delete("/sessions/ops?confirm=true")).status_code == 204
            assert (await http.get("/sessions/ops")).status_code == 404
            assert (await http.get(f"/jobs/{job_id}")).status_code == 404
