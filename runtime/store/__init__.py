"""The durable store: sessions, inboxes, event logs, nodes, small key-value state.

The store is the truth; memory is a cache. One protocol (:class:`Store`), two backends:

* ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or ``sqlite:///:memory:``
  (embedded default; option ``?synchronous=normal`` trades power-loss durability for latency);
* ``postgresql://user@host:5432/db`` (also ``postgres://``; option ``?pool_size=N``, the
  most connections the store opens at once, 1 to ``MAX_POOL_SIZE``, default 10; other query
  parameters become server settings, e.g. ``?search_path=myschema``).

One validating front (:class:`~runtime.store.front.Store`) checks every argument and builds
every record; the backend under it only runs operations (:mod:`runtime.store.ops`: typed query
objects holding each backend's SQL, written once where it is the same, and their decoding). A
feature's operations on its own tables are the same objects, run with :meth:`Store.run`. The
schema is the kernel's migration set plus any set a caller passes
(:mod:`runtime.store.migrations`).

Usage::

    async with open_store("sqlite:///turnstile.db") as store:
        await store.create_session("s1", owner="ada")
        item = await store.enqueue_input("s1", "user", {"text": "hello"})
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from turnstile.runtime.clock import Clock, SystemClock
from turnstile.runtime.store import ops, pgerrors
from turnstile.runtime.store._util import (
    check_int,
    check_limit,
    check_text,
    check_time,
    decode_json,
    decode_optional_json,
    encode_json,
    encode_optional_json,
    no_session,
)
from turnstile.runtime.store.base import UNSET, UnsetType, optional_ts, ts
from turnstile.runtime.store.closing import ClosingStep, Step
from turnstile.runtime.store.escaping import escape_json, unescape_json
from turnstile.runtime.store.front import Store, StoreFront
from turnstile.runtime.store.inbox import INPUT_COLUMNS, INSERT_INPUT, input_record
from turnstile.runtime.store.kernel import KERNEL, SCHEMA_VERSION
from turnstile.runtime.store.migrations import Migration, MigrationSet, ordered_sets
from turnstile.runtime.store.ops import Operation, Statement
from turnstile.runtime.store.records import (
    FINAL_INPUT_STATES,
    INPUT_STATES,
    NODE_STATES,
    ClusterView,
    Enqueued,
    EventRecord,
    InboxItem,
    MigrationRecord,
    NodeRecord,
    NodeRef,
    Session,
    SessionLease,
    TakeOver,
)
from turnstile.runtime.store.sessions import require_session_postgres, require_session_sqlite

__all__ = [
    "Store",
    "StoreFront",
    "open_store",
    "Migration",
    "MigrationSet",
    "Operation",
    "Statement",
    "Step",
    "ClosingStep",
    "ops",
    "pgerrors",
    "UNSET",
    "UnsetType",
    "SCHEMA_VERSION",
    "Session",
    "InboxItem",
    "Enqueued",
    "EventRecord",
    "MigrationRecord",
    "NodeRef",
    "NodeRecord",
    "ClusterView",
    "TakeOver",
    "SessionLease",
    "NODE_STATES",
    "INPUT_STATES",
    "FINAL_INPUT_STATES",
    # for a feature's operations that write a kernel row with their own, or check and encode
    # their arguments as the kernel's do (so both backends raise the same errors)
    "INPUT_COLUMNS",
    "INSERT_INPUT",
    "input_record",
    "require_session_sqlite",
    "require_session_postgres",
    "ts",
    "optional_ts",
    "check_int",
    "check_limit",
    "check_text",
    "check_time",
    "decode_json",
    "decode_optional_json",
    "encode_json",
    "encode_optional_json",
    # JSON a feature encodes itself (not a dict, its own encoder), as the store writes it
    "escape_json",
    "unescape_json",
    "no_session",
]

_SQLITE_OPTIONS = {"synchronous"}
#: The most connections ``?pool_size=`` may ask a PostgreSQL store for.
MAX_POOL_SIZE = 500


def postgres_options(url: str) -> tuple[str, dict[str, int]]:
    """Take the store's own options (``pool_size``) out of a PostgreSQL URL: the URL left for
    the driver (whose other query parameters become server settings, so ours must not reach
    it) and the pool options.

    Raises:
        ValueError: ``pool_size`` is not a whole number from 1 to ``MAX_POOL_SIZE``.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options: dict[str, int] = {}
    for key, value in query:
        if key == "pool_size":
            if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_POOL_SIZE:
                raise ValueError(
                    f"bad postgresql url: pool_size must be a whole number from 1 to "
                    f"{MAX_POOL_SIZE}, not {value[:20]!r}"
                )
            options["max_size"] = int(value)
    if not options:
        return url, options
    rest = urlencode([(k, v) for k, v in query if k != "pool_size"])
    return urlunsplit(parts._replace(query=rest)), options


@asynccontextmanager
async def open_store(
    url: str,
    *,
    clock: Clock | None = None,
    migrations: Sequence[MigrationSet] = (),
    name: str | None = None,
) -> AsyncIterator[Store]:
    """Open the store at ``url``, apply pending migrations, and close it on exit.

    Args:
        url: ``sqlite:///...`` or ``postgresql://...`` (see the module docstring).
        clock: stamps every row; defaults to the system clock.
        migrations: migration sets to apply after the kernel's, in this order (see
            :mod:`runtime.store.migrations`); each is tracked by its name and versions.
        name: who holds the store (a node: its id). PostgreSQL names its connections after it
            (``application_name``: ``turnstile <name>``, a listener's ``turnstile <name>
            listen <channel>``; a URL's own ``application_name`` replaces ``turnstile
            <name>``), so ``pg_stat_activity`` tells whose they are. SQLite ignores it.

    Yields:
        The open store (a :class:`~runtime.store.front.Store`).

    Raises:
        ValueError: the URL is not one the store understands, or two sets share a name.
        MigrationError: the schema is newer than this code, or a migration failed.
        StoreError: the database cannot be opened.
    """
    sets = ordered_sets(KERNEL, migrations)
    clock = clock if clock is not None else SystemClock()
    if url.startswith("sqlite://"):
        from turnstile.runtime.store.sqlite import SQLiteBackend

        rest = url.removeprefix("sqlite://")
        if not rest.startswith("/") or rest == "/":
            raise ValueError(f"bad sqlite url {url!r}: use sqlite:///path/to/file.db")
        path, _, query = rest[1:].partition("?")
        options = dict(parse_qsl(query, keep_blank_values=True))
        unknown = set(options) - _SQLITE_OPTIONS
        if unknown:
            raise ValueError(f"unknown sqlite option {sorted(unknown)[0]!r}")
        sqlite = SQLiteBackend(path, synchronous=options.get("synchronous", "FULL"))
        await sqlite.open(sets, clock.now())
        try:
            yield Store(sqlite, clock)
        finally:
            await sqlite.aclose()
    elif url.startswith(("postgresql://", "postgres://")):
        from turnstile.runtime.store.postgres import open_postgres_backend

        dsn, pool = postgres_options(url)
        async with open_postgres_backend(dsn, sets, clock.now(), name=name, **pool) as postgres:
            yield Store(postgres, clock)
    else:
        scheme = url.partition(":")[0]
        raise ValueError(f"unsupported store url scheme {scheme!r}")
