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


async def test_recall_over_http(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "r")
        async with connect(node) as client:
            await client.send(type="attach", session_id="r")
            await client.send(
                type="call",
                id="1",
                session_id="r",
                tool="schedule_recall",
                arguments={"call_type": "recurring", "interval_seconds": 3600,
                           "additional_context_message": "Read /tmp/build.log and report."},
            )  # fmt: skip
            made = await client.expect("result", id="1")
            assert made["ok"] is True, made
            update = await client.expect("recall_update")
            assert update["action"] == "scheduled"
        async with node.http() as http, node.http(BOB) as bob:
            pending = (await http.get("/sessions/r/recall")).json()["recall"]
            assert pending["call_type"] == "recurring" and pending["status"] == "pending"
            assert (await bob.get("/sessions/r/recall")).status_code == 404
            skipped = await http.post("/sessions/r/recall/skip")
            assert skipped.status_code == 200, skipped.text
            assert skipped.json()["trigger_at"] > pending["trigger_at"]
            cancelled = await http.delete("/sessions/r/recall")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
            assert (await http.get("/sessions/r/recall")).json() == {"recall": None}


async def test_a_heartbeat_over_http_its_settings_kept_when_disabled_and_gone_with_the_session(
    tmp_path,
):
    async with running_node(tmp_path) as node:
        await new_session(node, "hb")
        async with connect(node) as client:

            async def set_heartbeat(call_id: str, **arguments) -> dict:
                await client.send(
                    type="call",
                    id=call_id,
                    session_id="hb",
                    tool="set_heartbeat",
                    arguments=arguments,
                )
                result = await client.expect("result", id=call_id)
                assert result["ok"] is True, result
                return result["data"]

            made = await set_heartbeat("on", enabled=True, checklist="PRs?", interval_minutes=45)
            async with node.http() as http:
                shown = (await http.get("/sessions/hb/heartbeat")).json()
                assert shown["heartbeat"]["heartbeat_id"] == made["heartbeat_id"]
                assert shown["heartbeat"]["session_id"] == "hb.heartbeat"  # a public name
                assert (shown["heartbeat"]["enabled"], shown["runs"]) == (True, [])
                await set_heartbeat("off", enabled=False)
                kept = (await http.get("/sessions/hb/heartbeat")).json()["heartbeat"]
                assert (kept["enabled"], kept["checklist"], kept["interval_minutes"]) == (
                    False,
                    "PRs?",
                    45,
                )
                assert (await http.delete("/sessions/hb")).status_code == 204
                await new_session(node, "hb")  # the name again: nothing of the old one
                fresh = (await http.get("/sessions/hb/heartbeat")).json()
                assert fresh == {"heartbeat": None, "runs": []}
