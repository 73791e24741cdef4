"""The node's scheduled-turn slots seen from a session (``actors/sessions/slots.py``): user turns
take none, and on a node whose slots are all busy they run without reading their queue first
(issue 26: the read was a store round trip a turn on a busy node). That an input of a
scheduled kind still waits queued for its slot, in order, is
``tests/actors/scheduling/test_scheduler.py``'s."""

from __future__ import annotations

from typing import Any

import trio

from tests.support.agents import GatedAgent
from tests.support.polling import eventually
from tests.support.sessions import NoTools, StoreWith
from turnstile.actors.sessions.actor import SessionActor, SessionLimits, SessionServices, Submit
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor


async def test_user_turns_on_a_node_whose_slots_are_busy_do_not_read_their_queue(
    autojump_clock,
):
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        reads: list[Any] = []

        async def list_inputs(real: Any, *args: Any, **kwargs: Any) -> Any:
            reads.append((args, kwargs))
            return await real(*args, **kwargs)

        slots = trio.CapacityLimiter(1)
        await slots.acquire_on_behalf_of(object())  # a scheduled turn elsewhere holds it
        services = SessionServices(
            store=StoreWith(store, list_inputs=list_inputs),
            agent=GatedAgent(),
            tools=NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
            scheduled_turns=slots,
        )
        async with open_supervisor("sessions", escalate=False) as sup:
            registry = Registry(sup, idle_timeout=30.0)
            registry.register("session", lambda key: SessionActor(key, services))
            for text in ("one", "two", "three"):
                await registry.ref("session:s").ask(Submit(content=text))

            async def all_done() -> bool:
                return [i.state for i in await store.list_inputs("s")] == ["done"] * 3

            await eventually(all_done)
        # the actor's one read when it started (it counts what waits); no turn read the queue
        assert reads == [(("s",), {"states": ["queued"]})]
        assert slots.borrowed_tokens == 1  # no user turn took the slot
        replies = [e.payload for e in await store.read_events("s") if e.type == "stream_end"]
        assert [r["status"] for r in replies] == ["completed"] * 3
