"""A client that stops reading can neither stall other clients nor hang a shutdown."""

from __future__ import annotations

import socket

import trio
import wsproto
import wsproto.events as ws_events

from tests.support.node import ALICE, connect, new_session, running_node
from turnstile.runtime import server


async def stalled_client(port: int):
    """Attach over a raw socket with a tiny receive buffer, then never read again."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    request = ws_events.Request(
        host="127.0.0.1",
        target="/ws",
        extra_headers=[(b"authorization", f"Bearer {ALICE}".encode())],
    )
    await stream.send_all(ws.send(request))
    ws.receive_data(await stream.receive_some(65536))
    assert isinstance(next(ws.events()), ws_events.AcceptConnection)
    await stream.send_all(ws.send(ws_events.TextMessage('{"type":"attach","session_id":"s"}')))
    return stream


async def test_a_node_shuts_down_promptly_with_a_client_that_stopped_reading(tmp_path, monkeypatch):
    # short, so that the test is; not shorter: the deadline holds for every client, and the
    # watcher below, which reads, must not look stalled when a loaded box starves it (at 0.5 s
    # it was dropped at load 8)
    monkeypatch.setattr(server, "SEND_DEADLINE", 2.0)
    async with running_node(tmp_path) as node:
        await new_session(node, "s")
        stream = await stalled_client(int(node.url.rsplit(":", 1)[1]))
        async with connect(node) as watcher:
            await watcher.send(type="attach", session_id="s")
            await watcher.expect("session_sync")
            async with node.http() as http:  # far more event bytes than the stalled socket takes
                words = " ".join(["w"] * 3000)
                assert (
                    await http.post("/sessions/s/messages", json={"content": words})
                ).status_code == 202
            end = await watcher.expect("stream_end")  # the others are not held up
            assert end["status"] == "completed"
        started = trio.current_time()
    # leaving running_node cancelled the node: before the send deadline this never returned
    # (a generous bound, for a loaded box: what it tells apart is "returns" from "hangs")
    assert trio.current_time() - started < 30
    del stream
