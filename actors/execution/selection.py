"""What the model sees per turn: which tools' schemas a turn carries, its prompt, its history.

Sending every tool's full JSON schema with every model call costs about 27,000 characters (some
7,000 tokens) per call before the conversation even starts. So the tool set of a turn is a
choice, made here from ``[execution]`` (``actors.execution.settings.ExecutionConfig``) and, per
session, ``metadata.execution``:

* **groups**, as in the execution-primitives reference: the primitives (``run_parallel``,
  ``background_*``) are always in the turn; ``watchers = true`` adds the ``watch_*`` tools,
  ``scheduler = true`` the scheduling tools, a ``default_channel`` adds ``send_notification``;
  ``direct_tools`` names any other tool to carry. ``watchers = false`` or ``scheduler = false``
  hides the group from the model altogether, as the reference's "no awareness": its tools are
  neither carried nor indexed, ``tool_search`` does not answer with them, ``tool_run`` and the
  turn refuse them, and the prompt does not mention them (``ToolSelection.hidden``). Left unset,
  a group is like any other tool;
* **compact mode** (``tool_mode = "compact"``, the default): every other tool is left out of
  the call and listed by name, with a few words each, in the description of ``tool_search``,
  which answers with full schemas on demand; ``tool_run`` runs a tool by name (as do
  ``run_parallel`` and ``background_run``). ``direct`` mode carries every tool's schema
  instead, the old behaviour;
* **tool profiles** (``tool_profile``; the heartbeat profiles ``actors.scheduling.heartbeat``
  adds to ``SessionHooks.tool_profiles``): a restricted profile is a short list, so its tools'
  schemas are carried directly, and every other tool — the discovery tools included — is
  refused in that turn.

Every registered tool stays reachable in every mode, hidden groups aside: either its schema is
in the turn or its name is in ``tool_search``'s index (``ToolSelection.indexed``); the unit
tests check both against the node's full registry.

``TurnShaper`` puts it together for the session actor: the tools, the default system prompt
(``actors.sessions.agents.prompt``) with the session's time zone and the clock's time, and the
history fitted into ``max_context_tokens`` (``actors.sessions.agents.context``).

It is over 400 lines because the selection, the discovery tools and the shaper keep one promise
together (every tool is either in the turn or in ``tool_search``'s index), which a split would
spread over modules.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.execution.settings import ExecutionConfig
from turnstile.actors.execution.tools import PRIMITIVES
from turnstile.actors.sessions.actor import ShapedTurn
from turnstile.actors.sessions.agents.base import HistoryEntry, ToolSpec, TurnInput
from turnstile.actors.sessions.agents.context import estimate_tokens, fit_history
from turnstile.actors.sessions.agents.prompt import build_system_prompt, session_timezone
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument, TurnstileError
from turnstile.tools.registry import ToolCall, ToolRegistry
from turnstile.tools.spec import tool_name

__all__ = [
    "DISCOVERY",
    "GROUPS",
    "ExecutionSettings",
    "ToolCallFailed",
    "ToolSelection",
    "TurnShaper",
    "hidden_tools",
    "may_be_hidden",
    "register_discovery_tools",
    "schema_chars",
    "select_tools",
]

log = logging.getLogger("turnstile.tools")

#: The opt-in groups (and the primitives, always in): their tools' schemas go in every turn.
GROUPS: dict[str, frozenset[str]] = {
    "primitives": PRIMITIVES,
    "watchers": frozenset(
        {
            "watch_start",
            "watch_stop",
            "watch_pause",
            "watch_resume",
            "watch_status",
            "watch_list",
            "watch_history",
        }
    ),
    "scheduler": frozenset(
        {
            "schedule_once",
            "schedule_cron",
            "schedule_cancel",
            "schedule_pause",
            "schedule_resume",
            "schedule_list",
            "schedule_status",
            "remember",
            "schedule_check",
            "list_schedule",
            "cancel_scheduled",
            "cron",
            "schedule_recall",
            "manage_recall",
            "set_heartbeat",
        }
    ),
    "notifications": frozenset({"send_notification"}),
}
#: Every tool of a group that can be turned off (the store is read only for those).
_GROUPED = GROUPS["watchers"] | GROUPS["scheduler"]
#: The discovery tools of compact mode.
DISCOVERY = ("tool_search", "tool_run")
DISCOVERY_SET = frozenset(DISCOVERY)

ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class ExecutionSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The tool keys of ``[execution]`` (see ``ExecutionConfig``); also what a session's
    ``metadata.execution`` may set, each key overriding the node's."""

    tool_mode: Literal["compact", "direct"] = "compact"
    watchers: bool | None = None
    scheduler: bool | None = None
    default_channel: str = ""
    direct_tools: tuple[str, ...] = ()
    tool_profile: str = "full"


