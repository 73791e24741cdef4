"""A turn's closure is one commit: its ``stream_end``, its input's final state and what its
input's kind settles (a job's run) are stored together (``EventLog.close``,
``Store.close_input``), so a crash anywhere around it leaves the turn closed once.

The defect this pins (issue 23): the node died after a turn's ``stream_end completed`` was
stored and before its input was marked done; the restart's recovery found the input
``running`` and closed the turn a second time (a second ``stream_end``, ``interrupted``).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from tests.support.agents import GatedAgent
from tests.support.polling import eventually
from tests.support.sessions import NoTools, StoreWith, session_actors
from turnstile.actors.recovery import recover
from turnstile.actors.sessions.actor import SessionActor, SessionLimits, SessionServices, Submit
from turnstile.runtime.errors import StoreUnavailable
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor

pytestmark = pytest.mark.guard(600)

#: The store's writes a session makes while it runs a turn.
WRITES = frozenset(
    {
        "append_events",
        "close_input",
        "close_input_peek",
        "finish_input",
        "enqueue_input",
        "enqueue_keyed",
        "claim_next_input",
        "update_run",
    }
)


class DiesAfterStreamEnd:
    """The real store, until a write that stored a ``stream_end`` returns: from then on no
    write returns (the process died right after that commit)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.dead = trio.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name not in WRITES:
            return attr

        async def write(*args: Any, **kwargs: Any) -> Any:
            if self.dead.is_set():
                await trio.sleep_forever()
            result = await attr(*args, **kwargs)
            closing = ("append_events", "close_input", "close_input_peek")
            events = args[1] if name in closing else ()
            if any(type_ == "stream_end" for type_, _ in events):
                self.dead.set()
            return result

        return write


async def test_a_crash_right_after_a_turns_stream_end_is_stored_does_not_close_it_twice(
    autojump_clock,
):
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        dying = DiesAfterStreamEnd(store)
        services = SessionServices(
            store=dying,  # type: ignore[arg-type]
            agent=GatedAgent(),
            tools=NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
        )
        with trio.CancelScope() as process:
            async with open_supervisor("sessions", escalate=False) as sup:
                registry = Registry(sup, idle_timeout=30.0)
                registry.register("session", lambda key: SessionActor(key, services))
                submitted = await registry.ref("session:s").ask(Submit(content="hello"))
                await dying.dead.wait()
                await trio.testing.wait_all_tasks_blocked()
                process.cancel()  # the process dies: nothing after that commit is stored
        # The restart, on the same store.
        assert await recover(store) == []
        events = await store.read_events("s")
        mine = [e for e in events if e.payload.get("input_id") == submitted.input_id]
        assert [(e.type, e.payload.get("status")) for e in mine] == [
            ("turn_queued", None),
            ("stream_start", None),
            ("stream_delta", None),
            ("stream_end", "completed"),
            ("session_sync", "completed"),  # nobody watched: committed with the stream_end
        ]
        (item,) = await store.list_inputs("s")
        assert (item.id, item.state) == (submitted.input_id, "done")


async def test_a_closure_the_store_refuses_is_tried_again_and_the_session_goes_on(
    autojump_clock,
):
    """Issue 23's crash harness with the fault ``fail:N`` on ``close_input``: the refused
    commit crashed the session actor and left the input ``running`` until the node's next
    start, and the next message never ran. Now the closure is tried again until the store
    takes it: one ``stream_end``, the input ``done``, the next message runs."""
    async with open_store("sqlite:///:memory:") as store:
        await store.create_session("s", "ada")
        tries = 0

        async def close_input_peek(real, *args: Any, **kwargs: Any) -> Any:
            nonlocal tries
            tries += 1
            if tries <= 3:  # refused as an outage's commits are: nothing stored
                raise StoreUnavailable("the store is unavailable; retry in a few seconds")
            return await real(*args, **kwargs)

        async with session_actors(StoreWith(store, close_input_peek=close_input_peek)) as registry:
            first = await registry.ref("session:s").ask(Submit(content="one"))
            second = await registry.ref("session:s").ask(Submit(content="two"))

            async def both_done() -> bool:
                return [i.state for i in await store.list_inputs("s")] == ["done", "done"]

            await eventually(both_done)  # mock time: the pauses between tries, 0.2 s up
        assert tries == 5  # three refused, then one closure for each turn
        events = await store.read_events("s")
        for submitted in (first, second):
            ends = [
                e.payload["status"]
                for e in events
                if e.type == "stream_end" and e.payload["input_id"] == submitted.input_id
            ]
            assert ends == ["completed"]
