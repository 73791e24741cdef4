"""A Turnstile node, assembled: store, supervisors, session actors, tools, agent, gateway.

This is the composition root, so it sits at the top of the dependency chain
(``tools -> actors -> runtime``): the only module that knows every part. ``turnstile serve``
runs ``run_node``.

Start-up order matters for "nothing lost on a crash": migrations run, inputs that were
``running`` when the previous process died are closed as ``interrupted`` (with a visible
``stream_end`` in their session), then every session with queued inputs is woken so they run.
"""

from __future__ import annotations

import logging

import msgspec
import trio

from turnstile.actors.execution.approvals import ApprovalDesk
from turnstile.actors.execution.background import BackgroundActor, StartTask
from turnstile.actors.execution.selection import TurnShaper, register_discovery_tools
from turnstile.actors.execution.tools import register_execution_tools, register_shell_background
from turnstile.actors.notifications.actor import ChannelConfig, Notifier, NotifierConfig
from turnstile.actors.notifications.tools import guarded_webhook_post, register_notify_tools
from turnstile.actors.scheduling.actor import SchedulerActor, SchedulerLimits
from turnstile.actors.scheduling.checks import register_check_tools
from turnstile.actors.scheduling.cron import (
    bound_automations,
    cancel_bound_automations,
    register_cron_tool,
)
from turnstile.actors.scheduling.heartbeat import (
    HEARTBEAT_PROFILES,
    disable_heartbeat,
    register_heartbeat_tools,
)
from turnstile.actors.scheduling.recall import (
    cancel_recall,
    get_recall,
    recall_fired_events,
    register_recall_tools,
    skip_recall,
)
from turnstile.actors.scheduling.tools import register_scheduling_tools
from turnstile.actors.sessions.actor import (
    SessionActor,
    SessionLimits,
    SessionServices,
    Wake,
    job_run,
)
from turnstile.actors.sessions.agents import Agent, OpenAIAgent, ScriptedAgent, Usage
from turnstile.actors.sessions.directory import (
    RecallHooks,
    SessionDirectory,
    WatcherHooks,
    create_derived_session,
)
from turnstile.actors.watchers.actor import DropSessionWatchers, WatcherActor
from turnstile.actors.watchers.tools import (
    get_watcher,
    list_watchers,
    pause_watcher,
    register_watch_tools,
    resume_watcher,
    start_watcher,
    stop_watcher,
    watch_runner,
)
from turnstile.runtime.clock import Clock, SystemClock
from turnstile.runtime.config import Config
from turnstile.runtime.gateway import Auth, ConnectionLimits, build_app
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.registry import Registry
from turnstile.runtime.server import WS_SEND_MANY, package_version, serve_app
from turnstile.runtime.store import InboxItem, Store, open_store
from turnstile.runtime.supervisor import open_supervisor
from turnstile.tools.builtin import register_builtin_tools
from turnstile.tools.modules.filesystem import FilesystemConfig, register_filesystem_module
from turnstile.tools.modules.http import HttpConfig, StartBackground, register_http_module
from turnstile.tools.modules.shell import ShellConfig, register_shell_module
from turnstile.tools.netguard import NetPolicy
from turnstile.tools.policy import PolicyTable
from turnstile.tools.registry import ToolRegistry

__all__ = ["run_node", "make_agent", "recover"]

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


