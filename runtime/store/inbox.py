"""The store's inboxes: a session's turn inputs, how they arrive and how they are read.

An acknowledged input is durable: ``enqueue_input`` returns only after the commit. An input sent
twice under one idempotency key is stored once (a unique index decides, not a read before the
write). Claiming and settling inputs is in :mod:`runtime.store.claims`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from turnstile.runtime.errors import IdempotencyKeyReused
from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops, pgerrors
from turnstile.runtime.store.base import StoreBase, ts
from turnstile.runtime.store.records import Enqueued, InboxItem, NodeRef
from turnstile.runtime.store.sessions import (
    has_session_sqlite,
    require_session_sqlite,
)
from turnstile.runtime.tracing import TRACE_KEYS, without_trace

__all__ = [
    "INPUT_COLUMNS",
    "INSERT_INPUT",
    "INSERT_KEYED",
    "InboxMethods",
    "input_record",
    "same_input",
]


def input_record(row: Any) -> InboxItem:
    """An ``inbox`` row as an :class:`InboxItem`."""
    return InboxItem(
        id=row["id"],
        session_id=row["session_id"],
        source=row["source"],
        payload=u.decode_json(row["payload"]),
        state=row["state"],
        created_at=ts(row["created_at"]),
        updated_at=ts(row["updated_at"]),
        detail=u.decode_optional_json(row["detail"]),
        idempotency_key=row["idempotency_key"],
        claimed_by=None
        if row["claimed_by"] is None
        else NodeRef(row["claimed_by"], row["claimed_epoch"]),
    )


#: The inbox's columns, in the order of the table (a feature's statement that returns an inbox
#: row among its own columns names them, and splits the row with them).
INPUT_COLUMNS = (
    "id", "session_id", "source", "payload", "state", "created_at", "updated_at", "detail",
    "idempotency_key", "claimed_by", "claimed_epoch",
)  # fmt: skip

#: A new queued input; a feature's operation that enqueues a turn input with its own rows, in
#: one transaction, runs this statement for the inbox's row.
INSERT_INPUT = ops.Statement(
    "INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at)"
    " VALUES (:session_id, :source, :payload::jsonb, 'queued', :now, :now) RETURNING *"
)


# -- enqueue ------------------------------------------------------------------------------------


def _enqueue_sqlite(
    conn: sqlite3.Connection, session_id: str, source: str, payload: str, now: str
) -> Any:
    if not has_session_sqlite(conn, session_id):
        return None
    return conn.execute(INSERT_INPUT.sqlite, (session_id, source, payload, now)).fetchone()


async def _enqueue_postgres(conn: Any, session_id: str, source: str, payload: str, now: Any) -> Any:
    try:
        return await conn.fetchrow(INSERT_INPUT.postgres, session_id, source, payload, now)
    except pgerrors.ForeignKeyViolationError:
        return None


#: ``(session_id, source, payload, now)``; None when there is no such session.
ENQUEUE_INPUT = ops.row(
    "enqueue_input",
    sqlite=_enqueue_sqlite,
    postgres=_enqueue_postgres,
    decode=input_record,
    writes=True,
)

#: A new input under an idempotency key: nothing (no row back) when the key is taken.
INSERT_KEYED = ops.Statement(
    "INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at, detail,"
    " idempotency_key) VALUES (:session_id, :source, :payload::jsonb, :state, :now, :now,"
    " :detail::jsonb, :key) ON CONFLICT DO NOTHING RETURNING *"
)
_KEYED = ops.Statement(
    "SELECT * FROM inbox WHERE session_id = :session_id AND idempotency_key = :key"
)


def _enqueue_keyed_sqlite(conn: sqlite3.Connection, **args: Any) -> tuple[Any, bool] | None:
    if not has_session_sqlite(conn, args["session_id"]):
        return None
    row = conn.execute(INSERT_KEYED.sqlite, INSERT_KEYED.values(args)).fetchone()
    if row is not None:
        return row, True
    return conn.execute(_KEYED.sqlite, _KEYED.values(args)).fetchone(), False


async def _enqueue_keyed_postgres(conn: Any, **args: Any) -> tuple[Any, bool] | None:
    # Two statements, each its own snapshot (READ COMMITTED): a concurrent insert of the same
    # key makes the first wait for it and do nothing; the second then sees its committed row.
    try:
        row = await conn.fetchrow(INSERT_KEYED.postgres, *INSERT_KEYED.values(args))
    except pgerrors.ForeignKeyViolationError:
        return None
    if row is not None:
        return row, True
    return await conn.fetchrow(_KEYED.postgres, *_KEYED.values(args)), False


def _keyed(found: tuple[Any, bool] | None) -> tuple[InboxItem, bool] | None:
    return None if found is None else (input_record(found[0]), found[1])


#: ``(session_id, source, payload, key, state, detail, now) -> (row, created)``: the row under
#: ``(session_id, key)``, inserted by this call or not; None when there is no such session.
ENQUEUE_KEYED = ops.procedure(
    "enqueue_keyed",
    sqlite=_enqueue_keyed_sqlite,
    postgres=_enqueue_keyed_postgres,
    decode=_keyed,
    writes=True,
)
KEYED_INPUT = ops.row("keyed_input", _KEYED.text, decode=input_record)


# -- reading, recovery --------------------------------------------------------------------------


def _list_sqlite(conn: sqlite3.Connection, session_id: str, states: list[str] | None) -> list[Any]:
    require_session_sqlite(conn, session_id)
    sql, values = "SELECT * FROM inbox WHERE session_id = ?", [session_id]
    if states is not None:
        if not states:
            return []
        sql += f" AND state IN ({', '.join('?' * len(states))})"
        values += states
    return conn.execute(sql + " ORDER BY id", values).fetchall()


# One statement, one round trip, also for "no session" (no row) and "none" (one row of NULLs,
# the session's, joined to no input): the session's row joined to its inputs.
_LIST = ops.Statement(
    "SELECT i.* FROM sessions s LEFT JOIN inbox i ON i.session_id = s.id"
    " AND (:states::text[] IS NULL OR i.state = ANY(:states)) WHERE s.id = :session_id"
    " ORDER BY i.id",
    params=("session_id", "states"),
)


async def _list_postgres(conn: Any, session_id: str, states: list[str] | None) -> list[Any]:
    rows: list[Any] = await conn.fetch(_LIST.postgres, session_id, states)
    if not rows:
        raise u.no_session(session_id)
    if rows[0]["id"] is None:  # the session, without an input in ``states``
        return []
    return rows


#: ``(session_id, states)``: the inbox by id, only ``states`` unless None; ``NotFound`` for
#: no session.
LIST_INPUTS = ops.rows(
    "list_inputs", sqlite=_list_sqlite, postgres=_list_postgres, decode=input_record
)
#: ``(now)``: every running input moved to interrupted.
INTERRUPT_RUNNING = ops.rows(
    "interrupt_running",
    "UPDATE inbox SET state = 'interrupted', updated_at = :now WHERE state = 'running' RETURNING *",
    decode=input_record,
    writes=True,
)


def _first(row: Any) -> Any:
    return row[0]


QUEUED_SESSIONS = ops.rows(
    "sessions_with_queued_inputs",
    "SELECT DISTINCT session_id FROM inbox WHERE state = 'queued' ORDER BY session_id",
    decode=_first,
)
#: ``(node, epoch)``: as :data:`QUEUED_SESSIONS`, without the sessions that have an input
#: running on another live node.
QUEUED_SESSIONS_FOR_NODE = ops.rows(
    "sessions_with_queued_inputs",
    "SELECT DISTINCT session_id FROM inbox q WHERE state = 'queued' AND NOT EXISTS ("
    " SELECT 1 FROM inbox r JOIN nodes n ON n.id = r.claimed_by AND n.epoch = r.claimed_epoch"
    " WHERE r.session_id = q.session_id AND r.state = 'running' AND n.state <> 'stopped'"
    " AND NOT (r.claimed_by = :node AND r.claimed_epoch = :epoch)) ORDER BY session_id",
    decode=_first,
)


# -- the methods --------------------------------------------------------------------------------

#: The states ``enqueue_keyed`` may store an input in: to run, or already settled (an input
#: folded into a running turn keeps its key in a row that never runs).
_KEYED_STATES = ("queued", "done")


def same_input(item: InboxItem, source: str, payload: str) -> None:
    """Raise ``IdempotencyKeyReused`` unless ``item`` is the input ``(source, payload)``.

    The trace context a payload carries (``tracing.TRACE_KEYS``) is not part of the input: a
    resend made under another span (a client's retry) is the same input."""
    if item.source != source or not _same_payload(item.payload, u.decode_json(payload)):
        raise IdempotencyKeyReused(
            f"idempotency key {item.idempotency_key!r} already names another input of this"
            f" session (input {item.id}); a retry must send the same input"
        )


def _same_payload(stored: dict[str, Any], sent: dict[str, Any]) -> bool:
    if not TRACE_KEYS.isdisjoint(stored) or not TRACE_KEYS.isdisjoint(sent):
        return without_trace(stored) == without_trace(sent)
    return stored == sent


class InboxMethods(StoreBase):
    """The store's methods on inboxes (see :class:`runtime.store.front.Store`)."""

    async def enqueue_input(
        self, session_id: str, source: str, payload: dict[str, Any]
    ) -> InboxItem:
        """Append a turn input to a session's inbox, in state ``queued``.

        The input is durable when this returns: the return is the acknowledgement.

        Args:
            session_id: the session.
            source: where it came from (``"user"``, ``"cron"``, ...).
            payload: the input.

        Returns:
            The stored item, with its store-assigned monotonic id.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        u.check_text(session_id, "session_id")
        u.check_text(source, "source")
        data = u.encode_json(payload)
        item = await self.engine.run(
            ENQUEUE_INPUT, session_id=session_id, source=source, payload=data, now=self._now()
        )
        if item is None:
            raise u.no_session(session_id)
        return item

    async def enqueue_keyed(
        self,
        session_id: str,
        source: str,
        payload: dict[str, Any],
        idempotency_key: str,
        *,
        state: str = "queued",
        detail: dict[str, Any] | None = None,
    ) -> Enqueued:
        """Enqueue an input under an idempotency key, at most once per session and key.

        The key is unique per session in the database itself (a unique index): the insert does
        nothing when the key is taken, and the row that holds it is read back. So any number
        of concurrent calls with one key, on any number of nodes sharing a PostgreSQL, store
        one row; every call answers that row. The key lives as long as the row, which goes
        only with its session.

        Args:
            session_id, source, payload: as ``enqueue_input``.
            idempotency_key: 1 to 255 visible ASCII characters (``!`` to ``~``). Callers
                namespace their keys by where the input came from (``client:<id>``,
                ``github:<delivery id>``), since the space is shared per session.
            state: ``queued`` (to run), or ``done`` for an input that will not run as a turn
                of its own (one folded into the running turn) but whose key must be kept.
            detail: stored with the row (``done`` rows say why).

        Returns:
            The row under the key, and whether this call stored it.

        Raises:
            InvalidArgument: the key is malformed (``field`` is ``idempotency_key``).
            IdempotencyKeyReused: the key already names an input with another source or
                payload; nothing is written.
            NotFound: ``no session with id 'x'``.
        """
        u.check_text(session_id, "session_id")
        u.check_text(source, "source")
        key = u.check_idempotency_key(idempotency_key)
        if state not in _KEYED_STATES:
            raise ValueError(f"a keyed input is stored queued or done, not {state!r}")
        data = u.encode_json(payload)
        found = await self.engine.run(
            ENQUEUE_KEYED,
            session_id=session_id,
            source=source,
            payload=data,
            key=key,
            state=state,
            detail=u.encode_optional_json(detail),
            now=self._now(),
        )
        if found is None:
            raise u.no_session(session_id)
        item, created = found
        if not created:
            same_input(item, source, data)
        return Enqueued(item=item, created=created)

    async def keyed_input(
        self, session_id: str, idempotency_key: str, *, source: str, payload: dict[str, Any]
    ) -> InboxItem | None:
        """The input enqueued under ``idempotency_key`` in the session, if any (a read only).

        Raises:
            InvalidArgument: the key is malformed.
            IdempotencyKeyReused: there is one, but with another source or payload.
        """
        key = u.check_idempotency_key(idempotency_key)
        item = await self.engine.run(KEYED_INPUT, session_id=session_id, key=key)
        if item is not None:
            same_input(item, source, u.encode_json(payload))
        return item

    async def list_inputs(
        self, session_id: str, states: Sequence[str] | None = None
    ) -> list[InboxItem]:
        """A session's inbox in id (arrival) order, optionally only items in ``states``.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        wanted = u.check_input_states(states)
        return await self.engine.run(LIST_INPUTS, session_id=session_id, states=wanted)

    async def interrupt_running(self) -> list[InboxItem]:
        """Crash recovery of a store that one process uses alone: move every ``running``
        input to ``interrupted``, whoever claimed it. A node that shares its store uses
        :meth:`take_over_dead_nodes` instead.

        Returns:
            The items changed, by id.
        """
        items = await self.engine.run(INTERRUPT_RUNNING, now=self._now())
        return sorted(items, key=lambda item: item.id)

    async def sessions_with_queued_inputs(self, *, node: NodeRef | None = None) -> list[str]:
        """Ids of the sessions that have at least one ``queued`` input, sorted (for recovery).

        Args:
            node: the node asking; given, the sessions with an input running on another live
                node (a current, not stopped epoch) are left out: that node goes on with
                their queue.
        """
        if node is None:
            return await self.engine.run(QUEUED_SESSIONS)
        return await self.engine.run(QUEUED_SESSIONS_FOR_NODE, node=node.id, epoch=node.epoch)
