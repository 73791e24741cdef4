"""An input stored together with the event that announces it: one commit, not two.

A session that stores an input says so in its log (``turn_queued``) right after: two writes, and
on PostgreSQL two round trips and two commits, for every message a user sends (issue 26: a turn
was four round trips, enqueue, announcement, claim, closure). :meth:`AnnounceMethods.
enqueue_announced` makes them one transaction: the input, and the event whose payload names it
(its ``input_id``, which only the insert knows) at the session's next seq. On PostgreSQL that is
one statement: ``s`` takes the session's row lock, allocates the seq and checks the fence, ``i``
inserts the input only if ``s`` did, and ``e`` the event with ``i``'s id.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase, ts
from turnstile.runtime.store.events import APPEND_EVENTS
from turnstile.runtime.store.inbox import INSERT_INPUT, input_record
from turnstile.runtime.store.records import EventRecord, InboxItem
from turnstile.runtime.store.sessions import fenced_postgres, has_session_sqlite

__all__ = ["AnnounceMethods", "ENQUEUE_ANNOUNCED"]


def _with_input_id(event: str, input_id: int) -> str:
    """The event's payload (compact JSON of an object) with ``input_id`` first."""
    return f'{{"input_id":{input_id}}}' if event == "{}" else f'{{"input_id":{input_id},{event[1:]}'


def _enqueue_announced_sqlite(
    conn: sqlite3.Connection,
    session_id: str,
    source: str,
    payload: str,
    type: str,  # noqa: A002 - the event's type, as the events table names it
    event: str,
    now: str,
    fence: int | None,
) -> tuple[int, Any] | None:
    # one transaction (the writer's savepoint): a Fenced append takes the input back with it
    if not has_session_sqlite(conn, session_id):
        return None
    row = conn.execute(INSERT_INPUT.sqlite, (session_id, source, payload, now)).fetchone()
    announced = [(type, _with_input_id(event, row["id"]))]
    seq = APPEND_EVENTS.sqlite(conn, session_id, announced, now, fence)
    return int(seq), row


_ANNOUNCED_PG = (
    "WITH s AS (UPDATE sessions SET last_seq = last_seq + 1, updated_at = :now"
    " WHERE id = :session_id{held} RETURNING last_seq),"
    " i AS (INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at)"
    " SELECT :session_id, :source, :payload::jsonb, 'queued', :now, :now FROM s RETURNING *),"
    " e AS (INSERT INTO events (session_id, seq, type, payload, ts)"
    " SELECT :session_id, s.last_seq, :type, jsonb_build_object('input_id', i.id)"
    " || :event::jsonb, :now FROM s, i)"
    " SELECT s.last_seq AS _seq, i.* FROM s, i"
)
_ANNOUNCED_ARGS = ("session_id", "source", "payload", "type", "event", "now")
_ANNOUNCED_FREE = ops.Statement(_ANNOUNCED_PG.format(held=""), params=_ANNOUNCED_ARGS)
_ANNOUNCED_FENCED = ops.Statement(
    _ANNOUNCED_PG.format(held=" AND lease_epoch = :fence"), params=(*_ANNOUNCED_ARGS, "fence")
)


async def _enqueue_announced_postgres(
    conn: Any,
    session_id: str,
    source: str,
    payload: str,
    type: str,  # noqa: A002
    event: str,
    now: Any,
    fence: int | None,
) -> tuple[int, Any] | None:
    values = (session_id, source, payload, type, event, now)
    if fence is None:
        row = await conn.fetchrow(_ANNOUNCED_FREE.postgres, *values)
    else:
        row = await conn.fetchrow(_ANNOUNCED_FENCED.postgres, *values, fence)
    if row is None:
        if fence is not None:
            await fenced_postgres(conn, session_id, fence)
        return None
    return row["_seq"], row


#: ``(session_id, source, payload, type, event, now, fence)``: the event's seq and the input's
#: row, or None for no session; ``Fenced`` when ``fence`` (None: unfenced) is not the session's
#: lease epoch (nothing is stored).
ENQUEUE_ANNOUNCED = ops.procedure(
    "enqueue_announced",
    sqlite=_enqueue_announced_sqlite,
    postgres=_enqueue_announced_postgres,
    writes=True,
)


class AnnounceMethods(StoreBase):
    """The store's enqueue with its announcement, in one transaction."""

    async def enqueue_announced(
        self,
        session_id: str,
        source: str,
        payload: dict[str, Any],
        event: tuple[str, dict[str, Any]],
        *,
        fence: int | None = None,
    ) -> tuple[InboxItem, EventRecord]:
        """Store a turn input (as :meth:`enqueue_input`) and append the event that announces
        it, in one transaction: the event's payload is ``event``'s with ``input_id`` (the new
        input's id) put first.

        Args:
            session_id: the session.
            source: where the input came from.
            payload: the input.
            event: ``(type, payload)`` of the announcement, its payload without ``input_id``.
            fence: as :meth:`append_events`: stored only under that lease epoch.

        Returns:
            the stored input and the stored event.

        Raises:
            NotFound: ``no session with id 'x'``.
            Fenced: ``fence`` was given and is no longer the session's lease epoch (nothing is
                stored).
            ValueError: ``event``'s payload already names an ``input_id``.
        """
        u.check_text(session_id, "session_id")
        u.check_text(source, "source")
        data = u.encode_json(payload)
        ((type_, announced),) = u.check_events([event])
        if "input_id" in event[1]:
            raise ValueError("the announcement's payload gets its input_id from the store")
        now = self._now()
        answer = await self.engine.run(
            ENQUEUE_ANNOUNCED,
            session_id=session_id,
            source=source,
            payload=data,
            type=type_,
            event=announced,
            now=now,
            fence=u.check_fence(fence),
        )
        if answer is None:
            raise u.no_session(session_id)
        seq, row = answer
        item = input_record(row)
        record = EventRecord(
            session_id=session_id,
            seq=seq,
            type=type_,
            payload={"input_id": item.id, **event[1]},
            ts=ts(now),
        )
        return item, record