class ToolSelection(msgspec.Struct, frozen=True, kw_only=True):
    """The tools of a turn.

    Attributes:
        tools: the specs the turn carries (full schemas), sorted by name.
        indexed: the tools left out and listed in ``tool_search``'s index instead.
        allowed: the tools the turn may call; None for every tool.
        hidden: the tools of the groups turned off (``watchers = false``...), of which the
            model is told nothing and which it may not call.
    """

    tools: list[ToolSpec]
    indexed: tuple[str, ...] = ()
    allowed: frozenset[str] | None = None
    hidden: frozenset[str] = frozenset()


def may_be_hidden(names: Iterable[str]) -> bool:
    """Whether any of ``names`` (``module.action`` or function names) belongs to a group that
    can be turned off: only then is a session's metadata worth reading."""
    return any({name, tool_name(name)} & _GROUPED for name in names)


def hidden_tools(settings: ExecutionSettings) -> frozenset[str]:
    """The tools of the groups ``settings`` turns off (``watchers = false``,
    ``scheduler = false``)."""
    hidden: frozenset[str] = frozenset()
    if settings.watchers is False:
        hidden |= GROUPS["watchers"]
    if settings.scheduler is False:
        hidden |= GROUPS["scheduler"]
    return hidden


def schema_chars(specs: Iterable[ToolSpec]) -> int:
    """Characters the specs take in a chat-completions request's ``tools`` array (compact
    JSON, as an agent sends it): the measure of what a model call carries."""
    return len(
        msgspec.json.encode(
            [
                {
                    "type": "function",
                    "function": {
                        "name": s.name,
                        "description": s.description,
                        "parameters": s.parameters,
                    },
                }
                for s in specs
            ]
        )
    )


def select_tools(
    specs: list[ToolSpec],
    settings: ExecutionSettings,
    profiles: Mapping[str, frozenset[str] | None],
    allowed: frozenset[str] | None = None,
    hidden_more: frozenset[str] = frozenset(),
) -> ToolSelection:
    """Choose a turn's tools from every registered spec, as the module docstring describes.

    Args:
        specs: every registered tool (``ToolRegistry.specs()``).
        settings: the node's settings with the session's overrides applied.
        profiles: tool profiles by name.
        allowed: the turn's own profile (a heartbeat's), which wins over ``tool_profile``.
        hidden_more: more tools the model is not told of (``ToolRegistry.hidden_from``: an
            MCP server the session's user may not use), hidden like a group turned off.

    Raises:
        InvalidArgument: ``tool_profile`` names no profile (field ``tool_profile``).
    """
    if allowed is None:
        if settings.tool_profile not in profiles:
            raise InvalidArgument(
                f"tool_profile must be one of {', '.join(sorted(profiles))}, "
                f"got {settings.tool_profile!r}",
                field="tool_profile",
            )
        allowed = profiles[settings.tool_profile]
    hidden = hidden_tools(settings) | hidden_more
    if allowed is not None:
        allowed -= hidden
        return ToolSelection(
            tools=[s for s in specs if s.name in allowed], allowed=allowed, hidden=hidden
        )
    specs = [s for s in specs if s.name not in hidden]
    if settings.tool_mode == "direct":
        return ToolSelection(tools=[s for s in specs if s.name not in DISCOVERY], hidden=hidden)
    direct = set(GROUPS["primitives"]) | set(settings.direct_tools)
    if settings.watchers:
        direct |= GROUPS["watchers"]
    if settings.scheduler:
        direct |= GROUPS["scheduler"]
    if settings.default_channel:
        direct |= GROUPS["notifications"]
    carried = [s for s in specs if s.name in direct]
    rest = [s for s in specs if s.name not in direct and s.name not in DISCOVERY]
    if not rest:
        return ToolSelection(tools=carried, hidden=hidden)
    by_name = {s.name: s for s in specs}
    for name in DISCOVERY:
        spec = by_name.get(name)
        if spec is None:
            continue  # a registry without the discovery tools: the index has nowhere to go
        if name == "tool_search":
            spec = msgspec.structs.replace(spec, description=spec.description + "\n" + _index(rest))
        carried.append(spec)
    carried.sort(key=lambda s: s.name)
    return ToolSelection(tools=carried, indexed=tuple(s.name for s in rest), hidden=hidden)


