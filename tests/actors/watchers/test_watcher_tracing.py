"""A watcher check is a span when the node traces (issue 25): its tool call is its child, and
the notification it escalates is stored under it, so the turn that tells the session is in the
check's trace. On a mock clock: the checks fall every 10 s of trio's time."""

from __future__ import annotations

import pytest
import trio

from tests.support.mock_node import DAY
from tests.support.tracing import ancestors, attrs, children, connected, traced, tree
from tests.support.watchers import watching


@pytest.mark.guard(DAY)
async def test_each_check_is_a_span_with_its_tool_call_and_what_it_escalates(autojump_clock):
    with traced() as spans:
        async with watching() as w:
            wid = await w.start(interval=10, label="API health")
            await trio.sleep(25)  # checks at 0, 10 and 20; the first one is the baseline
            await w.n.seen.until(b'"stream_end"')
    checks = sorted(spans.named("watcher check"), key=lambda s: s.start_time)
    assert len(checks) == 3
    for check in checks:
        assert check.parent is None
        assert attrs(check)["turnstile.watcher.id"] == wid
        assert attrs(check)["turnstile.watcher.tool"] == "probe.read"
        assert attrs(check)["turnstile.session.id"] == "s"
        trace = spans.of_trace(check.context.trace_id)
        connected(trace, root_parent=None)
        (tool,) = [s for s in children(trace, check) if s.name.startswith("execute_tool")]
        assert tool.name == "execute_tool probe.read"
        assert attrs(tool)["turnstile.tool.ok"] is True
    # the baseline was escalated: its notification's turn is in the first check's trace
    first = spans.of_trace(checks[0].context.trace_id)
    (turn,) = [s for s in first if s.name == "turn"]
    assert ancestors(first, turn) == ["watcher check"], tree(first)
    assert attrs(turn)["turnstile.input.source"] == "notification"
