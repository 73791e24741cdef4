"""The durable store: sessions, inboxes, event logs, jobs and runs.

The store is the truth; memory is a cache. One protocol (:class:`Store`), two backends:

* ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or ``sqlite:///:memory:``
  (embedded default; option ``?synchronous=normal`` trades power-loss durability for latency);
* ``postgresql://user@host:5432/db`` (also ``postgres://``; other query parameters become
  server settings, e.g. ``?search_path=myschema``).

Usage::

    async with open_store("sqlite:///turnstile.db") as store:
        await store.create_session("s1", owner="ada")
        item = await store.enqueue_input("s1", "user", {"text": "hello"})
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl

from turnstile.runtime.clock import Clock
from turnstile.runtime.store.base import UNSET, Store, UnsetType
from turnstile.runtime.store.migrations import SCHEMA_VERSION
from turnstile.runtime.store.records import (
    FINAL_INPUT_STATES,
    INPUT_STATES,
    JOB_STATES,
    RUN_STATES,
    EventRecord,
    FireResult,
    InboxItem,
    Job,
    JobRun,
    MigrationRecord,
    Session,
)

__all__ = [
    "Store",
    "open_store",
    "UNSET",
    "UnsetType",
    "SCHEMA_VERSION",
    "Session",
    "InboxItem",
    "EventRecord",
    "Job",
    "JobRun",
    "FireResult",
    "MigrationRecord",
    "INPUT_STATES",
    "FINAL_INPUT_STATES",
    "JOB_STATES",
    "RUN_STATES",
]

_SQLITE_OPTIONS = {"synchronous"}


@asynccontextmanager
async def open_store(url: str, *, clock: Clock | None = None) -> AsyncIterator[Store]:
    """Open the store at ``url``, apply pending migrations, and close it on exit.

    Args:
        url: ``sqlite:///...`` or ``postgresql://...`` (see the module docstring).
        clock: stamps every row; defaults to the system clock.

    Yields:
        The open store.

    Raises:
        ValueError: the URL is not one the store understands.
        MigrationError: the schema is newer than this code, or a migration failed.
        StoreError: the database cannot be opened.
    """
    if url.startswith("sqlite://"):
        from turnstile.runtime.store.sqlite import SQLiteStore

        rest = url.removeprefix("sqlite://")
        if not rest.startswith("/") or rest == "/":
            raise ValueError(f"bad sqlite url {url!r}: use sqlite:///path/to/file.db")
        path, _, query = rest[1:].partition("?")
        options = dict(parse_qsl(query, keep_blank_values=True))
        unknown = set(options) - _SQLITE_OPTIONS
        if unknown:
            raise ValueError(f"unknown sqlite option {sorted(unknown)[0]!r}")
        store = SQLiteStore(path, clock=clock, synchronous=options.get("synchronous", "FULL"))
        await store.open()
        try:
            yield store
        finally:
            await store.aclose()
    elif url.startswith(("postgresql://", "postgres://")):
        from turnstile.runtime.store.postgres import open_postgres_store

        async with open_postgres_store(url, clock=clock) as pg_store:
            yield pg_store
    else:
        scheme = url.partition(":")[0]
        raise ValueError(f"unsupported store url scheme {scheme!r}")
