"""The events the scheduling feature adds to a session's log (``docs/protocol.md``).

``JobUpdate`` follows every job of the session (scheduled, fired, cancelled…); a recall also
gets a ``RecallUpdate`` (its banner and sidebar follow it). Both are ``SessionEvent``s: fields
in the order their keys were always written, a key only some events carry ``UNSET`` when
absent (see ``actors.sessions.event_types``).
"""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from turnstile.actors.sessions.event_types import SessionEvent

__all__ = ["JobUpdate", "RecallUpdate"]


class JobUpdate(SessionEvent, tag="job_update", kw_only=True, frozen=True):
    """A job of the session was scheduled, fired, cancelled, rescheduled, paused, resumed,
    missed or skipped outside its active hours.

    Attributes:
        job_id: the job.
        kind: its kind (``once``, ``cron``, ``recall``, ``heartbeat``, ``check``…).
        event: what happened (``scheduled``, ``fired``, ``cancelled``, ``rescheduled``,
            ``paused``, ``resumed``, or the run state of an occurrence that ran no turn, such
            as ``missed``).
        state: the job's state now (``active``, ``paused``, ``completed``, ``cancelled``).
        label: its label; may be empty.
        next_fire_at: its next occurrence (ISO 8601), or None.
        run_count: the turns it has delivered.
        run_id: (``fired``) the run record of this occurrence.
    """

    job_id: str
    kind: str
    event: str
    state: str
    label: str
    next_fire_at: str | None
    run_count: int
    run_id: int | UnsetType = UNSET


class RecallUpdate(SessionEvent, tag="recall_update", kw_only=True, frozen=True):
    """The session's recall changed: ``recall_view``'s fields, then what happened.

    Attributes:
        recall_id: the recall (also its job's id).
        call_type: ``once``, ``recurring`` or ``immediate``; None for a job not written as a
            recall.
        status: ``pending``, ``paused``, ``fired`` or ``cancelled``.
        trigger_at: its next occurrence (ISO 8601, ``Z``), or None.
        interval_seconds: (recurring) its period.
        internal_comment: the agent's note about it.
        additional_context_message: the self-instruction.
        fired_count: how many times it fired.
        created_at, updated_at: ISO 8601, ``Z``.
        action: ``scheduled``, ``cancelled``, ``skipped``, ``fired`` (a once or immediate
            recall: it is done) or ``rescheduled`` (a recurring one fired; ``trigger_at`` is
            its next occurrence).
        skipped_trigger_at: (``skipped``) the occurrence that was skipped.
        fired_at: (``fired``, ``rescheduled``) the occurrence that fired.
        run_id: (``fired``, ``rescheduled``) its run record.
    """

    recall_id: str
    call_type: str | None
    status: str
    trigger_at: str | None
    interval_seconds: int | None
    internal_comment: str
    additional_context_message: str
    fired_count: int
    created_at: str | None
    updated_at: str | None
    action: str
    skipped_trigger_at: str | None | UnsetType = UNSET
    fired_at: str | None | UnsetType = UNSET
    run_id: int | UnsetType = UNSET
