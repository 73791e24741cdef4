"""Tools every node has: harmless, read-only, useful for trying the protocol out."""

from __future__ import annotations

from typing import Annotated

import msgspec

from turnstile.runtime.clock import Clock
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = ["register_builtin_tools"]


class EchoParams(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of ``echo``."""

    text: Annotated[str, msgspec.Meta(max_length=10_000, description="text to send back")]


class NoParams(msgspec.Struct, forbid_unknown_fields=True):
    """A tool without arguments."""


def register_builtin_tools(registry: ToolRegistry, clock: Clock) -> None:
    """Register ``echo`` and ``clock.now``."""

    async def echo(call: ToolCall, params: EchoParams) -> dict[str, str]:
        return {"text": params.text}

    async def now(call: ToolCall, params: NoParams) -> dict[str, str]:
        return {"utc": clock.now().isoformat()}

    registry.register("echo", EchoParams, echo, "Return the given text unchanged.")
    registry.register("clock.now", NoParams, now, "The current time in UTC (ISO 8601).")
