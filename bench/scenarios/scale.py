"""Scenario ``scale``: one node with 100,000 sessions, and a scheduler with 1,000,000 timers.

Issue 26 asks what one node holds, measured rather than guessed. Both parts run on the
embedded SQLite store (the default), in this process.

**Sessions** (100,000; ``--quick`` 10,000): 1,000 users with 100 sessions each, created
through the node's directory (``open_node(serve=False)`` with the sessions feature, as the
``sessions`` scenario runs it). Then:

* **live and idle**: every session is activated (a client attaches and detaches, which loads
  its actor and its transcript) and left idle; ``tracemalloc`` gives the bytes each one holds,
  against the baseline of the ``idle`` scenario, a bare trio task parked on its own memory
  channel, traced the same way at the same N;
* **passivated**: every actor is passivated (what the idle timeout does); the bytes left per
  session should be nothing but allocator slack;
* **activation**: 1,000 sessions, now passivated, are attached again, each timed: p50/p99,
  against the store reads an activation cannot avoid (the session's row and the end of its
  transcript, ``get_session`` + ``read_events_back``) timed through the same store;
* **listing**: each user's page of 100 sessions (``list_sessions``, what ``GET /sessions``
  serves), p50/p99, against the same page read with a bare ``sqlite3`` query on the file.

**Timers** (1,000,000 pending jobs; ``--quick`` 100,000): the ``scheduler`` scenario's run
at that size (``bench/scenarios/scheduler.py``: the jobs written to the store, a new scheduler
loading them, then 1,000 fires/s alone and with 1,000 sessions turning), plus the reloaded
scheduler's memory per pending job under ``tracemalloc`` against a ``heapq`` of
``(deadline, id)`` entries (the least a timer queue holds), and the reload's time against a
bare ``sqlite3`` read of the same rows.
"""

from __future__ import annotations

import gc
import heapq
import os
import sqlite3
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field

import trio
import trio.testing

from bench.harness import Measure, ScenarioResult
from bench.scenarios import scheduler
from turnstile.actors.config import Config, Limits
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.actors.sessions.feature import SessionsFeature
from turnstile.runtime.server import tune_gc

PER_USER = 100
CREATE_CONCURRENCY = 32
SAMPLE = 1000  # activations timed after passivation
TRANSCRIPT = ("user_message", "stream_end", "tool_call", "tool_result")


def _pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


class _Quiet:
    """A client that attaches and reads nothing: activation is what is measured."""

    __slots__ = ()

    def offer(self, session_id: str, seq: int, frame: bytes) -> bool:
        return True

    def lagged(self, session_id: str, last_seq: int) -> None:
        pass

    def deleted(self, session_id: str) -> None:
        pass


@dataclass
class _Sessions:
    n: int = 0
    create_s: float = 0.0
    live_bytes: float = 0.0
    bare_bytes: float = 0.0
    passivated_bytes: float = 0.0
    activate_all_s: float = 0.0
    activation: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    listing: list[float] = field(default_factory=list)
    bare_listing: list[float] = field(default_factory=list)


async def _bare_tasks(n: int) -> float:
    """Bytes per bare trio task parked on its own memory channel (the ``idle`` baseline)."""

    async def parked(receive: trio.MemoryReceiveChannel[None]) -> None:
        async for _ in receive:
            pass

    async with trio.open_nursery() as nursery:
        before = _traced()
        keep = []
        for _ in range(n):
            send, receive = trio.open_memory_channel[None](1000)
            keep.append(send)
            nursery.start_soon(parked, receive)
        await trio.testing.wait_all_tasks_blocked()
        live = _traced()
        nursery.cancel_scope.cancel()
    return (live - before) / n


