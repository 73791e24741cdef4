"""Fixtures shared by the whole suite.

PostgreSQL: ``pg_dsn`` yields a DSN for a reachable server (``TURNSTILE_TEST_PG_DSN``, default
``postgresql://postgres@127.0.0.1:5432/test``). Without one the test is skipped with the reason,
except under ``CI=true``, where a skipped PostgreSQL test is a failure.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import inspect
import os
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pytest
import trio

DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _pg_reachable(dsn: str) -> str | None:
    """None when a TCP connection to the DSN's host works, else why not."""
    url = urlparse(dsn)
    host, port = url.hostname or "127.0.0.1", url.port or 5432
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"PostgreSQL at {host}:{port} unreachable ({exc})"


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    dsn = os.environ.get("TURNSTILE_TEST_PG_DSN", DEFAULT_PG_DSN)
    why = _pg_reachable(dsn)
    if why is not None:
        if IN_CI:
            pytest.fail(f"{why}; CI=true requires PostgreSQL tests to run")
        pytest.skip(f"{why}; set TURNSTILE_TEST_PG_DSN or start the local cluster")
    return dsn


@pytest.fixture
async def pg_store(pg_dsn):
    """A PostgreSQL store URL on a schema of its own (``?search_path=``), dropped afterwards."""
    from tests.runtime.store._support import pg_schema

    async with pg_schema(pg_dsn) as (url, _):
        yield url


#: A hang guard, not a promise: how long any test may take before it counts as hung. On the
#: real clock a 2-core box at load 8 runs a test four to six times slower than a quiet one, so
#: this is far beyond what a test takes there; under ``MockClock`` a deadlock still fails at
#: once. A bound that guards a performance promise belongs in ``bench/``, not here.
GUARD_SECONDS = 180


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "guard(seconds): raise the per-test fail_after deadline (trio's clock)"
    )
    config.addinivalue_line(
        "markers",
        "pg_nodes: runs several serving nodes on PostgreSQL; one such test at a time on a"
        " server with fewer than 200 connections",
    )


@functools.cache
def _max_connections(dsn: str) -> int:
    """The server's ``max_connections`` (0 when ``psql`` cannot say: then the lock is taken)."""
    try:
        done = subprocess.run(
            ["psql", dsn, "-tAc", "show max_connections"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return int(done.stdout.strip()) if done.returncode == 0 else 0
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


@pytest.fixture(autouse=True)
def _one_pg_nodes_test_at_a_time(request: pytest.FixtureRequest):
    """Tests marked ``pg_nodes`` run one at a time, across xdist workers and test runs.

    Each serving node holds up to about fifteen PostgreSQL connections (its pool, its lease's
    pool, a listener per channel). Two three-node tests that met at the end of a quiet CI run,
    a node restarted in one of them, took the server past its 100 connections: ``sorry, too
    many clients already``, answered ``503 store_unavailable`` to the test's clients. The lock
    is an ``flock`` on a file named after the server's DSN, so two suites on one server (a CI
    clone beside a working tree) also take turns. It is taken before the test's trio run
    starts, so the wait does not count against the test's hang guard.

    Only on a server with fewer than 200 connections: ``scripts/ensure-postgres.sh`` raises
    the local cluster's to 300, and there the tests overlap (taking turns cost a CI run 70 s
    of workers waiting on the lock).
    """
    dsn = os.environ.get("TURNSTILE_TEST_PG_DSN", DEFAULT_PG_DSN)
    if request.node.get_closest_marker("pg_nodes") is None or _max_connections(dsn) >= 200:
        yield
        return
    digest = hashlib.sha256(dsn.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"turnstile-tests-pg-nodes-{digest}.lock"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: The modules that take longest, longest first (seconds of one worker, measured with
#: ``scripts/test.sh --durations=0`` on the quiet 2-core box, 2026-11-28). They are collected
#: first so that, with ``--dist loadfile`` (scripts/test.sh: a module at a time to whichever
#: worker is free, in collection order), each starts early instead of the slowest ones
#: starting last and running alone: a CI run spent its last 25 s on one worker of three. A
#: stale list only costs time, never a result.
LONGEST_FIRST = (
    "tests/e2e/test_cluster.py",  # 136 s
    "tests/e2e/test_api_contract.py",  # 55
    "tests/crash/test_crash_sample.py",  # 41
    "tests/actors/test_node_start.py",  # 36
    "tests/e2e/console/test_console.py",  # 34
    "tests/test_wheel.py",  # 23
    "tests/actors/watchers/test_cluster_watchers.py",  # 23
    "tests/e2e/test_store_outage.py",  # 21
    "tests/actors/memory/test_pgvector_scale.py",  # 19
    "tests/e2e/test_http_fuzz.py",  # 19
    "tests/actors/memory/test_embeddings.py",  # 18
    "tests/e2e/test_crash.py",  # 17
    "tests/e2e/test_store_outage_cluster.py",  # 15
    "tests/actors/mcp/test_time_server.py",  # 14
    "tests/runtime/test_timerwheel.py",  # 14
    "tests/e2e/test_webhook_spool.py",  # 14
    "tests/actors/mcp/test_misbehaving.py",  # 12
    "tests/e2e/test_demo.py",  # 11
)


def _longest_first(items: list[pytest.Item]) -> None:
    """Put the modules of ``LONGEST_FIRST`` first, in its order; the rest keep theirs."""
    rank = {module: n for n, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the modules longest first (``LONGEST_FIRST``), and wrap every async test in
    ``trio.fail_after``: no test may hang the suite.

    The deadline is on trio's clock, so under ``MockClock(autojump_threshold=0)`` a deadlock
    (every task blocked forever) fails at once instead of hanging.
    """
    _longest_first(items)
    for item in items:
        fn = getattr(item, "obj", None)
        if not inspect.iscoroutinefunction(fn):
            continue
        marker = item.get_closest_marker("guard")
        seconds = marker.args[0] if marker else GUARD_SECONDS
        item.obj = _guarded(fn, seconds)


def _guarded(fn, seconds: float):
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        with trio.fail_after(seconds):
            return await fn(*args, **kwargs)

    return wrapper


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """Under CI=true a skipped PostgreSQL test is a failure, never a quiet skip."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and item.get_closest_marker("postgres") is not None:
        report.outcome = "failed"
        report.longrepr = f"PostgreSQL test skipped under CI=true: {report.longrepr}"
