"""Tool names inside the runtime and the function names models see; schemas with $defs."""

from __future__ import annotations

import msgspec
import pytest

from tests.support.fake_openai import check_parameters
from turnstile.actors.sessions.agents import function_name, tool_name
from turnstile.tools.registry import ToolRegistry, parameters_schema


class Inner(msgspec.Struct):
    x: int


class Outer(msgspec.Struct):
    items: list[Inner]


class Tree(msgspec.Struct):
    children: list[Tree] = []


class Flat(msgspec.Struct):
    a: str


async def handler(call, params):
    return {}


@pytest.mark.parametrize(
    ("name", "function"),
    [
        ("clock.now", "clock__now"),
        ("shell.background_run", "shell__background_run"),
        ("run_parallel", "run_parallel"),
        ("a.b.c", "a__b__c"),
    ],
)
def test_names_map_one_to_one(name, function):
    assert function_name(name) == function
    assert tool_name(function) == name
    ToolRegistry().register(name, Flat, handler, "")


@pytest.mark.parametrize(
    "name",
    ["", "a__b", "a_.b", "a._b", "_a", "a_", "a.", ".a", "a b", "a-b", "é.x", "a" * 65],
)
def test_names_that_would_not_map_back_are_refused(name):
    with pytest.raises(ValueError, match="tool name must look like module.action"):
        ToolRegistry().register(name, Flat, handler, "")


def test_a_function_name_of_exactly_64_characters_is_fine():
    ToolRegistry().register("m." + "a" * 61, Flat, handler, "")  # m__aaa…: 64 characters


@pytest.mark.parametrize("params", [Flat, Outer, Tree])
def test_parameter_schemas_are_self_contained(params):
    schema = parameters_schema(params)
    check_parameters(schema)
    assert schema["type"] == "object"


def test_nested_definitions_move_along_and_the_top_one_only_if_referenced():
    assert set(parameters_schema(Outer)["$defs"]) == {"Inner"}
    assert set(parameters_schema(Tree)["$defs"]) == {"Tree"}
    assert "$defs" not in parameters_schema(Flat)


async def test_a_call_by_function_name_runs_the_tool():
    registry = ToolRegistry()
    registry.register("clock.now", Flat, handler, "")
    result = await registry.call("s", "o", "clock__now", {"a": "x"})
    assert result.ok, result
    assert (await registry.call("s", "o", "clock__later", {"a": "x"})).error["code"] == (
        "unknown_tool"
    )
