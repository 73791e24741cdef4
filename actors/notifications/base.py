"""What the parts of ``Notifier`` share, declared once.

``Notifier`` (``actor.py``) is assembled from two mixins, the session buffer (``buffer.py``) and
the external channels (``channels.py``), that use the notifier's state. ``NotifierBase`` is the
base of both: it declares that state, which ``Notifier.__init__`` sets, and holds the per-key
lock every part takes, so that each part is type-checked against the same notifier rather than
as a fragment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from turnstile.actors.notifications.config import NotifierConfig, WebhookPost
from turnstile.runtime.clock import Clock
from turnstile.runtime.store import Store

__all__ = ["NotifierBase"]


class NotifierBase:
    """The state ``Notifier``'s parts share, and its locks. See the module docstring."""

    store: Store
    clock: Clock
    config: NotifierConfig
    ask_session: Callable[[str, Any], Awaitable[Any]]
    tell_session: Callable[[str, Any], Awaitable[Any]] | None
    webhook_post: WebhookPost | None
    _locks: dict[str, list[Any]]  # session or path -> [trio.Lock, users]
    #: Starts a background task owned by the node (``NodeContext.start_soon``; set by the
    #: feature), and how long an attach that found its session held by another node keeps
    #: trying to deliver the buffer (``SessionBufferMixin``); None: it does not.
    spawn: Callable[..., None] | None = None
    elsewhere_seconds: float = 45.0
    _retrying: set[str]  # sessions whose buffer such a task is delivering

    @asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        """A lock per session (or log path), forgotten when nobody holds or awaits it."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = [trio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[key]
