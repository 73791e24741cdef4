"""One turn of a session: its running state (``Turn``) and the context its agent gets.

``TurnContext`` is what ``Agent.run_turn`` receives: the input, the history before it, the
tools, and the calls back into the session (stream a delta, call a tool, take injected
messages, report token usage).

Every tool call of a turn carries an idempotency key (``tool_call_key``): derived from the
turn's inbox row and the call's position in the turn (1 for its first call, 2 for the next…),
so the same call of the same input's turn, run again after a crash, has the same key, and a
receiver that honours ``Idempotency-Key`` does its work once. The key names nothing it comes
from (a hash), since it travels to other people's servers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import trio

from turnstile.actors.sessions.agents.base import (
    HistoryEntry,
    ToolResult,
    ToolSpec,
    TurnInput,
    Usage,
)
from turnstile.actors.sessions.event_types import SessionEvent, ToolCalled, ToolStarted
from turnstile.actors.sessions.history import tool_result_text
from turnstile.actors.sessions.ids import public_result
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.store import InboxItem

__all__ = [
    "TOOL_CALL_KEY_PREFIX",
    "ToolCaller",
    "Turn",
    "TurnContext",
    "TurnHost",
    "tool_call_key",
]

#: What every tool call key starts with: where it comes from, for whoever receives it.
TOOL_CALL_KEY_PREFIX = "turnstile-"


def tool_call_key(item: InboxItem, position: int) -> str:
    """The idempotency key of the ``position``-th tool call (from 1) of ``item``'s turn.

    The same for every run of the turn of that inbox row (its session, id and creation time,
    which a re-run keeps), different for every other row and position; ``turnstile-`` and 32
    hex characters (128 bits of SHA-256), which says nothing of the session or the input.
    """
    origin = f"{item.session_id}\n{item.id}\n{item.created_at.isoformat()}\n{position}"
    return TOOL_CALL_KEY_PREFIX + hashlib.sha256(origin.encode()).hexdigest()[:32]


class Turn:
    """A running turn: its input, cancel scope, injections, buffered events and tool bounds."""

    __slots__ = (
        "item",
        "scope",
        "injections",
        "cancel_status",
        "buffer",
        "tool_calls",
        "allowed",
        "usage",
        "origin",
    )

    def __init__(self, item: InboxItem) -> None:
        self.item = item
        self.scope = trio.CancelScope()
        self.injections: list[HistoryEntry] = []
        self.cancel_status = "stopped"
        #: Events held back until the turn ends (a heartbeat may turn out to be suppressed).
        self.buffer: list[tuple[str, dict[str, Any]]] | None = None
        self.tool_calls = 0
        #: Tools this turn may call (a heartbeat's tool profile); None allows every tool.
        self.allowed: frozenset[str] | None = None
        #: Tokens the turn's model calls used, summed; None when the agent reported none.
        self.usage: Usage | None = None
        #: What its ``stream_end`` says of the input it answers (``history.answer_origin``).
        self.origin: dict[str, Any] = {}

    def cancel(self, status: str) -> None:
        self.cancel_status = status
        self.scope.cancel()


class ToolCaller(Protocol):
    """Runs tools for a session's turns (the tool registry implements this)."""

    def specs(self) -> list[ToolSpec]:
        """The tools an agent may call, as function-calling specs."""
        ...

    async def call(
        self,
        session_id: str,
        owner: str,
        name: str,
        arguments: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        """Run ``name``; tool failures are returned, not raised. ``idempotency_key`` is the
        call's key within its turn (see ``turn.tool_call_key``), handed to the tool;
        ``call_id`` the model's id for the call, if it gave one (the call's span records it:
        ``gen_ai.tool.call.id``)."""
        ...


class TurnHost(Protocol):
    """A running turn's session: all a turn (its context, its input's kind) may do to it.

    The session actor gives each turn one (``SessionActor``'s private state stays its own).

    Attributes:
        session_id: the session's key.
        owner: the user the session belongs to.
        item: the inbox row the turn runs.
    """

    session_id: str
    owner: str
    item: InboxItem

    async def emit(self, event: SessionEvent, *, durable: bool = True) -> dict[str, Any]:
        """Emit one of the turn's events: at once, or held back while the turn buffers
        (``Turn.buffer``). Returns its payload as stored."""
        ...

    async def emit_stored(
        self, type_: str, payload: dict[str, Any], *, durable: bool = True
    ) -> None:
        """:meth:`emit` for an event already as stored (the per-token deltas' fast path)."""
        ...

    async def publish(self, type_: str, payload: dict[str, Any], *, durable: bool = True) -> None:
        """Append an event, as stored, straight to the session's log (past any buffer);
        ``durable=False`` goes on without waiting for its commit (it is stored in order, with
        the next write that waits: the turn's closure, for a heartbeat's forwarded events)."""
        ...

    async def enqueue(self, source: str, content: str, payload: dict[str, Any]) -> None:
        """Store an input to run as a turn of its own after this one."""
        ...

    def forget_turn(self) -> None:
        """Drop from the session's history every entry this turn added, its input's included
        (a turn logged, not forwarded: a quiet heartbeat)."""
        ...

    def remember(self, entry: HistoryEntry) -> None:
        """Add an entry to the session's history."""
        ...


class TurnContext:
    """The ``TurnContext`` a session hands its agent for one turn.

    Args:
        host: the turn's session.
        turn: the running turn.
        turn_input: what the agent answers.
        history: the history before this turn's input.
        tools: the node's tools.
        on_usage: called with each model call's token counts (metrics), or None.
    """

    __slots__ = (
        "_host",
        "_turn",
        "_caller",
        "_on_usage",
        "session_id",
        "input",
        "history",
        "tools",
    )

    def __init__(
        self,
        host: TurnHost,
        turn: Turn,
        turn_input: TurnInput,
        history: list[HistoryEntry],
        tools: ToolCaller,
        on_usage: Callable[[Usage], None] | None = None,
    ) -> None:
        self._host = host
        self._turn = turn
        self._caller = tools
        self._on_usage = on_usage
        self.session_id = host.session_id
        self.input = turn_input
        self.history = history
        allowed = turn.allowed
        self.tools = tools.specs()
        if allowed is not None:
            self.tools = [spec for spec in self.tools if spec.name in allowed]

    async def emit(self, type: str, text: str) -> None:
        if type not in ("stream_delta", "thinking_delta"):
            raise InvalidArgument(f"agents emit stream_delta or thinking_delta, not {type!r}")
        # Per token, so built as stored directly: what ``StreamDelta(...).stored()`` (or
        # ``ThinkingDelta``'s) gives, without a Struct and ``to_builtins`` per token (a test
        # pins the two to the same payload).
        payload = {"input_id": self.input.input_id, "text": text}
        await self._host.emit_stored(type, payload, durable=False)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], call_id: str | None = None
    ) -> ToolResult:
        host = self._host
        input_id = self.input.input_id
        named = msgspec.UNSET if call_id is None else call_id
        turn = self._turn
        turn.tool_calls += 1
        key = tool_call_key(turn.item, turn.tool_calls)  # before any await: the call's place
        started = ToolStarted(input_id=input_id, tool=name, call_id=named, arguments=arguments)
        await host.emit(started)
        if turn.allowed is not None and name not in turn.allowed:
            result = ToolResult(
                ok=False,
                error={
                    "code": "not_allowed",
                    "message": f"tool {name!r} is not allowed in this turn's tool profile",
                },
            )
        else:
            result = public_result(
                await self._caller.call(
                    host.session_id,
                    host.owner,
                    name,
                    arguments,
                    idempotency_key=key,
                    call_id=call_id,
                )
            )
        called = ToolCalled(
            input_id=input_id,
            tool=name,
            call_id=named,
            arguments=arguments,
            ok=result.ok,
            result=result.data if result.ok else msgspec.UNSET,
            error=msgspec.UNSET if result.ok else result.error,
        )
        await host.emit(called)
        host.remember(
            HistoryEntry(
                role="tool",
                content=tool_result_text(result),
                tool=name,
                arguments=arguments,
                call_id=call_id,
            )
        )
        return result

    def take_injections(self) -> list[HistoryEntry]:
        taken, self._turn.injections = self._turn.injections, []
        return taken

    def add_usage(self, usage: Usage) -> None:
        before = self._turn.usage or Usage()
        self._turn.usage = Usage(
            prompt_tokens=before.prompt_tokens + usage.prompt_tokens,
            completion_tokens=before.completion_tokens + usage.completion_tokens,
        )
        if self._on_usage is not None:
            self._on_usage(usage)
