"""What a turn and a fire cost on PostgreSQL: round trips, commits and CPU, against SQLite's
turns/s (issue 26).

``python -m bench.pgturns`` runs, in one process, the in-process turns of ``bench sessions``
(a node with ``open_node(serve=False)``, ``N`` sessions, each sending ``M`` 3-word messages in
a closed loop, ``ScriptedAgent`` at 0 ms) on SQLite and then on PostgreSQL (a throw-away
schema), alternating which goes first, ``--rounds`` times. On PostgreSQL the store counts what
it sends (``TURNSTILE_STORE_STATS=1``, :mod:`runtime.store.postgres_stats`), so each round
reports per turn: round trips, statement preparations, operations, commits (write operations),
and each operation's calls and round trips. Then ``--fires`` once-jobs (one per session, due
over one second) fire and run their turns: the same per fired turn, measured from half a
second before the first is due to the last turn's end (their rate is the schedule's).

CPU per turn is read from ``/proc``: this process's main thread (trio: the node and the
clients), its other threads (PostgreSQL: the store's asyncio thread; SQLite: the writer and
readers), and the server processes of the store's own connections (by ``application_name``;
the WAL writer and other shared server processes are not among them).

A warm-up turn per session runs first (the pool grown, statements prepared), then the
measured ones. ``--json PATH`` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import trio

from bench.pgschema import PG_DSN, PostgresUnavailable, temporary_schema
from bench.scenarios.sessions import USER, _in_process_phase, _InProcSubscriber, _limits
from turnstile.actors.config import Config
from turnstile.actors.node import open_node
from turnstile.actors.scheduling.actor import AddJob, Schedule
from turnstile.actors.scheduling.feature import SchedulingFeature
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.actors.sessions.feature import SessionsFeature
from turnstile.actors.sessions.ids import session_key
from turnstile.runtime.server import tune_gc
from turnstile.runtime.store import ops
from turnstile.runtime.store.postgres_stats import ENV as STATS_ENV

_TICK = os.sysconf("SC_CLK_TCK")

_BACKENDS = ops.rows(
    "bench.backends",
    postgres="SELECT pid FROM pg_stat_activity WHERE application_name = :name",
    decode=lambda row: row["pid"],
)


def _ticks(path: str) -> int:
    """utime + stime of a ``/proc/.../stat`` file, in clock ticks (0 once it is gone)."""
    try:
        with open(path) as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _threads() -> tuple[int, int]:
    """CPU ticks of this process's main thread and of all its other threads."""
    main = threading.main_thread().native_id
    mine = others = 0
    for tid in os.listdir("/proc/self/task"):
        ticks = _ticks(f"/proc/self/task/{tid}/stat")
        if int(tid) == main:
            mine += ticks
        else:
            others += ticks
    return mine, others


@dataclass
class Cost:
    """One measured phase."""

    store: str
    what: str  # "turns" or "fires"
    count: int
    seconds: float
    cpu_main_ms: float
    cpu_others_ms: float
    cpu_server_ms: float | None
    round_trips: int | None = None
    prepares: int | None = None
    operations: int | None = None
    writes: int | None = None
    by_operation: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def per(self, value: float | None) -> float | None:
        return None if value is None or not self.count else value / self.count


class _Meter:
    """Snapshots of time, CPU and (PostgreSQL) the store's counts around a phase."""

    def __init__(self, node: Any) -> None:
        self.store = node.store
        self.engine = node.store.engine
        self.postgres = self.store.backend == "postgres"
        self.pids: list[int] = []

    async def start(self) -> None:
        if self.postgres:
            self.pids = await self.store.run(_BACKENDS, name=self.engine.application_name)
        self._t = time.perf_counter()
        self._threads = _threads()
        self._server = sum(_ticks(f"/proc/{pid}/stat") for pid in self.pids)
        self._stats = self.engine.statistics() if self.postgres else None

    def stop(self, what: str, count: int) -> Cost:
        seconds = time.perf_counter() - self._t
        main, others = _threads()
        ms = 1000.0 / _TICK
        cost = Cost(
            store=self.store.backend,
            what=what,
            count=count,
            seconds=seconds,
            cpu_main_ms=(main - self._threads[0]) * ms,
            cpu_others_ms=(others - self._threads[1]) * ms,
            cpu_server_ms=None,
        )
        if self.postgres:
            server = sum(_ticks(f"/proc/{pid}/stat") for pid in self.pids)
            cost.cpu_server_ms = (server - self._server) * ms
            stats = self.engine.statistics() - self._stats
            cost.round_trips, cost.prepares = stats.round_trips, stats.prepares
            cost.operations, cost.writes = stats.operations, stats.writes
            cost.by_operation = {
                name: (s.calls, s.round_trips) for name, s in sorted(stats.by_operation.items())
            }
        return cost


