"""The http module and the netguard, against a real server on 127.0.0.1.

Happy paths allow-list ``127.0.0.1`` explicitly. Every refusal is checked with a network
backend that records connection attempts and never opens a socket, so no test can send
traffic anywhere but loopback; host names other than ``localhost`` go through a fake resolver.
"""

from __future__ import annotations

import base64
import ipaddress

import httpcore
import pytest
import trio

from tests.support.http import LOCAL, make_tools
from turnstile.tools.connpool import PoolStatistics
from turnstile.tools.modules.http import POLICIES, HttpConfig, register_http_module
from turnstile.tools.netguard import NetPolicy, classify_address
from turnstile.tools.policy import Policy, PolicyTable
from turnstile.tools.registry import ToolRegistry


class Recorder(httpcore.AsyncNetworkBackend):
    """Records every connection attempt; opens real sockets only when ``real`` (loopback)."""

    def __init__(self, real: bool = True) -> None:
        self.hosts: list[str] = []
        self.real = real
        self._backend = httpcore.TrioBackend()

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # noqa: ASYNC109
        self.hosts.append(host)
        assert ipaddress.ip_address(host).is_loopback, f"test tried to reach {host}"
        if not self.real:
            raise AssertionError(f"a connection to {host} was attempted")
        return await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class FakeResolver:
    """Answers from a table, one answer list per call (the last one repeats)."""

    def __init__(self, **answers: list[list[str]]) -> None:
        self.answers = {host.replace("_", "."): list(seq) for host, seq in answers.items()}
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        sequence = self.answers.get(host)
        if not sequence:
            raise OSError(f"[fake] unknown host {host}")
        return sequence.pop(0) if len(sequence) > 1 else sequence[0]


async def test_get_text_json_and_binary(server):
    call, _ = make_tools(**LOCAL)
    text = await call("http.get", url=f"{server}/text")
    assert text.ok, text.error
    data = text.data
    assert (data["status_code"], data["body"], data["encoding"]) == (200, "hello", "text")
    assert data["headers"]["content-type"].startswith("text/plain")
    assert (data["truncated"], data["bytes"], data["redirects"]) == (False, 5, [])
    assert isinstance(data["elapsed_ms"], int)

    json = (await call("http.get", url=f"{server}/json")).data
    assert json["encoding"] == "json"
    assert json["body"]["items"][0]["price"] == 3

    binary = (await call("http.get", url=f"{server}/bytes")).data
    assert binary["encoding"] == "base64"
    assert base64.b64decode(binary["body"]) == b"\x89PNG\x00\xff"

    failing = await call("http.get", url=f"{server}/status/503")
    assert failing.ok  # a status is a result, not an error
    assert failing.data["status_code"] == 503


async def test_post_json_and_text(server):
    call, _ = make_tools(**LOCAL)
    sent = await call("http.post", url=f"{server}/echo", json={"a": [1, 2]})
    assert sent.ok, sent.error
    assert sent.data["body"] == {
        "method": "POST",
        "body": '{"a":[1,2]}',
        "content_type": "application/json",
    }
    text = await call("http.post", url=f"{server}/echo", body="hi", content_type="text/csv")
    assert text.data["body"]["body"] == "hi"
    assert text.data["body"]["content_type"] == "text/csv"
    both = await call("http.post", url=f"{server}/echo", body="x", json=1)
    assert both.error["code"] == "invalid_argument"
    too_big = make_tools(max_request_bytes=10, **LOCAL)[0]
    refused = await too_big("http.post", url=f"{server}/echo", body="x" * 11)
    assert refused.error["code"] == "limit_exceeded"


async def test_a_post_carries_its_call_s_idempotency_key_and_a_get_none(server):
    call, _ = make_tools(**LOCAL)
    key = "turnstile-0123456789abcdef0123456789abcdef"
    posted = await call("http.post", idempotency_key=key, url=f"{server}/headers", body="x")
    assert posted.ok, posted.error
    assert posted.data["body"]["idempotency-key"] == key
    # A key the caller set itself is the one sent (it knows what its receiver expects).
    own = await call(
        "http.post",
        idempotency_key=key,
        url=f"{server}/headers",
        body="x",
        headers={"Idempotency-Key": "mine-1"},
    )
    assert own.data["body"]["idempotency-key"] == "mine-1"
    fetched = await call("http.get", idempotency_key=key, url=f"{server}/headers")
    assert "idempotency-key" not in fetched.data["body"]
    outside = await call("http.post", url=f"{server}/headers", body="x")  # not in a turn
    assert "idempotency-key" not in outside.data["body"]


