"""The openai agent on a real node, through the real gateway, against a strict model server.

The stand-in (tests/support/fake_openai.py) enforces OpenAI's request rules — function
names, parameter schemas and their ``$ref``s, every tool message answering its assistant
``tool_calls`` — and answers 400 with OpenAI's error body otherwise, so a turn here completes
only if the node sent what OpenAI itself would accept. Every test ends by asserting that the
stand-in refused nothing.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.support.agents import ENV_VARS
from tests.support.fake_openai import (
    Reply,
    Stream,
    check_parameters,
    chunk,
    finish,
    start_standin,
    text_stream,
    tool_piece,
    tool_stream,
)
from tests.support.node import connect, new_session, running_node
from turnstile.actors import node as node_module
from turnstile.actors.sessions.agents import OpenAIAgent, function_name, tool_name
from turnstile.actors.sessions.agents.base import FUNCTION_NAME
from turnstile.tools.registry import ToolRegistry


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def standin(nursery):
    standin = await start_standin(nursery)
    yield standin
    assert standin.rejected == []


@pytest.fixture
def registries(monkeypatch) -> list[ToolRegistry]:
    """Every ToolRegistry a node builds while the test runs."""
    built: list[ToolRegistry] = []

    class Recording(ToolRegistry):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(node_module, "ToolRegistry", Recording)
    return built


async def node_registry(tmp_path, registries) -> ToolRegistry:
    async with running_node(tmp_path):
        pass
    (registry,) = registries
    return registry


async def test_every_registered_tool_has_a_valid_function_name_that_maps_back(tmp_path, registries):
    registry = await node_registry(tmp_path, registries)
    names = registry.names()
    assert len(names) > 30 and "clock.now" in names and "run_parallel" in names
    advertised = [function_name(name) for name in names]
    bad = [f for f in advertised if not FUNCTION_NAME.fullmatch(f)]
    assert bad == []
    assert [tool_name(f) for f in advertised] == names  # one to one, both ways
    assert len(set(advertised)) == len(names)
    assert function_name("clock.now") == "clock__now"


async def test_every_registered_tool_schema_is_valid_and_its_refs_resolve(tmp_path, registries):
    registry = await node_registry(tmp_path, registries)
    specs = {spec.name: spec for spec in registry.specs()}
    for spec in specs.values():
        try:
            check_parameters(spec.parameters)  # the 2020-12 meta-schema, then every $ref
        except ValueError as exc:
            pytest.fail(f"{spec.name}: {exc}")
    # The two that used to reach the model with dangling references:
    assert "Action" in specs["run_parallel"].parameters["$defs"]
    assert "NotifyConfig" in specs["watch_start"].parameters["$defs"]
    # ... and the nested schema really applies: a bad action is caught by the schema alone.
    validator = jsonschema.Draft202012Validator(specs["run_parallel"].parameters)
    validator.validate({"actions": [{"name": "clock.now", "params": {}}]})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"actions": [{"nmae": "clock.now"}]})


async def turn(client, session_id: str, content: str, msg_id: str) -> dict:
    """Send ``content`` and return the turn's ``stream_end``."""
    await client.send(type="send", session_id=session_id, content=content, client_msg_id=msg_id)
    ack = await client.expect("ack", client_msg_id=msg_id)
    return await client.expect("stream_end", input_id=ack["input_id"])


def agent_for(standin, **settings) -> OpenAIAgent:
    return OpenAIAgent(base_url=standin.base_url, model="m", **{"max_retries": 0, **settings})


