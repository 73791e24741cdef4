"""Read queries behind the memory routes that ``queries.py`` does not have: the extraction
state of sessions (``GET /memory/extraction``) and a page of facts in one category
(``GET /memory/facts?category=…``). ``TableQuery`` objects, one function per backend, as in
``queries.py``; kept in a module of their own so the search queries there can change apart.

Extraction state. A session is *due* when the extraction sweep (``extraction.py``) would take
it now: idle since before the cut-off (``sessions.updated_at < now - stale_after``) and not
extracted since that activity (no ``memory_session_state.extracted_at``, or one older than
``updated_at``); the same condition as ``extraction.STALE``. Sessions are listed by key, which
for one owner (``<owner>/<name>``) is by name, with a keyset cursor (``after``, a key), as
``GET /sessions`` pages by name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from turnstile.actors.memory.queries import SORT_KEYS, Fact
from turnstile.runtime.store import TableQuery

__all__ = ["EXTRACTION_STATE", "FACTS_IN_CATEGORY", "SessionState"]


class SessionState(msgspec.Struct, frozen=True):
    """One session as extraction sees it."""

    #: the session's key, ``<owner>/<name>``.
    key: str
    owner: str
    #: its last activity (its last event, or its creation).
    updated_at: datetime
    #: the activity extraction last processed (None: never extracted).
    extracted_at: datetime | None


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


#: The sweep's condition (``extraction.STALE``); ``{c}`` is the cut-off's placeholder.
_DUE = "(s.updated_at < {c} AND (m.extracted_at IS NULL OR m.extracted_at < s.updated_at))"


def _state_sql(
    sigil: str, owner: str | None, cutoff: Any, after: str | None, due: bool | None, limit: int
) -> tuple[str, list[Any]]:
    """The query text and its arguments, numbered ``?1`` (SQLite) or ``$1`` (PostgreSQL)."""
    clauses, args = [], []

    def arg(value: Any) -> str:
        args.append(value)
        return f"{sigil}{len(args)}"

    if owner is not None:
        clauses.append(f"s.owner = {arg(owner)}")
    if after is not None:
        clauses.append(f"s.id > {arg(after)}")
    if due is not None:
        condition = _DUE.format(c=arg(cutoff))
        clauses.append(condition if due else f"NOT {condition}")
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    sql = (
        "SELECT s.id, s.owner, s.updated_at, m.extracted_at FROM sessions s"
        f" LEFT JOIN memory_session_state m ON m.session_key = s.id{where}"
        f" ORDER BY s.id LIMIT {arg(limit)}"
    )
    return sql, args


def _state_sqlite(
    conn: Any,
    *,
    owner: str | None,
    cutoff: str,
    after: str | None,
    due: bool | None,
    limit: int,
) -> list[SessionState]:
    sql, args = _state_sql("?", owner, cutoff, after, due, limit)
    rows = conn.execute(sql, args).fetchall()
    return [SessionState(r[0], r[1], _time(r[2]), _time(r[3])) for r in rows]


async def _state_postgres(
    conn: Any,
    *,
    owner: str | None,
    cutoff: datetime,
    after: str | None,
    due: bool | None,
    limit: int,
) -> list[SessionState]:
    sql, args = _state_sql("$", owner, cutoff, after, due, limit)
    rows = await conn.fetch(sql, *args)
    return [SessionState(r[0], r[1], r[2], r[3]) for r in rows]


#: ``(owner | None, cutoff, after, due, limit) -> [SessionState]``: sessions by key after
#: ``after`` (None: from the start), ``owner``'s only unless None (admins: the caller checks);
#: ``due=True`` only those the sweep would take at ``cutoff`` (``now - stale_after``),
#: ``due=False`` only the others.
EXTRACTION_STATE = TableQuery(
    "memory.extraction_state", sqlite=_state_sqlite, postgres=_state_postgres
)


# ---- a page of facts in one category --------------------------------------------------------

_COLUMNS = (
    "owner, category, key, value, source, confidence, created_at, updated_at,"
    " last_verified_at, expires_at, source_context"
)


def _like(text: str) -> str:
    """``%text%`` with LIKE's wildcards escaped (``ESCAPE '\\'``)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _page_sql(sigil: str, owner: str | None, category: str, search: str | None, sort: str):
    """The count and page queries and their arguments after ``now`` (always the first)."""
    clauses = [f"(expires_at IS NULL OR expires_at > {sigil}1)", f"category = {sigil}2"]
    args: list[Any] = [category]
    if owner is not None:
        args.append(owner)
        clauses.append(f"owner = {sigil}{1 + len(args)}")
    if search:
        args.append(_like(search))
        m = f"{sigil}{1 + len(args)}"
        like = "LIKE" if sigil == "?" else "ILIKE"  # SQLite's LIKE ignores ASCII case
        clauses.append(
            "("
            + " OR ".join(f"{c} {like} {m} ESCAPE '\\'" for c in ("category", "key", "value"))
            + ")"
        )
    where = " AND ".join(clauses)
    n = 2 + len(args)
    page = (
        f"SELECT {_COLUMNS} FROM memory_facts WHERE {where} ORDER BY {sort}"
        f" LIMIT {sigil}{n} OFFSET {sigil}{n + 1}"
    )
    return f"SELECT count(*) FROM memory_facts WHERE {where}", page, args


def _order(sort_by: str, sort_order: str) -> str:
    if sort_by not in SORT_KEYS or sort_order not in ("asc", "desc"):
        raise ValueError(f"cannot sort by {sort_by!r} {sort_order!r}")
    return f"{sort_by} {sort_order.upper()}, owner, category, key"


def _fact(row: Any) -> Fact:
    values = list(row)
    for i in (6, 7, 8, 9):
        values[i] = _time(values[i])
    return Fact(*values)


def _page_sqlite(
    conn: Any,
    *,
    owner: str | None,
    category: str,
    now: str,
    limit: int,
    offset: int,
    search: str | None,
    sort_by: str,
    sort_order: str,
) -> tuple[list[Fact], int]:
    count, page, args = _page_sql("?", owner, category, search, _order(sort_by, sort_order))
    (total,) = conn.execute(count, (now, *args)).fetchone()
    rows = conn.execute(page, (now, *args, limit, offset)).fetchall()
    return [_fact(r) for r in rows], total


async def _page_postgres(
    conn: Any,
    *,
    owner: str | None,
    category: str,
    now: datetime,
    limit: int,
    offset: int,
    search: str | None,
    sort_by: str,
    sort_order: str,
) -> tuple[list[Fact], int]:
    count, page, args = _page_sql("$", owner, category, search, _order(sort_by, sort_order))
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        total = await conn.fetchval(count, now, *args)
        rows = await conn.fetch(page, now, *args, limit, offset)
    return [_fact(r) for r in rows], total


#: ``(owner | None, category, now, limit, offset, search, sort_by, sort_order) -> ([Fact],
#: total)``: ``queries.LIST`` restricted to one category (exact, as saved: stripped).
FACTS_IN_CATEGORY = TableQuery(
    "memory.facts_in_category", sqlite=_page_sqlite, postgres=_page_postgres
)
