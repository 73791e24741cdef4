"""How a feature runs queries on tables of its own, which the kernel knows nothing about.

A feature brings its tables as a migration set (:class:`~runtime.store.migrations.MigrationSet`)
and its queries as ``TableQuery`` objects, one function per backend; the store runs them the
way it runs its own operations, so they keep the store's guarantees:

* **SQLite**: ``sqlite(conn, **args)`` runs in a thread, never on the trio thread. A write runs
  in the writer thread's group commit (its own savepoint: an exception undoes it alone, and the
  caller's ``await`` returns once it is durable); a read runs on a reader connection in one read
  transaction (one snapshot). Placeholders are ``?``; rows are ``sqlite3.Row``.
* **PostgreSQL**: ``postgres(conn, **args)`` is a coroutine run on a pooled asyncpg connection on
  the asyncio side of the store's bridge; it opens ``async with conn.transaction():`` itself
  when it needs more than one statement. Placeholders are ``$1``…; rows are ``asyncpg.Record``.
  The connection goes back to the pool without a reset, so leave no session state behind:
  ``SET LOCAL`` and ``pg_advisory_xact_lock`` (they end with the transaction), never ``SET``,
  session advisory locks, ``LISTEN`` or cursors ``WITH HOLD``.

Either way a database error reaches the caller as ``StoreError``. Arguments are passed as
given (convert times with ``store.db_time``), and what the function returns is the answer, so a
query should return plain values (tuples, dicts, ints) rather than rows tied to a connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TableQuery"]


@dataclass(frozen=True, slots=True)
class TableQuery:
    """One operation on a feature's own tables, written for each backend.

    Attributes:
        name: what the operation is called in errors and logs (``"memory.save"``).
        sqlite: ``(conn: sqlite3.Connection, **args) -> answer``, run in a thread.
        postgres: ``async (conn: asyncpg.Connection, **args) -> answer``.
    """

    name: str
    sqlite: Callable[..., Any]
    postgres: Callable[..., Awaitable[Any]]
