"""The memory change log: each user's changes, durably and in order, behind the ``memory``
topic (``runtime.gateway.topics``) and ``GET /memory/changes``.

Every write of ``Memory`` (a save, a forget, the summary, deleting everything) runs here as one
transaction that makes the change *and* appends its events (``events.py``) to the user's log,
so the log never says what did not happen nor misses what did, whoever wrote: a tool, a route,
extraction. After the commit the events are published to the user's subscribed WebSockets.

Tables (their own migration set, ``memory_changes``, next to the feature's ``memory`` set):

===========================  ================================================================
``memory_change_heads``      per user: ``last_seq`` (the latest event's), ``pruned_seq``
                             (events up to it may be gone unsuperseded), ``kept`` (rows held)
``memory_changes``           ``(owner, seq)``: ``type``, ``subject``, ``payload`` (JSON),
                             ``created_at``
===========================  ================================================================

``seq`` counts per user from 1 and only grows; the head row is updated first in every write,
so on PostgreSQL it is also the lock that orders one user's writes across nodes.

What the log keeps. An event supersedes the earlier ones about the same subject (one fact, the
summary; ``MemoryDeleted`` supersedes all): they are deleted as it is appended, so a forgotten
value does not live on in the log, a fact saved a thousand times is one row, and replaying the
log from any point gives the same final state as replaying every event would have. ``seq``
therefore has gaps. Beyond ``keep`` rows per user (``[memory] changes_kept``) the oldest are
dropped and ``pruned_seq`` moves: a client that saw less than it must reload
(``TopicHead.pruned_seq``, ``reset``).

Other nodes: a summary set and a user's memory deleted also announce themselves on PostgreSQL
(``pg_notify`` in the same transaction: sent if and only if it commits), for the caches other
nodes keep (``notices.py``).

Expiry: a fact past its ``expires_at`` is deleted at its owner's next save, which appends a
``fact_forgotten`` with ``reason: "expired"``; nothing is published at the moment it expires
(``fact_saved`` carries ``expires_at`` for a console to hide it on time).

It is over 400 lines because every memory write is logged in the same transaction as the write
itself, once per backend (the change log's head locked on PostgreSQL), and each write's logged
form sits beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import msgspec
import trio

from turnstile.actors.memory.account_queries import DELETE_USER, SET_SUMMARY
from turnstile.actors.memory.events import (
    EVERYTHING,
    FactForgotten,
    FactSaved,
    MemoryChange,
    MemoryDeleted,
    SummaryChanged,
)
from turnstile.actors.memory.notices import CHANNEL
from turnstile.actors.memory.queries import FORGET, SAVE
from turnstile.runtime.errors import StoreError
from turnstile.runtime.gateway.topics import TopicEvent, TopicHead
from turnstile.runtime.store import Migration, MigrationSet, Store, ops

__all__ = [
    "CHANGES",
    "TOPIC",
    "ChangeLog",
    "DELETE_USER_LOGGED",
    "FORGET_LOGGED",
    "SAVE_LOGGED",
    "SET_SUMMARY_LOGGED",
]

#: The topic's name on the gateway.
TOPIC = "memory"

#: How long a write may run shielded from its caller's cancellation (``ChangeLog.write``).
WRITE_SHIELD_SECONDS = 60.0

_SQLITE_V1 = (
    """CREATE TABLE memory_change_heads (
        owner TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL,
        pruned_seq INTEGER NOT NULL DEFAULT 0,
        kept INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE memory_changes (
        owner TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        subject TEXT NOT NULL,
        payload TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (owner, seq)
    )""",
    "CREATE INDEX memory_changes_subject ON memory_changes (owner, subject)",
)

_POSTGRES_V1 = (
    """CREATE TABLE memory_change_heads (
        owner TEXT PRIMARY KEY,
        last_seq BIGINT NOT NULL,
        pruned_seq BIGINT NOT NULL DEFAULT 0,
        kept INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE memory_changes (
        owner TEXT NOT NULL,
        seq BIGINT NOT NULL,
        type TEXT NOT NULL,
        subject TEXT NOT NULL,
        payload TEXT NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (owner, seq)
    )""",
    "CREATE INDEX memory_changes_subject ON memory_changes (owner, subject)",
)

#: The change log's tables: a migration set of its own, so the feature's ``memory`` set (and
#: whoever opens a store with only that set, such as ``turnstile memory backfill``) is
#: unaffected.
CHANGES = MigrationSet(
    "memory_changes",
    (
        Migration(1, "change log", sqlite=_SQLITE_V1, postgres=_POSTGRES_V1),
        # each logged save first lists the owner's expired facts: by index, not by reading
        # all of the owner's facts (a save then costs about what it did without the log)
        Migration(
            2,
            "expired facts by owner",
            statements=(
                "CREATE INDEX memory_facts_owner_expiry ON memory_facts (owner, expires_at)"
                " WHERE expires_at IS NOT NULL",
            ),
        ),
    ),
)

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(dict[str, Any]).decode


def _time(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _stored(changes: list[MemoryChange]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for change in changes:
        kind, payload = change.stored()
        yield kind, change.subject, payload


# ---- appending (inside a write's transaction) -----------------------------------------------


def _append_sqlite(
    conn: Any, owner: str, changes: list[MemoryChange], now: str, keep: int
) -> list[TopicEvent]:
    conn.execute(
        "INSERT INTO memory_change_heads (owner, last_seq) VALUES (?, 0)"
        " ON CONFLICT (owner) DO NOTHING",
        (owner,),
    )
    seq, pruned, kept = conn.execute(
        "SELECT last_seq, pruned_seq, kept FROM memory_change_heads WHERE owner = ?", (owner,)
    ).fetchone()
    events = []
    for kind, subject, payload in _stored(changes):
        seq += 1
        if subject == EVERYTHING:
            gone = conn.execute("DELETE FROM memory_changes WHERE owner = ?", (owner,))
        else:
            gone = conn.execute(
                "DELETE FROM memory_changes WHERE owner = ? AND subject = ?", (owner, subject)
            )
        conn.execute(
            "INSERT INTO memory_changes (owner, seq, type, subject, payload, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (owner, seq, kind, subject, _encode(payload).decode(), now),
        )
        kept += 1 - gone.rowcount
        events.append(TopicEvent(seq, kind, _time(now), payload))
    if kept > keep:
        (cut,) = conn.execute(
            "SELECT seq FROM memory_changes WHERE owner = ? ORDER BY seq LIMIT 1 OFFSET ?",
            (owner, kept - keep - 1),
        ).fetchone()
        kept -= conn.execute(
            "DELETE FROM memory_changes WHERE owner = ? AND seq <= ?", (owner, cut)
        ).rowcount
        pruned = cut
    conn.execute(
        "UPDATE memory_change_heads SET last_seq = ?, pruned_seq = ?, kept = ? WHERE owner = ?",
        (seq, pruned, kept, owner),
    )
    return events


#: Creates or locks the owner's head row (held until the transaction ends: one writer per user
#: at a time, across nodes), answering ``last_seq, pruned_seq, kept``; a query may add columns.
_LOCK_HEAD = (
    "WITH head AS (INSERT INTO memory_change_heads (owner, last_seq) VALUES ($1, 0)"
    " ON CONFLICT (owner) DO UPDATE SET last_seq = memory_change_heads.last_seq"
    " RETURNING last_seq, pruned_seq, kept)"
    " SELECT head.last_seq, head.pruned_seq, head.kept{more} FROM head"
)


async def _lock_head_postgres(conn: Any, owner: str) -> tuple[int, int, int]:
    """Create or lock ``owner``'s head row; its ``(last_seq, pruned_seq, kept)``."""
    row = await conn.fetchrow(_LOCK_HEAD.format(more=""), owner)
    return row[0], row[1], row[2]


#: One event appended: the events it supersedes deleted, it inserted, the head moved; one round
#: trip. (A data-modifying CTE sees the rows as they were before the statement, so the DELETE
#: never meets the row being inserted.) ``{which}`` narrows the DELETE to the subject.
_APPEND = (
    "WITH gone AS (DELETE FROM memory_changes WHERE owner = $1{which} RETURNING 1),"
    " added AS (INSERT INTO memory_changes (owner, seq, type, subject, payload, created_at)"
    " VALUES ($1, $3, $4, $2, $5, $6))"
    " UPDATE memory_change_heads SET last_seq = $3, kept = kept + 1 - (SELECT count(*) FROM gone)"
    " WHERE owner = $1 RETURNING kept"
)
_APPEND_ONE = _APPEND.format(which=" AND subject = $2")
_APPEND_ALL = _APPEND.format(which="")


async def _append_postgres(
    conn: Any,
    owner: str,
    head: tuple[int, int, int],
    changes: list[MemoryChange],
    now: datetime,
    keep: int,
) -> list[TopicEvent]:
    seq, _, kept = head
    events = []
    for kind, subject, payload in _stored(changes):
        seq += 1
        kept = await conn.fetchval(
            _APPEND_ALL if subject == EVERYTHING else _APPEND_ONE,
            owner,
            subject,
            seq,
            kind,
            _encode(payload).decode(),
            now,
        )
        events.append(TopicEvent(seq, kind, now, payload))
    if kept > keep:
        await conn.execute(
            "WITH cut AS (SELECT seq FROM memory_changes WHERE owner = $1"
            " ORDER BY seq LIMIT 1 OFFSET $2),"
            " gone AS (DELETE FROM memory_changes WHERE owner = $1 AND seq <= (SELECT seq FROM cut)"
            " RETURNING 1)"
            " UPDATE memory_change_heads SET pruned_seq = (SELECT seq FROM cut),"
            " kept = kept - (SELECT count(*) FROM gone) WHERE owner = $1",
            owner,
            kept - keep - 1,
        )
    return events


# ---- the writes, each with its events -------------------------------------------------------

#: The owner's expired facts (the ones a save deletes first), found through
#: ``memory_facts_owner_expiry`` (migration 2) rather than by reading every fact of the owner.
_EXPIRED = (
    "SELECT category, key FROM memory_facts"
    " WHERE owner = {o} AND expires_at IS NOT NULL AND expires_at <= {n}"
)
_LIVE = (
    "SELECT 1 FROM memory_facts WHERE owner = {o} AND category = {c} AND key = {k}"
    " AND (expires_at IS NULL OR expires_at > {n})"
)


def _save_changes(expired: list[tuple[str, str]], fact: Any, created: bool) -> list[MemoryChange]:
    """The events of a save: the owner's facts it found expired (and deleted), then the fact
    (an expired fact of the same key is simply replaced)."""
    changes: list[MemoryChange] = [
        FactForgotten(category=c, key=k, reason="expired")
        for c, k in expired
        if (c, k) != (fact.category, fact.key)
    ]
    view = msgspec.to_builtins(fact)
    view.pop("owner", None)  # the topic is the owner's
    changes.append(FactSaved(fact=view, created=created))
    return changes


def _save_sqlite(conn: Any, *, keep: int, **args: Any) -> tuple[Any, list[TopicEvent]]:
    owner, fact, now = args["owner"], args["fact"], args["now"]
    expired = conn.execute(_EXPIRED.format(o="?", n="?"), (owner, now)).fetchall()
    live = conn.execute(
        _LIVE.format(o="?1", c="?2", k="?3", n="?4"),
        (owner, fact["category"], fact["key"], now),
    ).fetchone()
    saved = SAVE.sqlite(conn, **args)
    changes = _save_changes([tuple(r) for r in expired], saved, live is None)
    return saved, _append_sqlite(conn, owner, changes, now, keep)


async def _save_postgres(conn: Any, *, keep: int, **args: Any) -> tuple[Any, list[TopicEvent]]:
    owner, fact, now = args["owner"], args["fact"], args["now"]
    expired = _EXPIRED.format(o="$1", n="$2").replace(
        "SELECT category, key", "SELECT ARRAY[category, key]"
    )
    live = _LIVE.format(o="$1", c="$3", k="$4", n="$2")
    more = f", ARRAY({expired}) AS expired, EXISTS({live}) AS live"
    async with conn.transaction():
        row = await conn.fetchrow(
            _LOCK_HEAD.format(more=more), owner, now, fact["category"], fact["key"]
        )
        saved = await SAVE.postgres(conn, **args)  # its own transaction: a savepoint in ours
        gone = [(c, k) for c, k in row["expired"] or ()]
        changes = _save_changes(gone, saved, not row["live"])
        head = (row[0], row[1], row[2])
        return saved, await _append_postgres(conn, owner, head, changes, now, keep)


#: ``queries.SAVE``'s arguments plus ``keep`` -> ``(Fact, [TopicEvent])``: the save and its
#: events (expired facts it deleted, then ``fact_saved``) in one transaction.
SAVE_LOGGED = ops.procedure(
    "memory.save_logged", sqlite=_save_sqlite, postgres=_save_postgres, writes=True
)


_MATCHING = "SELECT DISTINCT category FROM memory_facts WHERE owner = {o} AND key = {k}"


def _forget_sqlite(
    conn: Any, *, owner: str, key: str, category: str | None, now: str, keep: int
) -> tuple[int, list[TopicEvent]]:
    sql, args = _MATCHING.format(o="?", k="?"), [owner, key]
    if category is not None:
        sql, args = sql + " AND category = ?", [*args, category]
    categories = [r[0] for r in conn.execute(sql, args).fetchall()]
    deleted = FORGET.sqlite(conn, owner=owner, key=key, category=category)
    changes: list[MemoryChange] = [FactForgotten(category=c, key=key) for c in sorted(categories)]
    return deleted, _append_sqlite(conn, owner, changes, now, keep) if deleted else []


async def _forget_postgres(
    conn: Any, *, owner: str, key: str, category: str | None, now: datetime, keep: int
) -> tuple[int, list[TopicEvent]]:
    matching = _MATCHING.format(o="$1", k="$2") + " AND ($3::text IS NULL OR category = $3)"
    async with conn.transaction():
        row = await conn.fetchrow(
            _LOCK_HEAD.format(more=f", ARRAY({matching}) AS categories"), owner, key, category
        )
        deleted = await FORGET.postgres(conn, owner=owner, key=key, category=category)
        if not deleted:
            return 0, []
        changes: list[MemoryChange] = [
            FactForgotten(category=c, key=key) for c in sorted(row["categories"])
        ]
        return deleted, await _append_postgres(conn, owner, tuple(row[:3]), changes, now, keep)


#: ``(owner, key, category, now, keep) -> (deleted, [TopicEvent])``: ``queries.FORGET`` and a
#: ``fact_forgotten`` per fact it deleted.
FORGET_LOGGED = ops.procedure(
    "memory.forget_logged", sqlite=_forget_sqlite, postgres=_forget_postgres, writes=True
)


async def _announce_postgres(conn: Any, announce: str | None) -> None:
    """``pg_notify`` the other nodes with ``announce`` (``notices.announcement``) inside the
    write's transaction: PostgreSQL sends it when, and only if, the write commits. (SQLite is one
    node's: its writes take ``announce`` and ignore it.)"""
    if announce is not None:
        await conn.execute(
            f"SELECT pg_notify({ops.scoped_channel_sql('$1')}, $2)", CHANNEL, announce
        )


def _summary_sqlite(
    conn: Any, *, owner: str, content: str, now: str, keep: int, announce: str | None = None
) -> tuple[Any, list[TopicEvent]]:
    summary = SET_SUMMARY.sqlite(conn, owner=owner, content=content, now=now)
    change = SummaryChanged(summary=summary.content, updated_at=summary.updated_at)
    return summary, _append_sqlite(conn, owner, [change], now, keep)


async def _summary_postgres(
    conn: Any,
    *,
    owner: str,
    content: str,
    now: datetime,
    keep: int,
    announce: str | None = None,
) -> tuple[Any, list[TopicEvent]]:
    async with conn.transaction():
        head = await _lock_head_postgres(conn, owner)
        summary = await SET_SUMMARY.postgres(conn, owner=owner, content=content, now=now)
        change = SummaryChanged(summary=summary.content, updated_at=summary.updated_at)
        await _announce_postgres(conn, announce)
        return summary, await _append_postgres(conn, owner, head, [change], now, keep)


#: ``(owner, content, now, keep, announce=None) -> (Summary, [TopicEvent])``:
#: ``queries.SET_SUMMARY`` and its ``summary_changed`` (and ``announce``, see above).
SET_SUMMARY_LOGGED = ops.procedure(
    "memory.set_summary_logged",
    sqlite=_summary_sqlite,
    postgres=_summary_postgres,
    writes=True,
)


def _delete_sqlite(
    conn: Any, *, owner: str, now: str, keep: int, announce: str | None = None
) -> tuple[dict[str, int], list[TopicEvent]]:
    counts = DELETE_USER.sqlite(conn, owner=owner)
    return counts, _append_sqlite(conn, owner, [MemoryDeleted(deleted=counts)], now, keep)


async def _delete_postgres(
    conn: Any, *, owner: str, now: datetime, keep: int, announce: str | None = None
) -> tuple[dict[str, int], list[TopicEvent]]:
    async with conn.transaction():
        head = await _lock_head_postgres(conn, owner)
        counts = await DELETE_USER.postgres(conn, owner=owner)
        change = MemoryDeleted(deleted=counts)
        await _announce_postgres(conn, announce)
        return counts, await _append_postgres(conn, owner, head, [change], now, keep)


#: ``(owner, now, keep, announce=None) -> (counts, [TopicEvent])``: ``queries.DELETE_USER``,
#: and the user's log emptied of everything but one ``memory_deleted`` (which holds only the
#: counts); ``announce`` as above.
DELETE_USER_LOGGED = ops.procedure(
    "memory.delete_user_logged",
    sqlite=_delete_sqlite,
    postgres=_delete_postgres,
    writes=True,
)


# ---- reading --------------------------------------------------------------------------------


def _head_sqlite(conn: Any, *, owner: str) -> TopicHead:
    row = conn.execute(
        "SELECT last_seq, pruned_seq FROM memory_change_heads WHERE owner = ?", (owner,)
    ).fetchone()
    return TopicHead() if row is None else TopicHead(row[0], row[1])


async def _head_postgres(conn: Any, *, owner: str) -> TopicHead:
    row = await conn.fetchrow(
        "SELECT last_seq, pruned_seq FROM memory_change_heads WHERE owner = $1", owner
    )
    return TopicHead() if row is None else TopicHead(row[0], row[1])


def _read_sqlite(conn: Any, *, owner: str, after_seq: int, limit: int) -> list[TopicEvent]:
    rows = conn.execute(
        "SELECT seq, type, created_at, payload FROM memory_changes"
        " WHERE owner = ? AND seq > ? ORDER BY seq LIMIT ?",
        (owner, after_seq, limit),
    ).fetchall()
    return [TopicEvent(r[0], r[1], _time(r[2]), _decode(r[3])) for r in rows]


async def _read_postgres(conn: Any, *, owner: str, after_seq: int, limit: int) -> list[TopicEvent]:
    rows = await conn.fetch(
        "SELECT seq, type, created_at, payload FROM memory_changes"
        " WHERE owner = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        owner,
        after_seq,
        limit,
    )
    return [TopicEvent(r[0], r[1], r[2], _decode(r[3])) for r in rows]


def _page_sqlite(
    conn: Any, *, owner: str, after_seq: int, limit: int
) -> tuple[TopicHead, list[TopicEvent]]:
    head = _head_sqlite(conn, owner=owner)
    return head, _read_sqlite(conn, owner=owner, after_seq=after_seq, limit=limit)


async def _page_postgres(
    conn: Any, *, owner: str, after_seq: int, limit: int
) -> tuple[TopicHead, list[TopicEvent]]:
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        head = await _head_postgres(conn, owner=owner)
        return head, await _read_postgres(conn, owner=owner, after_seq=after_seq, limit=limit)


#: ``(owner) -> TopicHead``.
HEAD = ops.procedure("memory.changes_head", sqlite=_head_sqlite, postgres=_head_postgres)
#: ``(owner, after_seq, limit) -> [TopicEvent]`` oldest first.
READ = ops.procedure("memory.changes_read", sqlite=_read_sqlite, postgres=_read_postgres)
#: ``(owner, after_seq, limit) -> (TopicHead, [TopicEvent])`` from one snapshot.
PAGE = ops.procedure("memory.changes_page", sqlite=_page_sqlite, postgres=_page_postgres)


# ---- the log as the gateway and the service see it ------------------------------------------


class ChangeLog:
    """The ``memory`` topic's log (a ``runtime.gateway.topics.TopicLog``), and where ``Memory``
    hands the events of each write once it committed.

    Args:
        store: the node's store (the ``memory_changes`` set applied).
        keep: events kept per user (``[memory] changes_kept``).
        publish: ``(owner, events)``, called after each committed write, in ``seq`` order per
            owner (``UserTopics.publish`` bound to the topic); None publishes nothing.
    """

    def __init__(
        self,
        store: Store,
        keep: int,
        publish: Callable[[str, list[TopicEvent]], Any] | None = None,
    ) -> None:
        self.store = store
        self.keep = keep
        self._publish = publish
        self._locks: dict[str, tuple[trio.Lock, int]] = {}

    async def head(self, user: str) -> TopicHead:
        """Where ``user``'s log stands."""
        return await self.store.run(HEAD, owner=user)

    async def read(self, user: str, after_seq: int, limit: int) -> list[TopicEvent]:
        """``user``'s events after ``after_seq``, oldest first, at most ``limit``."""
        return await self.store.run(READ, owner=user, after_seq=after_seq, limit=limit)

    async def page(
        self, user: str, after_seq: int, limit: int
    ) -> tuple[TopicHead, list[TopicEvent]]:
        """Where ``user``'s log stands and their events after ``after_seq`` (at most
        ``limit``), read together."""
        return await self.store.run(PAGE, owner=user, after_seq=after_seq, limit=limit)

    @asynccontextmanager
    async def writing(self, owner: str):
        """Hold ``owner``'s turn to write: one write at a time per user on this node, so their
        events are published in the order they were committed."""
        lock, holders = self._locks.get(owner, (trio.Lock(), 0))
        self._locks[owner] = (lock, holders + 1)
        try:
            async with lock:
                yield
        finally:
            lock, holders = self._locks[owner]
            if holders == 1:
                del self._locks[owner]
            else:
                self._locks[owner] = (lock, holders - 1)

    async def write(self, query: ops.Operation[Any], /, **args: Any) -> Any:
        """Run a ``*_LOGGED`` write for ``args["owner"]`` and publish its events; its first
        answer.

        The write is shielded from cancellation once started (for at most
        ``WRITE_SHIELD_SECONDS``): it commits and its events are published, or it fails; a
        caller cancelled meanwhile cannot leave a committed change unannounced.

        Raises:
            StoreError: the write failed, or took longer than ``WRITE_SHIELD_SECONDS``.
        """
        owner = args["owner"]
        async with self.writing(owner):
            with trio.move_on_after(WRITE_SHIELD_SECONDS, shield=True) as scope:
                answer, events = await self.store.run(query, keep=self.keep, **args)
                if events and self._publish is not None:
                    self._publish(owner, events)
            if scope.cancelled_caught:
                raise StoreError(f"{query.name} took longer than {WRITE_SHIELD_SECONDS:g} s")
        return answer
