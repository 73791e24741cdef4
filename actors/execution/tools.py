"""Execution primitives: ``run_parallel`` and ``background_*`` (as in the execution-primitives
reference).

``run_parallel`` runs 1–50 tool calls at once; each is independent (one failing does not cancel
the others), results come back in input order, and every call goes through the registry — its
policy and its module's concurrency limit apply exactly as for a direct call, except that an
``APPROVE`` action is not put to a person: it comes back at once, not run, as
``requires_approval`` (as in the reference: the call never waits on a person, and the model calls
that action on its own to ask). ``BLOCK`` is refused. Total time is about the slowest action.

The ``background_*`` tools drive the background actor (``actors.execution.background``): start
a tool and get a ``task_id`` at once, then status, result, cancel, list, or wait (timeout
default 60 s, at most 3,600 s). The session is notified automatically when a task ends. A task
another node runs (or ran) is read from the store: status, result, list and wait work through
any node; only the node running a task can cancel it (elsewhere ``cancelled`` is false).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

import msgspec
import trio

from turnstile.actors.execution.background import CancelTask, GetTask, ListTasks, StartTask
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = ["register_execution_tools", "register_shell_background", "PRIMITIVES"]

#: How often ``background_wait`` looks at the store for a task another node runs.
STORED_WAIT_POLL = 1.0

ToolName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
TaskId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]

#: Primitives that may not be nested inside run_parallel or background_run.
PRIMITIVES = frozenset(
    {
        "run_parallel",
        "background_run",
        "background_status",
        "background_result",
        "background_cancel",
        "background_list",
        "background_wait",
    }
)


class Action(msgspec.Struct, forbid_unknown_fields=True):
    """One action of ``run_parallel``."""

    name: ToolName
    params: dict[str, Any] = msgspec.field(default_factory=dict)


class RunParallel(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of ``run_parallel``."""

    actions: Annotated[list[Action], msgspec.Meta(min_length=1, max_length=50)]


