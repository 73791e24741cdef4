"""Stand-ins a session actor talks to: ``NoTools`` (a tool caller with no tools) and
``Recorder`` (a subscriber that keeps every frame and can fall behind on purpose)."""

from __future__ import annotations

import trio

from turnstile.actors.sessions.agents.base import ToolResult


class NoTools:
    def specs(self):
        return []

    async def call(self, session_id, owner, name, arguments, *, idempotency_key=None):
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
