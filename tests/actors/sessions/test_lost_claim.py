"""A claim whose answer is lost still runs its input (issue 23, 'Store outages').

A claim is one commit. When the connection to the database fails after the commit and before
its answer (a stall, a reset, a half-open connection), the input is ``running``, stamped with
this node, and no turn runs it. Before, the turn runner's next claim took the input after it,
and the claimed one stayed ``running`` until the node's next start: an acknowledged message
that never ran (found by ``tests/e2e/test_store_outage.py``'s half-open connection, one run in
three). Now the runner, after a claim the store did not answer, first looks for such an input
and runs it, in its place in the order.
"""

from __future__ import annotations

from typing import Any

from tests.support.agents import GatedAgent
from tests.support.polling import eventually
from tests.support.sessions import NoTools
from turnstile.actors.sessions.actor import SessionActor, SessionLimits, SessionServices, Submit
from turnstile.runtime.errors import StoreUnavailable
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor


class LosesClaimAnswers:
    """The real store, except that the answers of its first ``lost`` claims are lost: each
    commits, then fails as an outage does."""

    def __init__(self, store: Any, lost: int) -> None:
        self._store = store
        self.lost = lost
        self.claims = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if name != "claim_next_input":
            return attr

        async def claim_next_input(*args: Any, **kwargs: Any) -> Any:
            self.claims += 1
            claimed = await attr(*args, **kwargs)
            if self.claims <= self.lost:
                raise StoreUnavailable("the store is unavailable; retry in a few seconds")
            return claimed

        return claim_next_input


async def test_an_input_whose_claim_answer_was_lost_runs_once_and_in_order(autojump_clock):
    async with open_store("sqlite:///:memory:") as store:
        node, _ = await store.register_node("a", lease_seconds=60)
        store.claimer = node.ref
        await store.create_session("s", "ada")
        losing = LosesClaimAnswers(store, lost=1)
        services = SessionServices(
            store=losing,  # type: ignore[arg-type]
            agent=GatedAgent(),
            tools=NoTools(),
            limits=SessionLimits(),
            encode_event=encode_event,
        )
        async with open_supervisor("sessions", escalate=False) as sup:
            registry = Registry(sup, idle_timeout=30.0)
            registry.register("session", lambda key: SessionActor(key, services))
            first = await registry.ref("session:s").ask(Submit(content="one"))
            second = await registry.ref("session:s").ask(Submit(content="two"))

            async def both_done() -> bool:
                return [i.state for i in await store.list_inputs("s")] == ["done", "done"]

            await eventually(both_done)  # mock time: the runner waits a second after the loss
        events = await store.read_events("s")
        starts = [e.payload["input_id"] for e in events if e.type == "stream_start"]
        ends = [
            (e.payload["input_id"], e.payload["status"]) for e in events if e.type == "stream_end"
        ]
        assert starts == [first.input_id, second.input_id]  # each once, in arrival order
        assert ends == [(first.input_id, "completed"), (second.input_id, "completed")]
