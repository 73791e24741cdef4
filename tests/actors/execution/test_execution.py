"""run_parallel and background tasks on trio's MockClock, with real session injection."""

from __future__ import annotations

import json
from typing import Annotated

import msgspec
import pytest
import trio
import trio.testing

from tests.support.mock_node import DAY, node
from turnstile.actors.execution.background import BackgroundActor
from turnstile.actors.execution.tools import register_execution_tools
from turnstile.actors.sessions.actor import Submit
from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.policy import Policy, PolicyTable
from turnstile.tools.registry import ToolRegistry


class Nap(msgspec.Struct, forbid_unknown_fields=True):
    seconds: Annotated[float, msgspec.Meta(ge=0, le=10_000)]
    fail: bool = False
    big: bool = False


def tools_with_naps(policies=None) -> ToolRegistry:
    registry = ToolRegistry(PolicyTable(policies))

    async def nap(call, params: Nap):
        await trio.sleep(params.seconds)
        if params.fail:
            raise InvalidArgument("woke up grumpy")
        return {"slept": params.seconds, "pad": "x" * 3000 if params.big else ""}

    registry.register("slow.nap", Nap, nap, "Sleep.")
    registry.register("slow.guarded", Nap, nap, "Sleep, if allowed.", policy=Policy.BLOCK)
    return registry


class Running:
    def __init__(self, policies=None, max_running: int = 20) -> None:
        self.tools = tools_with_naps(policies)
        self.max_running = max_running

    async def __aenter__(self):
        self._node = node(tools=self.tools)
        n = await self._node.__aenter__()
        background = await n.sup.spawn(
            lambda: BackgroundActor(
                self.tools.call, n.publish, n.clock, max_running_per_session=self.max_running
            ),
            name="background",
        )
        self.background = background
        register_execution_tools(self.tools, background)

        async def call(tool, **arguments):
            return await self.tools.call("s", "ada", tool, arguments)

        return n, call

    async def __aexit__(self, *exc):
        return await self._node.__aexit__(*exc)


async def test_run_parallel_takes_as_long_as_the_slowest_and_keeps_order(autojump_clock):
    async with Running() as (n, call):
        start = trio.current_time()
        result = await call(
            "run_parallel",
            actions=[
                {"name": "slow.nap", "params": {"seconds": 3}},
                {"name": "slow.nap", "params": {"seconds": 1, "fail": True}},
                {"name": "slow.guarded", "params": {"seconds": 1}},
                {"name": "slow.nap", "params": {"seconds": 2}},
            ],
        )
        assert trio.current_time() - start == 3  # not 6: they ran at once
        data = result.data
        assert (data["total"], data["succeeded"], data["failed"]) == (4, 2, 2)
        assert [r["index"] for r in data["results"]] == [0, 1, 2, 3]
        assert data["results"][0]["data"]["slept"] == 3
        assert data["results"][1]["error"]["message"] == "woke up grumpy"  # independent failure
        assert data["results"][2]["error"]["code"] == "blocked"  # policy still applies


class Probe(msgspec.Struct, forbid_unknown_fields=True):
    tag: str = ""


@pytest.mark.guard(DAY)
async def test_the_call_s_idempotency_key_reaches_the_actions_it_runs(autojump_clock):
    """run_parallel's actions get the call's key with their place in the list (they run at
    once, so not their start order); a background task's call gets the key that started it."""
    running = Running()
    seen: dict[str, str | None] = {}

    async def probe(call, params: Probe):
        seen[params.tag] = call.idempotency_key
        return {}

    running.tools.register("probe.key", Probe, probe, "Record the call's key.")
    async with running as (n, call):
        key = "turnstile-0123456789abcdef0123456789abcdef"
        actions = [{"name": "probe.key", "params": {"tag": t}} for t in ("a", "b", "c")]
        done = await running.tools.call(
            "s", "ada", "run_parallel", {"actions": actions}, idempotency_key=key
        )
        assert done.data["succeeded"] == 3
        assert seen == {"a": f"{key}.1", "b": f"{key}.2", "c": f"{key}.3"}
        started = await running.tools.call(
            "s",
            "ada",
            "background_run",
            {"name": "probe.key", "params": {"tag": "bg"}},
            idempotency_key=key,
        )
        await call("background_wait", task_id=started.data["task_id"])
        assert seen["bg"] == key
        await call("run_parallel", actions=[{"name": "probe.key", "params": {"tag": "none"}}])
        assert seen["none"] is None  # not in a turn: no key to pass on
        await n.seen.until(b'"stream_end"')  # the task's completion turn


