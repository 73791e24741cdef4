"""The scheduling feature: the scheduler actor, its tools, its routes, its session hooks.

Owns jobs (cron, once, recalls, checks, heartbeats) and their run records. It blocks deleting a
session that still has jobs (unless confirmed), ends a deleted session's kept heartbeat
settings, shows pending recalls in session listings, and hands sessions its heartbeat tool
profiles and the way to disable a failing heartbeat.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from turnstile.actors.feature import NodeContext
from turnstile.actors.scheduling.actor import Begin, SchedulerActor, SchedulerLimits
from turnstile.actors.scheduling.checks import register_check_tools
from turnstile.actors.scheduling.cron import (
    bound_automations,
    cancel_bound_automations,
    register_cron_tool,
)
from turnstile.actors.scheduling.heartbeat import (
    HEARTBEAT_PROFILES,
    KV_NAMESPACE,
    disable_heartbeat,
    register_heartbeat_tools,
)
from turnstile.actors.scheduling.recall import (
    get_recall,
    recall_fired_events,
    register_recall_tools,
)
from turnstile.actors.scheduling.routes import scheduling_routes
from turnstile.actors.scheduling.schema import SCHEDULING
from turnstile.actors.scheduling.settings import HeartbeatDefaults
from turnstile.actors.scheduling.tools import register_scheduling_tools
from turnstile.actors.scheduling.turns import register_scheduled_kinds
from turnstile.actors.sessions.directory import create_derived_session
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.gateway.routes import HttpRoute

__all__ = ["SchedulingFeature"]


class SchedulingFeature:
    """``[limits]`` job limits and ``[heartbeat]`` defaults. Its tools take the notifications
    feature's ``check_channel`` when it starts, hence ``after``."""

    name = "scheduling"
    needs: tuple[str, ...] = ("sessions",)
    after: tuple[str, ...] = ("notifications",)
    #: its jobs and runs (taken over from the kernel's tables, ``schema``)
    migrations = [SCHEDULING]

    def __init__(self) -> None:
        self.scheduler: ActorRef | None = None
        self.opened = False

    async def start(self, node: NodeContext) -> None:
        store, clock, tools, limits = node.store, node.clock, node.tools, node.config.limits
        heartbeat = node.section("heartbeat", HeartbeatDefaults)
        self.scheduler = scheduler = await node.supervisor.spawn(
            lambda: SchedulerActor(
                store,
                clock,
                publish=node.tell_session,
                limits=SchedulerLimits(
                    max_jobs_per_session=limits.max_jobs_per_session,
                    min_interval_seconds=limits.min_job_interval_seconds,
                    max_prompt_chars=limits.max_prompt_chars,
                ),
                metrics=node.metrics,
                fired_events=recall_fired_events,
                share=node.membership,
                # it loads the jobs now and fires in ``open``; an incarnation restarted after
                # a crash once the node is open fires from its start
                held=not self.opened,
            ),
            name="scheduler",
        )
        register_scheduling_tools(
            tools,
            scheduler,
            store,
            clock,
            check_channel=node.check_channel,
            default_channel=node.output_channel,
        )
        register_heartbeat_tools(
            tools,
            scheduler,
            store,
            clock,
            lambda parent, suffix: create_derived_session(
                store, limits.max_sessions_per_user, parent, suffix
            ),
            defaults={k: v for k, v in msgspec.structs.asdict(heartbeat).items() if v is not None},
            check_channel=node.check_channel,
        )
        register_check_tools(tools, scheduler, store, clock)
        register_cron_tool(tools, scheduler, store, clock)
        register_recall_tools(tools, scheduler, store, clock, node.tell_session)

        hooks = node.hooks
        hooks.automations = lambda key: bound_automations(store, key)
        hooks.cancel_automations = lambda key: cancel_bound_automations(scheduler, store, key)
        hooks.pending_recall = lambda key: get_recall(store, key)
        hooks.tool_profiles = {**hooks.tool_profiles, **HEARTBEAT_PROFILES}

        async def disable_job(job_id: str) -> None:
            await disable_heartbeat(store, scheduler, job_id)

        async def forget_heartbeat(key: str) -> None:  # its kept heartbeat settings
            await store.kv_delete(KV_NAMESPACE, [key])

        hooks.on_session_end.append(forget_heartbeat)
        # The inputs scheduling writes are its own to read: cron, once, recall, heartbeat,
        # check (``turns``). Heartbeats pick their tools among the node's profiles.
        register_scheduled_kinds(
            hooks.input_kinds,
            store,
            tool_profiles=lambda: hooks.tool_profiles,
            notify=lambda: node.notify,
            disable_job=disable_job,
        )

    async def open(self, node: NodeContext) -> None:
        """Due jobs fire from now on: overdue ones (spread, ``restart_rate``), then each on
        time."""
        assert self.scheduler is not None, "open() after start()"
        self.opened = True
        await self.scheduler.ask(Begin())

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        assert self.scheduler is not None, "routes() after start()"
        return scheduling_routes(node, self.scheduler)
