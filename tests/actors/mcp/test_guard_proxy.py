"""The guard proxy on its own: what it lets through, what it refuses and how it says so."""

from __future__ import annotations

from functools import partial

import httpx
import pytest
import trio

from tests.support.http import read_request_head
from turnstile.actors.mcp.egress import GuardProxy, proxy_environment
from turnstile.tools.netguard import NetPolicy


async def start(nursery, policy: NetPolicy, **options) -> GuardProxy:
    proxy = GuardProxy(policy, **options)
    await nursery.start(proxy.serve)
    return proxy


async def raw(proxy: GuardProxy, request: bytes) -> bytes:
    port = int(proxy.url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize(
    ("request_bytes", "status", "body"),
    [
        (
            b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n",
            b"403",
            b"refused by the node's guard: "
            b"refusing 127.0.0.1 (loopback address) for host '127.0.0.1'",
        ),
        (b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", b"403", b"(loopback address)"),
        (
            b"GET http://169.254.169.254/latest/meta-data HTTP/1.1\r\n\r\n",
            b"403",
            b"refusing 169.254.169.254 (link-local address)",
        ),
        (b"GET http://10.0.0.1/ HTTP/1.1\r\n\r\n", b"403", b"(private address)"),
        (b"GET /relative HTTP/1.1\r\n\r\n", b"400", b"only CONNECT and absolute http:// URLs"),
        (b"GET https://example.com/ HTTP/1.1\r\n\r\n", b"400", b"only CONNECT and absolute"),
        (b"CONNECT nohost HTTP/1.1\r\n\r\n", b"400", b"CONNECT needs host:port"),
        (b"garbage\r\n\r\n", b"400", b"not an HTTP request"),
        (b"GET http://rebinds.example/ HTTP/1.1\r\n\r\n", b"403", b"refusing 127.0.0.1"),
    ],
)
async def test_refusals(nursery, request_bytes, status, body):
    async def resolver(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "127.0.0.1"]  # one public, one not: refused whole

    proxy = await start(nursery, NetPolicy(), resolver=resolver)
    answer = await raw(proxy, request_bytes)
    assert answer.split(b" ")[1] == status, answer
    assert body in answer
    # and it still serves
    again = await raw(proxy, b"garbage\r\n\r\n")
    assert b" 400 " in again


async def test_an_allowed_destination_is_reached_at_the_vetted_address(nursery):
    seen: list[bytes] = []

    async def origin(stream: trio.SocketStream) -> None:
        head = await read_request_head(stream)
        seen.append(head or b"")
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
        )
        await stream.aclose()

    (listener,) = await nursery.start(partial(trio.serve_tcp, origin, 0, host="127.0.0.1"))
    port = listener.socket.getsockname()[1]
    connected: list[tuple[str, int]] = []

    async def connect(address: str, port: int) -> trio.SocketStream:
        connected.append((address, port))
        return await trio.open_tcp_stream(address, port)

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    proxy = await start(
        nursery, NetPolicy(allowed_hosts=("origin.test",)), resolver=resolver, connect=connect
    )
    async with httpx.AsyncClient(proxy=proxy.url, trust_env=False) as http:
        answer = await http.get(f"http://origin.test:{port}/page?q=1")
    assert answer.text == "hello"
    assert connected == [("127.0.0.1", port)]
    assert seen[0].startswith(b"GET /page?q=1 HTTP/1.1\r\n")
    assert b"Host: origin.test" in seen[0] or b"host: origin.test" in seen[0]
    assert b"Connection: close" in seen[0]
    assert proxy.refused == []


def test_the_environment_points_every_variable_at_the_proxy():
    env = proxy_environment("http://127.0.0.1:9")
    assert env["HTTPS_PROXY"] == env["http_proxy"] == env["ALL_PROXY"] == "http://127.0.0.1:9"
    assert env["NO_PROXY"] == env["no_proxy"] == ""