async def run_node(
    config: Config,
    tokens: dict[str, str],
    *,
    agent: Agent | None = None,
    clock: Clock | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a node until cancelled; ``task_status.started`` gets the bound URLs.

    Args:
        config: what to run (store, agent, limits, bind address).
        tokens: bearer token → user name.
        agent: overrides the agent the config names (tests, embedding).
        clock: overrides the system clock (tests).
    """
    clock = clock or SystemClock()
    agent = agent or make_agent(config)
    limits = config.limits
    metrics = Metrics()
    try:
        async with open_store(config.store, clock=clock) as store:
            waiting = await recover(store)
            async with open_supervisor("root") as root:
                sessions = await root.spawn_supervisor(
                    "sessions", max_restarts=3, within=10.0, escalate=False
                )
                registry = Registry(
                    sessions, idle_timeout=config.idle_timeout, mailbox_size=limits.mailbox_size
                )

                async def tell_session(session_id: str, message) -> None:
                    await registry.ref(f"session:{session_id}").tell(message)

                approvals = ApprovalDesk(
                    tell_session, clock, timeout=config.approval_timeout_seconds
                )
                tools = ToolRegistry(PolicyTable(config.policies), approver=approvals.request)
                register_builtin_tools(tools, clock)

                async def start_background(call, tool: str, params: dict) -> dict:
                    # ``background`` is spawned below, before any tool can be called.
                    task = await background.ask(
                        StartTask(
                            session_id=call.session_id,
                            owner=call.owner,
                            tool=tool,
                            params=params,
                            preapproved=True,
                        )
                    )
                    return task.view(trio.current_time())

                register_modules(tools, config, start_background)
                notifier = make_notifier(config, store, clock, registry)
                register_notify_tools(tools, notifier)
                root._require_nursery().start_soon(purge_expired, store, name="kv purge")

                scheduler = await root.spawn(
                    lambda: SchedulerActor(
                        store,
                        clock,
                        publish=tell_session,
                        limits=SchedulerLimits(
                            max_jobs_per_session=limits.max_jobs_per_session,
                            min_interval_seconds=limits.min_job_interval_seconds,
                            max_prompt_chars=limits.max_prompt_chars,
                        ),
                        metrics=metrics,
                        fired_events=recall_fired_events,
                    ),
                    name="scheduler",
                )
                register_scheduling_tools(
                    tools, scheduler, store, clock, check_channel=notifier.check_channel
                )
                register_heartbeat_tools(
                    tools,
                    scheduler,
                    store,
                    clock,
                    lambda parent, suffix: create_derived_session(
                        store, limits.max_sessions_per_user, parent, suffix
                    ),
                    defaults={
                        k: v
                        for k, v in msgspec.structs.asdict(config.heartbeat).items()
                        if v is not None
                    },
                    check_channel=notifier.check_channel,
                )
                register_check_tools(tools, scheduler, store, clock)
                register_cron_tool(tools, scheduler, store, clock)
                register_recall_tools(tools, scheduler, store, clock, tell_session)
                background = await root.spawn(
                    lambda: BackgroundActor(tools.call, tell_session, clock), name="background"
                )
                register_execution_tools(tools, background)
                register_shell_background(tools, background)
                # After the sessions supervisor: children stop newest first, so the watcher
                # saves its state and delivers what is pending while sessions still run.
                watchers = await root.spawn(
                    lambda: WatcherActor(
                        watch_runner(tools), tell_session, store, clock, notify=notifier.notify
                    ),
                    name="watchers",
                )
                register_watch_tools(tools, watchers)
                register_discovery_tools(tools)
                # After every tool is registered: [execution] names tools and a profile.
                shaper = TurnShaper(tools, clock, config.execution, HEARTBEAT_PROFILES)

                async def disable_job(job_id: str) -> None:
                    await disable_heartbeat(store, scheduler, job_id)

                def turn_closed(status: str, seconds: float) -> None:
                    metrics.inc(f'turnstile_turns_total{{status="{status}"}}')
                    metrics.observe("turnstile_turn_seconds", seconds)

                services = SessionServices(
                    store=store,
                    agent=agent,
                    tools=tools,
                    limits=SessionLimits(
                        max_queued_inputs=limits.max_queued_inputs,
                        max_content_chars=limits.max_content_chars,
                        history_entries=limits.history_entries,
                    ),
                    encode_event=_counting_encoder(metrics),
                    on_turn_closed=turn_closed,
                    on_usage=lambda usage: _count_tokens(metrics, usage),
                    tool_profiles=HEARTBEAT_PROFILES,
                    shaper=shaper,
                    disable_job=disable_job,
                    notify=notifier.notify,
                    scheduled_turns=trio.CapacityLimiter(limits.max_concurrent_scheduled_turns),
                )
                registry.register("session", lambda key: SessionActor(key, services))
                metrics.gauge("turnstile_sessions_active", lambda: registry.statistics().active)
                metrics.gauge("turnstile_mailbox_depth", registry.mailbox_depth)
                metrics.gauge(
                    "turnstile_crashes_total",
                    lambda: len(root.crash_reports) + len(sessions.crash_reports),
                )
                directory = SessionDirectory(
                    store,
                    registry,
                    tools,
                    max_sessions_per_user=limits.max_sessions_per_user,
                    metrics=metrics,
                    automations=lambda sid: bound_automations(store, sid),
                    cancel_automations=lambda sid: cancel_bound_automations(scheduler, store, sid),
                    watchers=WatcherHooks(
                        start=lambda sid, owner, spec: start_watcher(
                            watchers, tools, sid, owner, spec
                        ),
                        list=lambda sid, owner: list_watchers(
                            watchers, session_id=sid, owner=owner
                        ),
                        get=lambda wid, owner: get_watcher(watchers, wid, owner),
                        stop=lambda wid, owner: stop_watcher(watchers, wid, owner),
                        pause=lambda wid, owner: pause_watcher(watchers, wid, owner),
                        resume=lambda wid, owner: resume_watcher(watchers, wid, owner),
                        drop_session=lambda sid: watchers.ask(DropSessionWatchers(session_id=sid)),
                    ),
                    background=background,
                    approvals=approvals,
                    notifier=notifier,
                    recalls=RecallHooks(
                        get=lambda sid: get_recall(store, sid),
                        cancel=lambda sid: cancel_recall(scheduler, store, sid, tell_session),
                        skip=lambda sid: skip_recall(scheduler, store, clock, sid, tell_session),
                    ),
                )
                for session_id in waiting:
                    await registry.ref(f"session:{session_id}").tell(Wake())
                connections = [0]

                def on_connection(delta: int) -> None:
                    connections[0] += delta

                metrics.gauge("turnstile_websocket_connections", lambda: connections[0])
                app = build_app(
                    backend=directory,
                    auth=Auth(tokens, config.allowed_origins),
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
                )
                binds = await root._require_nursery().start(
                    lambda task_status: serve_app(
                        app,
                        host=config.host,
                        port=config.port,
                        max_frame_bytes=limits.max_frame_bytes,
                        header_timeout=limits.header_timeout_seconds,
                        task_status=task_status,
                    )
                )
                log.info("turnstile %s serving on %s", package_version(), ", ".join(binds))
                task_status.started(binds)
                await trio.sleep_forever()
    finally:
        with trio.move_on_after(5, shield=True):
            await agent.aclose()


def make_notifier(config: Config, store: Store, clock: Clock, registry: Registry) -> Notifier:
    """The notifier with the config's channels; webhooks go through the SSRF guard."""

    async def ask_session(session_id: str, message):
        return await registry.ref(f"session:{session_id}").ask(message)

    def listed(struct) -> dict:
        return {
            k: tuple(v) if isinstance(v, list) else v
            for k, v in msgspec.structs.asdict(struct).items()
        }

    http = config.modules.http
    return Notifier(
        store,
        clock,
        ask_session,
        NotifierConfig(
            channels=tuple(
                ChannelConfig(name=name, **listed(channel))
                for name, channel in config.channels.items()
            ),
            **msgspec.structs.asdict(config.notifications),
        ),
        webhook_post=guarded_webhook_post(
            NetPolicy(tuple(http.allowed_hosts), tuple(http.allowed_networks))
        ),
    )


async def purge_expired(store: Store, every: float = 3600.0) -> None:
    """Delete expired key-value rows (notification buffers) now and then."""
    while True:
        await trio.sleep(every)
        try:
            await store.kv_purge_expired()
        except Exception:
            log.warning("purging expired rows failed", exc_info=True)


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


def _count_tokens(metrics: Metrics, usage: Usage) -> None:
    """Model tokens by kind, as the agent's server counted them (``stream_end`` has per turn)."""
    metrics.inc('turnstile_model_tokens_total{kind="prompt"}', usage.prompt_tokens)
    metrics.inc('turnstile_model_tokens_total{kind="completion"}', usage.completion_tokens)


def _counting_encoder(metrics: Metrics):
    def encode(session_id, record) -> bytes:
        metrics.inc("turnstile_events_broadcast_total")
        return encode_event(session_id, record)

    return encode
