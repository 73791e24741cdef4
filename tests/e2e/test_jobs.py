"""Scheduling through the real gateway: call, job endpoints, ownership, deletion blocking."""

from __future__ import annotations

import trio

from tests.support.node import BOB, connect, new_session, running_node


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
            # cron-session-binding.md's fields, next to the error clients already read
            assert (body["deleted"], body["blocked_by_automations"]) == (False, True)
            assert [a["id"] for a in body["automations"]] == [job_id]
            assert body["automations"][0]["enabled"] is True and body["automations"][0]["name"]
            assert (await http.get("/sessions/ops")).status_code == 200  # still there
            # a mistyped confirmation is refused, never read as "no" (nor as "yes")
            typo = await http.delete("/sessions/ops", params={"confirm": "ture"})
            assert typo.status_code == 400 and typo.json()["error"]["field"] == "confirm"
            assert (await http.get("/sessions/ops")).status_code == 200

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


class HeldRecallAgent:
    """Replies to every turn at once, except a recall's, which it holds until ``release``."""

    name = "held"

    def __init__(self) -> None:
        self.started = trio.Event()
        self.release = trio.Event()

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn) -> str:
        if turn.input.source == "recall":
            self.started.set()
            await self.release.wait()
        return f"reply:{turn.input.content}"


async def test_a_recall_nobody_watches_runs_headless_and_the_session_list_shows_recalls(
    tmp_path,
):
    """recall.md over the real gateway: an immediate recall scheduled with no client attached
    fires (recall_update ``fired``), runs with ``is_recall`` and its self-instruction out of
    the user-role content, and ends with ``session_sync``; ``GET /sessions`` says which
    sessions have a pending recall and filters on it; recalls do not block deletion."""
    agent = HeldRecallAgent()
    async with running_node(tmp_path, agent=agent) as node:
        for name in ("r", "waiting", "plain"):
            await new_session(node, name)
        async with connect(node) as client:
            await client.send(
                type="call",
                id="1",
                session_id="r",
                tool="schedule_recall",
                arguments={"call_type": "immediate",
                           "additional_context_message": "Read /tmp/build.log and report."},
            )  # fmt: skip
            made = await client.expect("result", id="1")
            assert made["ok"] is True, made
            await client.send(
                type="call",
                id="2",
                session_id="waiting",
                tool="schedule_recall",
                arguments={"call_type": "once", "when": "in 2h",
                           "additional_context_message": "Look again."},
            )  # fmt: skip
            assert (await client.expect("result", id="2"))["ok"] is True
            await agent.started.wait()  # the recall turn runs, and nobody watched it start
            await client.send(type="attach", session_id="r", after_seq=0)
            await client.expect("session_sync")  # the attach-time one (busy)
            agent.release.set()
            sync = await client.expect(lambda f: f["type"] == "session_sync" and "input_id" in f)
        async with node.http() as http:
            events = (await http.get("/sessions/r/events")).json()["events"]
            kinds = [e["type"] for e in events]
            assert kinds[-2:] == ["stream_end", "session_sync"]
            fired = [e for e in events if e["type"] == "recall_update"][-1]
            assert (fired["action"], fired["status"]) == ("fired", "fired")
            (start,) = [e for e in events if e["type"] == "stream_start"]
            assert start["is_recall"] is True and start["source"] == "recall"
            assert start["instruction"] == "Read /tmp/build.log and report."
            assert "Read /tmp/build.log" not in start["content"]
            assert sync["status"] == "completed"
            (entry, _answer) = (await http.get("/sessions/r/history")).json()["history"]
            assert entry["is_recall"] is True and entry["role"] == "user"

            listed = (await http.get("/sessions")).json()["sessions"]
            flags = {s["id"]: (s["has_recall"], s["recall_trigger_at"]) for s in listed}
            assert flags["r"] == (False, None) and flags["plain"] == (False, None)
            assert flags["waiting"][0] is True and flags["waiting"][1].endswith("Z")
            only = (await http.get("/sessions?has_recall=true")).json()["sessions"]
            assert [s["id"] for s in only] == ["waiting"]
            others = (await http.get("/sessions?has_recall=false&limit=1")).json()["sessions"]
            assert [s["id"] for s in others] == ["plain"]  # read on past 'waiting'
            bad = await http.get("/sessions?has_recall=maybe")
            assert bad.status_code == 400 and bad.json()["error"]["field"] == "has_recall"
            # a pending recall ends with its session: it does not block the delete
            assert (await http.delete("/sessions/waiting")).status_code == 204
            assert (await http.get("/sessions?has_recall=true")).json() == {"sessions": []}


