"""The node's scheduled-turn slots seen from a session (``actors/sessions/slots.py``): user turns
take none, and on a node whose slots are all busy they run without reading their queue first
(issue 26: the read was a store round trip a turn on a busy node). That an input of a
scheduled kind still waits queued for its slot, in order, is
``tests/actors/scheduling/test_scheduler.py``'s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from tests.support.agents import GatedAgent
from tests.support.polling import eventually
from tests.support.sessions import NoTools, StoreWith
from turnstile.actors.sessions.actor import (
    GetStatus,
    SessionActor,
    SessionLimits,
    SessionServices,
    Submit,
)
from turnstile.actors.sessions.inputs import UserMessage
from turnstile.actors.sessions.kinds import PlainKind
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor


def services_over(store: Any, slots: trio.CapacityLimiter, agent: Any) -> SessionServices:
    """A node's session services with ``slots``, where ``tick`` inputs are scheduled."""
    services = SessionServices(
        store=store,
        agent=agent,
        tools=NoTools(),
        limits=SessionLimits(),
        encode_event=encode_event,
        scheduled_turns=slots,
    )
    services.input_kinds.register(PlainKind("tick", UserMessage, scheduled=True))
    return services


@asynccontextmanager
async def sessions(services: SessionServices) -> AsyncIterator[Registry]:
    async with open_supervisor("sessions", escalate=False) as sup:
        registry = Registry(sup, idle_timeout=30.0)
        registry.register("session", lambda key: SessionActor(key, services))
        yield registry


async def states(store: Any) -> list[str]:
    return [i.state for i in await store.list_inputs("s")]


async def test_user_turns_on_a_node_whose_slots_are_busy_do_not_read_their_queue(
    autojump_clock,
):
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        reads: list[Any] = []

        async def read(real: Any, *args: Any, **kwargs: Any) -> Any:
            reads.append((real.__name__, args, kwargs))
            return await real(*args, **kwargs)

        slots = trio.CapacityLimiter(1)
        await slots.acquire_on_behalf_of(object())  # a scheduled turn elsewhere holds it
        counted = StoreWith(store, list_inputs=read)
        async with sessions(services_over(counted, slots, GatedAgent())) as registry:
            for text in ("one", "two", "three"):
                await registry.ref("session:s").ask(Submit(content=text))

            async def all_done() -> bool:
                return await states(store) == ["done"] * 3

            await eventually(all_done)
        # the actor's one read when it started (it counts what waits); no turn read the queue
        assert reads == [("list_inputs", ("s",), {"states": ["queued"]})]
        assert slots.borrowed_tokens == 1  # no user turn took the slot
        replies = [e.payload for e in await store.read_events("s") if e.type == "stream_end"]
        assert [r["status"] for r in replies] == ["completed"] * 3


async def test_a_scheduled_input_waits_queued_for_a_slot_and_what_is_behind_it_too(
    autojump_clock,
):
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        # stored before the session starts: it finds it and knows it needs a slot
        await store.enqueue_input("s", "tick", {"content": "wait:tick"})
        slots = trio.CapacityLimiter(1)
        elsewhere = object()
        await slots.acquire_on_behalf_of(elsewhere)
        agent = GatedAgent()
        async with sessions(services_over(store, slots, agent)) as registry:
            await registry.ref("session:s").ask(Submit(content="wait:after"))
            await trio.testing.wait_all_tasks_blocked()
            assert agent.running == []
            assert await states(store) == ["queued", "queued"]  # a crash now loses nothing
            slots.release_on_behalf_of(elsewhere)
            await trio.testing.wait_all_tasks_blocked()
            assert agent.running == ["wait:tick"]
            assert slots.borrowed_tokens == 1  # the tick's
            agent.gate("wait:tick").set()
            await trio.testing.wait_all_tasks_blocked()
            assert agent.running == ["wait:tick", "wait:after"]
            assert slots.borrowed_tokens == 0  # the user's turn takes none
            agent.gate("wait:after").set()

            async def all_done() -> bool:
                return await states(store) == ["done", "done"]

            await eventually(all_done)


def fired_update() -> Any:
    from turnstile.actors.scheduling.events import JobUpdate

    return JobUpdate(
        job_id="j",
        kind="cron",
        event="fired",
        state="active",
        label="tick",
        next_fire_at=None,
        run_count=1,
    )


async def test_a_fire_into_an_idle_session_is_announced_in_its_turn_s_write(autojump_clock):
    """Issue 26: a fire's ``job_update`` and ``turn_queued`` were a commit each before the
    turn's own; into a session with nothing running they now wait for the turn's first write
    (``EventLog.emit(defer=True)``): a fast turn stores all of it with its closure."""
    from turnstile.actors.sessions.actor import Delivered

    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        appends: list[list[str]] = []

        async def append_events(real: Any, session_id: str, events: Any, **kw: Any) -> Any:
            appends.append([t for t, _ in events])
            return await real(session_id, events, **kw)

        counted = StoreWith(store, append_events=append_events)
        services = services_over(counted, trio.CapacityLimiter(3), GatedAgent())
        async with sessions(services) as registry:
            await registry.ref("session:s").ask(GetStatus())  # active, nothing queued
            item = await store.enqueue_input("s", "tick", {"content": "now"})
            await registry.ref("session:s").tell(
                Delivered(input_id=item.id, source="tick", job_update=fired_update())
            )

            async def done() -> bool:
                return await states(store) == ["done"]

            await eventually(done)
        assert appends == []  # one write, the closure's
        types = [e.type for e in await store.read_events("s")]
        assert types == [
            "job_update",
            "turn_queued",
            "stream_start",
            "stream_delta",
            "stream_end",
            "session_sync",
        ]


async def test_a_fire_that_waits_for_a_slot_is_announced_while_it_waits(autojump_clock):
    """What was held back for a turn that cannot start at once (every slot busy) is written
    before the wait, so a client sees the fire queued while it waits."""
    from turnstile.actors.sessions.actor import Delivered

    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        slots = trio.CapacityLimiter(1)
        elsewhere = object()
        await slots.acquire_on_behalf_of(elsewhere)  # a scheduled turn elsewhere holds it
        async with sessions(services_over(store, slots, GatedAgent())) as registry:
            await registry.ref("session:s").ask(GetStatus())
            item = await store.enqueue_input("s", "tick", {"content": "now"})
            await registry.ref("session:s").tell(
                Delivered(input_id=item.id, source="tick", job_update=fired_update())
            )

            async def announced() -> bool:
                types = [e.type for e in await store.read_events("s")]
                return types == ["job_update", "turn_queued"]

            await eventually(announced)
            assert await states(store) == ["queued"]
            slots.release_on_behalf_of(elsewhere)

            async def done() -> bool:
                return await states(store) == ["done"]

            await eventually(done)
