"""kill -9 a real ``turnstile serve`` while a background task runs: after the restart the task
reads ``lost`` and its session has been told, once (issue 14: "background tasks of a dead node
are closed as lost and notified"; on one SQLite node the next start is the one that finds it).
"""

from __future__ import annotations

import signal
from functools import partial

import pytest
import trio

from tests.support.http import read_request_head
from tests.support.node import connect, new_session
from tests.support.serve import serving, stop

TOKEN = "background-lost-token-0123456789"
#: a hang guard (real clock), not a promise: generous, so that a 2-core box at load 8 passes
WAIT = 60


class SilentServer:
    """A loopback HTTP server that reads a request and never answers it."""

    def __init__(self) -> None:
        self.asked = trio.Event()
        self.port = 0

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    async def _handle(self, stream: trio.SocketStream) -> None:
        if await read_request_head(stream) is not None:
            self.asked.set()
            await trio.sleep_forever()


@pytest.mark.slow
async def test_a_task_running_at_kill_9_is_lost_after_the_restart(tmp_path):
    db = str(tmp_path / "lost.db")
    config = tmp_path / "turnstile.toml"
    config.write_text('[modules.http]\nallowed_networks = ["127.0.0.0/8"]\n')
    async with trio.open_nursery() as nursery:
        server = SilentServer()
        await server.serve(nursery)
        url = f"http://127.0.0.1:{server.port}/slow"
        async with serving(db, TOKEN, "--config", str(config)) as (process, node):
            await new_session(node, "c", token=TOKEN)
            async with connect(node, TOKEN) as client:
                await client.send(
                    type="call",
                    id="bg",
                    session_id="c",
                    tool="background_run",
                    arguments={"name": "http.get", "params": {"url": url}},
                )
                started = await client.expect("result", id="bg")
                assert started["ok"] is True, started
                task_id = started["data"]["task_id"]
                with trio.fail_after(WAIT):
                    await server.asked.wait()  # the task is under way
                await stop(process, signal.SIGKILL)
            assert process.returncode == -signal.SIGKILL

        async with serving(db, TOKEN, "--config", str(config)) as (process, node):
            async with connect(node, TOKEN) as client:
                await client.send(type="attach", session_id="c", after_seq=0)
                notice = await client.expect(
                    lambda f: (
                        f.get("type") == "stream_start"
                        and "[BACKGROUND TASK FAILED]" in f.get("content", "")
                    )
                )
                head, error = notice["content"].split("\n")
                assert head.startswith(f"[BACKGROUND TASK FAILED] task_id={task_id}, tool=http.get")
                assert error == (
                    "Error: lost: node 'local' epoch 1 ended before the task finished (the node"
                    " started again as epoch 2)"
                )
                await client.send(
                    type="call",
                    id="st",
                    session_id="c",
                    tool="background_status",
                    arguments={"task_id": task_id},
                )
                assert (await client.expect("result", id="st"))["data"]["status"] == "lost"
                await client.expect("stream_end", input_id=notice["input_id"])
            async with node.http(TOKEN) as http:
                read = await http.get(f"/sessions/c/tasks/{task_id}")
                assert read.status_code == 200 and read.json()["status"] == "lost"
            async with connect(node, TOKEN) as client:
                await client.send(type="attach", session_id="c", after_seq=0)
                await client.expect("session_sync")
                told = [
                    f
                    for f in client.frames
                    if f.get("type") == "stream_start" and task_id in f.get("content", "")
                ]
                assert len(told) == 1  # told once
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_an_approval_waiting_at_kill_9_is_withdrawn_after_the_restart(tmp_path):
    """A tool call waits for a person when its node is killed: the call, and its turn, are
    gone, so after the restart the approval is no longer listed (it stayed until its timeout
    and a minute more before) and the session says ``approval_resolved`` ``cancelled``."""
    db = str(tmp_path / "approvals.db")
    config = tmp_path / "turnstile.toml"
    config.write_text('[policies]\n"echo" = "APPROVE"\n')
    async with serving(db, TOKEN, "--config", str(config)) as (process, node):
        await new_session(node, "c", token=TOKEN)
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="c")
            await client.expect("session_sync")
            await client.send(type="send", session_id="c", content='/call echo {"text": "x"}')
            asked = await client.expect("approval_required")
            approval_id = asked["approval_id"]
            async with node.http(TOKEN) as http:
                listed = (await http.get("/sessions/c/approvals")).json()["approvals"]
                assert [a["approval_id"] for a in listed] == [approval_id]
            await stop(process, signal.SIGKILL)

    async with serving(db, TOKEN, "--config", str(config)) as (process, node):
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="c", after_seq=0)
            resolved = await client.expect("approval_resolved", approval_id=approval_id)
            assert resolved["decision"] == "cancelled"
        async with node.http(TOKEN) as http:
            assert (await http.get("/sessions/c/approvals")).json()["approvals"] == []
            answered = await http.post(f"/approvals/{approval_id}/approve")
            assert answered.status_code == 404  # nothing waits for it any more
