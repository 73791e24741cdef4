"""A store URL for each backend: the feature packages' node tests (memory, webhooks) run on
SQLite and PostgreSQL (a schema of its own per test, as ``tests/runtime/store/conftest.py``
does)."""

from __future__ import annotations

import pytest

from tests.runtime.store._support import pg_schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/node.db"
        return
    async with pg_schema(request.getfixturevalue("pg_dsn")) as (url, _):
        yield url
