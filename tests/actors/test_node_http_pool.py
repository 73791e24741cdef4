"""The node closes the http module's kept connections when it stops (issue 26 gave the module a
pool of connections kept alive per origin): a stopped node leaves no socket open to a site its
tools fetched from, rather than leaving them to the process's exit."""

from __future__ import annotations

from functools import partial

import trio

from tests.support.http import read_request_head
from turnstile.actors.config import Config
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.actors.settings import HttpModuleConfig, ModulesConfig

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


async def test_a_stopped_node_closes_the_connections_its_http_calls_kept(tmp_path):
    opened = 0
    closed = trio.Event()

    async def site(stream: trio.SocketStream) -> None:
        nonlocal opened
        opened += 1
        while await read_request_head(stream) is not None:  # keep-alive: one request after another
            await stream.send_all(OK)
        closed.set()  # the client hung up

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, site, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        config = Config(
            store=f"sqlite:///{tmp_path}/node.db",
            modules=ModulesConfig(http=HttpModuleConfig(allowed_hosts=["127.0.0.1"])),
        )
        async with open_node(config, agent=ScriptedAgent(), serve=False) as node:
            await node.directory.create_session("ada", session_id="s")
            for _ in range(2):
                result = await node.tools.call(
                    "ada/s", "ada", "http.get", {"url": f"http://127.0.0.1:{port}/"}
                )
                assert result.ok, result.error
                assert result.data["status_code"] == 200
            assert opened == 1  # the second call reused the kept connection
            assert not closed.is_set()  # and it is still open while the node runs
        with trio.fail_after(10):
            await closed.wait()  # the node's stop closed it
        nursery.cancel_scope.cancel()
