"""The background tasks' rows on both backends: which running tasks are lost (their incarnation
ended: stopped, declared dead, or superseded by a newer epoch), closed once however many nodes
pass at once, each session told once; the live ones left alone."""

from __future__ import annotations

from datetime import timedelta

import trio

from turnstile.actors.execution.background import LostTasks
from turnstile.actors.execution.background_schema import BACKGROUND
from turnstile.actors.execution.queries import FINISH, GET, LIST, LOOK, START
from turnstile.runtime.clock import SystemClock
from turnstile.runtime.store import open_store

LEASE = 600.0


async def start(store, key: str, task_id: str, node) -> None:
    row = {
        "id": task_id,
        "session_key": key,
        "owner": key.split("/")[0],
        "tool": "test.hang",
        "args": "{}",
        "started_at": store.db_time(SystemClock().now() - timedelta(seconds=3)),
        "node_id": node.id,
        "node_epoch": node.epoch,
    }
    await store.run(START, task=row, keep=100)


async def test_the_tasks_of_ended_incarnations_are_closed_once_by_concurrent_passes(store_url):
    async with open_store(store_url, migrations=[BACKGROUND]) as store:
        a, _ = await store.register_node("a", lease_seconds=LEASE)
        b, _ = await store.register_node("b", lease_seconds=LEASE)
        c1, _ = await store.register_node("c", lease_seconds=LEASE)
        view_before_c2 = await store.list_nodes()
        c2, _ = await store.register_node("c", lease_seconds=LEASE)  # c started again
        for n in range(5):
            await start(store, f"ada/s{n % 2}", f"bg-a{n}", a.ref)
        await start(store, "ada/s0", "bg-b", b.ref)
        await start(store, "bob/s", "bg-c1", c1.ref)
        await start(store, "bob/s", "bg-c2", c2.ref)
        assert await store.stop_node(a.ref)  # a stopped (cleanly, or declared dead)
        view = await store.list_nodes()

        told: list[tuple[str, object]] = []

        async def tell(key, notice) -> None:
            told.append((key, notice))

        passes = [LostTasks(store, SystemClock(), tell) for _ in range(3)]
        closed: list = []

        async def one(lost: LostTasks) -> None:
            closed.extend(await lost.close(view))

        async with trio.open_nursery() as nursery:
            for lost in passes:
                nursery.start_soon(one, lost)
        # each lost task closed by exactly one pass; the live incarnations' tasks left alone
        assert sorted(t.id for t in closed) == [
            "bg-a0",
            "bg-a1",
            "bg-a2",
            "bg-a3",
            "bg-a4",
            "bg-c1",
        ]
        states = {
            t.id: t.state
            for key in ("ada/s0", "ada/s1", "bob/s")
            for t in await store.run(LIST, session_key=key, limit=10)
        }
        assert states == {
            "bg-a0": "lost",
            "bg-a1": "lost",
            "bg-a2": "lost",
            "bg-a3": "lost",
            "bg-a4": "lost",
            "bg-c1": "lost",
            "bg-b": "running",
            "bg-c2": "running",
        }
        # every lost task's session was told (twice at most, by two passes at once, always the
        # same notice under the same key: the session stores it once)
        by_id: dict[str, set] = {}
        for key, notice in told:
            (task_id,) = notice.payload["background_tasks"]
            assert notice.idempotency_key == f"background-lost:{task_id}"
            by_id.setdefault(task_id, set()).add((key, notice.content))
        assert sorted(by_id) == sorted(t.id for t in closed)
        assert all(len(notices) == 1 for notices in by_id.values())
        (c1_notice,) = by_id["bg-c1"]
        assert c1_notice[0] == "bob/s"
        assert c1_notice[1].startswith("[BACKGROUND TASK FAILED] task_id=bg-c1, tool=test.hang, ")
        assert c1_notice[1].endswith(
            "\nError: lost: node 'c' epoch 1 ended before the task finished (the node started"
            " again as epoch 2)"
        )
        # all told: the next pass closes and tells nothing
        assert (await store.run(LOOK, limit=100))[1] == []
        count = len(told)
        assert await passes[0].close(await store.list_nodes()) == []
        assert len(told) == count
        # a view read before c started again does not know c's new epoch: nothing of it is lost
        await start(store, "bob/s", "bg-c2b", c2.ref)
        assert await passes[0].close(view_before_c2) == []
        # the node that ran a lost task and finishes it later finds it lost: it tells nobody
        now = store.db_time(SystemClock().now())
        finish = {"state": "completed", "result": '{"success": true}', "now": now}
        assert not await store.run(FINISH, session_key="ada/s0", id="bg-a0", **finish)
        assert await store.run(FINISH, session_key="ada/s0", id="bg-b", **finish)
        row = await store.run(GET, session_key="ada/s0", id="bg-a0")
        assert row.state == "lost" and row.result["error"]["code"] == "lost"


async def test_a_tell_that_fails_is_tried_again_at_the_next_pass(store_url):
    async with open_store(store_url, migrations=[BACKGROUND]) as store:
        a, _ = await store.register_node("a", lease_seconds=LEASE)
        await start(store, "ada/s", "bg-1", a.ref)
        assert await store.stop_node(a.ref)
        told: list[str] = []
        failing = True

        async def tell(key, notice) -> None:
            if failing:
                raise RuntimeError("the session's queue is full")
            told.append(notice.content)

        lost = LostTasks(store, SystemClock(), tell)
        assert [t.id for t in await lost.close(await store.list_nodes())] == ["bg-1"]
        assert told == []
        failing = False
        assert await lost.close(await store.list_nodes()) == []  # nothing more to close…
        assert len(told) == 1  # …but the session is told now
        assert (await store.run(LOOK, limit=10))[1] == []


async def test_a_start_forgets_the_sessions_oldest_finished_tasks_past_those_kept(store_url):
    async with open_store(store_url, migrations=[BACKGROUND]) as store:
        a, _ = await store.register_node("a", lease_seconds=LEASE)
        clock = SystemClock()
        for n in range(4):
            row = {
                "id": f"bg-{n}",
                "session_key": "ada/s",
                "owner": "ada",
                "tool": "echo",
                "args": "{}",
                "started_at": store.db_time(clock.now() + timedelta(seconds=n)),
                "node_id": a.id,
                "node_epoch": a.epoch,
            }
            await store.run(START, task=row, keep=2)
            if n < 3:  # the newest stays running
                done = {"state": "completed", "result": None, "now": store.db_time(clock.now())}
                assert await store.run(FINISH, session_key="ada/s", id=f"bg-{n}", **done)
        await start(store, "ada/t", "bg-t", a.ref)  # another session's are not counted
        kept = await store.run(LIST, session_key="ada/s", limit=10)
        assert [(t.id, t.state) for t in kept] == [
            ("bg-3", "running"),
            ("bg-2", "completed"),
            ("bg-1", "completed"),
        ]
