"""The execution feature's approvals table: its migration set ``"execution"`` (the background
tasks' table is a set of its own, ``background_schema.py``).

=============  ===================================================================================
``approvals``  one tool call waiting for a person (``actors.execution.approvals``): written when
               the call asks, deleted when it stops waiting (decided, timed out, withdrawn).
               ``decision`` is set once, by the first answer, through any node (a
               compare-and-set on ``decision IS NULL``); the node whose call waits reads it.
               ``owner`` is the session's owner: only they answer or see it. ``node_id`` and
               ``node_epoch`` (migration 2) name the node incarnation whose call waits: when
               it ends (a crash, a node declared dead) the pass that closes its background
               tasks deletes its rows too (:data:`LOST_INCARNATIONS`, :data:`DROP_LOST`). A
               row with no incarnation (written before migration 2, or by a store without
               one) reads as gone once ``expires_at`` is :data:`STALE` past, and the next
               request deletes it.
=============  ===================================================================================

The queries (store operations, one function per backend) take times already converted with
``store.db_time``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from turnstile.runtime.store import Migration, MigrationSet, ops

__all__ = [
    "CLOSE",
    "DECIDE",
    "DROP",
    "DROP_LOST",
    "EXECUTION",
    "LOST_INCARNATIONS",
    "PENDING",
    "READ",
    "REQUEST",
    "STALE",
]

#: How long after its expiry a row still counts: the call waiting for it deletes it at its
#: timeout, so only a row whose node died outlives it (and then reads as gone).
STALE = timedelta(seconds=60)


def _tables(time: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE approvals (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            tool TEXT NOT NULL,
            requested_at {time} NOT NULL,
            expires_at {time} NOT NULL,
            decision TEXT CHECK (decision IN ('approved', 'denied')),
            decided_by TEXT
        )""",
        "CREATE INDEX approvals_session ON approvals (session_id)",
        "CREATE INDEX approvals_expires ON approvals (expires_at)",
    )


#: The feature's migration set (the approvals).
EXECUTION = MigrationSet(
    "execution",
    (
        Migration(
            1,
            "approvals",
            sqlite=_tables("TEXT"),
            postgres=_tables("TIMESTAMPTZ"),
        ),
        Migration(
            2,
            "approvals_node",
            sqlite=(
                "ALTER TABLE approvals ADD COLUMN node_id TEXT",
                "ALTER TABLE approvals ADD COLUMN node_epoch INTEGER",
            ),
            postgres=(
                "ALTER TABLE approvals ADD COLUMN node_id TEXT",
                "ALTER TABLE approvals ADD COLUMN node_epoch BIGINT",
            ),
        ),
    ),
)

# ---- request: a call starts waiting ------------------------------------------------------------

_PURGE = "DELETE FROM approvals WHERE expires_at < {}"
_INSERT = (
    "INSERT INTO approvals"
    " (id, session_id, owner, tool, requested_at, expires_at, node_id, node_epoch)"
    " VALUES ({}, {}, {}, {}, {}, {}, {}, {})"
)
_REQUEST_FIELDS = (
    "id",
    "session_id",
    "owner",
    "tool",
    "now",
    "expires_at",
    "node_id",
    "node_epoch",
)


def _request_sqlite(conn: Any, **a: Any) -> None:
    conn.execute(_PURGE.format("?"), (a["stale_before"],))
    conn.execute(_INSERT.format(*"?" * 8), tuple(a[f] for f in _REQUEST_FIELDS))


async def _request_postgres(conn: Any, **a: Any) -> None:
    async with conn.transaction():
        await conn.execute(_PURGE.format("$1"), a["stale_before"])
        await conn.execute(
            _INSERT.format(*(f"${i}" for i in range(1, 9))), *(a[f] for f in _REQUEST_FIELDS)
        )


#: ``(id, session_id, owner, tool, now, expires_at, node_id, node_epoch, stale_before)``:
#: records a waiting call of that node incarnation (``node_id`` None: none), and deletes the
#: rows left without an incarnation, expired before ``stale_before``.
REQUEST = ops.procedure(
    "execution.request", sqlite=_request_sqlite, postgres=_request_postgres, writes=True
)

# ---- decide: the first answer wins -------------------------------------------------------------

_DECIDE = (
    "UPDATE approvals SET decision = {decision}, decided_by = {owner} WHERE id = {id}"
    " AND owner = {owner} AND decision IS NULL AND expires_at > {live} RETURNING session_id"
)
_FOUND = (
    "SELECT session_id FROM approvals WHERE id = {id} AND owner = {owner} AND expires_at > {live}"
)


def _decide_sqlite(conn: Any, *, id: str, owner: str, decision: str, live_after: str) -> Any:
    won = conn.execute(
        _DECIDE.format(decision="?1", owner="?2", id="?3", live="?4"),
        (decision, owner, id, live_after),
    ).fetchone()
    if won is not None:
        return (True, won[0])
    found = conn.execute(
        _FOUND.format(id="?1", owner="?2", live="?3"), (id, owner, live_after)
    ).fetchone()
    return None if found is None else (False, found[0])


async def _decide_postgres(
    conn: Any, *, id: str, owner: str, decision: str, live_after: Any
) -> Any:
    won = await conn.fetchval(
        _DECIDE.format(decision="$1", owner="$2", id="$3", live="$4"),
        decision,
        owner,
        id,
        live_after,
    )
    if won is not None:
        return (True, won)
    found = await conn.fetchval(
        _FOUND.format(id="$1", owner="$2", live="$3"), id, owner, live_after
    )
    return None if found is None else (False, found)