async def test_every_job_of_yours_listed_filtered_and_cancelled_over_http(tmp_path):
    """``GET /jobs`` lists the caller's jobs across sessions (``session``, ``state`` narrow
    it); ``POST /jobs/{id}/cancel`` cancels one (a job already cancelled answers as it is);
    another user's job is not found, listed or cancelled."""
    async with running_node(tmp_path) as node:
        ids = {}
        for name in ("a", "b"):
            await new_session(node, name)
            async with connect(node) as client:
                arguments = {"cron": "every day at 9am", "prompt": f"report {name}"}
                await client.send(
                    type="call", id=name, session_id=name, tool="schedule_cron", arguments=arguments
                )
                result = await client.expect("result", id=name)
                assert result["ok"] is True, result
                ids[name] = result["data"]["job_id"]
        await new_session(node, "a", token=BOB)  # Bob's own "a": no job
        async with node.http() as http, node.http(BOB) as bob:
            listed = (await http.get("/jobs")).json()["jobs"]
            assert [(j["id"], j["session_id"]) for j in listed] == [
                (ids["a"], "a"),
                (ids["b"], "b"),
            ]
            only_b = (await http.get("/jobs", params={"session": "b"})).json()["jobs"]
            assert [j["id"] for j in only_b] == [ids["b"]]
            assert (await bob.get("/jobs")).json() == {"jobs": []}
            assert (await bob.post(f"/jobs/{ids['a']}/cancel")).status_code == 404

            cancelled = await http.post(f"/jobs/{ids['a']}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            assert (cancelled.json()["state"], cancelled.json()["next_fire_at"]) == (
                "cancelled",
                None,
            )
            again = await http.post(f"/jobs/{ids['a']}/cancel")
            assert again.json()["state"] == "cancelled"
            active = (await http.get("/jobs", params={"state": "active"})).json()["jobs"]
            assert [j["id"] for j in active] == [ids["b"]]

            # pause and resume, as for watchers; a job that is done cannot change (409)
            assert (await bob.post(f"/jobs/{ids['b']}/pause")).status_code == 404
            paused = await http.post(f"/jobs/{ids['b']}/pause")
            assert paused.status_code == 200, paused.text
            assert paused.json()["state"] == "paused" and paused.json()["next_fire_at"]
            listed = (await http.get("/jobs", params={"state": "paused"})).json()["jobs"]
            assert [j["id"] for j in listed] == [ids["b"]]
            resumed = await http.post(f"/jobs/{ids['b']}/resume")
            assert resumed.status_code == 200 and resumed.json()["state"] == "active"
            done = await http.post(f"/jobs/{ids['a']}/resume")
            assert done.status_code == 409 and done.json()["error"]["code"] == "conflict"
            assert (await http.get("/jobs", params={"state": "failed"})).json() == {"jobs": []}

            bad = await http.get("/jobs", params={"state": "sleeping"})
            assert bad.status_code == 400 and bad.json()["error"]["field"] == "state"
            missing = await http.get("/jobs", params={"session": "nope"})
            assert missing.status_code == 404


async def test_a_job_whose_last_run_failed_is_listed_as_failed(tmp_path):
    """``GET /jobs?state=failed``: jobs whose last run failed (``schedule_list``'s ``failed``)."""
    async with running_node(tmp_path) as node:
        await new_session(node, "f")
        async with connect(node) as client:
            await client.send(type="attach", session_id="f")
            await client.expect("session_sync")
            arguments = {"when": "in 1s", "action_type": "llm_prompt", "prompt": "/fail nope"}
            await client.send(
                type="call", id="j", session_id="f", tool="schedule_once", arguments=arguments
            )
            result = await client.expect("result", id="j")
            assert result["ok"] is True, result
            await client.expect("stream_end", status="failed")
            await client.send(
                type="call", id="l", session_id="f", tool="schedule_list", arguments={}
            )
            listed = await client.expect("result", id="l")
        job_id = result["data"]["job_id"]
        assert [j["status"] for j in listed["data"]["jobs"]] == ["failed"]
        async with node.http() as http:
            # the run record settles with the turn, in its closing transaction
            failed = (await http.get("/jobs", params={"state": "failed"})).json()["jobs"]
            assert [(j["id"], j["state"]) for j in failed] == [(job_id, "completed")]
            completed = (await http.get("/jobs", params={"state": "completed"})).json()["jobs"]
            assert [j["id"] for j in completed] == [job_id]