async def test_a_plain_turn_streams_and_records_token_usage(tmp_path, standin):
    standin.script(text_stream("Hello", " there.", usage=(120, 7)))
    async with running_node(tmp_path, agent=agent_for(standin)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            end = await turn(client, "s1", "hi", "m1")
            assert (end["status"], end["text"]) == ("completed", "Hello there.")
            assert end["usage"] == {
                "prompt_tokens": 120,
                "completion_tokens": 7,
                "total_tokens": 127,
            }
        async with node.http() as http:
            metrics = (await http.get("/metrics")).text.splitlines()
    assert 'turnstile_model_tokens_total{kind="prompt"} 120.0' in metrics
    assert 'turnstile_model_tokens_total{kind="completion"} 7.0' in metrics
    (seen,) = standin.requests
    names = [tool["function"]["name"] for tool in seen.body["tools"]]
    assert names and all("." not in name for name in names)
    assert seen.body["stream_options"] == {"include_usage": True}


async def test_the_model_calls_remember_and_a_job_appears(tmp_path, standin):
    standin.script(
        tool_stream(("call_r", "remember", {"what": "stretch", "when": "in 2 hours"})),
        text_stream("I will remind you."),
        text_stream("Still here."),
    )
    async with running_node(tmp_path, agent=agent_for(standin)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            end = await turn(client, "s1", "remind me to stretch in 2 hours", "m1")
            assert (end["status"], end["text"]) == ("completed", "I will remind you.")
            call = await client.expect("tool_call", tool="remember")
            assert call["ok"] is True, call
            assert call["call_id"] == "call_r"
            # A second turn replays the first one's call and result as history; the stand-in
            # checks that they still pair up.
            assert (await turn(client, "s1", "thanks", "m2"))["status"] == "completed"
        async with node.http() as http:
            jobs = (await http.get("/sessions/s1/jobs")).json()["jobs"]
    assert len(jobs) == 1 and jobs[0]["state"] == "active"
    second, third = (seen.body["messages"] for seen in standin.requests[1:])
    assistant, answer = second[-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "remember"
    assert answer["tool_call_id"] == "call_r"
    assert json.loads(answer["content"])["job_id"] == jobs[0]["id"]
    assert [m["role"] for m in third[-5:]] == ["user", "assistant", "tool", "assistant", "user"]


async def test_run_parallel_with_nested_actions(tmp_path, standin):
    actions = [
        {"name": "clock.now", "params": {}},
        {"name": "echo", "params": {"text": "hi"}},
        {"name": "clock__now", "params": {}},  # what the model was shown works as well
    ]
    standin.script(
        tool_stream(("call_p", "run_parallel", {"actions": actions})), text_stream("Both done.")
    )
    async with running_node(tmp_path, agent=agent_for(standin)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            end = await turn(client, "s1", "do two things", "m1")
            assert end["status"] == "completed"
            call = await client.expect("tool_call", tool="run_parallel")
    assert call["ok"] is True, call
    result = call["result"]
    assert (result["total"], result["succeeded"]) == (3, 3), result
    assert [r["name"] for r in result["results"]] == ["clock.now", "echo", "clock__now"]
    tools = {t["function"]["name"]: t["function"] for t in standin.requests[0].body["tools"]}
    assert "Action" in tools["run_parallel"]["parameters"]["$defs"]


async def test_streaming_variants_of_local_servers(tmp_path, standin):
    # Ollama: a whole call in one chunk, no index, no id, arguments as an object; vLLM:
    # reasoning_content, usage on the last choice chunk.
    standin.script(
        Stream(
            [
                chunk(role="assistant", reasoning_content="Let me look."),
                chunk(tool_calls=[{"function": {"name": "clock__now", "arguments": {}}}]),
                finish("tool_calls"),
            ]
        ),
        Stream(
            [
                chunk(reasoning="It is known."),
                chunk(content="It is now."),
                {**finish("stop"), "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
            ],
            split=True,
        ),
    )
    async with running_node(tmp_path, agent=agent_for(standin)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            end = await turn(client, "s1", "time?", "m1")
            assert (end["status"], end["text"]) == ("completed", "It is now.")
            assert end["usage"]["completion_tokens"] == 4
            thinking = [e["text"] for e in client.events("s1") if e["type"] == "thinking_delta"]
            assert thinking == ["Let me look.", "It is known."]
            call = await client.expect("tool_call", tool="clock.now")
            assert call["ok"] is True and call["call_id"].startswith("call_")


async def test_split_arguments_of_parallel_calls(tmp_path, standin):
    standin.script(
        Stream(
            [
                chunk(tool_calls=[tool_piece(0, id="a", name="echo")]),
                chunk(tool_calls=[tool_piece(1, id="b", name="echo")]),
                chunk(tool_calls=[tool_piece(1, arguments='{"text": ')]),
                chunk(tool_calls=[tool_piece(0, arguments='{"text": "one"}')]),
                chunk(tool_calls=[tool_piece(1, arguments='"two"}')]),
                finish("tool_calls"),
            ]
        ),
        text_stream("ok"),
    )
    async with running_node(tmp_path, agent=agent_for(standin)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            assert (await turn(client, "s1", "echo twice", "m1"))["status"] == "completed"
            first = await client.expect("tool_call", call_id="a")
            second = await client.expect("tool_call", call_id="b")
    assert (first["arguments"], second["arguments"]) == ({"text": "one"}, {"text": "two"})


async def test_max_tool_rounds_closes_completed_with_the_last_text_and_a_note(tmp_path, standin):
    again = tool_stream(("c", "clock__now", {}), text="Checking the clock.")
    standin.script(again, again)
    async with running_node(tmp_path, agent=agent_for(standin, max_tool_rounds=1)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            end = await turn(client, "s1", "loop", "m1")
    assert end["status"] == "completed"
    assert end["text"] == "Checking the clock.\n\n[stopped after 1 rounds of tool calls]"
    assert len(standin.requests) == 2


async def test_a_429_is_retried_then_the_turn_completes(tmp_path, standin):
    busy = json.dumps({"error": {"message": "Rate limit reached", "type": "requests"}})
    standin.script(Reply(429, busy, headers={"Retry-After": "0.01"}), text_stream("ok"))
    async with running_node(tmp_path, agent=agent_for(standin, max_retries=2)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            assert (await turn(client, "s1", "hi", "m1"))["status"] == "completed"
    assert len(standin.requests) == 2


async def test_a_stream_cut_midway_fails_the_turn_with_one_line(tmp_path, standin):
    standin.script(Stream([chunk(content="Half an ans")], cut=True))
    async with running_node(tmp_path, agent=agent_for(standin)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            end = await turn(client, "s1", "hi", "m1")
    assert end["status"] == "failed"
    assert end["error"] == "model server cut the answer off mid-stream"


async def test_a_refused_request_fails_the_turn_with_the_servers_message(tmp_path, standin):
    body = {"error": {"message": "model 'nope' not found", "type": "invalid_request_error"}}
    standin.script(Reply(404, json.dumps(body)))
    async with running_node(tmp_path, agent=agent_for(standin)) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            await client.send(type="attach", session_id="s1")
            end = await turn(client, "s1", "hi", "m1")
    assert (end["status"], end["error"]) == (
        "failed",
        "model server answered 404: model 'nope' not found",
    )
