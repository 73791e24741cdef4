"""The guard proxy: where MCP servers' network traffic goes, through the SSRF guard.

An MCP server makes its own requests (``mcp-server-fetch`` fetches any URL it is given and
follows redirects), so checking a tool's arguments could not stop a public URL that redirects
to ``169.254.169.254``. Instead every stdio server with ``egress = "guarded"`` (the default)
gets ``HTTP_PROXY``, ``HTTPS_PROXY`` and ``ALL_PROXY`` (and their lower-case twins) pointing at
this proxy, and the node's own client for a streamable HTTP server uses it too. The proxy is an
HTTP forward proxy on loopback, one per node:

* ``CONNECT host:port`` (HTTPS) and absolute-form requests (``GET http://host/path``) are
  accepted; anything else is ``400``;
* the host is resolved once, **every** address must pass the guard
  (``tools.netguard.NetPolicy``: no loopback, private, link-local, … unless ``[mcp]
  allowed_hosts`` / ``allowed_networks`` open it), and the connection goes to the vetted
  address, so DNS rebinding has nothing to exploit; each redirect the server follows is a new
  request through the proxy, vetted the same way;
* a refused destination is ``403`` with the guard's reason in the body, which the server
  reports as its tool's error.

The variables are a request, not a wall: a server that ignores them connects directly.
docs/security.md says how to hold such a server (a network namespace without a route).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import trio

from turnstile.tools.netguard import BlockedAddress, NetPolicy, Resolver, resolve_host

__all__ = ["GuardProxy", "proxy_environment"]

log = logging.getLogger("turnstile.mcp")

MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT = 10.0
CONNECT_TIMEOUT = 10.0


def proxy_environment(proxy_url: str) -> dict[str, str]:
    """The variables that send a server's HTTP(S) traffic to ``proxy_url``."""
    names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    env = {name: proxy_url for name in names}
    env.update({name.lower(): proxy_url for name in names})
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class GuardProxy:
    """An HTTP forward proxy on loopback that lets through only what the guard allows.

    Args:
        policy: destinations allowed besides the public internet.
        resolver: host name -> addresses (``netguard.resolve_host``; injectable for tests).
        connect: opens a TCP stream to a vetted IP literal (``trio.open_tcp_stream``).
    """

    def __init__(
        self,
        policy: NetPolicy,
        resolver: Resolver | None = None,
        connect: Callable[[str, int], Any] | None = None,
    ) -> None:
        self.policy = policy
        self.resolver = resolver or resolve_host
        self.connect = connect or trio.open_tcp_stream
        self.url: str | None = None
        #: destinations refused so far, newest last (at most 100): ``(host, reason)``.
        self.refused: list[tuple[str, str]] = []

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 (any free port) and serve until cancelled; ``started`` with
        the proxy's URL."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        task_status.started(self.url)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        try:
            await self._serve_one(client)
        except Exception:  # one connection's trouble never stops the proxy
            log.exception("mcp guard proxy: a connection failed")

    async def _serve_one(self, client: trio.SocketStream) -> None:
        async with client:
            try:
                with trio.fail_after(HEAD_TIMEOUT):
                    head, rest = await _read_head(client)
                upstream, preface = await self._open(head)
            except _Refused as exc:
                await _answer(client, exc.status, str(exc))
                return
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            async with upstream:
                try:
                    if preface is None:  # CONNECT: the tunnel is open
                        await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    else:
                        await upstream.send_all(preface)
                    if rest:
                        await upstream.send_all(rest)
                    await _splice(client, upstream)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return

    async def _open(self, head: bytes) -> tuple[trio.SocketStream, bytes | None]:
        """The upstream connection for a request head, and what to send first on it (None
        for a CONNECT tunnel)."""
        try:
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
        except ValueError:
            raise _Refused(400, "not an HTTP request") from None
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            host = host.strip("[]")
            if not host or not port_text.isdigit():
                raise _Refused(400, "CONNECT needs host:port")
            return await self._connect(host, int(port_text)), None
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            raise _Refused(400, "only CONNECT and absolute http:// URLs go through this proxy")
        try:
            port = parts.port or 80
        except ValueError:
            raise _Refused(400, "bad port") from None
        upstream = await self._connect(parts.hostname, port)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        headers = [
            line
            for line in lines[1:]
            if line
            and line.split(":", 1)[0].strip().lower()
            not in ("proxy-connection", "proxy-authorization", "connection", "keep-alive")
        ]
        preface = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close"])
        return upstream, (preface + "\r\n\r\n").encode("latin-1")

    async def _connect(self, host: str, port: int) -> trio.SocketStream:
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                addresses = [host] if _is_ip(host) else await self.resolver(host, port)
        except (OSError, UnicodeError, trio.TooSlowError) as exc:
            raise _Refused(502, f"cannot resolve host {host!r}: {exc}") from None
        if not addresses:
            raise _Refused(502, f"host {host!r} has no addresses")
        try:
            vetted = self.policy.vet(host, addresses)
        except BlockedAddress as exc:
            self.refused = [*self.refused[-99:], (host, str(exc))]
            log.info("mcp egress refused: %s", exc)
            raise _Refused(403, f"refused by the node's guard: {exc}") from None
        failure: Exception | None = None
        for address in vetted:  # only vetted IP literals are connected to
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    stream: trio.SocketStream = await self.connect(address, port)
                return stream
            except (OSError, trio.TooSlowError) as exc:
                failure = exc
        raise _Refused(502, f"cannot connect to {host!r}: {failure}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _read_head(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise _Refused(431, "request head too large")
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise trio.BrokenResourceError("the client went away")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


async def _answer(stream: trio.SocketStream, status: int, text: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large"}
    body = text.encode()
    head = (
        f"HTTP/1.1 {status} {reasons.get(status, 'Bad Gateway')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    try:
        await stream.send_all(head.encode() + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _splice(a: trio.SocketStream, b: trio.SocketStream) -> None:
    """Copy both ways until either side ends."""

    async def copy(src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
        try:
            while chunk := await src.receive_some(65536):
                await dst.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        done.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(copy, a, b, nursery.cancel_scope)
        nursery.start_soon(copy, b, a, nursery.cancel_scope)
