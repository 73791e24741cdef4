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

from runtime.config import HttpModuleConfig, Limits, ModulesConfig
from tests.e2e.conftest import ALICE, BOB, WAIT, Client, connect, new_session, running_node

_ids = itertools.count()


async def call(client: Client, session_id: str, tool: str, **arguments: Any) -> dict:
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
            # Deleting the parent takes the derived session and its heartbeat with it.
            blocked = await ann.delete("/sessions/ann-main")
            assert blocked.status_code == 409
            assert [a["kind"] for a in blocked.json()["automations"]] == ["heartbeat"]
            assert (await ann.delete("/sessions/ann-main?confirm=true")).status_code == 204
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
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                return
            data += chunk
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
