"""The execution feature: background tasks, approvals and ``run_parallel``, and the choice of
what the model sees per turn (``[execution]``: tool groups, profiles, compact mode).

It makes ``APPROVE`` tool calls wait for a person (the WebSocket ``approve``/``deny`` frames
and the approval endpoints), runs long calls as background tasks (``http.download`` among
them), and, once every feature has registered its tools, builds the turn shaper sessions use.
A deleted session's tasks are cancelled and its pending approvals denied.

It owns the ``background_tasks`` table (the ``background`` migration set,
``background_schema.py``): every background task is recorded there with the node incarnation
running it, so any node can read it, and the tasks of an incarnation that ended before them are
closed as lost and their sessions told (``LostTasks``): once the node is open (what an earlier
start of this node left running) and, with several nodes, after every membership sweep
(``Membership.after_sweep``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from turnstile.actors.execution.approvals import ApprovalDesk
from turnstile.actors.execution.background import (
    BackgroundActor,
    DropSessionTasks,
    LostTasks,
    StartTask,
)
from turnstile.actors.execution.background_schema import BACKGROUND
from turnstile.actors.execution.routes import execution_routes
from turnstile.actors.execution.schema import EXECUTION
from turnstile.actors.execution.selection import (
    TurnShaper,
    may_be_hidden,
    register_discovery_tools,
)
from turnstile.actors.execution.settings import ExecutionConfig
from turnstile.actors.execution.tools import register_execution_tools, register_shell_background
from turnstile.actors.feature import NodeContext
from turnstile.actors.sessions.actor import ShapedTurn
from turnstile.actors.sessions.agents.base import HistoryEntry, TurnInput
from turnstile.actors.sessions.history import unified_history
from turnstile.runtime.actor import ActorRef
from turnstile.runtime.errors import InvalidArgument, NotFound, PlacedElsewhere, StoreError
from turnstile.runtime.gateway.routes import HttpRoute
from turnstile.runtime.store import ClusterView
from turnstile.tools.spec import tool_name

__all__ = ["ExecutionFeature"]

log = logging.getLogger("turnstile.background")


class ExecutionFeature:
    """``[execution]`` and ``approval_timeout_seconds``. Its turn shaper knows every tool: it
    is built in ``ready``, once every feature's ``start`` has registered its own."""

    name = "execution"
    needs: tuple[str, ...] = ("sessions",)
    after: tuple[str, ...] = ()
    migrations = [BACKGROUND, EXECUTION]

    def __init__(self) -> None:
        self.background: ActorRef | None = None
        self.approvals: ApprovalDesk | None = None
        self.lost: LostTasks | None = None
        self.shaper = _ShaperOnceReady()
        self._node: NodeContext | None = None
        self._passes: trio.MemoryReceiveChannel[ClusterView | None] | None = None

    async def start(self, node: NodeContext) -> None:
        tools = node.tools
        self.approvals = approvals = ApprovalDesk(
            node.tell_session,
            node.clock,
            timeout=node.config.approval_timeout_seconds,
            store=node.store,
            shared=node.placement is not None,
        )
        tools.approver = approvals.request

        async def tell(key: str, notice: Any) -> None:
            # asked where the session lives here, so that it is stored before the task is
            # marked told; told through the store where another node holds it
            try:
                await node.ask_session(key, notice)
            except PlacedElsewhere:
                await node.tell_session(key, notice)

        self.background = background = await node.supervisor.spawn(
            lambda: BackgroundActor(
                tools.call,
                tell,
                node.clock,
                max_running_per_session=node.config.limits.max_background_tasks_per_session,
                store=node.store,
                node=lambda: node.store.claimer,
            ),
            name="background",
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
        self._node = node
        register_execution_tools(tools, background, hidden=self._hidden_names)
        register_shell_background(tools, background)

        async def end(key: str) -> None:
            await background.ask(DropSessionTasks(session_id=key))
            await approvals.drop_session(key)

        node.hooks.on_session_end.append(end)
        node.hooks.resolve_approval = approvals.answer
        node.hooks.approval_heard = approvals.poke
        node.hooks.shaper = self.shaper  # what it stands for is built in ``ready``
        if node.section("execution", ExecutionConfig).unified_session:
            keep = node.config.limits.history_entries

            async def unified(owner: str, key: str, input_id: int) -> list[HistoryEntry]:
                return await unified_history(node.store, owner, key, input_id, keep)

            node.hooks.turn_history = unified

        self.lost = LostTasks(node.store, node.clock, tell)
        sweeps: trio.MemorySendChannel[ClusterView | None]
        sweeps, passes = trio.open_memory_channel(math.inf)
        sweeps.send_nowait(None)  # the start-up pass: what an earlier start left running
        if node.membership is not None:

            async def after_sweep(view: ClusterView) -> None:
                sweeps.send_nowait(view)  # the pass runs in the node's task, not the sweep's

            node.membership.after_sweep.append(after_sweep)  # (passes wait for ``open``)
        self._passes = passes

    async def open(self, node: NodeContext) -> None:
        """Close what ended incarnations left (the start-up pass), then after every sweep."""
        assert self._passes is not None, "open() after start()"
        node.start_soon(self._close_lost, node, self._passes, name="lost background tasks")

    async def _close_lost(
        self, node: NodeContext, passes: trio.MemoryReceiveChannel[ClusterView | None]
    ) -> None:
        """Once the node is open, and after every sweep: close the tasks of ended
        incarnations as lost and tell their sessions (``LostTasks``), and withdraw the
        approvals their calls waited for (``ApprovalDesk.drop_lost``). Views that queued up
        while a pass ran are taken together: the newest says all they did."""
        assert self.lost is not None and self.approvals is not None
        async for view in passes:
            while True:
                try:
                    view = passes.receive_nowait()
                except trio.WouldBlock:
                    break
            with trio.move_on_after(10, shield=True):  # a pass is not cut in half by a stop
                try:
                    if view is None:
                        view = await node.store.list_nodes()
                    await self.lost.close(view)
                    await self.approvals.drop_lost(view)  # the calls waiting on them are gone
                except StoreError as exc:
                    log.warning(
                        "closing lost background tasks and approvals failed (next sweep): %s", exc
                    )

    async def _hidden(self, session_key: str) -> frozenset[str]:
        """The tools the session's model is not told of (its groups turned off)."""
        shaper, node = self.shaper.shaper, self._node
        if shaper is None or node is None:  # before ready: no turn runs yet
            return frozenset()
        try:
            session = await node.store.get_session(session_key)
        except NotFound:  # a client's call for no session: the node's settings
            return shaper.hidden_for({})
        return shaper.hidden_for(session.metadata, session.owner)

    async def _hidden_names(self, session_key: str, names: Sequence[str]) -> frozenset[str]:
        """Those of ``names`` the session's model is not told of (run_parallel's actions,
        background_run's tool); the store is read only when one may be."""
        if not may_be_hidden(names) and not (self._node and self._node.tools.hiders):
            return frozenset()
        hidden = await self._hidden(session_key)
        return frozenset(name for name in names if {name, tool_name(name)} & hidden)

    async def ready(self, node: NodeContext) -> None:
        """Every feature's tools are registered: index them and choose per turn from them."""
        register_discovery_tools(node.tools, self._hidden)
        settings = node.section("execution", ExecutionConfig)
        self.shaper.shaper = shaper = TurnShaper(
            node.tools, node.clock, settings, node.hooks.tool_profiles
        )
        channel = settings.default_channel
        if channel and node.check_channel is not None:
            try:
                node.check_channel(channel)
            except InvalidArgument as exc:  # UnknownChannel lists the configured ones
                raise InvalidArgument(str(exc), field="$.execution.default_channel") from None
        node.default_channel = lambda metadata: shaper.settings_for(metadata).default_channel

    def routes(self, node: NodeContext) -> Sequence[HttpRoute]:
        assert self.background is not None and self.approvals is not None, "routes() after start()"
        return execution_routes(node, self.background, self.approvals)


class _ShaperOnceReady:
    """``SessionHooks.shaper`` from execution's ``start`` on, standing for the ``TurnShaper``
    its ``ready`` builds. The sessions feature takes the hook in its own ``ready``, which runs
    first (every feature needs sessions, so they start first), while the shaper can only be
    built once every feature's ``start`` has registered its tools and tool profiles. No turn
    runs before every feature is ready (``open_node``), so ``shape`` always finds it."""

    def __init__(self) -> None:
        self.shaper: TurnShaper | None = None

    def shape(
        self,
        metadata: Mapping[str, Any],
        turn_input: TurnInput,
        history: list[HistoryEntry],
        allowed: frozenset[str] | None,
        owner: str | None = None,
    ) -> ShapedTurn:
        """``TurnShaper.shape``."""
        if self.shaper is None:
            raise RuntimeError("a turn was shaped before ExecutionFeature.ready built the shaper")
        return self.shaper.shape(metadata, turn_input, history, allowed, owner)
