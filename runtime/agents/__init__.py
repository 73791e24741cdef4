"""Agents: the protocol a turn runs through, and the built-in agents."""

from runtime.agents.base import (
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
from runtime.agents.openai import OpenAIAgent
from runtime.agents.scripted import ScriptedAgent

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
