"""Traces: OpenTelemetry spans of what a node does, off unless turned on.

Off (the default) every helper here is a check of one module variable: nothing of OpenTelemetry
is imported, no span, context or attribute is made, and an inbox payload carries nothing more.
On, spans go to the tracer of the provider given to :func:`install` (tests give one with an
in-memory exporter; an embedder may give its own), or of the provider :func:`open_tracing`
makes from the standard ``OTEL_*`` environment variables (OTLP over HTTP), as ``open_node`` does.

What names spans and their attributes is the code that does the work (the gateway, the session's
turn, an agent, the tool registry, a feature); this module knows none of them. It gives:

* :func:`span`: a span around a block, current inside it (so spans started within, in this
  task or in tasks it starts, are its children), under a parent given as a W3C ``traceparent``
  or as carrier headers, or under whatever span is current.
* :func:`child_span`: a span only where one is current and recording (an operation on a traced
  path, such as a store commit a turn makes): everywhere else nothing, not even a root span.
* :func:`current_trace`: the current span's trace context as W3C headers (``traceparent``, and
  ``tracestate`` when the trace has one), to store with work that another task, another node
  or a later start picks up (the durable inbox's payload carries them under :data:`TRACE_KEY`
  and :data:`STATE_KEY`: :func:`carry`, :func:`stored_parent`, :func:`without_trace`);
  :func:`current_traceparent` the ``traceparent`` alone.
* :func:`checked_tracestate` (``runtime.tracecontext``): a W3C ``tracestate`` as a node keeps
  it, bounded, a malformed one dropped. Every parent given as headers goes through it.
* :func:`clear_context`: forget the current span in this task and the tasks it will start (an
  actor's task, spawned from whatever task first asked for it, must not make every later span
  a child of that request's).

A cancelled block (``trio.Cancelled``) ends its span without an error status: a stopped turn
or a shutdown is not a failure. Any other exception is recorded on the span, which is marked
as an error with ``error.type``.

It is over 400 lines because every helper has its off path, which is the point (one variable
read, nothing imported), beside its on path, and the configuration from the environment is
the standard variables' rules spelt out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import trio

from turnstile.runtime.tracecontext import (
    MAX_TRACESTATE_CHARS,
    MAX_TRACESTATE_MEMBERS,
    checked_tracestate,
)

__all__ = [
    "MAX_TRACESTATE_CHARS",
    "MAX_TRACESTATE_MEMBERS",
    "OFF",
    "STATE_KEY",
    "TRACE_KEY",
    "TRACE_KEYS",
    "OffSpan",
    "Span",
    "active",
    "carry",
    "checked_tracestate",
    "child_span",
    "clear_context",
    "current_trace",
    "current_traceparent",
    "db_span",
    "exporters_from_env",
    "install",
    "open_tracing",
    "span",
    "stored_parent",
    "uninstall",
    "without_trace",
]

log = logging.getLogger("turnstile.tracing")

#: The key of an inbox payload that carries the trace context of whoever stored it (a W3C
#: ``traceparent``): the turn that runs the input continues that trace, on any node.
TRACE_KEY = "traceparent"
#: The key of an inbox payload that carries its trace's W3C ``tracestate`` (vendors' entries,
#: checked by :func:`checked_tracestate`), beside :data:`TRACE_KEY`.
STATE_KEY = "tracestate"
#: Both: what a payload carries of its trace, which is no part of the input itself.
TRACE_KEYS = frozenset({TRACE_KEY, STATE_KEY})

#: How long a node's close waits for the spans still queued to be exported.
SHUTDOWN_SECONDS = 5.0

#: The exporters :func:`open_tracing` knows (``OTEL_TRACES_EXPORTER``).
KNOWN_EXPORTERS = ("otlp", "console")

Kind = Literal["internal", "server", "client", "producer", "consumer"]

#: The tracer spans are made with; None: tracing is off.
_tracer: Any = None


def active() -> bool:
    """Whether tracing is on in this process."""
    return _tracer is not None


def install(provider: Any) -> None:
    """Turn tracing on with ``provider`` (an OpenTelemetry ``TracerProvider``): every span of
    the process goes to its tracer ``turnstile`` from now on.

    Raises:
        RuntimeError: tracing is on already (:func:`uninstall` first).
    """
    global _tracer
    if _tracer is not None:
        raise RuntimeError("tracing is on already; uninstall() first")
    _tracer = provider.get_tracer("turnstile")


def uninstall() -> None:
    """Turn tracing off (spans under way still end; nothing new is traced)."""
    global _tracer
    _tracer = None


class OffSpan:
    """What a span helper gives when nothing is traced: every method does nothing."""

    __slots__ = ()

    recording = False

    def __enter__(self) -> OffSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, key: str, value: Any) -> None:
        """Set one attribute (nothing here)."""

    def update(self, attributes: Mapping[str, Any]) -> None:
        """Set attributes (nothing here)."""

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Add an event (nothing here)."""

    def fail(self, error_type: str, message: str | None = None) -> None:
        """Mark the span failed (nothing here)."""

    @property
    def traceparent(self) -> str | None:
        """None: there is no span."""
        return None


