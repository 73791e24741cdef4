"""``http.download`` is a background action (execution-primitives reference): approved once,
answered at once with a task id, and the session is told when the file is in place."""

from __future__ import annotations

from functools import partial

import trio

from tests.support.http import read_request_head
from tests.support.node import ALICE, new_session, running_node
from turnstile.actors.config import FilesystemModuleConfig, HttpModuleConfig, ModulesConfig
from turnstile.client import ApprovalRequired, SessionStream, StreamStart, open_client

BODY = b"x" * 5000


async def next_data(stream: SessionStream, kind: type, matches=lambda data: True):
    """The data of the stream's next event that is a ``kind`` and ``matches``."""
    async for event in stream:
        if isinstance(event.data, kind) and matches(event.data):
            return event.data
    raise AssertionError(f"the stream ended before a {kind.__name__}")


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
            async with open_client(node.url, ALICE) as client, client.attach("dl") as stream:
                calls: list = []

                async def download() -> None:
                    arguments = {"url": url, "destination": "in/big.zip", "create_parents": True}
                    calls.append(await stream.call("http.download", arguments))

                async with trio.open_nursery() as calling:
                    calling.start_soon(download)  # it waits for the approval
                    asked = await next_data(stream, ApprovalRequired)
                    assert asked.tool == "http.download"
                    await stream.approve(asked.approval_id)
                (started,) = calls
                # Answered while the server still holds the body: the download is a task.
                assert started["tool_name"] == "http.download"
                assert started["status"] == "running"
                task_id = started["task_id"]
                assert not (tmp_path / "ws" / "in" / "big.zip").exists()
                server.gate.set()
                notice = await next_data(
                    stream, StreamStart, lambda s: "[BACKGROUND TASK COMPLETED]" in s.content
                )
                assert f"task_id={task_id}" in notice.content
                assert "tool=http.download" in notice.content
                result = await stream.call("background_result", {"task_id": task_id})
                assert result["status"] == "completed"
                assert result["result"]["data"]["bytes"] == len(BODY)
            assert (tmp_path / "ws" / "in" / "big.zip").read_bytes() == BODY
            async with node.http() as http:
                # Approved once: the task did not ask again.
                assert (await http.get("/sessions/dl/approvals")).json()["approvals"] == []
            assert server.requests == 1
        nursery.cancel_scope.cancel()
