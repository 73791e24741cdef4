"""Fixtures for scheduling's store tests (``test_job_store.py``, ``test_recall_constraint.py``,
``test_schema.py``): the store suite's, on SQLite and PostgreSQL alike, with scheduling's
migration set applied after the kernel's, as ``open_node`` applies it.

``jobs_backend`` is the store suite's :class:`~tests.runtime.store._support.Backend` (raw SQL
behind the store's back) whose ``open`` applies the set; ``jobs`` is a
:class:`~actors.scheduling.store.JobStore` over a store opened that way.
"""

from __future__ import annotations

import pytest

from tests.runtime.store._support import Backend, ManualClock, pg_schema
from turnstile.actors.scheduling.schema import SCHEDULING
from turnstile.actors.scheduling.store import JobStore
from turnstile.runtime.clock import Clock
from turnstile.runtime.store import open_store


class SchedulingBackend(Backend):
    """A test database whose store has scheduling's tables."""

    def open(self, clock: Clock | None = None):
        return open_store(self.url, clock=clock, migrations=[SCHEDULING])


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def jobs_backend(request: pytest.FixtureRequest, tmp_path) -> SchedulingBackend:
    if request.param == "sqlite":
        yield SchedulingBackend("sqlite", f"sqlite:///{tmp_path}/store.db")
        return
    dsn = request.getfixturevalue("pg_dsn")
    async with pg_schema(dsn) as (url, _):
        yield SchedulingBackend("postgres", url, admin_dsn=dsn)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def jobs_store(jobs_backend: SchedulingBackend, clock: ManualClock):
    async with jobs_backend.open(clock) as store:
        yield store


@pytest.fixture
def jobs(jobs_store) -> JobStore:
    return JobStore(jobs_store)
