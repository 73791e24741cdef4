"""A node wired by hand on trio's MockClock: a store, session actors and a scheduler, with one
session ``s`` of ``ada`` and a ``Recorder`` attached to it (``node()``)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime

import trio

from tests.support.agents import GatedAgent
from tests.support.sessions import NoTools, Recorder
from turnstile.actors.scheduling.actor import (
    AddJob,
    CancelJob,
    Schedule,
    SchedulerActor,
    SchedulerLimits,
)
from turnstile.actors.scheduling.recall import recall_fired_events
from turnstile.actors.scheduling.schema import SCHEDULING
from turnstile.actors.scheduling.turns import register_scheduled_kinds
from turnstile.actors.sessions.actor import (
    Attach,
    SessionActor,
    SessionLimits,
    SessionServices,
)
from turnstile.runtime.clock import MockWallClock
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
LIMITS = SchedulerLimits(min_interval_seconds=300)
DAY = 86400


class Node:
    """A store, sessions and a scheduler, as a node wires them, on a mock clock."""

    def __init__(self, store, clock, registry, sup, agent) -> None:
        self.store, self.clock, self.registry, self.sup, self.agent = (
            store,
            clock,
            registry,
            sup,
            agent,
        )
        self.scheduler = None
        self.seen = Recorder()

    async def publish(self, session_id, message) -> None:
        await self.registry.ref(f"session:{session_id}").tell(message)

    async def start_scheduler(self, name: str = "scheduler"):
        self.scheduler = await self.sup.spawn(
            lambda: SchedulerActor(
                self.store,
                self.clock,
                publish=self.publish,
                limits=LIMITS,
                fired_events=recall_fired_events,
            ),
            name=name,
        )
        return self.scheduler

    async def add(self, **fields):
        fields.setdefault("session_id", "s")
        fields.setdefault("kind", "once")
        fields.setdefault("deliver", {"prompt": "do the thing", "source": "schedule"})
        return await self.scheduler.ask(AddJob(**fields))

    def ends(self) -> list[dict]:
        import json

        return [json.loads(f) for f in self.seen.frames if b'"stream_end"' in f]

    def starts(self) -> list[dict]:
        import json

        return [json.loads(f) for f in self.seen.frames if b'"stream_start"' in f]


@asynccontextmanager
async def node(
    start_scheduler: bool = True,
    tools=None,
    profiles=None,
    agent=None,
    notify=None,
    scheduled_turns: int | None = None,
    disable_job=None,
):
    """A mock-clock node: one session ``s`` of ``ada``, a scheduler, a recorder attached.

    ``disable_job(n, job_id)`` replaces how a heartbeat's ``on_error: disable`` stops its job
    (by default the job is cancelled)."""
    clock = MockWallClock(T0)
    agent = agent or GatedAgent()
    async with open_store("sqlite:///:memory:", clock=clock, migrations=[SCHEDULING]) as store:
        await store.create_session("s", "ada")
        services = SessionServices(
            store=store,
            agent=agent,
            tools=tools or NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
            scheduled_turns=None
            if scheduled_turns is None
            else trio.CapacityLimiter(scheduled_turns),
        )
        async with open_supervisor("root", escalate=False) as sup:
            registry = Registry(sup, idle_timeout=10 * DAY)
            registry.register("session", lambda key: SessionActor(key, services))
            n = Node(store, clock, registry, sup, agent)
            n.services = services

            async def cancel_job(job_id):
                if disable_job is not None:
                    await disable_job(n, job_id)
                else:
                    await n.scheduler.ask(CancelJob(job_id=job_id))

            register_scheduled_kinds(
                services.input_kinds,
                store,
                tool_profiles=lambda: profiles or {"full": None},
                notify=lambda: notify,
                disable_job=cancel_job,
            )
            await registry.ref("session:s").ask(Attach(subscriber=n.seen))
            if start_scheduler:
                await n.start_scheduler()
            yield n


def once(at: datetime) -> Schedule:
    return Schedule(type="once", run_at=at)
