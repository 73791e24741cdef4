"""Users never reach each other's data: by any id, a derived session or a reused id.

Each test plays the hostile but careful client of issue 9 against a real node: Bob knows (or
guesses) Ann's session names, job, watcher, task and approval ids, and tries them over every HTTP
route, every WebSocket frame and every tool that takes an id. Everything he tries must answer
exactly like an id nobody uses, and nothing of Ann's may ever reach him.
"""

from __future__ import annotations

import itertools
import json
from functools import partial
from typing import Any

import trio

from tests.support.http import read_request_head
from tests.support.node import ALICE, BOB, WAIT, Client, connect, new_session, running_node
from turnstile.actors.config import HttpModuleConfig, Limits, ModulesConfig

_ids = itertools.count()


async def call(client: Client, session_id: str, tool: str, /, **arguments: Any) -> dict:
    """Call a tool over the WebSocket; the ``result`` (or ``error``) frame that answers it."""
    call_id = f"c{next(_ids)}"
    await client.send(
        type="call", id=call_id, session_id=session_id, tool=tool, arguments=arguments
    )
    return await client.expect(lambda f: f.get("id") == call_id)


def not_found(name: str) -> dict:
    return {"error": {"code": "not_found", "message": f"no session with id {name!r}"}}


async def test_a_taken_name_is_free_for_another_user_and_reveals_nothing(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "shared", token=ALICE)
        async with node.http(ALICE) as ann, node.http(BOB) as bob:
            # Bob's create answers exactly as for a name nobody uses: 201, his own session.
            created = await bob.post("/sessions", json={"id": "shared"})
            assert created.status_code == 201, created.text
            assert (created.json()["id"], created.json()["owner"]) == ("shared", "bob")
            # Creating it again is his own conflict, and says so.
            again = await bob.post("/sessions", json={"id": "shared"})
            assert again.status_code == 400
            assert again.json()["error"]["code"] == "already_exists"
            # Two sessions, each seeing only its own messages.
            await bob.post("/sessions/shared/messages", json={"content": "bob was here"})
            async with connect(node, ALICE) as client:
                await client.send(type="attach", session_id="shared", after_seq=0)
                await client.send(type="send", session_id="shared", content="ann's secret")
                await client.expect("stream_end")
                assert all("bob was here" not in json.dumps(f) for f in client.frames)
            bobs = (await bob.get("/sessions/shared/events")).json()["events"]
            assert bobs and all("ann's secret" not in json.dumps(e) for e in bobs)
            assert [s["id"] for s in (await ann.get("/sessions")).json()["sessions"]] == ["shared"]
            # Deleting his does nothing to hers.
            assert (await bob.delete("/sessions/shared")).status_code == 204
            assert (await ann.get("/sessions/shared")).status_code == 200


