"""The tool registry: schemas, validation, and policies that no caller can bypass."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from turnstile.runtime.errors import InvalidArgument, NotFound, StoreError, StoreUnavailable
from turnstile.runtime.gateway.frames import STORE_FAILED
from turnstile.tools.policy import Policy, PolicyTable
from turnstile.tools.registry import ToolRegistry


class Params(msgspec.Struct, forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(max_length=10, description="where")]


def make(overrides=None, approver=None) -> tuple[ToolRegistry, list]:
    ran: list = []

    async def handler(call, params):
        ran.append((call.session_id, params.path))
        return {"done": params.path}

    registry = ToolRegistry(PolicyTable(overrides), approver=approver)
    registry.register("fs.read", Params, handler, "Read.")
    registry.register("fs.write", Params, handler, "Write.", policy=Policy.APPROVE)
    registry.register("shell.run", Params, handler, "Run.", policy=Policy.BLOCK)
    return registry, ran


def test_specs_carry_a_plain_json_schema_per_tool():
    registry, _ = make()
    spec = {s.name: s for s in registry.specs()}["fs.read"]
    assert spec.parameters["type"] == "object"
    assert spec.parameters["properties"]["path"] == {
        "type": "string",
        "maxLength": 10,
        "description": "where",
    }
    assert spec.parameters["required"] == ["path"]


def test_specs_follow_registrations_and_callers_get_their_own_list():
    registry, _ = make()
    first = registry.specs()
    assert [s.name for s in first] == ["fs.read", "fs.write", "shell.run"]
    first.clear()  # a caller (a turn's tool list) may filter its copy

    async def handler(call, params):
        return {}

    registry.register("a.first", Params, handler, "A.")
    assert [s.name for s in registry.specs()] == ["a.first", "fs.read", "fs.write", "shell.run"]


async def test_a_tool_not_offered_is_left_out_of_specs_yet_callable_under_its_policy():
    registry, ran = make()

    async def handler(call, params):
        ran.append(params.path)
        return {"kept": params.path}

    registry.register("fs.keep", Params, handler, "Keep.", Policy.APPROVE, offered=False)
    assert "fs.keep" not in [s.name for s in registry.specs()]
    assert "fs.keep" in registry.names()
    assert registry.policy_of("fs.keep") is Policy.APPROVE
    refused = await registry.call("s", "ada", "fs.keep", {"path": "x"})
    assert refused.error["code"] == "requires_approval" and ran == []
    assert (await registry.call("s", "ada", "fs.keep", {"path": "x"}, approved=True)).ok


async def test_defaults_and_overrides_resolve_exact_then_module_then_default():
    registry, _ = make({"fs.*": "BLOCK", "fs.read": "AUTO", "shell.run": "approve"})
    assert registry.policy_of("fs.read") is Policy.AUTO  # exact wins
    assert registry.policy_of("fs.write") is Policy.BLOCK  # module wildcard
    assert registry.policy_of("shell.run") is Policy.APPROVE  # case-insensitive value


async def test_block_and_unapprovable_calls_never_run_the_tool():
    registry, ran = make()
    blocked = await registry.call("s", "ada", "shell.run", {"path": "x"})
    assert blocked.error == {"code": "blocked", "message": "shell.run is blocked by policy"}
    unapproved = await registry.call("s", "ada", "fs.write", {"path": "x"})
    assert unapproved.error["code"] == "requires_approval"
    assert ran == []


async def test_a_call_that_may_not_ask_comes_back_as_requires_approval():
    asked = []

    async def approver(call, name, arguments):
        asked.append(name)
        return True

    registry, ran = make(approver=approver)
    result = await registry.call("s", "ada", "fs.write", {"path": "x"}, ask_approval=False)
    assert result.error == {
        "code": "requires_approval",
        "message": "fs.write needs approval (not asked for here)",
    }
    assert asked == [] and ran == []


async def test_approver_decides_and_sees_the_call():
    asked = []

    async def approver(call, name, arguments):
        asked.append((call.session_id, call.owner, name, arguments))
        return arguments["path"] == "ok"

    registry, ran = make(approver=approver)
    assert (await registry.call("s", "ada", "fs.write", {"path": "ok"})).ok
    denied = await registry.call("s", "ada", "fs.write", {"path": "no"})
    assert denied.error == {"code": "denied", "message": "fs.write was not approved"}
    assert ran == [("s", "ok")]
    assert asked[0] == ("s", "ada", "fs.write", {"path": "ok"})


async def test_bad_arguments_are_refused_before_policy_and_handler():
    registry, ran = make()
    result = await registry.call("s", "ada", "fs.read", {"path": "x" * 11})
    assert result.error == {
        "code": "bad_arguments",
        "message": "expected `str` of length <= 10 at $.path",
        "field": "$.path",
    }
    assert ran == []


def test_unknown_policy_values_are_refused():
    with pytest.raises(
        InvalidArgument, match="policy for 'fs.read' must be AUTO, APPROVE or BLOCK"
    ):
        PolicyTable({"fs.read": "SOMETIMES"})


async def test_observers_see_each_successful_call_and_cannot_break_it(caplog):
    registry, _ = make()
    seen: list = []

    async def observe(call, name, arguments, data):
        seen.append((call.session_id, call.owner, name, arguments, data))

    async def broken(call, name, arguments, data):
        raise RuntimeError("observer bug")

    registry.observers += [broken, observe]
    result = await registry.call("ada/s", "ada", "fs.read", {"path": "a"})
    assert result.ok and result.data == {"done": "a"}  # the broken observer changed nothing
    assert seen == [("ada/s", "ada", "fs.read", {"path": "a"}, {"done": "a"})]
    assert "an observer of tool fs.read failed" in caplog.text
    # refused calls never reach the observers
    assert not (await registry.call("ada/s", "ada", "shell.run", {"path": "a"})).ok
    assert not (await registry.call("ada/s", "ada", "fs.read", {"path": "a" * 11})).ok
    assert len(seen) == 1


async def test_a_store_failure_reaches_the_model_without_the_databases_text(caplog):
    """Found by the crash harness's ``--fault fail`` (issue 23): a tool whose write the store
    refused came back with the driver's text ("sqlite: transaction failed: …"; on PostgreSQL
    the host and port) in its result, which the model and every watching client see. It is
    now the code and the fixed sentence HTTP and the WebSocket give; the log keeps the text.
    A request's own error (a NotFound) and an unavailable store keep theirs."""
    registry = ToolRegistry(PolicyTable(None))
    raised: list[Exception] = []

    async def failing(call, params):
        raise raised[0]

    registry.register("fs.read", Params, failing, "Read.")
    raised.append(StoreError("connection to 10.0.0.7:5432 failed: INSERT INTO memory_facts"))
    result = await registry.call("s", "ada", "fs.read", {"path": "x"})
    assert result.error == {"code": "store_error", "message": STORE_FAILED}
    assert "10.0.0.7:5432" in caplog.text  # kept in the node's log
    raised[0] = StoreUnavailable()
    result = await registry.call("s", "ada", "fs.read", {"path": "x"})
    assert result.error == {"code": "store_unavailable", "message": str(StoreUnavailable())}
    raised[0] = NotFound("no fact with key 'x'")
    result = await registry.call("s", "ada", "fs.read", {"path": "x"})
    assert result.error == {"code": "not_found", "message": "no fact with key 'x'"}
