"""Session leases: which node holds a session, and the fencing token its writes carry.

One holder among live nodes; a new lease epoch at each acquisition. The session's row lock
orders acquisitions of one session, and the fenced writes (which hold a share lock on the same
row, :mod:`runtime.store.inbox`) against them. The holder is live exactly as long as its node
is: that node's current epoch, not stopped, its lease unexpired (by the database clock on
PostgreSQL, the store's on SQLite).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase
from turnstile.runtime.store.inbox import input_record
from turnstile.runtime.store.records import NodeRef, SessionLease

__all__ = ["LeaseMethods"]

_HOLDER = (
    "SELECT s.lease_node, s.lease_node_epoch, s.lease_epoch, n.address, {live} AS live"
    " FROM sessions s LEFT JOIN nodes n ON n.id = s.lease_node AND n.epoch = s.lease_node_epoch"
    " WHERE s.id = :session_id"
)
_HOLDER_SQLITE = ops.Statement(
    _HOLDER.format(
        live="(n.id IS NOT NULL AND n.state <> 'stopped' AND n.lease_expires_at > :now)"
    ),
    params=("session_id", "now"),
)
_HOLDER_PG = ops.Statement(
    _HOLDER.format(live="coalesce(n.state <> 'stopped' AND n.lease_expires_at > now(), false)")
)
_LOCK_PG = ops.Statement("SELECT 1 FROM sessions WHERE id = :session_id FOR UPDATE")
_ACQUIRE = ops.Statement(
    "UPDATE sessions SET lease_node = :node, lease_node_epoch = :epoch,"
    " lease_epoch = lease_epoch + 1 WHERE id = :session_id RETURNING lease_epoch",
    params=("session_id", "node", "epoch"),
)
# the session's turns cut off on a node that is not live: the new holder closes them before it
# starts one (its claim and their closure cannot interleave with a sweep's)
_CUT_OFF = (
    "UPDATE inbox SET state = 'interrupted', updated_at = :now WHERE session_id = :session_id"
    " AND state = 'running' AND claimed_by IS NOT NULL"
    " AND NOT (claimed_by = :node AND claimed_epoch = :epoch) AND NOT EXISTS ("
    " SELECT 1 FROM nodes n WHERE n.id = inbox.claimed_by"
    " AND n.epoch = inbox.claimed_epoch AND n.state <> 'stopped'"
    " AND n.lease_expires_at > {now}) RETURNING *"
)
_CUT_OFF_ARGS = ("session_id", "node", "epoch", "now")
_CUT_OFF_SQLITE = ops.Statement(_CUT_OFF.format(now=":now"), params=_CUT_OFF_ARGS)
_CUT_OFF_PG = ops.Statement(_CUT_OFF.format(now="now()"), params=_CUT_OFF_ARGS)


def _mine(current: Any, node: str, epoch: int) -> bool:
    """Whether the lease may be taken: nobody live holds it, or ``node`` does."""
    return not current["live"] or (
        current["lease_node"] == node and current["lease_node_epoch"] == epoch
    )


def _acquire_sqlite(
    conn: sqlite3.Connection, session_id: str, node: str, epoch: int, now: str
) -> Any:
    # one transaction at a time here (the writer's), so nothing interleaves
    current = conn.execute(_HOLDER_SQLITE.sqlite, (session_id, now)).fetchone()
    if current is None:
        return None, None, []
    if not _mine(current, node, epoch):
        return None, current, []
    row = conn.execute(_ACQUIRE.sqlite, (session_id, node, epoch)).fetchone()
    cut_off = conn.execute(_CUT_OFF_SQLITE.sqlite, (session_id, node, epoch, now)).fetchall()
    return row, current, cut_off


async def _acquire_postgres(conn: Any, session_id: str, node: str, epoch: int, now: Any) -> Any:
    # A live holder that is not this node refuses in one read, without a transaction or a lock:
    # with several nodes, every message for a session another node holds (a fire's input, its
    # job_update) comes here first, and the locking transaction was six round trips and a row
    # lock against the holder's own writes each time (issue 26). The refusal is as good as the
    # locked one: either holder may stop right after it; what may take the lease is re-read
    # under the lock below.
    current = await conn.fetchrow(_HOLDER_PG.postgres, session_id)
    if current is None:
        return None, None, []
    if not _mine(current, node, epoch):
        return None, current, []
    async with conn.transaction():
        # lock first, then look at the holder's node in a statement of its own: a join in the
        # locking statement would be re-checked against the node row it read before the wait
        if await conn.fetchval(_LOCK_PG.postgres, session_id) is None:
            return None, None, []
        current = await conn.fetchrow(_HOLDER_PG.postgres, session_id)
        if not _mine(current, node, epoch):
            return None, current, []
        row = await conn.fetchrow(_ACQUIRE.postgres, session_id, node, epoch)
        cut_off = await conn.fetch(_CUT_OFF_PG.postgres, session_id, node, epoch, now)
    return row, current, cut_off


#: ``(session_id, node, epoch, now) -> (row with the new lease_epoch | None when a live node
#: holds it, the holder before with its address and liveness | None for no session, rows of
#: the session's inputs cut off on nodes not live, interrupted)``.
ACQUIRE_SESSION = ops.procedure(
    "acquire_session", sqlite=_acquire_sqlite, postgres=_acquire_postgres, writes=True
)
#: ``(session_id, fence)``: False when the lease moved on.
RELEASE_SESSION = ops.found(
    "release_session",
    "UPDATE sessions SET lease_node = NULL, lease_node_epoch = NULL"
    " WHERE id = :session_id AND lease_epoch = :fence AND lease_node IS NOT NULL RETURNING 1",
    writes=True,
)


class LeaseMethods(StoreBase):
    """The store's methods on session leases (see :class:`runtime.store.front.Store`)."""

    async def acquire_session(self, session_id: str, node: NodeRef) -> SessionLease:
        """Make ``node`` the holder of ``session_id``'s lease, unless another live node holds it.

        Acquired (``fence`` set, one more than the session's previous lease epoch, even when
        ``node`` held it already, so that a late release of an earlier activation cannot
        clear it) when nobody holds the lease, when its holder is not live (its node's
        current epoch, not stopped, lease unexpired: by the database's clock on
        PostgreSQL), or when ``node`` holds it. Otherwise ``fence`` is None and ``holder``
        names the live node that holds it. The fenced writes (``claim_next_input``,
        ``finish_input``, ``append_events`` with ``fence=``) are ordered against it.

        Raises:
            NotFound: no such session.
        """
        u.check_text(session_id, "session_id")
        row, current, cut_off = await self.engine.run(
            ACQUIRE_SESSION,
            session_id=session_id,
            node=node.id,
            epoch=node.epoch,
            now=self._now(),
        )
        if current is None:
            raise u.no_session(session_id)
        return SessionLease(
            session_id=session_id,
            fence=None if row is None else row["lease_epoch"],
            holder=current["lease_node"],
            holder_epoch=current["lease_node_epoch"],
            holder_address=current["address"],
            holder_live=bool(current["live"]),
            interrupted=sorted((input_record(r) for r in cut_off), key=lambda item: item.id),
        )

    async def release_session(self, session_id: str, fence: int) -> bool:
        """Give the lease up (the activation ended), if ``fence`` is still its epoch; the epoch
        stays, so the next holder gets a higher one. False when the lease had moved on."""
        u.check_int(fence, "fence")
        return await self.engine.run(RELEASE_SESSION, session_id=session_id, fence=fence)
