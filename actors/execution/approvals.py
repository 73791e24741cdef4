"""The approval desk: a person decides whether an ``APPROVE`` tool call may run.

When a tool whose policy is ``APPROVE`` is called, the desk records a pending approval, emits
``approval_required`` into the calling session (so every attached client sees it, and a client
that reconnects gets it by replay), and waits. A client answers with an ``approve`` or ``deny``
frame (or ``POST /approvals/{id}/approve|deny``); the desk emits ``approval_resolved`` and the
call runs or is refused. No answer within the timeout is a denial. If the call that asked is
cancelled while it waits (its WebSocket client went away, its turn was stopped), the approval is
withdrawn: it leaves the pending list and ``approval_resolved`` says ``cancelled``. Pending
approvals live in memory: a node that restarts has also lost the turn that was waiting.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import trio

from turnstile.actors.execution.events import ApprovalRequired, ApprovalResolved
from turnstile.actors.sessions.actor import Publish
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument, NotFound

__all__ = ["ApprovalDesk"]

#: Arguments larger than this are cut in the approval_required event (the call gets them whole).
MAX_SHOWN_ARGUMENT_CHARS = 4000

#: Seconds the ``approval_resolved`` event may take to reach a busy session before it is given
#: up (it is published shielded, even while the waiting call is being cancelled).
RESOLVED_PUBLISH_GRACE = 10.0


class _Pending:
    __slots__ = ("id", "session_id", "owner", "tool", "decided", "approved", "by")

    def __init__(self, id: str, session_id: str, owner: str, tool: str) -> None:
        self.id = id
        self.session_id = session_id
        self.owner = owner
        self.tool = tool
        self.decided = trio.Event()
        self.approved = False
        self.by: str | None = None


class ApprovalDesk:
    """Pending approvals, by id.

    Args:
        publish: ``async (session_id, message)`` — tells a session actor (``Publish``).
        clock: for the ``expires_at`` shown to people.
        timeout: seconds before an unanswered approval counts as denied.
    """

    def __init__(
        self,
        publish: Callable[[str, Any], Awaitable[None]],
        clock: Clock,
        timeout: float = 300.0,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.publish = publish
        self.clock = clock
        self.timeout = timeout
        self._pending: dict[str, _Pending] = {}

    def pending(self, session_id: str) -> list[dict[str, Any]]:
        """The approvals a session is waiting on."""
        return [
            {"approval_id": p.id, "tool": p.tool}
            for p in self._pending.values()
            if p.session_id == session_id
        ]

    async def request(self, call, tool: str, arguments: dict[str, Any]) -> bool:
        """Ask the session's people; True only if someone approves in time (the ``Approver``)."""
        pending = _Pending(uuid.uuid4().hex[:16], call.session_id, call.owner, tool)
        self._pending[pending.id] = pending
        expires = self.clock.now() + timedelta(seconds=self.timeout)
        shown = {
            k: (v if len(repr(v)) <= MAX_SHOWN_ARGUMENT_CHARS else "…(too long to show)")
            for k, v in arguments.items()
        }
        announced = timed_out = False
        try:
            await self.publish(
                call.session_id,
                Publish(
                    event=ApprovalRequired(
                        approval_id=pending.id,
                        tool=tool,
                        arguments=shown,
                        expires_at=expires.isoformat().replace("+00:00", "Z"),
                    )
                ),
            )
            announced = True
            with trio.move_on_after(self.timeout) as waiting:
                await pending.decided.wait()
            timed_out = waiting.cancelled_caught
            return pending.approved
        finally:
            # Also when the caller is cancelled: nobody can decide any more, and the people
            # shown approval_required must not be left with a question that means nothing.
            self._pending.pop(pending.id, None)
            if announced:
                if pending.decided.is_set():
                    decision = "approved" if pending.approved else "denied"
                else:
                    decision = "timed_out" if timed_out else "cancelled"
                with trio.move_on_after(RESOLVED_PUBLISH_GRACE, shield=True):
                    await self.publish(
                        call.session_id,
                        Publish(
                            event=ApprovalResolved(
                                approval_id=pending.id, decision=decision, by=pending.by
                            )
                        ),
                    )

    def drop_session(self, session_id: str) -> int:
        """Deny every approval a deleted session is waiting on (nobody can answer them any
        more, and none may be answered for a later session of the same name); returns how
        many there were."""
        mine = [p for p in self._pending.values() if p.session_id == session_id]
        for pending in mine:
            if not pending.decided.is_set():
                pending.approved = False
                pending.decided.set()
            self._pending.pop(pending.id, None)
        return len(mine)

    def resolve(self, user: str, approval_id: str, approved: bool) -> dict[str, Any]:
        """Record a person's decision.

        Raises:
            NotFound: no pending approval with that id for this user's sessions.
        """
        pending = self._pending.get(approval_id)
        if pending is None or pending.owner != user:
            raise NotFound(f"no pending approval with id {approval_id!r}")
        if pending.decided.is_set():
            raise InvalidArgument(f"approval {approval_id!r} is already decided")
        pending.approved = approved
        pending.by = user
        pending.decided.set()
        return {
            "approval_id": approval_id,
            "decision": "approved" if approved else "denied",
            "session_id": pending.session_id,
        }
