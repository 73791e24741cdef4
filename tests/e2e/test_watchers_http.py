"""Watchers and background tasks over the real gateway: CRUD, ownership, escalation reaching
the session."""

from __future__ import annotations

from tests.support.node import BOB, connect, new_session, running_node
from turnstile.actors.config import WatchersConfig


async def test_watcher_crud_and_its_baseline_escalation(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "w")
        async with connect(node) as client, node.http() as http, node.http(BOB) as bob:
            await client.send(type="attach", session_id="w")
            await client.expect("session_sync")
            spec = {
                "tool": "echo",
                "params": {"text": "steady"},
                "interval": 60,
                "label": "steady echo",
                "notify_when": "on_change",
            }
            made = await http.post("/sessions/w/watchers", json=spec)
            assert made.status_code == 201, made.text
            wid = made.json()["watcher_id"]
            # the first check sets the baseline and escalates: an event and a turn
            update = await client.expect("watcher_update", watcher_id=wid)
            assert update["watcher_id"] == wid
            start = await client.expect(
                lambda f: f.get("type") == "stream_start" and "[WATCHER UPDATE]" in f["content"]
            )
            assert f"watcher_id={wid}" in start["content"] and start["source"] == "notification"

            listed = (await http.get("/sessions/w/watchers")).json()
            assert [w["watcher_id"] for w in listed["watchers"]] == [wid]
            every = (await http.get("/watchers")).json()  # all of Ann's, every session's
            assert [(w["watcher_id"], w["session_id"]) for w in every["watchers"]] == [(wid, "w")]
            assert (every["total"], every["running"], every["paused"]) == (1, 1, 0)
            assert (await bob.get("/watchers")).json()["watchers"] == []
            assert (await bob.get(f"/watchers/{wid}")).status_code == 404
            assert (await bob.get("/sessions/w/watchers")).status_code == 404
            assert (await http.post(f"/watchers/{wid}/pause")).json()["status"] == "paused"
            assert (await http.post(f"/watchers/{wid}/resume")).json()["status"] == "running"
            assert (await http.get(f"/watchers/{wid}")).json()["check_count"] >= 1
            assert (await http.delete(f"/watchers/{wid}")).status_code == 200
            assert (await http.get(f"/watchers/{wid}")).status_code == 404

            refused = await http.post(
                "/sessions/w/watchers",
                json={**spec, "notify_when": "on_threshold",
                      "notify_config": {"expression": "result.text =="}},
            )  # fmt: skip
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "bad_expression"


async def test_background_tasks_over_http(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "b")
        async with connect(node) as client, node.http() as http, node.http(BOB) as bob:
            await client.send(
                type="call",
                id="1",
                session_id="b",
                tool="background_run",
                arguments={"name": "echo", "params": {"text": "later"}},
            )
            task_id = (await client.expect("result", id="1"))["data"]["task_id"]
            tasks = (await http.get("/sessions/b/tasks")).json()["tasks"]
            assert [t["task_id"] for t in tasks] == [task_id]
            status = (await http.get(f"/sessions/b/tasks/{task_id}")).json()
            assert status["tool_name"] == "echo"
            assert (await bob.get(f"/sessions/b/tasks/{task_id}")).status_code == 404
            cancelled = await http.post(f"/sessions/b/tasks/{task_id}/cancel")
            assert cancelled.status_code == 200 and "cancelled" in cancelled.json()


async def test_the_watchers_section_of_the_config_bounds_a_session(tmp_path):
    """``[watchers] max_per_session`` reaches the watcher actor: the third watcher of a session
    that may have two is refused with a 4xx naming the limit, and another session may still
    start its own."""
    async with running_node(tmp_path, watchers=WatchersConfig(max_per_session=2)) as node:
        await new_session(node, "w")
        await new_session(node, "v")
        spec = {"tool": "echo", "params": {"text": "x"}, "interval": 60}
        async with node.http() as http:
            for _ in range(2):
                made = await http.post("/sessions/w/watchers", json=spec)
                assert made.status_code == 201, made.text
            refused = await http.post("/sessions/w/watchers", json=spec)
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["code"] == "limit_exceeded" and "2" in error["message"]
            assert (await http.post("/sessions/v/watchers", json=spec)).status_code == 201
