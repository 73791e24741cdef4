"""``KeepAlivePool``: connections kept per origin, and cancellation at any point of a request
leaving the pool usable (issue 26: httpcore's pool could lose a slot to a cancelled request,
encode/httpcore#1093, and handed one idle connection to several waiting requests at once).

The network is in memory (``trio.testing.memory_stream_pair``) with a small HTTP/1.1 server
on the other end of each connection, and time is ``MockClock``'s, so every delay is exact.
"""

from __future__ import annotations

import httpcore
import pytest
import trio
import trio.testing

from turnstile.tools.connpool import KeepAlivePool, PoolStatistics


class MemoryStream(httpcore.AsyncNetworkStream):
    """httpcore's view of one end of an in-memory connection."""

    def __init__(self, stream: trio.testing.MemoryStapledStream, peer_closed: trio.Event):
        self._stream = stream
        self._peer_closed = peer_closed

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return await self._stream.receive_some(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._stream.send_all(buffer)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def get_extra_info(self, info: str):
        # a socket whose peer closed it reads as readable (the EOF): what httpcore looks at
        return self._peer_closed.is_set() if info == "is_readable" else None


class Site(httpcore.AsyncNetworkBackend):
    """Every connection gets a server task in ``nursery``. Paths: ``/slow`` answers after
    10 s, ``/big`` sends 10 chunks 1 s apart, ``/close`` answers with ``Connection: close``;
    anything else answers at once. Each body names the request's path and its connection."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.connections = 0
        self.closed = 0
        self.peers: list[trio.Event] = []

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # noqa: ASYNC109
        await trio.sleep(0.01)  # connecting takes a moment (a cancel can land in it)
        client, server = trio.testing.memory_stream_pair()
        self.connections += 1
        peer_closed = trio.Event()
        self.peers.append(peer_closed)
        self.nursery.start_soon(self._serve, server, self.connections, peer_closed)
        return MemoryStream(client, peer_closed)

    async def _serve(self, stream, number: int, peer_closed: trio.Event) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                path = head.split(b" ")[1]
                body = b"%s on %d" % (path, number)
                if path == b"/slow":
                    await trio.sleep(10)
                if path == b"/big":
                    await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")
                    for _ in range(10):
                        await trio.sleep(1)
                        await stream.send_all(b"x")
                    continue
                close = path == b"/close"
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s"
                    % (len(body), b"connection: close\r\n" if close else b"", body)
                )
                if close:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed += 1
            peer_closed.set()
            await stream.aclose()

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


async def get(pool: KeepAlivePool, path: str, host: str = "a.example") -> bytes:
    request = httpcore.Request("GET", f"http://{host}{path}", headers=[(b"host", host)])
    response = await pool.handle_async_request(request)
    try:
        return b"".join([part async for part in response.stream])
    finally:
        await response.stream.aclose()


async def test_a_connection_is_kept_per_origin_and_reused(nursery, autojump_clock):
    site = Site(nursery)
    pool = KeepAlivePool(site)
    assert await get(pool, "/one") == b"/one on 1"
    assert await get(pool, "/two") == b"/two on 1"  # the same connection
    assert await get(pool, "/three", host="b.example") == b"/three on 2"  # another origin
    assert pool.statistics() == PoolStatistics(idle=2, in_use=0, opened=2, reused=1)
    await pool.aclose()
    await trio.testing.wait_all_tasks_blocked()
    assert site.closed == 2
    with pytest.raises(httpcore.UnsupportedProtocol, match="the connection pool is closed"):
        await get(pool, "/late")


async def test_idle_connections_are_bounded_per_origin_and_expire(nursery, autojump_clock):
    site = Site(nursery)
    pool = KeepAlivePool(site, max_idle_per_origin=2, keepalive_expiry=30)
    async with trio.open_nursery() as calls:
        for k in range(3):
            calls.start_soon(get, pool, f"/{k}")
    assert (site.connections, pool.statistics().idle) == (3, 2)  # the third was closed
    await trio.sleep(29)
    assert await get(pool, "/warm") in (b"/warm on 1", b"/warm on 2", b"/warm on 3")
    assert site.connections == 3  # one of the two kept, not a new one
    await trio.sleep(31)  # every idle connection is older than 30 s now
    assert await get(pool, "/cold") == b"/cold on 4"
    await trio.testing.wait_all_tasks_blocked()
    assert (site.closed, pool.statistics().idle) == (3, 1)


async def test_a_connection_the_server_closed_is_not_reused(nursery, autojump_clock):
    site = Site(nursery)
    pool = KeepAlivePool(site)
    assert await get(pool, "/close") == b"/close on 1"  # Connection: close: not kept
    assert await get(pool, "/next") == b"/next on 2"
    site.peers[1].set()  # as if the server had hung up on the idle connection
    assert await get(pool, "/after") == b"/after on 3"
    assert pool.statistics().opened == 3


async def test_a_body_left_unread_closes_its_connection(nursery, autojump_clock):
    site = Site(nursery)
    pool = KeepAlivePool(site)
    response = await pool.handle_async_request(
        httpcore.Request("GET", "http://a.example/big", headers=[(b"host", b"a.example")])
    )
    await response.stream.aclose()  # after the head, before the body
    assert await get(pool, "/next") == b"/next on 2"
    assert pool.statistics() == PoolStatistics(idle=1, in_use=0, opened=2, reused=0)


async def test_a_response_closed_under_cancellation_is_not_kept(nursery, autojump_clock):
    site = Site(nursery)
    pool = KeepAlivePool(site)
    response = await pool.handle_async_request(
        httpcore.Request("GET", "http://a.example/one", headers=[(b"host", b"a.example")])
    )
    assert b"".join([part async for part in response.stream]) == b"/one on 1"
    with trio.CancelScope() as scope:
        scope.cancel()
        await response.stream.aclose()  # h11 cannot finish its cycle: the connection goes
    await trio.testing.wait_all_tasks_blocked()
    assert (pool.statistics(), site.closed) == (PoolStatistics(0, 0, 1, 0), 1)


@pytest.mark.parametrize("path", ["/slow", "/big", "/fast"])
async def test_cancelled_requests_leave_the_pool_usable(nursery, autojump_clock, path):
    """Fifty requests, each cancelled at its own moment: while connecting, waiting for the
    head, or reading the body (``/big``) — or not at all for the quickest. Afterwards nothing
    is in use, only connections h11 left idle are kept, and the next requests run, each on a
    connection of its own answering its own request (none inherits another's answer)."""
    site = Site(nursery)
    pool = KeepAlivePool(site)

    async def cancelled(k: int) -> None:
        with trio.move_on_after(0.002 * k):  # 0 to 98 ms: connect takes 10 ms
            await get(pool, path if path != "/fast" else f"/fast{k}")

    async with trio.open_nursery() as calls:
        for k in range(50):
            calls.start_soon(cancelled, k)
    await trio.testing.wait_all_tasks_blocked()
    stats = pool.statistics()
    assert stats.in_use == 0
    assert stats.idle == (16 if path == "/fast" else 0)  # slow ones were all cut mid-exchange
    async with trio.open_nursery() as calls:
        for k in range(20):
            calls.start_soon(_expect_own_answer, pool, k)
    assert pool.statistics().in_use == 0


async def _expect_own_answer(pool: KeepAlivePool, k: int) -> None:
    answer = await get(pool, f"/again{k}")
    assert answer.startswith(b"/again%d on " % k), answer
