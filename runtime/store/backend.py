"""The small protocol between the validating front and a database backend.

:class:`~runtime.store.front.StoreFront` checks every argument, encodes JSON and times, and
turns rows into records; a backend only runs queries. It is asked for an operation by name,
with keyword arguments that are already checked and encoded: JSON as text, times as
``backend.db_time(dt)`` made them (ISO text for SQLite, ``datetime`` for PostgreSQL). It
answers with rows (anything that reads ``row["column"]`` and ``row[0]``), plain values, or
``None`` where the row asked about does not exist; the front turns that into ``NotFound``.

Errors a backend raises itself: ``StoreError`` for whatever the database reported, and, where
the answer is only known inside its transaction (so that nothing is written), the shared
``NotFound``/``ConflictError`` of :mod:`runtime.store._util` (a parent session or job that
does not exist, a fired input for a job without a session, a unique rule other than the id).

Every backend implements every operation below, in its own query module
(:mod:`runtime.store.sqlite_queries`, :mod:`runtime.store.postgres_queries`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

__all__ = ["Backend", "READS", "WRITES"]

#: Operations that only read, and what they answer.
READS: dict[str, str] = {
    "ping": "() -> None",
    "migrations": "() -> rows of schema_migrations, kernel first, then by set and version",
    "get_session": "(id) -> row | None",
    "list_sessions": "(owner, limit, after_id) -> rows",
    "list_inputs": "(session_id, states) -> rows by id; NotFound for no session",
    "input_state": "(input_id) -> str | None",
    "keyed_input": "(session_id, key) -> row | None",
    "sessions_with_queued_inputs": "(node, epoch) -> rows of (session_id,), sorted; with a"
    " node, not the sessions with an input running on another live node",
    "get_node": "(id, now) -> row with alive | None",
    "list_nodes": "(now) -> (the time alive was judged at, rows with alive, by id)",
    "read_events": "(session_id, after_seq, limit) -> rows; NotFound for no session",
    "read_events_back": "(session_id, types, before_seq, limit) -> rows, newest first;"
    " NotFound for no session",
    "last_seq": "(session_id) -> int | None",
    "get_job": "(id) -> row | None",
    "list_jobs": "(session_id, states) -> rows by (created_at, id)",
    "due_jobs": "(before, limit) -> rows by (next_fire_at, id)",
    "list_runs": "(job_id, limit) -> rows, newest first; NotFound for no job",
    "get_run": "(run_id) -> row | None",
    "kv_get": "(namespace, key, now) -> JSON text | None",
    "kv_list": "(namespace, after, limit, now) -> rows of (key, value)",
}

#: Operations that write (one transaction each), and what they answer.
WRITES: dict[str, str] = {
    "create_session": "(id, owner, metadata, policy, now) -> row | None when the id is taken",
    "update_session": "(id, sets, now) -> row | None",
    "delete_session": "(id) -> bool (whether it existed)",
    "enqueue_input": "(session_id, source, payload, now) -> row | None for no session",
    "enqueue_keyed": "(session_id, source, payload, key, state, detail, now) -> (row, created)"
    " | None for no session; the row already under (session_id, key) when one is",
    "claim_next_input": "(session_id, now, node, epoch, fence=None) -> row | None (stamped"
    " with its claimer); NotFound for no session, Fenced when fence is not the session's"
    " lease epoch",
    "finish_input": "(input_id, state, detail, now, fence=None) -> row | None unless it was"
    " running; Fenced as claim_next_input",
    "fold_input": "(input_id, detail, now, fence=None) -> row | None unless it was queued;"
    " Fenced as claim_next_input",
    "requeue_input": "(input_id, detail, now) -> row | None unless it was interrupted",
    "interrupt_running": "(now) -> rows",
    "register_node": "(id, address, lease, now, expires) -> (row with its new epoch, the row"
    " before | None)",
    "heartbeat_node": "(id, epoch, lease, address, now, expires) -> row | None unless that"
    " epoch is current and not stopped",
    "drain_node": "(id, epoch) -> bool (False unless that epoch was current and running)",
    "stop_node": "(id, epoch, now) -> bool",
    "take_over_dead_nodes": "(node, epoch, unclaimed, now) -> (rows of the nodes declared"
    " dead, rows of the inputs interrupted, rows (id, lease_epoch) of their sessions leased"
    " to the node)",
    "acquire_session": "(session_id, node, epoch, now) -> (row with the new lease_epoch | None"
    " when a live node holds it, the row before with its holder's address and liveness | None"
    " for no session, rows of the session's inputs cut off on nodes not live, interrupted)",
    "release_session": "(session_id, fence) -> bool (False when the lease moved on)",
    "append_events": "(session_id, events, now, fence=None) -> the new last seq | None for no"
    " session; Fenced as claim_next_input",
    "create_job": "(id, kind, spec, session_id, next_fire_at, state, now) -> row | None"
    " when the id is taken; NotFound for no session, ConflictError for another unique rule",
    "update_job": "(id, sets, now) -> row | None",
    "delete_job": "(id) -> bool",
    "update_run": "(run_id, state, detail, now) -> row | None",
    "fire_job": "(job_id, expected, new, run_state, input, detail, now, counts, extra_runs)"
    " -> (job row, run row, input row | None) | None when the compare-and-set lost;"
    " NotFound for no job, ConflictError for an input to a job without a session",
    "fire_jobs": "(fires, now) -> for each (job_id, expected, new, run_state, input, detail)"
    " of fires, in order, (job row, run row, input row) | None when it was not fired (the"
    " compare-and-set lost, no such job, no session); on-time occurrences with an input, each"
    " counted, no extra runs",
    "kv_put": "(namespace, rows, now) -> None",
    "kv_delete": "(namespace, keys) -> int",
    "kv_purge": "(now) -> int",
    "kv_append": "(namespace, value, expires, keep, now) -> int: the item's number, one more"
    " than the namespace's last (its counter row, key '', is locked for the transaction)",
}


class Backend(Protocol):
    """A database that runs the operations of :data:`READS` and :data:`WRITES`.

    Attributes:
        kind: ``"sqlite"`` or ``"postgres"`` (the store's ``backend``).
    """

    kind: str

    def db_time(self, value: datetime) -> Any:
        """An aware datetime as this database stores it."""
        ...

    async def read(self, op: str, /, **args: Any) -> Any:
        """Run the read-only operation ``op``."""
        ...

    async def write(self, op: str, /, **args: Any) -> Any:
        """Run the operation ``op`` in a transaction; durable when this returns."""
        ...

    async def run_read(self, fn: Any, /, **args: Any) -> Any:
        """Run a feature's own read query (:mod:`runtime.store.tables`) on a connection."""
        ...

    async def run_write(self, fn: Any, /, **args: Any) -> Any:
        """Run a feature's own write query, durable when this returns."""
        ...

    async def notify(self, channel: str, payload: str) -> None:
        """Send a notification to the channel's listeners (none on SQLite)."""
        ...

    async def listen(self, channel: str, on_message: Any) -> None:
        """Listen forever (see ``Store.listen``)."""
        ...

    async def aclose(self) -> None:
        """Finish what is in flight and close every connection; later calls are refused."""
        ...
