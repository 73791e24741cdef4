"""PostgreSQL: a fire (``first=True``) is served before the operations already waiting for a
connection, and fires among themselves in the order they came (docs/store.md, "Fires first")."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from tests.runtime.store._support import T0
from turnstile.actors.scheduling.schema import SCHEDULING
from turnstile.actors.scheduling.store import JobStore
from turnstile.runtime.store import open_store, ops

pytestmark = pytest.mark.postgres


def _on_postgres(fn) -> ops.Operation:
    """An operation that runs ``await fn(conn)`` on a pooled connection."""
    return ops.procedure("test.hold", sqlite=None, postgres=fn, writes=True)


async def test_a_fire_is_served_before_operations_already_waiting(pg_store):
    async with open_store(pg_store, migrations=[SCHEDULING]) as store:
        jobs = JobStore(store)
        await store.create_session("s1", "ada")
        await jobs.create_job("j1", kind="once", spec={}, session_id="s1", next_fire_at=T0)
        pool = store.engine._pool
        assert pool._size == 1
        pool._max_size = 1  # one connection: every other operation waits for it
        held = threading.Event()

        async def hold(conn):  # asyncio side
            held.set()
            await conn.execute("SELECT pg_sleep(0.3)")

        answers = {}

        async def enqueue():
            answers["queued"] = await store.enqueue_input("s1", "user", {"text": "waiting"})

        async def fire():
            answers["fired"] = await jobs.fire_job("j1", T0, None, input=("job", {"n": 1}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run, _on_postgres(hold))
            await trio.to_thread.run_sync(held.wait)
            nursery.start_soon(enqueue)
            await trio.testing.wait_all_tasks_blocked()  # its request is in before the fire's
            nursery.start_soon(fire)
        # the inbox ids give the order: the fire's input was inserted first
        assert answers["fired"].input.id < answers["queued"].id


async def test_fires_waiting_for_a_connection_are_served_in_the_order_they_came(pg_store):
    # under a steady stream of fires, the oldest waiting fire is the latest: it goes first
    async with open_store(pg_store, migrations=[SCHEDULING]) as store:
        jobs = JobStore(store)
        await store.create_session("s1", "ada")
        for job_id in ("j1", "j2", "j3"):
            await jobs.create_job(job_id, kind="once", spec={}, session_id="s1", next_fire_at=T0)
        pool = store.engine._pool
        assert pool._size == 1
        pool._max_size = 1  # one connection: every other operation waits for it
        held, release = threading.Event(), threading.Event()

        async def hold(conn):  # asyncio side: keeps the connection until released
            held.set()
            while not release.is_set():
                await conn.execute("SELECT pg_sleep(0.005)")

        async def let_go():  # asyncio side, after the requests made before it
            release.set()

        answers = {}

        async def fire(job_id):
            answers[job_id] = await jobs.fire_job(job_id, T0, None, input=("job", {}))

        async def enqueue():
            answers["queued"] = await store.enqueue_input("s1", "user", {"text": "waiting"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run, _on_postgres(hold))
            await trio.to_thread.run_sync(held.wait)
            for job_id in ("j1", "j2"):
                nursery.start_soon(fire, job_id)
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(enqueue)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(fire, "j3")
            await trio.testing.wait_all_tasks_blocked()
            await store.engine._aio.call(let_go)
        order = sorted(answers, key=lambda k: getattr(answers[k], "input", answers[k]).id)
        assert order == ["j1", "j2", "j3", "queued"]
