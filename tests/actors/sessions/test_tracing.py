"""OpenTelemetry traces of a turn (issue 25): from the caller's ``traceparent`` (the HTTP header,
the WebSocket ``send`` frame's field) through the durable inbox into the turn, its model calls
and tool calls, to the commit of its ``stream_end``: one connected trace, on one node and
across two (PostgreSQL, the message sent through the node that does not hold the session). The
caller's ``tracestate`` goes the same way, checked: every span of the turn carries it, and a
malformed one is dropped while the ``traceparent`` still counts.

Spans are kept by the SDK's ``InMemorySpanExporter`` (``tests/support/tracing.py``). The model
is the strict OpenAI stand-in, answering in-process: one model call asks for two tools (``echo``
and ``clock.now``), the next answers.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import httpx
import pytest
import trio
from opentelemetry.trace import SpanKind, StatusCode
from trio_websocket import open_websocket_url

from tests.support.fake_openai import OpenAIStandIn, Stream, text_stream, tool_stream, usage_chunk
from tests.support.sessions import Recorder
from tests.support.tracing import (
    CALLER_SPAN,
    CALLER_TRACE,
    CALLER_TRACEPARENT,
    CALLER_TRACESTATE,
    ancestors,
    attrs,
    children,
    connected,
    traced,
    tree,
)
from turnstile.actors.config import Config, NodeConfig
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents.openai import OpenAIAgent
from turnstile.actors.sessions.agents.scripted import ScriptedAgent
from turnstile.client import StreamEnd, open_client
from turnstile.runtime import tracing

ADA = "tracing-ada-token-0123456789"
TOKENS = {ADA: "ada"}
#: a hang guard on the real clock (a node, its store's threads), not a promise
WAIT = 60


def script(standin: OpenAIStandIn) -> None:
    """One model call that asks for two tools, then one that answers."""
    asks = tool_stream(("call_1", "echo", {"text": "hi"}), ("call_2", "clock__now", {}))
    standin.script(
        Stream([*asks.chunks, usage_chunk(40, 12)]),
        text_stream("It is ", "now.", usage=(60, 4)),
    )


def model_agent(standin: OpenAIStandIn) -> OpenAIAgent:
    return OpenAIAgent(
        base_url="http://model.test/v1", model="m", transport=standin.transport(), max_retries=0
    )


def http_client(node) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=node.app),
        base_url="http://node",
        headers={"Authorization": f"Bearer {ADA}"},
    )


def check_turn_trace(spans, *, node_id: str | None = None, remote: bool = False) -> None:
    """The caller's trace holds the whole path, connected: the request, the submit, its commit,
    the turn, both model calls, both tool calls and the closure's commit; every span carries
    the caller's ``tracestate`` (through the inbox, on whichever node)."""
    trace = spans.of_trace(CALLER_TRACE)
    connected(trace, root_parent=int(CALLER_SPAN, 16))
    assert {s.context.trace_state.to_header() for s in trace} == {CALLER_TRACESTATE}
    by_name = {}
    for span in trace:
        by_name.setdefault(span.name, []).append(span)

    (request,) = by_name["POST /sessions/{id}/messages"]
    assert request.kind is SpanKind.SERVER
    assert request.parent.span_id == int(CALLER_SPAN, 16) and request.parent.is_remote
    assert attrs(request)["http.response.status_code"] == 202
    assert attrs(request)["http.route"] == "/sessions/{id}/messages"

    (submit,) = by_name["session submit"]
    assert submit.parent.span_id == request.context.span_id
    assert attrs(submit)["turnstile.session.id"] == "s"
    assert attrs(submit)["turnstile.session.owner"] == "ada"
    assert attrs(submit)["turnstile.input.source"] == "user"
    assert attrs(submit).get("turnstile.session.remote", False) is remote
    stored = [c.name for c in children(trace, submit) if "db.system.name" in attrs(c)]
    # the row with its turn_queued in one commit (here), or the row and its announcement to
    # the holder (another node)
    expected = ["enqueue_input", "notify"] if remote else ["enqueue_announced"]
    assert stored == expected, tree(trace)

    (turn,) = by_name["turn"]
    assert turn.parent.span_id == submit.context.span_id  # through the inbox's row
    turn_attrs = attrs(turn)
    assert turn_attrs["turnstile.input.id"] == attrs(submit)["turnstile.input.id"]
    assert turn_attrs["turnstile.session.id"] == "s"
    assert turn_attrs["turnstile.input.source"] == "user"
    assert turn_attrs["turnstile.turn.status"] == "completed"
    assert turn_attrs["gen_ai.operation.name"] == "invoke_agent"
    assert turn_attrs["gen_ai.usage.input_tokens"] == 100
    assert turn_attrs["gen_ai.usage.output_tokens"] == 16
    if node_id is not None:
        assert turn_attrs["turnstile.node.id"] == node_id

    chats = sorted(by_name["chat m"], key=lambda s: s.start_time)
    assert [c.parent.span_id for c in chats] == [turn.context.span_id] * 2
    first, second = (attrs(c) for c in chats)
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "m"
    assert first["gen_ai.response.model"] == "standin"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (40, 12)
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert second["gen_ai.response.finish_reasons"] == ("stop",)
    assert first["server.address"] == "model.test"
    assert all(c.kind is SpanKind.CLIENT for c in chats)

    (echo,) = by_name["execute_tool echo"]
    (clock,) = by_name["execute_tool clock.now"]
    for tool, name, call_id in ((echo, "echo", "call_1"), (clock, "clock.now", "call_2")):
        assert tool.parent.span_id == turn.context.span_id
        assert attrs(tool)["gen_ai.operation.name"] == "execute_tool"
        assert attrs(tool)["gen_ai.tool.name"] == name
        assert attrs(tool)["gen_ai.tool.call.id"] == call_id  # the model's id for the call
        assert attrs(tool)["turnstile.tool.policy"] == "AUTO"
        assert attrs(tool)["turnstile.tool.ok"] is True
        assert attrs(tool)["turnstile.tool.result_bytes"] > 0
    assert attrs(echo)["turnstile.tool.result_bytes"] == len(b'{"text":"hi"}')
    # the tools ran between the model calls
    assert chats[0].end_time <= echo.start_time <= clock.start_time <= chats[1].start_time

    # the turn's commits are in it: its events, and last its closure (the stream_end)
    commits = sorted(
        (s for s in trace if "turn" in ancestors(trace, s) and "db.system.name" in attrs(s)),
        key=lambda s: s.end_time,
    )
    assert commits[-1].name == "close_input", tree(trace)
    assert commits[-1].parent.span_id == turn.context.span_id
    assert commits[0].name == "claim_next_input", tree(trace)  # where the turn begins
    assert commits[0].start_time == turn.start_time
    assert {s.name for s in commits[1:-1]} <= {"append_events"}, tree(trace)
    assert attrs(commits[-1])["db.operation.name"] == "close_input"
    assert all(s.status.status_code is not StatusCode.ERROR for s in trace), tree(trace)


