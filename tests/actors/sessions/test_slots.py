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
from turnstile.actors.sessions.actor import SessionActor, SessionLimits, SessionServices, Submit
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
