"""The composition root: ``open_node(config)`` assembles a node from its features.

A node is a store, a root supervisor, the registry of session actors, a tool registry, the
features (sessions, scheduling, watchers, notifications, execution, memory, webhooks, the
console and MCP by default) and, unless told otherwise, the HTTP/WebSocket gateway on
``config.host:config.port``.
``turnstile serve``, the bench scenarios and the tests all build their node here; so can an
application that embeds Turnstile::

    async with open_node(Config(store="sqlite:///app.db"), tokens={"t0ken": "ada"},
                         agent=MyAgent()) as node:
        print("serving on", node.urls)
        await trio.sleep_forever()

A node starts whole: nothing fires, delivers or recovers before every feature is ready
(``turnstile.actors.feature``). ``open_node`` states the order in its body:

1. migrations run (the kernel's set, then each feature's), and the node registers in the
   store's ``nodes`` table with a new epoch and starts heartbeating (``runtime.membership``);
2. the start order is derived from what each feature ``needs`` and comes ``after``
   (``feature.start_order``; a missing feature or a cycle is refused before anything opens);
3. every feature's ``start`` in that order: actors, tools, hooks, and nothing else;
4. every feature's ``ready`` in the same order (the sessions feature registers the ``session``
   actor kind there);
5. recovery: inputs that were ``running`` when a dead node (this node's previous epoch
   included) was cut off are closed as ``interrupted`` (with a visible ``stream_end`` in their
   session) -- never those a live node is running --, then every session with queued inputs is
   woken so they run (except those another live node is running a turn of);
6. every feature's ``open`` in the same order: work begins (the scheduler's overdue jobs, watcher
   checks, webhook redelivery, lost background tasks, memory extraction);
7. the gateway opens.

While the node runs, its sweep takes over the running inputs of nodes whose lease expires and
closes them the same way (docs/cluster.md). Closing goes the other way: the gateway stops, then
actors stop newest first (their ``on_stop`` runs): each feature's actors in the reverse of the
start order, the sessions last; then the node marks itself stopped, then the store closes.

It is over 400 lines because ``open_node`` states the start order in its body, step by step, in one
function whose nursery and exit stack own everything the node opens; splitting it would hide the
order this module exists to show.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, field

import msgspec
import trio
from starlette.applications import Starlette

from turnstile.actors.config import Config
from turnstile.actors.console.feature import ConsoleFeature
from turnstile.actors.demo import DemoAgent
from turnstile.actors.execution.feature import ExecutionFeature
from turnstile.actors.feature import Feature, NodeContext, start_order
from turnstile.actors.mcp.feature import McpFeature
from turnstile.actors.memory.feature import MemoryFeature
from turnstile.actors.notifications.feature import NotificationsFeature
from turnstile.actors.recovery import close_cut_off, recover, release_all
from turnstile.actors.scheduling.feature import SchedulingFeature
from turnstile.actors.sessions.actor import Wake
from turnstile.actors.sessions.agents import Agent, OpenAIAgent, ScriptedAgent
from turnstile.actors.sessions.directory import SessionDirectory
from turnstile.actors.sessions.feature import SessionsFeature
from turnstile.actors.sessions.hooks import SessionHooks
from turnstile.actors.watchers.feature import WatchersFeature
from turnstile.actors.webhooks.feature import WebhooksFeature
from turnstile.runtime.clock import Clock, SystemClock
from turnstile.runtime.errors import ActorStopped, NotFound, PlacedElsewhere, StoreError
from turnstile.runtime.gateway import Auth, ConnectionLimits, build_app
from turnstile.runtime.membership import Membership, default_node_id, open_membership
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.placement import LeasePlacement
from turnstile.runtime.registry import Registry
from turnstile.runtime.server import WS_SEND_MANY, package_version, serve_app
from turnstile.runtime.store import Store, TakeOver, open_store
from turnstile.runtime.supervisor import open_supervisor
from turnstile.runtime.tracing import open_tracing
from turnstile.tools.builtin import register_builtin_tools
from turnstile.tools.modules.filesystem import FilesystemConfig, register_filesystem_module
from turnstile.tools.modules.http import (
    HttpConfig,
    HttpModule,
    StartBackground,
    register_http_module,
)
from turnstile.tools.modules.shell import ShellConfig, register_shell_module
from turnstile.tools.policy import PolicyTable
from turnstile.tools.registry import ToolRegistry

__all__ = [
    "Node",
    "close_cut_off",
    "default_features",
    "make_agent",
    "open_node",
    "recover",
    "register_modules",
]

log = logging.getLogger("turnstile.node")


def make_agent(config: Config) -> Agent:
    """The agent the config names."""
    if config.agent == "openai":
        return OpenAIAgent.from_config(config.openai)
    if config.agent == "demo":
        return DemoAgent(token_delay=config.scripted.token_delay)
    return ScriptedAgent(token_delay=config.scripted.token_delay)


#: While draining, how long after a turn ended (or between looks) idle sessions are handed
#: over again: a closed turn's last events are stored a moment after it ends.
_HANDOVER_LOOK = 0.25


def default_features(agent: Agent) -> list[Feature]:
    """The features a node runs unless told otherwise. Their order here is not their start
    order: ``open_node`` derives that from what each declares (``feature.start_order``)."""
    return [
        SessionsFeature(agent),
        NotificationsFeature(),
        SchedulingFeature(),
        ExecutionFeature(),
        WatchersFeature(),
        MemoryFeature(),
        WebhooksFeature(),
        ConsoleFeature(),
        McpFeature(),
    ]


@dataclass
class Node:
    """A running node.

    Attributes:
        config: what it runs.
        store: its store.
        tools: its tool registry (every feature's tools).
        directory: the sessions, as the gateway reaches them (names, not keys; owner checks).
        app: the HTTP/WebSocket ASGI app (None when the node neither serves nor has tokens).
        metrics: its metrics (``/metrics``).
        features: the features it runs, by name.
        urls: the addresses the gateway listens on (empty with ``serve=False``).
        membership: its row among the nodes sharing the store (``membership.ref``: its id and
            epoch; docs/cluster.md).
    """

    config: Config
    store: Store
    tools: ToolRegistry
    directory: SessionDirectory
    app: Starlette | None
    metrics: Metrics
    context: NodeContext
    features: dict[str, Feature] = field(default_factory=dict)
    urls: list[str] = field(default_factory=list)
    membership: Membership | None = None

    async def drain(self, seconds: float) -> bool:
        """Begin a graceful stop (several nodes, leases; ``docs/cluster.md``): the node takes
        no new sessions (their messages are stored for the other nodes) and no new jobs, its
        sessions claim no more inputs, and the turns running here finish. Returns True once
        none runs, False if ``seconds`` passed first. Closing the node afterwards stops it as
        usual: its leases are free at once, and what waits moves to the nodes that stay.

        On one node (no placement) there is nowhere for work to go: returns True at once.
        """
        placement, membership = self.context.placement, self.membership
        if placement is None or membership is None:
            return True
        await membership.drain()
        placement.draining = True
        sessions = self.features["sessions"]
        assert isinstance(sessions, SessionsFeature) and sessions.services is not None
        running = sessions.services.running
        running.draining = True
        log.info("draining: %d turn(s) running here, up to %g s", running.count, seconds)
        with trio.move_on_after(seconds):
            # Hand over every session as soon as it has no turn: its lease is released, and
            # another node runs what waits in it (its catch-up finds it) while this one still
            # finishes its other turns; the clients watching it here follow it from the store.
            while True:
                handed = await self.directory.hand_over()
                if handed:
                    log.info("drain: %d session(s) handed over", handed)
                if running.count == 0:
                    return True
                with trio.move_on_after(_HANDOVER_LOOK):  # a closed turn's events settle
                    await running.one_ended()
        log.warning("drain: %d turn(s) still running after %g s", running.count, seconds)
        return False

    @property
    def url(self) -> str:
        """The first address the gateway listens on."""
        if not self.urls:
            raise NotFound("this node does not serve HTTP (open_node(serve=False))")
        return self.urls[0]


@asynccontextmanager
async def open_node(
    config: Config,
    *,
    tokens: dict[str, str] | None = None,
    agent: Agent | None = None,
    clock: Clock | None = None,
    features: Sequence[Feature] | None = None,
    serve: bool = True,
) -> AsyncIterator[Node]:
    """Run a node for the duration of the ``async with`` block.

    Args:
        config: what to run (store, agent, limits, bind address, feature sections).
        tokens: bearer token → user name (``config.users`` when None).
        agent: overrides the agent the config names (tests, embedding).
        clock: overrides the system clock (tests).
        features: the features to run, in any order (``default_features(agent)`` when None);
            the sessions feature must be among them. They start in the order their
            declarations give (``feature.start_order``).
        serve: open the gateway on ``config.host:config.port`` (``False``: nothing listens,
            for in-process use and benchmarks; the app is still built when there are tokens,
            e.g. to drive it through an ASGI transport).

    Raises:
        MissingFeature: a feature (or the node) needs a feature that is not among them.
        FeatureCycle: the features' ``needs`` and ``after`` wait on each other in a cycle.
        FeatureOrderError: two features share a name, or one declares its needs wrongly.
        LeaseLost: the node's row in the store was taken over (another process started with
            its node id) or it was declared dead while it ran: everything in the block was
            cancelled, and it must not serve on (docs/cluster.md).
    """
    clock = clock or SystemClock()
    agent = agent or make_agent(config)
    http: HttpModule | None = None  # closed last: a watcher's or a turn's call may use it
    if tokens is None:
        tokens = {user.token: user.name for user in config.users}
    given = list(features) if features is not None else default_features(agent)
    # Derived before anything opens: a missing feature or a cycle is refused here.
    chosen = start_order(given, required=("sessions",))
    limits = config.limits
    metrics = Metrics()
    try:
        # each feature's own tables: the kernel's set first, then the features' in start order
        migrations = [m for feature in chosen for m in getattr(feature, "migrations", ())]
        node_id = config.node.id or default_node_id(
            "sqlite" if config.store.startswith("sqlite:") else "postgres",
            port=config.port if serve else None,
        )
        async with (
            # the OTEL_* variables (off unless they ask; docs/tracing.md): outermost, so that
            # what the node traced until it closed is exported
            open_tracing(service_version=package_version()),
            open_store(config.store, clock=clock, migrations=migrations, name=node_id) as store,
            _heartbeat_store(config.store, clock, node_id) as beat_store,
            open_membership(
                store,
                node_id,
                lease_seconds=config.node.lease_seconds,
                address=config.node.address,
                metrics=metrics,
                private=config.store.partition("?")[0] == "sqlite:///:memory:",
                beat_store=beat_store,
            ) as membership,
        ):
            max_reruns = config.limits.max_turn_reruns
            hooks = SessionHooks()  # filled by the features as they start
            kinds = hooks.input_kinds
            placement = None
            if _placed(config):
                placement = LeasePlacement(
                    store,
                    lambda: membership.ref,
                    _session_key,
                    metrics=metrics,
                    on_moved=lambda items: close_cut_off(
                        store, items, max_reruns=max_reruns, kinds=kinds
                    ),
                )
            async with open_supervisor("root") as root:
                # The root's first child: children stop newest first, so every feature's actors
                # (spawned in their ``start``, in start order) stop before any session, and a
                # watcher delivers what is pending while the sessions still run.
                sessions = await root.spawn_supervisor(
                    "sessions", max_restarts=3, within=10.0, escalate=False
                )
                registry = Registry(
                    sessions,
                    idle_timeout=config.idle_timeout,
                    mailbox_size=limits.mailbox_size,
                    placement=placement,
                )
                async with trio.open_nursery() as tasks:  # the node's plain tasks
                    if placement is not None:
                        tasks.start_soon(placement.run)
                    tools = ToolRegistry(PolicyTable(config.policies))
                    context = NodeContext(
                        config=config,
                        store=store,
                        clock=clock,
                        metrics=metrics,
                        tools=tools,
                        sessions=registry,
                        supervisor=root,
                        hooks=hooks,
                        start_soon=tasks.start_soon,
                        placement=placement,
                        membership=membership if placement is not None else None,
                    )
                    register_builtin_tools(tools, clock)

                    async def start_background(call, tool: str, params: dict) -> dict:
                        if context.start_background is None:  # no execution feature
                            raise NotFound("background tasks are not enabled on this node")
                        return await context.start_background(call, tool, params)

                    http = register_modules(
                        tools,
                        config,
                        start_background if any(f.name == "execution" for f in chosen) else None,
                    )
                    # 1. start, in the derived order: actors, tools, hooks; nothing fires,
                    # delivers, recovers or talks to a session yet.
                    for feature in chosen:
                        await feature.start(context)
                    # 2. ready, in the same order: what needs every feature started (the
                    # sessions feature registers the ``session`` actor kind).
                    for feature in chosen:
                        ready = getattr(feature, "ready", None)
                        if ready is not None:
                            await ready(context)
                    metrics.gauge(
                        "turnstile_crashes_total",
                        lambda: len(root.crash_reports) + len(sessions.crash_reports),
                        "Actors that crashed (their supervisors' crash reports).",
                    )

                    async def wake(session_id: str) -> None:
                        try:
                            await registry.ref(f"session:{session_id}").tell(Wake())
                        except (PlacedElsewhere, ActorStopped, StoreError):
                            pass  # another node holds it: it runs what waits there

                    # 3. recovery, once every feature is ready (settling a cut-off turn goes
                    # through the input kinds the features registered): turns cut off by a
                    # crash are closed, then the sessions with inputs waiting are woken.
                    waiting = await recover(
                        store, max_reruns=max_reruns, node=membership.ref, kinds=kinds
                    )
                    for session_id in waiting:  # (another node may have taken one meanwhile)
                        await wake(session_id)

                    async def take_over(taken: TakeOver) -> None:
                        # A dead node's cut-off turns: closed as at start-up (their sessions
                        # leased here meanwhile, then released), and what waits behind them
                        # runs here or anywhere. Woken from tasks of their own, so that a
                        # wake-up never waits on a claim that waits on this.
                        holding = (
                            nullcontext()
                            if placement is None
                            else placement.closing(
                                taken.leases  # this node's own activations wait for it too
                            )
                        )
                        async with holding:
                            await close_cut_off(
                                store, taken.inputs, max_reruns=max_reruns, kinds=kinds
                            )
                            await release_all(store, taken.leases)
                        items = taken.inputs
                        for session_id in sorted({item.session_id for item in items}):
                            if await store.list_inputs(session_id, ["queued"]):
                                try:
                                    tasks.start_soon(wake, session_id)
                                except RuntimeError:  # the node is stopping: the next takes it
                                    return

                    membership.on_takeover = take_over
                    if placement is not None:
                        tasks.start_soon(
                            _catch_up, store, registry, membership, name="queued-input catch-up"
                        )
                    # 4. open, in the same order: the features' work begins (timers fire,
                    # deliveries and checks run, lost work is closed).
                    for feature in chosen:
                        begin = getattr(feature, "open", None)
                        if begin is not None:
                            await begin(context)
                    context.started.set()
                    app = None
                    if tokens or serve:  # serving without a token is refused by Auth
                        app = build_app(
                            backend=context.directory,
                            auth=Auth(tokens, config.allowed_origins),
                            routes=[route for f in chosen for route in f.routes(context)],
                            limits=ConnectionLimits(
                                max_frame_bytes=limits.max_frame_bytes,
                                outbox_frames=limits.outbox_frames,
                                max_attached=limits.max_attached_per_connection,
                            ),
                            version=package_version(),
                            metrics=metrics,
                            ws_send_many=WS_SEND_MANY,
                            body_timeout=limits.body_timeout_seconds,
                            topics=context.topics,
                            draining=lambda: membership.draining,
                        )
                    node = Node(
                        config=config,
                        store=store,
                        tools=tools,
                        directory=context.directory,
                        app=app,
                        metrics=metrics,
                        context=context,
                        features={f.name: f for f in chosen},
                        membership=membership,
                    )
                    if serve and app is not None:
                        node.urls = await tasks.start(
                            lambda task_status: serve_app(
                                app,
                                host=config.host,
                                port=config.port,
                                max_frame_bytes=limits.max_frame_bytes,
                                header_timeout=limits.header_timeout_seconds,
                                task_status=task_status,
                            )
                        )
                        log.info(
                            "turnstile %s serving on %s", package_version(), ", ".join(node.urls)
                        )
                        if config.node.address is None:
                            await membership.advertise(node.urls[0])
                    try:
                        yield node
                    finally:  # the gateway and plain tasks first; then the actors stop
                        membership.on_takeover = None  # no session is woken from now on
                        tasks.cancel_scope.cancel()
    finally:
        with trio.move_on_after(5, shield=True):
            await agent.aclose()
            if http is not None:  # its kept connections, closed rather than left to the OS
                await http.aclose()


async def _catch_up(store: Store, registry: Registry, membership: Membership) -> None:
    """With several nodes, every sweep interval: wake the sessions that have queued inputs and
    no turn running on another live node. An input stored by another node (a fire, a webhook,
    a message) for a session whose lease this node holds reaches it here at the latest; a
    session no node holds is activated here (or by whichever node asks first); one held by
    another live node is refused by the placement and left to it."""
    while True:
        await trio.sleep(membership.interval)
        try:
            waiting = await store.sessions_with_queued_inputs(node=membership.ref)
        except StoreError as exc:
            log.warning("looking for queued inputs failed: %s", exc)
            continue
        for session_id in waiting:
            try:
                await registry.ref(f"session:{session_id}").tell(Wake())
            except (PlacedElsewhere, ActorStopped, StoreError):
                continue  # another node holds it, or it is going away


@asynccontextmanager
async def _heartbeat_store(url: str, clock: Clock, node_id: str) -> AsyncIterator[Store | None]:
    """PostgreSQL: the store opened a second time, for the node's heartbeats alone (a pool busy
    with fires and turns would hold a heartbeat back until the lease ran out: seen with three
    nodes firing 2,000 timers in one second). SQLite: None (one writer; nothing to gain)."""
    if url.startswith("sqlite:"):
        yield None
        return
    async with open_store(url, clock=clock, name=f"{node_id} heartbeat") as beat_store:
        yield beat_store


def _placed(config: Config) -> bool:
    """Whether sessions are placed by lease (``[node] placement``; ``auto``: on PostgreSQL)."""
    if config.node.placement == "auto":
        return not config.store.startswith("sqlite:")
    return config.node.placement == "leases"


def _session_key(address: str) -> str | None:
    """The session row a registry address stands for (only sessions are placed)."""
    kind, _, key = address.partition(":")
    return key if kind == "session" else None


def register_modules(
    tools: ToolRegistry, config: Config, start_background: StartBackground | None = None
) -> HttpModule:
    """Register the http, filesystem and shell modules with the config's settings;
    ``start_background`` makes ``http.download`` a background action. Returns the http module,
    whose kept connections the node closes when it stops."""

    def settings(struct) -> dict:
        return {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in msgspec.structs.asdict(struct).items()
        }

    modules = config.modules
    fs = register_filesystem_module(tools, FilesystemConfig(**settings(modules.filesystem)))
    http = register_http_module(
        tools,
        HttpConfig(**settings(modules.http)),
        sandbox=fs.sandbox,
        start_background=start_background,
    )
    register_shell_module(tools, ShellConfig(**settings(modules.shell)), fs.sandbox)
    return http
