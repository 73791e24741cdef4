"""OpenAIAgent against a strict OpenAI stand-in server on loopback (or in-process, on a
MockClock, where a test waits out retries)."""

from __future__ import annotations

import json
import socket

import msgspec
import pytest
import trio

from tests.support.agents import FakeTurn
from tests.support.fake_openai import (
    Reply,
    Stall,
    Stream,
    chunk,
    finish,
    text_stream,
    tool_piece,
    tool_stream,
)
from turnstile.actors.sessions.agents.base import (
    AgentError,
    HistoryEntry,
    ToolSpec,
    TurnContext,
    TurnInput,
    Usage,
)
from turnstile.actors.sessions.agents.context import estimate_tokens, message_tokens
from turnstile.actors.sessions.agents.openai import OpenAIAgent

CLOCK = ToolSpec(
    name="clock",
    description="What time is it?",
    parameters={"type": "object", "properties": {"zone": {"type": "string"}}},
)


@pytest.fixture
async def agent(standin):
    # Retries have tests of their own (test_openai_streaming.py); here one answer is one outcome.
    agent = OpenAIAgent(base_url=standin.base_url, model="test-model", max_retries=0)
    yield agent
    await agent.aclose()


def test_fake_turn_is_a_turn_context():
    assert isinstance(FakeTurn(), TurnContext)


async def test_streams_text_deltas_in_order_and_returns_the_full_text(standin, agent):
    standin.script(text_stream("Hel", "lo", ", ", "world.", split=True))  # events cut in two
    turn = FakeTurn("hi")
    assert await agent.run_turn(turn) == "Hello, world."
    assert turn.events == [("stream_delta", p) for p in ("Hel", "lo", ", ", "world.")]
    (seen,) = standin.requests
    assert seen.body["stream"] is True
    assert seen.body["model"] == "test-model"
    assert seen.body["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in seen.body


async def test_thinking_deltas_in_both_spellings(standin, agent):
    standin.script(
        Stream(
            [
                chunk(reasoning_content="Let me "),
                chunk(reasoning="think."),
                chunk(content="Done."),
                finish(),
            ]
        )
    )
    turn = FakeTurn()
    assert await agent.run_turn(turn) == "Done."
    assert turn.events == [
        ("thinking_delta", "Let me "),
        ("thinking_delta", "think."),
        ("stream_delta", "Done."),
    ]


async def test_tool_call_round_trip(standin, agent):
    standin.script(
        Stream(
            [
                chunk(content="Checking. "),
                chunk(tool_calls=[tool_piece(0, id="call_a", name="clock", arguments="")]),
                chunk(tool_calls=[tool_piece(0, arguments='{"zo')]),
                chunk(tool_calls=[tool_piece(0, arguments='ne": "UTC"}')]),
                chunk(tool_calls=[tool_piece(1, id="call_b", name="broken", arguments="{}")]),
                finish("tool_calls"),
            ]
        ),
        text_stream("It is ", "noon."),
    )
    turn = FakeTurn("what time is it?", tools=[CLOCK])
    assert await agent.run_turn(turn) == "It is noon."
    assert turn.calls == [("clock", {"zone": "UTC"}, "call_a"), ("broken", {}, "call_b")]
    assert turn.deltas() == ["Checking. ", "It is ", "noon."]

    first, second = standin.requests
    assert first.body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "clock",
                "description": "What time is it?",
                "parameters": CLOCK.parameters,
            },
        }
    ]
    assert second.body["messages"][:1] == first.body["messages"]
    assistant, clock_result, broken_result = second.body["messages"][1:]
    assert assistant == {
        "role": "assistant",
        "content": "Checking. ",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "clock", "arguments": '{"zone": "UTC"}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "broken", "arguments": "{}"}},
        ],
    }
    assert clock_result == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": json.dumps({"time": "12:00", "args": {"zone": "UTC"}}),
    }
    assert broken_result["tool_call_id"] == "call_b"
    assert json.loads(broken_result["content"]) == {
        "error": {"code": "boom", "message": "it broke"}
    }


