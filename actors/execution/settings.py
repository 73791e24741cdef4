"""The execution feature's config section: ``[execution]``, what the model sees per turn."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = ["ExecutionConfig"]


class ExecutionConfig(msgspec.Struct, forbid_unknown_fields=True):
    """What the model sees per turn, ``[execution]`` (key names after the execution-primitives
    reference; see docs/tools.md, "What the model sees"). A session's ``metadata.execution``
    may override any of the tool keys for that session.

    Attributes:
        tool_mode: ``compact`` — the primitives' schemas plus ``tool_search``, whose
            description indexes every other tool (full schemas on demand, run with
            ``tool_run``); ``direct`` — every selected tool's full schema in every call.
        watchers: the ``watch_*`` tools (``execution.watchers``): ``True``, their schemas in
            every turn; ``False``, the model is not told of them at all (not carried, not in
            ``tool_search``'s index or answers, refused by ``tool_run``, ``run_parallel``,
            ``background_run`` and as a direct call, not in the prompt), as the reference
            has it; unset (None), like any other tool
            (indexed in compact mode).
        scheduler: the scheduling tools (``schedule_*``, ``remember``, ``cron``, recalls,
            heartbeats, checks; ``execution.scheduler``), the same three ways.
        default_channel: an output channel the prompt names as the default for notifications,
            jobs and watchers; setting it gives ``send_notification``'s schema in every turn.
        direct_tools: more tools whose full schemas every turn carries (``"http.get"``).
        tool_profile: the tool profile of ordinary turns (``full``, ``heartbeat``,
            ``heartbeat_active``): a restricted profile carries its tools' schemas directly and
            refuses every other tool.
        default_prompt: give agents the runtime's default system prompt (primitives, time).
        timezone: the time zone the prompt gives for a session without ``metadata.timezone``.
        max_context_tokens: the estimated tokens a model call may take (system prompts, tool
            schemas, history, input, and the turn's own tool calls and results; four
            characters a token); long tool results are cut and the oldest history goes first
            (see ``actors.sessions.agents.context``).
        unified_session: a user's sessions are one conversation (cron-session-binding.md's
            ``unified_session``): each turn sees the history of all its owner's sessions,
            merged in time order (``actors.sessions.history.unified_history``), while every
            input, event, job and watcher stays bound to the concrete session it belongs to.
            Node-wide, not per session.
    """

    tool_mode: Literal["compact", "direct"] = "compact"
    watchers: bool | None = None
    scheduler: bool | None = None
    default_channel: str = ""
    direct_tools: list[str] = msgspec.field(default_factory=list)
    tool_profile: str = "full"
    default_prompt: bool = True
    timezone: str = "UTC"
    max_context_tokens: Annotated[int, msgspec.Meta(ge=1000)] = 32_000
    unified_session: bool = False
