"""Membership: this node's row among the nodes that share a store, its lease and heartbeat.

Several nodes may share one PostgreSQL (and, less usefully, processes one SQLite file). Each
registers at start-up (``store.register_node``): one row per node id in the ``nodes`` table,
with a new epoch at every start (strictly increasing per id), a state (``running``, then
``stopped`` on a clean shutdown) and a lease. :func:`open_membership` owns two tasks for the
node's lifetime:

* the **heartbeat** renews the lease every ``lease_seconds / 3``. On PostgreSQL the database
  clock sets and judges every lease (``now()`` in the statement), never the node's clock, so
  nodes whose clocks disagree still agree on who is alive; on SQLite the store's clock does.
  If the store answers that the row was taken over (a newer epoch of the same id: another
  process started with this id) or that the node was declared dead, the heartbeat raises
  :class:`~runtime.errors.LeaseLost`, logged as critical: the nursery cancels everything the
  node runs and the error ends ``open_membership`` (and ``turnstile serve``, with exit
  status 3). This is the foundation of fencing; it does not yet fence the writes a paused node
  makes between the moment it is declared dead and its next heartbeat (docs/cluster.md).
  A heartbeat the store does not answer is counted (``heartbeat_failures``) and retried at
  the next beat; it does not stop the node by itself: only the store can say the node lost.
* the **sweep**, every ``lease_seconds / 3`` too, asks the store to take over the work of dead
  nodes (``store.take_over_dead_nodes``): a node whose lease expired is declared dead (its row
  becomes ``stopped``, so its heartbeat can no longer renew) and the inputs it was running are
  interrupted in the same transaction; :attr:`Membership.on_takeover` (set by whoever can close
  those turns and run what waits behind them) gets them. So a dead node's running inputs are
  recovered at most one sweep interval after its lease expired, even if it never comes back.
  A node that lost touch with the store (a heartbeat failed, or renewed more than two
  intervals after the one before: a stall) declares no other node dead until it has been
  back for a whole lease: an outage of the shared store cuts every node off at once, and
  each must have the time to renew its lease before another may take it for dead (else the
  first node to sweep after an outage longer than the lease stopped all the others). Those
  sweeps are counted as deferred; a node cut off alone is declared dead as before.
  The sweep also counts the live nodes it sees, and then calls every hook in
  :attr:`Membership.after_sweep` with the cluster as it saw it: a feature whose work is
  recorded with the node incarnation doing it (a background task) closes there the work of
  incarnations that have ended (:func:`ended_by`), whoever ended them.

Which id a node takes is :func:`default_node_id`'s choice unless it is configured.

It is over 400 lines because the heartbeat, the sweep and the rules on ended incarnations
(:func:`ended_by`, :func:`owner_of`) read the same row and lease: together they are the one
definition of which node is alive.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import trio

from turnstile.runtime.errors import LeaseLost, StoreError
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.store import ClusterView, InboxItem, NodeRecord, NodeRef, Store, TakeOver

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "SQLITE_NODE_ID",
    "Membership",
    "SweepHook",
    "default_node_id",
    "ended_by",
    "open_membership",
    "owner_of",
]

log = logging.getLogger("turnstile.membership")

#: A node's lease unless configured (``[node] lease_seconds``): it heartbeats every third of it,
#: and a node that stops heartbeating is dead for everyone this long after its last beat.
DEFAULT_LEASE_SECONDS = 15.0
#: The id of a node on SQLite unless configured: one SQLite file is one node's store, so every
#: start is a new epoch of the same node, and recovers everything the previous one left running.
SQLITE_NODE_ID = "local"
#: How long a clean shutdown may spend marking the node stopped.
_STOP_TIMEOUT = 5.0
#: How long closing the turns a sweep took over may go on once the node is stopping.
_TAKEOVER_GRACE = 10.0

#: What ``on_takeover`` is: given what a sweep took over (the inputs it interrupted, and their
#: sessions it leased meanwhile), closes their turns and releases those sessions.
TakeoverHandler = Callable[[TakeOver], Awaitable[None]]
#: What an ``after_sweep`` hook is: given the cluster as a sweep saw it (after declaring the
#: expired nodes dead), closes the work of ended incarnations (:func:`ended_by`).
SweepHook = Callable[[ClusterView], Awaitable[None]]


def default_node_id(backend: str, *, port: int | None) -> str:
    """The node id when ``[node] id`` is not set.

    * SQLite: :data:`SQLITE_NODE_ID` (``"local"``): one node per file.
    * PostgreSQL, serving on a fixed port: ``<host name>:<port>``, stable across restarts on
      the same host and port, so a restarted node recovers its own earlier epoch's work at
      once; two nodes on one host differ by their port.
    * PostgreSQL otherwise (port 0, or not serving): ``<host name>-<8 random hex digits>``, new
      at every start; what an earlier start left running is recovered once its lease expires.
      Set ``[node] id`` to have a stable one.
    """
    if backend == "sqlite":
        return SQLITE_NODE_ID
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip(".-_")[:100] or "node"
    if port:
        return f"{host}:{port}"
    return f"{host}-{secrets.token_hex(4)}"


class Membership:
    """A registered node: its current row and the state of its heartbeat and sweep.

    Made by :func:`open_membership`; see the module docstring.

    Attributes:
        record: the node's row as of the last registration or heartbeat.
        lease_seconds: the length of its lease.
        live_nodes: how many live nodes (this one included) the last sweep saw.
        live_ids: the ids of the live nodes taking work (running, not draining), sorted (this
            one's alone until the first sweep).
        draining: a graceful stop has begun (:meth:`drain`): this node owns nothing new.
        heartbeat_failures: heartbeats the store did not answer, since start-up.
        settled_at: when (trio's clock) this node may declare other nodes dead again, after
            it lost touch with the store (``-inf``: it never did).
        on_takeover: gets the inputs each sweep interrupted (a dead node's running inputs);
            None until the node can close their turns: the sweep takes nothing over until
            then.
        lost: the :class:`LeaseLost` that ended the node, if one did.
        after_sweep: called after every sweep, in order, with the :class:`ClusterView` it
            read (the nodes it declared dead show as ``stopped``). Each runs shielded for at
            most ``_TAKEOVER_GRACE`` seconds; what it raises is logged and ends nothing. A hook
            that needs more time or talks to sessions should hand the view to a task of its
            own.
    """

    def __init__(
        self,
        store: Store,
        record: NodeRecord,
        lease_seconds: float,
        metrics: Metrics | None,
        beat_store: Store | None = None,
    ) -> None:
        self.store = store
        #: where heartbeats go: a store of their own (its own connections) keeps them from
        #: queueing behind the node's work when the pool is busy, which would lose the lease
        self.beat_store = beat_store if beat_store is not None else store
        self.record = record
        self.lease_seconds = lease_seconds
        self.live_nodes = 1
        self.live_ids: tuple[str, ...] = (record.id,)
        self.draining = False
        self.heartbeat_failures = 0
        self.settled_at = -math.inf
        #: a heartbeat failed and none succeeded since: out of touch with the store
        self._out_of_touch = False
        self.on_takeover: TakeoverHandler | None = None
        self.after_sweep: list[SweepHook] = []
        self.lost: LeaseLost | None = None
        self._metrics = metrics if metrics is not None else Metrics()
        metrics = self._metrics
        metrics.gauge("turnstile_node_epoch", lambda: self.record.epoch, "This node's epoch.")
        metrics.gauge(
            "turnstile_nodes_live", lambda: self.live_nodes, "Nodes alive at the last sweep."
        )
        for name, help in (  # present from the start, at 0
            ("turnstile_node_heartbeat_failures_total", "Heartbeats that failed."),
            ("turnstile_node_sweeps_total", "Dead-node sweeps run."),
            (
                "turnstile_node_sweeps_deferred_total",
                "Sweeps that declared no node dead: this node was back in touch with the"
                " store for less than a lease.",
            ),
            ("turnstile_nodes_declared_dead_total", "Nodes this node declared dead."),
            ("turnstile_inputs_taken_over_total", "Cut-off inputs taken over from dead nodes."),
        ):
            metrics.counter(name, help)

    @property
    def ref(self) -> NodeRef:
        """This incarnation: the node id and its current epoch."""
        return self.record.ref

    def owns(self, key: str) -> bool:
        """Whether this node is the one of the live nodes that owns ``key`` (rendezvous
        hashing over :attr:`live_ids`: every node that saw the same live nodes agrees, and a
        node joining or leaving moves only the keys it gains or had). Work that must be done
        once but needs no lease (which node fires a job, runs a watcher) is split this way;
        during a change of membership two nodes may briefly both think they own a key, so the
        work itself must stay safe to do twice (a compare-and-set)."""
        if self.draining or not self.live_ids:
            return False
        return owner_of(key, self.live_ids) == self.record.id

    async def drain(self) -> None:
        """Begin a graceful stop: the node's row says ``draining`` (other nodes stop giving it
        work at their next sweep), and from now on it owns nothing (:meth:`owns`)."""
        self.draining = True
        self.live_ids = tuple(i for i in self.live_ids if i != self.record.id)
        try:
            await self.store.drain_node(self.ref)
        except StoreError as exc:  # its peers still learn it when it stops
            log.warning("node %r: marking itself draining failed: %s", self.record.id, exc)

    @property
    def interval(self) -> float:
        """Seconds between two heartbeats (and two sweeps): a third of the lease."""
        return self.lease_seconds / 3

    async def advertise(self, address: str) -> None:
        """Record where the node can be reached (its gateway's URL), with a heartbeat now.

        Raises:
            LeaseLost: the node was taken over meanwhile.
        """
        self.record = await self._renew(address)

    async def _renew(self, address: str | None = None) -> NodeRecord:
        try:
            record = await self.beat_store.heartbeat_node(
                self.ref, lease_seconds=self.lease_seconds, address=address
            )
        except LeaseLost as exc:
            self.lost = exc
            log.critical("%s: this node stops serving now", exc)
            raise
        # By the store's clock: a renewal this late after the one before means the store
        # stalled (no heartbeat failed, they waited).
        gap = (record.heartbeat_at - self.record.heartbeat_at).total_seconds()
        if self._out_of_touch or gap > 2 * self.interval:
            self._out_of_touch = False
            self.settled_at = trio.current_time() + self.lease_seconds
            log.warning(
                "node %r: the store answers again; this node declares no other node dead for"
                " %g s (a lease), so that every node the outage cut off renews its lease first",
                self.record.id,
                self.lease_seconds,
            )
        return record

    async def heartbeats(self) -> None:
        """Renew the lease every :attr:`interval`, forever; raises ``LeaseLost`` when the store
        says the node may no longer serve."""
        while True:
            await trio.sleep(self.interval)
            try:
                self.record = await self._renew()
            except LeaseLost:
                raise
            except StoreError as exc:
                self._out_of_touch = True
                self.heartbeat_failures += 1
                self._metrics.inc("turnstile_node_heartbeat_failures_total")
                log.error(
                    "node %r epoch %d: heartbeat failed (%s); the lease runs out at %s unless"
                    " a later one succeeds",
                    self.record.id,
                    self.record.epoch,
                    exc,
                    self.record.lease_expires_at.isoformat(),
                )

    async def sweeps(self) -> None:
        """Every :attr:`interval`, forever: take over what dead nodes were running (once
        :attr:`on_takeover` is set) and count the live nodes."""
        while True:
            await trio.sleep(self.interval)
            try:
                await self.sweep()
            except StoreError as exc:
                log.error("node %r: sweep for dead nodes failed: %s", self.record.id, exc)

    @property
    def settled(self) -> bool:
        """Whether this node may declare other nodes dead: it has been in touch with the store
        for a lease at least (see the module docstring)."""
        return not self._out_of_touch and trio.current_time() >= self.settled_at

    async def sweep(self) -> None:
        """One sweep (see :meth:`sweeps`)."""
        # back from an outage for less than a lease: nobody is declared dead this time
        deferred = self.on_takeover is not None and not self.settled
        if self.on_takeover is not None and not deferred:
            taken = await self.store.take_over_dead_nodes(self.ref)
            for dead in taken.nodes:
                log.warning(
                    "node %r epoch %d is dead (its lease expired at %s): declared stopped, its"
                    " work moves",
                    dead.id,
                    dead.epoch,
                    dead.lease_expires_at.isoformat(),
                )
            self._metrics.inc("turnstile_nodes_declared_dead_total", len(taken.nodes))
            if taken.inputs:
                self._metrics.inc("turnstile_inputs_taken_over_total", len(taken.inputs))
                log.warning(
                    "node %r took over %d running input(s) of dead nodes: %s",
                    self.record.id,
                    len(taken.inputs),
                    ", ".join(
                        f"{item.id} (session {item.session_id}, claimed by {_claimer(item)})"
                        for item in taken.inputs
                    ),
                )
                # The inputs are interrupted already: their closure must not be cut in half
                # by a shutdown that begins meanwhile, nor end the node if it fails.
                with trio.move_on_after(_TAKEOVER_GRACE, shield=True):
                    try:
                        await self.on_takeover(taken)
                    except Exception:
                        log.exception(
                            "node %r: closing the turns it took over failed (the inputs stay"
                            " interrupted)",
                            self.record.id,
                        )
        view = await self.store.list_nodes()
        self.live_nodes = len(view.live)
        ids = {node.id for node in view.live if node.state == "running"}
        if not self.draining:
            ids.add(self.record.id)  # a sweep that ran late still counts this node
        else:
            ids.discard(self.record.id)
        self.live_ids = tuple(sorted(ids))
        self._metrics.inc("turnstile_node_sweeps_total")
        if deferred:
            self._metrics.inc("turnstile_node_sweeps_deferred_total")
        for hook in list(self.after_sweep):
            with trio.move_on_after(_TAKEOVER_GRACE, shield=True):
                try:
                    await hook(view)
                except Exception:
                    log.exception("node %r: a sweep hook failed", self.record.id)


def ended_by(view: ClusterView, ref: NodeRef) -> NodeRecord | None:
    """The row of ``view`` showing that incarnation ``ref`` has ended for good, or None while
    it may still be live.

    An incarnation has ended when its node has a newer epoch (it started again, or another
    process took its id over) or its epoch is ``stopped`` (a clean shutdown, or declared dead
    by a sweep): the same rule that decides whether an input's claim is live. Neither ever
    comes back, so the answer holds however old ``view`` is; a node ``view`` does not list
    (it registered after ``view`` was read) has not ended. An epoch whose lease merely
    expired has not ended either until a sweep declares it dead: until then it renews
    normally, and its work stays its own.
    """
    for node in view.nodes:
        if node.id == ref.id:
            if node.epoch > ref.epoch or (node.epoch == ref.epoch and node.state == "stopped"):
                return node
            return None
    return None


def owner_of(key: str, nodes: Sequence[str]) -> str:
    """The node of ``nodes`` that owns ``key``: the highest ``blake2b(node, key)`` (rendezvous
    hashing)."""

    def weight(node: str) -> bytes:
        return hashlib.blake2b(f"{node}\x00{key}".encode(), digest_size=8).digest()

    return max(nodes, key=weight)


def _claimer(item: InboxItem) -> str:
    claimed = item.claimed_by
    return "no node" if claimed is None else f"{claimed.id!r} epoch {claimed.epoch}"


@asynccontextmanager
async def open_membership(
    store: Store,
    node_id: str,
    *,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    address: str | None = None,
    metrics: Metrics | None = None,
    private: bool = False,
    beat_store: Store | None = None,
) -> AsyncIterator[Membership]:
    """Register ``node_id`` with a new epoch and hold its lease for the ``async with`` block.

    The store stamps every input it claims meanwhile with this incarnation
    (``store.claimer``). The heartbeat and the sweep run in a nursery this opens around the
    block; a clean exit marks the node ``stopped`` (dead for everyone at once, so another node
    may take whatever it left running).

    Args:
        private: no other process can open this store (in-memory SQLite): there is nobody to
            keep a lease for or to take work over from, so neither the heartbeat nor the sweep
            runs (the node still registers, and its claims are stamped).
        beat_store: the same database opened apart, for the heartbeats alone (PostgreSQL: a
            pool busy with fires and turns must not hold a heartbeat back past the lease).

    Raises:
        LeaseLost: from the block, when the heartbeat found the node taken over or declared
            dead; everything in the block was cancelled first. The node is not marked
            stopped then: its row is no longer its own.
        InvalidArgument: a malformed ``node_id``.
    """
    record, previous = await store.register_node(
        node_id, lease_seconds=lease_seconds, address=address
    )
    if previous is not None and previous.alive:
        log.warning(
            "node %r: epoch %d was still alive (lease until %s); epoch %d takes over. If"
            " another process runs with this node id, it stops serving at its next heartbeat",
            node_id,
            previous.epoch,
            previous.lease_expires_at.isoformat(),
            record.epoch,
        )
    log.info(
        "node %r registered with epoch %d (lease %g s, heartbeat every %g s)",
        node_id,
        record.epoch,
        lease_seconds,
        lease_seconds / 3,
    )
    membership = Membership(store, record, lease_seconds, metrics, beat_store)
    store.claimer = membership.ref
    try:
        async with trio.open_nursery() as nursery:
            if not private:
                nursery.start_soon(membership.heartbeats, name=f"heartbeat of node {node_id}")
                nursery.start_soon(membership.sweeps, name=f"dead-node sweep of node {node_id}")
            try:
                yield membership
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The heartbeat's LeaseLost (the block was cancelled for it): raised as itself, so
        # that the caller sees why the node stopped rather than a group around it.
        lost, rest = group.split(LeaseLost)
        if lost is None or rest is not None or membership.lost is None:
            raise
        raise membership.lost from None
    finally:
        store.claimer = None
        if membership.lost is None:
            with trio.move_on_after(_STOP_TIMEOUT, shield=True):
                try:
                    await store.stop_node(membership.ref)
                except StoreError as exc:
                    log.error("node %r: could not mark itself stopped: %s", node_id, exc)