async def test_history_sources_and_injections_become_messages(standin, agent):
    history = [
        HistoryEntry(role="user", content="remind me at 9", source="user"),
        HistoryEntry(role="tool", content='{"ok": true}', tool="remind", arguments={"at": "9"}),
        HistoryEntry(role="tool", content="[]", tool="list", arguments={}, call_id="call_h"),
        HistoryEntry(role="assistant", content="Done.", status="completed"),
        HistoryEntry(role="user", content="[WATCHER UPDATE] up", source="notification"),
        HistoryEntry(role="user", content="nightly report", source="cron"),
    ]
    standin.script(
        Stream(
            [
                chunk(tool_calls=[tool_piece(0, id="call_1", name="clock", arguments="{}")]),
                finish("tool_calls"),
            ]
        ),
        text_stream("ok"),
    )
    turn = FakeTurn(
        "it is 9",
        source="recall",
        history=history,
        injections=[HistoryEntry(role="user", content="early", source="user")],
        inject_on_call=[HistoryEntry(role="user", content="job done", source="notification")],
    )
    agent.system_prompt = "Be brief."
    assert await agent.run_turn(turn) == "ok"

    first, second = (seen.body["messages"] for seen in standin.requests)
    generated_id = first[2]["tool_calls"][0]["id"]
    assert generated_id.startswith("call_")
    assert first == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "remind me at 9"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": generated_id,
                    "type": "function",
                    "function": {"name": "remind", "arguments": '{"at": "9"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": generated_id, "content": '{"ok": true}'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_h",
                    "type": "function",
                    "function": {"name": "list", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_h", "content": "[]"},
        {"role": "assistant", "content": "Done."},
        {"role": "system", "content": "[WATCHER UPDATE] up"},
        {"role": "user", "content": "[cron] nightly report"},
        {"role": "user", "content": "[recall] it is 9"},
        {"role": "user", "content": "early"},
    ]
    assert second[: len(first)] == first
    # what the runtime tells the session reaches the model as a system message (reference)
    assert second[len(first) :][-1] == {"role": "system", "content": "job done"}
    assert [m["role"] for m in second[len(first) :]] == ["assistant", "tool", "system"]


async def test_a_turn_a_notification_starts_sends_it_as_a_system_message(standin, agent):
    """A background result, a watcher's escalation or a job's delivery that reaches an idle
    session starts a turn of its own: the model gets it as a system message, not as the user's
    words (it was ``{"role": "user", "content": "[notification] …"}``)."""
    standin.script(text_stream("Your download is done."))
    done = "[BACKGROUND TASK COMPLETED] task_id=bg-1, tool=http.download, elapsed=2.0s"
    turn = FakeTurn(done, source="notification")
    assert await agent.run_turn(turn) == "Your download is done."
    (request,) = standin.requests
    assert request.body["messages"] == [{"role": "system", "content": done}]


async def test_a_scheduled_notice_is_a_system_message_live_and_in_history(standin, agent):
    """A job's notification or tool result (``TurnInput.notice``, ``HistoryEntry.notice``) is
    the runtime speaking, as a background result is: a system message, not a user's words."""
    standin.script(text_stream("noted"))
    history = [
        HistoryEntry(role="user", content="[SCHEDULED NOTIFICATION] a", source="cron", notice=True),
        HistoryEntry(role="user", content="standup notes", source="cron", cron_turn=True),
    ]
    turn = FakeTurn("[SCHEDULED TOOL RESULT] job_id=j tool=clock ok=true", source="schedule")
    turn.history = history
    turn.input = msgspec.structs.replace(turn.input, notice=True)
    assert await agent.run_turn(turn) == "noted"
    (request,) = standin.requests
    assert request.body["messages"] == [
        {"role": "system", "content": "[SCHEDULED NOTIFICATION] a"},
        {"role": "user", "content": "[cron] standup notes"},
        {"role": "system", "content": "[SCHEDULED TOOL RESULT] job_id=j tool=clock ok=true"},
    ]


async def test_notifications_may_be_labelled_user_messages_for_strict_templates(standin):
    """``notification_role = "user"``: for a server whose chat template refuses a system
    message after the first, a notification is a user message labelled ``[notification]``."""
    standin.script(text_stream("ok"))
    agent = OpenAIAgent.from_config(
        {"base_url": standin.base_url, "max_retries": 0, "notification_role": "user"}
    )
    history = [HistoryEntry(role="user", content="[WATCHER UPDATE] up", source="notification")]
    turn = FakeTurn("[BACKGROUND TASK COMPLETED] bg-1", source="notification", history=history)
    assert await agent.run_turn(turn) == "ok"
    await agent.aclose()
    (request,) = standin.requests
    assert request.body["messages"] == [
        {"role": "user", "content": "[notification] [WATCHER UPDATE] up"},
        {"role": "user", "content": "[notification] [BACKGROUND TASK COMPLETED] bg-1"},
    ]
    with pytest.raises(ValueError, match="^notification_role must be system or user, got 'x'$"):
        OpenAIAgent(notification_role="x")


async def test_bad_tool_arguments_are_reported_to_the_model(standin, agent):
    standin.script(
        Stream(
            [
                chunk(tool_calls=[tool_piece(0, id="c1", name="clock", arguments='{"zone": ')]),
                chunk(tool_calls=[tool_piece(1, id="c2", name="clock", arguments="[1]")]),
                finish("tool_calls"),
            ]
        ),
        text_stream("sorry"),
    )
    turn = FakeTurn(tools=[CLOCK])
    assert await agent.run_turn(turn) == "sorry"
    assert turn.calls == []  # neither call reached the tool
    results = [m for m in standin.requests[1].body["messages"] if m["role"] == "tool"]
    first, second = (json.loads(m["content"])["error"] for m in results)
    assert first["code"] == second["code"] == "invalid_arguments"
    assert "not valid JSON" in first["message"]
    assert "must be a JSON object" in second["message"]


async def test_max_tool_rounds_closes_with_the_last_text_and_a_note(standin):
    def call(text: str) -> Stream:
        return Stream(
            [
                chunk(content=text),
                chunk(tool_calls=[tool_piece(0, id="c", name="clock", arguments="{}")]),
                finish("tool_calls"),
            ]
        )

    standin.script(call("one"), call("two"), call(""))
    agent = OpenAIAgent(base_url=standin.base_url, max_tool_rounds=2)
    turn = FakeTurn(tools=[CLOCK])
    text = await agent.run_turn(turn)
    await agent.aclose()
    assert text == "two\n\n[stopped after 2 rounds of tool calls]"
    assert turn.deltas() == ["one", "two", "\n\n[stopped after 2 rounds of tool calls]"]
    assert len(turn.calls) == 2  # the third round's call is not run
    assert len(standin.requests) == 3  # and nothing is sent with it unanswered


async def test_zero_tool_rounds_closes_with_only_the_note(standin):
    standin.script(
        Stream([chunk(tool_calls=[tool_piece(0, id="c", name="clock", arguments="{}")]), finish()])
    )
    agent = OpenAIAgent(base_url=standin.base_url, max_tool_rounds=0)
    turn = FakeTurn(tools=[CLOCK])
    assert await agent.run_turn(turn) == "[stopped after 0 rounds of tool calls]"
    await agent.aclose()
    assert turn.calls == []


async def test_http_error_status_uses_the_json_error_message(standin, agent):
    standin.script(Reply(500, json.dumps({"error": {"message": "model exploded", "type": "x"}})))
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    assert str(info.value) == "model server answered 500: model exploded"


async def test_http_error_status_with_a_plain_body(standin, agent):
    standin.script(Reply(502, "upstream\n  " + "x" * 300, content_type="text/plain"))
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    assert str(info.value) == "model server answered 502: " + ("upstream " + "x" * 300)[:200]


async def test_the_api_key_is_sent_as_bearer_and_never_echoed(standin):
    standin.script(text_stream("hi"), Reply(401, json.dumps({"error": "bad key sk-secret-123"})))
    agent = OpenAIAgent(base_url=standin.base_url, api_key="sk-secret-123")
    await agent.run_turn(FakeTurn())
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    await agent.aclose()
    assert standin.requests[0].headers["authorization"] == "Bearer sk-secret-123"
    assert str(info.value) == "model server answered 401: bad key ***"
    assert "sk-secret" not in repr(agent)


async def test_no_authorization_header_without_a_key(standin, agent):
    standin.script(text_stream("hi"))
    await agent.run_turn(FakeTurn())
    assert "authorization" not in standin.requests[0].headers


async def test_unreachable_server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    agent = OpenAIAgent(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0)
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    await agent.aclose()
    assert str(info.value).startswith("model server unreachable: ")


async def test_read_timeout_is_unreachable(standin):
    standin.script(Stall())
    agent = OpenAIAgent(base_url=standin.base_url, timeout=0.2, max_retries=0)
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    await agent.aclose()
    assert str(info.value) == "model server unreachable: timed out"


async def test_cancellation_propagates(standin, agent):
    standin.script(Stall())
    with trio.move_on_after(0.2) as scope:
        await agent.run_turn(FakeTurn())
    assert scope.cancelled_caught


@pytest.mark.parametrize(
    "stream",
    [
        Stream([chunk(content="a"), "{not json", finish()]),
        Stream(['["a list"]', finish()]),
        Stream([{"choices": "nope"}, finish()]),
        Stream([chunk(tool_calls="nope"), finish()]),
    ],
)
async def test_malformed_stream_data(standin, agent, stream):
    standin.script(stream)
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    assert str(info.value) == "model server sent malformed data"


async def test_error_event_mid_stream(standin, agent):
    standin.script(Stream([chunk(content="a"), {"error": {"message": "overloaded"}}, finish()]))
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    assert str(info.value) == "model server error: overloaded"


async def test_non_streaming_json_answer_is_accepted(standin, agent):
    message = {"role": "assistant", "content": "whole"}
    standin.script(Reply(200, json.dumps({"choices": [{"index": 0, "message": message}]})))
    turn = FakeTurn()
    assert await agent.run_turn(turn) == "whole"
    assert turn.deltas() == ["whole"]


async def test_empty_answer_and_usage_only_chunks(standin, agent):
    standin.script(
        Stream(
            [
                chunk(role="assistant"),
                finish(),
                {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1}},
            ]
        )
    )
    turn = FakeTurn()
    assert await agent.run_turn(turn) == ""
    assert turn.usage == [Usage(prompt_tokens=2, completion_tokens=1)]


