"""A SQLite file locked by another process is an outage too (issue 23, 'Store outages').

A node served on loopback on a SQLite file; the test holds the file's write lock from a plain
``sqlite3`` connection (``BEGIN EXCLUSIVE``, as another process writing would) for longer than
the store's busy timeout (``runtime.store.sqlite.BUSY_TIMEOUT``, 10 s, shortened here): a write
is ``503 store_unavailable`` with ``Retry-After`` and nothing of the file or the SQL in the
body; reads go on (WAL); once the lock is released the node serves again, without a restart,
and nothing it acknowledged is lost.
"""

from __future__ import annotations

import sqlite3

import httpx
import trio

from tests.support.node import running_node
from tests.support.outage import Turns, assert_unavailable, turns
from tests.support.polling import eventually


async def test_a_sqlite_file_locked_past_the_busy_timeout_is_503_then_served_again(
    tmp_path, monkeypatch
):
    from turnstile.runtime.store import sqlite

    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT", 0.5)
    path = str(tmp_path / "node.db")
    database = (str(tmp_path), "node.db", "sqlite", "locked", "INSERT", "SELECT", "BEGIN")
    async with running_node(tmp_path) as node, node.http() as http:
        assert (await http.post("/sessions", json={"id": "s1"})).status_code == 201
        before = await http.post("/sessions/s1/messages", json={"content": "before"})
        assert before.status_code == 202, before.text
        acked = [before.json()["input_id"]]

        async def ran(input_id: int) -> Turns | None:
            log = await turns(http, "s1")
            return log if log is not None and log.ends[input_id] else None

        await eventually(lambda: ran(acked[0]))

        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            await trio.to_thread.run_sync(other.execute, "BEGIN EXCLUSIVE")
            for method, path_, body in [
                ("POST", "/sessions/s1/messages", {"content": "during"}),
                ("POST", "/sessions", {"id": "s2"}),
            ]:
                answer = await http.request(method, path_, json=body, timeout=30)
                assert_unavailable(answer, database=database)
            # reads go on: in WAL mode a writer's lock does not stop them
            history = await http.get("/sessions/s1/history")
            assert history.status_code == 200, history.text
        finally:
            await trio.to_thread.run_sync(other.execute, "ROLLBACK")
            other.close()

        async def sent_again() -> httpx.Response | None:
            answer = await http.post(
                "/sessions/s1/messages", json={"content": "after"}, headers={"Idempotency-Key": "a"}
            )
            if answer.status_code == 503:
                assert_unavailable(answer, database=database)
                return None
            return answer

        answer = await eventually(sent_again)
        assert answer.status_code == 202, answer.text
        acked.append(answer.json()["input_id"])
        assert (await http.post("/sessions", json={"id": "s2"})).status_code == 201
        log = await eventually(lambda: ran(acked[1]))
    log.assert_each_ran_once(acked)
    assert set(log.starts) == set(acked)  # the 503 message was not stored
