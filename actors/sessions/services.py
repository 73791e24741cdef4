"""What a session actor needs from the rest of the node, shared by every session of a node.

``SessionServices`` bundles the store, the agent, the tools and the node's hooks (metrics,
notifier, the turn shaper, the scheduled-turn slots); ``SessionLimits`` bounds one session.
``ToolCaller`` and ``TurnShaper`` are the protocols the tool registry and
``actors.execution.selection`` implement.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import trio

from turnstile.actors.sessions.agents.base import (
    Agent,
    HistoryEntry,
    ToolSpec,
    TurnInput,
    Usage,
)
from turnstile.actors.sessions.kinds import InputKinds, session_kinds
from turnstile.actors.sessions.turn import ToolCaller
from turnstile.runtime.placement import LeasePlacement
from turnstile.runtime.store import EventRecord, Store

__all__ = ["ToolCaller", "ShapedTurn", "TurnShaper", "SessionLimits", "SessionServices"]


class ShapedTurn(msgspec.Struct, frozen=True, kw_only=True):
    """What the model sees in one turn, as a ``TurnShaper`` chose it.

    Attributes:
        tools: the specs the turn carries.
        system_prompt: the runtime's default system prompt (``TurnInput.system_prompt``).
        history: the transcript fitted into the context budget.
        allowed: the tools the turn may call; None for every tool.
        context_tokens: what one model call may take (``TurnInput.context_tokens``).
    """

    tools: list[ToolSpec]
    system_prompt: str | None
    history: list[HistoryEntry]
    allowed: frozenset[str] | None = None
    context_tokens: int | None = None


class TurnShaper(Protocol):
    """Chooses a turn's tools, prompt and history (``tools.selection.TurnShaper``)."""

    def shape(
        self,
        metadata: dict[str, Any],
        turn_input: TurnInput,
        history: list[HistoryEntry],
        allowed: frozenset[str] | None,
        owner: str | None = None,
    ) -> ShapedTurn:
        """What the model sees this turn; ``allowed`` is the turn's own profile, if any;
        ``owner`` the session's user (tools may be kept from some users)."""
        ...


@dataclass(frozen=True)
class SessionLimits:
    """Bounds on what one session may hold.

    Attributes:
        max_queued_inputs: inputs waiting in the inbox before ``submit`` answers ``Busy``.
        max_content_chars: longest accepted input text.
        history_entries: transcript entries kept in memory and given to the agent.
    """

    max_queued_inputs: int = 100
    max_content_chars: int = 32_000
    history_entries: int = 200


class RunningTurns:
    """How many turns run on this node, for a graceful stop: ``draining`` stops the sessions
    from claiming more, and ``idle`` waits until the last one has closed."""

    def __init__(self) -> None:
        self.count = 0
        self.draining = False
        self._idle = trio.Event()
        self._idle.set()
        self._ended = trio.Event()

    def started(self) -> None:
        self.count += 1
        if self._idle.is_set():
            self._idle = trio.Event()

    def ended(self) -> None:
        self.count -= 1
        self._ended.set()
        self._ended = trio.Event()
        if self.count == 0:
            self._idle.set()

    async def one_ended(self) -> None:
        """Return once a turn has ended (any)."""
        await self._ended.wait()

    async def idle(self) -> None:
        """Return once no turn runs here."""
        while self.count:
            await self._idle.wait()


@dataclass
class SessionServices:
    """Everything a session actor uses, shared by all sessions of a node."""

    store: Store
    agent: Agent
    tools: ToolCaller
    limits: SessionLimits
    encode_event: Callable[[str, EventRecord], bytes]
    #: Called as every turn closes with its status, its seconds and its input's source
    #: (for /metrics).
    on_turn_closed: Callable[[str, float, str], None] | None = None
    #: Called with each model call's token counts as the agent reports them (for /metrics).
    on_usage: Callable[[Usage], None] | None = None
    #: The node's turn input kinds by source (``kinds``): filled by the features as they
    #: start; the sessions feature's own kinds by default.
    input_kinds: InputKinds = field(default_factory=session_kinds)
    #: Chooses each turn's tools, default prompt and history budget; None hands the agent
    #: every tool (or its profile's) and the whole kept history, with no default prompt.
    shaper: TurnShaper | None = None
    #: Node-wide slots for turns started by a job (``[limits] max_concurrent_scheduled_turns``);
    #: None runs them without a bound. User turns never take a slot.
    scheduled_turns: trio.CapacityLimiter | None = None
    #: ``async (owner, session_key) -> str | None``: system messages for each turn
    #: (``SessionHooks.turn_context``).
    turn_context: list[Callable[[str, str], Awaitable[str | None]]] = field(default_factory=list)
    #: ``async (owner, session_key, input_id) -> [HistoryEntry]``: the history a turn sees
    #: instead of its session's own (``SessionHooks.turn_history``); None for its own.
    turn_history: Callable[[str, str, int], Awaitable[list[HistoryEntry]]] | None = None
    #: With several nodes: the placement whose lease each activation holds; its lease epoch
    #: fences the session's writes (``runtime.placement``). None on one node.
    placement: LeasePlacement | None = None
    #: With several nodes: this node's side of sessions held elsewhere, and the announcements
    #: of its own sessions' events (``actors.sessions.remote``). None on one node.
    remote: Any = None
    #: The turns running on this node (a graceful stop waits for them).
    running: RunningTurns = field(default_factory=RunningTurns)