async def test_body_is_truncated_at_max_bytes(server):
    call, _ = make_tools(**LOCAL)
    result = await call("http.get", url=f"{server}/big", max_bytes=1000)
    assert result.ok, result.error
    assert (result.data["truncated"], result.data["bytes"]) == (True, 1000)
    assert result.data["body"] == "a" * 1000
    over = await call("http.get", url=f"{server}/big", max_bytes=11 * 1024 * 1024)
    assert over.error["code"] == "bad_arguments"  # the schema's ceiling


async def test_timeout_bounds_the_whole_call(server):
    call, _ = make_tools(**LOCAL)
    started = trio.current_time()
    result = await call("http.get", url=f"{server}/slow", timeout=0.3)
    assert result.error["code"] == "timeout"
    # far sooner than the 30 s /slow takes to answer; generous, for a loaded box (how soon is
    # not the point: that the timeout ends the call is)
    assert trio.current_time() - started < 10
    refused = await make_tools(max_timeout=60, **LOCAL)[0](
        "http.get", url=f"{server}/text", timeout=100
    )
    assert (refused.error["code"], refused.error["field"]) == ("invalid_argument", "timeout")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:8080/", "refusing 127.0.0.1 (loopback address) for host '127.0.0.1'"),
        ("http://localhost:8080/", "(loopback address) for host 'localhost'"),
        ("http://[::1]:8080/", "refusing ::1 (loopback address) for host '::1'"),
        ("https://10.0.0.1/", "refusing 10.0.0.1 (private address) for host '10.0.0.1'"),
        ("http://192.168.1.1/", "refusing 192.168.1.1 (private address)"),
        ("http://172.16.5.4/", "refusing 172.16.5.4 (private address)"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "refusing 169.254.169.254 (link-local address) for host '169.254.169.254'",
        ),
        ("http://0.0.0.0/", "refusing 0.0.0.0 (unspecified address)"),
        ("http://[::ffff:10.0.0.1]/", "refusing ::ffff:a00:1 (private address)"),
        ("http://[fd12::1]/", "refusing fd12::1 (unique-local address)"),
        ("http://[fe80::1]/", "refusing fe80::1 (link-local address)"),
        ("http://224.0.0.1/", "refusing 224.0.0.1 (multicast address)"),
        ("http://2130706433/", "refusing 127.0.0.1 (loopback address) for host '2130706433'"),
    ],
)
async def test_private_destinations_are_refused_before_any_connection(url, message):
    backend = Recorder(real=False)
    call, _ = make_tools(backend=backend)  # no allow-list; the real resolver for localhost
    result = await call("http.get", url=url)
    assert not result.ok
    assert result.error["code"] == "blocked_address"
    assert message in result.error["message"]
    assert result.error["field"] == "url"
    assert backend.hosts == []


async def test_a_public_looking_name_that_resolves_to_a_private_address_is_refused():
    backend = Recorder(real=False)
    resolver = FakeResolver(metadata_example_com=[["93.184.216.34", "169.254.169.254"]])
    call, _ = make_tools(backend=backend, resolver=resolver)
    result = await call("http.get", url="https://metadata.example.com/latest")
    assert result.error == {
        "code": "blocked_address",
        "message": "refusing 169.254.169.254 (link-local address) for host 'metadata.example.com'",
        "field": "url",
    }
    assert resolver.calls == ["metadata.example.com"]
    assert backend.hosts == []


