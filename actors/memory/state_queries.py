"""The read query behind ``GET /memory/extraction`` that ``queries.py`` does not have: the
extraction state of sessions. A store operation, one function per backend, as in
``queries.py``; kept in a module of its own so the search queries there can change apart.

Extraction state. A session is *due* when the extraction sweep (``extraction.py``) would take
it now: idle since before the cut-off (``sessions.updated_at < now - stale_after``) and not
extracted since that activity (no ``memory_session_state.extracted_at``, or one older than
``updated_at``); the same condition as ``extraction.STALE``. Sessions are listed by key, which
for one owner (``<owner>/<name>``) is by name, with a keyset cursor (``after``, a key), as
``GET /sessions`` pages by name.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, overload

import msgspec

from turnstile.runtime.store import ops

__all__ = ["EXTRACTION_STATE", "SessionState"]


class SessionState(msgspec.Struct, frozen=True):
    """One session as extraction sees it."""

    #: the session's key, ``<owner>/<name>``.
    key: str
    owner: str
    #: its last activity (its last event, or its creation).
    updated_at: datetime
    #: the activity extraction last processed (None: never extracted).
    extracted_at: datetime | None


@overload
def _time(value: str | datetime) -> datetime: ...
@overload
def _time(value: None) -> None: ...
def _time(value: str | datetime | None) -> datetime | None:
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
EXTRACTION_STATE = ops.procedure(
    "memory.extraction_state",
    sqlite=_state_sqlite,
    postgres=_state_postgres,
)
