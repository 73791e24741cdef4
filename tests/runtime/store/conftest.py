"""Fixtures for the store suite: every test runs against SQLite and PostgreSQL.

PostgreSQL isolation: each test gets its own schema ``t_<random>`` (created here, dropped
afterwards) and a store URL with ``?search_path=t_<random>``; asyncpg passes unknown DSN query
parameters on as server settings, so every pooled connection lives in that schema.
"""

from __future__ import annotations

import pytest

from tests.runtime.store._support import Backend, ManualClock, pg_schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend_kind(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    if request.param == "postgres":
        return "postgres", request.getfixturevalue("pg_dsn")
    return "sqlite", None


@pytest.fixture
async def backend(backend_kind: tuple[str, str | None], tmp_path) -> Backend:
    kind, dsn = backend_kind
    if kind == "sqlite":
        yield Backend("sqlite", f"sqlite:///{tmp_path}/store.db")
        return
    assert dsn is not None
    async with pg_schema(dsn) as (url, _):
        yield Backend("postgres", url, admin_dsn=dsn)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def store(backend: Backend, clock: ManualClock):
    async with backend.open(clock) as s:
        yield s
