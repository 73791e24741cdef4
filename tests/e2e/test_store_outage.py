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
from tests.support.outage import UNAVAILABLE, Turns, assert_unavailable, turns
from tests.support.polling import eventually
from tests.support.tcpproxy import open_tcp_proxy
from turnstile.actors.config import Config
from turnstile.actors.node import open_node

#: how long the cut lasts once the node has noticed it (an outage's length, not a wait)
OUTAGE_SECONDS = 3


@pytest.fixture
async def served(pg_dsn):
    """(node, proxy, what names the database) for a node on a schema of its own, through a
    proxy."""
    target = urlsplit(pg_dsn)
    async with (
        pg_schema(pg_dsn) as (url, schema),
        open_tcp_proxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy,
    ):
        config = Config(port=0, store=proxy.rewrite(url), agent="scripted")
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


async def test_a_slow_store_makes_requests_slower_but_every_one_succeeds(served):
    """Every chunk between the node and PostgreSQL waits 50 ms (a database far away, or
    overloaded): nothing is refused as an outage, the turns complete, each once."""
    node, proxy, _ = served
    async with node.http() as http, connect(node) as ws:
        http.timeout = httpx.Timeout(60)  # a hang guard: every store round trip is 100 ms
        proxy.slow(0.02)
        t0 = trio.current_time()
        assert (await http.post("/sessions", json={"id": "s1"})).status_code == 201
        print("create", trio.current_time() - t0)
        await ws.send(type="attach", session_id="s1")
        await ws.expect("attached", session_id="s1")
        print("attach", trio.current_time() - t0)
        answer = await http.post("/sessions/s1/messages", json={"content": "one"})
        assert answer.status_code == 202, answer.text
        sent = [answer.json()["input_id"]]
        print("sent", trio.current_time() - t0)
        end = await ws.expect("stream_end", input_id=sent[0])
        assert (end["status"], end["text"]) == ("completed", "You said: one")
        print("turn", trio.current_time() - t0)
        await ws.send(type="send", session_id="s1", content="two", client_msg_id="w")
        sent.append((await ws.expect("ack", client_msg_id="w"))["input_id"])
        await ws.expect("stream_end", input_id=sent[-1])
        print("turn2", trio.current_time() - t0)
        for path in ("/sessions", "/sessions/s1/history", "/readyz"):
            answer = await http.get(path)
            assert answer.status_code == 200, (path, answer.status_code, answer.text)
        print("gets", trio.current_time() - t0)
        assert proxy.statistics().mode == "slow"  # all of it went through the slow proxy
        log = await turns(http, "s1")
        log.assert_each_ran_once(sent)
        assert len(log.starts) == 2


@pytest.mark.parametrize("direction", ["up", "down"])
async def test_a_half_open_store_is_503_after_the_operation_bound(served, monkeypatch, direction):
    """A connection that passes one way only (``up``: the node's queries vanish; ``down``: the
    database's answers do) is a stall the node cannot see from its socket: each operation is
    bounded (``OPERATION_TIMEOUT``, 1 s here), answered ``503 store_unavailable``, and once
    the network heals the node serves again; the message acknowledged before and the one
    after each run once. (One run in three, ``down`` dropped the answer of the first
    message's claim after its commit, and that message never ran: fixed in the turn runner,
    ``tests/actors/sessions/test_lost_claim.py``.)"""
    from turnstile.runtime.store import postgres

    monkeypatch.setattr(postgres, "OPERATION_TIMEOUT", 1.0)
    node, proxy, database = served
    async with node.http() as http:
        assert (await http.post("/sessions", json={"id": "s1"})).status_code == 201
        before = await http.post("/sessions/s1/messages", json={"content": "before"})
        assert before.status_code == 202, before.text
        # its turn may meet the fault too: its claim commits and the answer is dropped (down)
        proxy.half_open(direction)
        answer = await http.post("/sessions/s1/messages", json={"content": "x"}, timeout=30)
        assert_unavailable(answer, database=database)
        assert_unavailable(await http.get("/sessions", timeout=30), database=database)
        proxy.heal()

        async def sent_again() -> httpx.Response | None:
            answer = await http.post("/sessions/s1/messages", json={"content": "after"})
            if answer.status_code == 503:  # still the outage's (a pooled connection broken)
                assert_unavailable(answer, database=database)
                return None
            return answer

        answer = await eventually(sent_again)
        assert answer.status_code == 202, answer.text
        after = answer.json()["input_id"]

        async def ran() -> Turns | None:
            log = await turns(http, "s1")
            return log if log is not None and log.ends[after] else None

        log = await eventually(ran)
    log.assert_each_ran_once([before.json()["input_id"], after])
