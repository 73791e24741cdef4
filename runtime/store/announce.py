"""An input stored together with the event that announces it: one commit, not two.

A session that stores an input says so in its log (``turn_queued``) right after: two writes, and
on PostgreSQL two round trips and two commits, for every message a user sends (issue 26: a turn
was four round trips, enqueue, announcement, claim, closure). :meth:`AnnounceMethods.
enqueue_announced` makes them one transaction: the input, and the event whose payload names it
(its ``input_id``, which only the insert knows) at the session's next seq; with an
idempotency key, as ``enqueue_keyed``: a key already taken stores and announces nothing. On
PostgreSQL that is one statement (``_ANNOUNCED_PG``).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase, ts
from turnstile.runtime.store.events import APPEND_EVENTS
from turnstile.runtime.store.inbox import (
    INSERT_INPUT,
    INSERT_KEYED,
    KEYED_INPUT,
    input_record,
    same_input,
)
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
    key: str | None,
    fence: int | None,
) -> tuple[int | None, Any] | None:
    # one transaction (the writer's savepoint): a Fenced append takes the input back with it
    if not has_session_sqlite(conn, session_id):
        return None
    if key is None:
        row = conn.execute(INSERT_INPUT.sqlite, (session_id, source, payload, now)).fetchone()
    else:
        args = {"session_id": session_id, "source": source, "payload": payload, "now": now}
        values = INSERT_KEYED.values({**args, "state": "queued", "detail": None, "key": key})
        row = conn.execute(INSERT_KEYED.sqlite, values).fetchone()
        if row is None:  # the key's row, as it is: nothing announced
            return None, KEYED_INPUT.sqlite(conn, session_id=session_id, key=key)
    announced = [(type, _with_input_id(event, row["id"]))]
    seq = APPEND_EVENTS.sqlite(conn, session_id, announced, now, fence)
    return int(seq), row


# ``lk`` locks the session's row (checking the fence), ``i`` inserts the input under it (keyed:
# nothing when the key is taken), ``s`` allocates the seq only if ``i`` inserted, and ``e``
# inserts the event with ``i``'s id: each reads the one before, which orders them, and a stale
# fence, a missing session or a taken key writes nothing at all (no seq used up).
_ANNOUNCED_PG = (
    "WITH lk AS (SELECT 1 FROM sessions WHERE id = :session_id{held} FOR NO KEY UPDATE),"
    " i AS (INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at,"
    " idempotency_key) SELECT :session_id, :source, :payload::jsonb, 'queued', :now, :now,"
    " :key FROM lk{conflict} RETURNING *),"
    " s AS (UPDATE sessions SET last_seq = last_seq + 1, updated_at = :now"
    " WHERE id = :session_id AND EXISTS (SELECT 1 FROM i) RETURNING last_seq),"
    " e AS (INSERT INTO events (session_id, seq, type, payload, ts)"
    " SELECT :session_id, s.last_seq, :type, jsonb_build_object('input_id', i.id)"
    " || :event::jsonb, :now FROM s, i)"
    " SELECT EXISTS (SELECT 1 FROM lk) AS _held, (SELECT last_seq FROM s) AS _seq, i.*"
    " FROM (SELECT 1) AS one LEFT JOIN i ON true"
)
_ANNOUNCED_ARGS = ("session_id", "source", "payload", "type", "event", "now", "key")
_ANNOUNCED = {
    (fenced, keyed): ops.Statement(
        _ANNOUNCED_PG.format(
            held=" AND lease_epoch = :fence" if fenced else "",
            conflict=" ON CONFLICT DO NOTHING" if keyed else "",
        ),
        params=(*_ANNOUNCED_ARGS, "fence") if fenced else _ANNOUNCED_ARGS,
    )
    for fenced in (False, True)
    for keyed in (False, True)
}


async def _enqueue_announced_postgres(
    conn: Any,
    session_id: str,
    source: str,
    payload: str,
    type: str,  # noqa: A002
    event: str,
    now: Any,
    key: str | None,
    fence: int | None,
) -> tuple[int | None, Any] | None:
    statement = _ANNOUNCED[fence is not None, key is not None]
    values = (session_id, source, payload, type, event, now, key)
    if fence is None:
        row = await conn.fetchrow(statement.postgres, *values)
    else:
        row = await conn.fetchrow(statement.postgres, *values, fence)
    if not row["_held"]:  # no session, or a stale fence: nothing was written
        if fence is not None:
            await fenced_postgres(conn, session_id, fence)
        return None
    if row["id"] is None:  # the key is taken: its row, read in a statement (snapshot) of its own
        return None, await KEYED_INPUT.postgres(conn, session_id=session_id, key=key)
    return row["_seq"], row


#: ``(session_id, source, payload, type, event, now, key, fence)``: the event's seq and the
#: input's row (a taken ``key``: None and the key's row, nothing written), or None for no
#: session; ``Fenced`` when ``fence`` (None: unfenced) is not the session's lease epoch
#: (nothing is stored).
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
        idempotency_key: str | None = None,
        fence: int | None = None,
    ) -> tuple[InboxItem, EventRecord | None]:
        """Store a turn input (as :meth:`enqueue_input`, or with ``idempotency_key`` as
        :meth:`enqueue_keyed`) and append the event that announces it, in one transaction: the
        event's payload is ``event``'s with ``input_id`` (the new input's id) put first.

        Args:
            session_id: the session.
            source: where the input came from.
            payload: the input.
            event: ``(type, payload)`` of the announcement, its payload without ``input_id``.
            idempotency_key: as :meth:`enqueue_keyed`; a key already taken stores and
                announces nothing, and answers the key's row.
            fence: as :meth:`append_events`: stored only under that lease epoch.

        Returns:
            the input (new, or the key's), and the stored event (None: the key's row).

        Raises:
            NotFound: ``no session with id 'x'``.
            Fenced: ``fence`` was given and is no longer the session's lease epoch (nothing is
                stored).
            InvalidArgument: a malformed key.
            IdempotencyKeyReused: as :meth:`enqueue_keyed`.
            ValueError: ``event``'s payload already names an ``input_id``.
        """
        u.check_text(session_id, "session_id")
        u.check_text(source, "source")
        key = None if idempotency_key is None else u.check_idempotency_key(idempotency_key)
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
            key=key,
            fence=u.check_fence(fence),
        )
        if answer is None:
            raise u.no_session(session_id)
        seq, row = answer
        item = input_record(row)
        if seq is None:
            same_input(item, source, data)
            return item, None
        record = EventRecord(
            session_id=session_id,
            seq=seq,
            type=type_,
            payload={"input_id": item.id, **event[1]},
            ts=ts(now),
        )
        return item, record
