"""A fire is a span of its own when the node traces (issue 25), stored with the inbox input it
makes: the turn that runs the input is its child, across the inbox. On a mock clock: the job
falls due an hour later and nothing waits for it in real time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from opentelemetry.trace import SpanKind

from tests.support.agents import SeeingAgent
from tests.support.mock_node import DAY, T0, node, once
from tests.support.tracing import attrs, connected, traced, tree
from turnstile.actors.scheduling.actor import AddJob
from turnstile.runtime import tracing


@pytest.mark.guard(2 * DAY)
async def test_a_fire_is_the_parent_of_the_turn_it_starts(autojump_clock):
    with traced() as spans:
        async with node(agent=SeeingAgent()) as n:
            job = await n.scheduler.ask(
                AddJob(
                    session_id="s",
                    kind="once",
                    schedule=once(T0 + timedelta(hours=1)),
                    deliver={"prompt": "ship it"},
                )
            )
            await n.seen.until(b'"stream_end"')
            (item,) = await n.store.list_inputs("s")
            assert tracing.TRACE_KEY in item.payload
            assert tracing.TRACE_KEY not in n.agent.inputs[0].payload  # the agent is not shown it
    (fire,) = spans.named("fire once")
    trace = spans.of_trace(fire.context.trace_id)
    connected(trace, root_parent=None)
    assert fire.kind is SpanKind.PRODUCER and fire.parent is None
    assert attrs(fire)["turnstile.job.id"] == job.id
    assert attrs(fire)["turnstile.job.kind"] == "once"
    assert attrs(fire)["turnstile.job.fired"] is True
    assert attrs(fire)["turnstile.input.id"] == item.id
    assert attrs(fire)["turnstile.job.scheduled_for"] == (T0 + timedelta(hours=1)).isoformat()
    (turn,) = [s for s in trace if s.name == "turn"]
    assert turn.parent.span_id == fire.context.span_id, tree(trace)
    assert attrs(turn)["turnstile.input.source"] == "once"
    assert attrs(turn)["turnstile.input.id"] == item.id
    assert attrs(turn)["turnstile.turn.status"] == "completed"
