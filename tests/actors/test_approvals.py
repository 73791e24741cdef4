"""The approval desk on trio's MockClock: silence is a denial."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import trio
import trio.testing

from turnstile.actors.execution.approvals import ApprovalDesk
from turnstile.runtime.clock import MockWallClock
from turnstile.runtime.errors import NotFound
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
