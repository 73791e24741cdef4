"""Slow clients cannot hold a connection open: a request head or body that trickles in is cut
off after ``[limits] header_timeout_seconds`` / ``body_timeout_seconds``.

These talk raw HTTP/1.1 over a real socket to a real served node, so they run on the real
clock (MockClock cannot drive a socket): the limits are tiny and every wait is bounded.
"""

from __future__ import annotations

import json

import trio

from tests.support.node import ALICE, new_session, running_node
from turnstile.actors.config import Limits

LIMIT = 0.5  # seconds, for both timeouts
#: no test waits longer than this for the server to act: a hang guard, generous for a loaded
#: box (the server acts right after LIMIT; when it does is not what the tests are about)
BOUND = 20.0


async def _open(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def _trickle_until_closed(stream: trio.SocketStream, drip: bytes) -> tuple[bytes, float]:
    """Send ``drip`` every 0.1 s while reading; return what the server sent before it closed
    the connection, and how long that took."""
    received = bytearray()
    started = trio.current_time()

    async def drip_forever() -> None:
        while True:
            await trio.sleep(0.1)
            try:
                await stream.send_all(drip)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drip_forever)
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    chunk = b""
                if not chunk:
                    break
                received += chunk
            nursery.cancel_scope.cancel()
    return bytes(received), trio.current_time() - started


async def test_a_slow_body_is_answered_408_and_the_connection_closed(tmp_path):
    limits = Limits(body_timeout_seconds=LIMIT, header_timeout_seconds=BOUND * 2)
    async with running_node(tmp_path, limits=limits) as node:
        await new_session(node, "s1")
        stream = await _open(node.url)
        head = (
            "POST /sessions/s1/messages HTTP/1.1\r\n"
            "Host: node\r\n"
            f"Authorization: Bearer {ALICE}\r\n"
            "Content-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n"
            '{"content": "'
        )
        await stream.send_all(head.encode())
        received, took = await _trickle_until_closed(stream, b"a")
    status, _, rest = received.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 "
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"connection: close" in headers.lower()
    assert json.loads(body) == {
        "error": {
            "code": "request_timeout",
            "message": "the request body did not arrive within 0.5 s",
        }
    }
    assert LIMIT <= took < BOUND


async def test_slow_headers_are_cut_off(tmp_path):
    limits = Limits(header_timeout_seconds=LIMIT)
    async with running_node(tmp_path, limits=limits) as node:
        stream = await _open(node.url)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n")
        received, took = await _trickle_until_closed(stream, b"X-Slow: 1\r\n")
    assert received == b""  # closed without an answer: nothing was asked yet
    assert LIMIT <= took < BOUND


async def test_a_body_over_the_limit_is_refused_before_it_is_read(tmp_path):
    limits = Limits(max_frame_bytes=1024, body_timeout_seconds=BOUND * 2)
    async with running_node(tmp_path, limits=limits) as node:
        await new_session(node, "s1")
        stream = await _open(node.url)
        head = (
            "POST /sessions/s1/messages HTTP/1.1\r\n"
            "Host: node\r\n"
            f"Authorization: Bearer {ALICE}\r\n"
            "Content-Length: 100000000\r\n\r\n"
        )
        await stream.send_all(head.encode())
        received = b""
        with trio.fail_after(BOUND):  # answered at once, without waiting for 100 MB
            while not received.endswith(b"}}"):
                received += await stream.receive_some(65536)
        await stream.aclose()
    status, _, rest = received.partition(b"\r\n")
    assert status == b"HTTP/1.1 400 "
    assert json.loads(rest.partition(b"\r\n\r\n")[2]) == {
        "error": {"code": "bad_message", "message": "body is larger than 1024 bytes"}
    }