async def test_env_fallback(standin, monkeypatch):
    monkeypatch.setenv("TURNSTILE_OPENAI_BASE_URL", standin.base_url + "/")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # TURNSTILE_* wins
    monkeypatch.setenv("OPENAI_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    standin.script(text_stream("hi"))
    agent = OpenAIAgent()
    assert await agent.run_turn(FakeTurn()) == "hi"
    await agent.aclose()
    assert standin.requests[0].body["model"] == "env-model"
    assert standin.requests[0].headers["authorization"] == "Bearer sk-env"


def test_defaults_and_config():
    agent = OpenAIAgent()
    assert (agent.base_url, agent.model) == ("https://api.openai.com/v1", "gpt-4o-mini")
    configured = OpenAIAgent.from_config(
        {"base_url": "http://localhost:11434/v1", "model": "qwen3", "system_prompt": "hi"}
    )
    assert configured.base_url == "http://localhost:11434/v1"
    assert (configured.model, configured.system_prompt) == ("qwen3", "hi")
    with pytest.raises(ValueError, match="modle"):
        OpenAIAgent.from_config({"modle": "x"})


async def test_a_turn_can_add_a_system_segment_and_override_model_and_max_tokens(standin, agent):
    standin.script(text_stream("all good"))
    turn = FakeTurn("check the checklist", source="heartbeat")
    turn.input = TurnInput(
        input_id=1,
        source="heartbeat",
        content="check the checklist",
        system_segment="This is a scheduled heartbeat check.",
        model="cheap-model",
        max_tokens=256,
    )
    agent.system_prompt = "Be brief."
    assert await agent.run_turn(turn) == "all good"
    (seen,) = standin.requests
    assert seen.body["model"] == "cheap-model"
    assert seen.body["max_tokens"] == 256
    assert seen.body["messages"][0] == {
        "role": "system",
        "content": "Be brief.\n\nThis is a scheduled heartbeat check.",
    }


# ---- one model call within the turn's context budget ----------------------------------------

PAGE = ToolSpec(
    name="page",
    description="Fetch the page.",
    parameters={"type": "object", "properties": {}},
)


def _tokens(body: dict) -> int:
    """The call's size as the agent estimates it (context.message_tokens, tools included)."""
    tools = estimate_tokens(json.dumps(body["tools"])) if body.get("tools") else 0
    return tools + sum(message_tokens(m) for m in body["messages"])


async def test_a_tool_result_larger_than_the_budget_is_cut_to_what_fits(standin, agent):
    """A page of 200,000 characters comes back from a tool: the next call sends as much of it
    as the turn's budget leaves, with a pointer to the rest, and the server (whose window is
    the budget's size) accepts it; sent whole, it would refuse the call and fail the turn."""
    standin.context_tokens = 2500
    standin.script(tool_stream(("call_p", "page", {})), text_stream("It is about trains."))
    page = "trains and timetables " * 9091  # 200,002 characters
    turn = FakeTurn("what is the page about?", tools=[PAGE], results={"page": {"text": page}})
    turn.input = msgspec.structs.replace(turn.input, context_tokens=2000)
    agent.system_prompt = "You are a careful reader."
    assert await agent.run_turn(turn) == "It is about trains."
    first, second = standin.requests
    result = second.body["messages"][-1]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_p"
    full = json.dumps({"text": page})
    assert result["content"].endswith(f"… [truncated; {len(full)} chars — see history]")
    kept = result["content"].split("… [truncated")[0]
    assert full.startswith(kept) and len(kept) > 5_000  # most of what the budget leaves
    assert _tokens(second.body) <= 2000
    # what fitted is not touched: the system prompt and the question go as they were
    assert second.body["messages"][:2] == first.body["messages"]


async def test_earlier_turns_give_way_before_this_turns_result(standin, agent):
    """Over the budget in a turn's second call: first the earlier turns' long tool results are
    cut, then the oldest earlier turns go whole (a call with its result), and this turn's own
    result is kept whole while that is enough."""
    standin.script(
        tool_stream(("call_1", "page", {})),
        tool_stream(("call_2", "page", {})),
        text_stream("done"),
    )
    history = [
        HistoryEntry(role="user", content="old question"),
        HistoryEntry(role="tool", tool="page", content="o" * 3000, call_id="old_call"),
        HistoryEntry(role="assistant", content="old answer"),
        HistoryEntry(role="user", content="recent question"),
        HistoryEntry(role="assistant", content="recent answer"),
    ]
    turn = FakeTurn("now?", history=history, tools=[PAGE], results={"page": {"text": "n" * 1600}})
    turn.input = msgspec.structs.replace(turn.input, context_tokens=1000)
    assert await agent.run_turn(turn) == "done"
    first, second, third = standin.requests
    assert _tokens(first.body) <= 1000 and first.body["messages"][2]["content"] == "o" * 3000
    # second call: the old turn's result cut to 1,000 characters was enough
    old_result = second.body["messages"][2]
    assert old_result["tool_call_id"] == "old_call"
    assert old_result["content"] == "o" * 1000 + "… [truncated; 3000 chars — see history]"
    assert second.body["messages"][-1]["content"] == json.dumps({"text": "n" * 1600})
    # third call: a second result of this turn; the old turn goes, call and result together
    contents = [m.get("content") for m in third.body["messages"]]
    assert contents[:3] == ["recent question", "recent answer", "now?"]
    assert not any(m.get("tool_call_id") == "old_call" for m in third.body["messages"])
    tool_results = [m["content"] for m in third.body["messages"] if m["role"] == "tool"]
    assert tool_results == [json.dumps({"text": "n" * 1600})] * 2
    assert _tokens(third.body) <= 1000


async def test_without_a_budget_nothing_is_cut(standin, agent):
    standin.script(tool_stream(("call_p", "page", {})), text_stream("ok"))
    page = "x" * 50_000
    turn = FakeTurn("read it", tools=[PAGE], results={"page": {"text": page}})
    assert await agent.run_turn(turn) == "ok"
    assert standin.requests[1].body["messages"][-1]["content"] == json.dumps({"text": page})


async def test_the_answers_max_tokens_counts_against_the_budget(standin, agent):
    """A turn that reserves 800 tokens for the answer leaves the call 1,200 of its 2,000: the
    server (a window a little larger than the budget: it counts the JSON too), which counts
    prompt and completion together, accepts it."""
    standin.context_tokens = 2100
    standin.script(tool_stream(("call_p", "page", {})), text_stream("short"))
    page = "z" * 40_000
    turn = FakeTurn("summarise", tools=[PAGE], results={"page": {"text": page}})
    turn.input = msgspec.structs.replace(turn.input, context_tokens=2000, max_tokens=800)
    assert await agent.run_turn(turn) == "short"
    second = standin.requests[1].body
    assert second["max_tokens"] == 800 and _tokens(second) <= 1200
