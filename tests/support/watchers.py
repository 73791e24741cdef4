"""Watchers as the tests drive them: ``Probe``, a fake tool (``probe.read``) whose result the
test sets, and ``watching()``, a ``node()`` with the watch tools and a watcher actor."""

from __future__ import annotations

import json
from collections import deque
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from tests.support.mock_node import node
from turnstile.actors.watchers.actor import WatcherActor
from turnstile.actors.watchers.tools import register_watch_tools, watch_runner
from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.policy import Policy, PolicyTable
from turnstile.tools.registry import ToolRegistry


class ProbeArgs(msgspec.Struct, forbid_unknown_fields=True):
    key: str = "a"


class Probe:
    """A tool whose result the test controls: ``value``, or a scripted sequence, or failure."""

    def __init__(self) -> None:
        self.value: Any = {"value": 1}
        self.fail: str | None = None
        self.script: deque = deque()  # consumed first: a value, or an Exception to raise
        self.calls: list[float] = []

    def registry(self, policies=None) -> ToolRegistry:
        registry = ToolRegistry(PolicyTable(policies))

        async def read(call, params: ProbeArgs):
            self.calls.append(trio.current_time())
            if self.script:
                step = self.script.popleft()
                if isinstance(step, Exception):
                    raise step
                return step
            if self.fail is not None:
                raise InvalidArgument(self.fail)
            return self.value

        registry.register("probe.read", ProbeArgs, read, "Read the probe.")
        registry.register("probe.write", ProbeArgs, read, "Write.", policy=Policy.BLOCK)
        registry.register("probe.ask", ProbeArgs, read, "Ask first.", policy=Policy.APPROVE)
        return registry


class Watching:
    """A node, a probe registry with the watch tools, and a watcher actor."""

    def __init__(self, n, tools, probe, ref) -> None:
        self.n, self.tools, self.probe, self.ref = n, tools, probe, ref

    async def call(self, _tool: str, session: str = "s", owner: str = "ada", **arguments):
        return await self.tools.call(session, owner, _tool, arguments)

    async def start(self, **arguments) -> str:
        arguments.setdefault("tool", "probe.read")
        result = await self.call("watch_start", **arguments)
        assert result.ok, result.error
        return result.data["watcher_id"]

    def notes(self) -> list[str]:
        """Every notification the session got: turns of their own and folded-in ones."""
        out = []
        for frame in self.n.seen.frames:
            event = json.loads(frame)
            if event["type"] == "stream_start" and event.get("source") == "notification":
                out.append(event["content"])
            elif event["type"] == "user_message" and event.get("source") == "notification":
                out.append(event["content"])
        return out

    def updates(self) -> list[dict]:
        return [json.loads(f) for f in self.n.seen.frames if b'"watcher_update"' in f]

    @property
    def actor(self) -> WatcherActor:
        return self.ref._cell.actor


@asynccontextmanager
async def watching(**actor_options):
    probe = Probe()
    tools = probe.registry()
    async with node(tools=tools) as n:
        ref = await n.sup.spawn(
            lambda: WatcherActor(watch_runner(tools), n.publish, n.store, n.clock, **actor_options),
            name="watchers",
        )
        register_watch_tools(tools, ref)
        yield Watching(n, tools, probe, ref)
        # Let pending notifications reach their sessions: a session actor first spawned while
        # the test's supervisor is stopping its children would never be stopped.
        await trio.sleep(0.1)
