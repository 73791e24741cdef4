"""A tool call is a span ``execute_tool <name>`` when the node traces (issue 25): the model's id
for the call (``gen_ai.tool.call.id``, when it gave one), its policy,
the wait for a person's approval and what was decided, whether it succeeded (else its code as
``error.type``), the size of its result. On a mock clock: the person answers 90 s later."""

from __future__ import annotations

import msgspec
import pytest
import trio
from opentelemetry.trace import StatusCode

from tests.support.tracing import attrs, traced
from turnstile.tools.policy import Policy
from turnstile.tools.registry import ToolRegistry


class Text(msgspec.Struct, forbid_unknown_fields=True):
    text: str


@pytest.mark.guard(600)
async def test_a_tool_call_span_says_policy_approval_wait_outcome_and_size(autojump_clock):
    async def approver(call, name, arguments) -> bool:
        await trio.sleep(90)  # a person reads, then answers
        return arguments["text"] != "no"

    async def shout(call, params: Text) -> dict:
        return {"text": params.text.upper()}

    registry = ToolRegistry(approver=approver)
    registry.register("say.loud", Text, shout, "Shout.", policy=Policy.APPROVE)
    registry.register("say.soft", Text, shout, "Whisper.")
    with traced() as spans:
        assert (await registry.call("s", "ada", "say.loud", {"text": "hi"}, call_id="call_7")).ok
        assert not (await registry.call("s", "ada", "say.loud", {"text": "no"})).ok
        assert (await registry.call("s", "ada", "say__soft", {"text": "hi"})).ok
        assert not (await registry.call("s", "ada", "say.soft", {"text": 3})).ok
        assert not (await registry.call("s", "ada", "say.none", {})).ok  # no span: no tool
    approved, denied = spans.named("execute_tool say.loud")
    assert attrs(approved) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "say.loud",
        "gen_ai.tool.call.id": "call_7",
        "turnstile.tool.policy": "APPROVE",
        "turnstile.tool.approval_wait_seconds": 90.0,
        "turnstile.tool.approval": "approved",
        "turnstile.tool.ok": True,
        "turnstile.tool.result_bytes": len(b'{"text":"HI"}'),
    }
    assert approved.status.status_code is StatusCode.UNSET
    assert attrs(denied)["turnstile.tool.approval"] == "denied"
    assert attrs(denied)["error.type"] == "denied"
    assert denied.status.status_code is StatusCode.ERROR
    assert denied.status.description == "say.loud was not approved"
    soft, bad = spans.named("execute_tool say.soft")  # the model's name maps back
    assert attrs(soft)["turnstile.tool.policy"] == "AUTO"
    assert "turnstile.tool.approval_wait_seconds" not in attrs(soft)
    assert "gen_ai.tool.call.id" not in attrs(soft)  # called without one (not by a model)
    assert attrs(bad)["error.type"] == "bad_arguments"
    assert "turnstile.tool.policy" not in attrs(bad)  # refused before the policy applies
    assert len(spans.all) == 4
