"""The store's fault seam (runtime/store/faults.py), on both backends.

A crash is a real one: a child process opens the store with the fault set and writes until
the fault stops it; the test then reads what it kept.
"""

from __future__ import annotations

import os
import sys

import pytest
import trio

from turnstile.runtime.errors import StoreError
from turnstile.runtime.store import faults, open_store


@pytest.mark.parametrize(
    ("spec", "kind", "at", "seconds"),
    [
        ("crash-after:17", "crash-after", 17, 0.0),
        ("crash-before:1", "crash-before", 1, 0.0),
        ("fail:3", "fail", 3, 0.0),
        ("delay:2:0.25", "delay", 2, 0.25),
        ("count", "count", 0, 0.0),
    ],
)
def test_parse(spec, kind, at, seconds):
    fault = faults.parse(spec)
    assert (fault.kind, fault.at, fault.seconds) == (kind, at, seconds)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("explode:3", "bad TURNSTILE_STORE_FAULT 'explode:3'"),
        ("crash-after", "bad TURNSTILE_STORE_FAULT 'crash-after'"),
        ("delay:3", "bad TURNSTILE_STORE_FAULT 'delay:3'"),
        ("fail:x", "N must be an integer"),
        ("fail:0", "a store fault's write number must be >= 1"),
        ("delay:1:-1", "a store fault's delay must be >= 0"),
    ],
)
def test_parse_refuses(spec, message):
    with pytest.raises(ValueError, match=message):
        faults.parse(spec)


def test_unset_or_empty_is_no_fault():
    assert faults.from_environment({}) is None
    assert faults.from_environment({faults.ENV: ""}) is None


async def test_fail_fails_only_that_commit_and_count_logs_every_write(
    backend, monkeypatch, tmp_path
):
    log = tmp_path / "writes.log"
    monkeypatch.setenv(faults.ENV, "fail:3")
    monkeypatch.setenv(faults.LOG_ENV, str(log))
    async with backend.open() as store:
        await store.create_session("s", owner="ada")  # write 1
        await store.enqueue_input("s", "user", {"text": "one"})  # 2
        with pytest.raises(StoreError) as failed:
            await store.enqueue_input("s", "user", {"text": "two"})
        # (PostgreSQL's injected fault is a dropped connection, an outage: its text is the
        # cause's, the client-facing message a fixed sentence)
        detail = f"{failed.value} / {failed.value.__cause__}"
        assert "injected fault: the commit of write 3 failed" in detail
        await store.enqueue_input("s", "user", {"text": "three"})  # 4
        kept = [i.payload["text"] for i in await store.list_inputs("s")]
    assert kept == ["one", "three"]
    names = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert [int(n) for n, _ in names] == [1, 2, 3, 4]
    assert names[0][1] == "create_session"


async def test_delay_delays_that_commit(backend, monkeypatch):
    monkeypatch.setenv(faults.ENV, "delay:2:0.3")
    async with backend.open() as store:
        await store.create_session("s", owner="ada")
        start = trio.current_time()
        await store.enqueue_input("s", "user", {"text": "slow"})
        assert trio.current_time() - start >= 0.3
        start = trio.current_time()
        await store.enqueue_input("s", "user", {"text": "fast"})
        assert trio.current_time() - start < 0.3


_CHILD = """
import sys, trio
from turnstile.runtime.store import open_store

async def main():
    async with open_store(sys.argv[1]) as store:
        await store.create_session("s", owner="ada")
        for i in range(5):
            await store.enqueue_input("s", "user", {"text": str(i)})

trio.run(main)
"""


@pytest.mark.parametrize(("where", "kept"), [("crash-before", 2), ("crash-after", 3)])
async def test_crash_stops_the_process_at_that_commit(backend, where, kept):
    # writes: 1 the session, 2.. the inputs; the fault hits write 4, the third input
    env = {**os.environ, faults.ENV: f"{where}:4"}
    child = await trio.run_process(
        [sys.executable, "-c", _CHILD, backend.url], env=env, check=False, capture_stderr=True
    )
    assert child.returncode == faults.CRASH_EXIT, child.stderr
    assert f"store fault {where}:4".encode() in child.stderr
    async with open_store(backend.url) as store:
        assert [i.payload["text"] for i in await store.list_inputs("s")] == [
            str(i) for i in range(kept)
        ]
