"""hypercorn as a node serves it: several WebSocket messages in one socket write."""

from __future__ import annotations

import pytest
import trio
import trio_websocket
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import UnexpectedMessageError

from turnstile.runtime.server import WS_SEND_MANY, serve_app


async def _serving(nursery: trio.Nursery, app) -> str:
    (url,) = await nursery.start(
        lambda task_status: serve_app(
            app, host="127.0.0.1", port=0, max_frame_bytes=1 << 20, task_status=task_status
        )
    )
    return url.replace("http://", "ws://")


@pytest.fixture
def writes(monkeypatch) -> list[bytes]:
    """Every socket write the server makes (after wrapping hypercorn's send)."""
    seen: list[bytes] = []
    original = TCPServer.protocol_send

    async def counting(self, event):
        data = getattr(event, "data", None)
        if isinstance(data, bytes):
            seen.append(data)
        await original(self, event)

    monkeypatch.setattr(TCPServer, "protocol_send", counting)
    return seen


async def test_send_many_delivers_each_text_as_its_own_message_in_one_write(nursery, writes):
    texts = ['{"seq": 1}', '{"seq": 2}', "é" * 200, '{"seq": 4}']
    sent = trio.Event()
    writes_for_them: list[int] = []

    async def app(scope, receive, send):
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        writes.clear()
        await send({"type": WS_SEND_MANY, "texts": texts})
        writes_for_them.append(len(writes))
        sent.set()
        while (await receive())["type"] != "websocket.disconnect":
            pass

    url = await _serving(nursery, app)
    async with trio_websocket.open_websocket_url(url + "/") as ws:
        received = [await ws.get_message() for _ in texts]
        await sent.wait()
    assert received == texts
    assert writes_for_them == [1]


async def test_send_many_before_accept_is_refused_and_after_close_is_quiet(nursery):
    outcomes: list[str] = []
    done = trio.Event()

    async def app(scope, receive, send):
        await receive()
        try:
            await send({"type": WS_SEND_MANY, "texts": ["too early"]})
        except UnexpectedMessageError:
            outcomes.append("refused before accept")
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass
        await send({"type": WS_SEND_MANY, "texts": ["too late"]})  # the client is gone
        outcomes.append("quiet after close")
        done.set()

    url = await _serving(nursery, app)
    async with trio_websocket.open_websocket_url(url + "/"):
        pass
    await done.wait()
    assert outcomes == ["refused before accept", "quiet after close"]
