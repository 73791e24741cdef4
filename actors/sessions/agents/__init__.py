"""Agents: the protocol a turn runs through, and the built-in agents."""

from turnstile.actors.sessions.agents.base import (
    Agent,
    AgentError,
    HistoryEntry,
    ToolResult,
    ToolSpec,
    TurnContext,
    TurnInput,
    Usage,
    function_name,
    tool_name,
)
from turnstile.actors.sessions.agents.openai import OpenAIAgent
from turnstile.actors.sessions.agents.scripted import ScriptedAgent

__all__ = [
    "Agent",
    "AgentError",
    "HistoryEntry",
    "ToolResult",
    "ToolSpec",
    "TurnContext",
    "TurnInput",
    "Usage",
    "function_name",
    "tool_name",
    "ScriptedAgent",
    "OpenAIAgent",
]
