"""What a tool is to a model and to a caller: its advertised spec and the outcome of a call.

These types belong to the tool system because every feature's tools produce them and every
agent consumes them; ``turnstile.actors.sessions.agents`` re-exports them for agent authors.

Tool names: inside the runtime a tool is ``module.action`` (policies, config, run_parallel's
``actions[].name`` use that). Model servers accept only ``^[a-zA-Z0-9_-]{1,64}$`` as a function
name, so an agent advertises ``function_name(name)`` (dots become ``__``) and maps what the
model calls back with ``tool_name``; the registry refuses names for which that is not a
one-to-one round trip.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

__all__ = ["FUNCTION_NAME", "ToolResult", "ToolSpec", "function_name", "tool_name"]

#: What OpenAI (and the servers that copy its rules) accept as a function name.
FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def function_name(name: str) -> str:
    """The name a tool is advertised under to a model: ``clock.now`` -> ``clock__now``.

    Dots are not allowed in function names; a double underscore is (and no tool name has one,
    see ``tools.registry``), so the mapping can be reversed by ``tool_name``.
    """
    return name.replace(".", "__")


def tool_name(function: str) -> str:
    """The runtime's name for a function name a model called: ``clock__now`` -> ``clock.now``."""
    return function.replace("__", ".")


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as a model's function calling sees it (name, description, JSON schema)."""

    name: str
    description: str
    parameters: dict[str, Any]


class ToolResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The outcome of a tool call, success or not; tool errors are data, not exceptions.

    Attributes:
        ok: whether the tool succeeded.
        data: the tool's result when ``ok``.
        error: ``{"code": …, "message": …, "field"?: …}`` when not ``ok``.
    """

    ok: bool
    data: Any = None
    error: dict[str, Any] | None = None