async def test_run_parallel_answers_at_once_for_an_action_that_needs_approval(autojump_clock):
    """An APPROVE action in run_parallel is not put to a person: it comes back at once, not run,
    as requires_approval, and the others run (the whole call waited for the approval before)."""
    running = Running(policies={"slow.write": "APPROVE"})
    asked: list[str] = []

    async def approver(call, name, arguments):
        asked.append(name)
        await trio.sleep_forever()  # nobody answers

    async def write(call, params: Nap):
        raise AssertionError("an action that needs approval ran")

    running.tools.register("slow.write", Nap, write, "Write.")
    running.tools.approver = approver
    async with running as (n, call):
        start = trio.current_time()
        result = await call(
            "run_parallel",
            actions=[
                {"name": "slow.nap", "params": {"seconds": 2}},
                {"name": "slow.write", "params": {"seconds": 0}},
                {"name": "slow.guarded", "params": {"seconds": 0}},
            ],
        )
        assert trio.current_time() - start == 2  # the slowest action, not an approval's wait
        assert asked == []
        assert result.ok, result.error
        assert result.data == {
            "total": 3,
            "succeeded": 1,
            "failed": 1,
            "requires_approval": 1,
            "results": [
                {"index": 0, "name": "slow.nap", "success": True, "data": {"slept": 2, "pad": ""}},
                {
                    "index": 1,
                    "name": "slow.write",
                    "success": False,
                    "requires_approval": True,
                    "error": {
                        "code": "requires_approval",
                        "message": "slow.write needs approval, which run_parallel does not ask "
                        "for: call it on its own and the user is asked",
                    },
                },
                {
                    "index": 2,
                    "name": "slow.guarded",
                    "success": False,
                    "error": {"code": "blocked", "message": "slow.guarded is blocked by policy"},
                },
            ],
        }
        # called on its own, the same action is put to a person
        with trio.move_on_after(60):
            await call("slow.write", seconds=0)
        assert asked == ["slow.write"]


async def test_run_parallel_bounds_and_no_nesting(autojump_clock):
    async with Running() as (n, call):
        too_many = await call("run_parallel", actions=[{"name": "slow.nap"}] * 51)
        assert too_many.error["code"] == "bad_arguments"
        nested = await call("run_parallel", actions=[{"name": "run_parallel"}])
        assert nested.error["message"] == "run_parallel cannot run inside run_parallel"


@pytest.mark.guard(DAY)
async def test_a_background_task_notifies_an_idle_session_with_a_turn(autojump_clock):
    async with Running() as (n, call):
        started = (await call("background_run", name="slow.nap", params={"seconds": 30})).data
        assert started["status"] == "running" and started["task_id"].startswith("bg-")
        status = (await call("background_status", task_id=started["task_id"])).data
        assert status["status"] == "running"
        await n.seen.until(b'"stream_end"')
        (start,) = n.starts()
        assert start["source"] == "notification"
        head = f"task_id={started['task_id']}, tool=slow.nap, elapsed=30.0s"
        assert start["content"].startswith(f"[BACKGROUND TASK COMPLETED] {head}")
        done = (await call("background_result", task_id=started["task_id"])).data
        assert done["result"] == {"success": True, "data": {"slept": 30, "pad": ""}}


@pytest.mark.guard(DAY)
async def test_completions_fold_into_the_running_turn_batched(autojump_clock):
    async with Running() as (n, call):
        await n.registry.ref("session:s").ask(Submit(content="wait:turn"))
        await n.seen.until(b'"stream_start"')
        for seconds in (5, 5):
            await call("background_run", name="slow.nap", params={"seconds": seconds})
        await call("background_run", name="slow.nap", params={"seconds": 5, "fail": True})
        await trio.sleep(10)
        n.agent.gate("wait:turn").set()
        await n.seen.until(b'"stream_end"')
        folded = [json.loads(f) for f in n.seen.frames if b'"user_message"' in f]
        assert len(folded) == 1  # three finished together: one notification
        text = folded[0]["content"]
        assert text.count("[BACKGROUND TASK COMPLETED]") == 2
        assert "[BACKGROUND TASK FAILED]" in text and "Error: woke up grumpy" in text
        assert n.ends()[0]["text"].startswith("reply:wait:turn +[BACKGROUND TASK")


