"""The tool registry: named tools with typed parameters, callable by agents and clients.

A tool is an async function taking a ``ToolCall`` context and a msgspec ``Struct`` of
parameters. The registry derives each tool's JSON schema from that type (what a model's
function calling needs), validates arguments before the tool runs — a wrong argument is an
error naming the field, and the tool never sees it — and turns every failure into a
``ToolResult`` with a stable code instead of an exception, so one bad call cannot break a turn.

Policies (AUTO / APPROVE / BLOCK) and the http, filesystem and shell modules build on this.

A call runs in this order: arguments decoded, ``BLOCK`` refused, the tool's *precheck* (if it
registered one), approval (``APPROVE``), the handler. The precheck validates what the decoder
cannot (a path outside the workspace, content that is not valid base64) and raises the same
typed error the handler would, so a person is never asked to approve a call that would be
refused anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.agents.base import ToolResult, ToolSpec
from runtime.codec import Codec
from runtime.errors import DecodeError, TurnstileError
from tools.policy import Policy, PolicyTable

__all__ = ["Approver", "Precheck", "ToolCall", "ToolRegistry", "Tool"]

log = logging.getLogger("turnstile.tools")


@dataclass(frozen=True)
class ToolCall:
    """Who is calling a tool: the session and its owner, and whether the call already runs
    as a background task (a module's own background action then does its work inline)."""

    session_id: str
    owner: str
    background: bool = False


#: Asks a person to approve a call: ``(call, tool name, arguments) -> approved``.
Approver = Callable[[ToolCall, str, dict[str, Any]], Awaitable[bool]]

#: Validates a call's decoded parameters before approval is asked: ``(call, params) -> None``,
#: raising a ``TurnstileError`` (with ``field``) to refuse the call.
Precheck = Callable[[ToolCall, Any], Awaitable[None]]


@dataclass(frozen=True)
class Tool:
    """A registered tool."""

    name: str
    description: str
    params: type[msgspec.Struct]
    handler: Callable[[ToolCall, Any], Awaitable[Any]]
    codec: Codec
    schema: dict[str, Any]
    policy: Policy = Policy.AUTO
    precheck: Precheck | None = None


class ToolRegistry:
    """Tools by name, with their policies.

    Args:
        policies: overrides from the config file (see ``tools.policy``).
        approver: asks a person about ``APPROVE`` calls; without one they are refused.
    """

    def __init__(
        self, policies: PolicyTable | None = None, approver: Approver | None = None
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._specs: list[ToolSpec] | None = None
        self.policies = policies or PolicyTable()
        self.approver = approver

    def register(
        self,
        name: str,
        params: type[msgspec.Struct],
        handler: Callable[[ToolCall, Any], Awaitable[Any]],
        description: str,
        policy: Policy = Policy.AUTO,
        precheck: Precheck | None = None,
    ) -> None:
        """Add a tool; ``policy`` is its default (reads AUTO, writes APPROVE or BLOCK).

        ``precheck``, if given, runs before approval is asked (see the module docstring); it
        should be cheap and side-effect free, and the handler must still check everything
        itself (what was true at the precheck may have changed by the time it runs).

        Raises:
            ValueError: the name is taken or malformed.
        """
        if not name or len(name) > 128 or not name.replace(".", "_").isidentifier():
            raise ValueError(f"tool name must look like module.action, got {name!r}")
        if name in self._tools:
            raise ValueError(f"tool {name!r} is already registered")
        schema = msgspec.json.schema(params)
        if "$ref" in schema:  # inline the single definition: models want a plain object schema
            ref = schema["$ref"].rsplit("/", 1)[-1]
            schema = schema["$defs"][ref]
        self._tools[name] = Tool(
            name, description, params, handler, Codec(params), schema, Policy(policy), precheck
        )
        self._specs = None

    def validate(self, name: str, arguments: dict[str, Any]) -> None:
        """Check ``arguments`` against ``name``'s parameters without running it.

        Raises:
            KeyError: no such tool.
            DecodeError: the arguments do not fit; ``field`` names the culprit.
        """
        self._tools[name].codec.convert(arguments)

    def policy_of(self, name: str) -> Policy:
        """The policy in force for ``name`` (config overrides applied).

        Raises:
            KeyError: no such tool.
        """
        return self.policies.decide(name, self._tools[name].policy)

    def names(self) -> list[str]:
        """Registered tool names, sorted."""
        return sorted(self._tools)

    def specs(self) -> list[ToolSpec]:
        """Every tool as a function-calling spec, sorted by name (built once per change: every
        turn asks)."""
        if self._specs is None:
            self._specs = [
                ToolSpec(name=t.name, description=t.description, parameters=t.schema)
                for t in sorted(self._tools.values(), key=lambda t: t.name)
            ]
        return list(self._specs)

    async def call(
        self,
        session_id: str,
        owner: str,
        name: str,
        arguments: dict[str, Any],
        *,
        approved: bool = False,
        background: bool = False,
    ) -> ToolResult:
        """Validate ``arguments`` and run ``name``; failures come back as ``ToolResult``.

        ``approved``: a person already approved this very call (a module's background action
        that the runtime resumes as a task), so an APPROVE policy does not ask twice; only the
        runtime sets it. ``background``: the call runs as a background task (``ToolCall``).
        """
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult(
                ok=False, error={"code": "unknown_tool", "message": f"no tool named {name!r}"}
            )
        try:
            params = tool.codec.convert(arguments)
        except DecodeError as exc:
            error = {"code": "bad_arguments", "message": str(exc)}
            if exc.field:
                error["field"] = exc.field
            return ToolResult(ok=False, error=error)
        policy = self.policies.decide(name, tool.policy)
        call = ToolCall(session_id, owner, background)
        if policy is Policy.BLOCK:
            return ToolResult(
                ok=False, error={"code": "blocked", "message": f"{name} is blocked by policy"}
            )
        if tool.precheck is not None:
            try:
                await tool.precheck(call, params)
            except TurnstileError as exc:
                return ToolResult(ok=False, error=_error(exc))
            except Exception as exc:
                log.exception("precheck of tool %s failed", name)
                return ToolResult(
                    ok=False,
                    error={
                        "code": "tool_failed",
                        "message": f"{name} failed ({type(exc).__name__})",
                    },
                )
        if policy is Policy.APPROVE and not approved:
            if self.approver is None:
                return ToolResult(
                    ok=False,
                    error={
                        "code": "requires_approval",
                        "message": f"{name} needs approval and nobody can give it here",
                    },
                )
            if not await self.approver(call, name, arguments):
                return ToolResult(
                    ok=False, error={"code": "denied", "message": f"{name} was not approved"}
                )
        try:
            data = await tool.handler(call, params)
        except TurnstileError as exc:
            return ToolResult(ok=False, error=_error(exc))
        except Exception as exc:
            log.exception("tool %s failed", name)
            return ToolResult(
                ok=False,
                error={"code": "tool_failed", "message": f"{name} failed ({type(exc).__name__})"},
            )
        return ToolResult(ok=True, data=msgspec.to_builtins(data))


def _error(exc: TurnstileError) -> dict[str, Any]:
    """A tool result's ``error`` for a typed error: its code, message and field."""
    error = {"code": exc.code, "message": str(exc)}
    if getattr(exc, "field", None):
        error["field"] = exc.field
    return error
