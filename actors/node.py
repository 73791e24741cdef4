"""The composition root: ``open_node(config)`` assembles a node from its features.

A node is a store, a root supervisor, the registry of session actors, a tool registry, the
features (sessions, scheduling, watchers, notifications, execution, memory by default) and, unless
told otherwise, the HTTP/WebSocket gateway on ``config.host:config.port``. ``turnstile serve``,
the bench scenarios and the tests all build their node here; so can an application that embeds
Turnstile::

    async with open_node(Config(store="sqlite:///app.db"), tokens={"t0ken": "ada"},
                         agent=MyAgent()) as node:
        print("serving on", node.urls)
        await trio.sleep_forever()

Start-up order matters for "nothing lost on a crash": migrations run, inputs that were
``running`` when the previous process died are closed as ``interrupted`` (with a visible
``stream_end`` in their session), the features start, then every session with queued inputs is
woken so they run, then the gateway opens. Closing goes the other way: the gateway stops, then
actors stop newest first (their ``on_stop`` runs), then the store closes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import msgspec
import trio
from starlette.applications import Starlette

from turnstile.actors.config import Config
from turnstile.actors.execution.feature import ExecutionFeature
from turnstile.actors.feature import Feature, NodeContext
from turnstile.actors.memory.feature import MemoryFeature
from turnstile.actors.notifications.feature import NotificationsFeature
from turnstile.actors.scheduling.feature import SchedulingFeature
from turnstile.actors.sessions.actor import Wake, job_run
from turnstile.actors.sessions.agents import Agent, OpenAIAgent, ScriptedAgent
from turnstile.actors.sessions.directory import SessionDirectory
from turnstile.actors.sessions.feature import SessionsFeature
from turnstile.actors.sessions.hooks import SessionHooks
from turnstile.actors.watchers.feature import WatchersFeature
from turnstile.runtime.clock import Clock, SystemClock
from turnstile.runtime.errors import NotFound
from turnstile.runtime.gateway import Auth, ConnectionLimits, build_app
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.registry import Registry
from turnstile.runtime.server import WS_SEND_MANY, package_version, serve_app
from turnstile.runtime.store import InboxItem, Store, open_store
from turnstile.runtime.supervisor import open_supervisor
from turnstile.tools.builtin import register_builtin_tools
from turnstile.tools.modules.filesystem import FilesystemConfig, register_filesystem_module
from turnstile.tools.modules.http import HttpConfig, StartBackground, register_http_module
from turnstile.tools.modules.shell import ShellConfig, register_shell_module
from turnstile.tools.policy import PolicyTable
from turnstile.tools.registry import ToolRegistry

__all__ = ["Node", "default_features", "make_agent", "open_node", "recover", "register_modules"]

log = logging.getLogger("turnstile.node")


def make_agent(config: Config) -> Agent:
    """The agent the config names."""
    if config.agent == "openai":
        return OpenAIAgent.from_config(config.openai)
    return ScriptedAgent(token_delay=config.scripted.token_delay)


_RECOVERY_PAGE = 500


async def recover(store: Store) -> list[str]:
    """Close turns cut off by a crash and list the sessions with inputs waiting.

    Returns:
        ids of sessions that have queued inputs.
    """
    for item in await store.interrupt_running():
        closure: list[tuple[str, dict]] = []
        if not await _turn_started(store, item):
            # A turn's stream_start is stored with the events that follow it, so a crash
            # can take it; without it the transcript would lose the input that began it.
            content = item.payload.get("content", "")
            closure.append(
                ("stream_start", {"input_id": item.id, "source": item.source, "content": content})
            )
        closure.append(
            (
                "stream_end",
                {
                    "input_id": item.id,
                    "status": "interrupted",
                    "text": "",
                    "error": "the node stopped during this turn",
                },
            )
        )
        await store.append_events(item.session_id, closure)
        log.warning("input %s of session %s was interrupted by a restart", item.id, item.session_id)
        run = await job_run(store, item)
        if run is not None:  # a scheduled turn: its run record says what happened
            note = {**(run.detail or {}), "status": "interrupted"}
            await store.update_run(run.id, "turn_interrupted", note)
    return await store.sessions_with_queued_inputs()


async def _turn_started(store: Store, item: InboxItem) -> bool:
    """Whether the session's log holds ``item``'s ``stream_start``.

    Reads back from the end of the log: turns run one at a time, so meeting an earlier turn's
    ``stream_end`` or this input's own ``turn_queued`` first means its turn never got a start.
    """
    end = await store.last_seq(item.session_id)
    while end > 0:
        after = max(0, end - _RECOVERY_PAGE)
        for event in reversed(await store.read_events(item.session_id, after, end - after)):
            mine = event.payload.get("input_id") == item.id
            if mine and event.type == "stream_start":
                return True
            if event.type == "stream_end" or (mine and event.type == "turn_queued"):
                return False
        end = after
    return False


def default_features(agent: Agent) -> list[Feature]:
    """The features a node runs unless told otherwise, in start order: the ones others use
    first, sessions last (its ``ready`` builds the session services from the filled hooks)."""
    return [
        NotificationsFeature(),
        SchedulingFeature(),
        ExecutionFeature(),
        WatchersFeature(),  # after the sessions supervisor and the rest: it stops first
        MemoryFeature(),
        SessionsFeature(agent),
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
        features: the features to run (``default_features(agent)`` when None); the sessions
            feature must be among them, last.
        serve: open the gateway on ``config.host:config.port`` (``False``: nothing listens,
            for in-process use and benchmarks; the app is still built when there are tokens,
            e.g. to drive it through an ASGI transport).
    """
    clock = clock or SystemClock()
    agent = agent or make_agent(config)
    if tokens is None:
        tokens = {user.token: user.name for user in config.users}
    chosen = list(features) if features is not None else default_features(agent)
    if not chosen or not isinstance(chosen[-1], SessionsFeature):
        raise ValueError("open_node: the sessions feature must be the last feature")
    limits = config.limits
    metrics = Metrics()
    try:
        # each feature's own tables: the kernel's set first, then the features' in start order
        migrations = [m for feature in chosen for m in getattr(feature, "migrations", ())]
        async with open_store(config.store, clock=clock, migrations=migrations) as store:
            waiting = await recover(store)
            async with open_supervisor("root") as root:
                sessions = await root.spawn_supervisor(
                    "sessions", max_restarts=3, within=10.0, escalate=False
                )
                registry = Registry(
                    sessions, idle_timeout=config.idle_timeout, mailbox_size=limits.mailbox_size
                )
                async with trio.open_nursery() as tasks:  # the node's plain tasks
                    tools = ToolRegistry(PolicyTable(config.policies))
                    context = NodeContext(
                        config=config,
                        store=store,
                        clock=clock,
                        metrics=metrics,
                        tools=tools,
                        sessions=registry,
                        supervisor=root,
                        hooks=SessionHooks(),
                        start_soon=tasks.start_soon,
                    )
                    register_builtin_tools(tools, clock)

                    async def start_background(call, tool: str, params: dict) -> dict:
                        if context.start_background is None:  # no execution feature
                            raise NotFound("background tasks are not enabled on this node")
                        return await context.start_background(call, tool, params)

                    register_modules(
                        tools,
                        config,
                        start_background if any(f.name == "execution" for f in chosen) else None,
                    )
                    for feature in chosen:
                        await feature.start(context)
                    for feature in chosen:
                        ready = getattr(feature, "ready", None)
                        if ready is not None:
                            await ready(context)
                    metrics.gauge(
                        "turnstile_crashes_total",
                        lambda: len(root.crash_reports) + len(sessions.crash_reports),
                    )
                    for session_id in waiting:
                        await registry.ref(f"session:{session_id}").tell(Wake())
                    connections = [0]

                    def on_connection(delta: int) -> None:
                        connections[0] += delta

                    metrics.gauge("turnstile_websocket_connections", lambda: connections[0])
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
                            on_connection=on_connection,
                            on_frames_sent=lambda n: metrics.inc("turnstile_frames_sent_total", n),
                            ws_send_many=WS_SEND_MANY,
                            body_timeout=limits.body_timeout_seconds,
                            topics=context.topics,
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
                    try:
                        yield node
                    finally:  # the gateway and plain tasks first; then the actors stop
                        tasks.cancel_scope.cancel()
    finally:
        with trio.move_on_after(5, shield=True):
            await agent.aclose()


def register_modules(
    tools: ToolRegistry, config: Config, start_background: StartBackground | None = None
) -> None:
    """Register the http, filesystem and shell modules with the config's settings;
    ``start_background`` makes ``http.download`` a background action."""

    def settings(struct) -> dict:
        return {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in msgspec.structs.asdict(struct).items()
        }

    modules = config.modules
    fs = register_filesystem_module(tools, FilesystemConfig(**settings(modules.filesystem)))
    register_http_module(
        tools,
        HttpConfig(**settings(modules.http)),
        sandbox=fs.sandbox,
        start_background=start_background,
    )
    register_shell_module(tools, ShellConfig(**settings(modules.shell)), fs.sandbox)
