"""Claiming a session's next input, and settling it: ``finish_input``, ``fold_input``,
``requeue_input``.

States move ``queued -> running -> done | failed | interrupted``; ``fold_input`` moves a
``queued`` input straight to ``done``, ``requeue_input`` an ``interrupted`` one back to
``queued``. Claims are exclusive (PostgreSQL: ``FOR UPDATE SKIP LOCKED``). A fenced write
(``fence=``, the activation's lease epoch, :mod:`runtime.store.leases`) locks the session's row
in share mode while it checks the epoch on PostgreSQL, so a concurrent acquisition waits for it,
and a write that starts after one committed re-reads the row and finds the new epoch: it commits
before the lease moved or not at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from typing import Any

from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase
from turnstile.runtime.store.escaping import escape_text
from turnstile.runtime.store.inbox import input_record
from turnstile.runtime.store.records import InboxItem
from turnstile.runtime.store.sessions import (
    fenced_postgres,
    fenced_sqlite,
    require_session_sqlite,
)

__all__ = ["ClaimMethods"]

# -- claim, finish, fold, requeue ---------------------------------------------------------------

# PostgreSQL answers a claim in one statement, whatever it finds: ``s`` reads the session's row
# (fenced: locked in share mode, so an acquisition waits for the claim, and the epoch read is the
# one the claim commits under), ``c`` claims the oldest queued input (fenced: only under that
# epoch), and the one row back says, besides the claimed input (all NULL when none), whether the
# session exists and its lease epoch: no second round trip to tell "nothing queued" from "no
# session" or "fenced", as there was.
_CLAIM_PG = (
    "WITH s AS (SELECT lease_epoch FROM sessions WHERE id = :session_id{lock}),"
    " c AS (UPDATE inbox SET state = 'running', updated_at = :now, claimed_by = :node,"
    " claimed_epoch = :epoch WHERE id = (SELECT id FROM inbox WHERE session_id = :session_id"
    " AND state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED){held} RETURNING *)"
    " SELECT EXISTS (SELECT 1 FROM s) AS _found, (SELECT lease_epoch FROM s) AS _lease, c.*"
    " FROM (SELECT 1) AS one LEFT JOIN c ON true"
)
_CLAIM_SQLITE = (
    "UPDATE inbox SET state = 'running', updated_at = :now, claimed_by = :node,"
    " claimed_epoch = :epoch WHERE id = (SELECT id FROM inbox WHERE session_id = :session_id"
    " AND state = 'queued' ORDER BY id LIMIT 1){held} RETURNING *"
)
_CLAIM_ARGS = ("session_id", "now", "node", "epoch")
_CLAIM_FENCED_ARGS = (*_CLAIM_ARGS, "fence")
_CLAIM_FREE = ops.Statement(_CLAIM_PG.format(lock="", held=""), params=_CLAIM_ARGS)
_CLAIM_FENCED = ops.Statement(
    _CLAIM_PG.format(
        lock=" FOR SHARE", held=" AND EXISTS (SELECT 1 FROM s WHERE lease_epoch = :fence)"
    ),
    params=_CLAIM_FENCED_ARGS,
)
_CLAIM_FREE_SQLITE = ops.Statement(_CLAIM_SQLITE.format(held=""), params=_CLAIM_ARGS)
_CLAIM_FENCED_SQLITE = ops.Statement(
    _CLAIM_SQLITE.format(
        held=" AND (SELECT lease_epoch FROM sessions WHERE id = :session_id) = :fence"
    ),
    params=_CLAIM_FENCED_ARGS,
)


def _claim_sqlite(
    conn: sqlite3.Connection,
    session_id: str,
    now: str,
    node: str | None,
    epoch: int | None,
    fence: int | None = None,
) -> Any:
    if fence is None:
        row = conn.execute(_CLAIM_FREE_SQLITE.sqlite, (session_id, now, node, epoch)).fetchone()
    else:
        sql = _CLAIM_FENCED_SQLITE.sqlite
        row = conn.execute(sql, (session_id, now, node, epoch, fence)).fetchone()
    if row is None:
        if fence is not None:
            fenced_sqlite(conn, session_id, fence)
        require_session_sqlite(conn, session_id)
    return row


async def _claim_postgres(
    conn: Any,
    session_id: str,
    now: Any,
    node: str | None,
    epoch: int | None,
    fence: int | None = None,
) -> Any:
    if fence is None:
        row = await conn.fetchrow(_CLAIM_FREE.postgres, session_id, now, node, epoch)
    else:
        row = await conn.fetchrow(_CLAIM_FENCED.postgres, session_id, now, node, epoch, fence)
    if row["id"] is not None:
        return row
    if not row["_found"]:
        raise u.no_session(session_id)
    if fence is not None and row["_lease"] != fence:
        raise u.fenced(session_id, fence, row["_lease"])
    return None


#: ``(session_id, now, node, epoch, fence)``: the oldest queued input, now running and stamped
#: with its claimer; None when nothing is queued. ``NotFound`` for no session, ``Fenced`` when
#: ``fence`` (None: unfenced) is not the session's lease epoch.
CLAIM_NEXT_INPUT = ops.row(
    "claim_next_input",
    sqlite=_claim_sqlite,
    postgres=_claim_postgres,
    decode=input_record,
    writes=True,
)

# The claim of a node with scheduled-turn slots: as the claim, but an oldest queued input whose
# source is one of ``unless`` (it needs a slot the caller does not hold) stays queued, and the
# statement answers its source instead (``_waits``), in the same round trip.
_CLAIM_UNLESS_PG = (
    "WITH s AS (SELECT lease_epoch FROM sessions WHERE id = :session_id{lock}),"
    " h AS (SELECT id, source FROM inbox WHERE session_id = :session_id AND state = 'queued'"
    " ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED),"
    " c AS (UPDATE inbox SET state = 'running', updated_at = :now, claimed_by = :node,"
    " claimed_epoch = :epoch WHERE id = (SELECT id FROM h WHERE source <> ALL(:unless::text[])"
    "){held} RETURNING *)"
    " SELECT EXISTS (SELECT 1 FROM s) AS _found, (SELECT lease_epoch FROM s) AS _lease,"
    " (SELECT source FROM h WHERE source = ANY(:unless)) AS _waits, c.*"
    " FROM (SELECT 1) AS one LEFT JOIN c ON true"
)
_CLAIM_UNLESS_ARGS = (*_CLAIM_ARGS, "unless")
_CLAIM_UNLESS_FREE = ops.Statement(
    _CLAIM_UNLESS_PG.format(lock="", held=""), params=_CLAIM_UNLESS_ARGS
)
_CLAIM_UNLESS_FENCED = ops.Statement(
    _CLAIM_UNLESS_PG.format(
        lock=" FOR SHARE", held=" AND EXISTS (SELECT 1 FROM s WHERE lease_epoch = :fence)"
    ),
    params=(*_CLAIM_UNLESS_ARGS, "fence"),
)
_HEAD_SOURCE = ops.Statement(
    "SELECT source FROM inbox WHERE session_id = :session_id AND state = 'queued'"
    " ORDER BY id LIMIT 1"
)


def _claim_unless_sqlite(
    conn: sqlite3.Connection,
    session_id: str,
    now: str,
    node: str | None,
    epoch: int | None,
    unless: list[str],
    fence: int | None = None,
) -> tuple[Any, str | None]:
    # one transaction (the writer's): the oldest queued input read, then claimed
    head = conn.execute(_HEAD_SOURCE.sqlite, (session_id,)).fetchone()
    if head is not None and head[0] in unless:
        if fence is not None:
            fenced_sqlite(conn, session_id, fence)
        return None, head[0]
    return _claim_sqlite(conn, session_id, now, node, epoch, fence), None


async def _claim_unless_postgres(
    conn: Any,
    session_id: str,
    now: Any,
    node: str | None,
    epoch: int | None,
    unless: list[str],
    fence: int | None = None,
) -> tuple[Any, str | None]:
    sources = [escape_text(source) for source in unless]  # text[]: see append_events
    if fence is None:
        row = await conn.fetchrow(
            _CLAIM_UNLESS_FREE.postgres, session_id, now, node, epoch, sources
        )
    else:
        row = await conn.fetchrow(
            _CLAIM_UNLESS_FENCED.postgres, session_id, now, node, epoch, sources, fence
        )
    if row["id"] is not None:
        return row, None
    if not row["_found"]:
        raise u.no_session(session_id)
    if fence is not None and row["_lease"] != fence:
        raise u.fenced(session_id, fence, row["_lease"])
    return None, row["_waits"]


def _claimed_or_waits(answer: tuple[Any, str | None]) -> InboxItem | str | None:
    row, waits = answer
    return input_record(row) if row is not None else waits


#: ``(session_id, now, node, epoch, unless, fence)``: as :data:`CLAIM_NEXT_INPUT`, or the
#: source of the oldest queued input, left queued, when it is one of ``unless``.
CLAIM_UNLESS = ops.procedure(
    "claim_next_input",
    sqlite=_claim_unless_sqlite,
    postgres=_claim_unless_postgres,
    decode=_claimed_or_waits,
    writes=True,
)

# Move an input from ``was`` to ``state`` in one statement (nothing unless it was ``was``); with
# ``fence``, only while the session's lease epoch is that (else ``Fenced``).
_MOVE = (
    "{lease}UPDATE inbox SET state = :state, detail = :detail::jsonb, updated_at = :now"
    " WHERE id = :input_id AND state = :was{held} RETURNING *"
)
_MOVE_ARGS = ("input_id", "state", "detail", "now", "was")
_MOVE_FREE = ops.Statement(_MOVE.format(lease="", held=""), params=_MOVE_ARGS)
_MOVE_FENCED = ops.Statement(
    _MOVE.format(
        lease="WITH lease AS (SELECT 1 FROM sessions s JOIN inbox i ON i.session_id = s.id"
        " WHERE i.id = :input_id AND s.lease_epoch = :fence FOR SHARE OF s) ",
        held=" AND EXISTS (SELECT 1 FROM lease)",
    ),
    params=(*_MOVE_ARGS, "fence"),
)
_MOVE_FENCED_SQLITE = ops.Statement(
    _MOVE.format(
        lease="",
        held=" AND (SELECT lease_epoch FROM sessions WHERE id = inbox.session_id) = :fence",
    ),
    params=(*_MOVE_ARGS, "fence"),
)
_OWNER = ops.Statement("SELECT session_id FROM inbox WHERE id = :input_id")


def _move_sqlite(
    conn: sqlite3.Connection,
    input_id: int,
    was: str,
    state: str,
    detail: str | None,
    now: str,
    fence: int | None = None,
) -> Any:
    if fence is None:
        return conn.execute(_MOVE_FREE.sqlite, (input_id, state, detail, now, was)).fetchone()
    values = (input_id, state, detail, now, was, fence)
    row = conn.execute(_MOVE_FENCED_SQLITE.sqlite, values).fetchone()
    if row is None:
        owner = conn.execute(_OWNER.sqlite, (input_id,)).fetchone()
        if owner is not None:
            fenced_sqlite(conn, owner[0], fence)
    return row


async def _move_postgres(
    conn: Any,
    input_id: int,
    was: str,
    state: str,
    detail: str | None,
    now: Any,
    fence: int | None = None,
) -> Any:
    if fence is None:
        return await conn.fetchrow(_MOVE_FREE.postgres, input_id, state, detail, now, was)
    row = await conn.fetchrow(_MOVE_FENCED.postgres, input_id, state, detail, now, was, fence)
    if row is None:
        session_id = await conn.fetchval(_OWNER.postgres, input_id)
        if session_id is not None:
            await fenced_postgres(conn, session_id, fence)
    return row


#: ``(input_id, was, state, detail, now, fence)``: the input moved from ``was`` to ``state``;
#: None unless it was ``was``. ``Fenced`` as :data:`CLAIM_NEXT_INPUT`.
MOVE_INPUT = ops.row(
    "move_input", sqlite=_move_sqlite, postgres=_move_postgres, decode=input_record, writes=True
)
#: ``(input_id, detail, now)``: an interrupted input queued again; None unless it was.
REQUEUE_INPUT = ops.row(
    "requeue_input",
    "UPDATE inbox SET state = 'queued', detail = :detail::jsonb, updated_at = :now"
    " WHERE id = :input_id AND state = 'interrupted' RETURNING *",
    decode=input_record,
    writes=True,
)
#: ``(input_id) -> state | None``.
INPUT_STATE = ops.value("input_state", "SELECT state FROM inbox WHERE id = :input_id")


class ClaimMethods(StoreBase):
    """The store's methods that claim and settle inputs (see :class:`runtime.store.front.Store`)."""

    def _claimed_by(self) -> dict[str, Any]:
        """The claimer's id and epoch as a claim stamps them on the row (None without one)."""
        claimer = self.claimer
        if claimer is None:
            return {"node": None, "epoch": None}
        return {"node": claimer.id, "epoch": claimer.epoch}

    async def claim_next_input(
        self, session_id: str, *, fence: int | None = None
    ) -> InboxItem | None:
        """Atomically move the oldest ``queued`` input of a session to ``running``.

        Concurrent callers (even on different store instances) never get the same item. The
        same statement records :attr:`claimer` on the row (``claimed_by``), so that recovery
        can tell whose turn it is. With ``fence`` (the lease epoch of the activation that
        claims, ``acquire_session``) the claim happens only while that is still the
        session's lease epoch, checked in the same statement.

        Returns:
            The claimed item (state ``running``), or None when nothing is queued.

        Raises:
            NotFound: ``no session with id 'x'``.
            Fenced: ``fence`` was given and is no longer the session's lease epoch.
        """
        return await self.engine.run(
            CLAIM_NEXT_INPUT,
            session_id=session_id,
            now=self._now(),
            **self._claimed_by(),
            fence=u.check_fence(fence),
        )

    async def claim_next_input_unless(
        self, session_id: str, unless: Collection[str], *, fence: int | None = None
    ) -> InboxItem | str | None:
        """As :meth:`claim_next_input`, unless the oldest queued input came from one of the
        sources ``unless``: then it stays ``queued`` and its source is the answer, in the same
        statement (a session whose next input needs a scheduled-turn slot it does not hold,
        ``actors/sessions/slots.py``).

        Returns:
            The claimed item (state ``running``), the source of the oldest queued input (one
            of ``unless``, not claimed), or None when nothing is queued.

        Raises:
            NotFound: ``no session with id 'x'``.
            Fenced: ``fence`` was given and is no longer the session's lease epoch.
        """
        return await self.engine.run(
            CLAIM_UNLESS,
            session_id=session_id,
            now=self._now(),
            **self._claimed_by(),
            unless=[u.check_text(source, "source") for source in unless],
            fence=u.check_fence(fence),
        )

    async def finish_input(
        self,
        input_id: int,
        state: str,
        detail: dict[str, Any] | None = None,
        *,
        fence: int | None = None,
    ) -> InboxItem:
        """Move a ``running`` input to ``done``, ``failed`` or ``interrupted``.

        Args:
            input_id: the item.
            state: one of :data:`~runtime.store.records.FINAL_INPUT_STATES`.
            detail: what to record with it (an error, a summary); replaces any earlier detail.
            fence: as ``claim_next_input``.

        Returns:
            The item as stored after the change.

        Raises:
            ValueError: ``state`` is not an input state at all.
            NotFound: ``no input with id 5``.
            ConflictError: the transition is illegal: ``cannot move input 5 from done to failed``.
            Fenced: ``fence`` was given and is no longer the session's lease epoch.
        """
        u.check_int(input_id, "input_id")
        u.check_input_state(state)
        data = u.encode_optional_json(detail)
        fence = u.check_fence(fence)
        while True:
            if u.finish_allowed("running", state):
                item = await self.engine.run(
                    MOVE_INPUT,
                    input_id=input_id,
                    was="running",
                    state=state,
                    detail=data,
                    now=self._now(),
                    fence=fence,
                )
                if item is not None:
                    return item
            current = await self.engine.run(INPUT_STATE, input_id=input_id)
            if current is None:
                raise u.no_input(input_id)
            if current != "running" or not u.finish_allowed(current, state):
                raise u.transition_error(input_id, current, state)
            # it was claimed between the two statements: try the move again

    async def fold_input(
        self, input_id: int, detail: dict[str, Any] | None = None, *, fence: int | None = None
    ) -> InboxItem | None:
        """Move a ``queued`` input straight to ``done`` without a turn of its own: it was folded
        into the session's running turn (an ``inject`` message stored by another node).

        Args:
            input_id: the item.
            detail: replaces its detail (which turn it went into).
            fence: as ``claim_next_input``.

        Returns:
            The item as stored after the change, or None when it was no longer ``queued``
            (claimed meanwhile: it runs as a turn of its own) or does not exist.

        Raises:
            Fenced: ``fence`` was given and is no longer the session's lease epoch.
        """
        return await self._move(input_id, "queued", "done", detail, fence)

    async def unfold_input(self, input_id: int, *, fence: int | None = None) -> InboxItem | None:
        """Move an input folded into a turn (``done`` by ``fold_input`` or stored so by
        ``enqueue_keyed(state="done")``) back to ``queued``, its detail cleared: the turn
        closed before its agent could take it, so it runs as a turn of its own, in its own row
        (under its own idempotency key), rather than as a second row that tells the session
        the same thing (issue 23's crash harness, ``background`` with a refused commit).

        Returns:
            The item as stored after the change, or None when it was not ``done``.

        Raises:
            Fenced: ``fence`` was given and is no longer the session's lease epoch.
        """
        return await self._move(input_id, "done", "queued", None, fence)

    async def _move(
        self, input_id: int, was: str, state: str, detail: dict[str, Any] | None, fence: int | None
    ) -> InboxItem | None:
        """``MOVE_INPUT`` of ``input_id`` from ``was`` to ``state`` (None unless it was)."""
        u.check_int(input_id, "input_id")
        return await self.engine.run(
            MOVE_INPUT,
            input_id=input_id,
            was=was,
            state=state,
            detail=u.encode_optional_json(detail),
            now=self._now(),
            fence=u.check_fence(fence),
        )

    async def requeue_input(self, input_id: int, detail: dict[str, Any] | None = None) -> InboxItem:
        """Crash recovery that runs a cut-off turn again: move an ``interrupted`` input back
        to ``queued`` (the one way out of a final state). Its id keeps its place: it is the
        next of its session to run.

        Args:
            input_id: the item.
            detail: replaces its detail (recovery counts the re-runs there).

        Raises:
            NotFound: ``no input with id 5``.
            ConflictError: it is not interrupted: ``cannot move input 5 from done to queued``.
        """
        u.check_int(input_id, "input_id")
        data = u.encode_optional_json(detail)
        item = await self.engine.run(REQUEUE_INPUT, input_id=input_id, detail=data, now=self._now())
        if item is not None:
            return item
        current = await self.engine.run(INPUT_STATE, input_id=input_id)
        if current is None:
            raise u.no_input(input_id)
        raise u.transition_error(input_id, current, "queued")