#: How the index labels each group's tools (the rest are ``more``).
_INDEX_LABELS = {
    "watchers": "watchers (check a tool periodically, hear only of changes)",
    "scheduler": "scheduler (later, recurring, reminders)",
    "notifications": "notifications",
}


def _index(specs: Iterable[ToolSpec]) -> str:
    """``Index: watchers (…): watch_start, …; …; more: clock.now, …`` for the tools left out
    of a turn: names only (they say what the tools do; ``query`` searches the descriptions),
    by group, so the index stays short however many tools there are."""
    names = [s.name for s in specs]
    parts = []
    for group, label in _INDEX_LABELS.items():
        members = [n for n in names if n in GROUPS[group]]
        if members:
            parts.append(f"{label}: {', '.join(members)}")
    rest = [n for n in names if not any(n in GROUPS[g] for g in _INDEX_LABELS)]
    if rest:
        parts.append(f"more: {', '.join(rest)}")
    return "Index: " + "; ".join(parts) + "."


# -- the discovery tools ---------------------------------------------------------------------


class ToolCallFailed(TurnstileError):
    """A tool run through ``tool_run`` failed; carries that tool's own error code, message and
    field, so the model sees the same error as for a direct call."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        super().__init__(str(error.get("message") or "the tool failed"))
        self.code = str(error.get("code") or "tool_failed")
        self.field = error.get("field")


class ToolSearch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``tool_search``.

    Attributes:
        names: tools to describe, by name (``module.action``).
        query: a word to look for in tool names and descriptions (case-insensitive).
    """

    names: Annotated[list[ToolName], msgspec.Meta(max_length=50)] = msgspec.field(
        default_factory=list
    )
    query: Annotated[str, msgspec.Meta(max_length=100)] = ""