#: The span helpers' answer when nothing is traced (a context manager too).
OFF = OffSpan()


class Span:
    """A recording span, as the code that names it sets it (a thin face of OpenTelemetry's)."""

    __slots__ = ("_span",)

    recording = True

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: Any) -> None:
        """Set the attribute ``key`` (None values are left out)."""
        if value is not None:
            self._span.set_attribute(key, value)

    def update(self, attributes: Mapping[str, Any]) -> None:
        """Set several attributes (None values are left out)."""
        for key, value in attributes.items():
            if value is not None:
                self._span.set_attribute(key, value)

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Add a timestamped event to the span."""
        self._span.add_event(name, dict(attributes or {}))

    def fail(self, error_type: str, message: str | None = None) -> None:
        """Mark the span as failed: status ERROR (with ``message``) and ``error.type``."""
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR, message))

    @property
    def traceparent(self) -> str | None:
        """This span as a W3C ``traceparent``."""
        return _format(self._span.get_span_context())


class _Scope:
    """A span around a ``with`` block, current inside it."""

    __slots__ = ("_name", "_context", "_kind", "_attributes", "_links", "_start", "_span", "_token")

    def __init__(
        self,
        name: str,
        context: Any,
        kind: Kind,
        attributes: Mapping[str, Any] | None,
        links: Sequence[str],
        start_time: int | None,
    ) -> None:
        self._name = name
        self._context = context
        self._kind = kind
        self._attributes = attributes
        self._links = links
        self._start = start_time
        self._span: Any = None
        self._token: Any = None

    def __enter__(self) -> Span | OffSpan:
        tracer = _tracer
        if tracer is None:  # turned off since
            return OFF
        from opentelemetry import context as otel_context
        from opentelemetry import trace

        attributes = None
        if self._attributes:
            attributes = {k: v for k, v in self._attributes.items() if v is not None}
        links = [trace.Link(c) for c in map(_span_context, self._links) if c is not None]
        self._span = tracer.start_span(
            self._name,
            context=self._context,
            kind=getattr(trace.SpanKind, self._kind.upper()),
            attributes=attributes,
            links=links or None,
            start_time=self._start,
            record_exception=False,
            set_status_on_exception=False,
        )
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return Span(self._span)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        span = self._span
        if span is None:
            return
        from opentelemetry import context as otel_context

        try:
            if exc is not None:
                if _cancelled(exc):
                    span.set_attribute("turnstile.cancelled", True)
                else:
                    from opentelemetry.trace import Status, StatusCode

                    span.record_exception(exc)
                    span.set_attribute("error.type", type(exc).__qualname__)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}"))
        finally:
            otel_context.detach(self._token)
            span.end()


def span(
    name: str,
    *,
    parent: str | Mapping[str, Any] | None = None,
    kind: Kind = "internal",
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[str] = (),
    start_time: int | None = None,
) -> _Scope | OffSpan:
    """A span named ``name`` around a ``with`` block: ``with span("turn") as s: s.set(...)``.

    Args:
        name: the span's name (low cardinality: ``turn``, ``chat gpt-4o``, ``POST /x/{id}``).
        parent: a W3C ``traceparent`` (str), or headers that may carry one (``traceparent``,
            ``tracestate``); a missing or malformed one starts a new trace. None: the span
            current in this task is the parent (none: a new trace).
        kind: OpenTelemetry's span kind.
        attributes: set at the start (None values left out).
        links: ``traceparent`` strings of spans this one is linked to (malformed ones skipped).
        start_time: when the span began (ns since the epoch), when earlier than now.

    Returns:
        a context manager whose value is the :class:`Span` (or :data:`OFF`, tracing being off).
    """
    if _tracer is None:
        return OFF
    return _Scope(name, _parent_context(parent), kind, attributes, links, start_time)


def child_span(
    name: str,
    *,
    kind: Kind = "internal",
    attributes: Mapping[str, Any] | None = None,
    start_time: int | None = None,
) -> _Scope | OffSpan:
    """As :func:`span` under the current span, but only where one is current and recording:
    elsewhere :data:`OFF` (an operation traced on a traced path only, never as a trace of its
    own)."""
    if _tracer is None:
        return OFF
    from opentelemetry import trace

    if not trace.get_current_span().is_recording():
        return OFF
    return _Scope(name, None, kind, attributes, (), start_time)


def db_span(system: str, operation: str, *, start_time: int | None = None) -> _Scope | OffSpan:
    """:func:`child_span` for a database operation, named by it, with OpenTelemetry's database
    attributes (``db.system.name``, ``db.operation.name``); ``start_time`` for one recorded
    once it is over."""
    if _tracer is None:
        return OFF
    attributes = {"db.system.name": system, "db.operation.name": operation}
    return child_span(operation, kind="client", attributes=attributes, start_time=start_time)


def current_traceparent() -> str | None:
    """The current span as a W3C ``traceparent``; None when tracing is off or no span is
    current."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    return _format(trace.get_current_span().get_span_context())


