"""A database outage is the server's problem (issue 23, 'Store outages and slow stores').

A node served on loopback (port 0) on PostgreSQL through a TCP proxy the test controls
(``tests.support.tcpproxy``): while the proxy is cut, every request that needs the store is
``503 store_unavailable`` with ``Retry-After`` and nothing of the database (host, port, SQL,
driver text) in the body, a WebSocket frame gets a typed ``error`` frame and the connection
stays open, ``/readyz`` says 503; once the cut ends the node serves again, without a restart.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from tests.runtime.store._support import pg_schema
from tests.support.node import TOKENS, Node, connect
from tests.support.polling import eventually
from tests.support.tcpproxy import open_tcp_proxy
from turnstile.actors.config import Config
from turnstile.actors.node import open_node

UNAVAILABLE = {
    "error": {
        "code": "store_unavailable",
        "message": "the store is unavailable; retry in a few seconds",
    }
}


#: how long the cut lasts once the node has noticed it (an outage's length, not a wait)
OUTAGE_SECONDS = 3


def assert_unavailable(answer: httpx.Response, *, database: tuple[str, ...]) -> None:
    """``answer`` is the outage's 503, and says nothing of the database."""
    request = f"{answer.request.method} {answer.request.url.path}"
    assert answer.status_code == 503, (request, answer.status_code, answer.text)
    assert answer.headers["retry-after"] == "5", request
    assert answer.json() == UNAVAILABLE, request
    for secret in database:
        assert secret not in answer.text, (request, secret)


@pytest.fixture
async def served(pg_dsn):
    """(node, proxy, what names the database) for a node on a schema of its own, through a
    proxy."""
    target = urlsplit(pg_dsn)
    async with (
        pg_schema(pg_dsn) as (url, schema),
        open_tcp_proxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy,
    ):
        config = Config(port=0, store=proxy.rewrite(url))
        async with open_node(config, tokens=TOKENS) as node:
            served = Node(url=node.url, ws_url=node.url.replace("http://", "ws://") + "/ws")
            database = (
                target.hostname or "",
                f":{proxy.port}",
                str(target.port or 5432),
                schema,
                "postgres",
                "SELECT",
                "asyncpg",
                "connection",
            )
            yield served, proxy, database


async def test_a_cut_store_is_503_store_unavailable_and_the_node_recovers(served):
    node, proxy, database = served
    async with node.http() as http, connect(node) as ws:
        assert (await http.post("/sessions", json={"id": "s1"})).status_code == 201
        await ws.send(type="attach", session_id="s1")
        await ws.expect("attached", session_id="s1")
        sent = await http.post("/sessions/s1/messages", json={"content": "before"})
        assert sent.status_code == 202, sent.text
        await ws.expect("stream_end", input_id=sent.json()["input_id"])
        assert (await http.get("/readyz")).status_code == 200

        await proxy.cut()
        for method, path, body in [
            ("POST", "/sessions/s1/messages", {"content": "during"}),
            ("POST", "/sessions", {"id": "s2"}),
            ("GET", "/sessions", None),
            ("GET", "/sessions/s1/history", None),
            ("GET", "/sessions/s1/events", None),
            ("GET", "/sessions/s1/jobs", None),
            ("DELETE", "/sessions/s1", None),
        ]:
            answer = await http.request(method, path, json=body)
            assert_unavailable(answer, database=database)

        # a WebSocket frame that needs the store: a typed error frame, the connection open
        await ws.send(type="send", session_id="s1", content="during", client_msg_id="w1")
        error = await ws.expect("error", session_id="s1")
        assert (error["code"], error["message"]) == (
            "store_unavailable",
            UNAVAILABLE["error"]["message"],
        )
        assert not any(secret in json.dumps(error) for secret in database)

        async def not_ready() -> httpx.Response | None:
            answer = await http.get("/readyz")
            return answer if answer.status_code == 503 else None

        answer = await eventually(not_ready)
        assert answer.json()["error"] == UNAVAILABLE["error"]
        assert answer.headers["retry-after"] == "5"
        assert (await http.get("/healthz")).status_code == 200  # liveness: no restart wanted
        # the outage lasts: heartbeats, listeners, the scheduler and the sessions meet it
        await trio.sleep(OUTAGE_SECONDS)
        assert_unavailable(await http.get("/sessions"), database=database)

        proxy.heal()

        async def sent_again() -> httpx.Response | None:
            answer = await http.post("/sessions/s1/messages", json={"content": "after"})
            return answer if answer.status_code == 202 else None

        after = await eventually(sent_again)
        await ws.expect("stream_end", input_id=after.json()["input_id"])
        # the same WebSocket connection serves again
        await ws.send(type="send", session_id="s1", content="after ws", client_msg_id="w2")
        ack = await ws.expect("ack", client_msg_id="w2")
        await ws.expect("stream_end", input_id=ack["input_id"])
        assert (await http.post("/sessions", json={"id": "s2"})).status_code == 201

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await eventually(ready)


async def test_connections_reset_mid_transaction_are_503_then_served_again(served):
    node, proxy, database = served
    async with node.http() as http:
        assert (await http.post("/sessions", json={"id": "s1"})).status_code == 201
        proxy.stall()  # what is sent now waits in the proxy: the operation is in flight
        async with trio.open_nursery() as nursery:
            answers: list[httpx.Response] = []

            async def post() -> None:
                answers.append(await http.post("/sessions/s1/messages", json={"content": "x"}))

            nursery.start_soon(post)
            await eventually(lambda: _held(proxy))  # the operation's bytes wait in the proxy
            proxy.reset()
            proxy.heal()
        assert_unavailable(answers[0], database=database)

        async def served_again() -> bool:
            answer = await http.post("/sessions/s1/messages", json={"content": "y"})
            return answer.status_code == 202

        await eventually(served_again)


async def _held(proxy) -> bool:
    return proxy.statistics().held > 0


async def test_a_stalled_store_is_503_after_the_operation_bound(served, monkeypatch):
    from turnstile.runtime.store import postgres

    monkeypatch.setattr(postgres, "OPERATION_TIMEOUT", 1.0)
    node, proxy, database = served
    async with node.http() as http:
        assert (await http.post("/sessions", json={"id": "s1"})).status_code == 201
        proxy.stall()
        answer = await http.post("/sessions/s1/messages", json={"content": "x"}, timeout=30)
        assert_unavailable(answer, database=database)
        proxy.heal()

        async def served_again() -> bool:
            answer = await http.post("/sessions/s1/messages", json={"content": "y"})
            return answer.status_code == 202

        await eventually(served_again)