async def test_a_heartbeat_session_is_derived_by_the_runtime_and_cannot_be_taken_over(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "ann-main", token=ALICE)
        async with node.http(BOB) as bob, node.http(ALICE) as ann:
            # Bob cannot plant the derived name, in his namespace or anywhere.
            planted = await bob.post("/sessions", json={"id": "ann-main.heartbeat"})
            assert planted.status_code == 400
            assert planted.json()["error"]["field"] == "id"
            assert planted.json()["error"]["message"] == (
                "ids ending in .heartbeat are reserved for sessions the runtime derives from "
                "a session"
            )
            await new_session(node, "bob-main", token=BOB)
            async with connect(node, ALICE) as client:
                made = await call(
                    client,
                    "ann-main",
                    "set_heartbeat",
                    enabled=True,
                    checklist="ann's private checklist",
                )
            assert made["ok"] is True, made
            assert made["data"]["session_id"] == "ann-main.heartbeat"
            # Ann sees her derived session and its job; Bob sees nothing of it anywhere.
            names = [s["id"] for s in (await ann.get("/sessions")).json()["sessions"]]
            assert sorted(names) == ["ann-main", "ann-main.heartbeat"]
            (job,) = (await ann.get("/sessions/ann-main.heartbeat/jobs")).json()["jobs"]
            assert job["kind"] == "heartbeat" and job["session_id"] == "ann-main.heartbeat"
            for path in ("/sessions/ann-main.heartbeat", "/sessions/ann-main.heartbeat/jobs"):
                response = await bob.get(path)
                assert response.status_code == 404
                assert response.json() == not_found("ann-main.heartbeat")
            assert (await bob.get(f"/jobs/{job['id']}")).status_code == 404
            async with connect(node, BOB) as client:
                listed = await call(client, "bob-main", "list_schedule", session_only=False)
                assert listed["ok"] is True and listed["data"]["items"] == []
                assert "checklist" not in json.dumps(listed)
            # Deleting the parent takes the derived session and its heartbeat with it (a
            # heartbeat is a system job: like the reference, it does not block the delete).
            assert (await ann.delete("/sessions/ann-main")).status_code == 204
            assert (await ann.get("/sessions")).json() == {"sessions": []}
            assert (await ann.get(f"/jobs/{job['id']}")).status_code == 404


async def test_derived_sessions_count_against_the_session_limit(tmp_path):
    limits = Limits(max_sessions_per_user=2)
    async with running_node(tmp_path, limits=limits) as node:
        await new_session(node, "one", token=BOB)
        await new_session(node, "two", token=BOB)
        async with connect(node, BOB) as client:
            refused = await call(client, "one", "set_heartbeat", enabled=True, checklist="x")
            assert refused["ok"] is False
            assert refused["error"]["code"] == "limit_exceeded"
            # The main-session heartbeat needs no new session, so it is allowed.
            main = await call(
                client, "one", "set_heartbeat", enabled=True, checklist="x", session="main"
            )
            assert main["ok"] is True and main["data"]["session_id"] == "one"
        async with node.http(BOB) as bob:
            names = [s["id"] for s in (await bob.get("/sessions")).json()["sessions"]]
            assert sorted(names) == ["one", "two"]


class HeldHttpServer:
    """A loopback HTTP server that never answers: it tells the test when a request arrives and
    when its client gives up on it (closes the connection)."""

    def __init__(self) -> None:
        self.received = trio.Event()
        self.abandoned = trio.Event()
        self.port = 0

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    async def _handle(self, stream: trio.SocketStream) -> None:
        if await read_request_head(stream) is None:
            return
        self.received.set()
        while await stream.receive_some(4096):
            pass
        self.abandoned.set()


async def test_background_tasks_end_with_their_session(tmp_path):
    modules = ModulesConfig(http=HttpModuleConfig(allowed_networks=["127.0.0.0/8"]))
    async with trio.open_nursery() as nursery:
        held = HeldHttpServer()
        await held.serve(nursery)
        url = f"http://127.0.0.1:{held.port}/report"
        async with running_node(tmp_path, modules=modules) as node:
            await new_session(node, "reuse-1", token=ALICE)
            async with connect(node, ALICE) as ann_ws:
                started = await call(
                    ann_ws, "reuse-1", "background_run", name="http.get", params={"url": url}
                )
                assert started["ok"] is True, started
                task_id = started["data"]["task_id"]
            with trio.fail_after(WAIT):
                await held.received.wait()
            async with node.http(ALICE) as ann:
                listed = (await ann.get("/sessions/reuse-1/tasks")).json()["tasks"]
                assert [t["task_id"] for t in listed] == [task_id]
                assert (await ann.delete("/sessions/reuse-1")).status_code == 204
            # The task ended with its session: its request is abandoned, so no result and no
            # completion notice can ever reach whoever uses the name next.
            with trio.fail_after(WAIT):
                await held.abandoned.wait()
            # The name is reused, by Bob and by Ann herself: neither finds the old task.
            await new_session(node, "reuse-1", token=BOB)
            await new_session(node, "reuse-1", token=ALICE)
            for token in (BOB, ALICE):
                async with node.http(token) as http:
                    assert (await http.get("/sessions/reuse-1/tasks")).json() == {"tasks": []}
                    gone = await http.get(f"/sessions/reuse-1/tasks/{task_id}")
                    assert gone.status_code == 404
                async with connect(node, token) as client:
                    result = await call(client, "reuse-1", "background_result", task_id=task_id)
                    assert result["ok"] is False and result["error"]["code"] == "not_found"
                    await client.send(type="attach", session_id="reuse-1", after_seq=0)
                    await client.send(type="send", session_id="reuse-1", content="after")
                    await client.expect("stream_end")
                    assert "BACKGROUND TASK" not in json.dumps(client.frames)
            async with node.http(ALICE) as ann:
                metrics = (await ann.get("/metrics")).text.splitlines()
                assert "turnstile_crashes_total 0.0" in metrics
        nursery.cancel_scope.cancel()


