"""The kernel's tracing helpers (``runtime/tracing.py``): off, they give nothing and carry
nothing; on, spans nest as the code nests them, under a caller's ``traceparent`` when given; a
cancellation is not a failure; and which exporters the ``OTEL_*`` variables ask for."""

from __future__ import annotations

import pytest
import trio
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.tracing import (
    CALLER_SPAN,
    CALLER_TRACE,
    CALLER_TRACEPARENT,
    CALLER_TRACESTATE,
    attrs,
    traced,
)
from turnstile.runtime import tracing


def test_off_every_helper_gives_nothing():
    assert not tracing.active()
    with tracing.span("x", attributes={"a": 1}) as span:
        assert span is tracing.OFF
        assert not span.recording
        span.set("k", "v")
        span.fail("boom")
        assert span.traceparent is None
    assert tracing.child_span("y") is tracing.OFF
    assert tracing.db_span("sqlite", "op") is tracing.OFF
    assert tracing.current_traceparent() is None
    assert tracing.current_trace() is None
    tracing.clear_context()  # nothing to forget
    payload = {"content": "hi"}
    assert tracing.carry(payload, tracing.current_traceparent()) is payload
    assert tracing.carry(payload, tracing.current_trace()) is payload


def test_carry_and_without_trace():
    carried = tracing.carry({"content": "hi"}, CALLER_TRACEPARENT)
    assert carried == {"content": "hi", "traceparent": CALLER_TRACEPARENT}
    assert tracing.without_trace(carried) == {"content": "hi"}
    assert tracing.stored_parent(carried) == {"traceparent": CALLER_TRACEPARENT}
    headers = {"traceparent": CALLER_TRACEPARENT, "tracestate": CALLER_TRACESTATE}
    carried = tracing.carry({"content": "hi"}, headers)
    assert carried == {"content": "hi", **headers}
    assert tracing.stored_parent(carried) == headers
    assert tracing.without_trace(carried) == {"content": "hi"}
    # a malformed tracestate is not stored; without a traceparent nothing is
    bad = tracing.carry({"content": "hi"}, {**headers, "tracestate": "Bad Entry"})
    assert bad == {"content": "hi", "traceparent": CALLER_TRACEPARENT}
    assert tracing.carry({}, {"tracestate": CALLER_TRACESTATE}) == {}
    assert tracing.stored_parent({"content": "hi", "tracestate": CALLER_TRACESTATE}) == {}


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        (CALLER_TRACESTATE, CALLER_TRACESTATE),
        (" congo=t61rcWkgMzE , ", "congo=t61rcWkgMzE"),
        ("Bad Entry", ""),  # malformed: dropped, the traceparent still counts
        (",".join(f"k{i}=v" for i in range(33)), ""),  # more than 32 members
        ("k=" + "v" * 600, ""),  # one member longer than 512 characters: nothing fits
    ],
)
def test_a_callers_tracestate_goes_with_its_trace_checked(sent, kept):
    with traced() as spans:
        headers = {"traceparent": CALLER_TRACEPARENT, "tracestate": sent}
        with tracing.span("outer", parent=headers, kind="server"):
            with tracing.child_span("inner"):
                current = tracing.current_trace()
    assert current is not None
    assert current["traceparent"].startswith(f"00-{CALLER_TRACE}-")
    assert current.get("tracestate", "") == kept
    for name in ("outer", "inner"):  # the trace's children carry it on
        span = spans.one(name)
        assert span.context.trace_id == int(CALLER_TRACE, 16)
        assert span.context.trace_state.to_header() == kept


def test_spans_nest_under_the_callers_traceparent():
    with traced() as spans:
        with tracing.span("outer", parent=CALLER_TRACEPARENT, kind="server") as outer:
            assert outer.traceparent == tracing.current_traceparent()
            assert outer.traceparent.startswith(f"00-{CALLER_TRACE}-")
            with tracing.child_span("inner", attributes={"n": 1, "skipped": None}):
                pass
            with tracing.db_span("sqlite", "enqueue_input"):
                pass
        assert tracing.current_traceparent() is None  # the block's span is no longer current
    outer_span = spans.one("outer")
    assert outer_span.kind is SpanKind.SERVER
    assert outer_span.context.trace_id == int(CALLER_TRACE, 16)
    assert outer_span.parent.span_id == int(CALLER_SPAN, 16)
    inner = spans.one("inner")
    assert inner.parent.span_id == outer_span.context.span_id
    assert attrs(inner) == {"n": 1}
    commit = spans.one("enqueue_input")
    assert commit.kind is SpanKind.CLIENT
    assert attrs(commit) == {"db.system.name": "sqlite", "db.operation.name": "enqueue_input"}