class _EndCounter:
    """A subscriber that counts the ``stream_end`` events of one session."""

    def __init__(self, ends: dict[str, int], done: trio.Event, expected: int) -> None:
        self.ends, self.done, self.expected = ends, done, expected

    def offer(self, session_id: str, seq: int, frame: bytes) -> bool:
        if b'"stream_end"' in frame:
            self.ends[session_id] = self.ends.get(session_id, 0) + 1
            if sum(self.ends.values()) >= self.expected:
                self.done.set()
        return True

    def lagged(self, session_id: str, last_seq: int) -> None:  # pragma: no cover
        pass


async def _phases(url: str, n: int, m: int, fires: int) -> list[Cost]:
    agent = ScriptedAgent()
    config = Config(store=url, limits=_limits(), idle_timeout=300.0)
    scheduling = SchedulingFeature()
    features = [SessionsFeature(agent), scheduling]
    costs = []
    async with open_node(config, agent=agent, features=features, serve=False) as node:
        directory = node.directory
        subs, keys = [], []
        for i in range(n):
            name = f"t{i:04d}"
            await directory.create_session(USER, session_id=name)
            keys.append(session_key(USER, name))
            sub = _InProcSubscriber(name, None)  # type: ignore[arg-type]
            sub.next_seq = (await directory.attach(USER, name, sub)).last_seq + 1
            subs.append(sub)
        await _in_process_phase(directory, subs, 1)  # warm-up: pool grown, statements prepared
        meter = _Meter(node)
        await meter.start()
        tally = await _in_process_phase(directory, subs, m)
        costs.append(meter.stop("turns", tally.turns))
        if fires:
            ends: dict[str, int] = {}
            done = trio.Event()
            for i in range(n):
                await directory.attach(USER, f"t{i:04d}", _EndCounter(ends, done, fires))
            assert scheduling.scheduler is not None
            due = datetime.now(UTC) + timedelta(seconds=2.0)
            for i in range(fires):
                at = due + timedelta(seconds=i / fires)
                await scheduling.scheduler.ask(
                    AddJob(
                        session_id=keys[i % n],
                        kind="once",
                        schedule=Schedule(type="once", run_at=at),
                        deliver={"prompt": f"scheduled {i}"},
                    )
                )
            # measured from before the first is due (a late start on a busy box missed fires)
            lead = (due - datetime.now(UTC)).total_seconds() - 0.5
            await trio.sleep_until(trio.current_time() + max(0.0, lead))
            await meter.start()
            with trio.fail_after(120):
                await done.wait()
            costs.append(meter.stop("fires", fires))
    return costs


def _run(store: str, n: int, m: int, fires: int) -> list[Cost]:
    with ExitStack() as stack:
        if store == "sqlite":
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="turnstile-bench-"))
            url = f"sqlite:///{tmp}/node.db"
        else:
            url = stack.enter_context(temporary_schema())
            os.environ[STATS_ENV] = "1"
            stack.callback(os.environ.pop, STATS_ENV, None)
        return trio.run(_phases, url, n, m, fires)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _report(costs: list[Cost]) -> None:
    for c in costs:
        line = (
            f"  {c.store:8} {c.what:5} {c.count:5} in {c.seconds:6.2f}s = {c.rate:8.1f}/s;"
            f" CPU per {c.what[:-1]}: main {_fmt(c.per(c.cpu_main_ms), 3)} ms,"
            f" other threads {_fmt(c.per(c.cpu_others_ms), 3)} ms,"
            f" server {_fmt(c.per(c.cpu_server_ms), 3)} ms"
        )
        print(line)
        if c.round_trips is not None:
            print(
                f"           per {c.what[:-1]}: round trips {_fmt(c.per(c.round_trips))},"
                f" prepares {_fmt(c.per(c.prepares))}, operations {_fmt(c.per(c.operations))},"
                f" commits {_fmt(c.per(c.writes))}"
            )
            for name, (calls, trips) in c.by_operation.items():
                print(
                    f"             {name:28} calls {calls / c.count:5.2f}"
                    f"  round trips {trips / c.count:5.2f}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=20, help="measured turns per session")
    parser.add_argument("--fires", type=int, default=100, help="once-jobs fired (0: none)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=["both", "sqlite", "postgres"], default="both")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    tune_gc()
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    print(f"PostgreSQL at {PG_DSN}; N={args.sessions}, M={args.turns}, fires={args.fires}")
    results: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = stores if r % 2 == 0 else stores[::-1]
        load = os.getloadavg()[0]
        costs: list[Cost] = []
        for store in order:
            try:
                costs += _run(store, args.sessions, args.turns, args.fires)
            except PostgresUnavailable as exc:
                print(f"  postgres: no figures ({exc})")
        by = {(c.store, c.what): c for c in costs}
        lite, pg = by.get(("sqlite", "turns")), by.get(("postgres", "turns"))
        ratio = f", PostgreSQL/SQLite {pg.rate / lite.rate:.2f}" if lite and pg else ""
        print(
            f"round {r + 1} ({' then '.join(order)}), load {load:.2f} -> "
            f"{os.getloadavg()[0]:.2f}{ratio}"
        )
        _report(costs)
        results.append(
            {
                "round": r + 1,
                "order": order,
                "load_before": load,
                "load_after": os.getloadavg()[0],
                "costs": [asdict(c) for c in costs],
            }
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
