"""Scheduling's turn inputs: what a job's occurrence puts in a session's inbox, typed.

A fire stores the job's ``deliver`` template with the occurrence's fields (``job_id``,
``kind``, ``label``, ``scheduled_for``) and the run record's id (``run_id``, added by the
store's fire transaction) as the input's payload, under the job's source:

================  =======================  =================================================
``source``        Struct                   written by
================  =======================  =================================================
``cron``          :class:`CronTrigger`     the ``cron`` tool; ``schedule_cron``; ``remember``
                                           with a recurring ``when``
``schedule``      :class:`ScheduledJob`    ``schedule_once``; ``remember`` with a one-off
``once``          :class:`ScheduledJob`    an ``AddJob`` of kind ``once`` naming no source
``recall``        :class:`RecallFiring`    ``schedule_recall``
``heartbeat``     :class:`HeartbeatRun`    ``set_heartbeat``; a heartbeat's ``retry_once``
``check``         :class:`ScheduledCheck`  ``schedule_check``
================  =======================  =================================================

They share :class:`ScheduledAction`: the scheduler's fields and what the occurrence does
(``action_type``, ``tool_name``/``tool_params``, ``output_channel``/``output_config``). The
kinds that read them (``turns``) are registered with the sessions feature's input kinds
when scheduling starts; no other feature reads these keys. Every field has a default, so
payloads stored by earlier releases read on; ``run_id`` must fit the store's 64-bit ids.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.sessions.inputs import IN_SESSION, TurnPayload

__all__ = [
    "SCHEDULED_INPUTS",
    "CronTrigger",
    "HeartbeatRun",
    "HeartbeatSettings",
    "JobRef",
    "PromptRef",
    "RecallFiring",
    "RunId",
    "ScheduledAction",
    "ScheduledCheck",
    "ScheduledJob",
]

#: A run record's id: the store's ids are 64-bit.
RunId = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]


class JobRef(msgspec.Struct, frozen=True, kw_only=True):
    """The job and run an input of a scheduled source names: read on its own when the rest of
    the payload does not decode, so that the run still gets the failure.

    Attributes:
        job_id: the job.
        run_id: the run record (absent from inputs stored before the fire put it there).
    """

    job_id: str | None = None
    run_id: RunId | None = None


class ScheduledAction(TurnPayload, frozen=True, kw_only=True):
    """The part every input a job delivers shares: which job and run, and what to do.

    Attributes:
        job_id: the job; None for an input no job delivered.
        run_id: the run record the fire wrote (absent from inputs stored before the fire put
            it there: the session then finds the run by ``job_id``).
        kind: the job's kind (``once``, ``cron``, ``recall``…).
        label: the job's label; may be empty.
        scheduled_for: the occurrence it delivers, ISO 8601.
        action_type: ``llm_prompt`` (the agent answers ``content``), ``notification`` (a
            message to relay), ``tool_call`` (run ``tool_name`` first, then the agent sees its
            result) or ``heartbeat``; None or another value runs as ``llm_prompt``, as the
            scheduler renders it.
        tool_name: (tool_call) the tool to run.
        tool_params: (tool_call) its arguments.
        output_channel: where the output goes; None or ``llm_notification`` is into the session.
        output_config: the channel's options for this job.
    """

    job_id: str | None = None
    run_id: RunId | None = None
    kind: str | None = None
    label: str = ""
    scheduled_for: str | None = None
    action_type: str | None = None
    tool_name: str | None = None
    tool_params: dict[str, Any] = msgspec.field(default_factory=dict)
    output_channel: str | None = None
    output_config: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def channel(self) -> str:
        """The output channel, ``llm_notification`` when none is named."""
        return self.output_channel or IN_SESSION


class PromptRef(msgspec.Struct, frozen=True, kw_only=True):
    """A cron prompt's versioned reference (cron-session-binding.md).

    Attributes:
        name: the prompt's name in its session (``daily-monitor``).
        version: the version of that name's text, from 1.
        sha256: the text's SHA-256, hex.
        template: the trigger line's format (``cron.trigger@v1``).
    """

    name: str
    version: int
    sha256: str = ""
    template: str = ""


class CronTrigger(ScheduledAction, frozen=True, kw_only=True):
    """An occurrence of a cron job (``source="cron"``).

    Attributes:
        cron_job_name: (``cron`` tool) the prompt's name.
        prompt_ref: (``cron`` tool) the prompt's versioned reference; jobs made by
            ``schedule_cron`` or ``remember`` have none.
    """

    cron_job_name: str | None = None
    prompt_ref: PromptRef | None = None


class ScheduledJob(ScheduledAction, frozen=True, kw_only=True):
    """A one-off job's occurrence (``source="schedule"``: ``schedule_once``, ``remember``)."""


class RecallFiring(ScheduledAction, frozen=True, kw_only=True):
    """A recall the agent scheduled for itself (``source="recall"``).

    Attributes:
        recall_id: the recall (also its job's id).
        instruction: the self-instruction, handed to the agent as a system message.
        is_recall: always true as written; the source already says so.
    """

    recall_id: str | None = None
    instruction: str = ""
    is_recall: bool = True


class HeartbeatSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A heartbeat's settings, as ``set_heartbeat`` copies them into every occurrence.

    Attributes:
        checklist: what to check; the turn's system segment quotes it.
        model_override: a model for these turns instead of the agent's default.
        tool_profile: the node's tool profile the turn may use.
        max_tokens: a cap on the answer's length.
        suppress_threshold: an answer shorter than this, from a turn that called no tool, is
            logged but not forwarded.
        on_error: what a failed turn does: nothing, run once more, or disable the heartbeat.
        dedicated: the turn runs in a dedicated session, from a clean context.
        alert_channel: where ``on_error: disable`` says so.
        heartbeat_of: the session the heartbeat belongs to (its alerts go there).
    """

    checklist: str = ""
    model_override: str | None = None
    tool_profile: str = "heartbeat"
    max_tokens: int | None = None
    suppress_threshold: int = 300
    on_error: Literal["skip", "retry_once", "disable"] = "skip"
    dedicated: bool = True
    alert_channel: str = IN_SESSION
    heartbeat_of: str | None = None


class HeartbeatRun(ScheduledAction, frozen=True, kw_only=True):
    """A heartbeat's occurrence (``source="heartbeat"``).

    Attributes:
        heartbeat: its settings; None runs it as an ordinary turn.
        retry: this is the one retry of a failed occurrence (``on_error: retry_once``).
    """

    heartbeat: HeartbeatSettings | None = None
    retry: bool = False


class ScheduledCheck(ScheduledAction, frozen=True, kw_only=True):
    """A check the agent asked to come back to (``source="check"``).

    Attributes:
        type: the work item's type, ``scheduled_check``.
        instructions: what to check or do, in full.
        reference: the PR, ticket or URL it is about.
        requested_at: when it was asked for, ISO 8601.
    """

    type: str = "scheduled_check"
    instructions: str = ""
    reference: str | None = None
    requested_at: str | None = None


#: The Struct of each source scheduling writes.
SCHEDULED_INPUTS: dict[str, type[ScheduledAction]] = {
    "cron": CronTrigger,
    "schedule": ScheduledJob,
    "once": ScheduledJob,
    "recall": RecallFiring,
    "heartbeat": HeartbeatRun,
    "check": ScheduledCheck,
}
