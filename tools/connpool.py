"""Keep-alive HTTP/1.1 connections per origin, each lent to one request at a time.

``KeepAlivePool`` replaces ``httpcore.AsyncConnectionPool`` under ``GuardedTransport``
(``tools.netguard``). httpcore's pool hands requests to connections through a shared queue:
every request that finishes re-runs an assignment over all queued requests and connections,
several queued requests can be given the same idle connection (all but one then fail with
``ConnectionNotAvailable`` and go round again: three retries per request measured at 16 calls
at once, issue 26), and a request cancelled at the wrong moment can leave a connection that
never leaves the pool's slot count (encode/httpcore#1093). ``http.get`` runs under cancel
scopes (the call's ``timeout``, a watcher's check timeout, a node's shutdown), so the pool here
has no queue and no slots to lose:

* A request takes the most recently used idle connection to its origin (scheme, host, port)
  that is still usable, or opens a new one through the network backend it was given — for
  ``GuardedTransport`` that is ``GuardedBackend``, so every new connection is vetted.
* While the request and its response are in use, the connection belongs to them alone; it is
  not in the pool. When the response is closed, a connection h11 left idle goes back (newest
  last); anything else — an error, a cancellation, a body not read to the end, a server's
  ``Connection: close`` — leaves it closed by httpcore and forgotten here. A response nobody
  closes keeps its connection out of the pool, and costs the pool nothing.
* Idle connections are bounded per origin (``max_idle_per_origin``) and overall
  (``max_idle``; the oldest goes first), and closed after ``keepalive_expiry`` seconds idle,
  measured on trio's clock (so ``MockClock`` drives it). One the server closed while idle is
  noticed when taken (its socket is readable) and replaced.

How many requests run at once is not the pool's business: its callers bound that (the http
module's ``max_concurrency``).
"""

from __future__ import annotations

import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpcore
import trio

__all__ = ["KeepAlivePool", "PoolStatistics"]

#: Seconds a shielded close of a connection may take (a TLS close_notify to a dead peer).
CLOSE_SECONDS = 1.0

#: (scheme, host, port) of a request.
OriginKey = tuple[bytes, bytes, int]


@dataclass(frozen=True)
class PoolStatistics:
    """A snapshot of a ``KeepAlivePool``.

    Attributes:
        idle: connections waiting for their next request.
        in_use: requests sent whose response is not closed yet.
        opened: connections opened since the pool was made.
        reused: requests sent on a connection that had served one before.
    """

    idle: int
    in_use: int
    opened: int
    reused: int


