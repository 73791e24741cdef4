"""The store's sessions: their rows, and the methods that create, read, change and delete them.

Deleting a session removes its inbox and events, and whatever rows of a feature's tables name
it with ``ON DELETE CASCADE``, in the same statement.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from msgspec import UNSET, UnsetType

from turnstile.runtime.errors import AlreadyExists, LimitExceeded
from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase, ts
from turnstile.runtime.store.records import Session

__all__ = [
    "SessionMethods",
    "fenced_postgres",
    "fenced_sqlite",
    "has_session_sqlite",
    "require_session_postgres",
    "require_session_sqlite",
    "session_record",
]


def session_record(row: Any) -> Session:
    """A ``sessions`` row as a :class:`Session`."""
    return Session(
        id=row["id"],
        owner=row["owner"],
        metadata=u.decode_json(row["metadata"]),
        policy=row["policy"],
        created_at=ts(row["created_at"]),
        updated_at=ts(row["updated_at"]),
        last_seq=row["last_seq"],
    )


# -- checks the other areas' operations make inside their transactions --------------------------

_SESSION_EXISTS = ops.Statement("SELECT 1 FROM sessions WHERE id = :id")
_LEASE_EPOCH = ops.Statement("SELECT lease_epoch FROM sessions WHERE id = :id")


def has_session_sqlite(conn: sqlite3.Connection, session_id: str) -> bool:
    """Whether the session exists."""
    return conn.execute(_SESSION_EXISTS.sqlite, (session_id,)).fetchone() is not None


def require_session_sqlite(conn: sqlite3.Connection, session_id: str) -> None:
    """``NotFound`` unless the session exists."""
    if not has_session_sqlite(conn, session_id):
        raise u.no_session(session_id)


async def require_session_postgres(conn: Any, session_id: str) -> None:
    """``NotFound`` unless the session exists."""
    if await conn.fetchval(_SESSION_EXISTS.postgres, session_id) is None:
        raise u.no_session(session_id)


def fenced_sqlite(conn: sqlite3.Connection, session_id: str, fence: int) -> None:
    """Raise ``Fenced`` when ``session_id``'s lease epoch is no longer ``fence`` (and
    ``NotFound`` when the session is gone): called after a fenced write matched nothing."""
    row = conn.execute(_LEASE_EPOCH.sqlite, (session_id,)).fetchone()
    if row is None:
        raise u.no_session(session_id)
    if row[0] != fence:
        raise u.fenced(session_id, fence, row[0])


async def fenced_postgres(conn: Any, session_id: str, fence: int) -> None:
    """As :func:`fenced_sqlite`."""
    current = await conn.fetchval(_LEASE_EPOCH.postgres, session_id)
    if current is None:
        raise u.no_session(session_id)
    if current != fence:
        raise u.fenced(session_id, fence, current)


# -- the operations on sessions -----------------------------------------------------------------

#: ``(id, owner, metadata, policy, now)``; None when the id is taken.
CREATE_SESSION = ops.row(
    "create_session",
    "INSERT INTO sessions (id, owner, metadata, policy, created_at, updated_at)"
    " VALUES (:id, :owner, :metadata::jsonb, :policy, :now, :now)"
    " ON CONFLICT (id) DO NOTHING RETURNING *",
    decode=session_record,
    writes=True,
)


_INSERT_SESSION = ops.Statement(
    "INSERT INTO sessions (id, owner, metadata, policy, created_at, updated_at)"
    " VALUES (:id, :owner, :metadata::jsonb, :policy, :now, :now)"
    " ON CONFLICT (id) DO NOTHING RETURNING *",
    params=("id", "owner", "metadata", "policy", "now"),
)
#: How many sessions ``owner`` has, counted up to ``limit`` (the limit's message never says
#: more than the limit, as when the directory listed a page of ``limit`` sessions).
_OWNED = ops.Statement(
    "SELECT count(*) FROM (SELECT 1 FROM sessions WHERE owner = :owner LIMIT :limit) AS mine",
    params=("owner", "limit"),
)
#: Serialises the session creations of one owner across connections (and nodes): the owner
#: has no row of their own to lock, so the lock is on a hash of their name, held to the end of
#: the transaction (a collision only makes two owners wait for each other).
_LOCK_OWNER = ops.Statement(
    "SELECT pg_advisory_xact_lock(hashtext('sessions:' || :owner::text))", params=("owner",)
)


def _create_within_sqlite(
    conn: sqlite3.Connection,
    *,
    id: str,
    owner: str,
    metadata: str,
    policy: str,
    now: str,
    limit: int,
) -> Any:
    # In the writer's transaction: no other write runs between the count and the insert.
    (mine,) = conn.execute(_OWNED.sqlite, (owner, limit)).fetchone()
    if mine >= limit:
        return mine
    return conn.execute(_INSERT_SESSION.sqlite, (id, owner, metadata, policy, now)).fetchone()


async def _create_within_postgres(
    conn: Any, *, id: str, owner: str, metadata: str, policy: str, now: Any, limit: int
) -> Any:
    async with conn.transaction():
        await conn.execute(_LOCK_OWNER.postgres, owner)
        mine = await conn.fetchval(_OWNED.postgres, owner, limit)
        if mine >= limit:
            return mine
        return await conn.fetchrow(_INSERT_SESSION.postgres, id, owner, metadata, policy, now)


def _created_within(answer: Any) -> Session | int | None:
    """The new session, None when the id is taken, or (an int) how many the owner has."""
    if answer is None or isinstance(answer, int):
        return answer
    return session_record(answer)


#: ``(id, owner, metadata, policy, now, limit)``: as ``CREATE_SESSION``, unless ``owner``
#: has ``limit`` sessions already (then that count): the count and the insert in one
#: transaction, which on PostgreSQL holds the owner's lock, so no two creations pass it at once.
CREATE_SESSION_WITHIN = ops.procedure(
    "create_session_within",
    sqlite=_create_within_sqlite,
    postgres=_create_within_postgres,
    decode=_created_within,
    writes=True,
)
GET_SESSION = ops.row("get_session", "SELECT * FROM sessions WHERE id = :id", decode=session_record)
#: ``(owner, after_id, limit)``, either filter None for none.
LIST_SESSIONS = ops.rows(
    "list_sessions",
    "SELECT * FROM sessions WHERE (:owner::text IS NULL OR owner = :owner)"
    " AND (:after_id::text IS NULL OR id > :after_id) ORDER BY id LIMIT :limit",
    decode=session_record,
)
#: ``(id, set_metadata, metadata, set_policy, policy, now)``: the columns whose ``set_`` flag
#: is true take the new value; None when there is no such session.
UPDATE_SESSION = ops.row(
    "update_session",
    "UPDATE sessions SET"
    " metadata = CASE WHEN :set_metadata THEN :metadata::jsonb ELSE metadata END,"
    " policy = CASE WHEN :set_policy THEN :policy::text ELSE policy END,"
    " updated_at = :now WHERE id = :id RETURNING *",
    decode=session_record,
    writes=True,
)
#: ``(id)``: whether it existed.
DELETE_SESSION = ops.found(
    "delete_session", "DELETE FROM sessions WHERE id = :id RETURNING id", writes=True
)


class SessionMethods(StoreBase):
    """The store's methods on sessions (see :class:`runtime.store.front.Store`)."""

    async def create_session(
        self,
        id: str,
        owner: str,
        metadata: dict[str, Any] | None = None,
        policy: str = "enqueue",
        *,
        max_per_owner: int | None = None,
    ) -> Session:
        """Create a session with an empty inbox and event log.

        Args:
            id: caller-supplied, non-empty.
            owner: the user it belongs to.
            metadata: free-form JSON object (default ``{}``).
            policy: what to do with input arriving mid-turn.
            max_per_owner: refuse when ``owner`` has this many sessions already. The count
                and the insert are one transaction (on PostgreSQL under a lock on the owner),
                so concurrent creations, through any number of nodes, never pass it.

        Returns:
            The new session (``last_seq`` 0).

        Raises:
            LimitExceeded: ``user 'x' already has 3 sessions (limit 3)`` (checked first).
            AlreadyExists: ``session 'x' already exists``.
        """
        u.check_text(id, "id")
        u.check_text(owner, "owner")
        u.check_text(policy, "policy")
        meta = u.encode_json({} if metadata is None else metadata, "metadata")
        now = self._now()
        if max_per_owner is None:
            session = await self.engine.run(
                CREATE_SESSION, id=id, owner=owner, metadata=meta, policy=policy, now=now
            )
        else:
            limit = u.check_int(max_per_owner, "max_per_owner")
            if limit < 1:
                raise ValueError("max_per_owner must be positive")
            answer = await self.engine.run(
                CREATE_SESSION_WITHIN,
                id=id,
                owner=owner,
                metadata=meta,
                policy=policy,
                now=now,
                limit=limit,
            )
            if isinstance(answer, int):
                raise LimitExceeded(f"user {owner!r} already has {answer} sessions (limit {limit})")
            session = answer
        if session is None:
            raise AlreadyExists(f"session {id!r} already exists")
        return session

    async def get_session(self, id: str) -> Session:
        """Read one session.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        session = await self.engine.run(GET_SESSION, id=id)
        if session is None:
            raise u.no_session(id)
        return session

    async def list_sessions(
        self, owner: str | None = None, limit: int = 100, after_id: str | None = None
    ) -> list[Session]:
        """List sessions ordered by id (byte order), one page at a time.

        Args:
            owner: only this user's sessions; None for all.
            limit: at most this many (positive).
            after_id: keyset pagination - only ids greater than this one.

        Returns:
            Up to ``limit`` sessions; pass the last one's id as ``after_id`` for the next page.
        """
        u.check_limit(limit)
        return await self.engine.run(LIST_SESSIONS, owner=owner, after_id=after_id, limit=limit)

    async def update_session(
        self,
        id: str,
        *,
        metadata: dict[str, Any] | UnsetType = UNSET,
        policy: str | UnsetType = UNSET,
    ) -> Session:
        """Replace a session's metadata and/or policy; bumps ``updated_at`` when anything is set.

        Returns:
            The session as stored after the update.

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        if metadata is UNSET and policy is UNSET:
            return await self.get_session(id)
        session = await self.engine.run(
            UPDATE_SESSION,
            id=id,
            set_metadata=metadata is not UNSET,
            metadata=None if metadata is UNSET else u.encode_json(metadata, "metadata"),
            set_policy=policy is not UNSET,
            policy=None if policy is UNSET else u.check_text(policy, "policy"),
            now=self._now(),
        )
        if session is None:
            raise u.no_session(id)
        return session

    async def delete_session(self, id: str) -> None:
        """Delete a session with its inbox and events, and the rows of features' tables that
        reference it ``ON DELETE CASCADE`` (one statement).

        Raises:
            NotFound: ``no session with id 'x'``.
        """
        if not await self.engine.run(DELETE_SESSION, id=id):
            raise u.no_session(id)
