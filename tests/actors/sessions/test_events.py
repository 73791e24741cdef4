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
import trio.testing

from tests.support.agents import GatedAgent
from tests.support.polling import eventually
from tests.support.sessions import StoreWith, session_actors
from turnstile.actors.sessions.actor import Inject, Submit
from turnstile.runtime.errors import StoreError, StoreUnavailable
from turnstile.runtime.store import open_store

pytestmark = pytest.mark.guard(600)


def refusing_appends(refuse: set[int], error: Exception):
    """A ``StoreWith`` override of ``append_events`` that refuses the appends numbered in
    ``refuse`` (1, 2, …) as ``error`` does (nothing committed); ``.appends`` counts them."""

    async def append_events(real, *args: Any, **kwargs: Any) -> Any:
        append_events.appends += 1  # type: ignore[attr-defined]
        if append_events.appends in refuse:  # type: ignore[attr-defined]
            raise error
        return await real(*args, **kwargs)

    append_events.appends = 0  # type: ignore[attr-defined]
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
    agent = GatedAgent()
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        # the turn's stream_start goes in an append of its own while the agent waits (refused
        # twice); the message's turn_queued commits with it, and the closure (stream_delta,
        # stream_end, session_sync) with its input's state (tests/actors/sessions/
        # test_closure.py)
        appends = refusing_appends({1, 2}, error)
        async with session_actors(StoreWith(store, append_events=appends), agent) as registry:
            submitted = await registry.ref("session:s").ask(Submit(content="wait:hello"))

            async def started() -> bool:
                return appends.appends >= 3  # (mock time: the retries' pauses pass at once)

            await eventually(started)
            agent.gate("wait:hello").set()

            async def closed() -> bool:
                return [i.state for i in await store.list_inputs("s")] == ["done"]

            await eventually(closed)
        events = await store.read_events("s")
        assert [(e.seq, e.type) for e in events] == [
            (1, "turn_queued"),
            (2, "stream_start"),
            (3, "stream_delta"),
            (4, "stream_end"),
            (5, "session_sync"),  # a turn nobody watched ends with one, in its closure
        ]
        assert all(e.payload["input_id"] == submitted.input_id for e in events)
        assert events[3].payload["status"] == "completed"
        assert appends.appends == 3  # the refused tries were made, and made again


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
        entered, release = trio.Event(), trio.Event()

        async def enqueue_keyed(real, *args: Any, **kwargs: Any) -> Any:
            entered.set()  # folding in: the key is being stored…
            await release.wait()  # …until the test lets it
            return await real(*args, **kwargs)

        holding = StoreWith(store, enqueue_keyed=enqueue_keyed)
        async with session_actors(holding, agent) as registry:
            ref = registry.ref("session:s")
            await ref.ask(Submit(content="wait:a"))
            answers: list[Any] = []

            async def tell() -> None:
                notice = Inject(content="the task ended", idempotency_key="background:bg-1")
                answers.append(await ref.ask(notice))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(tell)
                await entered.wait()
                agent.gate("wait:a").set()  # the turn ends meanwhile

                async def first_closed() -> bool:
                    return [i.state for i in await store.list_inputs("s")] == ["done"]

                await eventually(first_closed)
                release.set()

            async def notice_ran() -> bool:
                return "the task ended" in agent.running and all(
                    i.state == "done" for i in await store.list_inputs("s")
                )

            await eventually(notice_ran)
        starts = [
            e.payload["content"] for e in await store.read_events("s") if e.type == "stream_start"
        ]
        assert starts == ["wait:a", "the task ended"]
        # one row tells the session: the keyed one, queued again, ran the turn
        notices = [i for i in await store.list_inputs("s") if i.source != "user"]
        assert [(i.id, i.state, i.idempotency_key) for i in notices] == [
            (answers[0].input_id, "done", "background:bg-1")
        ]


