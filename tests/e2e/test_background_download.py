"""``http.download`` is a background action (execution-primitives reference): approved once,
answered at once with a task id, and the session is told when the file is in place."""

from __future__ import annotations

from functools import partial

import trio

from tests.support.http import read_request_head
from tests.support.node import connect, new_session, running_node
from turnstile.actors.config import FilesystemModuleConfig, HttpModuleConfig, ModulesConfig

BODY = b"x" * 5000


class GatedFileServer:
    """A loopback HTTP server whose answer waits until the test opens ``gate``."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.requests = 0
        self.port = 0

    async def serve(self, nursery: trio.Nursery) -> None:
        listeners = await nursery.start(partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]

    async def _handle(self, stream: trio.SocketStream) -> None:
        if await read_request_head(stream) is None:
            return
        self.requests += 1
        await self.gate.wait()
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(BODY)}\r\nConnection: close\r\n\r\n"
        await stream.send_all(head.encode() + BODY)
        await stream.aclose()


async def test_a_download_runs_in_the_background_and_notifies_the_session(tmp_path):
    modules = ModulesConfig(
        http=HttpModuleConfig(allowed_networks=["127.0.0.0/8"]),
        filesystem=FilesystemModuleConfig(root=str(tmp_path / "ws")),
    )
    async with trio.open_nursery() as nursery:
        server = GatedFileServer()
        await server.serve(nursery)
        url = f"http://127.0.0.1:{server.port}/big.zip"
        async with running_node(tmp_path, modules=modules) as node:
            await new_session(node, "dl")
            async with connect(node) as client:
                await client.send(type="attach", session_id="dl")
                await client.expect("session_sync")
                await client.send(
                    type="call",
                    id="d",
                    session_id="dl",
                    tool="http.download",
                    arguments={"url": url, "destination": "in/big.zip", "create_parents": True},
                )
                asked = await client.expect("approval_required", tool="http.download")
                await client.send(type="approve", session_id="dl", approval_id=asked["approval_id"])
                started = await client.expect("result", id="d")
                # Answered while the server still holds the body: the download is a task.
                assert started["ok"] is True, started
                assert started["data"]["tool_name"] == "http.download"
                assert started["data"]["status"] == "running"
                task_id = started["data"]["task_id"]
                assert not (tmp_path / "ws" / "in" / "big.zip").exists()
                server.gate.set()
                notice = await client.expect(
                    lambda f: (
                        f.get("type") == "stream_start"
                        and "[BACKGROUND TASK COMPLETED]" in f.get("content", "")
                    )
                )
                assert f"task_id={task_id}" in notice["content"]
                assert "tool=http.download" in notice["content"]
                await client.send(
                    type="call",
                    id="r",
                    session_id="dl",
                    tool="background_result",
                    arguments={"task_id": task_id},
                )
                result = (await client.expect("result", id="r"))["data"]
                assert result["status"] == "completed"
                assert result["result"]["data"]["bytes"] == len(BODY)
            assert (tmp_path / "ws" / "in" / "big.zip").read_bytes() == BODY
            async with node.http() as http:
                # Approved once: the task did not ask again.
                assert (await http.get("/sessions/dl/approvals")).json()["approvals"] == []
            assert server.requests == 1
        nursery.cancel_scope.cancel()
