"""A real ``turnstile serve`` exports its traces over OTLP/HTTP when the standard ``OTEL_*``
variables ask (issue 25): a receiver here, on loopback, decodes what it posts with the OTLP
protobuf types (``opentelemetry-proto``), and finds the caller's trace whole: the request, the
submit, the turn, its two model calls (the OpenAI stand-in, on loopback too) and its two tool
calls, each under the span it belongs to, under the resource the variables named.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.support.agents import ENV_VARS
from tests.support.fake_openai import Stream, start_standin, text_stream, tool_stream, usage_chunk
from tests.support.serve import launch, stop
from tests.support.tracing import CALLER_SPAN, CALLER_TRACE, CALLER_TRACEPARENT

TOKEN = "tracing-e2e-token-0123456789"
#: a hang guard on the real clock (a subprocess starting, batches exported), not a promise
WAIT = 60


@dataclass
class Exported:
    """One span as the node exported it."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver: every span of every export request, decoded."""

    spans: list[Exported] = field(default_factory=list)
    requests: int = 0
    content_types: set[str] = field(default_factory=set)
    arrived: trio.Event = field(default_factory=trio.Event)
    url: str = ""

    async def traces(self, request: Request) -> Response:
        self.content_types.add(request.headers.get("content-type", ""))
        export = ExportTraceServiceRequest.FromString(await request.body())
        self.requests += 1
        for resource_spans in export.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Exported(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            resource=resource,
                        )
                    )
        self.arrived.set()
        self.arrived = trio.Event()
        body = ExportTraceServiceResponse().SerializeToString()
        return Response(body, media_type="application/x-protobuf")

    async def until(self, name: str) -> Exported:
        """The first span named ``name`` received (waiting for it)."""
        while True:
            for span in self.spans:
                if span.name == name:
                    return span
            await self.arrived.wait()

    def named(self, name: str) -> list[Exported]:
        return [span for span in self.spans if span.name == name]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


async def start_receiver(nursery: trio.Nursery) -> Receiver:
    receiver = Receiver()
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    app = Starlette(routes=[Route("/v1/traces", receiver.traces, methods=["POST"])])
    (bind,) = await nursery.start(hypercorn_serve, app, config)
    receiver.url = bind
    return receiver


def node_env(receiver: Receiver, model_url: str) -> dict[str, str]:
    """This process's environment, less any tracing or model settings of its own, plus the
    standard variables that turn tracing on, and the stand-in as the model."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k not in ENV_VARS}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,  # the exporter posts to <it>/v1/traces
        OTEL_SERVICE_NAME="turnstile-e2e",
        OTEL_BSP_SCHEDULE_DELAY="50",  # ms between exports: the test waits less
        TURNSTILE_OPENAI_BASE_URL=model_url,
        TURNSTILE_OPENAI_MODEL="m",
    )
    return env


@pytest.mark.slow
async def test_a_real_node_exports_the_callers_trace_over_otlp_http(tmp_path, nursery):
    receiver = await start_receiver(nursery)
    standin = await start_standin(nursery)
    asks = tool_stream(("call_1", "echo", {"text": "hi"}), ("call_2", "clock__now", {}))
    standin.script(
        Stream([*asks.chunks, usage_chunk(40, 12)]), text_stream("It is now.", usage=(60, 4))
    )
    args = ["--agent", "openai", "--port", "0", "--store", f"sqlite:///{tmp_path}/node.db"]
    process, url = await launch(
        [*args, "--dev-token", TOKEN],
        env=node_env(receiver, standin.base_url),
        stderr=subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http:
            created = await http.post("/sessions", json={"id": "s"})
            assert created.status_code == 201, created.text
            sent = await http.post(
                "/sessions/s/messages",
                json={"content": "what time is it?"},
                headers={"traceparent": CALLER_TRACEPARENT},
            )
            assert sent.status_code == 202, sent.text
        with trio.fail_after(WAIT):
            turn = await receiver.until("turn")  # exported once the turn closed
    finally:
        await stop(process)  # a graceful stop exports what is still queued
    assert process.returncode == 0
    assert receiver.content_types == {"application/x-protobuf"}
    assert len(standin.requests) == 2

    trace = [span for span in receiver.spans if span.trace_id == CALLER_TRACE]
    by_id = {span.span_id: span for span in trace}
    names = sorted(span.name for span in trace if "db.system.name" not in span.attributes)
    assert names == [
        "POST /sessions/{id}/messages",
        "chat m",
        "chat m",
        "execute_tool clock.now",
        "execute_tool echo",
        "session submit",
        "turn",
    ]
    roots = [span for span in trace if span.parent_id not in by_id]
    assert [(span.name, span.parent_id) for span in roots] == [
        ("POST /sessions/{id}/messages", CALLER_SPAN)
    ]

    def parent(span: Exported) -> str:
        return by_id[span.parent_id].name

    assert parent(turn) == "session submit"
    assert parent(by_id[turn.parent_id]) == "POST /sessions/{id}/messages"
    for span in trace:
        if span.name.startswith(("chat ", "execute_tool ")):
            assert parent(span) == "turn"
    assert turn.attributes["turnstile.turn.status"] == "completed"
    assert turn.attributes["turnstile.session.id"] == "s"
    assert turn.attributes["turnstile.session.owner"] == "dev"
    chats = receiver.named("chat m")
    assert sorted(c.attributes["gen_ai.usage.input_tokens"] for c in chats) == [40, 60]
    assert {c.attributes["gen_ai.response.finish_reasons"] for c in chats} == {
        ("tool_calls",),
        ("stop",),
    }
    commits = [span for span in trace if "db.system.name" in span.attributes]
    assert {span.attributes["db.system.name"] for span in commits} == {"sqlite"}
    assert "close_input" in {span.name for span in commits}
    assert {span.resource["service.name"] for span in receiver.spans} == {"turnstile-e2e"}
    assert all("service.version" in span.resource for span in receiver.spans)
