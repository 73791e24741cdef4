"""The rows the store hands out, as immutable msgspec Structs.

Every time is an aware UTC ``datetime``; every JSON payload is a ``dict``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

__all__ = [
    "INPUT_STATES",
    "FINAL_INPUT_STATES",
    "Session",
    "InboxItem",
    "Enqueued",
    "EventRecord",
    "MigrationRecord",
    "NODE_STATES",
    "NodeRef",
    "NodeRecord",
    "ClusterView",
    "TakeOver",
    "SessionLease",
]

#: Every state an inbox item can be in: ``queued -> running -> done | failed | interrupted``;
#: recovery may move an ``interrupted`` one back to ``queued`` to run its turn again.
INPUT_STATES = ("queued", "running", "done", "failed", "interrupted")
#: The states ``finish_input`` may move a running input to.
FINAL_INPUT_STATES = ("done", "failed", "interrupted")
#: Every state a node's row can be in (``draining`` is reserved for the graceful drain, which
#: nothing sets yet).
NODE_STATES = ("running", "draining", "stopped")


class NodeRef(msgspec.Struct, frozen=True):
    """One incarnation of a node: its id and the epoch it registered with at start-up.

    An input claimed by a node records its ``NodeRef``; the claim is live exactly as long as
    that epoch is the node's current one and the node is not ``stopped``.
    """

    id: str
    epoch: int


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """One agent session.

    Attributes:
        id: caller-supplied id.
        owner: the user the session belongs to.
        metadata: free-form JSON object.
        policy: what to do with input that arrives mid-turn (default ``"enqueue"``).
        created_at: when the session was created.
        updated_at: when the row last changed (including appends to its event log).
        last_seq: seq of the last event appended, 0 when the log is empty.
    """

    id: str
    owner: str
    metadata: dict[str, Any]
    policy: str
    created_at: datetime
    updated_at: datetime
    last_seq: int


class InboxItem(msgspec.Struct, frozen=True, kw_only=True):
    """One durable turn input in a session's inbox.

    Attributes:
        id: monotonic integer assigned by the store.
        session_id: the session it belongs to.
        source: where it came from (``"user"``, ``"cron"``, ...).
        payload: the input itself.
        state: one of :data:`INPUT_STATES`.
        created_at: when it was enqueued.
        updated_at: when its state last changed.
        detail: what ``finish_input`` recorded (an error, a summary), or None.
        idempotency_key: the key it was enqueued under (``enqueue_keyed``), unique in its
            session, or None.
        claimed_by: the node (id and epoch) that last claimed it to run, or None (never
            claimed, or claimed through a store no node had registered with).
    """

    id: int
    session_id: str
    source: str
    payload: dict[str, Any]
    state: str
    created_at: datetime
    updated_at: datetime
    detail: dict[str, Any] | None = None
    idempotency_key: str | None = None
    claimed_by: NodeRef | None = None


class Enqueued(msgspec.Struct, frozen=True, kw_only=True):
    """What ``enqueue_keyed`` answers: the input stored under the key, and whether this call
    stored it (False: an earlier call with the same key did, and nothing was written)."""

    item: InboxItem
    created: bool


class EventRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a session's event log; ``seq`` is gap-free per session, from 1."""

    session_id: str
    seq: int
    type: str
    payload: dict[str, Any]
    ts: datetime


class MigrationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``schema_migrations``: step ``version`` of the migration set ``set_name``."""

    version: int
    name: str
    applied_at: datetime
    set_name: str = "kernel"


class NodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of ``nodes``: a node sharing the store, as of one read.

    Attributes:
        id: the node's id (``[node] id``, or the one it chose: see ``runtime.membership``).
        epoch: its current incarnation; a new, higher one at every start.
        state: one of :data:`NODE_STATES`.
        address: where it says it can be reached, or None.
        started_at: when this epoch registered.
        heartbeat_at: its last renewal.
        lease_expires_at: when it is dead for everyone unless it renews first.
        alive: not stopped and its lease not expired, by the store's clock when it was read
            (the database's on PostgreSQL).
    """

    id: str
    epoch: int
    state: str
    address: str | None
    started_at: datetime
    heartbeat_at: datetime
    lease_expires_at: datetime
    alive: bool

    @property
    def ref(self) -> NodeRef:
        return NodeRef(self.id, self.epoch)


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    """What ``list_nodes`` answers: every node's row, and the time they were judged at (the
    database clock on PostgreSQL, the store's clock on SQLite)."""

    now: datetime
    nodes: list[NodeRecord]

    @property
    def live(self) -> list[NodeRecord]:
        return [node for node in self.nodes if node.alive]


class TakeOver(msgspec.Struct, frozen=True, kw_only=True):
    """What ``take_over_dead_nodes`` did, in one transaction.

    Attributes:
        nodes: the nodes it declared dead (their lease had expired; now ``stopped``).
        inputs: the running inputs it moved to ``interrupted``, by id: those claimed by an
            epoch that is not current and running any more (a dead node's, or an earlier
            incarnation of a node's), and, when asked, those no node claimed.
        leases: the sessions of those inputs that no live node held, leased to the asking
            node in the same transaction (session id → lease epoch): no other node starts a
            turn of them until it has closed the cut-off turns and released them.
    """

    nodes: list[NodeRecord]
    inputs: list[InboxItem]
    leases: dict[str, int] = {}


class SessionLease(msgspec.Struct, frozen=True, kw_only=True):
    """What ``acquire_session`` answered.

    Attributes:
        session_id: the session.
        fence: the lease epoch this node now holds: every fenced write of the activation
            carries it. None when the lease is held by another live node (below).
        holder: with ``fence``, the node that held the lease before (None: nobody, or it was
            released); without, the live node that holds it.
        holder_epoch: that node's epoch.
        holder_address: where that node can be reached, when it said (``nodes.address``).
        holder_live: whether that node was live when asked (with ``fence``: True only when
            the lease was already this node's).
        interrupted: with ``fence``: the session's running inputs claimed by a node that is
            not live, moved to ``interrupted`` in the same transaction; the new holder closes
            their turns before it starts one.
    """

    session_id: str
    fence: int | None
    holder: str | None = None
    holder_epoch: int | None = None
    holder_address: str | None = None
    holder_live: bool = False
    interrupted: list[InboxItem] = []

    @property
    def acquired(self) -> bool:
        return self.fence is not None