class BackgroundRun(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of ``background_run``."""

    name: ToolName
    params: dict[str, Any] = msgspec.field(default_factory=dict)


class TaskRef(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments naming one background task."""

    task_id: TaskId


class Wait(msgspec.Struct, forbid_unknown_fields=True):
    """Arguments of ``background_wait``."""

    task_id: TaskId
    timeout: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0


class NoArgs(msgspec.Struct, forbid_unknown_fields=True):
    """No arguments."""


def _refuse_nesting(name: str, where: str) -> None:
    if name in PRIMITIVES:
        raise InvalidArgument(f"{name} cannot run inside {where}", field="name")


#: ``async (session key, tool names) -> the names among them the session's model is not told
#: of`` (``[execution] watchers = false`` …; the execution feature's).
HiddenNames = Callable[[str, Sequence[str]], Awaitable[frozenset[str]]]


def _unknown(name: str) -> dict[str, str]:
    """What a name that is no tool answers (``ToolRegistry.call``)."""
    return {"code": "unknown_tool", "message": f"no tool named {name!r}"}


def register_execution_tools(
    registry: ToolRegistry, background: ActorRef, hidden: HiddenNames | None = None
) -> None:
    """Register ``run_parallel`` and the ``background_*`` tools (composite: they run others).

    ``hidden``: tools of a group turned off for the session are answered as no tool at all,
    as ``tool_run`` does (the model is not told of them).
    """
    registry.composite |= PRIMITIVES

    async def hidden_among(call: ToolCall, names: Sequence[str]) -> frozenset[str]:
        return frozenset() if hidden is None else await hidden(call.session_id, names)

    async def run_parallel(call: ToolCall, args: RunParallel) -> dict[str, Any]:
        for action in args.actions:
            _refuse_nesting(action.name, "run_parallel")
        results: list[dict[str, Any] | None] = [None] * len(args.actions)
        unseen = await hidden_among(call, [action.name for action in args.actions])

        async def one(index: int, action: Action) -> None:
            if action.name in unseen:
                results[index] = {
                    "index": index,
                    "name": action.name,
                    "success": False,
                    "error": _unknown(action.name),
                }
                return
            # Each action's key is the run_parallel call's, by the action's place in the list
            # (not by when it starts: the actions run at once).
            key = None if call.idempotency_key is None else f"{call.idempotency_key}.{index + 1}"
            outcome = await registry.call(
                call.session_id,
                call.owner,
                action.name,
                action.params,
                ask_approval=False,
                idempotency_key=key,
            )
            entry: dict[str, Any] = {"index": index, "name": action.name, "success": outcome.ok}
            if outcome.ok:
                entry["data"] = outcome.data
            elif outcome.error and outcome.error.get("code") == "requires_approval":
                entry["requires_approval"] = True
                entry["error"] = {
                    "code": "requires_approval",
                    "message": f"{action.name} needs approval, which run_parallel does not ask "
                    "for: call it on its own and the user is asked",
                }
            else:
                entry["error"] = outcome.error
            results[index] = entry

        async with trio.open_nursery() as nursery:
            for index, action in enumerate(args.actions):
                nursery.start_soon(one, index, action)
        succeeded = sum(1 for r in results if r and r["success"])
        pending = sum(1 for r in results if r and r.get("requires_approval"))
        summary: dict[str, Any] = {
            "total": len(results),
            "succeeded": succeeded,
            "failed": len(results) - succeeded - pending,
        }
        if pending:
            summary["requires_approval"] = pending
        return {**summary, "results": results}

    async def background_run(call: ToolCall, args: BackgroundRun) -> dict[str, Any]:
        _refuse_nesting(args.name, "background_run")
        if args.name not in registry.names() or await hidden_among(call, [args.name]):
            raise InvalidArgument(f"no tool named {args.name!r}", field="name")
        task = await background.ask(
            StartTask(
                session_id=call.session_id,
                owner=call.owner,
                tool=args.name,
                params=args.params,
                idempotency_key=call.idempotency_key,
            )
        )
        return task.view(trio.current_time())

    async def get(call: ToolCall, task_id: str):
        return await background.ask(GetTask(session_id=call.session_id, task_id=task_id))

    async def background_status(call: ToolCall, args: TaskRef) -> dict[str, Any]:
        return (await get(call, args.task_id)).view(trio.current_time())

    def finished_view(task) -> dict[str, Any]:
        out: dict[str, Any] = {"task_id": task.id, "status": task.status}
        if task.status == "running":
            out["note"] = "Task is still running. Use background_wait or check back later."
        elif task.result is not None:
            out["result"] = (
                {"success": True, "data": task.result.data}
                if task.result.ok
                else {"success": False, "error": task.result.error}
            )
        return out

    async def background_result(call: ToolCall, args: TaskRef) -> dict[str, Any]:
        return finished_view(await get(call, args.task_id))

    async def background_cancel(call: ToolCall, args: TaskRef) -> dict[str, Any]:
        cancelled = await background.ask(
            CancelTask(session_id=call.session_id, task_id=args.task_id)
        )
        return {"task_id": args.task_id, "cancelled": cancelled}

    async def background_list(call: ToolCall, args: NoArgs) -> dict[str, Any]:
        tasks = await background.ask(ListTasks(session_id=call.session_id))
        now = trio.current_time()
        views = [t.view(now) for t in tasks]
        counts: dict[str, int] = {}
        for view in views:
            counts[view["status"]] = counts.get(view["status"], 0) + 1
        return {"tasks": views, "total": len(views), **counts}

    async def background_wait(call: ToolCall, args: Wait) -> dict[str, Any]:
        task = await get(call, args.task_id)
        with trio.move_on_after(args.timeout):  # waits here, never in the actor's mailbox
            while task.stored and task.status == "running":  # another node runs it
                await trio.sleep(STORED_WAIT_POLL)
                task = await get(call, args.task_id)
            await task.done.wait()
        out = finished_view(task)
        if task.status == "running":
            out["note"] = "Timeout reached. Task is still running."
        return out

    registry.register(
        "run_parallel",
        RunParallel,
        run_parallel,
        "Run 1-50 tool calls at once; independent failures; results in input order.",
    )
    registry.register(
        "background_run",
        BackgroundRun,
        background_run,
        "Start a tool in the background; you are notified automatically when it ends.",
    )
    registry.register("background_status", TaskRef, background_status, "A task's status.")
    registry.register(
        "background_result", TaskRef, background_result, "A finished task's full result."
    )
    registry.register("background_cancel", TaskRef, background_cancel, "Cancel a running task.")
    registry.register("background_list", NoArgs, background_list, "This session's tasks.")
    registry.register(
        "background_wait",
        Wait,
        background_wait,
        "Wait for a task to end (timeout default 60 s, at most 3600 s).",
    )


def register_shell_background(registry: ToolRegistry, background: ActorRef) -> None:
    """``shell.background_run``: ``shell.run`` as a background task (notified when it ends).

    It starts nothing when ``shell.run`` is blocked; otherwise the task's own ``shell.run`` call
    applies the policy (so an APPROVE policy asks once, not twice).
    """
    from turnstile.tools.modules.shell import RunParams
    from turnstile.tools.policy import Policy

    async def background_shell(call: ToolCall, params: RunParams) -> dict[str, Any]:
        if registry.policy_of("shell.run") is Policy.BLOCK:
            raise InvalidArgument("shell.run is blocked by policy", field="name")
        task = await background.ask(
            StartTask(
                session_id=call.session_id,
                owner=call.owner,
                tool="shell.run",
                params=msgspec.to_builtins(params),
                idempotency_key=call.idempotency_key,
            )
        )
        return task.view(trio.current_time())

    registry.register(
        "shell.background_run",
        RunParams,
        background_shell,
        "Run a command in the background (like shell.run); you are notified when it ends.",
    )
