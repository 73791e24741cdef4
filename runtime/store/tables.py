"""``TableQuery``, the way features wrote their own queries before operations: kept only until
the last callers move to :mod:`runtime.store.ops`.

A ``TableQuery`` did not say whether it writes; its caller did, by calling
``store.run_read`` or ``store.run_write``. So one is two operations
(:func:`runtime.store.ops.procedure`), a read and a write, made once, and those two methods pick
the one their name says. New code defines an operation, which says whether it writes, and runs
it with ``store.run``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from turnstile.runtime.store import ops

__all__ = ["TableQuery"]


class TableQuery:
    """One feature query, one function per backend (see :func:`runtime.store.ops.procedure`).

    Args:
        name: what the operation is called in errors (``"memory.save"``).
        sqlite: ``(conn: sqlite3.Connection, **args) -> answer``, run in a thread.
        postgres: ``async (conn: asyncpg.Connection, **args) -> answer``.

    Attributes:
        read: the query as an operation that reads.
        write: the query as an operation that writes.
    """

    __slots__ = ("name", "read", "write")

    def __init__(
        self,
        name: str,
        sqlite: Callable[..., Any] | None,
        postgres: Callable[..., Awaitable[Any]] | None,
    ) -> None:
        self.name = name
        self.read = ops.procedure(name, sqlite=sqlite, postgres=postgres)
        self.write = ops.procedure(name, sqlite=sqlite, postgres=postgres, writes=True)

    def __repr__(self) -> str:
        return f"<TableQuery {self.name}>"
