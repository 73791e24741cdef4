"""Several nodes through a store outage (issue 23, 'Store outages and slow stores').

Two nodes served on loopback (port 0) share one PostgreSQL schema through one TCP proxy the
test controls (``tests.support.tcpproxy``), with a 3 s lease, so that a cut reaches both at
once, as an outage of the shared database does. Clients are real HTTP and WebSocket clients
of the gateways; the store is looked at straight (not through the proxy) only to know when
the leases ran out.

Before ``runtime.membership`` deferred its sweeps after an outage, the first node to sweep
once the store was back declared the other dead (both leases had run out) and that one
stopped serving (``LeaseLost``): the first test failed on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
import pytest

from tests.runtime.store._support import pg_run, pg_schema
from tests.support.node import TOKENS, Node, connect
from tests.support.outage import Turns, assert_unavailable, turns
from tests.support.polling import eventually
from tests.support.tcpproxy import TcpProxy, open_tcp_proxy
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import open_node

LEASE = 3.0

pytestmark = [pytest.mark.postgres, pytest.mark.pg_nodes]


@asynccontextmanager
async def two_nodes(pg_dsn: str) -> AsyncIterator[tuple[list[Node], TcpProxy, str, tuple]]:
    """Nodes ``a`` and ``b`` on one schema through one proxy: (their addresses, the proxy,
    the store URL straight to the database, what names the database)."""
    target = urlsplit(pg_dsn)
    async with AsyncExitStack() as stack:
        url, schema = await stack.enter_async_context(pg_schema(pg_dsn))
        proxy = await stack.enter_async_context(
            open_tcp_proxy(target.hostname or "127.0.0.1", target.port or 5432)
        )
        nodes = []
        for node_id in ("a", "b"):
            config = Config(
                port=0,
                store=proxy.rewrite(url),
                node=NodeConfig(id=node_id, lease_seconds=LEASE, placement="leases"),
            )
            node = await stack.enter_async_context(open_node(config, tokens=TOKENS))
            nodes.append(Node(url=node.url, ws_url=node.url.replace("http://", "ws://") + "/ws"))
        database = (target.hostname or "", f":{proxy.port}", schema, "SELECT", "asyncpg")
        yield nodes, proxy, url, database


async def send(http: httpx.AsyncClient, session_id: str, content: str) -> int:
    answer = await http.post(f"/sessions/{session_id}/messages", json={"content": content})
    assert answer.status_code == 202, answer.text
    return answer.json()["input_id"]


async def metric(http: httpx.AsyncClient, name: str) -> float:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


async def full_sweeps(http: httpx.AsyncClient) -> float:
    """The node's sweeps that may declare nodes dead (not deferred after an outage)."""
    swept = await metric(http, "turnstile_node_sweeps_total")
    return swept - await metric(http, "turnstile_node_sweeps_deferred_total")


async def ran(http: httpx.AsyncClient, session_id: str, input_id: int) -> Turns:
    async def ended() -> Turns | None:
        log = await turns(http, session_id)
        return log if log is not None and log.ends[input_id] else None

    return await eventually(ended)


async def test_two_nodes_serve_again_after_an_outage_longer_than_their_lease(pg_dsn):
    """The store is cut off from both nodes until both leases ran out by the database's
    clock. Once it is back, neither node is declared dead: both serve on without a restart,
    a session made before is served through either node, a message sent after runs one turn
    (one ``stream_start``, one ``stream_end``), and every acknowledged message ran once."""
    async with two_nodes(pg_dsn) as (nodes, proxy, url, database):
        a, b = nodes
        async with a.http() as on_a, b.http() as on_b:
            acked: dict[str, list[int]] = {"s": [], "t": []}
            assert (await on_a.post("/sessions", json={"id": "s"})).status_code == 201
            assert (await on_b.post("/sessions", json={"id": "t"})).status_code == 201
            acked["s"].append(await send(on_a, "s", "before on a"))
            acked["t"].append(await send(on_b, "t", "before on b"))
            await ran(on_a, "s", acked["s"][0])
            await ran(on_b, "t", acked["t"][0])

            await proxy.cut()
            for http in (on_a, on_b):
                answer = await http.post("/sessions/s/messages", json={"content": "during"})
                assert_unavailable(answer, database=database)

            async def leases_ran_out() -> bool:
                rows = await pg_run(
                    url, "SELECT count(*) FROM nodes WHERE lease_expires_at > now()"
                )
                return rows[0][0] == 0

            await eventually(leases_ran_out)
            swept = [await full_sweeps(http) for http in (on_a, on_b)]
            proxy.heal()

            async def served_again(http: httpx.AsyncClient, session_id: str) -> int | None:
                answer = await http.post(
                    f"/sessions/{session_id}/messages",
                    json={"content": "after"},
                    headers={"Idempotency-Key": f"after-{session_id}"},  # a retry is one message
                )
                if answer.status_code == 503:
                    assert_unavailable(answer, database=database)
                    return None
                assert answer.status_code == 202, answer.text
                return answer.json()["input_id"]

            acked["s"].append(await eventually(lambda: served_again(on_b, "s")))
            acked["t"].append(await eventually(lambda: served_again(on_a, "t")))

            for session_id, ids in acked.items():
                for http in (on_a, on_b):
                    log = await ran(http, session_id, ids[-1])
                    log.assert_each_ran_once(ids)

            async def swept_in_full() -> bool:
                # a sweep after the outage that could have declared the other node dead
                for http, before in zip((on_a, on_b), swept, strict=True):
                    if await full_sweeps(http) < before + 1:
                        return False
                return True

            await eventually(swept_in_full)
            rows = await pg_run(url, "SELECT id, epoch, state FROM nodes ORDER BY id")
            assert [tuple(r) for r in rows] == [("a", 1, "running"), ("b", 1, "running")]
            for http in (on_a, on_b):  # both serve on, without a restart
                for session_id in acked:
                    answer = await http.get(f"/sessions/{session_id}")
                    assert answer.status_code == 200, answer.text


