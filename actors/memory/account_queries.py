"""The memory feature's queries on what a user has beyond search: listing facts, the
summary, the sessions' extraction state, and deleting a user's memory (store operations, one
function per backend, as in ``queries.py``). Every query filters on the owner.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from turnstile.actors.memory.queries import (
    FACT_COLUMNS,
    SORT_KEYS,
    Fact,
    Summary,
    fact_from_postgres,
    fact_from_sqlite,
    like_pattern,
    sqlite_time,
)
from turnstile.runtime.store import ops

__all__ = [
    "DELETE_USER",
    "END_SESSION",
    "EXTRACTED_AT",
    "GET_SUMMARY",
    "LIST",
    "MARK_EXTRACTED",
    "SET_SUMMARY",
]

# ---- list -----------------------------------------------------------------------------------


def _list_where(
    owner: str | None, category: str | None, search: str | None, sigil: str
) -> tuple[str, list[Any]]:
    """The WHERE clause of a list and its arguments after ``now`` (always the first).

    Placeholders are numbered on both backends (``?2`` on SQLite, ``$2`` on PostgreSQL), so
    the search pattern is passed once for its three columns.
    """
    clauses, args = [f"(expires_at IS NULL OR expires_at > {sigil}1)"], []
    if owner is not None:
        args.append(owner)
        clauses.append(f"owner = {sigil}{1 + len(args)}")
    if category is not None:
        args.append(category)
        clauses.append(f"category = {sigil}{1 + len(args)}")
    if search:
        args.append(like_pattern(search))
        m = f"{sigil}{1 + len(args)}"
        like = "LIKE" if sigil == "?" else "ILIKE"  # SQLite's LIKE ignores ASCII case
        clauses.append(
            "("
            + " OR ".join(f"{c} {like} {m} ESCAPE '\\'" for c in ("category", "key", "value"))
            + ")"
        )
    return " AND ".join(clauses), args


def _order(sort_by: str, sort_order: str) -> str:
    if sort_by not in SORT_KEYS or sort_order not in ("asc", "desc"):
        raise ValueError(f"cannot sort by {sort_by!r} {sort_order!r}")
    return f"{sort_by} {sort_order.upper()}, owner, category, key"


def _list_sqlite(
    conn: Any,
    *,
    owner: str | None,
    now: str,
    limit: int,
    offset: int,
    search: str | None,
    sort_by: str,
    sort_order: str,
    category: str | None = None,
) -> tuple[list[Fact], int]:
    where, args = _list_where(owner, category, search, "?")
    n = 2 + len(args)
    (total,) = conn.execute(
        f"SELECT count(*) FROM memory_facts WHERE {where}", (now, *args)
    ).fetchone()
    rows = conn.execute(
        f"SELECT {FACT_COLUMNS} FROM memory_facts WHERE {where}"
        f" ORDER BY {_order(sort_by, sort_order)} LIMIT ?{n} OFFSET ?{n + 1}",
        (now, *args, limit, offset),
    ).fetchall()
    return [fact_from_sqlite(r) for r in rows], total


async def _list_postgres(
    conn: Any,
    *,
    owner: str | None,
    now: datetime,
    limit: int,
    offset: int,
    search: str | None,
    sort_by: str,
    sort_order: str,
    category: str | None = None,
) -> tuple[list[Fact], int]:
    where, args = _list_where(owner, category, search, "$")
    n = 2 + len(args)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        total = await conn.fetchval(f"SELECT count(*) FROM memory_facts WHERE {where}", now, *args)
        rows = await conn.fetch(
            f"SELECT {FACT_COLUMNS} FROM memory_facts WHERE {where}"
            f" ORDER BY {_order(sort_by, sort_order)} LIMIT ${n} OFFSET ${n + 1}",
            now,
            *args,
            limit,
            offset,
        )
    return [fact_from_postgres(r) for r in rows], total


#: ``(owner | None, now, limit, offset, search, sort_by, sort_order) -> ([Fact], total)``;
#: ``owner=None`` is every user's (admins only: the caller checks). ``search`` is a
#: case-insensitive substring of category, key or value; ``category`` (optional) keeps that
#: category's facts only (exact, as saved).
LIST = ops.procedure("memory.list", sqlite=_list_sqlite, postgres=_list_postgres)


# ---- summary --------------------------------------------------------------------------------


def _get_summary_sqlite(conn: Any, *, owner: str) -> Summary | None:
    row = conn.execute(
        "SELECT content, updated_at FROM memory_summary WHERE owner = ?", (owner,)
    ).fetchone()
    return None if row is None else Summary(row[0], sqlite_time(row[1]))


async def _get_summary_postgres(conn: Any, *, owner: str) -> Summary | None:
    row = await conn.fetchrow(
        "SELECT content, updated_at FROM memory_summary WHERE owner = $1", owner
    )
    return None if row is None else Summary(row[0], row[1])


def _set_summary_sqlite(conn: Any, *, owner: str, content: str, now: str) -> Summary:
    conn.execute(
        "INSERT INTO memory_summary (owner, content, updated_at) VALUES (?, ?, ?)"
        " ON CONFLICT (owner) DO UPDATE SET content = excluded.content,"
        " updated_at = excluded.updated_at",
        (owner, content, now),
    )
    return Summary(content, sqlite_time(now))


async def _set_summary_postgres(conn: Any, *, owner: str, content: str, now: datetime) -> Summary:
    await conn.execute(
        "INSERT INTO memory_summary (owner, content, updated_at) VALUES ($1, $2, $3)"
        " ON CONFLICT (owner) DO UPDATE SET content = excluded.content,"
        " updated_at = excluded.updated_at",
        owner,
        content,
        now,
    )
    return Summary(content, now)


#: ``(owner) -> Summary | None``.
GET_SUMMARY = ops.procedure(
    "memory.get_summary",
    sqlite=_get_summary_sqlite,
    postgres=_get_summary_postgres,
)
#: ``(owner, content, now) -> Summary``: replaces the owner's summary.
SET_SUMMARY = ops.procedure(
    "memory.set_summary",
    sqlite=_set_summary_sqlite,
    postgres=_set_summary_postgres,
    writes=True,
)


# ---- extraction state -----------------------------------------------------------------------


def _mark_sqlite(conn: Any, *, session_key: str, at: str) -> None:
    conn.execute(
        "INSERT INTO memory_session_state (session_key, extracted_at) VALUES (?, ?)"
        " ON CONFLICT (session_key) DO UPDATE SET extracted_at = excluded.extracted_at",
        (session_key, at),
    )


async def _mark_postgres(conn: Any, *, session_key: str, at: datetime) -> None:
    await conn.execute(
        "INSERT INTO memory_session_state (session_key, extracted_at) VALUES ($1, $2)"
        " ON CONFLICT (session_key) DO UPDATE SET extracted_at = excluded.extracted_at",
        session_key,
        at,
    )


def _extracted_sqlite(conn: Any, *, session_key: str) -> datetime | None:
    row = conn.execute(
        "SELECT extracted_at FROM memory_session_state WHERE session_key = ?", (session_key,)
    ).fetchone()
    return None if row is None else sqlite_time(row[0])


async def _extracted_postgres(conn: Any, *, session_key: str) -> datetime | None:
    return await conn.fetchval(
        "SELECT extracted_at FROM memory_session_state WHERE session_key = $1", session_key
    )


def _end_session_sqlite(conn: Any, *, session_key: str) -> None:
    conn.execute("DELETE FROM memory_session_state WHERE session_key = ?", (session_key,))


async def _end_session_postgres(conn: Any, *, session_key: str) -> None:
    await conn.execute("DELETE FROM memory_session_state WHERE session_key = $1", session_key)


#: ``(session_key, at)``: the session was processed by extraction at ``at``.
MARK_EXTRACTED = ops.procedure(
    "memory.mark_extracted", sqlite=_mark_sqlite, postgres=_mark_postgres, writes=True
)
#: ``(session_key) -> datetime | None``.
EXTRACTED_AT = ops.procedure(
    "memory.extracted_at",
    sqlite=_extracted_sqlite,
    postgres=_extracted_postgres,
)
#: ``(session_key)``: forget a deleted session's extraction state.
END_SESSION = ops.procedure(
    "memory.end_session",
    sqlite=_end_session_sqlite,
    postgres=_end_session_postgres,
    writes=True,
)


# ---- a user's data --------------------------------------------------------------------------


def _delete_user_sqlite(conn: Any, *, owner: str) -> dict[str, int]:
    facts = conn.execute("DELETE FROM memory_facts WHERE owner = ?", (owner,)).rowcount
    summary = conn.execute("DELETE FROM memory_summary WHERE owner = ?", (owner,)).rowcount
    sessions = conn.execute(
        "DELETE FROM memory_session_state WHERE substr(session_key, 1, ?) = ?",
        (len(owner) + 1, owner + "/"),
    ).rowcount
    return {"facts": facts, "summary": summary, "sessions": sessions}


async def _delete_user_postgres(conn: Any, *, owner: str) -> dict[str, int]:
    async with conn.transaction():
        counts = [
            await conn.execute("DELETE FROM memory_facts WHERE owner = $1", owner),
            await conn.execute("DELETE FROM memory_summary WHERE owner = $1", owner),
            await conn.execute(
                "DELETE FROM memory_session_state WHERE starts_with(session_key, $1 || '/')",
                owner,
            ),
        ]
    facts, summary, sessions = (int(s.split()[-1]) for s in counts)
    return {"facts": facts, "summary": summary, "sessions": sessions}


#: ``(owner) -> {"facts", "summary", "sessions"}`` rows deleted: everything memory holds about
#: a user, in one transaction (their sessions' keys are ``<owner>/<name>``).
DELETE_USER = ops.procedure(
    "memory.delete_user",
    sqlite=_delete_user_sqlite,
    postgres=_delete_user_postgres,
    writes=True,
)
