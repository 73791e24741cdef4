"""The session feature's events encode to exactly the frames clients always received, and every
event type the node can emit has a Struct (the set ``docs/protocol.md`` documents)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import turnstile.actors.execution.events
import turnstile.actors.notifications.events
import turnstile.actors.scheduling.events
import turnstile.actors.watchers.events
import turnstile.actors.webhooks.events  # noqa: F401 (their events join event_types())
from tests.support.events import frame
from turnstile.actors.sessions.agents.base import TurnInput
from turnstile.actors.sessions.event_types import (
    HeartbeatDisabled,
    HeartbeatSuppressed,
    InjectedMessage,
    SessionSync,
    StreamDelta,
    StreamEnd,
    StreamStart,
    ThinkingDelta,
    TokenUsage,
    ToolCalled,
    ToolStarted,
    TurnQueued,
    event_types,
)
from turnstile.actors.sessions.turn import TurnContext

TAIL = ',"session_id":"s1","seq":1,"ts":"2025-01-01T00:00:00Z"}'

# Each frame below is what the session actor wrote before its events were Structs: the payload
# keys in the order the old dicts had them, then ``type`` and the frame's own fields.
CASES = [
    (
        TurnQueued(input_id=1, source="user", ahead=0),
        '{"input_id":1,"source":"user","ahead":0,"type":"turn_queued"',
    ),
    (
        StreamStart(input_id=1, source="user", content="hello"),
        '{"input_id":1,"source":"user","content":"hello","type":"stream_start"',
    ),
    (
        StreamStart(
            input_id=4,
            source="cron",
            content="[CRON] daily",
            job_id="j1",
            run_id=9,
            label="daily",
            kind="cron",
            prompt_ref={"name": "daily", "version": 2, "sha256": "ab", "template": "t@v1"},
        ),
        '{"input_id":4,"source":"cron","content":"[CRON] daily","job_id":"j1","run_id":9,'
        '"label":"daily","kind":"cron","prompt_ref":{"name":"daily","version":2,"sha256":"ab",'
        '"template":"t@v1"},"type":"stream_start"',
    ),
    (
        StreamStart(
            input_id=5,
            source="recall",
            content="[RECALL] recall_id=rc1 call_type=once",
            job_id="rc1",
            run_id=3,
            kind="recall",
            is_recall=True,
            instruction="check the build",
        ),
        '{"input_id":5,"source":"recall","content":"[RECALL] recall_id=rc1 call_type=once",'
        '"job_id":"rc1","run_id":3,"kind":"recall","is_recall":true,'
        '"instruction":"check the build","type":"stream_start"',
    ),
    (
        StreamStart(
            input_id=6, source="check", content="x", job_id="j2", run_id=1, reference="PR-7"
        ),
        '{"input_id":6,"source":"check","content":"x","job_id":"j2","run_id":1,'
        '"reference":"PR-7","type":"stream_start"',
    ),
    (
        StreamDelta(input_id=1, text="You "),
        '{"input_id":1,"text":"You ","type":"stream_delta"',
    ),
    (
        ThinkingDelta(input_id=1, text="hm"),
        '{"input_id":1,"text":"hm","type":"thinking_delta"',
    ),
    (
        ToolStarted(input_id=1, tool="echo", arguments={"text": "hi"}),
        '{"input_id":1,"tool":"echo","arguments":{"text":"hi"},"type":"tool_started"',
    ),
    (
        ToolStarted(input_id=1, tool="echo", call_id="c1", arguments={}),
        '{"input_id":1,"tool":"echo","call_id":"c1","arguments":{},"type":"tool_started"',
    ),
    (
        ToolCalled(input_id=1, tool="echo", arguments={"text": "hi"}, ok=True, result=None),
        '{"input_id":1,"tool":"echo","arguments":{"text":"hi"},"ok":true,"result":null,'
        '"type":"tool_call"',
    ),
    (
        ToolCalled(
            input_id=1,
            tool="shell.run",
            call_id="c2",
            arguments={},
            ok=False,
            error={"code": "blocked", "message": "no"},
        ),
        '{"input_id":1,"tool":"shell.run","call_id":"c2","arguments":{},"ok":false,'
        '"error":{"code":"blocked","message":"no"},"type":"tool_call"',
    ),
    (
        InjectedMessage.of("user", "also this", 3, {}),
        '{"source":"user","content":"also this","injected_into":3,"type":"user_message"',
    ),
    (
        InjectedMessage.of(
            "notification", "[WATCHER UPDATE]", 3, {"watcher_id": "w1", "watcher_ids": ["w1"]}
        ),
        '{"source":"notification","content":"[WATCHER UPDATE]","injected_into":3,'
        '"watcher_id":"w1","watcher_ids":["w1"],"type":"user_message"',
    ),
    (
        InjectedMessage.of("api", "hi", 3, {"own": 1, "keys": [2]}),
        '{"source":"api","content":"hi","injected_into":3,"own":1,"keys":[2],"type":"user_message"',
    ),
    (
        StreamEnd(input_id=1, status="completed", text="You said: hello"),
        '{"input_id":1,"status":"completed","text":"You said: hello","type":"stream_end"',
    ),
    (
        StreamEnd(
            input_id=2,
            status="failed",
            text="",
            error="the agent failed (RuntimeError)",
            usage=TokenUsage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
        ),
        '{"input_id":2,"status":"failed","text":"","error":"the agent failed (RuntimeError)",'
        '"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7},"type":"stream_end"',
    ),
    (
        SessionSync(busy=False, policy="enqueue", queued=0, input_id=4, status="completed"),
        '{"busy":false,"policy":"enqueue","queued":0,"input_id":4,"status":"completed",'
        '"type":"session_sync"',
    ),
    (
        HeartbeatSuppressed(input_id=8, chars=12),
        '{"input_id":8,"chars":12,"type":"heartbeat_suppressed"',
    ),
    (
        HeartbeatDisabled(job_id="hb1", error="failed"),
        '{"job_id":"hb1","error":"failed","type":"heartbeat_disabled"',
    ),
]


@pytest.mark.parametrize(("event", "expected"), CASES, ids=[type(e).__name__ for e, _ in CASES])
def test_a_session_event_encodes_to_the_frame_clients_always_got(event, expected):
    assert frame(event) == (expected + TAIL).encode()


def test_an_injected_message_keeps_a_payload_key_that_shadows_its_own():
    # ``{"source": …, **payload}`` let the payload win; so does ``extra``.
    event = InjectedMessage.of("user", "x", 1, {"source": "api"})
    assert event.stored() == (
        "user_message",
        {"source": "api", "content": "x", "injected_into": 1},
    )


def _documented_events() -> set[str]:
    """The event names in docs/protocol.md's table of stored session events."""
    text = (Path(__file__).parents[3] / "docs" / "protocol.md").read_text()
    table = text.split("### Server → client", 1)[1].split("Other server frames", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE))


def test_every_event_type_has_a_struct_and_every_struct_is_documented():
    documented = _documented_events()
    assert "stream_delta" in documented and len(documented) > 15  # the table was found
    assert set(event_types()) == documented


async def test_the_delta_fast_path_stores_what_the_structs_would():
    # ``TurnContext.emit`` builds a delta's payload directly (per token); it must be the
    # Structs' payload exactly.
    stored = []

    class Host:
        async def emit_stored(self, type_, payload, *, durable=True):
            stored.append((type_, payload))

    context = object.__new__(TurnContext)
    context._host, context._turn = Host(), None
    context.input = TurnInput(input_id=7, source="user", content="")
    await context.emit("stream_delta", "a")
    await context.emit("thinking_delta", "b")
    assert stored == [
        StreamDelta(input_id=7, text="a").stored(),
        ThinkingDelta(input_id=7, text="b").stored(),
    ]
