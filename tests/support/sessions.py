"""Stand-ins a session actor talks to: ``NoTools`` (a tool caller with no tools),
``Recorder`` (a subscriber that keeps every frame and can fall behind on purpose), ``StoreWith``
(the real store with some methods made to misbehave), and ``session_actors`` (a registry of
session actors over a store)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from turnstile.actors.sessions.actor import SessionActor, SessionLimits, SessionServices
from turnstile.actors.sessions.agents.base import ToolResult
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.supervisor import open_supervisor


class NoTools:
    def specs(self):
        return []

    async def call(self, session_id, owner, name, arguments, *, idempotency_key=None, call_id=None):
        return ToolResult(ok=False, error={"code": "unknown_tool", "message": name})


class Recorder:
    """A subscriber that records event types and can refuse (a client fallen behind)."""

    def __init__(self, accept: int = 10**9) -> None:
        self.frames: list[bytes] = []
        self.accept = accept
        self.lagged_at: int | None = None
        self._arrived = trio.Event()
        #: set when the session says it was deleted
        self.deleted_event = trio.Event()

    def offer(self, session_id, seq, frame) -> bool:
        if len(self.frames) >= self.accept:
            return False
        self.frames.append(frame)
        self._arrived.set()
        return True

    def count(self, needle: bytes) -> int:
        return sum(needle in frame for frame in self.frames)

    async def until(self, needle: bytes, n: int = 1) -> None:
        """Wait until ``n`` received frames contain ``needle``."""
        while self.count(needle) < n:
            self._arrived = trio.Event()
            await self._arrived.wait()

    def lagged(self, session_id, last_seq) -> None:
        self.lagged_at = last_seq

    def deleted(self, session_id) -> None:
        self.deleted_event.set()


class StoreWith:
    """The real store with some of its methods replaced, to make the store misbehave where a
    test needs it: ``StoreWith(store, append_events=refuse)`` calls ``await refuse(real, *args,
    **kwargs)`` (``real`` the store's own method) for every ``append_events``; every other
    attribute is the store's."""

    def __init__(self, store: Any, **overrides: Callable[..., Awaitable[Any]]) -> None:
        self._store = store
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        override = self._overrides.get(name)
        return attr if override is None else functools.partial(override, attr)


@asynccontextmanager
async def session_actors(store: Any, agent: Any = None) -> AsyncIterator[Registry]:
    """A registry of session actors (``session:<key>``) over ``store`` (the real one, or a
    ``StoreWith``), with ``agent`` (a ``GatedAgent`` unless given) and no tools."""
    from tests.support.agents import GatedAgent

    services = SessionServices(
        store=store,
        agent=agent if agent is not None else GatedAgent(),
        tools=NoTools(),
        limits=SessionLimits(),
        encode_event=encode_event,
    )
    async with open_supervisor("sessions", escalate=False) as sup:
        registry = Registry(sup, idle_timeout=30.0)
        registry.register("session", lambda key: SessionActor(key, services))
        yield registry
