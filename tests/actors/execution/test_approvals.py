"""The approval desk on trio's MockClock: silence is a denial."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import trio
import trio.testing

from turnstile.actors.execution.approvals import ApprovalDesk
from turnstile.actors.execution.schema import EXECUTION
from turnstile.runtime.clock import MockWallClock
from turnstile.runtime.errors import NotFound
from turnstile.runtime.store import ClusterView, NodeRecord, NodeRef, open_store
from turnstile.tools.registry import ToolCall


async def test_an_unanswered_approval_times_out_as_denied(autojump_clock):
    events = []

    async def publish(session_id, message):
        events.append((session_id, *message.event.stored()))

    desk = ApprovalDesk(publish, MockWallClock(datetime(2026, 11, 21, tzinfo=UTC)), timeout=30)
    start = trio.current_time()
    approved = await desk.request(ToolCall("s", "ada"), "shell.run", {"cmd": "ls"})
    assert approved is False
    assert trio.current_time() - start == 30
    (required, resolved) = events
    assert required[1] == "approval_required"
    assert required[2]["expires_at"] == "2026-11-21T00:00:30Z"
    assert resolved[1:] == (
        "approval_resolved",
        {"approval_id": required[2]["approval_id"], "decision": "timed_out", "by": None},
    )
    assert desk.pending("s") == []
    with pytest.raises(NotFound):
        desk.resolve("ada", required[2]["approval_id"], True)  # too late


async def test_only_the_sessions_owner_can_decide(autojump_clock):
    async def publish(session_id, message):
        pass

    desk = ApprovalDesk(publish, MockWallClock(datetime(2026, 11, 21, tzinfo=UTC)))
    async with trio.open_nursery() as nursery:
        result = []

        async def ask():
            result.append(await desk.request(ToolCall("s", "ada"), "filesystem.write", {}))

        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        (pending,) = desk.pending("s")
        with pytest.raises(NotFound, match="no pending approval with id"):
            desk.resolve("mallory", pending["approval_id"], True)
        assert desk.resolve("ada", pending["approval_id"], True)["decision"] == "approved"
    assert result == [True]


async def test_the_approvals_of_an_ended_node_incarnation_are_withdrawn_once(store_url):
    """Two incarnations' calls wait; a view shows the first ended (its node started again):
    a pass deletes only its rows and tells their session ``cancelled``; two passes at once
    (two nodes sweeping) delete and tell each once; the live incarnation's row stays."""
    now = datetime(2026, 11, 21, tzinfo=UTC)
    events = []
    asked = trio.Semaphore(0)

    async def publish(session_id, message):
        events.append((session_id, *message.event.stored()))
        if events[-1][1] == "approval_required":  # its row is stored
            asked.release()

    async with open_store(store_url, migrations=[EXECUTION]) as store:
        for node in ("a", "b"):
            await store.create_session(f"s-{node}", "ada")
        desk = ApprovalDesk(publish, MockWallClock(now), timeout=300, store=store)
        async with trio.open_nursery() as nursery:
            for node in ("a", "b"):
                store.claimer = NodeRef(node, 1)
                nursery.start_soon(desk.request, ToolCall(f"s-{node}", "ada"), "echo", {})
                await asked.acquire()
            view = ClusterView(now=now, nodes=[_node("a", 2, now), _node("b", 1, now)])
            dropped = []
            async with trio.open_nursery() as passes:
                for _ in range(2):
                    passes.start_soon(lambda: _extend(dropped, desk.drop_lost(view)))
            assert [session for _, session in dropped] == ["s-a"]
            assert [a["tool"] for a in await desk.list_pending("s-b")] == ["echo"]
            assert await desk.list_pending("s-a") == []
            told = [e for e in events if e[1] == "approval_resolved"]
            assert told == [
                (
                    "s-a",
                    "approval_resolved",
                    {"approval_id": dropped[0][0], "decision": "cancelled", "by": None},
                )
            ]
            nursery.cancel_scope.cancel()


async def _extend(into: list, rows) -> None:
    into.extend(await rows)


def _node(node_id: str, epoch: int, at: datetime) -> NodeRecord:
    return NodeRecord(
        id=node_id,
        epoch=epoch,
        state="running",
        address=None,
        started_at=at,
        heartbeat_at=at,
        lease_expires_at=at,
        alive=True,
    )
