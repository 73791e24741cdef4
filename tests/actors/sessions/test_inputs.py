"""Turn inputs, typed (``actors.sessions.inputs``).

Every payload here is made by its real writer — the scheduling tools through a scheduler fire,
the directory's submit, the notifier, a watcher, a background task, the session's own re-queue
of an injection and a heartbeat's retry — then read back from the inbox and decoded. Older
shapes are those same payloads without what later versions added (``run_id``, newer heartbeat
settings). A payload that does not decode closes its turn as ``failed``; the session goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from tests.support.agents import GatedAgent
from tests.support.mock_node import DAY, T0, Node, node, once
from tests.support.notifier import make_notifier
from tests.support.sessions import NoTools
from tests.support.watchers import watching
from turnstile.actors.execution.background import BackgroundActor
from turnstile.actors.execution.tools import register_execution_tools
from turnstile.actors.scheduling.checks import register_check_tools
from turnstile.actors.scheduling.cron import TRIGGER_TEMPLATE, register_cron_tool
from turnstile.actors.scheduling.heartbeat import HEARTBEAT_PROFILES, register_heartbeat_tools
from turnstile.actors.scheduling.inputs import (
    CronTrigger,
    HeartbeatRun,
    HeartbeatSettings,
    PromptRef,
    RecallFiring,
    ScheduledAction,
    ScheduledCheck,
    ScheduledJob,
)
from turnstile.actors.scheduling.recall import register_recall_tools
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.scheduling.tools import register_scheduling_tools
from turnstile.actors.scheduling.turns import register_scheduled_kinds
from turnstile.actors.sessions.actor import (
    UNREADABLE_INPUT,
    GetStatus,
    Inject,
    SetPolicy,
    Submit,
)
from turnstile.actors.sessions.agents.base import AgentError
from turnstile.actors.sessions.directory import SessionDirectory, create_derived_session
from turnstile.actors.sessions.history import load_history
from turnstile.actors.sessions.inputs import (
    Injection,
    InputPayloadError,
    OtherInput,
    UserMessage,
)
from turnstile.actors.sessions.kinds import PlainKind, session_kinds
from turnstile.actors.webhooks.inputs import WebhookEvent
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.store import InboxItem
from turnstile.tools.builtin import register_builtin_tools
from turnstile.tools.registry import ToolRegistry


def _node_kinds():
    """The input kinds a default node registers (sessions', scheduling's, webhooks')."""
    kinds = session_kinds()
    register_scheduled_kinds(
        kinds, None, tool_profiles=lambda: {}, notify=lambda: None, disable_job=None
    )
    kinds.register(PlainKind("webhook", WebhookEvent))
    return kinds


decode_input = _node_kinds().decode_item


class Scheduling:
    """A mock-clock node with every scheduling tool, called as session ``s`` of ``ada``."""

    def __init__(self, n: Node, tools: ToolRegistry) -> None:
        self.n, self.tools = n, tools

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.tools.call("s", "ada", tool, arguments)
        assert result.ok, result.error
        return result.data


@asynccontextmanager
async def scheduling(agent=None) -> AsyncIterator[Scheduling]:
    tools = ToolRegistry()
    async with node(tools=tools, profiles=HEARTBEAT_PROFILES, agent=agent) as n:
        register_builtin_tools(tools, n.clock)
        register_scheduling_tools(tools, n.scheduler, n.store, n.clock)
        register_cron_tool(tools, n.scheduler, n.store, n.clock)
        register_recall_tools(tools, n.scheduler, n.store, n.clock, n.publish)
        register_check_tools(tools, n.scheduler, n.store, n.clock)
        register_heartbeat_tools(
            tools,
            n.scheduler,
            n.store,
            n.clock,
            lambda parent, suffix: create_derived_session(n.store, 100, parent, suffix),
        )
        yield Scheduling(n, tools)


async def settled_inputs(n: Node, session_id: str = "s") -> list[InboxItem]:
    await trio.testing.wait_all_tasks_blocked()
    return await n.store.list_inputs(session_id)


CHECK_URL = "https://github.com/nitejar/nitejar/pull/3"
CRON_PROMPT = "Check the deploy dashboard and report anything red."


@dataclass
class Case:
    """A scheduling tool call, and what the first input it delivers decodes to."""

    tool: str
    arguments: dict[str, Any]
    type: type
    fields: dict[str, Any] = field(default_factory=dict)
    content_starts: str = ""


SCHEDULED = {
    "schedule_once notification": Case(
        "schedule_once",
        {"when": "in 5m", "prompt": "stand up", "label": "standup"},
        ScheduledJob,
        {
            "kind": "once",
            "label": "standup",
            "action_type": "notification",
            "output_channel": "llm_notification",
            "channel": "llm_notification",
            "scheduled_for": "2026-11-21T12:05:00+00:00",
            "was_injected": False,
        },
        "[SCHEDULED NOTIFICATION] job_id=",
    ),
    "schedule_once tool_call": Case(
        "schedule_once",
        {"when": "in 5m", "action_type": "tool_call", "tool_name": "clock.now"},
        ScheduledJob,
        {"action_type": "tool_call", "tool_name": "clock.now", "tool_params": {}},
        "[SCHEDULED TOOL CALL] job_id=",
    ),
    "schedule_cron": Case(
        "schedule_cron",
        {"cron": "every hour", "action_type": "llm_prompt", "prompt": "report"},
        CronTrigger,
        {"kind": "cron", "action_type": "llm_prompt", "prompt_ref": None, "content": "report"},
    ),
    "remember": Case(
        "remember",
        {"what": "water the plants", "when": "in 10m"},
        ScheduledJob,
        {"kind": "remember", "action_type": "notification", "label": "water the plants"},
        "[SCHEDULED NOTIFICATION] job_id=",
    ),
    "cron": Case(
        "cron",
        {"action": "add", "schedule": "every hour", "prompt": CRON_PROMPT, "name": "deploy"},
        CronTrigger,
        {
            "kind": "cron",
            "label": "deploy",
            "action_type": "llm_prompt",
            "cron_job_name": "deploy",
            "prompt_ref": PromptRef(
                name="deploy",
                version=1,
                sha256=hashlib.sha256(CRON_PROMPT.encode()).hexdigest(),
                template=TRIGGER_TEMPLATE,
            ),
        },
        "[CRON] job=",
    ),
    "schedule_recall": Case(
        "schedule_recall",
        {
            "call_type": "once",
            "when": "in 5m",
            "additional_context_message": "Read /tmp/build.log and report errors.",
            "internal_comment": "check the build",
        },
        RecallFiring,
        {
            "kind": "recall",
            "instruction": "Read /tmp/build.log and report errors.",
            "is_recall": True,
            "label": "check the build",
        },
        "[RECALL] recall_id=rc_",
    ),
    "schedule_check": Case(
        "schedule_check",
        {"delay_minutes": 5, "instructions": "Check CI on PR #3.", "reference": CHECK_URL},
        ScheduledCheck,
        {
            "kind": "check",
            "type": "scheduled_check",
            "instructions": "Check CI on PR #3.",
            "reference": CHECK_URL,
            "requested_at": "2026-11-21T12:00:00Z",
        },
        "[SCHEDULED CHECK] id=",
    ),
    "set_heartbeat": Case(
        "set_heartbeat",
        {"enabled": True, "interval_minutes": 15, "checklist": "CI green?", "session": "main"},
        HeartbeatRun,
        {
            "kind": "heartbeat",
            "action_type": "heartbeat",
            "retry": False,
            "heartbeat": HeartbeatSettings(
                checklist="CI green?",
                model_override=None,
                tool_profile="heartbeat",
                max_tokens=4096,
                suppress_threshold=300,
                on_error="skip",
                dedicated=False,
                alert_channel="llm_notification",
                heartbeat_of="s",
            ),
        },
        "[HEARTBEAT] job_id=",
    ),
}


def older(item: InboxItem, *keys: str) -> InboxItem:
    """``item`` as an older version stored it: without ``keys``."""
    payload = {k: v for k, v in item.payload.items() if k not in keys}
    return msgspec.structs.replace(item, payload=payload)


@pytest.mark.guard(DAY)
@pytest.mark.parametrize("case", SCHEDULED.values(), ids=SCHEDULED.keys())
async def test_every_scheduling_writer_decodes_by_its_source(case: Case, autojump_clock):
    async with scheduling() as s:
        await s.call(case.tool, **case.arguments)
        await trio.sleep(2 * 3600)
        item = (await settled_inputs(s.n))[0]
        stored = json.dumps(item.payload)
        got = decode_input(item)
        assert type(got) is case.type
        assert {name: getattr(got, name) for name in case.fields} == case.fields
        assert got.content == item.payload["content"]
        assert got.content.startswith(case.content_starts)
        # The typed fields agree with the run record the fire wrote.
        run = await JobStore(s.n.store).get_run(got.run_id)
        assert (run.job_id, run.input_id) == (got.job_id, item.id)
        assert json.dumps(item.payload) == stored  # decoding left the stored payload alone
        # Inputs fired before the store put ``run_id`` in the payload still read.
        old = decode_input(older(item, "run_id"))
        assert old == msgspec.structs.replace(got, run_id=None)


@pytest.mark.guard(DAY)
async def test_a_heartbeat_stored_before_its_newer_settings_still_reads(autojump_clock):
    async with scheduling() as s:
        await s.call("set_heartbeat", enabled=True, interval_minutes=15, session="main")
        await trio.sleep(16 * 60)
        (item,) = await settled_inputs(s.n)
    # Before ``alert_channel`` and ``heartbeat_of`` were settings, and before ``run_id``.
    payload = {k: v for k, v in item.payload.items() if k != "run_id"}
    payload["heartbeat"] = {
        k: v for k, v in payload["heartbeat"].items() if k not in ("alert_channel", "heartbeat_of")
    }
    got = decode_input(msgspec.structs.replace(item, payload=payload))
    assert isinstance(got, HeartbeatRun)
    assert (got.heartbeat.alert_channel, got.heartbeat.heartbeat_of) == ("llm_notification", None)


class FailingAgent(GatedAgent):
    async def run_turn(self, turn):
        raise AgentError("model down")


@pytest.mark.guard(DAY)
async def test_a_heartbeat_retry_decodes_with_retry_set(autojump_clock):
    async with scheduling(agent=FailingAgent()) as s:
        await s.call(
            "set_heartbeat",
            enabled=True,
            interval_minutes=15,
            session="main",
            on_error="retry_once",
        )
        await trio.sleep(16 * 60)
        first, retry = await settled_inputs(s.n)
    assert (retry.source, retry.payload["retry"]) == ("heartbeat", True)
    got = decode_input(retry)
    assert isinstance(got, HeartbeatRun) and got.retry is True
    assert got.heartbeat == decode_input(first).heartbeat
    assert (got.job_id, got.run_id, got.content) == (
        first.payload["job_id"],
        first.payload["run_id"],
        first.payload["content"],
    )


async def test_a_user_message_from_the_directory_decodes_as_one():
    async with node(start_scheduler=False) as n:
        await n.store.create_session("ada/main", "ada")
        directory = SessionDirectory(
            n.store, n.registry, NoTools(), max_sessions_per_user=10, metrics=Metrics()
        )
        await directory.submit("ada", "main", "hello")
        (item,) = await settled_inputs(n, "ada/main")
    assert item.source == "user"
    assert decode_input(item) == UserMessage(content="hello")


@pytest.mark.guard(DAY)
async def test_a_notification_from_the_notifier_decodes_as_an_injection(autojump_clock):
    async with node(start_scheduler=False) as n:
        notifier = make_notifier(n)
        sent = await notifier.notify("s", "ada", "llm_notification", "build is green")
        (item,) = await settled_inputs(n)
    got = decode_input(item)
    assert type(got) is Injection
    assert got.notification_id == sent["notification_id"]
    assert got.content == item.payload["content"] and "build is green" in got.content


@pytest.mark.guard(DAY)
async def test_a_watcher_escalation_decodes_as_an_injection(autojump_clock):
    async with watching() as w:
        wid = await w.start(interval=10, label="API health")
        await trio.sleep(5)
        item = (await settled_inputs(w.n))[0]
    got = decode_input(item)
    assert type(got) is Injection
    assert (got.watcher_id, got.watcher_ids) == (wid, [wid])
    assert got.content.startswith("[WATCHER UPDATE] watcher_id=")


class Nap(msgspec.Struct, forbid_unknown_fields=True):
    seconds: float


@pytest.mark.guard(DAY)
async def test_a_background_result_decodes_as_an_injection(autojump_clock):
    tools = ToolRegistry()

    async def nap(call, params: Nap):
        await trio.sleep(params.seconds)
        return {"slept": params.seconds}

    tools.register("slow.nap", Nap, nap, "Sleep.")
    async with node(tools=tools, start_scheduler=False) as n:
        background = await n.sup.spawn(
            lambda: BackgroundActor(tools.call, n.publish, n.clock), name="background"
        )
        register_execution_tools(tools, background)
        started = await tools.call(
            "s", "ada", "background_run", {"name": "slow.nap", "params": {"seconds": 3}}
        )
        await trio.sleep(60)
        (item,) = await settled_inputs(n)
    got = decode_input(item)
    assert type(got) is Injection
    assert got.background_tasks == [started.data["task_id"]]
    assert got.content.startswith("[BACKGROUND TASK COMPLETED]")


class IgnoresInjections(GatedAgent):
    """Never takes an injected input, so each is queued again when the turn ends."""

    async def run_turn(self, turn):
        if turn.input.content.startswith("wait:"):
            await self.gate(turn.input.content).wait()
        return f"reply:{turn.input.content}"


async def test_injections_the_agent_never_took_are_queued_again_and_decode_as_such():
    async with node(agent=IgnoresInjections(), start_scheduler=False) as n:
        ref = n.registry.ref("session:s")
        await ref.ask(Submit(content="wait:t"))
        await n.seen.until(b'"stream_start"')
        await ref.ask(SetPolicy(policy="inject"))
        assert (await ref.ask(Submit(content="also this"))).injected is True
        assert (await ref.ask(Inject(content="late news"))).injected is True
        n.agent.gate("wait:t").set()
        await n.seen.until(b'"stream_end"', 3)
        _, user, notice = await settled_inputs(n)
    assert (user.source, decode_input(user)) == (
        "user",
        UserMessage(content="also this", was_injected=True),
    )
    assert (notice.source, decode_input(notice)) == (
        "notification",
        Injection(content="late news", was_injected=True),
    )


def item_of(source: str, payload: dict[str, Any], input_id: int = 7) -> InboxItem:
    return InboxItem(
        id=input_id,
        session_id="s",
        source=source,
        payload=payload,
        state="queued",
        created_at=T0,
        updated_at=T0,
    )


@pytest.mark.parametrize(
    ("source", "payload", "expected"),
    [
        (
            "webhook",
            {"content": "push to main", "ref": "main"},
            WebhookEvent(content="push to main"),
        ),
        (
            "once",  # an AddJob whose deliver names no source: the job's kind is the source
            {"content": "do it", "job_id": "j1", "run_id": 3, "kind": "once"},
            ScheduledJob(content="do it", job_id="j1", run_id=3, kind="once"),
        ),
        (
            "custom",  # a source no feature registered: plain text, its keys not read
            {"content": "hi", "job_id": "j1", "run_id": 3},
            OtherInput(content="hi"),
        ),
        ("user", {}, UserMessage()),  # every field has a default
    ],
)
def test_sources_without_a_writer_here_and_the_fallback(source, payload, expected):
    got = decode_input(item_of(source, payload))
    assert (type(got), got) == (type(expected), expected)
    assert isinstance(got, ScheduledAction) == (source == "once")


@pytest.mark.parametrize(
    ("source", "payload", "why"),
    [
        (
            "recall",
            {"content": "x", "instruction": 42},
            "Expected `str`, got `int` - at `$.instruction`",
        ),
        (
            "cron",
            {"content": "x", "run_id": "3"},
            "Expected `int | null`, got `str` - at `$.run_id`",
        ),
        (
            "cron",
            {"content": "x", "run_id": 2**63},
            "Expected `int` <= 9223372036854775807 - at `$.run_id`",
        ),
        (
            "cron",
            {"prompt_ref": {"name": "d"}},
            "Object missing required field `version` - at `$.prompt_ref`",
        ),
        (
            "heartbeat",
            {"heartbeat": {"on_error": "explode"}},
            "Invalid enum value 'explode' - at `$.heartbeat.on_error`",
        ),
        ("user", {"content": None}, "Expected `str`, got `null` - at `$.content`"),
        ("notification", {"watcher_ids": "w1"}, "Expected `array`, got `str` - at `$.watcher_ids`"),
    ],
)
def test_a_payload_that_does_not_decode_raises_naming_the_input(source, payload, why):
    with pytest.raises(InputPayloadError) as caught:
        decode_input(item_of(source, payload, input_id=12))
    assert str(caught.value) == f"input 12 ({source!r}) has an unreadable payload: {why}"
    assert isinstance(caught.value, InvalidArgument)
    assert (caught.value.input_id, caught.value.source, caught.value.field) == (
        12,
        source,
        "payload",
    )


async def test_a_submit_with_an_unreadable_payload_is_refused_before_it_is_stored():
    async with node(start_scheduler=False) as n:
        ref = n.registry.ref("session:s")
        with pytest.raises(InputPayloadError) as caught:
            await ref.ask(Submit(content="hi", payload={"was_injected": "yes"}))
        assert str(caught.value) == (
            "a submitted input ('user') has an unreadable payload: "
            "Expected `bool`, got `str` - at `$.was_injected`"
        )
        assert await n.store.list_inputs("s") == []


@pytest.mark.guard(DAY)
async def test_an_unreadable_payload_fails_its_turn_visibly_and_the_next_input_runs(
    autojump_clock,
):
    async with node() as n:
        job = await n.add(
            kind="once",
            schedule=once(T0.replace(minute=1)),
            deliver={"source": "recall", "prompt": "go", "instruction": 42},
        )
        await n.seen.until(b'"stream_end"')  # the job's turn, at 12:01
        await n.registry.ref("session:s").ask(Submit(content="after"))
        await n.seen.until(b'"stream_end"', 2)
        bad, good = await settled_inputs(n)
        ends = n.ends()
        assert [(e["input_id"], e["status"], e.get("error"), e["text"]) for e in ends] == [
            (bad.id, "failed", UNREADABLE_INPUT, ""),
            (good.id, "completed", None, "reply:after"),
        ]
        why = (
            f"input {bad.id} ('recall') has an unreadable payload: "
            "Expected `str`, got `int` - at `$.instruction`"
        )
        assert (bad.state, bad.detail) == ("failed", {"status": "failed", "payload_error": why})
        (run,) = await JobStore(n.store).list_runs(job.id)
        assert run.state == "turn_failed"
        assert (run.detail["error"], run.detail["payload_error"]) == (UNREADABLE_INPUT, why)
        (start, _) = n.starts()
        assert (start["input_id"], start["job_id"], start["content"]) == (bad.id, job.id, "go")
        history = await load_history(n.store, "s", 100)
        assert [(h.role, h.content, h.status) for h in history] == [
            ("user", "go", None),
            ("assistant", UNREADABLE_INPUT, "failed"),
            ("user", "after", None),
            ("assistant", "reply:after", "completed"),
        ]
        assert (await n.registry.ref("session:s").ask(GetStatus())).busy is False
