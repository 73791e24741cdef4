"""The feature interface: what a feature package gives a node, and what a node gives it.

A feature (sessions, scheduling, watchers, notifications, execution, …) is one package under
``actors/``. It exposes one object satisfying ``Feature``; the composition root
(``turnstile.actors.node.open_node``) starts the features in order and mounts their routes.
Starting a feature means spawning its actors under the node's supervisor, registering its tools
in the node's ``ToolRegistry``, and plugging into the hooks other features offer: the sessions
feature's ``SessionHooks`` (what ends with a session, what blocks its deletion, what a turn may
use), and the few node-wide services below that one feature provides and others use
(``notify``, ``check_channel``, ``start_background``, ``default_channel``). Features never
import one another except ``sessions``, on which they all build; the import contracts in
pyproject.toml enforce it.

Adding a feature is adding a package with a ``Feature`` and naming it in ``default_features``
(or passing it to ``open_node(features=…)``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from turnstile.actors.sessions.hooks import SessionHooks
from turnstile.actors.sessions.inputs import IN_SESSION
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import PlacedElsewhere
from turnstile.runtime.gateway.routes import HttpRoute
from turnstile.runtime.gateway.topics import UserTopics
from turnstile.runtime.membership import Membership
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.placement import LeasePlacement
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import Store
from turnstile.runtime.supervisor import Supervisor
from turnstile.tools.registry import ToolRegistry

if TYPE_CHECKING:  # the node's Config composes every feature's section
    from turnstile.actors.config import Config

__all__ = ["Feature", "NodeContext"]


@dataclass
class NodeContext:
    """The node as a feature sees it while it starts.

    Attributes:
        config: the node's whole configuration (a feature reads its own section).
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
        start_soon: starts a plain background task owned by the node (stopped when it closes).
        notify: the notifications feature's ``notify`` (None without that feature).
        check_channel: validates a channel name (notifications; None without it).
        default_channel: the output channel of jobs and watchers created without one, for a
            session's metadata: ``[execution] default_channel``, or the session's own
            ``metadata.execution.default_channel`` ('' for none: the session itself); set by
            execution once every feature has started (None before, or without it). See
            :meth:`output_channel`.
        start_background: runs a tool call as a background task (execution; None without it).
        directory: the sessions feature's directory, set once sessions started (routes use it to
            turn a user's session name into its key).
        topics: the gateway's user topics: a feature registers the log of a per-user event
            stream there and publishes to it (``runtime.gateway.topics``; memory's changes).
        started: set once every feature is ready and the sessions with inputs waiting were
            woken: a task a feature starts in ``start`` that talks to sessions waits for it
            (the webhooks feature's redelivery).
    """

    config: Config
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
    """One feature package, as the composition root drives it."""

    #: the feature's name (``scheduling``); also its config section's, where it has one.
    name: str

    # Optional: ``migrations: Sequence[MigrationSet]``, the feature's own tables. ``open_node``
    # applies them after the store's own set, each recorded under its set's name, so adding a
    # feature (or a step to one) never touches the kernel's schema.

    async def start(self, node: NodeContext) -> None:
        """Spawn the feature's actors, register its tools, fill the hooks it serves."""
        ...

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        """The HTTP endpoints the feature adds (called once every feature has started)."""
        ...