async def test_a_turn_is_one_trace_from_the_http_request_to_the_stream_end(tmp_path):
    standin = OpenAIStandIn()
    script(standin)
    with traced() as spans:
        config = Config(store=f"sqlite:///{tmp_path}/node.db")
        agent = model_agent(standin)
        async with open_node(config, tokens=TOKENS, agent=agent, serve=False) as node:
            await node.directory.create_session("ada", session_id="s")
            watcher = Recorder()
            await node.directory.attach("ada", "s", watcher)
            async with http_client(node) as http:
                sent = await http.post(
                    "/sessions/s/messages",
                    json={"content": "what time is it?"},
                    headers={"traceparent": CALLER_TRACEPARENT, "tracestate": CALLER_TRACESTATE},
                )
            assert sent.status_code == 202, sent.text
            with trio.fail_after(WAIT):
                await watcher.until(b'"stream_end"')
            # the inbox row carries the trace, and the agent is not shown it
            (item,) = await node.store.list_inputs("ada/s")
            assert item.payload[tracing.TRACE_KEY].startswith(f"00-{CALLER_TRACE}-")
            assert item.payload[tracing.STATE_KEY] == CALLER_TRACESTATE
            assert len(standin.requests) == 2
        check_turn_trace(spans, node_id="local")
    # nothing else the node did joined the caller's trace, and nothing is left open
    assert all(span.end_time is not None for span in spans.all)


