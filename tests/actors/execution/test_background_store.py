"""The background tasks' rows on both backends: which running tasks are lost (their incarnation
ended: stopped, declared dead, or superseded by a newer epoch), closed once however many nodes
pass at once, each session told once; the live ones left alone. An ended task whose node died
before telling its session is told by the next pass, under the key its node stored. The
per-session limit on running tasks holds however many nodes start tasks at once."""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import timedelta

import trio

from turnstile.actors.execution.background import LostTasks
from turnstile.actors.execution.background_schema import BACKGROUND
from turnstile.actors.execution.queries import FINISH, GET, LIST, LOOK, START
from turnstile.runtime.clock import SystemClock
from turnstile.runtime.store import open_store

LEASE = 600.0


async def start(store, key: str, task_id: str, node, limit: int = 20) -> int | None:
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
    return await store.run(START, task=row, keep=100, limit=limit)


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
        finish = {"state": "completed", "result": '{"success": true}', "now": now, "notice": "k"}
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
            await store.run(START, task=row, keep=2, limit=20)
            if n < 3:  # the newest stays running
                now = store.db_time(clock.now())
                done = {"state": "completed", "result": None, "now": now, "notice": f"k{n}"}
                assert await store.run(FINISH, session_key="ada/s", id=f"bg-{n}", **done)
        await start(store, "ada/t", "bg-t", a.ref)  # another session's are not counted
        kept = await store.run(LIST, session_key="ada/s", limit=10)
        assert [(t.id, t.state) for t in kept] == [
            ("bg-3", "running"),
            ("bg-2", "completed"),
            ("bg-1", "completed"),
        ]


async def test_an_ended_task_whose_node_died_before_telling_is_told_under_its_key(store_url):
    """Issue 23's crash harness (scenario ``background``): a node stored a task's end and died
    before its session was told. Before, the end also marked it told, and nothing ever told it.
    Now the pass after that incarnation's end tells it, from its row, under the notice key the
    node stored with the end (one notice for the tasks of one batch); a live node's untold
    tasks are its own to tell."""
    async with open_store(store_url, migrations=[BACKGROUND]) as store:
        a, _ = await store.register_node("a", lease_seconds=LEASE)
        b, _ = await store.register_node("b", lease_seconds=LEASE)
        for task_id, node in (("bg-1", a), ("bg-2", a), ("bg-3", a), ("bg-b", b)):
            await start(store, "ada/s", task_id, node.ref)
        now = store.db_time(SystemClock().now())
        ends = {
            "bg-1": ("completed", "background:bg-1"),
            "bg-2": ("failed", "background:bg-1"),  # ended in bg-1's batch window
            "bg-3": ("completed", "background:bg-3"),
            "bg-b": ("completed", "background:bg-b"),
        }
        for task_id, (state, notice) in ends.items():
            result = '{"success": true, "data": 7}' if state == "completed" else None
            assert await store.run(
                FINISH,
                session_key="ada/s",
                id=task_id,
                state=state,
                result=result,
                now=now,
                notice=notice,
            )
        told: list = []

        async def tell(key, notice) -> None:
            told.append((key, notice))

        lost = LostTasks(store, SystemClock(), tell)
        assert await lost.close(await store.list_nodes()) == []
        assert told == []  # a and b live: theirs to tell
        assert await store.stop_node(a.ref)  # a died (or stopped) before telling
        assert await lost.close(await store.list_nodes()) == []  # nothing was running
        got = {n.idempotency_key: (k, n.payload["background_tasks"], n.content) for k, n in told}
        assert sorted(got) == ["background:bg-1", "background:bg-3"]
        key, ids, text = got["background:bg-1"]
        assert (key, ids) == ("ada/s", ["bg-1", "bg-2"])
        assert text.startswith("[BACKGROUND TASK COMPLETED] task_id=bg-1, tool=test.hang, ")
        assert '\nResult: {"success": true, "data": 7}\n\n[BACKGROUND TASK FAILED]' in text
        assert got["background:bg-3"][1] == ["bg-3"]
        # told: not again; b's task stays b's
        untold = (await store.run(LOOK, limit=10))[1]
        assert [t.id for t in untold] == ["bg-b"]
        assert await lost.close(await store.list_nodes()) == []
        assert len(told) == 2
        row = await store.run(GET, session_key="ada/s", id="bg-1")
        assert row.notified_at is not None and row.notice == "background:bg-1"


async def test_the_running_limit_holds_for_starts_at_once_through_several_nodes(store_url):
    """50 starts at once, through three nodes (each with its store), for a session at limit −
    1: exactly one is recorded, the others answer how many run; another session's tasks do
    not count."""
    limit = 5
    async with AsyncExitStack() as stack:
        stores = [
            await stack.enter_async_context(open_store(store_url, migrations=[BACKGROUND]))
            for _ in range(3)
        ]
        node, _ = await stores[0].register_node("a", lease_seconds=LEASE)
        for n in range(limit - 1):
            assert await start(stores[0], "ada/s", f"bg-{n}", node.ref, limit) is None
        assert await start(stores[0], "ada/t", "bg-t", node.ref, 1) is None
        answers: list = []

        async def one(n: int) -> None:
            answers.append(await start(stores[n % 3], "ada/s", f"bg-x{n}", node.ref, limit))

        async with trio.open_nursery() as nursery:
            for n in range(50):
                nursery.start_soon(one, n)
        assert answers.count(None) == 1
        assert sorted(set(answers) - {None}) == [limit]
        running = await stores[1].run(LIST, session_key="ada/s", limit=100)
        assert len(running) == limit