async def _sessions(users: int, tmp: str) -> _Sessions:
    out = _Sessions(n=users * PER_USER)
    agent = ScriptedAgent()
    config = Config(
        store=f"sqlite:///{tmp}/node.db",
        limits=Limits(max_sessions_per_user=PER_USER),
        idle_timeout=3600.0,
    )
    names = [(f"u{u:04d}", f"s{i:03d}") for u in range(users) for i in range(PER_USER)]
    async with open_node(
        config, agent=agent, features=[SessionsFeature(agent)], serve=False
    ) as node:
        directory = node.directory
        registry = directory.registry
        store = directory.store
        todo = iter(names)
        start = time.perf_counter()

        async def creator() -> None:
            for user, sid in todo:
                await directory.create_session(user, session_id=sid)

        async with trio.open_nursery() as nursery:
            for _ in range(CREATE_CONCURRENCY):
                nursery.start_soon(creator)
        out.create_s = time.perf_counter() - start

        quiet = _Quiet()
        tracemalloc.start()
        try:
            before = _traced()
            start = time.perf_counter()
            todo = iter(names)

            async def activator() -> None:
                for user, sid in todo:
                    await directory.attach(user, sid, quiet)
                    await directory.detach(user, sid, quiet)

            async with trio.open_nursery() as nursery:
                for _ in range(CREATE_CONCURRENCY):
                    nursery.start_soon(activator)
            out.activate_all_s = time.perf_counter() - start
            await trio.testing.wait_all_tasks_blocked()
            assert registry.statistics().active >= out.n, registry.statistics()
            out.live_bytes = (_traced() - before) / out.n
            for address in registry.active("session"):
                await registry.deactivate(address)
            await trio.testing.wait_all_tasks_blocked()
            out.passivated_bytes = max(0, _traced() - before) / out.n
            out.bare_bytes = await _bare_tasks(out.n)
        finally:
            tracemalloc.stop()

        step = max(1, len(names) // SAMPLE)
        for user, sid in names[::step][:SAMPLE]:
            key = await directory.owned_key(user, sid)
            t0 = time.perf_counter()
            await store.get_session(key)
            await store.read_events_back(key, TRANSCRIPT, limit=200)
            out.floor.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await directory.attach(user, sid, quiet)
            out.activation.append(time.perf_counter() - t0)
            await directory.detach(user, sid, quiet)

        db = sqlite3.connect(f"{tmp}/node.db")
        try:
            for u in range(users):
                user = f"u{u:04d}"
                t0 = time.perf_counter()
                page = await directory.list_sessions(user, limit=PER_USER)
                out.listing.append(time.perf_counter() - t0)
                assert len(page) == PER_USER
                t0 = time.perf_counter()
                rows = db.execute(
                    "SELECT * FROM sessions WHERE owner = ? ORDER BY id LIMIT ?", (user, PER_USER)
                ).fetchall()
                out.bare_listing.append(time.perf_counter() - t0)
                assert len(rows) == PER_USER
        finally:
            db.close()
    return out


def _heap_bytes(n: int) -> float:
    """Bytes per entry of a heapq of ``(deadline, id)``: the least a timer queue holds."""
    tracemalloc.start()
    try:
        before = _traced()
        heap: list[tuple[float, str]] = []
        now = time.time()
        for i in range(n):
            heapq.heappush(heap, (now + i, f"j{i}"))
        held = _traced() - before
    finally:
        tracemalloc.stop()
    del heap
    return held / n


def _bare_reload(path: str) -> float:
    """Seconds to read every job row with a bare sqlite3 query (the reload's floor)."""
    db = sqlite3.connect(path)
    try:
        start = time.perf_counter()
        rows = db.execute("SELECT * FROM jobs").fetchall()
        took = time.perf_counter() - start
    finally:
        db.close()
    assert rows
    return took


def _timers(quick: bool) -> tuple[scheduler._Backend, scheduler.Sizes, float]:
    jobs = 100_000 if quick else 1_000_000
    sizes = scheduler.Sizes(jobs, 1_000, 200, 3.0, 2.0, 5.0, 0, memory=True)
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-scale-") as tmp:
        url = f"sqlite:///{tmp}/scheduler.db"
        result = trio.run(scheduler._backend, url, sizes, 256)
        bare = _bare_reload(f"{tmp}/scheduler.db")
    return result, sizes, bare


def run(quick: bool = False) -> ScenarioResult:
    """One node at scale; see the module docstring."""
    users = 100 if quick else 1000
    load = os.getloadavg()
    thresholds = gc.get_threshold()
    tune_gc()  # what `turnstile serve` does
    try:
        with tempfile.TemporaryDirectory(prefix="turnstile-bench-scale-") as tmp:
            s = trio.run(_sessions, users, tmp)
        t, sizes, bare_reload = _timers(quick)
        heap = _heap_bytes(sizes.jobs)
    finally:
        gc.set_threshold(*thresholds)
    n = s.n
    ms = 1e3
    wa = t.window["wa"]
    lat = [x * ms for x in wa["commit"]]
    wb = t.window["wb"]
    start_b = [x * ms for x in wb.get("start", [])]
    measures = [
        Measure(f"{n:,} sessions: created", n / s.create_s, "sessions/s"),
        Measure(
            f"{n:,} sessions: bytes per live idle session",
            s.live_bytes,
            "bytes",
            baseline="bare trio task + channel",
            baseline_value=s.bare_bytes,
        ),
        Measure(
            f"{n:,} sessions: bytes per passivated session",
            s.passivated_bytes,
            "bytes",
            target="< 1 KB",
            ok=s.passivated_bytes < 1024,
        ),
        Measure(f"{n:,} sessions: activated (attach + detach)", n / s.activate_all_s, "sessions/s"),
        Measure(
            f"{n:,} sessions: activation p50",
            _pct(s.activation, 0.5) * ms,
            "ms",
            baseline="its store reads",
            baseline_value=_pct(s.floor, 0.5) * ms,
        ),
        Measure(
            f"{n:,} sessions: activation p99",
            _pct(s.activation, 0.99) * ms,
            "ms",
            baseline="its store reads",
            baseline_value=_pct(s.floor, 0.99) * ms,
        ),
        Measure(
            f"{n:,} sessions: a user's page of {PER_USER} p50",
            _pct(s.listing, 0.5) * ms,
            "ms",
            baseline="bare sqlite3 query",
            baseline_value=_pct(s.bare_listing, 0.5) * ms,
        ),
        Measure(
            f"{n:,} sessions: a user's page of {PER_USER} p99",
            _pct(s.listing, 0.99) * ms,
            "ms",
            baseline="bare sqlite3 query",
            baseline_value=_pct(s.bare_listing, 0.99) * ms,
        ),
        Measure(
            f"{sizes.jobs:,} timers: bytes per pending job (scheduler)",
            t.reload_bytes / max(1, t.reload_loaded),
            "bytes",
            baseline="heapq (deadline, id)",
            baseline_value=heap,
        ),
        Measure(
            f"{sizes.jobs:,} timers: reload",
            t.reload_s,
            "s",
            baseline="bare sqlite3 read of the rows",
            baseline_value=bare_reload,
        ),
        Measure(f"{sizes.jobs:,} timers: loaded", t.reload_loaded, "jobs"),
        Measure(
            f"{sizes.jobs:,} timers: due->inbox commit p99 @1k/s",
            _pct(lat, 0.99),
            "ms",
            target=f"< {scheduler.TARGET_P99_MS:g} ms",
            ok=_pct(lat, 0.99) < scheduler.TARGET_P99_MS and wa["fired"] == wa["count"],
        ),
        Measure(f"{sizes.jobs:,} timers: fired in window A", wa["fired"], f"of {wa['count']:,}"),
        Measure(
            f"{sizes.jobs:,} timers + 1,000 sessions: due->stream_start p99",
            _pct(start_b, 0.99),
            "ms",
        ),
    ]
    notes = [
        f"Load average before: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}. {n:,} sessions "
        f"({users:,} users x {PER_USER}) created in {s.create_s:.1f} s and activated in "
        f"{s.activate_all_s:.1f} s; activation timed on {len(s.activation):,} passivated ones.",
        f"Timers: window A started with {wa['slack']:.1f} s of slack after the reload. Steps (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in t.phases.items())
        + ".",
    ]
    return ScenarioResult("scale", measures, notes)
