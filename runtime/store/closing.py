"""Closing a turn in one transaction: its last events, its input's final state, and what the
input's owner settles with it.

A turn's closure used to be three commits: its ``stream_end`` appended, its input moved to
``done``, then (for a job's turn) its run record settled. A crash between two of them left a
turn that had ended as ``running`` in the inbox, and recovery closed it a second time (a second
``stream_start`` / ``stream_end`` for one input). :meth:`CloseMethods.close_input` makes them
one: either all of it is stored, or none of it is and recovery closes the turn once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.base import StoreBase, ts
from turnstile.runtime.store.claims import INPUT_STATE, MOVE_INPUT
from turnstile.runtime.store.events import APPEND_EVENTS
from turnstile.runtime.store.inbox import input_record
from turnstile.runtime.store.records import EventRecord, InboxItem

__all__ = ["CLOSE_INPUT", "CloseMethods", "Step"]

#: One more write of the closing transaction: an operation and its arguments, as the backend
#: takes them (times through ``Store.db_time``, JSON through ``Store.db_json``).
Step = tuple[ops.Operation[Any], Mapping[str, Any]]


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
) -> tuple[int | None, Any]:
    last = None
    if events:
        last = APPEND_EVENTS.sqlite(conn, session_id, events, now, fence)
        if last is None:
            return None, None
    row = MOVE_INPUT.sqlite(conn, input_id, "running", state, detail, now, fence)
    if row is None:
        raise _NotRunning
    for op, args in steps:
        op.sqlite(conn, **args)
    return last, row


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
) -> tuple[int | None, Any]:
    async with conn.transaction():
        last = None
        if events:
            last = await APPEND_EVENTS.postgres(conn, session_id, events, now, fence)
            if last is None:
                return None, None
        row = await MOVE_INPUT.postgres(conn, input_id, "running", state, detail, now, fence)
        if row is None:
            raise _NotRunning
        for op, args in steps:
            await op.postgres(conn, **args)
        return last, row


#: ``(session_id, events, now, input_id, state, detail, fence, steps)``: the new last seq (None
#: without events) and the input's row; ``(None, None)`` for no session; ``_NotRunning`` (all
#: rolled back) when the input was not ``running``.
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
        ``state`` and run ``steps``, in one transaction.

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
            the stored events, and the input as stored after the change.

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
            last, row = await self.engine.run(
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
        return records, input_record(row)