def test_a_child_span_needs_a_span_to_be_a_child_of():
    with traced() as spans:
        with tracing.child_span("alone") as alone:
            assert alone is tracing.OFF
        with tracing.db_span("sqlite", "claim_next_input") as commit:
            assert commit is tracing.OFF
    assert spans.all == []


@pytest.mark.parametrize(
    "parent", ["junk", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", {}, {"x": "y"}]
)
def test_a_malformed_or_missing_traceparent_starts_a_new_trace(parent):
    with traced() as spans:
        with tracing.span("outer", parent=CALLER_TRACEPARENT):
            with tracing.span("fresh", parent=parent):
                pass
    assert spans.one("fresh").parent is None
    assert spans.one("fresh").context.trace_id != int(CALLER_TRACE, 16)


def test_links_name_other_spans():
    with traced() as spans:
        with tracing.span("linked", links=[CALLER_TRACEPARENT, "junk"]):
            pass
    (link,) = spans.one("linked").links
    assert link.context.trace_id == int(CALLER_TRACE, 16)
    assert link.context.span_id == int(CALLER_SPAN, 16)


def test_failures_and_cancellation():
    with traced() as spans:
        with pytest.raises(ValueError), tracing.span("raises"):
            raise ValueError("no")
        with tracing.span("fails") as span:
            span.fail("bad_arguments", "text must be a string")
    raised = spans.one("raises")
    assert raised.status.status_code is StatusCode.ERROR
    assert attrs(raised)["error.type"] == "ValueError"
    assert [e.name for e in raised.events] == ["exception"]
    failed = spans.one("fails")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "text must be a string"
    assert attrs(failed)["error.type"] == "bad_arguments"


async def test_a_cancelled_block_ends_its_span_without_an_error():
    with traced() as spans:
        with trio.CancelScope() as scope:
            with tracing.span("cancelled"):
                scope.cancel()
                await trio.sleep_forever()
    cancelled = spans.one("cancelled")
    assert cancelled.status.status_code is StatusCode.UNSET
    assert attrs(cancelled)["turnstile.cancelled"] is True


async def test_tasks_started_inside_a_span_are_its_children_and_clear_context_forgets_it():
    seen: dict[str, str | None] = {}

    async def child(name: str, clear: bool) -> None:
        if clear:
            tracing.clear_context()
        seen[name] = tracing.current_traceparent()

    with traced():
        with tracing.span("parent") as parent:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(child, "inherits", False)
                nursery.start_soon(child, "cleared", True)
        assert seen == {"inherits": parent.traceparent, "cleared": None}


@pytest.mark.parametrize(
    ("environ", "exporters"),
    [
        ({}, ()),
        ({"OTEL_SERVICE_NAME": "x"}, ()),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": " OTLP , console,otlp"}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp,none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, ()),
        ({"OTEL_TRACES_EXPORTER": "zipkin,otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": ""}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, ()),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
    ],
)
def test_exporters_from_env(environ, exporters):
    assert tracing.exporters_from_env(environ) == exporters


async def test_open_tracing_is_off_without_the_variables_and_leaves_an_installed_provider():
    async with tracing.open_tracing({}) as on:
        assert on is False
        assert not tracing.active()
    with traced():
        async with tracing.open_tracing({"OTEL_TRACES_EXPORTER": "console"}) as on:
            assert on is True
        assert tracing.active()  # not the block's to turn off


def test_install_twice_is_refused():
    with (
        traced(),
        pytest.raises(RuntimeError, match=r"^tracing is on already; uninstall\(\) first$"),
    ):
        tracing.install(object())