async def test_the_connection_goes_to_the_vetted_address_without_a_second_lookup(server):
    port = server.rsplit(":", 1)[1]
    # A rebinding resolver: loopback (allowed here) first, a private address afterwards.
    resolver = FakeResolver(api_example_test=[["127.0.0.1"], ["10.0.0.1"]])
    backend = Recorder()
    call, _ = make_tools(
        backend=backend,
        resolver=resolver,
        allowed_networks=("127.0.0.0/8",),
        keepalive_seconds=0,  # no kept connection: the second call opens (and vets) its own
    )
    result = await call("http.get", url=f"http://api.example.test:{port}/headers")
    assert result.ok, result.error
    assert result.data["body"]["host"] == f"api.example.test:{port}"
    assert resolver.calls == ["api.example.test"]
    assert backend.hosts == ["127.0.0.1"]
    # The next connection resolves again — and is refused, never connected.
    again = await call("http.get", url=f"http://api.example.test:{port}/headers")
    assert again.error["message"] == (
        "refusing 10.0.0.1 (private address) for host 'api.example.test'"
    )
    assert backend.hosts == ["127.0.0.1"]


async def test_calls_to_one_origin_share_a_kept_connection_but_no_cookie(server):
    backend = Recorder()
    registry = ToolRegistry(PolicyTable({"http.*": "AUTO"}))
    module = register_http_module(registry, HttpConfig(**LOCAL), backend=backend)
    first = await registry.call("s", "ada", "http.get", {"url": f"{server}/cookie"})
    assert first.ok, first.error
    second = await registry.call("s", "ada", "http.get", {"url": f"{server}/headers"})
    assert second.ok, second.error
    assert "cookie" not in second.data["body"]  # the first call's cookie stays with it
    assert backend.hosts == ["127.0.0.1"]  # one connection, opened (and vetted) once
    assert module.transport.statistics() == PoolStatistics(idle=1, in_use=0, opened=1, reused=1)
    await module.aclose()
    assert module.transport.statistics().idle == 0


async def test_an_allowed_host_name_opens_its_private_addresses(server):
    port = server.rsplit(":", 1)[1]
    resolver = FakeResolver(internal_example=[["127.0.0.1"]])
    call, _ = make_tools(resolver=resolver, allowed_hosts=("internal.example",))
    assert (await call("http.get", url=f"http://internal.example:{port}/text")).ok
    other = make_tools(resolver=FakeResolver(other_example=[["127.0.0.1"]]), **LOCAL)[0]
    by_address = await other("http.get", url=f"http://other.example:{port}/text")
    assert by_address.ok  # 127.0.0.1 as an allowed host is an allowed address, whatever the name


async def test_a_redirect_to_a_private_address_is_refused_at_the_hop(server):
    backend = Recorder()
    call, _ = make_tools(backend=backend, **LOCAL)
    result = await call("http.get", url=f"{server}/redirect?to=http://10.0.0.1/admin")
    assert result.error["code"] == "blocked_address"
    assert result.error["message"] == ("refusing 10.0.0.1 (private address) for host '10.0.0.1'")
    assert backend.hosts == ["127.0.0.1"]  # the first hop only


async def test_redirects_are_followed_and_credentials_dropped_across_origins(server):
    port = server.rsplit(":", 1)[1]
    resolver = FakeResolver(api_example_test=[["127.0.0.1"]])
    call, _ = make_tools(resolver=resolver, allowed_networks=("127.0.0.0/8",))
    target = f"http://api.example.test:{port}/headers"
    result = await call(
        "http.get",
        url=f"{server}/redirect?to={target}",
        headers={"Authorization": "Bearer secret", "X-Trace": "1"},
    )
    assert result.ok, result.error
    assert result.data["url"] == target
    assert result.data["redirects"] == [f"{server}/redirect?to={target}"]
    assert "authorization" not in result.data["body"]
    assert result.data["body"]["x-trace"] == "1"
    # 303 after a POST: a GET without the body.
    posted = await call("http.post", url=f"{server}/redirect?status=303&to=/echo", body="x")
    assert posted.data["body"] == {"method": "GET", "body": "", "content_type": None}


async def test_redirect_limits_and_schemes(server):
    call, _ = make_tools(**LOCAL)
    loop = await call("http.get", url=f"{server}/loop")
    assert loop.error["code"] == "too_many_redirects"
    assert "stopped after 5 redirects" in loop.error["message"]
    to_file = await call("http.get", url=f"{server}/redirect?to=file:///etc/passwd")
    assert (to_file.error["code"], to_file.error["field"]) == ("invalid_argument", "url")


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"url": "file:///etc/passwd"}, "url"),
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": "http://example.com/", "headers": {"Host": "internal"}}, "headers"),
        ({"url": "http://example.com/", "headers": {"X-A": "1\r\nX-B: 2"}}, "headers"),
        ({"url": "http://example.com/", "headers": {"bad name": "1"}}, "headers"),
    ],
)
async def test_bad_urls_and_headers_are_refused(arguments, field):
    backend = Recorder(real=False)
    call, _ = make_tools(backend=backend, resolver=FakeResolver())
    result = await call("http.get", **arguments)
    assert (result.error["code"], result.error["field"]) == ("invalid_argument", field)
    assert backend.hosts == []


