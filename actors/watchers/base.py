"""What the parts of ``WatcherActor`` share, declared once.

``WatcherActor`` (``actor.py``) is assembled from three mixins (``cluster.py``,
``escalation.py``, ``persistence.py``) that use the actor's state and one another's methods.
``WatcherBase`` is the base of all of them: it declares that state, which
``WatcherActor.__init__`` sets, and the methods one part calls on another, so that each part is
checked against the same actor rather than as a fragment, and a part whose method no longer fits
what another part calls fails the type check. It adds nothing at run time but ``_Outbox``, a
record of that state (declared here, not in ``escalation.py`` which fills it, so that this module
imports none of the parts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from turnstile.actors.watchers.events import WatcherUpdate
from turnstile.actors.watchers.state import Watcher
from turnstile.runtime.actor import Actor
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import LimitExceeded
from turnstile.runtime.store import Store

__all__ = ["WatcherBase", "WatcherShare"]


class _Outbox:
    """A session's escalations waiting to be sent together (``escalation.py``)."""

    __slots__ = ("events", "texts", "ids", "trace")

    def __init__(self) -> None:
        self.events: list[WatcherUpdate] = []
        self.texts: list[str] = []
        self.ids: list[str] = []
        #: the span of the first check that escalated into the batch (W3C headers:
        #: ``traceparent``, ``tracestate``; None when the node does not trace): the
        #: notification's turn continues that trace
        self.trace: dict[str, str] | None = None


class WatcherShare(Protocol):
    """Several nodes on one store: which watchers this node checks (``runtime.membership``'s
    ``Membership``)."""

    live_ids: tuple[str, ...]

    @property
    def interval(self) -> float:
        """How often to look at the live set and the requests (a third of the lease)."""
        ...

    @property
    def ref(self) -> Any:
        """This node (its ``id``)."""
        ...

    def owns(self, key: str) -> bool:
        """Whether this node checks the watcher ``key``."""
        ...


class WatcherBase(Actor):
    """The state and the cross-part methods of ``WatcherActor``. See the module docstring."""

    share: WatcherShare | None
    store: Store
    clock: Clock
    publish: Callable[[str, Any], Awaitable[None]]
    notify: Callable[..., Awaitable[Any]] | None
    persist_interval: float
    #: watchers one session may have (``[watchers] max_per_session``)
    max_per_session: int
    watchers: dict[str, Watcher]
    stats: dict[str, int]
    _outbox: dict[str, _Outbox]
    _dirty: set[str]
    _dirty_chunks: set[tuple[str, int]]
    _dirty_event: trio.Event
    _write_lock: trio.Lock

    @property
    def _tasks(self) -> trio.Nursery:
        """The incarnation's nursery (``uses_nursery``), there while the actor runs."""
        nursery = self.nursery
        if nursery is None:
            raise RuntimeError("the watcher actor is not running")
        return nursery

    def _full(self, count: int) -> LimitExceeded:
        """The error for a session that has ``count`` watchers, the limit or more."""
        return LimitExceeded(
            f"session already has {count} watchers (limit {self.max_per_session}); "
            "stop one with watch_stop first",
            field="watcher",
        )

    if TYPE_CHECKING:
        # actor.py
        def _add(self, watcher: Watcher) -> None: ...
        def _schedule(self, watcher: Watcher, delay: float) -> None: ...
        def _forget(self, watcher: Watcher) -> None: ...
        async def _pause(self, watcher: Watcher) -> dict[str, Any]: ...
        async def _resume(self, watcher: Watcher) -> dict[str, Any]: ...
        async def _stop(self, watchers: list[Watcher], announce: bool = True) -> None: ...

        # persistence.py
        async def _read_all(
            self,
        ) -> tuple[dict[str, dict[str, Any]], dict[str, list[list[Any]]]]: ...
        def _restore(
            self, wid: str, state: dict[str, Any], entries: Sequence[list[Any]]
        ) -> Watcher | None: ...
        def _mark(self, w: Watcher, chunk: int | None = None) -> None: ...
        async def _write_out(self, watchers: list[Watcher], still_held: bool = False) -> None: ...
        async def _gone_sessions(self, session_ids: set[Any]) -> set[str]: ...
