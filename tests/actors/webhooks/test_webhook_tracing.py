"""A webhook delivery is a span when the node traces (issue 25): under the request that brought
it (and the sender's ``traceparent``, when it sent one), stored with the inbox input, so the
turn it wakes is its child; a delivery the sweep retries is a trace of its own."""

from __future__ import annotations

import pytest
import trio

from tests.actors.webhooks.test_ingress_node import ADA, PR3, node_with, session
from tests.support.github import check_run_event, signed
from tests.support.tracing import (
    CALLER_SPAN,
    CALLER_TRACE,
    CALLER_TRACEPARENT,
    ancestors,
    attrs,
    connected,
    traced,
    tree,
)

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

WAIT = 60


async def test_a_delivery_is_the_parent_of_the_turn_it_wakes(store_url):
    with traced() as spans:
        async with node_with(store_url) as (node, http, _):
            seen = await session(node, http, ADA, "pr3", PR3)
            request = signed("check_run", check_run_event(conclusion="failure"), delivery="d-1")
            request["headers"]["traceparent"] = CALLER_TRACEPARENT
            answer = await http.post("/webhooks/github", **request)
            assert answer.status_code == 202, answer.text
            with trio.fail_after(WAIT):
                await seen.until(b'"stream_end"')
    trace = spans.of_trace(CALLER_TRACE)
    connected(trace, root_parent=int(CALLER_SPAN, 16))
    (deliver,) = [s for s in trace if s.name == "webhook deliver"]
    assert attrs(deliver)["turnstile.webhook.delivery_id"] == "github:d-1"
    assert attrs(deliver)["turnstile.webhook.outcome"] == "delivered"
    assert attrs(deliver)["turnstile.session.id"] == "pr3"
    (turn,) = [s for s in trace if s.name == "turn"]
    assert ancestors(trace, turn) == [
        "session submit",
        "webhook deliver",
        "POST /webhooks/github",
    ], tree(trace)
    assert attrs(turn)["turnstile.input.source"] == "webhook"
    assert attrs(turn)["turnstile.turn.status"] == "completed"