async def test_a_job_due_during_an_outage_fires_once_after_it_and_a_watcher_checks_on(
    pg_dsn,
):
    """A job falls due while the store is cut off from both nodes (its fire, or the look
    for jobs to take on of the node that owns it, meets the outage), and once the store is
    back it fires exactly once (one run record, one turn), whichever node fires it. A watcher
    (every 5 s, the shortest interval) keeps checking after it, and its checks are stored
    again."""
    async with two_nodes(pg_dsn) as (nodes, proxy, url, database):
        a, b = nodes
        async with a.http() as on_a, b.http() as on_b, connect(a) as ws:
            assert (await on_a.post("/sessions", json={"id": "j"})).status_code == 201
            watch = {"tool": "echo", "params": {"text": "steady"}, "interval": 5}
            made = await on_a.post("/sessions/j/watchers", json=watch)
            assert made.status_code == 201, made.text
            watcher_id = made.json()["watcher_id"]
            await ws.send(
                type="call",
                id="1",
                session_id="j",
                tool="schedule_once",
                arguments={"when": "in 2s", "prompt": "due", "action_type": "llm_prompt"},
            )
            result = await ws.expect("result", id="1")
            assert result["ok"] is True, result
            job_id = result["data"]["job_id"]
            await proxy.cut()
            fired = await pg_run(url, "SELECT count(*) FROM job_runs")
            assert fired[0][0] == 0  # it falls due during the cut, not before

            due = datetime.fromisoformat(result["data"]["run_at"])

            async def fell_due() -> bool:  # by the database's clock, while the cut lasts
                return (await pg_run(url, "SELECT now() > $1::timestamptz", due))[0][0]

            await eventually(fell_due)
            assert_unavailable(await on_b.get(f"/jobs/{job_id}"), database=database)
            proxy.heal()
            healed_at = datetime.now(UTC)

            async def settled() -> dict | None:
                answer = await on_b.get(f"/jobs/{job_id}")
                if answer.status_code == 503:
                    return None
                assert answer.status_code == 200, answer.text
                detail = answer.json()
                runs = detail["runs"]
                return detail if runs and runs[0]["state"] != "queued" else None

            detail = await eventually(settled)
            assert detail["job"]["state"] == "completed" and detail["job"]["run_count"] == 1
            (run,) = detail["runs"]
            assert run["state"] == "turn_completed" and run["detail"]["late_seconds"] > 0

            async def checked_since() -> dict | None:
                answer = await on_b.get(f"/watchers/{watcher_id}")
                if answer.status_code == 503:
                    return None
                assert answer.status_code == 200, answer.text
                status = answer.json()
                last = status["last_check_at"]
                return status if last and datetime.fromisoformat(last) > healed_at else None

            status = await eventually(checked_since)
            assert (status["status"], status["consecutive_errors"]) == ("running", 0)
            assert status["recent_history"][-1]["ok"] is True
            log = await turns(on_a, "j")
        job_turns = [e for e in log.events if e["type"] == "stream_start" and e.get("job_id")]
        assert [e["job_id"] for e in job_turns] == [job_id]  # one turn for the job
        log.assert_each_ran_once([e["input_id"] for e in job_turns])
