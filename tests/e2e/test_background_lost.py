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
from tests.support.serve import serving

TOKEN = "background-lost-token-0123456789"


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
                with trio.fail_after(20):
                    await server.asked.wait()  # the task is under way
                process.send_signal(signal.SIGKILL)
                with trio.fail_after(10):
                    await process.wait()
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
