"""asyncpg's exception classes, for the PostgreSQL sides of operations, imported on first use.

An operation's PostgreSQL side catches the server's answers it expects (a foreign key that
points nowhere: no such session; a unique rule) as asyncpg's classes. The modules that define
operations are imported on SQLite too, so they name the classes through this module
(``except pgerrors.ForeignKeyViolationError:``): Python evaluates an ``except`` clause only when
an exception reaches it, by which time the PostgreSQL backend has imported asyncpg, so a node
on SQLite never loads it.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    import asyncpg

    return getattr(asyncpg, name)