@pytest.mark.guard(DAY)
async def test_wait_cancel_list_and_truncation(autojump_clock):
    async with Running() as (n, call):
        long = (await call("background_run", name="slow.nap", params={"seconds": 500})).data
        waited = (await call("background_wait", task_id=long["task_id"], timeout=10)).data
        assert waited["status"] == "running" and waited["note"].startswith("Timeout reached")
        assert (await call("background_cancel", task_id=long["task_id"])).data["cancelled"]
        big = await call("background_run", name="slow.nap", params={"seconds": 1, "big": True})
        waited = (await call("background_wait", task_id=big.data["task_id"])).data
        assert waited["status"] == "completed"
        listed = (await call("background_list")).data
        assert (listed["total"], listed["cancelled"], listed["completed"]) == (2, 1, 1)
        await n.seen.until(b'"stream_end"', 2)
        contents = [s["content"] for s in n.starts()]
        assert any(c.startswith("[BACKGROUND TASK CANCELLED]") for c in contents)
        (truncated,) = [c for c in contents if "truncated" in c]
        assert f'Use background_result(task_id="{big.data["task_id"]}")' in truncated


async def test_another_sessions_task_is_not_found(autojump_clock):
    runner = Running()
    async with runner as (n, call):
        started = (await call("background_run", name="slow.nap", params={"seconds": 1})).data
        theirs = await runner.tools.call(
            "other", "bob", "background_status", {"task_id": started["task_id"]}
        )
        assert theirs.error == {
            "code": "not_found",
            "message": f"no background task with id {started['task_id']!r}",
        }


async def test_a_session_at_its_running_limit_gets_limit_exceeded(autojump_clock):
    """``[limits] max_background_tasks_per_session``: a start past it is a typed error for the
    model, nothing runs; another session has its own; a task that ends makes room."""
    runner = Running(max_running=2)
    async with runner as (n, call):
        for seconds in (10, 20):
            assert (await call("background_run", name="slow.nap", params={"seconds": seconds})).ok
        refused = await call("background_run", name="slow.nap", params={"seconds": 1})
        assert refused.error == {
            "code": "limit_exceeded",
            "message": "session has 2 background tasks running (limit 2)",
        }
        listed = (await call("background_list")).data
        assert len(listed["tasks"]) == 2
        theirs = await runner.tools.call(
            "other", "bob", "background_run", {"name": "slow.nap", "params": {"seconds": 1}}
        )
        assert theirs.ok
        await trio.sleep(11)
        assert (await call("background_run", name="slow.nap", params={"seconds": 1})).ok


async def test_shell_background_run_is_refused_while_shell_is_blocked_and_runs_when_open(
    tmp_path,
):
    # A real clock: a real subprocess runs, and a mock clock would jump while it does.
    from turnstile.actors.execution.tools import register_shell_background
    from turnstile.tools.modules.filesystem import FilesystemConfig, register_filesystem_module
    from turnstile.tools.modules.shell import ShellConfig, register_shell_module

    for policies, expect_ok in ((None, False), ({"shell.*": "AUTO"}, True)):
        runner = Running(policies)
        fs = register_filesystem_module(runner.tools, FilesystemConfig(root=str(tmp_path)))
        register_shell_module(runner.tools, ShellConfig(), fs.sandbox)
        async with runner as (n, call):
            register_shell_background(runner.tools, runner.background)
            started = await call("shell.background_run", command=["echo", "hi"])
            assert started.ok is expect_ok, started
            if expect_ok:
                waited = await call("background_wait", task_id=started.data["task_id"])
                assert waited.data["result"]["data"]["stdout"] == "hi\n"
            else:
                assert started.error["message"] == "shell.run is blocked by policy"