class ToolRun(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``tool_run``.

    Attributes:
        name: the tool to run (``module.action``).
        params: its arguments.
    """

    name: ToolName
    params: dict[str, Any] = msgspec.field(default_factory=dict)


#: How many tools a ``query`` answers with at most.
MAX_SEARCH_RESULTS = 10


def register_discovery_tools(
    registry: ToolRegistry, hidden: Callable[[str], Awaitable[frozenset[str]]] | None = None
) -> None:
    """Register ``tool_search`` and ``tool_run`` (compact mode's way to every tool).

    Args:
        registry: every tool.
        hidden: the tools a session's model is not told of, by session key (its settings'
            ``TurnShaper.hidden_for``): ``tool_search`` does not answer with them (a name asked
            for is ``unknown``) and ``tool_run`` answers as for a name that is no tool.
    """

    async def hidden_for(session_key: str) -> frozenset[str]:
        return frozenset() if hidden is None else await hidden(session_key)

    async def search(call: ToolCall, args: ToolSearch) -> dict[str, Any]:
        left_out = DISCOVERY_SET | await hidden_for(call.session_id)
        specs = {s.name: s for s in registry.specs() if s.name not in left_out}
        if not args.names and not args.query:
            raise InvalidArgument("give names or a query", field="names")
        found = [specs[n] for n in dict.fromkeys(args.names) if n in specs]
        unknown = [n for n in args.names if n not in specs]
        if args.query:
            word = args.query.lower()
            matches = [
                s
                for s in specs.values()
                if (word in s.name.lower() or word in s.description.lower()) and s not in found
            ]
            found += matches[:MAX_SEARCH_RESULTS]
        answer: dict[str, Any] = {"tools": [msgspec.to_builtins(s) for s in found]}
        if unknown:
            answer["unknown"] = unknown
        return answer

    async def run(call: ToolCall, args: ToolRun) -> Any:
        if args.name in DISCOVERY:
            raise InvalidArgument(f"{args.name} cannot be run through tool_run", field="name")
        names = {args.name, tool_name(args.name)}
        maybe = names & _GROUPED or registry.hiders
        if maybe and names & await hidden_for(call.session_id):
            # what a name that is not a tool answers: the model learns nothing of the group
            unknown = {"code": "unknown_tool", "message": f"no tool named {args.name!r}"}
            raise ToolCallFailed(unknown)
        result = await registry.call(  # the same call under another name: the same key
            call.session_id,
            call.owner,
            args.name,
            args.params,
            idempotency_key=call.idempotency_key,
        )
        if not result.ok:
            raise ToolCallFailed(result.error or {})
        return result.data

    registry.register(
        "tool_search",
        ToolSearch,
        search,
        "Schemas of the tools not listed in this call, by names or a query word searched in "
        "their descriptions; run them with tool_run.",
    )
    registry.register(
        "tool_run",
        ToolRun,
        run,
        "Run a tool by name (module.action) with its params, as a direct call would.",
    )


# -- the turn, shaped ------------------------------------------------------------------------


class TurnShaper:
    """Chooses each turn's tools, writes its default system prompt, fits its history.

    The session actor calls ``shape`` once per turn (``SessionServices.shaper``).

    Args:
        registry: every tool.
        clock: the runtime's clock (the prompt's current time).
        config: the node's ``[execution]`` settings.
        profiles: tool profiles by name (``SessionHooks.tool_profiles``: ``full`` and the
            scheduling feature's ``HEARTBEAT_PROFILES``).

    Raises:
        InvalidArgument: the config names an unknown profile or tool (``field`` says which).
    """

    def __init__(
        self,
        registry: ToolRegistry,
        clock: Clock,
        config: ExecutionConfig,
        profiles: Mapping[str, frozenset[str] | None],
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.config = config
        self.profiles = dict(profiles)
        self.settings = ExecutionSettings(
            tool_mode=config.tool_mode,
            watchers=config.watchers,
            scheduler=config.scheduler,
            default_channel=config.default_channel,
            direct_tools=tuple(config.direct_tools),
            tool_profile=config.tool_profile,
        )
        self._check(self.settings, "$.execution")
        if session_timezone({}, config.timezone) != config.timezone:
            raise InvalidArgument(
                f"timezone {config.timezone!r} is not a time zone", field="$.execution.timezone"
            )
        self._cache: dict[
            tuple[ExecutionSettings, frozenset[str] | None, frozenset[str]], ToolSelection
        ] = {}
        self._version = -1  # the registry's version the cache was made from

    def _check(self, settings: ExecutionSettings, where: str) -> None:
        if settings.tool_profile not in self.profiles:
            raise InvalidArgument(
                f"tool_profile must be one of {', '.join(sorted(self.profiles))}, "
                f"got {settings.tool_profile!r}",
                field=f"{where}.tool_profile",
            )
        known = set(self.registry.names())
        for name in settings.direct_tools:
            if name not in known:
                raise InvalidArgument(f"no tool named {name!r}", field=f"{where}.direct_tools")

    def settings_for(self, metadata: Mapping[str, Any]) -> ExecutionSettings:
        """The node's settings with a session's ``metadata.execution`` applied.

        A session whose overrides do not fit (a typo, an unknown profile or tool) gets the
        node's settings, and the problem is logged: a session's metadata cannot be edited
        after creation, so failing every one of its turns would leave it unusable.
        """
        overrides = metadata.get("execution")
        if not overrides:
            return self.settings
        try:
            if not isinstance(overrides, dict):
                raise InvalidArgument("must be an object", field="metadata.execution")
            merged = msgspec.convert(
                {**msgspec.structs.asdict(self.settings), **overrides}, ExecutionSettings
            )
            self._check(merged, "metadata.execution")
        except (msgspec.ValidationError, InvalidArgument) as exc:
            log.warning("ignoring a session's metadata.execution: %s", exc)
            return self.settings
        return merged

    def hidden_for(self, metadata: Mapping[str, Any], owner: str | None = None) -> frozenset[str]:
        """The tools a session's model is not told of (its groups turned off), for the
        session's ``metadata``; with its ``owner``, those the registry's hiders keep from
        it too."""
        hidden = hidden_tools(self.settings_for(metadata))
        if owner is not None:
            hidden |= self.registry.hidden_from(owner, metadata)
        return hidden

    def select(
        self,
        settings: ExecutionSettings,
        allowed: frozenset[str] | None = None,
        hidden_more: frozenset[str] = frozenset(),
    ) -> ToolSelection:
        """The turn's tools (cached until the registry changes: an MCP server's tools come and
        go while the node runs, and one that replaces another keeps their number). With a
        group turned off and no profile, the turn may call every tool but that group's."""
        specs = self.registry.specs()
        if self._version != self.registry.version:
            self._cache.clear()
            self._version = self.registry.version
        key = (settings, allowed, hidden_more)
        found = self._cache.get(key)
        if found is None:
            found = select_tools(specs, settings, self.profiles, allowed, hidden_more)
            if found.hidden and found.allowed is None:
                callable_ = frozenset(self.registry.names()) - found.hidden
                found = msgspec.structs.replace(found, allowed=callable_)
            self._cache[key] = found
        return found

    def shape(
        self,
        metadata: Mapping[str, Any],
        turn_input: TurnInput,
        history: list[HistoryEntry],
        allowed: frozenset[str] | None,
        owner: str | None = None,
    ) -> ShapedTurn:
        """Tools, default system prompt and history for one turn.

        Args:
            metadata: the session's metadata (``timezone``, ``execution``).
            turn_input: what started the turn (its content counts against the budget).
            history: the transcript before the turn, oldest first.
            allowed: the turn's own tool profile (heartbeats), else None.
            owner: the session's user: the registry's hiders keep tools from it
                (``ToolRegistry.hidden_from``).
        """
        settings = self.settings_for(metadata)
        hidden_more = frozenset() if owner is None else self.registry.hidden_from(owner, metadata)
        selection = self.select(settings, allowed, hidden_more)
        prompt = None
        if self.config.default_prompt:
            prompt = build_system_prompt(
                tools=_names(selection.tools),
                now=self.clock.now(),
                timezone=session_timezone(dict(metadata), self.config.timezone),
                default_channel=settings.default_channel,
                hidden=selection.hidden,
            )
        spent = (
            estimate_tokens(prompt or "")
            + estimate_tokens(turn_input.system_segment or "")
            + schema_chars(selection.tools) // 4
            + estimate_tokens(turn_input.content)
        )
        budget = self.config.max_context_tokens - spent
        return ShapedTurn(
            tools=selection.tools,
            system_prompt=prompt,
            history=fit_history(history, budget),
            allowed=selection.allowed,
            context_tokens=self.config.max_context_tokens,
        )


def _names(specs: Collection[ToolSpec]) -> frozenset[str]:
    return frozenset(s.name for s in specs)