def current_trace() -> dict[str, str] | None:
    """The current span's trace context as W3C headers: ``traceparent``, and ``tracestate``
    when the trace carries one (from the caller that began it); None when tracing is off or no
    span is current."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    traceparent = _format(context)
    if traceparent is None:
        return None
    headers = {TRACE_KEY: traceparent}
    state = checked_tracestate(context.trace_state.to_header()) if context.trace_state else None
    if state:
        headers[STATE_KEY] = state
    return headers


def clear_context() -> None:
    """Forget the current span in this task (and the tasks it starts from now on)."""
    if _tracer is None:
        return
    from opentelemetry import context as otel_context

    otel_context.attach(otel_context.Context())


def carry(payload: dict[str, Any], trace: str | Mapping[str, str] | None) -> dict[str, Any]:
    """``payload`` with the trace context ``trace`` (a new dict); ``payload`` itself when
    there is none.

    Args:
        payload: what is stored (an inbox input's payload).
        trace: a ``traceparent``, or W3C headers (:func:`current_trace`): the ``traceparent``
            goes under :data:`TRACE_KEY` and the ``tracestate``, checked, under
            :data:`STATE_KEY`. None (or headers without a ``traceparent``): nothing.
    """
    if trace is None:
        return payload
    if isinstance(trace, str):
        return {**payload, TRACE_KEY: trace}
    traceparent = trace.get(TRACE_KEY)
    if not isinstance(traceparent, str):
        return payload
    carried = {**payload, TRACE_KEY: traceparent}
    state = checked_tracestate(trace.get(STATE_KEY))
    if state is not None:
        carried[STATE_KEY] = state
    return carried


def stored_parent(payload: Mapping[str, Any]) -> dict[str, str]:
    """The parent of the work a stored ``payload`` starts (a turn, for its input): the trace
    context :func:`carry` stored, as headers for :func:`span`'s ``parent``; ``{}`` (a trace of
    its own) when it carries none, as an input stored before tracing or while it was off."""
    traceparent = payload.get(TRACE_KEY)
    if not isinstance(traceparent, str):
        return {}
    state = payload.get(STATE_KEY)
    if isinstance(state, str):
        return {TRACE_KEY: traceparent, STATE_KEY: state}
    return {TRACE_KEY: traceparent}


def without_trace(payload: Mapping[str, Any]) -> dict[str, Any]:
    """``payload`` less :data:`TRACE_KEYS` (what an input is, whatever trace it came with)."""
    return {k: v for k, v in payload.items() if k not in TRACE_KEYS}


# -- configuration from the environment -------------------------------------------------------


def exporters_from_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The span exporters the standard variables ask for; empty: tracing stays off.

    * ``OTEL_SDK_DISABLED=true``: none.
    * ``OTEL_TRACES_EXPORTER``: a comma-separated list of ``otlp`` (OTLP over HTTP) and
      ``console``; ``none`` anywhere in it: none. Unknown names are logged and skipped.
    * Without ``OTEL_TRACES_EXPORTER``: ``otlp`` when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
      ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set, else none (off by default, unlike the
      SDK's own default of ``otlp``: a node traces only when asked to).
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    named = environ.get("OTEL_TRACES_EXPORTER")
    if named is None or not named.strip():
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ("otlp",) if endpoint else ()
    chosen: list[str] = []
    for name in (n.strip().lower() for n in named.split(",")):
        if name == "none":
            return ()
        if name not in KNOWN_EXPORTERS:
            log.warning("OTEL_TRACES_EXPORTER: %r is not one of %s; skipped", name, KNOWN_EXPORTERS)
        elif name not in chosen:
            chosen.append(name)
    return tuple(chosen)


@asynccontextmanager
async def open_tracing(
    environ: Mapping[str, str] | None = None,
    *,
    service_name: str = "turnstile",
    service_version: str | None = None,
) -> AsyncIterator[bool]:
    """Tracing on for the block as the ``OTEL_*`` variables say (:func:`exporters_from_env`);
    yields whether it is on.

    Nothing is done when tracing is on already (a provider was installed, or an outer block
    opened it): the block is traced and the provider is not this block's to close. Otherwise,
    with exporters asked for, an SDK ``TracerProvider`` is made (its resource from
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, ``service.name`` and
    ``service.version`` being ``service_name`` and ``service_version`` when they give none;
    its sampler from ``OTEL_TRACES_SAMPLER``), each span
    exported in batches (``OTEL_BSP_*``) by OTLP over HTTP (``OTEL_EXPORTER_OTLP_*``:
    endpoint, headers, timeout, compression) or printed (``console``), installed, and made the
    process's global provider too when none was set (so libraries that trace through the
    global API, the MCP SDK among them, join the same traces). At the end of the block what is
    queued is exported (within :data:`SHUTDOWN_SECONDS`) and tracing is off again.
    """
    environ = os.environ if environ is None else environ
    if _tracer is not None:
        yield True
        return
    exporters = exporters_from_env(environ)
    if not exporters:
        yield False
        return
    provider = _provider(environ, exporters, service_name, service_version)
    install(provider)
    try:
        yield True
    finally:
        uninstall()
        with trio.move_on_after(SHUTDOWN_SECONDS, shield=True):
            await trio.to_thread.run_sync(provider.shutdown, abandon_on_cancel=True)


def _provider(
    environ: Mapping[str, str],
    exporters: Sequence[str],
    service_name: str,
    service_version: str | None,
) -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    if service_version is not None and SERVICE_VERSION not in resource.attributes:
        resource = resource.merge(Resource({SERVICE_VERSION: service_version}))
    provider = TracerProvider(resource=resource)
    for name in exporters:
        if name == "otlp":
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol != "http/protobuf":
                log.warning(
                    "OTEL_EXPORTER_OTLP_PROTOCOL %r: this node exports OTLP over HTTP"
                    " (http/protobuf) only, and does so",
                    protocol,
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        trace.set_tracer_provider(provider)
    return provider


# -- helpers --------------------------------------------------------------------------------------


def _format(context: Any) -> str | None:
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _parent_context(parent: str | Mapping[str, Any] | None) -> Any:
    """OpenTelemetry's context for ``parent`` (None: the current one). Headers' ``tracestate``
    is taken as :func:`checked_tracestate` keeps it (dropped, or cut), whoever sent it."""
    if parent is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if isinstance(parent, str):
        carrier = {TRACE_KEY: parent}
    else:
        carrier = {}
        traceparent = parent.get(TRACE_KEY)
        if isinstance(traceparent, str):
            carrier[TRACE_KEY] = traceparent
            state = parent.get(STATE_KEY)
            state = checked_tracestate(state) if isinstance(state, str) else None
            if state is not None:
                carrier[STATE_KEY] = state
    return TraceContextTextMapPropagator().extract(carrier)


def _span_context(traceparent: str) -> Any:
    from opentelemetry import trace

    context = trace.get_current_span(_parent_context(traceparent)).get_span_context()
    return context if context.is_valid else None


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation (alone, or all a group holds)."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_cancelled(e) for e in exc.exceptions)
    return False