async def test_a_keyed_notice_whose_turn_ends_while_its_message_is_stored_is_told_once(
    autojump_clock,
):
    """Found by the crash harness (``background on postgres at fail:14``): the key was stored
    (its row ``done``, folded into the running turn), then the notice's ``user_message`` met a
    refused commit and was tried again, and the turn closed meanwhile. The notice then ran as
    a turn of its own, in a second row: the session was told twice of one task. Now the keyed
    row is queued again and runs that turn."""
    agent = GatedAgent()
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        entered, release = trio.Event(), trio.Event()

        async def append_events(real, session_id, events, **kwargs: Any) -> Any:
            if any(t == "user_message" for t, _ in events) and not release.is_set():
                entered.set()  # the notice's message is being stored (tried again)…
                await release.wait()  # …until the test lets it
            return await real(session_id, events, **kwargs)

        holding = StoreWith(store, append_events=append_events)
        async with session_actors(holding, agent) as registry:
            ref = registry.ref("session:s")
            await ref.ask(Submit(content="wait:a"))
            answers: list[Any] = []

            async def tell() -> None:
                notice = Inject(content="the task ended", idempotency_key="background:bg-1")
                answers.append(await ref.ask(notice))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(tell)
                await entered.wait()
                agent.gate("wait:a").set()  # the agent ends its turn meanwhile…
                # …and its closure waits behind the notice's message
                await trio.testing.wait_all_tasks_blocked()
                release.set()

            async def notice_ran() -> bool:
                return "the task ended" in agent.running and all(
                    i.state == "done" for i in await store.list_inputs("s")
                )

            await eventually(notice_ran)
        notices = [i for i in await store.list_inputs("s") if i.source != "user"]
        assert [(i.id, i.state, i.idempotency_key) for i in notices] == [
            (answers[0].input_id, "done", "background:bg-1")
        ]
        starts = [
            e.payload["content"] for e in await store.read_events("s") if e.type == "stream_start"
        ]
        assert starts == ["wait:a", "the task ended"]


@pytest.mark.parametrize("committed", [False, True], ids=["not-stored", "stored"])
async def test_a_batch_cut_by_shutdown_goes_in_ahead_of_the_closure(autojump_clock, committed):
    """Found by the suite's crash sample (seed 1959230062, ``cron on sqlite at fail:7``): the
    node stopped while the batch holding a turn's ``stream_start`` was being written; the cut
    write stored nothing, and the shielded closure stored ``stream_end interrupted`` alone: a
    turn that ended without having started. Now the cut batch's events go in with the closure,
    ahead of its ``stream_end``. When the cut write had committed after all (PostgreSQL: a
    commit cut mid-flight may have gone through), they are not stored a second time."""
    agent = GatedAgent()
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        cut = trio.Event()

        async def append_events(real, *args: Any, **kwargs: Any) -> Any:
            if cut.is_set():
                return await real(*args, **kwargs)
            cut.set()  # the stream_start's batch: the node stops while it is being written
            if committed:
                await real(*args, **kwargs)
            await trio.sleep_forever()

        async with session_actors(StoreWith(store, append_events=append_events), agent) as reg:
            submitted = await reg.ref("session:s").ask(Submit(content="wait:hello"))
            await cut.wait()
            # leaving the block stops the node: the turn is cut and closed, shielded
        events = await store.read_events("s")
        assert [(e.seq, e.type) for e in events] == [
            (1, "turn_queued"),
            (2, "stream_start"),
            (3, "stream_end"),
            (4, "session_sync"),
        ]
        assert all(e.payload["input_id"] == submitted.input_id for e in events)
        assert events[2].payload["status"] == "interrupted"
        assert [i.state for i in await store.list_inputs("s")] == ["interrupted"]


async def test_a_refused_commit_that_went_through_is_not_stored_twice(autojump_clock):
    """A commit whose answer was lost (PostgreSQL: the connection dropped during ``COMMIT``)
    is refused as an outage although it went through. Before, the batch was tried again as it
    was, and the log held the turn's ``stream_start`` twice; now the store is asked first."""
    agent = GatedAgent()
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        calls = 0

        async def append_events(real, *args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            records = await real(*args, **kwargs)
            if calls == 1:
                raise StoreUnavailable("the store is unavailable; retry in a few seconds")
            return records

        async with session_actors(StoreWith(store, append_events=append_events), agent) as reg:
            ref = reg.ref("session:s")
            await ref.ask(Submit(content="wait:hello"))

            async def started() -> bool:
                return calls >= 1

            await eventually(started)
            agent.gate("wait:hello").set()

            async def closed() -> bool:
                return [i.state for i in await store.list_inputs("s")] == ["done"]

            await eventually(closed)
        types = [e.type for e in await store.read_events("s")]
        assert types == [
            "turn_queued",
            "stream_start",
            "stream_delta",
            "stream_end",
            "session_sync",
        ]
