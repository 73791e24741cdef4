"""The execution feature's events encode to exactly the frames clients always received."""

from __future__ import annotations

from tests.support.events import frame
from turnstile.actors.execution.events import ApprovalRequired, ApprovalResolved

TAIL = ',"session_id":"s1","seq":1,"ts":"2025-01-01T00:00:00Z"}'


def test_approval_required():
    event = ApprovalRequired(
        approval_id="a1",
        tool="shell.run",
        arguments={"cmd": "ls"},
        expires_at="2025-01-01T00:05:00Z",
    )
    assert (
        frame(event)
        == (
            '{"approval_id":"a1","tool":"shell.run","arguments":{"cmd":"ls"},'
            '"expires_at":"2025-01-01T00:05:00Z","type":"approval_required"' + TAIL
        ).encode()
    )


def test_approval_resolved_keeps_a_null_by():
    event = ApprovalResolved(approval_id="a1", decision="timed_out", by=None)
    assert (
        frame(event)
        == (
            '{"approval_id":"a1","decision":"timed_out","by":null,"type":"approval_resolved"' + TAIL
        ).encode()
    )
