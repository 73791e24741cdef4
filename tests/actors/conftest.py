"""A store URL for each backend: the feature packages' node tests (memory, webhooks) run on
SQLite and PostgreSQL (a schema of its own per test, as ``tests/runtime/store/conftest.py``
does)."""

from __future__ import annotations

import secrets

import pytest
import trio

from tests.runtime.store._support import pg_run


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/node.db"
        return
    dsn = request.getfixturevalue("pg_dsn")
    schema = f"t_{secrets.token_hex(6)}"
    await pg_run(dsn, f"CREATE SCHEMA {schema}")
    try:
        sep = "&" if "?" in dsn else "?"
        yield f"{dsn}{sep}search_path={schema}"
    finally:
        with trio.CancelScope(shield=True):
            await pg_run(dsn, f"DROP SCHEMA {schema} CASCADE")
