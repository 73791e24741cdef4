"""A session's event log (``actors/sessions/events.py``) keeps what the store refused for a
moment: a batch the store refuses is tried again, in order, rather than dropped. And a keyed
notice whose turn ends while it is stored is not lost in the closed turn.

The defect this pins (issue 23, "one failed event batch also dropped a stream_start", found
again by the crash harness with the fault ``fail:N``): a refused batch was dropped, the turn
went on, and its ``turn_queued`` or ``stream_start`` was missing from the log for good.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.support.agents import GatedAgent
from tests.support.polling import eventually
from tests.support.sessions import NoTools
from turnstile.actors.sessions.actor import (
    Inject,
    SessionActor,
    SessionLimits,
    SessionServices,
    Submit,
)
from turnstile.runtime.errors import StoreError, StoreUnavailable
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor

pytestmark = pytest.mark.guard(600)


class RefusesAppends:
    """The real store, except that the appends it is told to refuse fail as ``error`` does
    (nothing committed)."""

    def __init__(self, store: Any, refuse: set[int], error: Exception) -> None:
        self._store = store
        self.refuse = refuse
        self.error = error
        self.appends = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name != "append_events":
            return attr

        async def append_events(*args: Any, **kwargs: Any) -> Any:
            self.appends += 1
            if self.appends in self.refuse:
                raise self.error
            return await attr(*args, **kwargs)

        return append_events


@pytest.mark.parametrize(
    "error",
    [
        StoreUnavailable("the store is unavailable; retry in a few seconds"),
        StoreError("sqlite: transaction failed: disk I/O error"),
    ],
    ids=["outage", "failed-commit"],
)
async def test_a_refused_batch_is_stored_later_in_order_not_dropped(autojump_clock, error):
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        refusing = RefusesAppends(store, refuse={1, 2, 4}, error=error)
        services = SessionServices(
            store=refusing,  # type: ignore[arg-type]
            agent=GatedAgent(),
            tools=NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
        )
        async with open_supervisor("sessions", escalate=False) as sup:
            registry = Registry(sup, idle_timeout=30.0)
            registry.register("session", lambda key: SessionActor(key, services))
            submitted = await registry.ref("session:s").ask(Submit(content="hello"))

            async def closed() -> bool:
                return [i.state for i in await store.list_inputs("s")] == ["done"]

            await eventually(closed)
        events = await store.read_events("s")
        assert [(e.seq, e.type) for e in events] == [
            (1, "turn_queued"),
            (2, "stream_start"),
            (3, "stream_delta"),
            (4, "stream_end"),
            (5, "session_sync"),  # a turn nobody watched ends with one
        ]
        assert all(e.payload["input_id"] == submitted.input_id for e in events)
        assert events[3].payload["status"] == "completed"
        assert refusing.appends >= 4  # the refused tries were made, and made again


class HoldsKeyedEnqueues:
    """The real store, except that ``enqueue_keyed`` waits for ``release`` (and says when it
    was entered): a keyed notice still being stored while its turn ends."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.entered = trio.Event()
        self.release = trio.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name != "enqueue_keyed":
            return attr

        async def enqueue_keyed(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            await self.release.wait()
            return await attr(*args, **kwargs)

        return enqueue_keyed


async def test_a_keyed_notice_whose_turn_ends_while_it_is_stored_runs_as_its_own_turn(
    autojump_clock,
):
    """Found by issue 23's survivor crash runs (``background``): a background task's notice
    (keyed, so that it is stored once) was folded into the running turn, but that turn closed
    while the key was being stored; the notice was marked ``injected_into`` the closed turn
    and the agent never saw it. Now it runs as a turn of its own."""
    agent = GatedAgent()
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        holding = HoldsKeyedEnqueues(store)
        services = SessionServices(
            store=holding,  # type: ignore[arg-type]
            agent=agent,
            tools=NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
        )
        async with open_supervisor("sessions", escalate=False) as sup:
            registry = Registry(sup, idle_timeout=30.0)
            registry.register("session", lambda key: SessionActor(key, services))
            ref = registry.ref("session:s")
            await ref.ask(Submit(content="wait:a"))
            answers: list[Any] = []

            async def tell() -> None:
                notice = Inject(content="the task ended", idempotency_key="background:bg-1")
                answers.append(await ref.ask(notice))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(tell)
                await holding.entered.wait()  # folding in: the key is being stored
                agent.gate("wait:a").set()  # the turn ends meanwhile

                async def first_closed() -> bool:
                    return [i.state for i in await store.list_inputs("s")] == ["done"]

                await eventually(first_closed)
                holding.release.set()

            async def notice_ran() -> bool:
                return "the task ended" in agent.running and all(
                    i.state == "done" for i in await store.list_inputs("s")
                )

            await eventually(notice_ran)
        starts = [
            e.payload["content"] for e in await store.read_events("s") if e.type == "stream_start"
        ]
        assert starts == ["wait:a", "the task ended"]
        assert answers[0].input_id is not None
