"""Outbound HTTP that cannot be pointed at the node's own network (SSRF protection).

An agent chooses URLs, so without a guard ``http.get`` would read cloud metadata
(``169.254.169.254``), admin ports on loopback or anything on the private network. The guard
refuses loopback, private (10/8, 172.16/12, 192.168/16), carrier-grade NAT (100.64/10),
link-local (169.254/16, fe80::/10), unique-local (fc00::/7), site-local, unspecified (0/8,
``::``), multicast, broadcast and reserved addresses — everything that is not globally
routable — including IPv4 hidden in IPv6 (``::ffff:10.0.0.1``, 6to4, Teredo, NAT64).

**Where the check happens.** Not on the URL's text but in the connection itself: the guard is
an httpcore *network backend* (``GuardedBackend``) that httpcore asks for every new TCP
connection. It resolves the host once (``trio.socket.getaddrinfo``, injectable), requires
**every** resolved address to be allowed, and then opens the socket to the vetted IP literal
— there is no second lookup between check and connect, so DNS rebinding (a name that answers
a public address to the check and a private one to the connect) has nothing to exploit.
Because httpcore still believes it is talking to the hostname, TLS uses the hostname for SNI
and certificate verification and the ``Host`` header is untouched, with no URL rewriting;
pooled connections are keyed by hostname, and each was vetted when it was opened.

``GuardedTransport`` is the ``httpx.AsyncBaseTransport`` built on that backend (a
``tools.connpool.KeepAlivePool`` of httpcore connections opened through it, httpcore errors
mapped to the httpx errors of the same name). It never uses proxies or ``*_proxy``
environment variables. ``open_response`` sends a request and follows redirects by hand (at
most ``max_redirects``): every hop is a new request through the same transport, so every hop
is vetted; only http/https hops are followed, ``Authorization`` / ``Cookie`` headers are
dropped when the origin changes, and 301/302/303 turn into a bodiless GET as browsers do.

The allow-list opens specific destinations: ``allowed_hosts`` are host names (exact, or
``*.example.com`` for subdomains) whose addresses are all accepted, and IP literals, which
count as single-address networks; ``allowed_networks`` are CIDR blocks
(``"127.0.0.0/8"``, ``"fd00::/8"``).

It is over 400 lines because it is one security boundary: every path from a URL to a socket
(classification, policy, the connection backend, the transport, the redirect walk) is here, to be
reviewed as a whole.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx
import trio

from turnstile.runtime.errors import InvalidArgument, TurnstileError
from turnstile.tools.connpool import KeepAlivePool, PoolStatistics

__all__ = [
    "BlockedAddress",
    "TooManyRedirects",
    "NetPolicy",
    "Resolver",
    "resolve_host",
    "classify_address",
    "GuardedBackend",
    "GuardedTransport",
    "guarded_client",
    "open_response",
    "check_url",
    "default_ssl_context",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: ``(host, port) -> addresses``: how host names become IP addresses (injectable for tests).
Resolver = Callable[[str, int], Awaitable[list[str]]]

SCHEMES = ("http", "https")


class BlockedAddress(TurnstileError):
    """A destination the guard refuses; the message names the host and the address class.

    Attributes:
        host: the host name of the request (or hop).
        address: the refused address.
        reason: its class, such as ``"private address"``.
        field: ``"url"``.
    """

    code = "blocked_address"

    def __init__(self, host: str, address: str, reason: str) -> None:
        super().__init__(f"refusing {address} ({reason}) for host '{host}'")
        self.host = host
        self.address = address
        self.reason = reason
        self.field = "url"


class TooManyRedirects(TurnstileError):
    """More redirects than allowed; ``field`` is ``"url"``."""

    code = "too_many_redirects"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.field = "url"


async def resolve_host(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the default ``Resolver``), without duplicates."""
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    addresses: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = str(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


_V4_SPECIAL: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), label)
    for net, label in (
        ("0.0.0.0/8", "unspecified address"),
        ("127.0.0.0/8", "loopback address"),
        ("169.254.0.0/16", "link-local address"),
        ("224.0.0.0/4", "multicast address"),
        ("10.0.0.0/8", "private address"),
        ("172.16.0.0/12", "private address"),
        ("192.168.0.0/16", "private address"),
        ("100.64.0.0/10", "shared address (carrier-grade NAT)"),
        ("255.255.255.255/32", "broadcast address"),
        ("240.0.0.0/4", "reserved address"),
    )
)
_V6_SPECIAL: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), label)
    for net, label in (
        ("::/128", "unspecified address"),
        ("::1/128", "loopback address"),
        ("fe80::/10", "link-local address"),
        ("fc00::/7", "unique-local address"),
        ("fec0::/10", "site-local address"),
        ("ff00::/8", "multicast address"),
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")


def classify_address(address: IPAddress) -> str | None:
    """Why ``address`` must not be contacted (``"loopback address"``…), or None if public.

    IPv4 carried inside IPv6 (mapped, compatible, 6to4, Teredo, NAT64) is judged by the
    IPv4 address it carries.
    """
    if isinstance(address, ipaddress.IPv4Address):
        for network, label in _V4_SPECIAL:
            if address in network:
                return label
        return None if address.is_global else "non-public address"
    if address.scope_id:
        address = ipaddress.IPv6Address(str(address).split("%", 1)[0])
    if address.ipv4_mapped is not None:
        return classify_address(address.ipv4_mapped)
    for network, label in _V6_SPECIAL:
        if address in network:
            return label
    embedded: list[ipaddress.IPv4Address] = []
    if address.sixtofour is not None:
        embedded.append(address.sixtofour)
    if address.teredo is not None:
        embedded.extend(address.teredo)
    if address in _NAT64 or address in _V4_COMPATIBLE:
        embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    for inner in embedded:
        inner_label = classify_address(inner)
        if inner_label is not None:
            return inner_label
    return None if address.is_global else "non-public address"


def _parse_ip(text: str) -> IPAddress | None:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class NetPolicy:
    """Which destinations are allowed besides the public internet.

    Args:
        allowed_hosts: host names whose addresses are all accepted (exact, case-insensitive,
            or ``*.example.com`` for any subdomain); IP literals here act as single-address
            networks (``"127.0.0.1"``).
        allowed_networks: CIDR blocks whose addresses are accepted.

    Raises:
        ValueError: a network is not valid CIDR.
    """

    allowed_hosts: tuple[str, ...] = ()
    allowed_networks: tuple[str, ...] = ()
    _hosts: frozenset[str] = field(init=False, repr=False, compare=False)
    _suffixes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _networks: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hosts: set[str] = set()
        suffixes: list[str] = []
        networks: list[IPNetwork] = []
        for entry in self.allowed_hosts:
            ip = _parse_ip(entry)
            if ip is not None:
                networks.append(ipaddress.ip_network(ip))
            elif entry.startswith("*."):
                suffixes.append(_normal_host(entry[1:]))
            else:
                hosts.add(_normal_host(entry))
        for entry in self.allowed_networks:
            networks.append(ipaddress.ip_network(entry, strict=False))
        object.__setattr__(self, "_hosts", frozenset(hosts))
        object.__setattr__(self, "_suffixes", tuple(suffixes))
        object.__setattr__(self, "_networks", tuple(networks))

    def host_allowed(self, host: str) -> bool:
        """Whether ``host`` is opened by name."""
        name = _normal_host(host)
        return name in self._hosts or any(name.endswith(suffix) for suffix in self._suffixes)

    def vet(self, host: str, addresses: Sequence[str]) -> list[str]:
        """The addresses to connect to, if every one is allowed for ``host``.

        Raises:
            BlockedAddress: an address is not allowed (the first one found).
        """
        by_name = self.host_allowed(host)
        vetted: list[str] = []
        for text in addresses:
            ip = _parse_ip(text)
            if ip is None:
                raise BlockedAddress(host, text, "not an IP address")
            if not by_name and not self._network_allowed(ip):
                reason = classify_address(ip)
                if reason is not None:
                    raise BlockedAddress(host, str(ip), reason)
            vetted.append(str(ip))
        return vetted

    def _network_allowed(self, ip: IPAddress) -> bool:
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            candidates.append(ip.ipv4_mapped)
        return any(
            c in net for c in candidates for net in self._networks if c.version == net.version
        )


def _normal_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that vets every TCP connection before opening it.

    Args:
        policy: what is allowed besides public addresses.
        resolver: host name → addresses (default ``resolve_host``).
        backend: opens the vetted connections (default ``httpcore.TrioBackend()``); it is
            only ever given IP literals.
    """

    def __init__(
        self,
        policy: NetPolicy,
        resolver: Resolver | None = None,
        backend: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self.policy = policy
        self.resolver = resolver or resolve_host
        self.backend = backend or httpcore.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if _parse_ip(host) is not None:
            addresses = [host]
        else:
            with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
                try:
                    addresses = await self.resolver(host, port)
                except (OSError, UnicodeError) as exc:
                    raise httpcore.ConnectError(f"cannot resolve host {host!r}: {exc}") from None
            if scope.cancelled_caught:
                raise httpcore.ConnectTimeout(f"resolving host {host!r} timed out")
            if not addresses:
                raise httpcore.ConnectError(f"host {host!r} has no addresses")
        vetted = self.policy.vet(host, addresses)
        failure: Exception | None = None
        for address in vetted:  # only vetted IP literals reach the socket layer
            try:
                return await self.backend.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not allowed")

    async def sleep(self, seconds: float) -> None:
        await self.backend.sleep(seconds)


def _httpx_error(exc: Exception) -> Exception | None:
    """The httpx error with the same name as an httpcore one (they mirror each other)."""
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] != "httpcore":
            continue
        target = getattr(httpx, cls.__name__, None)
        if isinstance(target, type) and issubclass(target, httpx.TransportError):
            return target(str(exc))
    return None


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except Exception as exc:
            mapped = _httpx_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def aclose(self) -> None:
        await self._stream.aclose()


_SSL_CONTEXT: ssl.SSLContext | None = None


def default_ssl_context() -> ssl.SSLContext:
    """A verifying TLS context (httpx's CA bundle), built once and shared."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = httpx.create_ssl_context()
    return _SSL_CONTEXT


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport whose every connection goes through ``GuardedBackend``.

    Its connections are kept alive per origin for the next request (``tools.connpool``'s
    ``KeepAlivePool``, not httpcore's pool: issue 26); a kept connection was vetted when it
    was opened, and a request to another origin (a redirect's hop too) opens and vets its own.

    Args:
        policy, resolver, backend: as for ``GuardedBackend``.
        ssl_context: TLS settings (default ``default_ssl_context()``).
        keepalive_expiry: seconds an idle connection is kept (0: closed after each request).
        max_idle_per_origin: idle connections kept per origin.
    """

    def __init__(
        self,
        policy: NetPolicy,
        *,
        resolver: Resolver | None = None,
        backend: httpcore.AsyncNetworkBackend | None = None,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_expiry: float = 5.0,
        max_idle_per_origin: int = 16,
    ) -> None:
        self._pool = KeepAlivePool(
            GuardedBackend(policy, resolver, backend),
            ssl_context=ssl_context or default_ssl_context(),
            keepalive_expiry=keepalive_expiry,
            max_idle_per_origin=max_idle_per_origin,
        )

    def statistics(self) -> PoolStatistics:
        """The connection pool's counts now (idle, in use, opened, reused)."""
        return self._pool.statistics()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme not in SCHEMES:
            raise httpx.UnsupportedProtocol(f"scheme {request.url.scheme!r} is not allowed")
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = await self._pool.handle_async_request(core_request)
        except Exception as exc:
            mapped = _httpx_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class _Borrowed(httpx.AsyncBaseTransport):
    """A shared transport lent to one client: closing the client leaves it open."""

    def __init__(self, transport: GuardedTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        pass


def guarded_client(
    policy: NetPolicy,
    *,
    timeout: float,
    resolver: Resolver | None = None,
    backend: httpcore.AsyncNetworkBackend | None = None,
    headers: dict[str, str] | None = None,
    transport: GuardedTransport | None = None,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` on a ``GuardedTransport``: no proxies, no automatic redirects.

    Use it with ``open_response``, which follows redirects one vetted hop at a time. Given a
    ``transport`` (its kept-alive connections shared by many calls: it must have been made
    with ``policy``), the client borrows it and closing the client leaves it open; otherwise
    the client gets one of its own. A client per call keeps one call's cookies from the next.
    """
    return httpx.AsyncClient(
        transport=_Borrowed(transport)
        if transport is not None
        else GuardedTransport(policy, resolver=resolver, backend=backend),
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        trust_env=False,
        headers=headers,
    )


_HTTPX_LOG = logging.getLogger("httpx")

_SENSITIVE = ("authorization", "cookie", "proxy-authorization")


def check_url(url: str | httpx.URL, field: str = "url") -> httpx.URL:
    """``url`` parsed, if it is absolute http(s) with a host.

    Raises:
        InvalidArgument: anything else.
    """
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise InvalidArgument(f"not a valid URL: {exc}", field=field) from None
    if parsed.scheme not in SCHEMES:
        raise InvalidArgument(
            f"only http and https URLs are allowed, got scheme {parsed.scheme!r}", field=field
        )
    if not parsed.host:
        raise InvalidArgument("the URL has no host", field=field)
    return parsed


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return (url.scheme, url.host, url.port)


@asynccontextmanager
async def open_response(
    client: httpx.AsyncClient | GuardedTransport,
    method: str,
    url: str | httpx.URL,
    *,
    headers: dict[str, str] | None = None,
    content: bytes | None = None,
    max_redirects: int = 5,
) -> AsyncIterator[tuple[httpx.Response, list[str]]]:
    """Send a request, following redirects by hand; yields ``(response, urls redirected from)``.

    The response is streamed (read it with ``aiter_bytes``) and closed on exit. Every hop goes
    through ``client``'s transport, so with a ``GuardedTransport`` every hop is vetted. Given
    the transport itself, requests go to it as built (no client: no cookie jar, default
    headers or per-operation timeouts; the caller bounds the call with a cancel scope).

    Raises:
        InvalidArgument: the URL, or a redirect target, is not http(s).
        TooManyRedirects: more than ``max_redirects`` hops.
        BlockedAddress: a hop leads to a refused address.
        httpx.HTTPError: the request failed.
    """
    current = check_url(url)
    headers = dict(headers or {})
    hops: list[str] = []
    while True:
        if isinstance(client, GuardedTransport):
            request = httpx.Request(method, current, headers=headers, content=content)
            response = await client.handle_async_request(request)
            response.request = request
            # The line an httpx client logs at INFO, here at DEBUG: a node with 10,000
            # watchers would write 2,000 of them a second (issue 26).
            _HTTPX_LOG.debug(
                'HTTP Request: %s %s "%s %d %s"',
                request.method,
                request.url,
                response.http_version,
                response.status_code,
                response.reason_phrase,
            )
        else:
            request = client.build_request(method, current, headers=headers, content=content)
            response = await client.send(request, stream=True, follow_redirects=False)
        location = response.headers.get("location") if response.is_redirect else None
        if location is None:
            try:
                yield response, hops
            finally:
                await response.aclose()
            return
        await response.aclose()
        if len(hops) >= max_redirects:
            raise TooManyRedirects(f"stopped after {max_redirects} redirects (at {current})")
        try:
            target = current.join(location)
        except (httpx.InvalidURL, ValueError) as exc:
            raise InvalidArgument(
                f"bad redirect location {location!r}: {exc}", field="url"
            ) from None
        target = check_url(target)
        hops.append(str(current))
        if _origin(target) != _origin(current):
            headers = {k: v for k, v in headers.items() if k.lower() not in _SENSITIVE}
        if (response.status_code == 303 and method != "HEAD") or (
            response.status_code in (301, 302) and method == "POST"
        ):
            method, content = "GET", None
            headers = {
                k: v
                for k, v in headers.items()
                if k.lower() not in ("content-type", "content-encoding")
            }
        current = target
