"""A TCP proxy under the test's control, between a node and its database (trio).

    async with open_tcp_proxy("127.0.0.1", 5432) as proxy:
        url = proxy.rewrite(store_url)      # the node connects through the proxy
        await proxy.cut()                   # refuse new connections, reset the open ones
        proxy.heal()                        # everything passes again

Faults, each until ``heal()`` (or another fault):

* ``cut()``: the listening socket is closed (a connect is refused) and every open connection
  is reset (RST to both ends).
* ``stall()``: connections are accepted and kept, but no byte passes either way.
* ``slow(delay)``: every chunk waits ``delay`` seconds before it is passed on.
* ``half_open(direction)``: the bytes of one direction (``"up"``: to the database; ``"down"``:
  to the node) are read and dropped, the other direction passes.
* ``reset()``: every open connection is reset now (RST to both ends: the database rolls back
  what was in flight); new connections pass.

``statistics()`` counts connections accepted and open. No sleeping to synchronise: a fault
takes effect before the call returns (a stalled or dropping pump holds or drops the very next
chunk).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import trio

__all__ = ["Mode", "ProxyStatistics", "TcpProxy", "open_tcp_proxy"]

Mode = Literal["pass", "cut", "stall", "slow", "half_open"]
Direction = Literal["up", "down"]


@dataclass(frozen=True)
class ProxyStatistics:
    mode: Mode
    accepted: int
    open: int
    #: chunks read and held by a stall, not passed on yet
    held: int


class _Link:
    """One proxied connection: the node's stream, the database's, and their pumps' scope."""

    def __init__(self, client: trio.SocketStream) -> None:
        self.client = client
        self.server: trio.SocketStream | None = None
        self.scope = trio.CancelScope()


def _abort(stream: trio.SocketStream | None) -> None:
    """Close ``stream`` with an RST rather than a FIN (SO_LINGER 0)."""
    if stream is None:
        return
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()


class TcpProxy:
    """See the module docstring. Made by :func:`open_tcp_proxy`."""

    def __init__(self, nursery: trio.Nursery, host: str, target: tuple[str, int]) -> None:
        self._nursery = nursery
        self.host = host
        self.port = 0
        self._target = target
        self._mode: Mode = "pass"
        self._delay = 0.0
        self._dropping: Direction | None = None
        self._changed = trio.Event()
        self._links: set[_Link] = set()
        self._listening: trio.CancelScope | None = None
        self._accepted = 0
        self._held = 0

    # ---- faults ----

    async def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        self._set("cut")
        if self._listening is not None:
            self._listening.cancel()
            self._listening = None
        self._reset_all()
        await trio.lowlevel.checkpoint()

    def stall(self) -> None:
        """Accept and keep connections, pass nothing."""
        self._set("stall")

    def slow(self, delay: float) -> None:
        """Pass every chunk ``delay`` seconds late."""
        if delay < 0:
            raise ValueError("delay must be >= 0")
        self._delay = delay
        self._set("slow")

    def half_open(self, direction: Direction) -> None:
        """Drop every byte going ``direction`` (``up``: to the database), pass the others."""
        if direction not in ("up", "down"):
            raise ValueError("direction must be 'up' or 'down'")
        self._dropping = direction
        self._set("half_open")

    def reset(self) -> None:
        """Reset every open connection now (RST both ways); new ones pass."""
        self._reset_all()

    def heal(self) -> None:
        """Pass everything again (listening again after a cut, on the same port)."""
        self._set("pass")
        if self._listening is None:
            self._listen_on(self.port)

    def statistics(self) -> ProxyStatistics:
        return ProxyStatistics(
            mode=self._mode, accepted=self._accepted, open=len(self._links), held=self._held
        )

    def rewrite(self, url: str) -> str:
        """``url`` (``postgresql://user@host:port/db?...``) pointed at this proxy."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{self.host}:{self.port}"))

    # ---- inside ----

    def _set(self, mode: Mode) -> None:
        self._mode = mode
        self._changed.set()
        self._changed = trio.Event()

    def _reset_all(self) -> None:
        links, self._links = self._links, set()
        for link in links:
            link.scope.cancel()
            _abort(link.client)
            _abort(link.server)

    def _listen_on(self, port: int) -> None:
        # bound synchronously, so that the port is known (or refused as taken) on return
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        raw.bind((self.host, port))
        raw.listen(128)
        self.port = raw.getsockname()[1]
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(raw))
        scope = trio.CancelScope()
        self._listening = scope
        self._nursery.start_soon(self._accept_loop, listener, scope, name="tcp proxy accept")

    async def _accept_loop(self, listener: trio.SocketListener, scope: trio.CancelScope) -> None:
        with scope:
            try:
                while True:
                    client = await listener.accept()
                    self._accepted += 1
                    self._nursery.start_soon(self._serve, client, name="tcp proxy link")
            finally:
                listener.socket.close()

    async def _serve(self, client: trio.SocketStream) -> None:
        link = _Link(client)
        self._links.add(link)
        with link.scope:
            try:
                link.server = await trio.open_tcp_stream(*self._target)
            except OSError:
                _abort(client)
                self._links.discard(link)
                return
            try:
                async with trio.open_nursery() as pumps:
                    pumps.start_soon(self._pump, link, client, link.server, "up")
                    pumps.start_soon(self._pump, link, link.server, client, "down")
            finally:
                self._links.discard(link)
                _abort(link.client)
                _abort(link.server)

    async def _pump(
        self, link: _Link, src: trio.SocketStream, dst: trio.SocketStream, way: Direction
    ) -> None:
        """Pass ``src``'s bytes to ``dst`` as the mode allows; when either end closes or
        fails, the link ends (both ends reset)."""
        try:
            while data := await src.receive_some(65536):
                if self._mode == "stall":
                    self._held += 1
                    try:
                        while self._mode == "stall":
                            await self._changed.wait()
                    finally:
                        self._held -= 1
                if self._mode == "half_open" and self._dropping == way:
                    continue
                if self._mode == "slow":
                    await trio.sleep(self._delay)
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        link.scope.cancel()


@asynccontextmanager
async def open_tcp_proxy(
    target_host: str, target_port: int, *, host: str = "127.0.0.1"
) -> AsyncIterator[TcpProxy]:
    """A proxy on ``host`` (a free port: ``proxy.port``) to ``target_host:target_port``."""
    async with trio.open_nursery() as nursery:
        proxy = TcpProxy(nursery, host, (target_host, target_port))
        proxy._listen_on(0)
        try:
            yield proxy
        finally:
            if proxy._listening is not None:
                proxy._listening.cancel()
            proxy._reset_all()
            nursery.cancel_scope.cancel()
