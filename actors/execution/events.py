"""The events the execution feature adds to a session's log (``docs/protocol.md``).

A tool call whose policy is ``APPROVE`` waits for a person: ``ApprovalRequired`` asks every
attached client (and reaches one that reconnects, by replay), ``ApprovalResolved`` says how it
ended. Background tasks report through ``Inject`` and publish no event of their own. Both are
``SessionEvent``s (see ``actors.sessions.event_types`` for how their fields are written).
"""

from __future__ import annotations

from typing import Any

from turnstile.actors.sessions.event_types import SessionEvent

__all__ = ["ApprovalRequired", "ApprovalResolved"]


class ApprovalRequired(SessionEvent, tag="approval_required", kw_only=True, frozen=True):
    """A tool call waits for a person to approve or deny it.

    Attributes:
        approval_id: what an ``approve`` or ``deny`` names.
        tool: the tool called.
        arguments: its arguments, each one too long to show replaced by a marker (the call
            itself gets them whole).
        expires_at: when an unanswered approval counts as denied (ISO 8601, ``Z``).
    """

    approval_id: str
    tool: str
    arguments: dict[str, Any]
    expires_at: str


class ApprovalResolved(SessionEvent, tag="approval_resolved", kw_only=True, frozen=True):
    """An approval was decided, timed out, or withdrawn.

    Attributes:
        approval_id: the approval.
        decision: ``approved``, ``denied``, ``timed_out`` or ``cancelled`` (the call waiting on
            it was cancelled: its client disconnected or its turn stopped).
        by: who decided; None when nobody did.
    """

    approval_id: str
    decision: str
    by: str | None
