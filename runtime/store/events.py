"""The store's event logs: a session's events, numbered 1, 2, 3, … without a gap.

The seq is taken from ``sessions.last_seq``, updated in the same transaction as the events'
insert: the ``UPDATE`` takes the session's row lock, so concurrent appenders (any number of
processes) serialise per session and seqs stay gap-free. On PostgreSQL that is one statement,
one round trip (it was BEGIN, UPDATE, INSERT, COMMIT: four): a data-modifying ``WITH`` whose
``UPDATE`` allocates the seqs and checks the fence, and whose ``INSERT`` takes the new
``last_seq`` from it, so it writes nothing when the ``UPDATE`` matched nothing; a statement is
atomic, as the transaction was.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase, ts
from turnstile.runtime.store.escaping import escape_text
from turnstile.runtime.store.records import EventRecord
from turnstile.runtime.store.sessions import (
    fenced_postgres,
    fenced_sqlite,
    require_session_postgres,
    require_session_sqlite,
)

__all__ = ["MAX_EVENT_TYPES", "EventMethods", "event_record"]

#: How many event types ``read_events_back`` takes at once
MAX_EVENT_TYPES = 16


def event_record(row: Any) -> EventRecord:
    """An ``events`` row as an :class:`EventRecord`."""
    return EventRecord(
        session_id=row["session_id"],
        seq=row["seq"],
        type=row["type"],
        payload=u.decode_json(row["payload"]),
        ts=ts(row["ts"]),
    )


# -- append -------------------------------------------------------------------------------------

_APPEND_SQLITE = (
    "UPDATE sessions SET last_seq = last_seq + :n, updated_at = :now WHERE id = :session_id"
    "{held} RETURNING last_seq"
)
_APPEND_FREE_SQLITE = ops.Statement(
    _APPEND_SQLITE.format(held=""), params=("n", "now", "session_id")
)
_APPEND_FENCED_SQLITE = ops.Statement(
    _APPEND_SQLITE.format(held=" AND lease_epoch = :fence"),
    params=("n", "now", "session_id", "fence"),
)
_INSERT_EVENT = ops.Statement(
    "INSERT INTO events (session_id, seq, type, payload, ts)"
    " VALUES (:session_id, :seq, :type, :payload, :ts)",
    params=("session_id", "seq", "type", "payload", "ts"),
)


def _append_sqlite(
    conn: sqlite3.Connection,
    session_id: str,
    events: list[tuple[str, str]],
    now: str,
    fence: int | None = None,
) -> int | None:
    n = len(events)
    if fence is None:
        row = conn.execute(_APPEND_FREE_SQLITE.sqlite, (n, now, session_id)).fetchone()
    else:
        row = conn.execute(_APPEND_FENCED_SQLITE.sqlite, (n, now, session_id, fence)).fetchone()
    if row is None:
        if fence is not None:
            fenced_sqlite(conn, session_id, fence)
        return None
    first = row[0] - n + 1
    conn.executemany(
        _INSERT_EVENT.sqlite,
        [(session_id, first + i, t, p, now) for i, (t, p) in enumerate(events)],
    )
    return int(row[0])


_APPEND_PG = (
    "WITH s AS (UPDATE sessions SET last_seq = last_seq + :n, updated_at = :now"
    " WHERE id = :session_id{held} RETURNING last_seq),"
    " ins AS (INSERT INTO events (session_id, seq, type, payload, ts)"
    " SELECT :session_id, s.last_seq - :n + x.n, x.t, x.p::jsonb, :now"
    " FROM s, unnest(:types::text[], :payloads::text[]) WITH ORDINALITY AS x(t, p, n))"
    " SELECT last_seq FROM s"
)
_APPEND_ARGS = ("session_id", "n", "now", "types", "payloads")
_APPEND_FREE = ops.Statement(_APPEND_PG.format(held=""), params=_APPEND_ARGS)
_APPEND_FENCED = ops.Statement(
    _APPEND_PG.format(held=" AND lease_epoch = :fence"), params=(*_APPEND_ARGS, "fence")
)


async def _append_postgres(
    conn: Any, session_id: str, events: list[tuple[str, str]], now: Any, fence: int | None = None
) -> int | None:
    # the UPDATE locks the session's row and re-reads it after a concurrent acquisition:
    # the seq allocation and the fence check are one step
    # a text[] element skips the connection's text codec (asyncpg's array codec is its own)
    types = [escape_text(t) for t, _ in events]
    payloads = [p for _, p in events]
    if fence is None:
        last = await conn.fetchval(
            _APPEND_FREE.postgres, session_id, len(events), now, types, payloads
        )
    else:
        last = await conn.fetchval(
            _APPEND_FENCED.postgres, session_id, len(events), now, types, payloads, fence
        )
    if last is None and fence is not None:
        await fenced_postgres(conn, session_id, fence)
    return last  # type: ignore[no-any-return]


#: ``(session_id, events: [(type, payload JSON)], now, fence)``: the new last seq; None for no
#: session. ``Fenced`` when ``fence`` (None: unfenced) is not the session's lease epoch.
APPEND_EVENTS = ops.value(
    "append_events", sqlite=_append_sqlite, postgres=_append_postgres, writes=True
)


# -- read ---------------------------------------------------------------------------------------

_READ = ops.Statement(
    "SELECT * FROM events WHERE session_id = :session_id AND seq > :after_seq"
    " ORDER BY seq LIMIT :limit"
)


def _read_sqlite(
    conn: sqlite3.Connection, session_id: str, after_seq: int, limit: int
) -> list[Any]:
    require_session_sqlite(conn, session_id)
    return conn.execute(_READ.sqlite, (session_id, after_seq, limit)).fetchall()


async def _read_postgres(conn: Any, session_id: str, after_seq: int, limit: int) -> list[Any]:
    rows: list[Any] = await conn.fetch(_READ.postgres, session_id, after_seq, limit)
    if not rows:
        await require_session_postgres(conn, session_id)
    return rows


#: ``(session_id, after_seq, limit)``: by seq; ``NotFound`` for no session.
READ_EVENTS = ops.rows(
    "read_events", sqlite=_read_sqlite, postgres=_read_postgres, decode=event_record
)

#: A seq above every stored one (``read_events_back`` from the end).
_END = 1 << 62


def _read_back_sqlite(
    conn: sqlite3.Connection, session_id: str, types: list[str], before_seq: int | None, limit: int
) -> list[Any]:
    require_session_sqlite(conn, session_id)
    # the primary key (session_id, seq) read backwards from before_seq: a long log's end only
    marks = ", ".join("?" * len(types))
    return conn.execute(
        f"SELECT * FROM events WHERE session_id = ? AND seq < ? AND type IN ({marks})"
        " ORDER BY seq DESC LIMIT ?",
        (session_id, _END if before_seq is None else before_seq, *types, limit),
    ).fetchall()


_READ_BACK = ops.Statement(
    "SELECT * FROM events WHERE session_id = :session_id AND seq < :before_seq"
    " AND type = ANY(:types::text[]) ORDER BY seq DESC LIMIT :limit"
)


async def _read_back_postgres(
    conn: Any, session_id: str, types: list[str], before_seq: int | None, limit: int
) -> list[Any]:
    before = _END if before_seq is None else before_seq
    types = [escape_text(t) for t in types]  # text[]: see _append_postgres
    rows: list[Any] = await conn.fetch(_READ_BACK.postgres, session_id, before, types, limit)
    if not rows:
        await require_session_postgres(conn, session_id)
    return rows


#: ``(session_id, types, before_seq, limit)``: newest first; ``NotFound`` for no session.
READ_EVENTS_BACK = ops.rows(
    "read_events_back",
    sqlite=_read_back_sqlite,
    postgres=_read_back_postgres,
    decode=event_record,
)
#: ``(session_id) -> last seq | None``.
LAST_SEQ = ops.value("last_seq", "SELECT last_seq FROM sessions WHERE id = :session_id")


class EventMethods(StoreBase):
    """The store's methods on event logs (see :class:`runtime.store.front.Store`)."""

    async def append_events(
        self,
        session_id: str,
        events: Sequence[tuple[str, dict[str, Any]]],
        *,
        fence: int | None = None,
    ) -> list[EventRecord]:
        """Atomically append events to a session's log.

        Seqs are consecutive, gap-free and strictly increasing per session, however many
        appenders (tasks, processes, store instances) run at once. With ``fence``, only while
        it is the session's lease epoch (as ``claim_next_input``); else ``Fenced``.

        Args:
            session_id: the session.
            events: ``(type, payload)`` pairs; an empty sequence is a no-op.

        Returns:
            The stored events, with their seqs, in the given order.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        encoded = u.check_events(events)
        if not encoded:
            await self.last_seq(session_id)  # still NotFound for an unknown session
            return []
        now = self._now()
        last = await self.engine.run(
            APPEND_EVENTS,
            session_id=session_id,
            events=encoded,
            now=now,
            fence=u.check_fence(fence),
        )
        if last is None:
            raise u.no_session(session_id)
        first, at = last - len(encoded) + 1, ts(now)
        return [
            EventRecord(
                session_id=session_id, seq=first + i, type=t, payload=u.decode_json(p), ts=at
            )
            for i, (t, p) in enumerate(encoded)
        ]

    async def read_events(
        self, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        """Events with ``seq > after_seq``, ordered by seq, at most ``limit`` of them.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        u.check_int(after_seq, "after_seq")
        u.check_limit(limit)
        return await self.engine.run(
            READ_EVENTS, session_id=session_id, after_seq=after_seq, limit=limit
        )

    async def read_events_back(
        self,
        session_id: str,
        types: Sequence[str],
        before_seq: int | None = None,
        limit: int = 1000,
    ) -> list[EventRecord]:
        """The newest events whose type is one of ``types``, with ``seq < before_seq`` (all
        when None), newest first, at most ``limit`` of them: the end of a long log without
        reading all of it (a session's transcript, ``actors.sessions.history``).

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        wanted = [u.check_text(t, "type") for t in types]
        if not wanted or len(wanted) > MAX_EVENT_TYPES:
            raise ValueError(f"types must name 1 to {MAX_EVENT_TYPES} event types")
        if before_seq is not None:
            u.check_int(before_seq, "before_seq")
        u.check_limit(limit)
        return await self.engine.run(
            READ_EVENTS_BACK,
            session_id=session_id,
            types=wanted,
            before_seq=before_seq,
            limit=limit,
        )

    async def last_seq(self, session_id: str) -> int:
        """The seq of the session's last event, 0 when its log is empty.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        last = await self.engine.run(LAST_SEQ, session_id=session_id)
        if last is None:
            raise u.no_session(session_id)
        return int(last)
