"""An approval whose caller is cancelled is withdrawn, not left pending."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import trio
import trio.testing

from turnstile.actors.execution.approvals import ApprovalDesk
from turnstile.runtime.clock import MockWallClock
from turnstile.runtime.errors import NotFound
from turnstile.tools.registry import ToolCall


async def test_a_cancelled_caller_withdraws_its_approval(autojump_clock):
    events = []

    async def publish(session_id, message):
        await trio.lowlevel.checkpoint()  # a real publish waits: the withdrawal is shielded
        events.append((session_id, *message.event.stored()))

    desk = ApprovalDesk(publish, MockWallClock(datetime(2026, 11, 21, tzinfo=UTC)), timeout=300)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:

            async def ask():
                await desk.request(ToolCall("s", "ada"), "shell.run", {"cmd": "ls"})
                raise AssertionError("the request returned although its caller was cancelled")

            nursery.start_soon(ask, name="approval asker")
            await trio.testing.wait_all_tasks_blocked()
            (pending,) = desk.pending("s")
            nursery.cancel_scope.cancel()
        assert desk.pending("s") == []
        with pytest.raises(NotFound):
            desk.resolve("ada", pending["approval_id"], True)
        assert [(e[1], e[2]) for e in events[1:]] == [
            (
                "approval_resolved",
                {"approval_id": pending["approval_id"], "decision": "cancelled", "by": None},
            )
        ]
        assert trio.current_time() < 300  # withdrawn at once, not at the timeout
