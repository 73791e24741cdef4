"""Traces in tests: the node's spans kept in memory by the OpenTelemetry SDK, and what a test
asks of them (one trace, connected, which span is whose parent).

``traced()`` turns tracing on for the block with a provider whose ``InMemorySpanExporter``
receives each span as it ends (``SimpleSpanProcessor``: nothing batched, nothing to flush).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from turnstile.runtime import tracing

__all__ = [
    "Spans",
    "traced",
    "CALLER_TRACE",
    "CALLER_SPAN",
    "CALLER_TRACEPARENT",
    "CALLER_TRACESTATE",
]

#: A caller's span, as a client that traces would send it (W3C ``traceparent``).
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
#: Its vendors' entries (W3C ``tracestate``), a simple key and a multi-tenant one.
CALLER_TRACESTATE = "congo=t61rcWkgMzE,rojo@sys=00f067aa0ba902b7"


class Spans:
    """The spans ended so far, and questions about them."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    @property
    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, (name, [s.name for s in self.all])
        return found[0]

    def of_trace(self, trace_id: int | str) -> list[ReadableSpan]:
        wanted = int(trace_id, 16) if isinstance(trace_id, str) else trace_id
        return [s for s in self.all if s.context.trace_id == wanted]

    def clear(self) -> None:
        self.exporter.clear()


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if parent_id(s) == parent.context.span_id]


def ancestors(spans: Sequence[ReadableSpan], span: ReadableSpan) -> list[str]:
    """The names of ``span``'s ancestors among ``spans``, nearest first."""
    by_id = {s.context.span_id: s for s in spans}
    names: list[str] = []
    current = by_id.get(parent_id(span) or -1)
    while current is not None:
        names.append(current.name)
        current = by_id.get(parent_id(current) or -1)
    return names


def connected(spans: Sequence[ReadableSpan], root_parent: int | None) -> None:
    """Assert ``spans`` form one tree: one trace, every span's parent among them, but for the
    root, whose parent is ``root_parent`` (a caller's span, or None for a new trace)."""
    assert spans, "no spans"
    assert len({s.context.trace_id for s in spans}) == 1, "spans of several traces"
    ids = {s.context.span_id for s in spans}
    roots = [s for s in spans if parent_id(s) not in ids]
    assert [parent_id(s) for s in roots] == [root_parent], [(s.name, parent_id(s)) for s in roots]


def tree(spans: Sequence[ReadableSpan]) -> str:
    """``spans`` as an indented tree, by start time (for assertion messages)."""
    ids = {s.context.span_id for s in spans}
    lines: list[str] = []

    def walk(span: ReadableSpan, depth: int) -> None:
        lines.append(f"{'  ' * depth}{span.name}")
        for child in sorted(children(spans, span), key=lambda s: s.start_time or 0):
            walk(child, depth + 1)

    roots = [s for s in spans if parent_id(s) not in ids]
    for root in sorted(roots, key=lambda s: s.start_time or 0):
        walk(root, 0)
    return "\n".join(lines)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@contextmanager
def traced() -> Iterator[Spans]:
    """Tracing on for the block, every span kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield Spans(exporter)
    finally:
        tracing.uninstall()
        provider.shutdown()
