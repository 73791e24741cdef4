"""The sessions feature: session actors, the directory the gateway talks to, the session
endpoints. Every other feature builds on it through ``SessionHooks`` and needs it, so it
starts first; its ``ready`` builds the session services from the hooks the others filled in
their ``start``, and its ``open`` starts listening to the other nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.actor import SessionActor, SessionLimits, SessionServices
from turnstile.actors.sessions.agents import Agent, Usage
from turnstile.actors.sessions.directory import SessionDirectory
from turnstile.actors.sessions.remote import RemoteSessions
from turnstile.actors.sessions.routes import session_routes
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.gateway.routes import HttpRoute
from turnstile.runtime.metrics import Metrics

__all__ = ["SessionsFeature"]


class SessionsFeature:
    """``[limits]`` session limits and the node's agent."""

    name = "sessions"
    needs: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.services: SessionServices | None = None
        self.directory: SessionDirectory | None = None
        self.remote: RemoteSessions | None = None

    async def start(self, node: NodeContext) -> None:
        """Nothing to do until the other features are in: see ``ready``."""

    async def ready(self, node: NodeContext) -> None:
        limits, metrics, hooks = node.config.limits, node.metrics, node.hooks

        declare_metrics(metrics)

        def turn_closed(status: str, seconds: float, source: str) -> None:
            metrics.inc("turnstile_turns_total", status=status)
            metrics.observe("turnstile_turn_seconds", seconds, status=status, source=source)

        self.services = services = SessionServices(
            store=node.store,
            agent=self.agent,
            tools=node.tools,
            limits=SessionLimits(
                max_queued_inputs=limits.max_queued_inputs,
                max_content_chars=limits.max_content_chars,
                history_entries=limits.history_entries,
            ),
            encode_event=counting_encoder(metrics),
            on_turn_closed=turn_closed,
            on_usage=lambda usage: count_tokens(metrics, usage),
            input_kinds=hooks.input_kinds,
            shaper=hooks.shaper,
            scheduled_turns=trio.CapacityLimiter(limits.max_concurrent_scheduled_turns),
            turn_context=hooks.turn_context,
            turn_history=hooks.turn_history,
            placement=node.placement,
        )
        hooks.scheduled_turns = services.scheduled_turns
        node.sessions.register("session", lambda key: SessionActor(key, services))
        metrics.gauge(
            "turnstile_sessions_active",
            lambda: node.sessions.statistics().active,
            "Session actors active (activated, not passivated).",
        )
        metrics.gauge(
            "turnstile_mailbox_depth",
            node.sessions.mailbox_depth,
            "Messages waiting in session actors' mailboxes.",
        )
        self.directory = node.directory = SessionDirectory(
            node.store,
            node.sessions,
            node.tools,
            max_sessions_per_user=limits.max_sessions_per_user,
            metrics=metrics,
            hooks=hooks,
        )
        if node.placement is not None:  # several nodes: reach sessions held elsewhere
            remote = RemoteSessions(
                node.store,
                node.sessions,
                node.placement,
                services.encode_event,
                max_content_chars=limits.max_content_chars,
                max_queued_inputs=limits.max_queued_inputs,
                clock=node.clock,
                metrics=node.metrics,
                input_kinds=services.input_kinds,
            )
            services.remote = self.directory.remote = remote
            remote.on_delete = self.directory.delete_here
            remote.on_gone = self.directory.heard_gone
            remote.on_approval = hooks.approval_heard
            self.remote = remote

    async def open(self, node: NodeContext) -> None:
        """Several nodes: hear the others (inputs for sessions held here, requests, the
        sessions this node follows for its clients)."""
        if self.remote is not None:
            node.start_soon(self.remote.run, name="remote sessions")

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        assert self.directory is not None, "routes() after ready()"
        return session_routes(self.directory)


def declare_metrics(metrics: Metrics) -> None:
    """The sessions feature's series (``docs/operations.md`` lists them). Labels come from
    fixed sets: a turn's status, its input's source, a token kind."""
    metrics.counter("turnstile_turns_total", "Turns closed, by status.", ("status",))
    metrics.histogram(
        "turnstile_turn_seconds",
        "Turn latency: a turn's start to its closure, by status and input source.",
        ("status", "source"),
    )
    metrics.counter(
        "turnstile_model_tokens_total", "Model tokens, as the model server counted them.", ("kind",)
    )
    metrics.counter("turnstile_events_broadcast_total", "Session events encoded for clients.")
    metrics.counter("turnstile_sessions_created_total", "Sessions created.")
    metrics.counter("turnstile_inputs_total", "Inputs stored (messages, over WebSocket and HTTP).")
    metrics.counter(
        "turnstile_inputs_replayed_total",
        "Messages sent again with a client_msg_id / Idempotency-Key already stored.",
    )
    metrics.counter("turnstile_tool_calls_total", "Tool calls made by clients (call frames).")


def count_tokens(metrics: Metrics, usage: Usage) -> None:
    """Model tokens by kind, as the agent's server counted them (``stream_end`` has per turn)."""
    metrics.inc("turnstile_model_tokens_total", usage.prompt_tokens, kind="prompt")
    metrics.inc("turnstile_model_tokens_total", usage.completion_tokens, kind="completion")


def counting_encoder(metrics: Metrics):
    """``encode_event`` that counts what it encodes (``turnstile_events_broadcast_total``)."""

    def encode(session_id, record) -> bytes:
        metrics.inc("turnstile_events_broadcast_total")
        return encode_event(session_id, record)

    return encode
