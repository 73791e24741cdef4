"""Placement for several nodes on one store: an address lives where its lease is.

The registry asks a ``Placement`` before it activates an address (``runtime.registry``). On
one node there is nothing to ask. With several nodes on one PostgreSQL, :class:`LeasePlacement`
makes an activation here hold the lease of the row it stands for (``Store.acquire_session``):

* **claim**: the lease is acquired unless another *live* node holds it (its current epoch, not
  stopped, lease unexpired by the database clock); then ``PlacedElsewhere`` names that node
  and its address, and nothing is activated here. A lease whose holder is not live any more
  (its node crashed, or was paused past its lease) moves here, and the session's turns cut off
  there are interrupted in the same transaction; before the activation starts, ``on_moved``
  closes them, so the session's log shows them closed before a new turn starts here.
* **fence**: every acquisition gets a lease epoch one higher than the last. The activation's
  writes carry it (``fence(address)``) and the store refuses them once it is not the row's
  any more (``Fenced``): a node that resumes after its sessions moved can write nothing.
* **released**: when the activation ends the lease is given up in the background, so the
  next message may activate the address on any node at once instead of after a lease time.

Which addresses are placed is the caller's choice (``key_of``): the kernel names no kind.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager

import trio

from turnstile.runtime.errors import NotFound, PlacedElsewhere, StoreError
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.store import InboxItem, NodeRef, Store

__all__ = ["LeasePlacement"]

log = logging.getLogger(__name__)

#: releases waiting to be written; beyond it a release is dropped (the lease then ends with
#: its node's lease, or at the next acquisition by this node, which needs no release)
_RELEASE_QUEUE = 10_000


class LeasePlacement:
    """Activates an address here only while this node holds its row's lease.

    Args:
        store: where the leases are.
        node: this node's incarnation (``Membership.ref``), read at every claim.
        key_of: the row an address stands for (``session:42`` → ``42``), or None for an
            address that is not placed (activated here without asking).
        metrics: counts acquisitions, refusals, moves and fencing refusals.
        on_moved: awaited with the session's inputs that were cut off on a node that is not
            live (interrupted by the acquisition), before the activation starts: it closes
            their turns, so that the session's log shows them closed before a new one.
    """

    def __init__(
        self,
        store: Store,
        node: Callable[[], NodeRef],
        key_of: Callable[[str], str | None],
        *,
        metrics: Metrics | None = None,
        on_moved: Callable[[list[InboxItem]], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self._node = node
        self._key_of = key_of
        self._fences: dict[str, int] = {}
        self.on_moved = on_moved
        #: a graceful stop has begun: nothing more is activated here
        self.draining = False
        #: sessions a sweep of this node leased to close their cut-off turns: an activation
        #: here waits until they are closed (the lease is this node's, so the store would not
        #: stop it)
        self._closing: dict[str, trio.Event] = {}
        self._send, self._receive = trio.open_memory_channel[tuple[str, int]](_RELEASE_QUEUE)
        self._metrics = metrics if metrics is not None else Metrics()
        for name in (  # present from the start, at 0
            "turnstile_leases_acquired_total",  # session leases acquired by this node
            "turnstile_leases_refused_total",  # activations refused: another node holds it
            "turnstile_leases_moved_total",  # leases taken from a node that was not live
            "turnstile_leases_released_total",  # handed over: free for any node to take
            "turnstile_fencing_refusals_total",  # writes refused: the lease had moved on
        ):
            self._metrics.inc(name, 0)
        self._metrics.gauge("turnstile_leases_held", lambda: len(self._fences))

    def fence(self, address: str) -> int | None:
        """The lease epoch the activation of ``address`` holds (None: not placed)."""
        return self._fences.get(address)

    def fenced(self) -> None:
        """Count a write the store refused because the lease had moved (``Fenced``)."""
        self._metrics.inc("turnstile_fencing_refusals_total")

    async def claim(self, address: str) -> None:
        """Acquire ``address``'s lease for an activation here.

        Raises:
            PlacedElsewhere: a live node holds it (names that node and its address), or this
                node is draining (names none).
        """
        key = self._key_of(address)
        if key is None:
            return
        if self.draining:  # the other nodes take it (through the store, meanwhile)
            self._metrics.inc("turnstile_leases_refused_total")
            raise PlacedElsewhere(address)
        while (closing := self._closing.get(key)) is not None:
            await closing.wait()
        me = self._node()
        try:
            lease = await self.store.acquire_session(key, me)
        except NotFound:
            return  # no row: the activation finds that out itself (and writes nothing)
        if lease.fence is None:
            self._metrics.inc("turnstile_leases_refused_total")
            raise PlacedElsewhere(address, lease.holder, lease.holder_address)
        self._fences[address] = lease.fence
        self._metrics.inc("turnstile_leases_acquired_total")
        mine = (lease.holder, lease.holder_epoch) == (me.id, me.epoch)
        if lease.holder is not None and not mine and not lease.holder_live:
            self._metrics.inc("turnstile_leases_moved_total")
            log.warning(
                "%s moved here from node %r epoch %s, which is not live",
                address,
                lease.holder,
                lease.holder_epoch,
            )
        if lease.interrupted and self.on_moved is not None:
            await self.on_moved(lease.interrupted)

    @asynccontextmanager
    async def closing(self, keys: Iterable[str]) -> AsyncIterator[None]:
        """Hold activations of ``keys`` here back for the block: a sweep closing the turns a
        dead node left in them (their leases are this node's meanwhile)."""
        events = {key: trio.Event() for key in keys if key not in self._closing}
        self._closing.update(events)
        try:
            yield
        finally:
            for key, event in events.items():
                del self._closing[key]
                event.set()

    def released(self, address: str) -> None:
        """The activation of ``address`` ended: give its lease up in the background."""
        fence = self._fences.pop(address, None)
        key = self._key_of(address)
        if fence is None or key is None:
            return
        try:
            self._send.send_nowait((key, fence))
        except trio.WouldBlock:
            log.warning("release of %s dropped: too many waiting", address)

    async def run(self) -> None:
        """Write the releases, forever (a task of the node's nursery)."""
        async for key, fence in self._receive:
            try:
                if await self.store.release_session(key, fence):
                    self._metrics.inc("turnstile_leases_released_total")
            except StoreError as exc:  # the lease then ends with the node's, or is re-taken
                log.warning("release of session %r failed: %s", key, exc)
