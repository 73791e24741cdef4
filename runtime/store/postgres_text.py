"""PostgreSQL connections whose ``text`` holds any string (``runtime/store/escaping.py``)."""

from __future__ import annotations

import asyncpg

from turnstile.runtime.store.escaping import text_codecs

__all__ = ["connect"]


async def connect(
    dsn: str,
    application_name: str | None = None,
    connection_class: type[asyncpg.Connection] = asyncpg.Connection,
) -> asyncpg.Connection:
    """``asyncpg.connect(dsn)``, with the ``text`` codec that escapes U+0000 (and, given one,
    the connection's ``application_name``, as ``pg_stat_activity`` shows it).

    Args:
        connection_class: asyncpg's, or a subclass (the round-trip counter's,
            :mod:`runtime.store.postgres_stats`).

    Raises:
        asyncpg's and OS errors, as ``asyncpg.connect`` (the connection is closed first).
    """
    settings = None if application_name is None else {"application_name": application_name}
    conn = await asyncpg.connect(dsn, server_settings=settings, connection_class=connection_class)
    try:
        # one round trip per new connection: asyncpg introspects the type once
        await conn.set_type_codec("text", **text_codecs())
    except BaseException:
        conn.terminate()
        raise
    return conn
