"""The webhooks feature's bindings: which sessions a source key's events go to.

Its table is ``webhook_bindings``. Store operations like :mod:`queries`' (``ops.procedure``,
one function per backend); times go in as the store keeps them (``store.db_time``) and come
back as aware datetimes.

:data:`BIND` takes a source for one user: a source already bound by another user's session is
refused (``ConflictError``, field ``source``), checked and written in one transaction (SQLite's
one writer; on PostgreSQL a transaction lock on the source, after the one on the session that
keeps ``max_bindings_per_session``), so of two users binding one source at once exactly one
holds it. Who may bind at all is the config's (``RepoConfig``), checked by the caller before.
:data:`END_SESSION` ends a deleted session's bindings and drops its undelivered targets.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from turnstile.runtime.errors import ConflictError, LimitExceeded
from turnstile.runtime.store import ops

__all__ = ["BIND", "BINDINGS", "END_SESSION", "UNBIND", "Binding"]


class Binding(msgspec.Struct, frozen=True):
    """A session bound to a source key."""

    source: str
    session_key: str
    owner: str
    #: how: ``tool`` (bind_source), ``http`` (POST …/bindings), ``pull_request`` (a PR opened).
    via: str
    created_at: datetime


def _time(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _full(limit: int) -> LimitExceeded:
    return LimitExceeded(
        f"this session is bound to {limit} sources already (limit {limit})", field="source"
    )


def _taken(source: str) -> ConflictError:
    # names neither the other user nor their session
    return ConflictError(f"{source} is bound to another user's session", field="source")


_OTHERS = "SELECT 1 FROM webhook_bindings WHERE source_key = {} AND owner <> {} LIMIT 1"


_BINDING_COLUMNS = "source_key, session_key, owner, via, created_at"


def _binding(row: Any) -> Binding:
    return Binding(row[0], row[1], row[2], row[3], _time(row[4]))


def _bind_sqlite(
    conn: Any, *, owner: str, session_key: str, source: str, via: str, now: str, limit: int
) -> tuple[Binding, bool]:
    existing = conn.execute(
        f"SELECT {_BINDING_COLUMNS} FROM webhook_bindings WHERE session_key = ? AND source_key = ?",
        (session_key, source),
    ).fetchone()
    if existing is not None:
        return _binding(existing), False
    if conn.execute(_OTHERS.format("?", "?"), (source, owner)).fetchone() is not None:
        raise _taken(source)
    (count,) = conn.execute(
        "SELECT count(*) FROM webhook_bindings WHERE session_key = ?", (session_key,)
    ).fetchone()
    if count >= limit:
        raise _full(limit)
    row = conn.execute(
        "INSERT INTO webhook_bindings (session_key, source_key, owner, via, created_at)"
        f" VALUES (?, ?, ?, ?, ?) RETURNING {_BINDING_COLUMNS}",
        (session_key, source, owner, via, now),
    ).fetchone()
    return _binding(row), True


async def _bind_postgres(
    conn: Any, *, owner: str, session_key: str, source: str, via: str, now: datetime, limit: int
) -> tuple[Binding, bool]:
    async with conn.transaction():
        # one binder per session at a time, so the count cannot be raced past the limit, and
        # one per source, so two users cannot both find it free (always in this order)
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", session_key)
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext('webhooks source ' || $1))", source
        )
        existing = await conn.fetchrow(
            f"SELECT {_BINDING_COLUMNS} FROM webhook_bindings"
            " WHERE session_key = $1 AND source_key = $2",
            session_key,
            source,
        )
        if existing is not None:
            return _binding(existing), False
        if await conn.fetchval(_OTHERS.format("$1", "$2"), source, owner) is not None:
            raise _taken(source)
        count = await conn.fetchval(
            "SELECT count(*) FROM webhook_bindings WHERE session_key = $1", session_key
        )
        if count >= limit:
            raise _full(limit)
        row = await conn.fetchrow(
            "INSERT INTO webhook_bindings (session_key, source_key, owner, via, created_at)"
            f" VALUES ($1, $2, $3, $4, $5) RETURNING {_BINDING_COLUMNS}",
            session_key,
            source,
            owner,
            via,
            now,
        )
        return _binding(row), True


#: ``(owner, session_key, source, via, now, limit) -> (Binding, created)``; binding a source the
#: session has already answers the existing binding. Raises ``ConflictError`` (field
#: ``source``) when a session of another user holds the source, ``LimitExceeded`` past
#: ``limit``.
BIND = ops.procedure("webhooks.bind", sqlite=_bind_sqlite, postgres=_bind_postgres, writes=True)


def _unbind_sqlite(conn: Any, *, session_key: str, source: str) -> int:
    return conn.execute(
        "DELETE FROM webhook_bindings WHERE session_key = ? AND source_key = ?",
        (session_key, source),
    ).rowcount


async def _unbind_postgres(conn: Any, *, session_key: str, source: str) -> int:
    status = await conn.execute(
        "DELETE FROM webhook_bindings WHERE session_key = $1 AND source_key = $2",
        session_key,
        source,
    )
    return int(status.split()[-1])


#: ``(session_key, source) -> rows deleted``.
UNBIND = ops.procedure(
    "webhooks.unbind", sqlite=_unbind_sqlite, postgres=_unbind_postgres, writes=True
)


def _bindings_sqlite(conn: Any, *, session_key: str) -> list[Binding]:
    rows = conn.execute(
        f"SELECT {_BINDING_COLUMNS} FROM webhook_bindings WHERE session_key = ?"
        " ORDER BY source_key",
        (session_key,),
    )
    return [_binding(row) for row in rows]


async def _bindings_postgres(conn: Any, *, session_key: str) -> list[Binding]:
    rows = await conn.fetch(
        f"SELECT {_BINDING_COLUMNS} FROM webhook_bindings WHERE session_key = $1"
        " ORDER BY source_key",
        session_key,
    )
    return [_binding(row) for row in rows]


#: ``(session_key) -> [Binding]``, by source.
BINDINGS = ops.procedure("webhooks.bindings", sqlite=_bindings_sqlite, postgres=_bindings_postgres)


def _end_sqlite(conn: Any, *, session_key: str, now: str) -> None:
    conn.execute("DELETE FROM webhook_bindings WHERE session_key = ?", (session_key,))
    conn.execute(
        "UPDATE webhook_targets SET state = 'dropped', error = 'session deleted',"
        " claimed_until = NULL, updated_at = ? WHERE session_key = ? AND state = 'accepted'",
        (now, session_key),
    )


async def _end_postgres(conn: Any, *, session_key: str, now: datetime) -> None:
    async with conn.transaction():
        await conn.execute("DELETE FROM webhook_bindings WHERE session_key = $1", session_key)
        await conn.execute(
            "UPDATE webhook_targets SET state = 'dropped', error = 'session deleted',"
            " claimed_until = NULL, updated_at = $1 WHERE session_key = $2 AND state = 'accepted'",
            now,
            session_key,
        )


#: ``(session_key, now)``: a deleted session's bindings go, its undelivered targets are dropped.
END_SESSION = ops.procedure(
    "webhooks.end_session", sqlite=_end_sqlite, postgres=_end_postgres, writes=True
)