async def test_download_writes_into_the_workspace(server, tmp_path):
    call, sandbox = make_tools(tmp_path, **LOCAL)
    result = await call(
        "http.download", url=f"{server}/file", destination="in/file.bin", create_parents=True
    )
    assert result.ok, result.error
    assert result.data["path"] == "in/file.bin"
    assert result.data["bytes"] == 1024
    assert (tmp_path / "root/in/file.bin").read_bytes() == bytes(range(256)) * 4

    exists = await call("http.download", url=f"{server}/file", destination="in/file.bin")
    assert exists.error["code"] == "file_error"
    assert (
        await call("http.download", url=f"{server}/file", destination="in/file.bin", overwrite=True)
    ).ok

    escape = await call("http.download", url=f"{server}/file", destination="../x.bin")
    assert (escape.error["code"], escape.error["field"]) == ("path_outside_root", "destination")

    too_big = await call(
        "http.download", url=f"{server}/file", destination="big.bin", max_bytes=100
    )
    assert too_big.error["code"] == "limit_exceeded"
    missing = await call("http.download", url=f"{server}/status/404", destination="nf.bin")
    assert missing.error["code"] == "request_failed"
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["in"]  # nothing left
    assert [p.name for p in (tmp_path / "root/in").iterdir()] == ["file.bin"]


async def test_download_needs_a_sandbox_and_policies_are_data():
    registry = ToolRegistry()
    register_http_module(registry, HttpConfig())
    assert registry.names() == ["http.get", "http.post"]
    assert POLICIES == {"http.get": "AUTO", "http.post": "APPROVE", "http.download": "APPROVE"}
    assert registry.policy_of("http.get") is Policy.AUTO
    assert registry.policy_of("http.post") is Policy.APPROVE


async def test_concurrency_is_limited_per_module(server):
    call, _ = make_tools(max_concurrency=1, **LOCAL)
    done: list[float] = []

    async def slow():
        await call("http.get", url=f"{server}/slow", timeout=0.2)
        done.append(trio.current_time())

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        nursery.start_soon(slow)
    assert max(done) - started >= 0.4  # one after the other


def test_classify_and_policy_edge_cases():
    ip = ipaddress.ip_address
    assert classify_address(ip("8.8.8.8")) is None
    assert classify_address(ip("2606:4700::1111")) is None
    assert classify_address(ip("100.64.0.1")) == "shared address (carrier-grade NAT)"
    assert classify_address(ip("2002:a00:1::1")) == "private address"  # 6to4 around 10.0.0.1
    assert classify_address(ip("64:ff9b::7f00:1")) == "loopback address"  # NAT64
    assert classify_address(ip("::7f00:1")) == "loopback address"  # IPv4-compatible
    assert classify_address(ip("255.255.255.255")) == "broadcast address"
    policy = NetPolicy(
        allowed_hosts=("*.corp.example", "Intranet."), allowed_networks=("10.1.0.0/16",)
    )
    assert policy.vet("a.corp.example", ["10.9.9.9"]) == ["10.9.9.9"]
    assert policy.vet("intranet", ["192.168.0.1"]) == ["192.168.0.1"]
    assert policy.vet("x.example", ["10.1.2.3", "8.8.8.8"]) == ["10.1.2.3", "8.8.8.8"]
    with pytest.raises(ValueError):
        NetPolicy(allowed_networks=("not-a-network",))


async def test_a_refused_connection_is_a_request_failure():
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    call, _ = make_tools(**LOCAL)
    result = await call("http.get", url=f"http://127.0.0.1:{port}/")
    assert (result.error["code"], result.error["field"]) == ("request_failed", "url")
    assert result.error["message"].startswith(f"GET http://127.0.0.1:{port}/ failed:")
