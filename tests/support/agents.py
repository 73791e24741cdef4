"""Agents and turn contexts for tests: ``GatedAgent`` (replies when the test opens the gate),
``SeeingAgent`` (keeps what each turn was given), ``FakeTurn`` (a ``TurnContext`` that records
what an agent does), and ``ENV_VARS``, the settings the openai agent reads from the environment.
"""

from __future__ import annotations

from typing import Any

import trio

from turnstile.actors.sessions.agents.base import (
    HistoryEntry,
    ToolResult,
    ToolSpec,
    TurnContext,
    TurnInput,
    Usage,
)


class GatedAgent:
    """Replies only when the test opens the gate for that turn, so "mid-turn" is exact.

    The reply is ``reply:<content>``, plus any injected inputs taken at the end.
    """

    name = "gated"

    def __init__(self) -> None:
        self.gates: dict[str, trio.Event] = {}
        self.running: list[str] = []

    def gate(self, content: str) -> trio.Event:
        return self.gates.setdefault(content, trio.Event())

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn: TurnContext) -> str:
        content = turn.input.content
        self.running.append(content)
        if content.startswith("wait:"):
            await self.gate(content).wait()
        injected = [entry.content for entry in turn.take_injections()]
        reply = f"reply:{content}" + (f" +{','.join(injected)}" if injected else "")
        await turn.emit("stream_delta", reply)
        return reply


class SeeingAgent(GatedAgent):
    """Keeps each turn's input and history, to check what the agent was given."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs = []
        self.histories = []

    async def run_turn(self, turn) -> str:
        self.inputs.append(turn.input)
        self.histories.append(list(turn.history))
        return await super().run_turn(turn)


class FakeTurn:
    """A TurnContext that records what the agent does."""

    def __init__(
        self,
        content: str = "hello",
        *,
        source: str = "user",
        history: list[HistoryEntry] | None = None,
        tools: list[ToolSpec] | None = None,
        injections: list[HistoryEntry] | None = None,
        inject_on_call: list[HistoryEntry] | None = None,
        results: dict[str, Any] | None = None,
        context_tokens: int | None = None,
    ) -> None:
        self.session_id = "s-1"
        self.input = TurnInput(
            input_id=1, source=source, content=content, context_tokens=context_tokens
        )
        self.results = results or {}  # tool name -> the data its call answers
        self.history = history or []
        self.tools = tools or []
        self.events: list[tuple[str, str]] = []
        self.calls: list[tuple[str, dict[str, Any], str | None]] = []
        self.injections = list(injections or [])
        self.inject_on_call = list(inject_on_call or [])
        self.usage: list[Usage] = []

    async def emit(self, type: str, text: str) -> None:
        self.events.append((type, text))

    async def call_tool(
        self, name: str, arguments: dict[str, Any], call_id: str | None = None
    ) -> ToolResult:
        self.calls.append((name, arguments, call_id))
        self.injections.extend(self.inject_on_call)
        self.inject_on_call = []
        if name == "broken":
            return ToolResult(ok=False, error={"code": "boom", "message": "it broke"})
        if name in self.results:
            return ToolResult(ok=True, data=self.results[name])
        return ToolResult(ok=True, data={"time": "12:00", "args": arguments})

    def take_injections(self) -> list[HistoryEntry]:
        taken, self.injections = self.injections, []
        return taken

    def add_usage(self, usage: Usage) -> None:
        self.usage.append(usage)

    def deltas(self, kind: str = "stream_delta") -> list[str]:
        return [text for type, text in self.events if type == kind]


#: Environment variables the openai agent reads; cleared so a developer's own never leak in.
ENV_VARS = (
    "TURNSTILE_OPENAI_BASE_URL",
    "OPENAI_BASE_URL",
    "TURNSTILE_OPENAI_MODEL",
    "OPENAI_MODEL",
    "TURNSTILE_OPENAI_API_KEY",
    "OPENAI_API_KEY",
)
