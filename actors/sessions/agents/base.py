"""The agent protocol: what a turn gets, and what it gives back.

A session runs one turn at a time. For each turn the runtime builds a ``TurnContext`` and calls
``await agent.run_turn(ctx)``. The agent streams text and thinking through ``ctx.emit``, calls
tools through ``ctx.call_tool`` (the runtime emits ``tool_started`` / ``tool_call`` events and
records the call in history), and, before each model call, folds in what
``ctx.take_injections()`` hands it (background results, watcher escalations, injected user
messages). It returns the final response text; an empty string closes the turn with the
explicit status ``empty``. Raising closes the turn as ``failed`` with a short message on the
stream; the full exception goes to the internal run record, not the transcript.

System messages, in the order an agent sends them: one system message made of
``TurnInput.system_prompt`` (the runtime's default), the agent's own configured prompt and
``TurnInput.system_segment``, in that order; then each of ``TurnInput.system_messages`` as a
system message of its own (what the node's features add for this turn, such as the memory
feature's ``## What I remember about the user``); then the history; then the input.

Cancellation (``stop``, ``interrupt``) arrives as ``trio.Cancelled`` at the agent's next
checkpoint; agents must let it propagate.

Tool names: inside the runtime a tool is ``module.action`` (policies, config, run_parallel's
``actions[].name`` use that). Model servers accept only ``^[a-zA-Z0-9_-]{1,64}$`` as a function
name, so an agent advertises ``function_name(name)`` (dots become ``__``) and maps what the
model calls back with ``tool_name``; the registry refuses names for which that is not a
one-to-one round trip.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from turnstile.tools.spec import FUNCTION_NAME, ToolResult, ToolSpec, function_name, tool_name

__all__ = [
    "Agent",
    "AgentError",
    "HistoryEntry",
    "ToolSpec",
    "ToolResult",
    "TurnContext",
    "TurnInput",
    "Usage",
    "FUNCTION_NAME",
    "function_name",
    "tool_name",
]


class AgentError(Exception):
    """A turn failed for a reason worth showing the user in one short line."""


class TurnInput(msgspec.Struct, frozen=True, kw_only=True):
    """What started the turn.

    Attributes:
        input_id: the durable inbox id.
        source: ``user``, ``cron``, ``recall``, ``heartbeat``, ``webhook`` or ``notification``.
        content: the text the agent should respond to.
        payload: everything else the sender attached.
        system_prompt: the runtime's default system prompt for this turn (the execution
            primitives, the session's time zone and the current time; see
            ``actors.sessions.agents.prompt``). An agent puts it first, then its own configured
            system prompt, then ``system_segment``. None when the node gives none.
        system_segment: text to append to the agent's system prompt for this turn only
            (heartbeats say "this is a scheduled check" and give the checklist).
        system_messages: system messages the node's features add for this turn (the memory
            feature's summary of the user); an agent sends each as a system message of its
            own, after its system prompt and before the history. Empty when none.
        model: a model to use for this turn instead of the agent's default.
        max_tokens: a cap on the answer's length for this turn.
        context_tokens: the estimated tokens one model call of this turn may take (system
            prompts, tool schemas, history and the turn's own messages, tool results
            included; ``actors.sessions.agents.context``), from ``[execution]
            max_context_tokens``; None: no bound.
        notice: the input is the runtime telling the agent something (a scheduled job's
            notification or tool result), not words to answer as the user's: an agent that
            tells roles apart gives it as a system message, as it does every input whose
            ``source`` is ``notification`` (execution-primitives reference).
    """

    input_id: int
    source: str
    content: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    system_prompt: str | None = None
    system_segment: str | None = None
    system_messages: tuple[str, ...] = ()
    model: str | None = None
    max_tokens: int | None = None
    context_tokens: int | None = None
    notice: bool = False


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One item of a session's transcript, oldest first.

    Attributes:
        role: ``user`` (any input, see ``source``), ``assistant`` or ``tool``.
        content: the text (for ``tool``: the JSON result).
        source: for ``user`` entries, where the input came from; for ``assistant`` entries, the
            source of the input the turn answered, when it is not ``user`` (a UI renders a
            cron job's or a recall's answer as such).
        tool: for ``tool`` entries, the tool's name.
        arguments: for ``tool`` entries, the arguments it was called with.
        call_id: for ``tool`` entries, the model's id for the call (if any).
        status: for ``assistant`` entries, how the turn ended.
        is_recall: for ``user`` entries, the input is a recall the agent scheduled for itself
            (its self-instruction reached the agent as a system message, not as this entry).
        cron_turn: for ``user`` entries, the input is a scheduled job's firing (a cron
            turn's trigger, the reference's ``_cron_turn``), not words the user typed.
        cron_job_id: for ``user`` entries from a scheduled job, the job; for ``assistant``
            entries, the job whose firing the turn answered.
        cron_job_name: with ``cron_job_id``, the job's name (a ``cron`` job's prompt name,
            another job's label), when it has one.
        cron_run_id: for ``user`` entries from a scheduled job, the run record of this firing.
        cron_prompt_ref: for ``user`` entries from a ``cron`` job, the versioned prompt
            reference (``{"name", "version", "sha256", "template"}``).
        notice: for ``user`` entries, the input was a notice from the runtime (a scheduled
            job's notification or tool result, ``TurnInput.notice``).
    """

    role: Literal["user", "assistant", "tool"]
    content: str
    source: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    call_id: str | None = None
    status: str | None = None
    is_recall: bool = False
    cron_turn: bool = False
    cron_job_id: str | None = None
    cron_job_name: str | None = None
    cron_run_id: int | None = None
    cron_prompt_ref: dict[str, Any] | None = None
    notice: bool = False


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens one model call used, as the server counted them.

    Attributes:
        prompt_tokens: tokens of the request (system prompt, history, tool schemas).
        completion_tokens: tokens of the answer (reasoning included where servers count it).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0


@runtime_checkable
class TurnContext(Protocol):
    """What an agent may see and do during one turn."""

    session_id: str
    input: TurnInput
    history: list[HistoryEntry]
    tools: list[ToolSpec]

    async def emit(self, type: Literal["stream_delta", "thinking_delta"], text: str) -> None:
        """Stream a piece of the answer (``stream_delta``) or of the reasoning."""
        ...

    async def call_tool(
        self, name: str, arguments: dict[str, Any], call_id: str | None = None
    ) -> ToolResult:
        """Run a tool by name; never raises for tool failures (see ``ToolResult.ok``)."""
        ...

    def take_injections(self) -> list[HistoryEntry]:
        """Inputs queued for this turn's next model call (and forget them)."""
        ...

    def add_usage(self, usage: Usage) -> None:
        """Count one model call's tokens towards the turn (its ``stream_end`` and /metrics)."""
        ...


@runtime_checkable
class Agent(Protocol):
    """Something that can run a turn."""

    name: str

    async def run_turn(self, turn: TurnContext) -> str:
        """Run one turn and return the final response text ('' for an empty result)."""
        ...

    async def aclose(self) -> None:
        """Release what the agent holds (HTTP clients, …)."""
        ...
