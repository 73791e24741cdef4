"""Which database errors mean the store is unavailable, and what a client is told of them.

A backend turns every error its driver raises into a :class:`~runtime.errors.StoreError`.
Those that say the database cannot be reached now become
:class:`~runtime.errors.StoreUnavailable` (the gateway's ``503`` with ``Retry-After``), whose
message is one fixed sentence; the driver's text, which names the database's host and port and
may quote SQL, goes to the node's log only (at warning: the node recovers on its own when the
store answers again, so an outage is not a bug). Unavailable means:

* PostgreSQL: the connection refused, reset, closed or timed out (``OSError``,
  ``TimeoutError``); asyncpg's connection errors (SQLSTATE class ``08``, ``ConnectionDoesNotExist``)
  and its interface errors on a connection that is gone; the server shutting down or not yet
  accepting connections (``57P01``-``57P03``), or out of resources (class ``53``: too many
  connections, disk full, out of memory); an operation that waited past its bound (pool
  exhausted, a stalled connection).
* SQLite: the database stays locked (``SQLITE_BUSY``, ``SQLITE_LOCKED``) past its busy timeout;
  its files cannot be read, written or opened (``SQLITE_IOERR``, ``SQLITE_FULL``,
  ``SQLITE_CANTOPEN``, ``SQLITE_PROTOCOL``).

Any other error stays a plain ``StoreError`` (a constraint the SQL did not expect, a bug): the
gateway answers it ``500 store_error`` without its text.
"""

from __future__ import annotations

import logging
import sqlite3

from turnstile.runtime.errors import StoreError, StoreUnavailable

__all__ = ["is_postgres_outage", "is_sqlite_outage", "postgres_error", "sqlite_error"]

log = logging.getLogger("turnstile.store")

#: SQLSTATE classes and codes of a server that cannot serve now (PostgreSQL appendix A)
_UNAVAILABLE_CLASSES = ("08", "53")
_UNAVAILABLE_CODES = ("57P01", "57P02", "57P03")

#: SQLite's primary result codes of a database that cannot be used now
_SQLITE_UNAVAILABLE = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_PROTOCOL,
}


def is_postgres_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (asyncpg's, or the OS's) says PostgreSQL cannot be reached now."""
    if isinstance(exc, (OSError, TimeoutError, EOFError)):
        return True
    import asyncpg  # loaded already: only the PostgreSQL backend calls this

    if isinstance(exc, asyncpg.PostgresError):
        sqlstate = str(getattr(exc, "sqlstate", "") or "")
        return sqlstate[:2] in _UNAVAILABLE_CLASSES or sqlstate in _UNAVAILABLE_CODES
    if isinstance(exc, asyncpg.InterfaceError):
        # "connection is closed", "connection was closed in the middle of operation"; not a
        # misuse such as a value of the wrong type (DataError) or an unsupported feature
        return not isinstance(
            exc,
            (
                asyncpg.exceptions.DataError,
                asyncpg.exceptions.ClientConfigurationError,
                asyncpg.exceptions.UnsupportedClientFeatureError,
                asyncpg.exceptions.UnsupportedServerFeatureError,
            ),
        )
    return False


def is_sqlite_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (sqlite3's) says the database cannot be used now."""
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):  # an extended code (SQLITE_IOERR_WRITE): its low byte is primary
        return code & 0xFF in _SQLITE_UNAVAILABLE
    # sqlite3 errors raised by Python itself carry no code: judge by SQLite's own sentences
    text = str(exc)
    return text.startswith(("database is locked", "disk I/O error", "unable to open database"))


def postgres_error(exc: BaseException, what: str = "postgres") -> StoreError:
    """The ``StoreError`` for a driver error ``exc`` of PostgreSQL (chained to it)."""
    if is_postgres_outage(exc):
        log.warning("%s: the store is unavailable: %s: %s", what, type(exc).__name__, exc)
        err: StoreError = StoreUnavailable()
    else:
        err = StoreError(f"{what}: {exc}")
    err.__cause__ = exc
    return err


def sqlite_error(exc: BaseException, what: str = "sqlite") -> StoreError:
    """The ``StoreError`` for a ``sqlite3`` error ``exc`` (chained to it)."""
    if is_sqlite_outage(exc):
        log.warning("%s: the store is unavailable: %s", what, exc)
        err: StoreError = StoreUnavailable()
    else:
        err = StoreError(f"{what}: {exc}")
    err.__cause__ = exc
    return err
