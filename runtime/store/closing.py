"""Closing a turn in one transaction: its last events, its input's final state, and what the
input's owner settles with it.

A turn's closure used to be three commits: its ``stream_end`` appended, its input moved to
``done``, then (for a job's turn) its run record settled. A crash between two of them left a
turn that had ended as ``running`` in the inbox, and recovery closed it a second time (a second
``stream_start`` / ``stream_end`` for one input). :meth:`CloseMethods.close_input` makes them
one: either all of it is stored, or none of it is and recovery closes the turn once.

On PostgreSQL the closure is one statement, and a step written as a :class:`ClosingStep` joins
that statement (a job's run record): a job's turn closes in one round trip instead of four
(BEGIN, the closure, the step, COMMIT; issue 26). Any other step runs in a transaction with it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any

from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase, ts
from turnstile.runtime.store.claims import INPUT_STATE, MOVE_INPUT
from turnstile.runtime.store.escaping import escape_text
from turnstile.runtime.store.events import APPEND_EVENTS
from turnstile.runtime.store.inbox import input_record
from turnstile.runtime.store.records import EventRecord, InboxItem
from turnstile.runtime.store.sessions import fenced_postgres

__all__ = ["CLOSE_INPUT", "CloseMethods", "ClosingStep", "Step"]

#: One more write of the closing transaction: an operation and its arguments, as the backend
#: takes them (times through ``Store.db_time``, JSON through ``Store.db_json``).
Step = tuple[ops.Operation[Any], Mapping[str, Any]]

#: What ``{moved}`` says inside the closing statement: the input was moved (``mv``, below).
_MOVED = "EXISTS (SELECT 1 FROM mv)"


class ClosingStep(ops.Operation[None]):
    """A step of a turn's closure (what the input's owner settles with it) written as one SQL
    statement, which PostgreSQL runs inside the closing statement itself: a job's turn closes
    in one round trip, not four (BEGIN, the closure, the step, COMMIT; issue 26).

    Inside the closing statement every part sees the same snapshot and commits or fails
    together, and the step must write nothing unless the closure moved its input (a refused
    closure writes nothing at all): its condition says so with ``{moved}``, which is the
    closure's "the input moved" there and ``TRUE`` where the step runs on its own (SQLite's
    closing transaction, or PostgreSQL's when the closure has no events or another step).

    Args:
        name: what it is called in errors.
        sql: one ``UPDATE``, ``INSERT … SELECT`` or ``DELETE`` with ``:name`` placeholders, whose
            condition holds ``{moved}`` (``… WHERE id = :run_id AND {moved}``); what it answers
            is not read.

    Raises:
        ValueError: ``sql`` without ``{moved}`` (a step that would write after a refused
            closure), or as :class:`~runtime.store.ops.Statement`.
    """

    __slots__ = ("joined",)

    #: the statement as it runs inside the closing statement (its own placeholders)
    joined: ops.Statement

    def __init__(self, name: str, sql: str) -> None:
        if "{moved}" not in sql:
            raise ValueError(f"closing step {name!r} must say {{moved}} in its condition")
        alone = ops.execute(name, sql.replace("{moved}", "TRUE"))
        super().__init__(name, sqlite=alone.sqlite, postgres=alone.postgres, writes=True)
        self.joined = ops.Statement(sql.replace("{moved}", _MOVED))


class _NotRunning(Exception):  # noqa: N818 - a signal inside the transaction, never raised out
    """The input was not ``running``: the closing transaction is rolled back."""


def _close_sqlite(
    conn: sqlite3.Connection,
    session_id: str,
    events: list[tuple[str, str]],
    now: str,
    input_id: int,
    state: str,
    detail: str | None,
    fence: int | None,
    steps: Sequence[Step],
) -> tuple[int | None, Any, bool | None]:
    last = None
    if events:
        last = APPEND_EVENTS.sqlite(conn, session_id, events, now, fence)
        if last is None:
            return None, None, None
    row = MOVE_INPUT.sqlite(conn, input_id, "running", state, detail, now, fence)
    if row is None:
        raise _NotRunning
    for op, args in steps:
        op.sqlite(conn, **args)
    return last, row, None  # (one node: its own enqueues are all it needs to know)


# PostgreSQL: the events and the move in one statement (a data-modifying ``WITH``), so a turn's
# closure without ``steps`` is one round trip, not four (BEGIN, append, move, COMMIT). ``lk``
# locks the session's row first (and checks the fence), as the append's UPDATE did, so the locks
# are taken in the order they always were (the session, then the input); ``mv`` moves the input
# only under that lock, ``s`` allocates the seqs only once ``mv`` moved it, and ``ins`` inserts
# only what ``s`` allocated: an input that is not running moves nothing and appends nothing
# (no seq is used up), and a statement is atomic as the transaction was. Each CTE reads the one
# before it, which makes them run in that order. ``_queued`` says whether the session has an
# input queued (as of the statement's snapshot): the runner takes it as its next claim's answer
# when it is false, instead of a claim that would find nothing (issue 26: one round trip a
# turn). An input stored by another node after that snapshot is announced to this one, as one
# stored after an empty claim was.
# ``{joined}`` is where the closure's ``ClosingStep`` CTEs go (``j0``, ``j1``, …): they read
# ``mv`` (through ``{moved}``), and a step's SQL must not name a table ``lk``, ``mv``, ``s``,
# ``ins`` or ``j<i>``, which these CTEs would shadow.
_CLOSE_PG = (
    "WITH lk AS (SELECT 1 FROM sessions WHERE id = :session_id{held} FOR NO KEY UPDATE),"
    " mv AS (UPDATE inbox SET state = :state, detail = :detail::jsonb, updated_at = :now"
    " WHERE id = :input_id AND state = 'running' AND EXISTS (SELECT 1 FROM lk) RETURNING *),"
    " s AS (UPDATE sessions SET last_seq = last_seq + :n, updated_at = :now"
    " WHERE id = :session_id AND EXISTS (SELECT 1 FROM mv) RETURNING last_seq),"
    " ins AS (INSERT INTO events (session_id, seq, type, payload, ts)"
    " SELECT :session_id, s.last_seq - :n + x.n, x.t, x.p::jsonb, :now"
    " FROM s, unnest(:types::text[], :payloads::text[]) WITH ORDINALITY AS x(t, p, n))"
    "{joined}"
    " SELECT EXISTS (SELECT 1 FROM lk) AS _held, (SELECT last_seq FROM s) AS _last_seq,"
    " EXISTS (SELECT 1 FROM inbox WHERE session_id = :session_id AND state = 'queued')"
    " AS _queued, mv.* FROM (SELECT 1) AS one LEFT JOIN mv ON true"
)
_CLOSE_ARGS = ("session_id", "state", "detail", "now", "input_id", "n", "types", "payloads")
_CLOSE_FREE = ops.Statement(_CLOSE_PG.format(held="", joined=""), params=_CLOSE_ARGS)
_CLOSE_FENCED = ops.Statement(
    _CLOSE_PG.format(held=" AND lease_epoch = :fence", joined=""),
    params=(*_CLOSE_ARGS, "fence"),
)


@lru_cache(maxsize=64)
def _close_joined(fenced: bool, steps: tuple[ClosingStep, ...]) -> ops.Statement:
    """The closing statement with ``steps`` joined as CTEs ``j0``, ``j1``, … after ``ins``: each
    step's placeholders renamed ``j<i>_<name>`` and numbered after the closure's own (and the
    fence's), in the step's order; compiled once per combination."""
    params: list[str] = [*_CLOSE_ARGS, "fence"] if fenced else list(_CLOSE_ARGS)
    joined = []
    for i, step in enumerate(steps):
        prefix = f"j{i}_"
        joined.append(f", j{i} AS ({ops.renamed(step.joined.text, prefix)})")
        params += [prefix + name for name in step.joined.params]
    held = " AND lease_epoch = :fence" if fenced else ""
    return ops.Statement(_CLOSE_PG.format(held=held, joined="".join(joined)), params=params)


async def _close_one_postgres(
    conn: Any,
    session_id: str,
    events: list[tuple[str, str]],
    now: Any,
    input_id: int,
    state: str,
    detail: str | None,
    fence: int | None,
    steps: Sequence[tuple[ClosingStep, Mapping[str, Any]]] = (),
) -> tuple[int | None, Any, bool | None]:
    """The closure in one statement (see ``_CLOSE_PG``), with ``steps`` (each a
    :class:`ClosingStep`) joined to it; without events, the move alone (and no steps).
    Answers as :data:`CLOSE_INPUT`."""
    if not events:
        row = await MOVE_INPUT.postgres(conn, input_id, "running", state, detail, now, fence)
        if row is None:
            raise _NotRunning
        return None, row, None
    # a text[] element skips the connection's text codec (as in append_events)
    types = [escape_text(t) for t, _ in events]
    payloads = [p for _, p in events]
    values = (session_id, state, detail, now, input_id, len(events), types, payloads)
    if steps:
        statement = _close_joined(fence is not None, tuple(op for op, _ in steps))
        fenced = () if fence is None else (fence,)
        joined = chain.from_iterable(op.joined.values(args) for op, args in steps)
        row = await conn.fetchrow(statement.postgres, *values, *fenced, *joined)
    elif fence is None:
        row = await conn.fetchrow(_CLOSE_FREE.postgres, *values)
    else:
        row = await conn.fetchrow(_CLOSE_FENCED.postgres, *values, fence)
    if not row["_held"]:  # no session, or (fenced) no longer this lease: nothing was written
        if fence is not None:
            await fenced_postgres(conn, session_id, fence)
        return None, None, None
    if row["id"] is None:
        raise _NotRunning
    return row["_last_seq"], row, row["_queued"]


async def _close_postgres(
    conn: Any,
    session_id: str,
    events: list[tuple[str, str]],
    now: Any,
    input_id: int,
    state: str,
    detail: str | None,
    fence: int | None,
    steps: Sequence[Step],
) -> tuple[int | None, Any, bool | None]:
    if not steps:  # one statement: atomic without a transaction of its own
        return await _close_one_postgres(
            conn, session_id, events, now, input_id, state, detail, fence
        )
    joined = [(op, args) for op, args in steps if isinstance(op, ClosingStep)]
    if events and len(joined) == len(steps):  # the steps joined: one statement likewise
        return await _close_one_postgres(
            conn, session_id, events, now, input_id, state, detail, fence, joined
        )
    async with conn.transaction():
        last, row, queued = await _close_one_postgres(
            conn, session_id, events, now, input_id, state, detail, fence
        )
        if row is None:
            return None, None, None
        for op, args in steps:
            await op.postgres(conn, **args)
        return last, row, queued


#: ``(session_id, events, now, input_id, state, detail, fence, steps)``: the new last seq (None
#: without events), the input's row and whether the session has an input queued (None: not
#: asked); ``(None, None, None)`` for no session; ``_NotRunning`` (all rolled back) when the
#: input was not ``running``.
CLOSE_INPUT = ops.procedure(
    "close_input", sqlite=_close_sqlite, postgres=_close_postgres, writes=True
)


class CloseMethods(StoreBase):
    """The store's one-transaction closure of a turn."""

    def db_json(self, value: dict[str, Any] | None) -> str | None:
        """A JSON object (or None) as the backends take it in an operation's arguments."""
        return u.encode_optional_json(value)

    async def close_input(
        self,
        session_id: str,
        events: Sequence[tuple[str, dict[str, Any]]],
        input_id: int,
        state: str,
        detail: dict[str, Any] | None = None,
        *,
        fence: int | None = None,
        steps: Sequence[Step] = (),
    ) -> tuple[list[EventRecord], InboxItem]:
        """Append ``events`` to the session's log, move the ``running`` input ``input_id`` to
        ``state`` and run ``steps``, in one transaction: :meth:`close_input_peek` without its
        answer about the queue."""
        records, item, _ = await self.close_input_peek(
            session_id, events, input_id, state, detail, fence=fence, steps=steps
        )
        return records, item

    async def close_input_peek(
        self,
        session_id: str,
        events: Sequence[tuple[str, dict[str, Any]]],
        input_id: int,
        state: str,
        detail: dict[str, Any] | None = None,
        *,
        fence: int | None = None,
        steps: Sequence[Step] = (),
    ) -> tuple[list[EventRecord], InboxItem, bool | None]:
        """Append ``events`` to the session's log, move the ``running`` input ``input_id`` to
        ``state`` and run ``steps``, in one transaction; and say whether the session has an
        input queued.

        Args:
            session_id: the session (the input's).
            events: the turn's closing events (``stream_end``…); may be empty.
            input_id: the turn's input, ``running``.
            state: ``done``, ``failed`` or ``interrupted``.
            detail: the input's detail, as ``finish_input`` records it.
            fence: as ``append_events`` and ``finish_input``.
            steps: further writes of the same transaction (the input's owner settles what it
                keeps: a job's run record).

        Returns:
            the stored events, the input as stored after the change, and whether the session
            has another input ``queued`` as of the closing statement (PostgreSQL, with events;
            None where it was not asked: SQLite, a closure without events).

        Raises:
            NotFound: no such session, or no such input.
            ConflictError: the input was not ``running`` (nothing is written).
            Fenced: ``fence`` is no longer the session's lease epoch (nothing is written).
        """
        encoded = u.check_events(events)
        u.check_int(input_id, "input_id")
        u.check_input_state(state)
        if not u.finish_allowed("running", state):
            raise u.transition_error(input_id, "running", state)
        now = self._now()
        try:
            last, row, queued = await self.engine.run(
                CLOSE_INPUT,
                session_id=session_id,
                events=encoded,
                now=now,
                input_id=input_id,
                state=state,
                detail=u.encode_optional_json(detail),
                fence=u.check_fence(fence),
                steps=tuple(steps),
            )
        except _NotRunning:
            current = await self.engine.run(INPUT_STATE, input_id=input_id)
            if current is None:
                raise u.no_input(input_id) from None
            raise u.transition_error(input_id, current, state) from None
        if row is None:
            raise u.no_session(session_id)
        records: list[EventRecord] = []
        if last is not None:
            first, at = last - len(encoded) + 1, ts(now)
            records = [
                EventRecord(
                    session_id=session_id,
                    seq=first + i,
                    type=t,
                    payload=u.decode_json(p),
                    ts=at,
                )
                for i, (t, p) in enumerate(encoded)
            ]
        return records, input_record(row), queued
