"""The store's key-value table: small state that belongs to no table of its own.

Watchers (``watchers``) and notification buffers (``notify:<session>``) keep rows here. An item
whose ``expires_at`` has passed reads as absent and is purged hourly. ``kv_append`` numbers a
namespace's items without a gap or a repeat however many nodes append at once: a counter row
under key ``""``, locked by the appending transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase

__all__ = ["KVMethods"]

#: An item that has not expired at ``:now``.
_LIVE = " AND (expires_at IS NULL OR expires_at > :now)"

_PUT = ops.Statement(
    "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
    " VALUES (:namespace, :key, :value::jsonb, :expires_at, :now)"
    " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
    " expires_at = excluded.expires_at, updated_at = excluded.updated_at",
    params=("namespace", "key", "value", "expires_at", "now"),
)


#: SQLite: many items in one statement, their ``[namespace, key, value, expires_at]`` a JSON
#: array read with ``json_each``. The writer thread releases the GIL around every statement it
#: steps and must take it back after; while the trio thread computes, each take waits up to the
#: switch interval (5 ms). ``executemany`` of 10,000 rows beside a busy Python thread took 4-55
#: s, this one statement 0.04-0.1 s (0.04 s either way on an idle box), so a watchers' flush of
#: 11,000 items at 10,000 watchers held its lock 10 s instead of a fraction of one, and
#: ``start_watcher`` starved behind it (docs/performance.md, watchers).
_PUT_MANY_SQLITE = (
    "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
    " SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'),"
    " json_extract(j.value, '$[2]'), json_extract(j.value, '$[3]'), ?"
    " FROM json_each(?) AS j WHERE true"
    " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
    " expires_at = excluded.expires_at, updated_at = excluded.updated_at"
)


def _put_rows_sqlite(
    conn: sqlite3.Connection, rows: list[tuple[str, str, str, Any]], now: str
) -> None:
    """Insert or replace ``(namespace, key, value JSON, expires_at)`` rows, the last of a
    repeated key winning (as one after the other would)."""
    if len(rows) > 1 and not any("\x00" in row[0] or "\x00" in row[1] for row in rows):
        last = list({(row[0], row[1]): row for row in rows}.values())
        conn.execute(_PUT_MANY_SQLITE, (now, msgspec.json.encode(last).decode()))
    else:  # one row, or a name with U+0000 (which a JSON string round trip might not keep)
        conn.executemany(_PUT.sqlite, [(*row, now) for row in rows])


def _put_sqlite(
    conn: sqlite3.Connection, namespace: str, rows: list[tuple[str, str, Any]], now: str
) -> None:
    _put_rows_sqlite(conn, [(namespace, key, value, expires) for key, value, expires in rows], now)


async def _put_postgres(
    conn: Any, namespace: str, rows: list[tuple[str, str, Any]], now: Any
) -> None:
    values = [(namespace, key, value, expires, now) for key, value, expires in rows]
    await conn.executemany(_PUT.postgres, values)


#: ``(namespace, rows: [(key, value JSON, expires_at)], now)``: inserted or replaced.
KV_PUT = ops.execute("kv_put", sqlite=_put_sqlite, postgres=_put_postgres)
#: ``(namespace, key, now) -> value JSON | None``.
KV_GET = ops.value(
    "kv_get", "SELECT value FROM kv WHERE namespace = :namespace AND key = :key" + _LIVE
)
_DELETE_ONE = ops.Statement(
    "DELETE FROM kv WHERE namespace = :namespace AND key = :key", params=("namespace", "key")
)


def _delete_sqlite(conn: sqlite3.Connection, namespace: str, keys: list[str]) -> int:
    return sum(conn.execute(_DELETE_ONE.sqlite, (namespace, key)).rowcount for key in keys)


#: ``(namespace, keys) -> how many existed``.
KV_DELETE = ops.count(
    "kv_delete",
    sqlite=_delete_sqlite,
    postgres="DELETE FROM kv WHERE namespace = :namespace AND key = ANY(:keys::text[])",
)


def _delete_pairs_sqlite(conn: sqlite3.Connection, namespaces: list[str], keys: list[str]) -> int:
    pairs = zip(namespaces, keys, strict=True)
    return sum(conn.execute(_DELETE_ONE.sqlite, pair).rowcount for pair in pairs)


#: ``(namespaces, keys) -> how many existed``: the items ``(namespaces[i], keys[i])``, in one
#: transaction, so rows of several namespaces that describe one thing go together.
KV_DELETE_PAIRS = ops.count(
    "kv_delete_pairs",
    sqlite=_delete_pairs_sqlite,
    postgres="DELETE FROM kv WHERE (namespace, key) IN"
    " (SELECT * FROM unnest(:namespaces::text[], :keys::text[]))",
)


def _item(row: Any) -> tuple[str, dict[str, Any]]:
    return row["key"], u.decode_json(row["value"])


#: ``(namespace, after, limit, now) -> [(key, value)]`` in key order.
KV_LIST = ops.rows(
    "kv_list",
    "SELECT key, value FROM kv WHERE namespace = :namespace AND key > :after"
    + _LIVE
    + " ORDER BY key LIMIT :limit",
    decode=_item,
)
#: ``(now) -> how many expired items were deleted``.
KV_PURGE = ops.count(
    "kv_purge", "DELETE FROM kv WHERE expires_at IS NOT NULL AND expires_at <= :now"
)

_INSERT_ITEM = ops.Statement(
    "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
    " VALUES (:namespace, :key, :value::jsonb, :expires_at, :now)",
    params=("namespace", "key", "value", "expires_at", "now"),
)
_COUNT_SQLITE = ops.Statement(
    "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
    " VALUES (:namespace, '', '{\"seq\":1}', NULL, :now)"
    " ON CONFLICT (namespace, key) DO UPDATE SET updated_at = excluded.updated_at,"
    " value = json_object('seq', json_extract(kv.value, '$.seq') + 1)"
    " RETURNING json_extract(value, '$.seq')",
    params=("namespace", "now"),
)
_KEEP_SQLITE = ops.Statement(
    "DELETE FROM kv WHERE namespace = :namespace AND key IN (SELECT key FROM kv"
    " WHERE namespace = :namespace AND key <> '' ORDER BY key DESC LIMIT -1 OFFSET :keep)",
    params=("namespace", "keep"),
)


def _append_sqlite(
    conn: sqlite3.Connection,
    namespace: str,
    value: str,
    expires: str | None,
    keep: int | None,
    now: str,
) -> int:
    # One writer at a time (the store's writer thread): the counter needs no lock of its own.
    (seq,) = conn.execute(_COUNT_SQLITE.sqlite, (namespace, now)).fetchone()
    conn.execute(_INSERT_ITEM.sqlite, (namespace, f"{seq:020d}", value, expires, now))
    if keep is not None:
        conn.execute(_KEEP_SQLITE.sqlite, (namespace, keep))
    return int(seq)


_BUMP_PG = ops.Statement(
    "UPDATE kv SET value = jsonb_build_object('seq', (value->>'seq')::bigint + 1),"
    " updated_at = :now WHERE namespace = :namespace AND key = ''"
    " RETURNING (value->>'seq')::bigint",
    params=("namespace", "now"),
)
_COUNT_PG = ops.Statement(
    "INSERT INTO kv (namespace, key, value, expires_at, updated_at)"
    " VALUES (:namespace, '', '{\"seq\": 1}', NULL, :now)"
    " ON CONFLICT (namespace, key) DO UPDATE SET updated_at = :now,"
    " value = jsonb_build_object('seq', (kv.value->>'seq')::bigint + 1)"
    " RETURNING (value->>'seq')::bigint",
    params=("namespace", "now"),
)
_KEEP_PG = ops.Statement(
    "DELETE FROM kv WHERE namespace = :namespace AND key IN (SELECT key FROM kv"
    " WHERE namespace = :namespace AND key <> '' ORDER BY key DESC OFFSET :keep)",
    params=("namespace", "keep"),
)


async def _append_postgres(
    conn: Any, namespace: str, value: str, expires: Any, keep: int | None, now: Any
) -> int:
    # The counter row's lock (its UPDATE, or the INSERT's conflict) orders concurrent appends
    # until the transaction ends: gapless, never repeated.
    async with conn.transaction():
        seq = await conn.fetchval(_BUMP_PG.postgres, namespace, now)
        if seq is None:
            seq = await conn.fetchval(_COUNT_PG.postgres, namespace, now)
        values = (namespace, f"{seq:020d}", value, expires, now)
        await conn.execute(_INSERT_ITEM.postgres, *values)
        if keep is not None:
            await conn.execute(_KEEP_PG.postgres, namespace, keep)
    return int(seq)


#: ``(namespace, value, expires, keep, now) -> the item's number``, one more than the
#: namespace's last.
KV_APPEND = ops.value("kv_append", sqlite=_append_sqlite, postgres=_append_postgres, writes=True)


#: How many unexpired items of ``namespace`` have a key starting with ``prefix``, counted up
#: to ``limit``.
_PREFIXED = ops.Statement(
    "SELECT count(*) FROM (SELECT 1 FROM kv WHERE namespace = :namespace AND key >= :prefix"
    " AND substr(key, 1, :length) = :prefix AND (expires_at IS NULL OR expires_at > :now)"
    " LIMIT :limit) AS found",
    params=("namespace", "prefix", "length", "now", "limit"),
)
#: Serialises the bounded puts under one prefix across connections (and nodes), to the end of
#: the transaction.
_LOCK_PREFIX = ops.Statement(
    "SELECT pg_advisory_xact_lock(hashtext('kv:' || :namespace::text || chr(31) || :prefix::text))",
    params=("namespace", "prefix"),
)


def _put_within_sqlite(
    conn: sqlite3.Connection,
    rows: list[tuple[str, str, str, Any]],
    namespace: str,
    prefix: str,
    limit: int,
    now: str,
) -> int | None:
    # In the writer's transaction: no other write runs between the count and the puts.
    (found,) = conn.execute(
        _PREFIXED.sqlite, (namespace, prefix, len(prefix), now, limit)
    ).fetchone()
    if found >= limit:
        return int(found)
    _put_rows_sqlite(conn, rows, now)
    return None


async def _put_within_postgres(
    conn: Any,
    rows: list[tuple[str, str, str, Any]],
    namespace: str,
    prefix: str,
    limit: int,
    now: Any,
) -> int | None:
    async with conn.transaction():
        await conn.execute(_LOCK_PREFIX.postgres, namespace, prefix)
        found = await conn.fetchval(_PREFIXED.postgres, namespace, prefix, len(prefix), now, limit)
        if found >= limit:
            return int(found)
        await conn.executemany(_PUT.postgres, [(*row, now) for row in rows])
    return None


#: ``(rows: [(namespace, key, value JSON, expires_at)], namespace, prefix, limit, now) ->
#: None | count``: the rows inserted or replaced, unless ``namespace`` has ``limit`` live keys
#: starting with ``prefix`` already (then that count); the count and the puts in one
#: transaction, on PostgreSQL under a lock on the namespace and prefix.
KV_PUT_WITHIN = ops.procedure(
    "kv_put_within", sqlite=_put_within_sqlite, postgres=_put_within_postgres, writes=True
)


def _put_items_sqlite(
    conn: sqlite3.Connection, rows: list[tuple[str, str, str, Any]], now: str
) -> None:
    _put_rows_sqlite(conn, rows, now)


async def _put_items_postgres(conn: Any, rows: list[tuple[str, str, str, Any]], now: Any) -> None:
    async with conn.transaction():
        await conn.executemany(_PUT.postgres, [(*row, now) for row in rows])


#: ``(rows: [(namespace, key, value JSON, expires_at)], now)``: inserted or replaced, in one
#: transaction.
KV_PUT_ITEMS = ops.procedure(
    "kv_put_items", sqlite=_put_items_sqlite, postgres=_put_items_postgres, writes=True
)


class KVMethods(StoreBase):
    """The store's key-value methods (see :class:`runtime.store.front.Store`)."""

    async def kv_put(
        self,
        namespace: str,
        items: Sequence[tuple[str, dict[str, Any], datetime | None]],
    ) -> None:
        """Insert or replace ``(key, value, expires_at)`` items of ``namespace``, in one commit.

        For small state that belongs to no table of its own (watchers, notification buffers):
        ``value`` is a JSON object; an item whose ``expires_at`` has passed reads as absent.
        """
        u.check_text(namespace, "namespace")
        rows = [
            (
                u.check_text(key, "key"),
                u.encode_json(value, "value"),
                self._optional_time(expires, "expires_at"),
            )
            for key, value, expires in items
        ]
        if rows:
            await self.engine.run(KV_PUT, namespace=namespace, rows=rows, now=self._now())

    async def kv_put_items(
        self, items: Sequence[tuple[str, str, dict[str, Any], datetime | None]]
    ) -> None:
        """Insert or replace ``(namespace, key, value, expires_at)`` items, in one commit.

        For one thing kept under several namespaces (a watcher's row and its index entry): a
        crash leaves them all as they were or all as written, never one of each.
        """
        rows = [
            (
                u.check_text(space, "namespace"),
                u.check_text(key, "key"),
                u.encode_json(value, "value"),
                self._optional_time(expires, "expires_at"),
            )
            for space, key, value, expires in items
        ]
        if rows:
            await self.engine.run(KV_PUT_ITEMS, rows=rows, now=self._now())

    async def kv_put_within(
        self,
        items: Sequence[tuple[str, str, dict[str, Any], datetime | None]],
        *,
        namespace: str,
        prefix: str,
        limit: int,
    ) -> int | None:
        """Insert or replace ``(namespace, key, value, expires_at)`` items, in one commit,
        unless ``namespace`` already has ``limit`` unexpired keys starting with ``prefix``.

        The count and the puts are one transaction (on PostgreSQL under a lock on
        ``namespace`` and ``prefix``), so concurrent puts under one prefix, through any number
        of nodes, never pass ``limit``: a per-owner limit on rows kept here (a session's
        watchers, whose index keys start with the session's key).

        Returns:
            None when the items were written; else how many keys have the prefix (``limit``
            at most), and nothing was written.
        """
        u.check_text(namespace, "namespace")
        check = u.check_int(limit, "limit")
        if check < 1:
            raise ValueError("limit must be positive")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        rows = [
            (
                u.check_text(space, "namespace"),
                u.check_text(key, "key"),
                u.encode_json(value, "value"),
                self._optional_time(expires, "expires_at"),
            )
            for space, key, value, expires in items
        ]
        return await self.engine.run(
            KV_PUT_WITHIN,
            rows=rows,
            namespace=namespace,
            prefix=prefix,
            limit=check,
            now=self._now(),
        )

    async def kv_get(self, namespace: str, key: str) -> dict[str, Any] | None:
        """The value under ``key``, or None (missing or expired)."""
        value = await self.engine.run(KV_GET, namespace=namespace, key=key, now=self._now())
        return u.decode_optional_json(value)  # type: ignore[no-any-return]

    async def kv_delete(self, namespace: str, keys: Sequence[str]) -> int:
        """Delete ``keys`` of ``namespace``; returns how many existed."""
        return await self.engine.run(KV_DELETE, namespace=namespace, keys=list(keys))

    async def kv_delete_items(self, items: Sequence[tuple[str, str]]) -> int:
        """Delete the ``(namespace, key)`` items, in one commit; returns how many existed.

        For one thing kept under several namespaces (a watcher's row, its history chunks and
        its index entry): a crash leaves all of them or none.
        """
        namespaces = [u.check_text(space, "namespace") for space, _ in items]
        keys = [u.check_text(key, "key") for _, key in items]
        if not keys:
            return 0
        return await self.engine.run(KV_DELETE_PAIRS, namespaces=namespaces, keys=keys)

    async def kv_list(
        self, namespace: str, *, after_key: str | None = None, limit: int = 1000
    ) -> list[tuple[str, dict[str, Any]]]:
        """Unexpired ``(key, value)`` pairs of ``namespace`` in key order, after ``after_key``."""
        return await self.engine.run(
            KV_LIST, namespace=namespace, after=after_key or "", limit=limit, now=self._now()
        )

    async def kv_purge_expired(self) -> int:
        """Delete every expired item; returns how many."""
        return await self.engine.run(KV_PURGE, now=self._now())

    async def kv_append(
        self,
        namespace: str,
        value: dict[str, Any],
        *,
        expires_at: datetime | None = None,
        keep: int | None = None,
    ) -> int:
        """Append ``value`` to ``namespace`` under the next number, in one transaction.

        Numbers are 1, 2, 3, … per namespace, without a gap or a repeat however many writers
        (nodes) append at once: a counter row (key ``""``, which ``kv_list`` never returns)
        is incremented and locked by the transaction that stores the item. The item's key is
        the number, zero-padded to 20 digits, so key order is number order. With ``keep``,
        only the newest ``keep`` items stay (the oldest are deleted in the same transaction);
        a reader tells what was dropped or expired from the gaps between the numbers it sees
        and the counter (``kv_get(namespace, "")`` is ``{"seq": <last number>}``).

        Returns:
            The item's number.
        """
        u.check_text(namespace, "namespace")
        if keep is not None and keep < 1:
            raise InvalidArgument("keep must be at least 1", field="keep")
        return await self.engine.run(
            KV_APPEND,
            namespace=namespace,
            value=u.encode_json(value, "value"),
            expires=self._optional_time(expires_at, "expires_at"),
            keep=keep,
            now=self._now(),
        )
