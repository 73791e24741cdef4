"""How real servers stream, and how they refuse: the variants the openai agent must take.

Every answer comes from the strict stand-in (tests/support/fake_openai.py), which also
checks each request the agent sends: a follow-up request after tool calls that broke OpenAI's
rules would be a 400 here, and every test ends by asserting none was. Retry tests run the
stand-in in-process on a ``MockClock``, so waiting out ``Retry-After`` takes no real time.
"""

from __future__ import annotations

import json
import socket

import openai._base_client as openai_base_client
import pytest
import trio

from tests.support.agents import FakeTurn
from tests.support.fake_openai import (
    OpenAIStandIn,
    Reply,
    Stream,
    chunk,
    finish,
    text_stream,
    tool_piece,
    usage_chunk,
)
from turnstile.actors.sessions.agents.base import AgentError, HistoryEntry, ToolSpec, Usage
from turnstile.actors.sessions.agents.openai import OpenAIAgent

CLOCK_NOW = ToolSpec(
    name="clock.now",
    description="What time is it?",
    parameters={"type": "object", "properties": {"zone": {"type": "string"}}},
)
FS_READ = ToolSpec(
    name="filesystem.read",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


@pytest.fixture
async def agent(standin):
    agent = OpenAIAgent(base_url=standin.base_url, model="m", max_retries=0)
    yield agent
    await agent.aclose()


def tool_messages(body: dict) -> list[dict]:
    return [m for m in body["messages"] if m["role"] in ("assistant", "tool")]


async def test_dotted_tools_are_advertised_under_valid_names_and_mapped_back(standin, agent):
    standin.script(
        Stream(
            [
                chunk(tool_calls=[tool_piece(0, id="c1", name="clock__now", arguments="{}")]),
                finish("tool_calls"),
            ]
        ),
        text_stream("noon"),
    )
    history = [HistoryEntry(role="tool", content="{}", tool="filesystem.read", call_id="h1")]
    turn = FakeTurn(tools=[CLOCK_NOW, FS_READ], history=history)
    assert await agent.run_turn(turn) == "noon"
    assert turn.calls == [("clock.now", {}, "c1")]
    first, second = (seen.body for seen in standin.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["clock__now", "filesystem__read"]
    assert first["messages"][0]["tool_calls"][0]["function"]["name"] == "filesystem__read"
    # The model's own name for the call goes back to it; the runtime ran clock.now.
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "clock__now"


async def test_a_name_the_turn_did_not_advertise_is_still_mapped_back(standin, agent):
    standin.script(
        Stream(
            [
                chunk(tool_calls=[tool_piece(0, id="c1", name="shell__run", arguments="{}")]),
                finish("tool_calls"),
            ]
        ),
        text_stream("ok"),
    )
    turn = FakeTurn(tools=[CLOCK_NOW])
    await agent.run_turn(turn)
    assert turn.calls == [("shell.run", {}, "c1")]


async def test_parallel_calls_interleaved_by_index_with_split_arguments(standin, agent):
    standin.script(
        Stream(
            [
                chunk(role="assistant", content=None),
                chunk(tool_calls=[tool_piece(0, id="a", name="clock__now")]),
                chunk(tool_calls=[tool_piece(1, id="b", name="filesystem__read")]),
                chunk(tool_calls=[tool_piece(1, arguments='{"pa')]),
                chunk(tool_calls=[tool_piece(0, arguments='{"zone":')]),
                chunk(tool_calls=[tool_piece(1, arguments='th": "x"}')]),
                chunk(tool_calls=[tool_piece(0, arguments=' "UTC"}')]),
                finish("tool_calls"),
                usage_chunk(10, 5),
            ]
        ),
        text_stream("done", usage=(20, 2)),
    )
    turn = FakeTurn(tools=[CLOCK_NOW, FS_READ])
    assert await agent.run_turn(turn) == "done"
    assert turn.calls == [
        ("clock.now", {"zone": "UTC"}, "a"),
        ("filesystem.read", {"path": "x"}, "b"),
    ]
    assert turn.usage == [
        Usage(prompt_tokens=10, completion_tokens=5),
        Usage(prompt_tokens=20, completion_tokens=2),
    ]
    assistant, first, second = tool_messages(standin.requests[1].body)
    assert [c["id"] for c in assistant["tool_calls"]] == ["a", "b"]
    assert (first["tool_call_id"], second["tool_call_id"]) == ("a", "b")


async def test_usage_is_requested_unless_turned_off(standin):
    standin.script(text_stream("a"), text_stream("b"))
    for include in (True, False):
        agent = OpenAIAgent(base_url=standin.base_url, include_usage=include, max_retries=0)
        await agent.run_turn(FakeTurn())
        await agent.aclose()
    on, off = (seen.body for seen in standin.requests)
    assert on["stream_options"] == {"include_usage": True}
    assert "stream_options" not in off


async def test_ollama_whole_calls_without_index_or_id_and_object_arguments(standin, agent):
    standin.script(
        Stream(
            [
                chunk(
                    tool_calls=[
                        {"function": {"name": "clock__now", "arguments": {"zone": "UTC"}}},
                        {"function": {"name": "filesystem__read", "arguments": {"path": "p"}}},
                    ]
                ),
                finish("tool_calls"),
            ]
        ),
        text_stream("ok"),
    )
    turn = FakeTurn(tools=[CLOCK_NOW, FS_READ])
    assert await agent.run_turn(turn) == "ok"
    (name_a, args_a, id_a), (name_b, args_b, id_b) = turn.calls
    assert (name_a, args_a, name_b, args_b) == (
        "clock.now",
        {"zone": "UTC"},
        "filesystem.read",
        {"path": "p"},
    )
    assert id_a.startswith("call_") and id_b.startswith("call_") and id_a != id_b
    assistant, *answers = tool_messages(standin.requests[1].body)
    assert [c["id"] for c in assistant["tool_calls"]] == [a["tool_call_id"] for a in answers]


async def test_pieces_without_index_continue_the_call_they_follow(standin, agent):
    standin.script(
        Stream(
            [
                chunk(tool_calls=[tool_piece(None, id="a", name="clock__now", arguments='{"zo')]),
                chunk(tool_calls=[tool_piece(None, arguments='ne": "UTC"}')]),
                chunk(
                    tool_calls=[tool_piece(None, id="b", name="filesystem__read", arguments="{}")]
                ),
                finish("tool_calls"),
            ]
        ),
        text_stream("ok"),
    )
    turn = FakeTurn(tools=[CLOCK_NOW, FS_READ])
    await agent.run_turn(turn)
    assert turn.calls == [("clock.now", {"zone": "UTC"}, "a"), ("filesystem.read", {}, "b")]


async def test_vllm_reasoning_content_then_answer_with_usage(standin, agent):
    standin.script(
        Stream(
            [
                chunk(role="assistant", reasoning_content="Think", content=None),
                chunk(reasoning_content="ing."),
                chunk(content="Answer."),
                {**finish("stop"), "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
            ]
        )
    )
    turn = FakeTurn()
    assert await agent.run_turn(turn) == "Answer."
    assert turn.deltas("thinking_delta") == ["Think", "ing."]
    assert turn.usage == [Usage(prompt_tokens=7, completion_tokens=3)]


@pytest.mark.parametrize(
    "stream",
    [
        Stream([chunk(content="Hal"), chunk(content="f")], cut=True),  # connection dropped
        Stream([chunk(content="Hal"), chunk(content="f")]),  # closed, but no finish_reason
    ],
    ids=["dropped", "unfinished"],
)
async def test_a_stream_cut_midway_fails_with_one_clear_line(standin, agent, stream):
    standin.script(stream)
    turn = FakeTurn()
    with pytest.raises(AgentError) as info:
        await agent.run_turn(turn)
    assert str(info.value) == "model server cut the answer off mid-stream"
    assert turn.deltas() == ["Hal", "f"]


async def test_an_invalid_request_comes_back_as_the_servers_400(standin, agent):
    bad = ToolSpec(name="no spaces please", description="", parameters={"type": "object"})
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn(tools=[bad]))
    assert str(info.value) == (
        "model server answered 400: Invalid 'tools[0].function.name': string does not match "
        "pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
    )
    assert standin.rejected.pop()["error"]["code"] == "invalid_value"


async def test_no_authorization_header_without_a_key(standin, agent):
    standin.script(text_stream("hi"))
    await agent.run_turn(FakeTurn())
    assert "authorization" not in standin.requests[0].headers


# -- retries, on a MockClock: the stand-in answers in-process (OpenAIStandIn.transport) ------


@pytest.fixture
def local() -> OpenAIStandIn:
    return OpenAIStandIn(base_url="http://standin.test/v1")


def local_agent(standin: OpenAIStandIn, **settings) -> OpenAIAgent:
    agent = OpenAIAgent(base_url=standin.base_url, transport=standin.transport(), **settings)
    # The openai client looks up the platform (for its X-Stainless-* headers) in a worker thread
    # on its first request; a MockClock jumps ahead while a thread runs, so look it up here.
    agent._openai()._platform = openai_base_client.get_platform()
    return agent


def refusal(status: int, **headers: str) -> Reply:
    body = {"error": {"message": f"busy ({status})", "type": "server_error"}}
    return Reply(status, json.dumps(body), headers=headers)


async def test_429_waits_out_retry_after_then_succeeds(local, autojump_clock):
    local.script(refusal(429, **{"Retry-After": "7"}), text_stream("at last"))
    agent = local_agent(local)
    started = trio.current_time()
    assert await agent.run_turn(FakeTurn()) == "at last"
    await agent.aclose()
    assert trio.current_time() - started >= 7
    assert len(local.requests) == 2


async def test_5xx_backs_off_and_gives_up_after_max_retries(local, autojump_clock):
    local.script(refusal(503), refusal(502), refusal(500), text_stream("never"))
    agent = local_agent(local, max_retries=2)
    started = trio.current_time()
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    await agent.aclose()
    assert str(info.value) == "model server answered 500: busy (500)"
    assert len(local.requests) == 3  # the first try and two retries, no more
    waited = trio.current_time() - started
    assert 0.5 * 0.75 + 1.0 * 0.75 <= waited <= 0.5 + 1.0  # backoff 0.5 s then 1 s, jittered


async def test_a_retry_after_beyond_two_minutes_is_not_waited_for(local, autojump_clock):
    local.script(refusal(429, **{"Retry-After": "3600"}), text_stream("never"))
    agent = local_agent(local)
    started = trio.current_time()
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    await agent.aclose()
    assert str(info.value) == "model server answered 429: busy (429)"
    assert len(local.requests) == 1
    assert trio.current_time() == started


async def test_a_400_is_not_retried(local, autojump_clock):
    local.script(Reply(400, json.dumps({"error": {"message": "bad request"}})), text_stream("x"))
    agent = local_agent(local)
    with pytest.raises(AgentError):
        await agent.run_turn(FakeTurn())
    await agent.aclose()
    assert len(local.requests) == 1


async def test_an_unreachable_server_is_retried_then_reported():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    agent = OpenAIAgent(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1)
    with pytest.raises(AgentError) as info:
        await agent.run_turn(FakeTurn())
    await agent.aclose()
    assert str(info.value).startswith("model server unreachable: ")