#: ``(id, owner, decision, live_after) -> (won, session_id) | None``: records ``decision``
#: unless one is recorded already (``won`` False); None when ``owner`` has no such approval.
DECIDE = ops.procedure(
    "execution.decide", sqlite=_decide_sqlite, postgres=_decide_postgres, writes=True
)

# ---- read, close, list -------------------------------------------------------------------------

_READ = "SELECT decision, decided_by FROM approvals WHERE id = {}"
_CLOSE = "DELETE FROM approvals WHERE id = {} RETURNING decision, decided_by"


def _read_sqlite(conn: Any, *, id: str) -> tuple[str | None, str | None] | None:
    row = conn.execute(_READ.format("?"), (id,)).fetchone()
    return None if row is None else (row[0], row[1])


async def _read_postgres(conn: Any, *, id: str) -> tuple[str | None, str | None] | None:
    row = await conn.fetchrow(_READ.format("$1"), id)
    return None if row is None else (row[0], row[1])


def _close_sqlite(conn: Any, *, id: str) -> tuple[str | None, str | None] | None:
    row = conn.execute(_CLOSE.format("?"), (id,)).fetchone()
    return None if row is None else (row[0], row[1])


async def _close_postgres(conn: Any, *, id: str) -> tuple[str | None, str | None] | None:
    row = await conn.fetchrow(_CLOSE.format("$1"), id)
    return None if row is None else (row[0], row[1])


#: ``(id) -> (decision, decided_by) | None``: the answer recorded so far (None: no row).
READ = ops.procedure("execution.read", sqlite=_read_sqlite, postgres=_read_postgres)
#: ``(id) -> (decision, decided_by) | None``: deletes the row, answering what it held.
CLOSE = ops.procedure(
    "execution.close", sqlite=_close_sqlite, postgres=_close_postgres, writes=True
)

_DROP = "DELETE FROM approvals WHERE session_id = {}"


def _drop_sqlite(conn: Any, *, session_id: str) -> int:
    return conn.execute(_DROP.format("?"), (session_id,)).rowcount


async def _drop_postgres(conn: Any, *, session_id: str) -> int:
    status = await conn.execute(_DROP.format("$1"), session_id)
    return int(status.split()[-1])


#: ``(session_id) -> int``: deletes a deleted session's approvals (their calls, on whichever
#: node, find their row gone and count it as a denial).
DROP = ops.procedure("execution.drop", sqlite=_drop_sqlite, postgres=_drop_postgres, writes=True)

_PENDING = (
    "SELECT id, tool FROM approvals WHERE session_id = {} AND decision IS NULL"
    " AND expires_at > {} ORDER BY requested_at, id"
)


def _pending_sqlite(conn: Any, *, session_id: str, live_after: str) -> list[tuple[str, str]]:
    rows = conn.execute(_PENDING.format("?", "?"), (session_id, live_after))
    return [(row[0], row[1]) for row in rows]


async def _pending_postgres(
    conn: Any, *, session_id: str, live_after: Any
) -> list[tuple[str, str]]:
    rows = await conn.fetch(_PENDING.format("$1", "$2"), session_id, live_after)
    return [(row[0], row[1]) for row in rows]


#: ``(session_id, live_after) -> [(id, tool)]``: the session's undecided approvals.
PENDING = ops.procedure("execution.pending", sqlite=_pending_sqlite, postgres=_pending_postgres)

# ---- the approvals of ended node incarnations --------------------------------------------------

_INCARNATIONS = "SELECT DISTINCT node_id, node_epoch FROM approvals WHERE node_id IS NOT NULL"
_DROP_LOST = "DELETE FROM approvals WHERE node_id = {} AND node_epoch = {} RETURNING id, session_id"


def _incarnations_sqlite(conn: Any) -> list[tuple[str, int]]:
    return [(row[0], row[1]) for row in conn.execute(_INCARNATIONS)]


async def _incarnations_postgres(conn: Any) -> list[tuple[str, int]]:
    return [(row[0], row[1]) for row in await conn.fetch(_INCARNATIONS)]


def _drop_lost_sqlite(conn: Any, *, node_id: str, node_epoch: int) -> list[tuple[str, str]]:
    rows = conn.execute(_DROP_LOST.format("?", "?"), (node_id, node_epoch)).fetchall()
    return [(row[0], row[1]) for row in rows]


async def _drop_lost_postgres(conn: Any, *, node_id: str, node_epoch: int) -> list[tuple[str, str]]:
    rows = await conn.fetch(_DROP_LOST.format("$1", "$2"), node_id, node_epoch)
    return [(row[0], row[1]) for row in rows]


#: ``() -> [(node_id, node_epoch)]``: the node incarnations whose calls wait for approvals.
LOST_INCARNATIONS = ops.procedure(
    "execution.lost_incarnations",
    sqlite=_incarnations_sqlite,
    postgres=_incarnations_postgres,
)
#: ``(node_id, node_epoch) -> [(id, session_id)]``: deletes that incarnation's approvals (it
#: ended: no call waits for them any more), answering which they were.
DROP_LOST = ops.procedure(
    "execution.drop_lost",
    sqlite=_drop_lost_sqlite,
    postgres=_drop_lost_postgres,
    writes=True,
)