async def test_the_send_frame_carries_the_trace_into_the_turn(tmp_path):
    """The frame's ``traceparent`` and ``tracestate``; a second message with a malformed
    ``tracestate`` is stored all the same, its turn in the caller's trace without one."""
    with traced() as spans:
        config = Config(store=f"sqlite:///{tmp_path}/node.db", port=0)
        async with open_node(config, tokens=TOKENS, agent=ScriptedAgent()) as node:
            await node.directory.create_session("ada", session_id="s")
            url = node.url.replace("http://", "ws://") + f"/ws?token={ADA}"
            async with open_websocket_url(url) as ws:
                await ws.send_message(json.dumps({"type": "attach", "session_id": "s"}))
                for content, state in (("hello", CALLER_TRACESTATE), ("again", "Bad,=")):
                    send = {
                        "type": "send",
                        "session_id": "s",
                        "content": content,
                        "traceparent": CALLER_TRACEPARENT,
                        "tracestate": state,
                    }
                    await ws.send_message(json.dumps(send))
                    with trio.fail_after(WAIT):
                        while json.loads(await ws.get_message())["type"] != "stream_end":
                            pass
            first, second = await node.store.list_inputs("ada/s")
            assert first.payload[tracing.STATE_KEY] == CALLER_TRACESTATE
            assert tracing.STATE_KEY not in second.payload  # dropped, not refused
    trace = spans.of_trace(CALLER_TRACE)
    sends = [s for s in trace if s.name == "ws send"]  # the roots, one per message
    assert [s.kind for s in sends] == [SpanKind.SERVER] * 2
    assert [s.parent.span_id for s in sends] == [int(CALLER_SPAN, 16)] * 2
    turns = sorted((s for s in trace if s.name == "turn"), key=lambda s: s.start_time)
    assert [attrs(t)["turnstile.input.id"] for t in turns] == [first.id, second.id]
    for turn in turns:
        assert ancestors(trace, turn) == ["session submit", "ws send"]
        assert attrs(turn)["turnstile.turn.status"] == "completed"
    states = [t.context.trace_state.to_header() for t in turns]
    assert states == [CALLER_TRACESTATE, ""]


async def test_without_a_traceparent_a_turn_starts_a_trace_of_its_own(tmp_path):
    with traced() as spans:
        config = Config(store=f"sqlite:///{tmp_path}/node.db")
        async with open_node(config, tokens=TOKENS, agent=ScriptedAgent(), serve=False) as node:
            await node.directory.create_session("ada", session_id="s")
            watcher = Recorder()
            await node.directory.attach("ada", "s", watcher)
            async with http_client(node) as http:
                first = await http.post(
                    "/sessions/s/messages", json={"content": "one"}, headers={"traceparent": "junk"}
                )
                second = await http.post("/sessions/s/messages", json={"content": "two"})
            assert first.status_code == second.status_code == 202
            with trio.fail_after(WAIT):
                await watcher.until(b'"stream_end"', 2)
    turns = spans.named("turn")
    assert len(turns) == 2
    requests = spans.named("POST /sessions/{id}/messages")
    assert [r.parent for r in requests] == [None, None]  # a malformed one is ignored
    for turn in turns:
        trace = spans.of_trace(turn.context.trace_id)
        connected(trace, root_parent=None)
        assert ancestors(trace, turn) == ["session submit", "POST /sessions/{id}/messages"]
    assert turns[0].context.trace_id != turns[1].context.trace_id


async def test_a_resend_under_another_span_is_the_same_message(tmp_path):
    """The trace context is not part of a message: a client's retry, made under a new span,
    is answered as the first (replayed), not refused as another message under the key."""
    with traced():
        config = Config(store=f"sqlite:///{tmp_path}/node.db")
        async with open_node(config, tokens=TOKENS, agent=ScriptedAgent(), serve=False) as node:
            await node.directory.create_session("ada", session_id="s")
            async with http_client(node) as http:
                answers = []
                for span_id in ("00f067aa0ba902b7", "00f067aa0ba902b8"):
                    answers.append(
                        await http.post(
                            "/sessions/s/messages",
                            json={"content": "once", "client_msg_id": "m1"},
                            headers={"traceparent": f"00-{CALLER_TRACE}-{span_id}-01"},
                        )
                    )
            assert [a.status_code for a in answers] == [202, 202]
            assert answers[1].headers["idempotent-replayed"] == "true"
            assert answers[0].json()["input_id"] == answers[1].json()["input_id"]


