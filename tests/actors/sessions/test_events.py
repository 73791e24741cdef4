"""A session's event log (``actors/sessions/events.py``) keeps what the store refused for a
moment: a batch the store refuses is tried again, in order, rather than dropped.

The defect this pins (issue 23, "one failed event batch also dropped a stream_start", found
again by the crash harness with the fault ``fail:N``): a refused batch was dropped, the turn
went on, and its ``turn_queued`` or ``stream_start`` was missing from the log for good.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.agents import GatedAgent
from tests.support.polling import eventually
from tests.support.sessions import NoTools
from turnstile.actors.sessions.actor import SessionActor, SessionLimits, SessionServices, Submit
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