class KeepAlivePool:
    """Idle HTTP/1.1 connections kept per origin for the next request (see the module
    docstring).

    Args:
        network_backend: opens connections (``GuardedBackend`` under ``GuardedTransport``).
        ssl_context: TLS settings of https connections.
        keepalive_expiry: seconds an idle connection is kept (0: none is kept).
        max_idle_per_origin: idle connections kept per origin.
        max_idle: idle connections kept in all.

    Raises:
        ValueError: a negative bound.
    """

    def __init__(
        self,
        network_backend: httpcore.AsyncNetworkBackend,
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_expiry: float = 30.0,
        max_idle_per_origin: int = 16,
        max_idle: int = 100,
    ) -> None:
        if keepalive_expiry < 0 or max_idle_per_origin < 0 or max_idle < 0:
            raise ValueError("keepalive_expiry, max_idle_per_origin and max_idle must be >= 0")
        self._backend = network_backend
        self._ssl_context = ssl_context
        self._expiry = keepalive_expiry
        self._max_per_origin = max_idle_per_origin if keepalive_expiry > 0 else 0
        self._max_idle = max_idle if keepalive_expiry > 0 else 0
        #: idle connections per origin, oldest first (a request takes the newest)
        self._idle: dict[OriginKey, list[httpcore.AsyncHTTPConnection]] = {}
        #: every idle connection, oldest first: its origin and since when it is idle
        self._since: OrderedDict[httpcore.AsyncHTTPConnection, tuple[OriginKey, float]] = (
            OrderedDict()
        )
        self._in_use = 0
        self._opened = 0
        self._reused = 0
        self._closed = False

    def statistics(self) -> PoolStatistics:
        """The pool's counts now."""
        return PoolStatistics(len(self._since), self._in_use, self._opened, self._reused)

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        """Send ``request`` on an idle connection to its origin, or on a new one.

        Returns:
            the response; closing its stream gives the connection back.

        Raises:
            httpcore.UnsupportedProtocol: the pool is closed.
            httpcore errors of the connection (connect, read, write, protocol).
        """
        if self._closed:
            raise httpcore.UnsupportedProtocol("the connection pool is closed")
        url = request.url
        key: OriginKey = (url.scheme, url.host, url.port or (443 if url.scheme == b"https" else 80))
        connection, stale = self._take(key)
        if stale:
            await _close_all(stale)
        if connection is None:
            connection = httpcore.AsyncHTTPConnection(
                url.origin,
                ssl_context=self._ssl_context,
                http1=True,
                http2=False,
                network_backend=self._backend,
            )
            self._opened += 1
        else:
            self._reused += 1
        self._in_use += 1
        try:
            response = await connection.handle_async_request(request)
        except BaseException:
            self._in_use -= 1
            await _close_all([connection])  # httpcore closed it already; never pooled again
            raise
        response.stream = _Lent(self, key, connection, response.stream)
        return response

    def _take(
        self, key: OriginKey
    ) -> tuple[httpcore.AsyncHTTPConnection | None, list[httpcore.AsyncHTTPConnection]]:
        """The newest usable idle connection to ``key`` (or None), and the unusable ones met
        on the way, for the caller to close."""
        stale: list[httpcore.AsyncHTTPConnection] = []
        idle = self._idle.get(key)
        now = trio.current_time()
        while idle:
            connection = idle.pop()
            _origin, since = self._since.pop(connection)
            if now - since > self._expiry or not connection.is_idle() or connection.has_expired():
                stale.append(connection)  # expired, or the server closed it meanwhile
                continue
            return connection, stale
        if idle is not None:
            del self._idle[key]
        return None, stale

    async def _give_back(self, key: OriginKey, connection: httpcore.AsyncHTTPConnection) -> None:
        """A response is closed: keep its connection if h11 left it idle; close what the
        bounds and expiry push out."""
        self._in_use -= 1
        if self._closed or self._max_per_origin == 0 or not connection.is_idle():
            await _close_all([connection])
            return
        now = trio.current_time()
        idle = self._idle.setdefault(key, [])
        idle.append(connection)
        self._since[connection] = (key, now)
        out: list[httpcore.AsyncHTTPConnection] = []
        if len(idle) > self._max_per_origin:
            oldest = idle.pop(0)
            del self._since[oldest]
            out.append(oldest)
        while self._since:
            oldest, (origin, since) = next(iter(self._since.items()))
            if len(self._since) <= self._max_idle and now - since <= self._expiry:
                break
            del self._since[oldest]
            self._idle[origin].remove(oldest)  # its origin's oldest: index 0
            if not self._idle[origin]:
                del self._idle[origin]
            out.append(oldest)
        if out:
            await _close_all(out)

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when their responses do."""
        self._closed = True
        idle = list(self._since)
        self._idle.clear()
        self._since.clear()
        await _close_all(idle)


async def _close_all(connections: list[httpcore.AsyncHTTPConnection]) -> None:
    with trio.move_on_after(CLOSE_SECONDS, shield=True):
        for connection in connections:
            await connection.aclose()


class _Lent:
    """A response's body; closing it gives the connection back to the pool (once)."""

    def __init__(
        self,
        pool: KeepAlivePool,
        key: OriginKey,
        connection: httpcore.AsyncHTTPConnection,
        stream: Any,
    ) -> None:
        self._pool = pool
        self._key = key
        self._connection: httpcore.AsyncHTTPConnection | None = connection
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._stream:  # httpcore closes the response itself on an error
            yield part

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            # h11's end of the cycle: idle, or closed. Not shielded: cancelled here, the
            # connection is left mid-cycle, and _give_back closes it instead of keeping it.
            await self._stream.aclose()
        finally:
            await self._pool._give_back(self._key, connection)
