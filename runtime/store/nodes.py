"""The nodes sharing the store: membership, and the recovery of dead nodes' work.

``runtime.membership`` drives these. Every lease decision is taken by the database clock on
PostgreSQL (``now()`` in the statement), never by a node's own clock: the ``now`` and
``expires`` arguments the front computes from the store's clock are for SQLite (one SQLite
file has one clock, the writer's) and unused there.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

from turnstile.runtime.errors import LeaseLost
from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase, ts
from turnstile.runtime.store.inbox import input_record
from turnstile.runtime.store.records import ClusterView, NodeRecord, NodeRef, TakeOver

__all__ = ["NodeMethods", "node_record"]


def node_record(row: Any) -> NodeRecord:
    """A ``nodes`` row (with its ``alive`` column) as a :class:`NodeRecord`."""
    return NodeRecord(
        id=row["id"],
        epoch=row["epoch"],
        state=row["state"],
        address=row["address"],
        started_at=ts(row["started_at"]),
        heartbeat_at=ts(row["heartbeat_at"]),
        lease_expires_at=ts(row["lease_expires_at"]),
        alive=bool(row["alive"]),
    )


#: A node's row and whether it is alive, by the store's clock (SQLite) or the database's.
_ROW_SQLITE = "*, state <> 'stopped' AND lease_expires_at > :now AS alive"
_ROW_PG = "*, state <> 'stopped' AND lease_expires_at > now() AS alive"
_LEASE_END_PG = "now() + make_interval(secs => :lease)"

_PREVIOUS_SQLITE = ops.Statement(
    f"SELECT {_ROW_SQLITE} FROM nodes WHERE id = :id", params=("id", "now")
)
_PREVIOUS_PG = ops.Statement(f"SELECT {_ROW_PG} FROM nodes WHERE id = :id FOR UPDATE")
_REGISTER = (
    "INSERT INTO nodes (id, epoch, state, address, started_at, heartbeat_at,"
    " lease_expires_at) VALUES (:id, 1, 'running', :address, {now}, {now}, {expires})"
    " ON CONFLICT (id) DO UPDATE SET epoch = nodes.epoch + 1, state = 'running',"
    " address = excluded.address, started_at = excluded.started_at,"
    " heartbeat_at = excluded.heartbeat_at, lease_expires_at = excluded.lease_expires_at"
    " RETURNING {row}"
)
_REGISTER_SQLITE = ops.Statement(
    _REGISTER.format(now=":now", expires=":expires", row=_ROW_SQLITE),
    params=("id", "address", "now", "expires"),
)
_REGISTER_PG = ops.Statement(
    _REGISTER.format(now="now()", expires=_LEASE_END_PG, row=_ROW_PG),
    params=("id", "address", "lease"),
)


def _register_sqlite(
    conn: sqlite3.Connection, id: str, address: str | None, lease: float, now: str, expires: str
) -> Any:
    previous = conn.execute(_PREVIOUS_SQLITE.sqlite, (id, now)).fetchone()
    row = conn.execute(_REGISTER_SQLITE.sqlite, (id, address, now, expires)).fetchone()
    return row, previous


async def _register_postgres(
    conn: Any, id: str, address: str | None, lease: float, now: Any, expires: Any
) -> Any:
    async with conn.transaction():
        previous = await conn.fetchrow(_PREVIOUS_PG.postgres, id)
        row = await conn.fetchrow(_REGISTER_PG.postgres, id, address, lease)
    return row, previous


def _registered(answer: tuple[Any, Any]) -> tuple[NodeRecord, NodeRecord | None]:
    row, previous = answer
    return node_record(row), None if previous is None else node_record(previous)


#: ``(id, address, lease, now, expires) -> (row with its new epoch, the row before | None)``.
REGISTER_NODE = ops.procedure(
    "register_node",
    sqlite=_register_sqlite,
    postgres=_register_postgres,
    decode=_registered,
    writes=True,
)
_HEARTBEAT = (
    "UPDATE nodes SET heartbeat_at = {now}, lease_expires_at = {expires},"
    " address = coalesce(:address, address)"
    " WHERE id = :id AND epoch = :epoch AND state <> 'stopped' RETURNING {row}"
)
#: ``(id, epoch, lease, address, now, expires)``: None unless that epoch is current and not
#: stopped.
HEARTBEAT_NODE = ops.row(
    "heartbeat_node",
    sqlite=_HEARTBEAT.format(now=":now", expires=":expires", row=_ROW_SQLITE),
    postgres=_HEARTBEAT.format(now="now()", expires=_LEASE_END_PG, row=_ROW_PG),
    decode=node_record,
    writes=True,
)
#: ``(id, epoch)``: False unless that epoch was current and running.
DRAIN_NODE = ops.found(
    "drain_node",
    "UPDATE nodes SET state = 'draining' WHERE id = :id AND epoch = :epoch"
    " AND state = 'running' RETURNING 1",
    writes=True,
)
_STOP = (
    "UPDATE nodes SET state = 'stopped', heartbeat_at = {now},"
    " lease_expires_at = {least}(lease_expires_at, {now})"
    " WHERE id = :id AND epoch = :epoch AND state <> 'stopped' RETURNING 1"
)
#: ``(id, epoch, now)``: False when that epoch was not current or already stopped.
STOP_NODE = ops.found(
    "stop_node",
    sqlite=_STOP.format(now=":now", least="min"),
    postgres=_STOP.format(now="now()", least="least"),
    writes=True,
)
#: ``(id, now)``: the row with ``alive``, or None.
GET_NODE = ops.row(
    "get_node",
    sqlite=f"SELECT {_ROW_SQLITE} FROM nodes WHERE id = :id",
    postgres=f"SELECT {_ROW_PG} FROM nodes WHERE id = :id",
    decode=node_record,
)
_NODES_SQLITE = ops.Statement(f"SELECT {_ROW_SQLITE} FROM nodes ORDER BY id")
_NODES_PG = ops.Statement(f"SELECT {_ROW_PG} FROM nodes ORDER BY id")


def _list_sqlite(conn: sqlite3.Connection, now: str) -> tuple[str, list[Any]]:
    return now, conn.execute(_NODES_SQLITE.sqlite, (now,)).fetchall()


async def _list_postgres(conn: Any, now: Any) -> tuple[Any, list[Any]]:
    async with conn.transaction():  # one transaction: one now() for the rows and the answer
        db_now = await conn.fetchval("SELECT now()")
        rows = await conn.fetch(_NODES_PG.postgres)
    return db_now, rows


def _view(answer: tuple[Any, list[Any]]) -> ClusterView:
    now, rows = answer
    return ClusterView(now=ts(now), nodes=[node_record(r) for r in rows])


#: ``(now)``: every row by id, judged alive at one instant.
LIST_NODES = ops.procedure("list_nodes", sqlite=_list_sqlite, postgres=_list_postgres, decode=_view)


# -- taking over dead nodes' work ---------------------------------------------------------------
# First the nodes whose lease expired become ``stopped`` (their heartbeat can no longer renew:
# they stop serving); the row lock orders this against a concurrent heartbeat, which either
# renewed first (then the lease is live again and the node is left alone) or finds the row
# stopped. Then every running input whose claimer is not a current, non-stopped epoch is
# interrupted: its turn was cut off. The sessions of the cut-off inputs are locked first (in id
# order, as an acquisition locks its one session before its inputs), and the ones no live node
# holds are leased to this node in the same transaction: no other node starts a turn of them
# before this one has closed the cut-off turn and released them (``release_session``).

_DEAD = (
    "UPDATE nodes SET state = 'stopped' WHERE state <> 'stopped'"
    " AND lease_expires_at <= {now} AND id <> :node RETURNING *, {false} AS alive"
)
_DEAD_SQLITE = ops.Statement(_DEAD.format(now=":now", false="0"), params=("now", "node"))
_DEAD_PG = ops.Statement(_DEAD.format(now="now()", false="false"))
#: A running input whose claim is not live (with ``unclaimed``, one without a claimer too).
_CUT_OFF = (
    "state = 'running' AND CASE WHEN claimed_by IS NULL THEN :unclaimed::boolean"
    " ELSE NOT (claimed_by = :node AND claimed_epoch = :epoch) AND NOT EXISTS ("
    " SELECT 1 FROM nodes n WHERE n.id = inbox.claimed_by"
    " AND n.epoch = inbox.claimed_epoch AND n.state <> 'stopped') END"
)
_TAKE_ARGS = ("now", "node", "epoch", "unclaimed")
_LOCK_CUT_OFF = ops.Statement(
    # (the time is not needed here; typed so that the statement prepares)
    "SELECT 1 FROM sessions WHERE :now::timestamptz IS NOT NULL AND id IN ("
    f"SELECT session_id FROM inbox WHERE {_CUT_OFF}) ORDER BY id FOR UPDATE",
    params=_TAKE_ARGS,
)
_INTERRUPT_CUT_OFF = ops.Statement(
    f"UPDATE inbox SET state = 'interrupted', updated_at = :now WHERE {_CUT_OFF} RETURNING *",
    params=_TAKE_ARGS,
)
_LEASE_CUT_OFF_SQLITE = ops.Statement(
    "UPDATE sessions SET lease_node = :node, lease_node_epoch = :epoch,"
    " lease_epoch = lease_epoch + 1 WHERE id = :session_id AND NOT EXISTS ("
    " SELECT 1 FROM nodes n WHERE n.id = sessions.lease_node"
    " AND n.epoch = sessions.lease_node_epoch AND n.state <> 'stopped'"
    " AND n.lease_expires_at > :now) RETURNING id, lease_epoch",
    params=("node", "epoch", "session_id", "now"),
)
_LEASE_CUT_OFF_PG = ops.Statement(
    "UPDATE sessions s SET lease_node = :node, lease_node_epoch = :epoch,"
    " lease_epoch = s.lease_epoch + 1 WHERE s.id = ANY(:session_ids::text[]) AND NOT EXISTS ("
    " SELECT 1 FROM nodes n WHERE n.id = s.lease_node AND n.epoch = s.lease_node_epoch"
    " AND n.state <> 'stopped' AND n.lease_expires_at > now())"
    " RETURNING s.id, s.lease_epoch"
)


def _take_over_sqlite(
    conn: sqlite3.Connection, node: str, epoch: int, unclaimed: bool, now: str
) -> Any:
    # one transaction at a time here (the writer's), so nothing interleaves
    dead = conn.execute(_DEAD_SQLITE.sqlite, (now, node)).fetchall()
    cut_off = (now, node, epoch, unclaimed)
    items = conn.execute(_INTERRUPT_CUT_OFF.sqlite, cut_off).fetchall()
    leases = []
    for session_id in sorted({r["session_id"] for r in items}):
        leased = conn.execute(
            _LEASE_CUT_OFF_SQLITE.sqlite, (node, epoch, session_id, now)
        ).fetchone()
        if leased is not None:
            leases.append(leased)
    return dead, items, leases


async def _take_over_postgres(conn: Any, node: str, epoch: int, unclaimed: bool, now: Any) -> Any:
    async with conn.transaction():
        dead = await conn.fetch(_DEAD_PG.postgres, node)
        await conn.execute(_LOCK_CUT_OFF.postgres, now, node, epoch, unclaimed)
        items = await conn.fetch(_INTERRUPT_CUT_OFF.postgres, now, node, epoch, unclaimed)
        session_ids = sorted({r["session_id"] for r in items})
        leases = await conn.fetch(_LEASE_CUT_OFF_PG.postgres, node, epoch, session_ids)
    return dead, items, leases


def _taken(answer: tuple[list[Any], list[Any], list[Any]]) -> TakeOver:
    dead, items, leases = answer
    return TakeOver(
        nodes=[node_record(r) for r in dead],
        inputs=sorted((input_record(r) for r in items), key=lambda item: item.id),
        leases={r["id"]: r["lease_epoch"] for r in leases},
    )


#: ``(node, epoch, unclaimed, now)``: the nodes declared dead, the inputs interrupted, and the
#: sessions of those leased to ``node``.
TAKE_OVER_DEAD_NODES = ops.procedure(
    "take_over_dead_nodes",
    sqlite=_take_over_sqlite,
    postgres=_take_over_postgres,
    decode=_taken,
    writes=True,
)


def _lease_lost(node: NodeRef, current: NodeRecord | None) -> LeaseLost:
    """Why ``node``'s heartbeat could not renew its lease, as the error that says so."""
    who = f"node {node.id!r} epoch {node.epoch}"
    if current is None:
        reason = f"{who}: its row is gone from the nodes table"
    elif current.epoch != node.epoch:
        reason = (
            f"{who} was taken over by epoch {current.epoch} (another process started with"
            " this node id)"
        )
    else:
        reason = (
            f"{who} was declared dead (state stopped; its lease expired at"
            f" {current.lease_expires_at.isoformat()}), and its work moved to other nodes"
        )
    return LeaseLost(reason, node=node.id, epoch=node.epoch)


