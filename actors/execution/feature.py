"""The execution feature: background tasks, approvals and ``run_parallel``, and the choice of
what the model sees per turn (``[execution]``: tool groups, profiles, compact mode).

It makes ``APPROVE`` tool calls wait for a person (the WebSocket ``approve``/``deny`` frames
and the approval endpoints), runs long calls as background tasks (``http.download`` among
them), and, once every feature has registered its tools, builds the turn shaper sessions use.
A deleted session's tasks are cancelled and its pending approvals denied.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio

from turnstile.actors.execution.approvals import ApprovalDesk
from turnstile.actors.execution.background import BackgroundActor, DropSessionTasks, StartTask
from turnstile.actors.execution.routes import execution_routes
from turnstile.actors.execution.selection import TurnShaper, register_discovery_tools
from turnstile.actors.execution.tools import register_execution_tools, register_shell_background
from turnstile.actors.feature import NodeContext
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.gateway.routes import HttpRoute

__all__ = ["ExecutionFeature"]


class ExecutionFeature:
    """``[execution]`` and ``approval_timeout_seconds``; start it after the features whose
    tools its shaper should know (``ready`` runs once all have started)."""

    name = "execution"

    def __init__(self) -> None:
        self.background: ActorRef | None = None
        self.approvals: ApprovalDesk | None = None

    async def start(self, node: NodeContext) -> None:
        tools = node.tools
        self.approvals = approvals = ApprovalDesk(
            node.tell_session, node.clock, timeout=node.config.approval_timeout_seconds
        )
        tools.approver = approvals.request
        self.background = background = await node.supervisor.spawn(
            lambda: BackgroundActor(tools.call, node.tell_session, node.clock), name="background"
        )

        async def start_background(call, tool: str, params: dict) -> dict:
            task = await background.ask(
                StartTask(
                    session_id=call.session_id,
                    owner=call.owner,
                    tool=tool,
                    params=params,
                    preapproved=True,
                    idempotency_key=call.idempotency_key,
                )
            )
            return task.view(trio.current_time())

        node.start_background = start_background
        register_execution_tools(tools, background)
        register_shell_background(tools, background)

        async def end(key: str) -> None:
            await background.ask(DropSessionTasks(session_id=key))
            approvals.drop_session(key)

        node.hooks.on_session_end.append(end)
        node.hooks.resolve_approval = approvals.resolve

    async def ready(self, node: NodeContext) -> None:
        """Every feature's tools are registered: index them and choose per turn from them."""
        register_discovery_tools(node.tools)
        node.hooks.shaper = TurnShaper(
            node.tools, node.clock, node.config.execution, node.hooks.tool_profiles
        )

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        assert self.background is not None and self.approvals is not None, "routes() after start()"
        return execution_routes(node, self.background, self.approvals)
