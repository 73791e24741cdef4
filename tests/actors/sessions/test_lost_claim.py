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

from tests.support.polling import eventually
from tests.support.sessions import StoreWith, session_actors
from turnstile.actors.sessions.actor import Submit
from turnstile.runtime.errors import StoreUnavailable
from turnstile.runtime.store import open_store


async def test_an_input_whose_claim_answer_was_lost_runs_once_and_in_order(autojump_clock):
    async with open_store("sqlite:///:memory:") as store:
        node, _ = await store.register_node("a", lease_seconds=60)
        store.claimer = node.ref
        await store.create_session("s", "ada")
        claims = 0

        async def claim_next_input(real, *args: Any, **kwargs: Any) -> Any:
            nonlocal claims
            claims += 1
            claimed = await real(*args, **kwargs)
            if claims == 1:  # committed, and its answer lost as an outage loses one
                raise StoreUnavailable("the store is unavailable; retry in a few seconds")
            return claimed

        losing = StoreWith(store, claim_next_input=claim_next_input)
        async with session_actors(losing) as registry:
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