#: Every HTTP route that names a session: ``(method, path, json body)``; ``{s}`` is the name.
SESSION_ROUTES = [
    ("GET", "/sessions/{s}", None),
    ("GET", "/sessions/{s}/history", None),
    ("GET", "/sessions/{s}/events", None),
    ("POST", "/sessions/{s}/messages", {"content": "bob's probe"}),
    ("POST", "/sessions/{s}/stop", None),
    ("GET", "/sessions/{s}/jobs", None),
    ("GET", "/sessions/{s}/approvals", None),
    ("GET", "/sessions/{s}/watchers", None),
    ("POST", "/sessions/{s}/watchers", {"tool": "echo", "params": {"text": "x"}}),
    ("GET", "/sessions/{s}/tasks", None),
    ("GET", "/sessions/{s}/tasks/{task}", None),
    ("POST", "/sessions/{s}/tasks/{task}/cancel", None),
    ("GET", "/sessions/{s}/recall", None),
    ("DELETE", "/sessions/{s}/recall", None),
    ("POST", "/sessions/{s}/recall/skip", None),
    ("GET", "/sessions/{s}/heartbeat", None),
    ("GET", "/sessions/{s}/bindings", None),
    ("POST", "/sessions/{s}/bindings", {"source": "github:acme/app#3"}),
    ("DELETE", "/sessions/{s}/bindings?source=github:acme/app%233", None),
    ("DELETE", "/sessions/{s}?confirm=true", None),
]

#: Every HTTP route that names another object by its id: ``(method, path, kind of id)``.
OBJECT_ROUTES = [
    ("GET", "/jobs/{id}", "job"),
    ("GET", "/jobs/{id}", "check"),
    ("GET", "/jobs/{id}", "recall"),
    ("GET", "/watchers/{id}", "watcher"),
    ("DELETE", "/watchers/{id}", "watcher"),
    ("POST", "/watchers/{id}/pause", "watcher"),
    ("POST", "/watchers/{id}/resume", "watcher"),
    ("POST", "/approvals/{id}/approve", "approval"),
    ("POST", "/approvals/{id}/deny", "approval"),
]

#: Every tool that takes an id, called from Bob's own session: ``(tool, arguments)``.
ID_TOOLS = [
    ("schedule_status", {"job_id": "{job}"}),
    ("schedule_cancel", {"job_id": "{job}"}),
    ("cancel_scheduled", {"scheduled_id": "{check}"}),
    ("cancel_scheduled", {"scheduled_id": "{job}"}),
    ("cron", {"action": "remove", "job_id": "{job}"}),
    ("manage_recall", {"action": "list", "session_id": "{session}"}),
    ("manage_recall", {"action": "cancel", "session_id": "{session}"}),
    ("background_status", {"task_id": "{task}"}),
    ("background_result", {"task_id": "{task}"}),
    ("background_cancel", {"task_id": "{task}"}),
    ("background_wait", {"task_id": "{task}", "timeout": 0.01}),
    ("watch_status", {"watcher_id": "{watcher}"}),
    ("watch_history", {"watcher_id": "{watcher}"}),
    ("watch_pause", {"watcher_id": "{watcher}"}),
    ("watch_resume", {"watcher_id": "{watcher}"}),
    ("watch_stop", {"watcher_id": "{watcher}"}),
]