async def test_off_by_default_nothing_is_carried(tmp_path):
    assert not tracing.active()
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    async with open_node(config, tokens=TOKENS, agent=ScriptedAgent(), serve=False) as node:
        await node.directory.create_session("ada", session_id="s")
        watcher = Recorder()
        await node.directory.attach("ada", "s", watcher)
        async with http_client(node) as http:
            sent = await http.post(
                "/sessions/s/messages",
                json={"content": "hi"},
                headers={"traceparent": CALLER_TRACEPARENT},
            )
        assert sent.status_code == 202
        with trio.fail_after(WAIT):
            await watcher.until(b'"stream_end"')
        (item,) = await node.store.list_inputs("ada/s")
        assert item.payload == {"content": "hi"}


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_across_two_nodes_the_turn_continues_the_senders_trace(store_url):
    """The message goes through node ``b``; node ``a`` holds the session and runs the turn,
    under the trace ``b`` stored with the input."""
    standin = OpenAIStandIn()
    script(standin)

    def node_config(node_id: str) -> Config:
        node = NodeConfig(id=node_id, lease_seconds=600, placement="leases")
        return Config(store=store_url, node=node)

    with traced() as spans:
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(
                open_node(node_config("a"), tokens=TOKENS, agent=model_agent(standin), serve=False)
            )
            b = await stack.enter_async_context(
                open_node(node_config("b"), tokens=TOKENS, agent=model_agent(standin), serve=False)
            )
            await a.directory.create_session("ada", session_id="s")
            on_a = Recorder()
            await a.directory.attach("ada", "s", on_a)  # a holds s
            async with http_client(b) as http:
                sent = await http.post(
                    "/sessions/s/messages",
                    json={"content": "what time is it?"},
                    headers={"traceparent": CALLER_TRACEPARENT, "tracestate": CALLER_TRACESTATE},
                )
            assert sent.status_code == 202, sent.text
            with trio.fail_after(WAIT):
                await on_a.until(b'"stream_end"')
        check_turn_trace(spans, node_id="a", remote=True)


async def test_the_client_sends_a_traceparent_over_the_websocket_and_http(tmp_path):
    """``turnstile.client``: ``stream.send(..., traceparent=, tracestate=)`` and
    ``post_message(..., traceparent=, tracestate=)``; each turn continues its caller's span
    and every span of the trace carries the caller's ``tracestate``."""
    over_ws = f"00-{CALLER_TRACE}-00000000000000a1-01"
    over_http = f"00-{CALLER_TRACE}-00000000000000b2-01"
    with traced() as spans:
        config = Config(store=f"sqlite:///{tmp_path}/node.db", port=0)
        async with open_node(config, tokens=TOKENS, agent=ScriptedAgent()) as node:
            async with open_client(node.url, ADA) as client:
                await client.create_session("s")
                async with client.attach("s") as stream:
                    await stream.send("one", traceparent=over_ws, tracestate=CALLER_TRACESTATE)
                    await client.post_message(
                        "s", "two", traceparent=over_http, tracestate=CALLER_TRACESTATE
                    )
                    ended = 0
                    with trio.fail_after(WAIT):
                        async for event in stream:
                            if isinstance(event.data, StreamEnd):
                                ended += 1
                                if ended == 2:
                                    break
    trace = spans.of_trace(CALLER_TRACE)
    turns = [s for s in trace if s.name == "turn"]
    assert len(turns) == 2
    roots = {ancestors(trace, turn)[-1]: trace_root(trace, turn) for turn in turns}
    assert roots == {"ws send": 0xA1, "POST /sessions/{id}/messages": 0xB2}
    assert {span.context.trace_state.to_header() for span in trace} == {CALLER_TRACESTATE}


def trace_root(trace, span) -> int:
    """The span id of the (remote) parent of ``span``'s root in ``trace``."""
    by_id = {s.context.span_id: s for s in trace}
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
    return span.parent.span_id
