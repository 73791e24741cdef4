"""The webhooks feature's queries: store operations (``ops.procedure``), one function per backend.

Times are passed in as the store keeps them (``store.db_time``), so every "now" follows the
node's clock; they come back as aware datetimes. JSON columns go in and come out as text
(``TEXT`` on SQLite, ``JSONB`` on PostgreSQL, which asyncpg passes as text).

:data:`RECORD` is the idempotency: the delivery row is inserted ``ON CONFLICT DO NOTHING``
together with its targets, in one transaction, and two unique rules decide the conflict: the
delivery's id and its event identity (``event_key``), so of any number of identical
deliveries, or of one event resent under new delivery ids, arriving at once exactly one records
targets and every other answers None; the bindings are read in that same transaction, so a
delivery goes to the sessions bound when it was recorded (of the users the repository lets
bind, decided again at that moment).

The bindings' operations are in :mod:`bindings`. This module is over 400 lines because each
operation is written twice, once per backend, next to the SQL both share; a delivery's record,
claim, settlement and listings read one set of tables.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, overload

import msgspec

from turnstile.runtime.store import escape_json, ops, unescape_json

__all__ = [
    "CLAIM",
    "DELIVERIES",
    "PENDING",
    "PRUNE",
    "RECORD",
    "RELEASE",
    "SETTLE",
    "TARGETS",
    "UNROUTED",
    "Claimed",
    "Recorded",
    "Target",
    "Unrouted",
]


class Target(msgspec.Struct, frozen=True):
    """One session a delivery goes to, and how far it got."""

    delivery_id: str
    session_key: str
    owner: str
    state: str
    input_id: int | None
    attempts: int
    error: str | None


class Claimed(msgspec.Struct, frozen=True):
    """A target claimed for one delivery attempt, with what to deliver."""

    delivery_id: str
    session_key: str
    owner: str
    attempts: int
    hook: str
    event: str
    source_ref: str
    content: str
    payload: dict[str, Any]


class Unrouted(msgspec.Struct, frozen=True):
    """A delivery nobody was bound to (``GET /webhooks/unrouted``)."""

    delivery_id: str
    hook: str
    event: str
    source_ref: str
    source_keys: list[str]
    owner: str | None
    content: str
    payload: dict[str, Any]
    received_at: datetime


class Recorded(msgspec.Struct, frozen=True):
    """A recorded delivery and where it went (``GET /webhooks/deliveries``)."""

    delivery_id: str
    hook: str
    event: str
    source_ref: str
    #: ``routed`` (it had sessions to go to) or ``unrouted``.
    state: str
    owner: str | None
    received_at: datetime
    #: the sessions it went to (only the reader's own, unless all users' were asked for).
    targets: list[Target]


@overload
def _time(value: str | datetime) -> datetime: ...
@overload
def _time(value: None) -> None: ...
def _time(value: str | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


_json = msgspec.json.encode


def _text(value: Any) -> str:
    return escape_json(_json(value))  # U+0000 escaped as the store does (PostgreSQL's jsonb)


def _load(value: str | bytes) -> Any:
    return msgspec.json.decode(unescape_json(value))


# ---- record ----------------------------------------------------------------------------------

#: No conflict target: the id's primary key and ``event_key``'s unique index both count.
_INSERT_DELIVERY = (
    "INSERT INTO webhook_deliveries (id, hook, event, source_ref, source_keys, owner, state,"
    " content, payload, received_at, event_key) VALUES ({}) ON CONFLICT DO NOTHING"
)


def _allowed(rows: Any, owners: list[str] | None) -> list[tuple[str, str]]:
    """The bound ``(session_key, owner)`` rows whose owner may be routed to."""
    return [(row[0], row[1]) for row in rows if owners is None or row[1] in owners]


def _record_sqlite(
    conn: Any,
    *,
    delivery: dict[str, Any],
    lookup: list[str],
    owners: list[str] | None,
    fallback: list[tuple[str, str]],
    now: str,
) -> list[tuple[str, str]] | None:
    targets: list[tuple[str, str]] = []
    if lookup:
        marks = ", ".join("?" * len(lookup))
        rows = conn.execute(
            "SELECT DISTINCT session_key, owner FROM webhook_bindings"
            f" WHERE source_key IN ({marks}) ORDER BY session_key",
            lookup,
        )
        targets = _allowed(rows, owners)
    targets = targets or [(t[0], t[1]) for t in fallback]
    cursor = conn.execute(
        _INSERT_DELIVERY.format(", ".join("?" * 11)),
        (
            delivery["id"],
            delivery["hook"],
            delivery["event"],
            delivery["source_ref"],
            _text(delivery["source_keys"]),
            delivery["owner"],
            "routed" if targets else "unrouted",
            delivery["content"],
            _text(delivery["payload"]),
            now,
            delivery.get("event_key"),
        ),
    )
    if cursor.rowcount == 0:
        return None
    conn.executemany(
        "INSERT INTO webhook_targets (delivery_id, session_key, owner, state, updated_at)"
        " VALUES (?, ?, ?, 'accepted', ?)",
        [(delivery["id"], key, owner, now) for key, owner in targets],
    )
    return targets


async def _record_postgres(
    conn: Any,
    *,
    delivery: dict[str, Any],
    lookup: list[str],
    owners: list[str] | None,
    fallback: list[tuple[str, str]],
    now: datetime,
) -> list[tuple[str, str]] | None:
    async with conn.transaction():
        rows = await conn.fetch(
            "SELECT DISTINCT session_key, owner FROM webhook_bindings"
            " WHERE source_key = ANY($1::text[]) ORDER BY session_key",
            lookup,
        )
        targets = _allowed(rows, owners) or [(t[0], t[1]) for t in fallback]
        inserted = await conn.fetchval(
            _INSERT_DELIVERY.format(", ".join(f"${i}" for i in range(1, 12))) + " RETURNING id",
            delivery["id"],
            delivery["hook"],
            delivery["event"],
            delivery["source_ref"],
            _text(delivery["source_keys"]),
            delivery["owner"],
            "routed" if targets else "unrouted",
            delivery["content"],
            _text(delivery["payload"]),
            now,
            delivery.get("event_key"),
        )
        if inserted is None:
            return None
        await conn.executemany(
            "INSERT INTO webhook_targets (delivery_id, session_key, owner, state, updated_at)"
            " VALUES ($1, $2, $3, 'accepted', $4)",
            [(delivery["id"], key, owner, now) for key, owner in targets],
        )
        return targets


#: ``(delivery, lookup, owners, fallback, now) -> [(session_key, owner)] | None``: records the
#: delivery with its targets (the sessions bound to any ``lookup`` key whose owner is one of
#: ``owners``, or any owner for None; else ``fallback``); None when that id, or that event
#: (``delivery["event_key"]``, optional), is already recorded (a redelivery, or the same event
#: resent: nothing is written).
RECORD = ops.procedure(
    "webhooks.record", sqlite=_record_sqlite, postgres=_record_postgres, writes=True
)


# ---- deliver: claim, settle, release, pending --------------------------------------------------

_CLAIM = (
    "UPDATE webhook_targets SET claimed_until = {until}, attempts = attempts + 1,"
    " updated_at = {now} WHERE delivery_id = {id} AND session_key = {key}"
    " AND state = 'accepted' AND (claimed_until IS NULL OR claimed_until <= {now})"
    " RETURNING owner, attempts"
)
_CLAIMED = "SELECT hook, event, source_ref, content, payload FROM webhook_deliveries WHERE id = {}"


def _claimed(delivery_id: str, key: str, claim: Any, row: Any) -> Claimed:
    return Claimed(
        delivery_id=delivery_id,
        session_key=key,
        owner=claim[0],
        attempts=claim[1],
        hook=row[0],
        event=row[1],
        source_ref=row[2],
        content=row[3],
        payload=_load(row[4]),
    )


def _claim_sqlite(
    conn: Any, *, delivery_id: str, session_key: str, now: str, until: str
) -> Claimed | None:
    claim = conn.execute(
        _CLAIM.format(until="?", now="?", id="?", key="?"),
        (until, now, delivery_id, session_key, now),
    ).fetchone()
    if claim is None:
        return None
    row = conn.execute(_CLAIMED.format("?"), (delivery_id,)).fetchone()
    return _claimed(delivery_id, session_key, claim, row)


async def _claim_postgres(
    conn: Any, *, delivery_id: str, session_key: str, now: datetime, until: datetime
) -> Claimed | None:
    async with conn.transaction():
        claim = await conn.fetchrow(
            _CLAIM.format(until="$1", now="$2", id="$3", key="$4"),
            until,
            now,
            delivery_id,
            session_key,
        )
        if claim is None:
            return None
        row = await conn.fetchrow(_CLAIMED.format("$1"), delivery_id)
        return _claimed(delivery_id, session_key, claim, row)


#: ``(delivery_id, session_key, now, until) -> Claimed | None``: takes the target for one
#: attempt (a lease until ``until``), unless it is settled or another deliverer holds it.
CLAIM = ops.procedure("webhooks.claim", sqlite=_claim_sqlite, postgres=_claim_postgres, writes=True)

_SETTLE = (
    "UPDATE webhook_targets SET state = {state}, input_id = {input_id}, error = {error},"
    " claimed_until = NULL, updated_at = {now}"
    " WHERE delivery_id = {id} AND session_key = {key} AND state = 'accepted'"
)


def _settle_sqlite(conn: Any, **args: Any) -> int:
    return conn.execute(
        _SETTLE.format(state="?", input_id="?", error="?", now="?", id="?", key="?"),
        (
            args["state"],
            args["input_id"],
            args["error"],
            args["now"],
            args["delivery_id"],
            args["session_key"],
        ),
    ).rowcount


async def _settle_postgres(conn: Any, **args: Any) -> int:
    status = await conn.execute(
        _SETTLE.format(state="$1", input_id="$2", error="$3", now="$4", id="$5", key="$6"),
        args["state"],
        args["input_id"],
        args["error"],
        args["now"],
        args["delivery_id"],
        args["session_key"],
    )
    return int(status.split()[-1])


#: ``(delivery_id, session_key, state, input_id, error, now) -> rows``: ``delivered`` (with the
#: inbox row) or ``dropped`` (the session is gone); only an ``accepted`` target moves.
SETTLE = ops.procedure(
    "webhooks.settle", sqlite=_settle_sqlite, postgres=_settle_postgres, writes=True
)

_RELEASE = (
    "UPDATE webhook_targets SET claimed_until = {retry_at}, error = {error}, updated_at = {now}"
    " WHERE delivery_id = {id} AND session_key = {key} AND state = 'accepted'"
)


def _release_sqlite(conn: Any, **args: Any) -> None:
    conn.execute(
        _RELEASE.format(retry_at="?", error="?", now="?", id="?", key="?"),
        (args["retry_at"], args["error"], args["now"], args["delivery_id"], args["session_key"]),
    )


async def _release_postgres(conn: Any, **args: Any) -> None:
    await conn.execute(
        _RELEASE.format(retry_at="$1", error="$2", now="$3", id="$4", key="$5"),
        args["retry_at"],
        args["error"],
        args["now"],
        args["delivery_id"],
        args["session_key"],
    )


#: ``(delivery_id, session_key, error, now, retry_at)``: an attempt failed (a full queue…); the
#: target stays ``accepted`` and is not tried again before ``retry_at``.
RELEASE = ops.procedure(
    "webhooks.release", sqlite=_release_sqlite, postgres=_release_postgres, writes=True
)

_PENDING = (
    "SELECT delivery_id, session_key FROM webhook_targets WHERE state = 'accepted'"
    " AND (claimed_until IS NULL OR claimed_until <= {now}) ORDER BY updated_at LIMIT {limit}"
)


def _pending_sqlite(conn: Any, *, now: str, limit: int) -> list[tuple[str, str]]:
    rows = conn.execute(_PENDING.format(now="?", limit="?"), (now, limit))
    return [(row[0], row[1]) for row in rows]


async def _pending_postgres(conn: Any, *, now: datetime, limit: int) -> list[tuple[str, str]]:
    rows = await conn.fetch(_PENDING.format(now="$1", limit="$2"), now, limit)
    return [(row[0], row[1]) for row in rows]


#: ``(now, limit) -> [(delivery_id, session_key)]``: targets not yet delivered that nobody holds.
PENDING = ops.procedure("webhooks.pending", sqlite=_pending_sqlite, postgres=_pending_postgres)

_TARGETS = (
    "SELECT delivery_id, session_key, owner, state, input_id, attempts, error"
    " FROM webhook_targets WHERE delivery_id = {} ORDER BY session_key"
)


def _targets_sqlite(conn: Any, *, delivery_id: str) -> list[Target]:
    return [Target(*row) for row in conn.execute(_TARGETS.format("?"), (delivery_id,))]


async def _targets_postgres(conn: Any, *, delivery_id: str) -> list[Target]:
    return [Target(*row) for row in await conn.fetch(_TARGETS.format("$1"), delivery_id)]


#: ``(delivery_id) -> [Target]``: where a delivery went.
TARGETS = ops.procedure("webhooks.targets", sqlite=_targets_sqlite, postgres=_targets_postgres)


# ---- deliveries, as a person reads them ---------------------------------------------------------

_DELIVERIES = (
    "SELECT d.id, d.hook, d.event, d.source_ref, d.state, d.owner, d.received_at,"
    " t.delivery_id, t.session_key, t.owner, t.state, t.input_id, t.attempts, t.error"
    " FROM (SELECT * FROM webhook_deliveries w {mine}"
    " ORDER BY received_at DESC, id LIMIT {limit}) d"
    " LEFT JOIN webhook_targets t ON t.delivery_id = d.id {theirs}"
    " ORDER BY d.received_at DESC, d.id, t.session_key"
)
#: A delivery is the reader's when it was sent on their behalf (their repository, their hook)
#: or went to one of their sessions.
_MINE = (
    "WHERE w.owner = {0} OR EXISTS (SELECT 1 FROM webhook_targets x"
    " WHERE x.delivery_id = w.id AND x.owner = {0})"
)


def _recorded(rows: Any) -> list[Recorded]:
    out: list[Recorded] = []
    for row in rows:
        if not out or out[-1].delivery_id != row[0]:
            out.append(Recorded(row[0], row[1], row[2], row[3], row[4], row[5], _time(row[6]), []))
        if row[7] is not None:
            out[-1].targets.append(Target(*row[7:14]))
    return out


def _deliveries_sqlite(conn: Any, *, owner: str | None, limit: int) -> list[Recorded]:
    if owner is None:
        sql = _DELIVERIES.format(mine="", limit="?", theirs="")
        return _recorded(conn.execute(sql, (limit,)))
    sql = _DELIVERIES.format(mine=_MINE.format("?"), limit="?", theirs="AND t.owner = ?")
    return _recorded(conn.execute(sql, (owner, owner, limit, owner)))


async def _deliveries_postgres(conn: Any, *, owner: str | None, limit: int) -> list[Recorded]:
    if owner is None:
        sql = _DELIVERIES.format(mine="", limit="$1", theirs="")
        return _recorded(await conn.fetch(sql, limit))
    sql = _DELIVERIES.format(mine=_MINE.format("$1"), limit="$2", theirs="AND t.owner = $1")
    return _recorded(await conn.fetch(sql, owner, limit))


#: ``(owner, limit) -> [Recorded]``, newest first, each with its targets; ``owner=None`` lists
#: everyone's (admins), else only the owner's deliveries and, of each, the owner's targets.
DELIVERIES = ops.procedure(
    "webhooks.deliveries",
    sqlite=_deliveries_sqlite,
    postgres=_deliveries_postgres,
)


# ---- unrouted, pruning -------------------------------------------------------------------------

_UNROUTED = (
    "SELECT id, hook, event, source_ref, source_keys, owner, content, payload, received_at"
    " FROM webhook_deliveries WHERE state = 'unrouted' {mine}"
    " ORDER BY received_at DESC, id LIMIT {limit}"
)


def _unrouted(row: Any) -> Unrouted:
    return Unrouted(
        delivery_id=row[0],
        hook=row[1],
        event=row[2],
        source_ref=row[3],
        source_keys=_load(row[4]),
        owner=row[5],
        content=row[6],
        payload=_load(row[7]),
        received_at=_time(row[8]),
    )


def _unrouted_sqlite(conn: Any, *, owner: str | None, limit: int) -> list[Unrouted]:
    if owner is None:
        rows = conn.execute(_UNROUTED.format(mine="", limit="?"), (limit,))
    else:
        rows = conn.execute(_UNROUTED.format(mine="AND owner = ?", limit="?"), (owner, limit))
    return [_unrouted(row) for row in rows]


async def _unrouted_postgres(conn: Any, *, owner: str | None, limit: int) -> list[Unrouted]:
    if owner is None:
        rows = await conn.fetch(_UNROUTED.format(mine="", limit="$1"), limit)
    else:
        rows = await conn.fetch(_UNROUTED.format(mine="AND owner = $1", limit="$2"), owner, limit)
    return [_unrouted(row) for row in rows]


#: ``(owner, limit) -> [Unrouted]``, newest first; ``owner=None`` lists everyone's (admins).
UNROUTED = ops.procedure("webhooks.unrouted", sqlite=_unrouted_sqlite, postgres=_unrouted_postgres)


def _prune_sqlite(conn: Any, *, before: str) -> int:
    return conn.execute("DELETE FROM webhook_deliveries WHERE received_at < ?", (before,)).rowcount


async def _prune_postgres(conn: Any, *, before: datetime) -> int:
    status = await conn.execute("DELETE FROM webhook_deliveries WHERE received_at < $1", before)
    return int(status.split()[-1])


#: ``(before) -> deliveries deleted`` (their targets with them): the end of the idempotency
#: window; a delivery redelivered after it is new again.
PRUNE = ops.procedure("webhooks.prune", sqlite=_prune_sqlite, postgres=_prune_postgres, writes=True)
