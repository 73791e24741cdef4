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

A tool registered with ``offered=False`` is not offered to a model (``specs`` leaves it out,
so no turn carries it and ``tool_search`` does not list it) but stays callable by name, with
its own policy: another tool fronts it (the memory feature offers one ``memory`` tool with an
``action`` and runs ``memory.save`` … through the registry).

A tool whose parameters are not a msgspec type (a tool another program describes, such as an MCP
server's) is registered with ``schema=``, the JSON Schema a model is shown, and ``params=dict``:
its arguments reach the handler as a dict, and its precheck validates them against the schema.
Such tools can come and go while the node runs (``unregister``; ``version`` counts the changes).
A feature may keep tools from some sessions' models (``hiders``: an MCP server a user may not
use); the turn shaper and the discovery tools ask ``hidden_from``.

After a call succeeds, the registry's *observers* see it (``ToolRegistry.observers``): a feature
that reacts to what a tool did, without the tool knowing the feature (the webhooks feature binds
a session to the pull request an ``http.post`` to GitHub's API opened). Observers run before the
result is returned, in order; one that raises is logged and the result stands.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from turnstile.runtime import tracing
from turnstile.runtime.codec import Codec
from turnstile.runtime.errors import DecodeError, TurnstileError
from turnstile.runtime.gateway.frames import public_error
from turnstile.tools.policy import Policy, PolicyTable
from turnstile.tools.spec import FUNCTION_NAME, ToolResult, ToolSpec, function_name, tool_name

__all__ = [
    "Approver",
    "Hider",
    "Observer",
    "Precheck",
    "ToolCall",
    "ToolRegistry",
    "Tool",
    "parameters_schema",
]

log = logging.getLogger("turnstile.tools")

#: ``module.action`` (or a bare ``action``): segments of ASCII letters and digits joined by single
#: underscores, so that ``function_name`` (dots to ``__``) maps back one to one by ``tool_name``.
TOOL_NAME = re.compile(r"[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*(?:\.[A-Za-z0-9]+(?:_[A-Za-z0-9]+)*)*")


def parameters_schema(params: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON Schema of a tool's parameters, as one self-contained object schema.

    msgspec answers ``{"$ref": "#/$defs/Params", "$defs": {...}}``; a model wants the object
    schema at the top, and every ``$ref`` inside it must still resolve there, so the other
    definitions (nested structs such as run_parallel's ``Action``) move to the top-level
    ``$defs``. The top definition stays in ``$defs`` only when something refers back to it.
    """
    schema = msgspec.json.schema(params)
    if "$ref" not in schema:
        return schema
    defs = dict(schema.get("$defs", {}))
    top_ref = schema["$ref"]
    top = dict(defs[top_ref.rsplit("/", 1)[-1]])
    if f'"{top_ref}"' not in msgspec.json.encode(defs).decode():
        del defs[top_ref.rsplit("/", 1)[-1]]
    if defs:
        top["$defs"] = defs
    return top


@dataclass(frozen=True)
class ToolCall:
    """Who is calling a tool: the session and its owner, and whether the call already runs
    as a background task (a module's own background action then does its work inline).

    ``idempotency_key``: set when the call is part of a turn (``TurnContext.call_tool``): a key
    derived from the turn's input and the call's position in the turn, so the same call of the
    same input's turn run again (after a crash) has the same key. A tool with an effect outside
    the node sends it on (the http module's ``Idempotency-Key`` header, the webhook
    notifications), so a receiver that honours it does the work once. None outside a turn
    (a client's ``call`` frame, a watcher's check).

    ``ask_approval``: false when the caller said an ``APPROVE`` call is not put to a person
    (``ToolRegistry.call``, ``run_parallel``); a tool that runs others through the registry
    (the ``memory`` tool's actions) passes it on.
    """

    session_id: str
    owner: str
    background: bool = False
    idempotency_key: str | None = None
    ask_approval: bool = True


#: Asks a person to approve a call: ``(call, tool name, arguments) -> approved``.
Approver = Callable[[ToolCall, str, dict[str, Any]], Awaitable[bool]]

#: Validates a call's decoded parameters before approval is asked: ``(call, params) -> None``,
#: raising a ``TurnstileError`` (with ``field``) to refuse the call.
Precheck = Callable[[ToolCall, Any], Awaitable[None]]

#: Sees a call that succeeded: ``(call, tool name, arguments, result data) -> None``.
Observer = Callable[[ToolCall, str, dict[str, Any], Any], Awaitable[None]]

#: ``(owner, session metadata) -> names`` of tools that session's model is not told of.
Hider = Callable[[str, Mapping[str, Any]], frozenset[str]]


@dataclass(frozen=True)
class Tool:
    """A registered tool."""

    name: str
    description: str
    params: type[msgspec.Struct] | type[dict[str, Any]]
    handler: Callable[[ToolCall, Any], Awaitable[Any]]
    codec: Codec[Any]
    schema: dict[str, Any]
    policy: Policy = Policy.AUTO
    precheck: Precheck | None = None
    offered: bool = True


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
        #: Tools that run other tools (``run_parallel``, ``background_*``, ``watch_*``): the
        #: features that register them add their names, and a tool that composes others
        #: refuses to nest or watch one of these.
        self.composite: set[str] = set()
        #: Called after every call that succeeded (see the module docstring).
        self.observers: list[Observer] = []
        #: Grows at every ``register`` and ``unregister``: whoever caches what it derived from
        #: the tools compares it.
        self.version = 0
        #: ``(owner, session metadata) -> tool names`` a session's model is not told of (an MCP
        #: server its user may not use): the turn shaper leaves them out of the turn and the
        #: index, and the discovery tools answer as for no tool. Calls are refused by the
        #: tools' own prechecks; this only keeps a model from being shown them.
        self.hiders: list[Hider] = []

    def register(
        self,
        name: str,
        params: type[msgspec.Struct] | type[dict[str, Any]],
        handler: Callable[[ToolCall, Any], Awaitable[Any]],
        description: str,
        policy: Policy = Policy.AUTO,
        precheck: Precheck | None = None,
        *,
        offered: bool = True,
        schema: dict[str, Any] | None = None,
    ) -> None:
        """Add a tool; ``policy`` is its default (reads AUTO, writes APPROVE or BLOCK).

        ``offered=False``: a model is not offered it (see the module docstring).

        ``schema``: the JSON Schema of the parameters as a model sees it, for a tool whose
        ``params`` is ``dict`` (its precheck validates the arguments; see the module
        docstring). Required with ``params=dict``, refused otherwise.

        ``precheck``, if given, runs before approval is asked (see the module docstring); it
        should be cheap and side-effect free, and the handler must still check everything
        itself (what was true at the precheck may have changed by the time it runs).

        Raises:
            ValueError: the name is taken or malformed.
        """
        wire = function_name(name)
        if not (TOOL_NAME.fullmatch(name) and FUNCTION_NAME.fullmatch(wire)) or (
            tool_name(wire) != name
        ):
            raise ValueError(
                "tool name must look like module.action (ASCII letters, digits and single "
                f"underscores, at most 64 characters as a function name), got {name!r}"
            )
        if name in self._tools:
            raise ValueError(f"tool {name!r} is already registered")
        if (schema is None) != (params is not dict):
            raise ValueError("schema must be given for params=dict, and only for it")
        self._tools[name] = Tool(
            name,
            description,
            params,
            handler,
            Codec(params),
            parameters_schema(params) if schema is None else schema,  # type: ignore[arg-type]
            Policy(policy),
            precheck,
            offered,
        )
        self._specs = None
        self.version += 1

    def unregister(self, name: str) -> None:
        """Remove a tool (one whose provider withdrew it); calls already running finish.

        Raises:
            KeyError: no such tool.
        """
        del self._tools[name]
        self._specs = None
        self.version += 1

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

    def hidden_from(self, owner: str, metadata: Mapping[str, Any]) -> frozenset[str]:
        """The tools the ``hiders`` keep from a session of ``owner`` with ``metadata``."""
        hidden: frozenset[str] = frozenset()
        for hider in self.hiders:
            hidden |= hider(owner, metadata)
        return hidden

    def names(self) -> list[str]:
        """Registered tool names, sorted."""
        return sorted(self._tools)

    def specs(self) -> list[ToolSpec]:
        """Every tool offered to a model as a function-calling spec, sorted by name (built once
        per change: every turn asks); tools registered with ``offered=False`` are left out."""
        if self._specs is None:
            self._specs = [
                ToolSpec(name=t.name, description=t.description, parameters=t.schema)
                for t in sorted(self._tools.values(), key=lambda t: t.name)
                if t.offered
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
        ask_approval: bool = True,
        background: bool = False,
        idempotency_key: str | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        """Validate ``arguments`` and run ``name``; failures come back as ``ToolResult``.

        ``approved``: a person already approved this very call (a module's background action
        that the runtime resumes as a task), so an APPROVE policy does not ask twice; only the
        runtime sets it. ``ask_approval=False``: an APPROVE call is not put to a person; it
        comes back at once, not run, as ``requires_approval`` (``run_parallel``'s actions, as
        the reference has it). ``background``: the call runs as a background task (``ToolCall``).
        ``idempotency_key``: the call's key, handed to the tool in its ``ToolCall``.
        ``call_id``: the model's id for the call (a turn's call), which only the trace records.

        ``name`` may also be the function name a model knows the tool by (``clock__now``):
        a model filling in run_parallel's ``actions[].name`` uses the name it was shown.

        When the node traces, the call is a span ``execute_tool <name>`` (OpenTelemetry's
        GenAI conventions, ``docs/tracing.md``): the model's call id, its policy, how long it
        waited for a person's approval and what was decided, whether it succeeded (else
        ``error.type``, its code) and the size of its result.
        """
        if name not in self._tools:
            name = tool_name(name)
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult(
                ok=False, error={"code": "unknown_tool", "message": f"no tool named {name!r}"}
            )
        if not tracing.active():
            return await self._call(
                tool, session_id, owner, arguments, approved, ask_approval, background,
                idempotency_key, tracing.OFF,
            )  # fmt: skip
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        if call_id is not None:
            attributes["gen_ai.tool.call.id"] = call_id
        with tracing.span(f"execute_tool {name}", attributes=attributes) as span:
            result = await self._call(
                tool, session_id, owner, arguments, approved, ask_approval, background,
                idempotency_key, span,
            )  # fmt: skip
            span.set("turnstile.tool.ok", result.ok)
            if result.ok:
                size = len(msgspec.json.encode(result.data))
                span.set("turnstile.tool.result_bytes", size)
            else:
                error = result.error or {}
                span.fail(str(error.get("code", "tool_failed")), error.get("message"))
            return result

    async def _call(
        self,
        tool: Tool,
        session_id: str,
        owner: str,
        arguments: dict[str, Any],
        approved: bool,
        ask_approval: bool,
        background: bool,
        idempotency_key: str | None,
        span: tracing.Span | tracing.OffSpan,
    ) -> ToolResult:
        """``call`` of a tool found (``span``: the call's, or ``OFF``)."""
        name = tool.name
        try:
            params = tool.codec.convert(arguments)
        except DecodeError as exc:
            error = {"code": "bad_arguments", "message": str(exc)}
            if exc.field:
                error["field"] = exc.field
            return ToolResult(ok=False, error=error)
        policy = self.policies.decide(name, tool.policy)
        span.set("turnstile.tool.policy", policy.value)
        call = ToolCall(session_id, owner, background, idempotency_key, ask_approval)
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
            if self.approver is None or not ask_approval:
                why = "and nobody can give it here" if ask_approval else "(not asked for here)"
                return ToolResult(
                    ok=False,
                    error={"code": "requires_approval", "message": f"{name} needs approval {why}"},
                )
            asked = trio.current_time()
            decided = await self.approver(call, name, arguments)
            span.set("turnstile.tool.approval_wait_seconds", trio.current_time() - asked)
            span.set("turnstile.tool.approval", "approved" if decided else "denied")
            if not decided:
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
        result = ToolResult(ok=True, data=msgspec.to_builtins(data))
        for observe in self.observers:
            try:
                await observe(call, name, arguments, result.data)
            except Exception:
                log.exception("an observer of tool %s failed", name)
        return result


def _error(exc: TurnstileError) -> dict[str, Any]:
    """A tool result's ``error`` for a typed error: its code, message and field, as a client
    may see them (``public_error``): a tool result reaches the model and every client watching
    the session, so a store failure is its code and a fixed sentence, and the database's text
    (driver, host, port, SQL) stays in the node's log, as on HTTP and the WebSocket."""
    code, message, field = public_error(exc)
    error = {"code": code, "message": message}
    if field:
        error["field"] = field
    return error
