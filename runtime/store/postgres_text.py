"""PostgreSQL connections whose ``text`` holds any string (``runtime/store/escaping.py``)."""

from __future__ import annotations

import asyncpg

from turnstile.runtime.store.escaping import text_codecs

__all__ = ["connect"]


async def connect(dsn: str) -> asyncpg.Connection:
    """``asyncpg.connect(dsn)``, with the ``text`` codec that escapes U+0000.

    Raises:
        asyncpg's and OS errors, as ``asyncpg.connect`` (the connection is closed first).
    """
    conn = await asyncpg.connect(dsn)
    try:
        # one round trip per new connection: asyncpg introspects the type once
        await conn.set_type_codec("text", **text_codecs())
    except BaseException:
        conn.terminate()
        raise
    return conn