class NodeMethods(StoreBase):
    """The store's methods on nodes (see :class:`runtime.store.front.Store`).

    Membership of the nodes sharing this store (``runtime.membership`` drives these). Every
    lease decision is taken by the database clock on PostgreSQL (``now()`` in the statement)
    and by the store's clock on SQLite, never by a node's own clock on PostgreSQL.
    """

    def _lease(self, lease_seconds: object) -> dict[str, Any]:
        """The lease arguments: its length, and (for SQLite) now and its end by our clock."""
        if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float):
            raise TypeError(f"lease_seconds must be a number, not {type(lease_seconds).__name__}")
        if not 0 < lease_seconds <= u.MAX_LEASE_SECONDS:
            raise ValueError(f"lease_seconds must be in (0, {u.MAX_LEASE_SECONDS}]")
        now = self.clock.now()
        return {
            "lease": float(lease_seconds),
            "now": self.engine.db_time(now),
            "expires": self.engine.db_time(now + timedelta(seconds=lease_seconds)),
        }

    async def register_node(
        self, id: str, *, lease_seconds: float, address: str | None = None
    ) -> tuple[NodeRecord, NodeRecord | None]:
        """Register a start of node ``id``: a new epoch (1, or one more than the row's), state
        ``running``, a lease of ``lease_seconds`` from now.

        An earlier epoch of the same id loses its row: its next heartbeat raises
        ``LeaseLost`` (so two processes given one id cannot both serve), and the inputs it
        had claimed are dead claims that recovery may take.

        Returns:
            The row as registered, and the row it replaced (None for a new id): whether that
            earlier epoch was still ``alive`` tells a restart from a takeover.

        Raises:
            InvalidArgument: a malformed id (``field`` is ``id``).
        """
        u.check_node_id(id)
        if address is not None:
            u.check_text(address, "address")
        lease = self._lease(lease_seconds)
        return await self.engine.run(REGISTER_NODE, id=id, address=address, **lease)

    async def heartbeat_node(
        self, node: NodeRef, *, lease_seconds: float, address: str | None = None
    ) -> NodeRecord:
        """Renew ``node``'s lease to ``lease_seconds`` from now (and set its address when given).

        It renews only while ``node.epoch`` is its id's current epoch and the row is not
        ``stopped``; a lease that lapsed without anyone declaring the node dead is renewed
        (none of its work had moved).

        Raises:
            LeaseLost: the row belongs to a newer epoch, or the node was declared dead or
                stopped; the message says which. The node must stop serving.
        """
        if address is not None:
            u.check_text(address, "address")
        lease = self._lease(lease_seconds)
        record = await self.engine.run(
            HEARTBEAT_NODE, id=node.id, epoch=node.epoch, address=address, **lease
        )
        if record is not None:
            return record
        current = await self.engine.run(GET_NODE, id=node.id, now=self._now())
        raise _lease_lost(node, current)

    async def drain_node(self, node: NodeRef) -> bool:
        """Mark ``node`` draining (a graceful stop has begun): still alive, so it keeps its
        leases and its running turns, but no longer given new work (``Membership.owns``).
        False unless that epoch was current and running."""
        return await self.engine.run(DRAIN_NODE, id=node.id, epoch=node.epoch)

    async def stop_node(self, node: NodeRef) -> bool:
        """Mark ``node`` stopped (a clean shutdown): dead for everyone at once, so another node
        may take whatever it left running. False when that epoch was not current or already
        stopped."""
        return await self.engine.run(STOP_NODE, id=node.id, epoch=node.epoch, now=self._now())

    async def list_nodes(self) -> ClusterView:
        """Every node's row by id, each judged alive or dead at one instant (the database's
        clock on PostgreSQL)."""
        return await self.engine.run(LIST_NODES, now=self._now())

    async def take_over_dead_nodes(self, node: NodeRef, *, unclaimed: bool = False) -> TakeOver:
        """Recovery scoped to dead nodes, asked by the live ``node``, in one transaction.

        First every other node whose lease expired is declared dead (``stopped``: its
        heartbeat can no longer renew, so it stops serving). Then every ``running`` input
        whose claimer is no current, running epoch (a dead node's, a stopped one's, an
        earlier incarnation of any node's, ``node``'s own earlier ones) is moved to
        ``interrupted``; with ``unclaimed``, so are the running inputs that record no claimer
        (rows from before claimers were recorded, or claimed through a store with no node).
        The inputs of ``node`` itself and of every live node are left alone.
        """
        return await self.engine.run(
            TAKE_OVER_DEAD_NODES,
            node=node.id,
            epoch=node.epoch,
            unclaimed=bool(unclaimed),
            now=self._now(),
        )
