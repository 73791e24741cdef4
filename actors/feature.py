"""The feature interface: what a feature package gives a node, and what a node gives it.

A feature (sessions, scheduling, watchers, notifications, execution, …) is one package under
``actors/``. It exposes one object satisfying ``Feature``; the composition root
(``turnstile.actors.node.open_node``) assembles the features and mounts their routes. Features
never import one another except ``sessions``, on which they all build; the import contracts in
pyproject.toml enforce it.

**Dependencies.** A feature declares ``needs`` (features that must be on the node and start
before it: a missing one is :class:`MissingFeature`) and ``after`` (features it starts after
when they are on the node). :func:`start_order` derives the order from them (Home Assistant
resolves an integration's ``dependencies`` the same way): a topological sort that keeps the
order the features were given wherever the declarations leave a choice, and refuses a cycle
(:class:`FeatureCycle`, naming it). Nobody keeps an order by hand.

**Phases.** ``open_node`` drives every feature through the same phases, each over every feature
in that order before the next begins, so that nothing fires, delivers or recovers before every
feature is ready:

1. ``start``: spawn the feature's actors, register its tools, plug into the hooks other
   features offer: the sessions feature's ``SessionHooks`` (what ends with a session, what
   blocks its deletion, what a turn may use) and the node-wide services on :class:`NodeContext`
   that one feature provides and others use (``notify``, ``check_channel``,
   ``start_background``, ``default_channel``). Nothing here fires a timer, delivers an input,
   recovers anything or talks to a session: those may not be there yet.
2. ``ready`` (optional): what needs every feature started (the sessions feature builds its
   services from the filled hooks and registers the ``session`` actor kind; execution builds
   the turn shaper from every registered tool).
3. The node's own recovery (turns cut off by a crash are closed), then the sessions with
   inputs waiting are woken.
4. ``open`` (optional): work begins (the scheduler's overdue jobs and its wheel, watcher
   checks, webhook redelivery, lost background tasks, memory extraction, purges, listeners).

The node stops the other way: actors stop newest first, so a feature's actors stop before
those of the features it started after, and every session stops last.

Adding a feature is adding a package with a ``Feature`` and naming it in ``default_features``
(in any order), or passing it to ``open_node(features=…)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import trio

from turnstile.actors.sessions.hooks import SessionHooks
from turnstile.actors.sessions.inputs import IN_SESSION
from turnstile.actors.settings import SharedConfig
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import PlacedElsewhere, TurnstileError
from turnstile.runtime.gateway.routes import HttpRoute
from turnstile.runtime.gateway.topics import UserTopics
from turnstile.runtime.membership import Membership
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.placement import LeasePlacement
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import Store
from turnstile.runtime.supervisor import Supervisor
from turnstile.tools.registry import ToolRegistry

__all__ = [
    "Feature",
    "FeatureCycle",
    "FeatureOrderError",
    "MissingFeature",
    "NodeContext",
    "start_order",
]

S = TypeVar("S")


@dataclass
class NodeContext:
    """The node as a feature sees it through its phases (``start``, ``ready``, ``open``).

    Attributes:
        config: the node's own settings (limits, users, tool modules, agent, …), what every
            feature may read; a feature reads its own section with :meth:`section`.
        store: the node's store.
        clock: the node's clock (a ``MockWallClock`` in tests).
        metrics: where counters, gauges and summaries go (``/metrics``).
        tools: the tool registry every feature registers into.
        sessions: the registry of ``session:<key>`` virtual actors.
        placement: where sessions are activated with several nodes (``runtime.placement``:
            each activation holds its session's lease and fences its writes with it); None on
            one node.
        membership: this node among the nodes sharing the store (live nodes, ``owns``: which
            work that needs no lease is this node's); set with ``placement``.
        supervisor: the root supervisor; a feature spawns its actors under it.
        hooks: the sessions feature's hook points, filled in by the features.
        start_soon: starts a plain background task owned by the node (stopped when it closes);
            a task that does work (fires, delivers, talks to sessions) is started in ``open``.
        notify: the notifications feature's ``notify``, set in its ``start`` (None before, or
            without that feature: a feature that takes it in its own ``start`` comes ``after``
            notifications).
        check_channel: validates a channel name (notifications, likewise; None without it).
        default_channel: the output channel of jobs and watchers created without one, for a
            session's metadata: ``[execution] default_channel``, or the session's own
            ``metadata.execution.default_channel`` ('' for none: the session itself); set by
            execution in its ``ready`` (None before, or without it): read it when used, not
            in ``start``. See :meth:`output_channel`.
        start_background: runs a tool call as a background task (execution; None without it).
        directory: the sessions feature's directory, set in its ``ready`` (routes use it to
            turn a user's session name into its key).
        topics: the gateway's user topics: a feature registers the log of a per-user event
            stream there and publishes to it (``runtime.gateway.topics``; memory's changes).
        started: set once every phase has run (every feature open). Nothing needs it to be
            correct: work begins in ``open``, after every feature is ready.
    """

    config: SharedConfig
    store: Store
    clock: Clock
    metrics: Metrics
    tools: ToolRegistry
    sessions: Registry
    supervisor: Supervisor
    hooks: SessionHooks
    start_soon: Callable[..., None]
    notify: Callable[..., Awaitable[dict[str, Any]]] | None = None
    check_channel: Callable[..., Any] | None = None
    default_channel: Callable[[Mapping[str, Any]], str] | None = None
    start_background: Callable[..., Awaitable[dict[str, Any]]] | None = None
    directory: Any = None
    placement: LeasePlacement | None = None
    membership: Membership | None = None
    topics: UserTopics = field(default_factory=UserTopics)
    started: trio.Event = field(default_factory=trio.Event)

    def section(self, name: str, kind: type[S]) -> S:
        """A feature's own section of the node's configuration (``[name]`` in its file).

        Args:
            name: the section's name (``webhooks``; ``heartbeat`` for scheduling's).
            kind: its type, defined in the feature's package (``WebhooksConfig``).

        Returns:
            the section as the node was configured.

        Raises:
            TypeError: the node's configuration has no section ``name`` of type ``kind``.
        """
        value = getattr(self.config, name, None)
        if not isinstance(value, kind):
            raise TypeError(
                f"config section {name!r} must be a {kind.__name__}, got {type(value).__name__}"
            )
        return value

    async def output_channel(self, session_key: str) -> str:
        """Where a job or watcher of the session ``session_key`` delivers when its creator
        named no channel: the default channel for the session (:attr:`default_channel`), or
        ``llm_notification``, the session itself."""
        if self.default_channel is None:
            return IN_SESSION
        session = await self.store.get_session(session_key)
        return self.default_channel(session.metadata) or IN_SESSION

    async def tell_session(self, key: str, message: Any) -> None:
        """Send ``message`` to the session actor with key ``key`` (activating it). With several
        nodes, a session another node holds gets it through the store and a notification
        (``actors.sessions.remote``)."""
        try:
            await self.sessions.ref(f"session:{key}").tell(message)
        except PlacedElsewhere:
            remote = getattr(self.directory, "remote", None)
            if remote is None:
                raise
            await remote.deliver(key, message)

    async def ask_session(self, key: str, message: Any) -> Any:
        """Ask the session actor with key ``key`` and wait for its answer."""
        return await self.sessions.ref(f"session:{key}").ask(message)


class Feature(Protocol):
    """One feature package, as the composition root drives it (see the module docstring).

    Optional, looked up with ``getattr`` (a feature without them does without):

    * ``migrations: Sequence[MigrationSet]``, the feature's own tables. ``open_node`` applies
      them after the store's own set, each recorded under its set's name, so adding a feature
      (or a step to one) never touches the kernel's schema.
    * ``async def ready(self, node: NodeContext) -> None``: what needs every feature started.
    * ``async def open(self, node: NodeContext) -> None``: where the feature's work begins.

    A feature without ``needs`` or ``after`` needs nothing and starts after nothing.
    """

    #: the feature's name (``scheduling``); also its config section's, where it has one.
    name: str
    #: features that must be on the node and start before this one.
    needs: tuple[str, ...]
    #: features this one starts after when they are on the node (it uses what they set on the
    #: ``NodeContext`` in their ``start``, if they are there).
    after: tuple[str, ...]

    async def start(self, node: NodeContext) -> None:
        """Spawn the feature's actors, register its tools, fill the hooks it serves; fire,
        deliver and recover nothing."""
        ...

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        """The HTTP endpoints the feature adds (called once every feature is open)."""
        ...


class FeatureOrderError(TurnstileError, ValueError):
    """The features given to a node cannot be started: one needs a feature that is not there
    (:class:`MissingFeature`), they wait on each other in a cycle (:class:`FeatureCycle`), two
    share a name, or a declaration is not a tuple of names."""

    code = "invalid_features"


class MissingFeature(FeatureOrderError, LookupError):
    """A feature (or the node itself) needs a feature that is not among the node's.

    Attributes:
        needed: the name of the feature that is missing.
        by: the name of the feature that needs it; None for the node itself.
    """

    def __init__(self, needed: str, by: str | None = None) -> None:
        self.needed, self.by = needed, by
        who = "the node" if by is None else f"feature {by!r}"
        super().__init__(f"{who} needs feature {needed!r}, which is not on the node")


class FeatureCycle(FeatureOrderError):
    """The features' ``needs`` and ``after`` wait on each other in a cycle.

    Attributes:
        cycle: the names along it, the first repeated at the end; each starts after the next.
    """

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = tuple(cycle)
        super().__init__(
            "features cannot be started in any order: "
            f"{' -> '.join(self.cycle)} (each needs or comes after the next)"
        )


def start_order(features: Sequence[Feature], *, required: Sequence[str] = ()) -> list[Feature]:
    """The order in which a node starts ``features``, from what each declares.

    Each feature starts after every feature it ``needs`` and every feature of its ``after``
    that is present. Among the features free to start next, the one given first goes first:
    the order is deterministic, and features given in an order that already fits keep it.

    Args:
        features: the node's features, in any order.
        required: names of features the caller itself needs (the node: ``sessions``).

    Returns:
        the features in start order (the node stops them in the reverse order).

    Raises:
        MissingFeature: a needed feature is not among ``features``.
        FeatureCycle: the declarations wait on each other in a cycle.
        FeatureOrderError: two features share a name, or ``needs`` / ``after`` is not a tuple
            of names.
    """
    by_name: dict[str, Feature] = {}
    for feature in features:
        if feature.name in by_name:
            raise FeatureOrderError(f"two features are named {feature.name!r}")
        by_name[feature.name] = feature
    first: dict[str, list[str]] = {}  # name -> the features it starts after
    for name, feature in by_name.items():
        needs, after = _declared(feature, "needs"), _declared(feature, "after")
        for needed in needs:
            if needed not in by_name:
                raise MissingFeature(needed, by=name)
        first[name] = [*needs, *(other for other in after if other in by_name)]
    for name in required:
        if name not in by_name:
            raise MissingFeature(name)
    order: list[Feature] = []
    done: set[str] = set()
    while len(order) < len(by_name):
        for name in by_name:
            if name not in done and all(other in done for other in first[name]):
                done.add(name)
                order.append(by_name[name])
                break
        else:
            raise FeatureCycle(_cycle(by_name, first, done))
    return order


def _declared(feature: Feature, attribute: str) -> tuple[str, ...]:
    """A feature's ``needs`` or ``after`` (``()`` when it declares none)."""
    names = getattr(feature, attribute, ())
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise FeatureOrderError(
            f"feature {feature.name!r}: {attribute} must be a tuple of feature names, got {names!r}"
        )
    return tuple(names)


def _cycle(
    by_name: Mapping[str, Feature], first: Mapping[str, list[str]], done: set[str]
) -> list[str]:
    """A cycle among the features that could not start: each of them waits on one that has
    not started either, so walking from one along such waits comes back to a name seen."""
    name = next(n for n in by_name if n not in done)
    path: list[str] = []
    while name not in path:
        path.append(name)
        name = next(other for other in first[name] if other not in done)
    return [*path[path.index(name) :], name]
