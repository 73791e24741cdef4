"""A session's turn inputs, typed: what an inbox row's ``payload`` holds, by ``source``.

Every turn starts from an inbox row (``InboxItem``): a ``source`` and a JSON ``payload``. The
payload has no tag of its own — the row's ``source`` is the tag — so :func:`decode_input` picks
the Struct by source and converts the payload once, at the start of the turn; the session then
branches on the Struct's type instead of on strings and ``dict.get``.

================  =======================  =================================================
``source``        Struct                   written by
================  =======================  =================================================
``user``          :class:`UserMessage`     the directory's ``submit`` (HTTP and WebSocket)
``notification``  :class:`Injection`       ``Inject``: the notification buffer, watcher
                                           escalation, background-task results
``webhook``       :class:`WebhookEvent`    the webhooks feature (GitHub CI failures, declared
                                           Standard Webhooks hooks)
``cron``          :class:`CronTrigger`     the ``cron`` tool; ``schedule_cron``; ``remember``
                                           with a recurring ``when``
``schedule``      :class:`ScheduledJob`    ``schedule_once``; ``remember`` with a one-off
``recall``        :class:`RecallFiring`    ``schedule_recall``
``heartbeat``     :class:`HeartbeatRun`    ``set_heartbeat``; a heartbeat's ``retry_once``
``check``         :class:`ScheduledCheck`  ``schedule_check``
anything else     :class:`OtherInput`      an ``AddJob`` whose ``deliver`` names no source
                                           (the job's kind is the source), a ``Submit`` or
                                           ``Inject`` with a source of its own
================  =======================  =================================================

Inputs a job delivers (every scheduled kind, and ``OtherInput``) share :class:`ScheduledAction`:
the scheduler's fields (``job_id``, ``run_id``, ``kind``, ``label``, ``scheduled_for``) and
what the occurrence does (``action_type``, ``tool_name``/``tool_params``,
``output_channel``/``output_config``). Any input may carry ``was_injected``: an input folded into
a turn that ended before the agent took it is queued again as a turn of its own.

Compatibility: payloads stored before these Structs existed must keep reading. So every field
has a default (older rows lack ``run_id``, newer keys; only a ``prompt_ref``, when there is
one, must name its prompt and version), unknown keys are ignored (``AddJob`` callers may add
their own), and the types are strict (no ``"3"`` for ``3``). Nothing is re-encoded: the store
keeps the row as written, and the agent's ``TurnInput.payload`` is the stored dict (less
``content``), not these Structs. A payload that does not convert raises
:class:`InputPayloadError`; the session closes that turn as ``failed`` and goes on.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.store import InboxItem

__all__ = [
    "IN_SESSION",
    "CronTrigger",
    "HeartbeatRun",
    "HeartbeatSettings",
    "InboxInput",
    "Injection",
    "InputPayloadError",
    "OtherInput",
    "PromptRef",
    "RecallFiring",
    "ScheduledAction",
    "ScheduledCheck",
    "ScheduledJob",
    "UserMessage",
    "WebhookEvent",
    "decode_input",
    "decode_payload",
]

#: The output channel that means "into the session" (a turn the agent answers).
IN_SESSION = "llm_notification"


class InputPayloadError(InvalidArgument):
    """An input's payload does not decode as the Struct its ``source`` names (a row written by
    hand, by a newer version, or damaged; or a ``Submit`` carrying such a payload).

    Attributes:
        input_id: the inbox row, or None for an input not stored yet (a ``Submit``).
        source: the input's source.
    """

    code = "bad_input_payload"

    def __init__(self, input_id: int | None, source: str, why: str) -> None:
        what = "a submitted input" if input_id is None else f"input {input_id}"
        super().__init__(f"{what} ({source!r}) has an unreadable payload: {why}", "payload")
        self.input_id = input_id
        self.source = source


class _Input(msgspec.Struct, frozen=True, kw_only=True):
    """What every input has.

    Attributes:
        content: the text the turn starts from (for a job: the rendered prompt or trigger line).
        was_injected: it was folded into a turn that ended before the agent took it, and was
            queued again as a turn of its own.
    """

    content: str = ""
    was_injected: bool = False


class UserMessage(_Input, frozen=True, kw_only=True):
    """A message the session's owner sent (``source="user"``)."""


class Injection(_Input, frozen=True, kw_only=True):
    """A notice for the session sent with ``Inject`` (``source="notification"``), queued as a
    turn of its own because no turn was running to take it.

    Attributes:
        notification_id: (notify tool) the notification it tells of.
        watcher_id: (watcher escalation) the first watcher of the batch.
        watcher_ids: (watcher escalation) every watcher of the batch.
        background_tasks: (background results) the finished tasks it reports.
    """

    notification_id: str | None = None
    watcher_id: str | None = None
    watcher_ids: list[str | None] = msgspec.field(default_factory=list)
    background_tasks: list[str] = msgspec.field(default_factory=list)


class WebhookEvent(_Input, frozen=True, kw_only=True):
    """An event an external system sent (``source="webhook"``); its other keys (a failing CI
    run's ``name``, ``conclusion``, ``output_title``… or a hook's ``data``) reach the agent in
    ``TurnInput.payload`` as they were sent.

    Attributes:
        hook: who sent it: ``github`` or a declared hook's name.
        event: its kind (``check_run``, ``workflow_run``, or the sender's ``type``).
        delivery_id: the sender's delivery, unique (``github:<X-GitHub-Delivery>``).
        source_ref: what it is about (``owner/repo#check_run:<id>``).
    """

    hook: str = ""
    event: str = ""
    delivery_id: str = ""
    source_ref: str = ""


class ScheduledAction(_Input, frozen=True, kw_only=True):
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
    run_id: int | None = None
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


class OtherInput(ScheduledAction, frozen=True, kw_only=True):
    """An input whose source names none of the others. It may come from a job (an ``AddJob``
    whose ``deliver`` names no source), so it keeps the scheduled fields."""


#: Every decoded input.
InboxInput = (
    UserMessage
    | Injection
    | WebhookEvent
    | CronTrigger
    | ScheduledJob
    | RecallFiring
    | HeartbeatRun
    | ScheduledCheck
    | OtherInput
)

_BY_SOURCE: dict[str, type[_Input]] = {
    "user": UserMessage,
    "notification": Injection,
    "webhook": WebhookEvent,
    "cron": CronTrigger,
    "schedule": ScheduledJob,
    "recall": RecallFiring,
    "heartbeat": HeartbeatRun,
    "check": ScheduledCheck,
}


def decode_payload(source: str, payload: dict[str, Any], input_id: int | None = None) -> InboxInput:
    """The Struct ``source`` names, converted from ``payload`` (which is left as it is).

    Args:
        source: the input's source; an unknown one gives an :class:`OtherInput`.
        payload: the input's payload, ``content`` included.
        input_id: the inbox row, for the error; None for an input not stored yet.

    Returns:
        one of :data:`InboxInput`.

    Raises:
        InputPayloadError: the payload does not convert (the message says where and why).
    """
    try:
        return msgspec.convert(payload, _BY_SOURCE.get(source, OtherInput))
    except msgspec.ValidationError as exc:
        raise InputPayloadError(input_id, source, str(exc)) from None


def decode_input(item: InboxItem) -> InboxInput:
    """The inbox row ``item``'s payload, decoded by its ``source``.

    Raises:
        InputPayloadError: the payload does not convert; ``input_id`` is ``item.id``.
    """
    return decode_payload(item.source, item.payload, item.id)
