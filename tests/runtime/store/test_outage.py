"""Which database errors are an outage (``StoreUnavailable``) and which stay ``StoreError``
(``runtime.store.outage``): table-driven over what asyncpg, the OS and sqlite3 raise."""

from __future__ import annotations

import sqlite3

import asyncpg
import pytest

from turnstile.runtime.errors import StoreError, StoreUnavailable
from turnstile.runtime.store.outage import postgres_error, sqlite_error

UNAVAILABLE = "the store is unavailable; retry in a few seconds"
E = asyncpg.exceptions


@pytest.mark.parametrize(
    ("exc", "outage"),
    [
        (ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (TimeoutError(), True),
        (OSError(113, "No route to host"), True),
        (E.ConnectionDoesNotExistError("connection was closed in the middle of operation"), True),
        (E.ConnectionFailureError("connection failure"), True),
        (E.AdminShutdownError("terminating connection due to administrator command"), True),
        (E.CannotConnectNowError("the database system is starting up"), True),
        (E.TooManyConnectionsError("sorry, too many clients already"), True),
        (E.DiskFullError("could not extend file"), True),
        (asyncpg.InterfaceError("connection is closed"), True),
        (E.UniqueViolationError("duplicate key value violates unique constraint"), False),
        (E.UndefinedTableError('relation "nope" does not exist'), False),
        (E.DataError("invalid input for query argument $1"), False),
        (E.SerializationError("could not serialize access"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_postgres_errors(exc, outage):
    err = postgres_error(exc)
    assert err.__cause__ is exc
    if outage:
        assert type(err) is StoreUnavailable
        assert (err.code, str(err)) == ("store_unavailable", UNAVAILABLE)
    else:
        assert type(err) is StoreError
        assert (err.code, str(err)) == ("store_error", f"postgres: {exc}")


def test_sqlite_locked_past_its_timeout_is_an_outage(tmp_path):
    path = tmp_path / "s.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("INSERT INTO t VALUES (1)")
    err = sqlite_error(locked.value)
    assert (type(err), str(err)) == (StoreUnavailable, UNAVAILABLE)
    with pytest.raises(sqlite3.OperationalError) as missing:
        other.execute("SELECT * FROM nope")
    err = sqlite_error(missing.value)
    assert (type(err), str(err)) == (StoreError, "sqlite: no such table: nope")


def test_sqlite_errors_without_a_code_are_judged_by_their_sentence():
    assert type(sqlite_error(sqlite3.OperationalError("disk I/O error"))) is StoreUnavailable
    err = sqlite_error(sqlite3.OperationalError("injected fault"), "sqlite: transaction failed")
    assert (type(err), str(err)) == (StoreError, "sqlite: transaction failed: injected fault")