#: Bob's listings, which must hold nothing of Ann's.
LISTINGS = [
    ("list_schedule", {"session_only": False}),
    ("schedule_list", {}),
    ("watch_list", {}),
    ("background_list", {}),
    ("manage_recall", {"action": "list"}),
    ("cron", {"action": "list"}),
]


def fill(template: Any, ids: dict[str, str]) -> Any:
    if isinstance(template, str):
        return template.format(**ids)
    if isinstance(template, dict):
        return {k: fill(v, ids) for k, v in template.items()}
    return template


def blind(answer: Any, ids: dict[str, str]) -> str:
    """An answer with the probed ids replaced, so answers about two ids compare equal."""
    text = json.dumps(answer, sort_keys=True)
    for kind, value in sorted(ids.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(value, f"<{kind}>")
    return text


async def test_every_route_frame_and_tool_answers_a_foreign_id_like_a_missing_one(tmp_path):
    """Bob probes every HTTP route, every WS frame and every id-taking tool with Ann's ids and
    with ids nobody uses: the answers are identical, Ann's things are untouched, and not one
    frame of Ann's reaches Bob."""
    async with running_node(tmp_path) as node:
        for name in ("a1", "a2"):
            await new_session(node, name, token=ALICE)
        await new_session(node, "b1", token=BOB)
        async with connect(node, ALICE) as ann, trio.open_nursery() as nursery:
            await ann.send(type="attach", session_id="a1")
            await ann.expect("attached")
            made = {
                "job": await call(
                    ann, "a1", "schedule_once", when="in 2 hours", prompt="ann-secret job"
                ),
                "check": await call(
                    ann, "a1", "schedule_check", delay_minutes=30, instructions="ann-secret"
                ),
                "recall": await call(
                    ann,
                    "a1",
                    "schedule_recall",
                    call_type="once",
                    when="in 1 hour",
                    additional_context_message="ann-secret recall",
                ),
                "watcher": await call(
                    ann, "a1", "watch_start", tool="echo", params={"text": "ann-secret"}
                ),
                "task": await call(
                    ann, "a1", "background_run", name="echo", params={"text": "ann-secret"}
                ),
            }
            assert all(m["ok"] for m in made.values()), made
            ann_ids = {
                "session": "a1",
                "job": made["job"]["data"]["job_id"],
                "check": made["check"]["data"]["scheduled_id"],
                "recall": made["recall"]["data"]["recall_id"],
                "watcher": made["watcher"]["data"]["watcher_id"],
                "task": made["task"]["data"]["task_id"],
            }

            async def ask_to_write() -> None:  # APPROVE by default: waits for a person
                async with connect(node, ALICE) as writer:
                    await writer.send(
                        type="call",
                        id="write",
                        session_id="a1",
                        tool="filesystem.write",
                        arguments={"path": "x.txt", "content": "ann"},
                    )
                    await trio.sleep_forever()  # until the test ends

            nursery.start_soon(ask_to_write)
            ann_ids["approval"] = (await ann.expect("approval_required"))["approval_id"]
            # Ids of the same shapes that nobody uses.
            missing = {k: v[:-4] + "zzzz" for k, v in ann_ids.items()}
            missing["session"] = "a9"

            async with node.http(BOB) as bob, connect(node, BOB) as bob_ws:
                for ids_a, ids_b in ((ann_ids, missing),):
                    for method, path, body in SESSION_ROUTES:
                        answers = []
                        for ids in (ids_a, ids_b):
                            response = await bob.request(
                                method, fill(path, {"s": ids["session"], **ids}), json=body
                            )
                            answers.append((response.status_code, blind(response.json(), ids)))
                        assert answers[0] == answers[1], (method, path, answers)
                        assert answers[0][0] == 404, (method, path, answers)
                    for method, path, kind in OBJECT_ROUTES:
                        answers = []
                        for ids in (ids_a, ids_b):
                            response = await bob.request(method, path.format(id=ids[kind]))
                            answers.append((response.status_code, blind(response.json(), ids)))
                        assert answers[0] == answers[1], (method, path, answers)
                        assert answers[0][0] == 404, (method, path, answers)
                    # A foreign task id through Bob's own session, too.
                    for ids in (ids_a, ids_b):
                        response = await bob.get(f"/sessions/b1/tasks/{ids['task']}")
                        assert response.status_code == 404
                    for frame in (
                        {"type": "attach", "session_id": "{session}", "after_seq": 0},
                        {"type": "send", "session_id": "{session}", "content": "probe"},
                        {"type": "stop", "session_id": "{session}"},
                        {"type": "set_policy", "session_id": "{session}", "policy": "reject"},
                        {"type": "detach", "session_id": "{session}"},
                        {"type": "approve", "session_id": "{session}", "approval_id": "{approval}"},
                        {"type": "deny", "session_id": "{session}", "approval_id": "{approval}"},
                        {"type": "approve", "session_id": "b1", "approval_id": "{approval}"},
                        {"type": "deny", "session_id": "b1", "approval_id": "{approval}"},
                        {"type": "call", "session_id": "{session}", "tool": "echo"},
                    ):
                        answers = []
                        for ids in (ids_a, ids_b):
                            extra = {"id": f"f{next(_ids)}"} if frame["type"] == "call" else {}
                            await bob_ws.send(**fill(frame, ids), **extra)
                            answer = await bob_ws.expect(lambda f: "seq" not in f)
                            answer.pop("id", None)
                            answers.append(blind(answer, ids))
                        assert answers[0] == answers[1], (frame, answers)
                        assert '"not_found"' in answers[0] or frame["type"] == "detach", answers
                    for tool, arguments in ID_TOOLS:
                        answers = []
                        for ids in (ids_a, ids_b):
                            answer = await call(bob_ws, "b1", tool, **fill(arguments, ids))
                            answer.pop("id")
                            answers.append(blind(answer, ids))
                        assert answers[0] == answers[1], (tool, arguments, answers)
                        assert '"ok": false' in answers[0], (tool, answers)
                    for tool, arguments in LISTINGS:
                        listed = await call(bob_ws, "b1", tool, **arguments)
                        assert listed["ok"] is True, (tool, listed)
                        assert "ann-secret" not in json.dumps(listed), (tool, listed)
                        for value in ann_ids.values():
                            assert value not in json.dumps(listed), (tool, value, listed)
                assert all("ann-secret" not in json.dumps(f) for f in bob_ws.frames)
                assert not any(
                    f.get("session_id") in ("a1", "a2") and "seq" in f for f in bob_ws.frames
                )
            # Nothing of Ann's moved: her job, check, recall and watcher are pending, her
            # approval still waits, her session still runs turns.
            async with node.http(ALICE) as ann_http:
                jobs = (await ann_http.get("/sessions/a1/jobs")).json()["jobs"]
                assert sorted(j["state"] for j in jobs) == ["active", "active", "active"]
                watcher = (await ann_http.get(f"/watchers/{ann_ids['watcher']}")).json()
                assert watcher["status"] == "running"
                pending = (await ann_http.get("/sessions/a1/approvals")).json()["approvals"]
                assert [p["approval_id"] for p in pending] == [ann_ids["approval"]]
                denied = await ann_http.post(f"/approvals/{ann_ids['approval']}/deny")
                assert denied.json()["session_id"] == "a1"
            nursery.cancel_scope.cancel()
