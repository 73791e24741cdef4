"""The stand-in refuses what OpenAI refuses: each rule, one bad request each."""

from __future__ import annotations

import pytest

from tests.support.fake_openai import Rejected, check_request

USER = {"role": "user", "content": "hi"}


def call(id: str = "a", name: str = "clock__now") -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def asks(*calls: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def answer(id: str = "a") -> dict:
    return {"role": "tool", "tool_call_id": id, "content": "{}"}


def tool(name: str = "clock__now", parameters: object = None) -> dict:
    function: dict = {"name": name, "description": ""}
    function["parameters"] = {"type": "object"} if parameters is None else parameters
    return {"type": "function", "function": function}


def request(messages=None, tools=None, **extra) -> dict:
    body = {"model": "m", "messages": [USER] if messages is None else messages, **extra}
    if tools is not None:
        body["tools"] = tools
    return body


VALID = [
    request(),
    request([USER, asks(call("a"), call("b")), answer("a"), answer("b"), USER]),
    request(tools=[tool(), tool("run_parallel")]),
    request(
        tools=[
            tool(
                parameters={
                    "type": "object",
                    "properties": {"a": {"type": "array", "items": {"$ref": "#/$defs/A"}}},
                    "$defs": {"A": {"type": "object"}},
                }
            )
        ]
    ),
    request(stream=True, stream_options={"include_usage": True}),
]

INVALID = [
    (request(tools=[tool("clock.now")]), "tools[0].function.name", "does not match pattern"),
    (request(tools=[tool("x" * 65)]), "tools[0].function.name", "string too long"),
    (request(tools=[tool(), tool()]), "tools", "duplicate function name"),
    (
        request(
            tools=[tool(parameters={"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}})]
        ),
        "tools[0].function.parameters",
        "reference '#/$defs/A' can't be resolved",
    ),
    (
        request(tools=[tool(parameters={"type": "object", "required": "a"})]),
        "tools[0].function.parameters",
        "is not of type 'array'",
    ),
    (
        request(tools=[tool(parameters={"type": "string"})]),
        "tools[0].function.parameters",
        'type: "object"',
    ),
    (request([USER, answer("a")]), "messages.[1].role", "must be a response to a preceeding"),
    (request([USER, asks(call("a")), USER]), "messages.[1].role", "did not have response"),
    (request([USER, asks(call("a"))]), "messages.[1].role", "did not have response messages: a"),
    (
        request([USER, asks(call("a")), answer("a"), answer("a")]),
        "messages.[3].role",
        "must be a response",
    ),
    (request([{"role": "robot", "content": "x"}]), "messages[0].role", "Invalid value: 'robot'"),
    (request([]), "messages", "empty array"),
    (request(stream_options={"include_usage": True}), "stream_options", "only allowed"),
]


@pytest.mark.parametrize("body", VALID)
def test_valid_requests_pass(body):
    check_request(body)


@pytest.mark.parametrize(("body", "param", "message"), INVALID)
def test_invalid_requests_are_refused_like_openai(body, param, message):
    with pytest.raises(Rejected) as info:
        check_request(body)
    assert info.value.param == param
    assert message in str(info.value)
    assert info.value.body()["error"]["type"] == "invalid_request_error"
