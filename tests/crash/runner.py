"""Crash runs in bulk: every commit point (``--full``) or a seeded sample, and the table.

``.venv/bin/python -m tests.crash --full`` runs every scenario on SQLite (and PostgreSQL with
``--store both`` and ``TURNSTILE_TEST_PG_DSN``): first once without a crash to count its
commit points, then once per point with a crash before it and once with a crash after it
(``--fault fail``: once per point with that commit failing while the node lives on).
Without ``--full``, ``--sample K`` (default 1) points per scenario and store, chosen by a seed
that is printed (``TURNSTILE_CRASH_SEED`` or ``--seed`` repeats a run), among the points the
scenario is known to have (:attr:`Scenario.points`), with no counting run: that is the form
the suite runs (``tests/crash/test_crash_sample.py``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from tests.crash.harness import DELAY, FAIL, WHERES, Outcome, count_points, run_many, run_point
from tests.crash.scenarios import SCENARIOS

SEED_ENV = "TURNSTILE_CRASH_SEED"


def seed_from(value: int | None = None) -> int:
    """``value``, else ``TURNSTILE_CRASH_SEED``, else a new random one."""
    if value is not None:
        return value
    env = os.environ.get(SEED_ENV)
    return int(env) if env else random.SystemRandom().randrange(2**31)


@dataclass
class Row:
    """One line of the table: a scenario on a store."""

    scenario: str
    store: str
    points: int = 0
    runs: int = 0
    crashes: int = 0
    violations: list[tuple[Outcome, str]] = field(default_factory=list)
    seconds: float = 0.0


def sample(
    scenarios: Sequence[str],
    stores: Sequence[str],
    k: int,
    seed: int,
    wheres: Sequence[str] = WHERES,
):
    """``k`` (scenario, store, where, point) per scenario and store, drawn with ``seed``."""
    rng = random.Random(seed)
    picked = []
    for store in stores:
        for name in scenarios:
            points = SCENARIOS[name].points
            for _ in range(k):
                picked.append((name, store, rng.choice(wheres), rng.randint(1, points)))
    return picked


async def run_sample(
    scenarios: Sequence[str],
    stores: Sequence[str],
    k: int,
    seed: int,
    workdir: Path,
    pg_dsn: str | None,
    parallel: int = 3,
    survivor: bool = False,
    wheres: Sequence[str] = WHERES,
) -> list[Outcome]:
    """The sampled crash runs (see :func:`sample`), ``parallel`` at a time."""
    jobs: list[Callable[[], Awaitable[Outcome]]] = []
    for name, store, where, point in sample(scenarios, stores, k, seed, wheres):

        async def job(name=name, store=store, where=where, point=point) -> Outcome:
            return await run_point(
                SCENARIOS[name](), store, where, point, workdir, pg_dsn, survivor
            )

        jobs.append(job)
    return await run_many(jobs, parallel)


async def run_full(
    scenarios: Sequence[str],
    stores: Sequence[str],
    workdir: Path,
    pg_dsn: str | None,
    parallel: int,
    progress: Callable[[str], None],
    survivor: bool = False,
    wheres: Sequence[str] = WHERES,
) -> list[Row]:
    """Every commit point of every scenario on every store, crashed before and after (with
    ``survivor``: on PostgreSQL with a second node that takes over, see ``run_point``)."""
    rows: list[Row] = []
    for store in stores:
        for name in scenarios:
            started = time.monotonic()
            row = Row(name, store + ("+survivor" if survivor else ""))
            names, violations = await count_points(SCENARIOS[name](), store, workdir, pg_dsn)
            row.points = len(names)
            for v in violations:
                row.violations.append((Outcome(name, store, "none", 0), v))
            progress(f"{name} on {store}: {row.points} commit points")
            jobs: list[Callable[[], Awaitable[Outcome]]] = []
            for point in range(1, row.points + 1):
                for where in wheres:

                    async def job(
                        name: str = name,
                        store: str = store,
                        names: list[str] = names,
                        where: str = where,
                        point: int = point,
                    ) -> Outcome:
                        outcome = await run_point(
                            SCENARIOS[name](), store, where, point, workdir, pg_dsn, survivor
                        )
                        outcome.operation = names[point - 1]
                        return outcome

                    jobs.append(job)

            def done(outcome: Outcome) -> None:
                mark = "VIOLATION" if outcome.violations else "ok"
                progress(f"  {outcome.describe()}: {mark} ({outcome.seconds:.1f}s)")

            for outcome in await run_many(jobs, parallel, done):
                row.runs += 1
                row.crashes += outcome.crashed
                row.violations += [(outcome, v) for v in outcome.violations]
            row.seconds = time.monotonic() - started
            rows.append(row)
            progress(table([row]))  # each row as it is done: a long run stopped early keeps them
    return rows


def table(rows: Sequence[Row]) -> str:
    """The full run's table (markdown), then each violation on a line of its own."""
    lines = [
        "| scenario | store | commit points | runs | crashes | violations | time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.store} | {r.points} | {r.runs} | {r.crashes}"
            f" | {len(r.violations)} | {r.seconds:.0f} s |"
        )
    details = [f"- {o.describe()}: {v}" for r in rows for o, v in r.violations]
    return "\n".join(lines + ([""] + details if details else []))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.crash", description=__doc__)
    parser.add_argument("--full", action="store_true", help="every commit point, both sides")
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--sample", type=int, default=1, help="points per scenario and store")
    parser.add_argument("--seed", type=int, help=f"the sample's seed (or {SEED_ENV})")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--workdir", help="keep each run's store and log here")
    parser.add_argument(
        "--survivor",
        action="store_true",
        help="PostgreSQL, two nodes: the crashed one does not come back, the other takes over",
    )
    parser.add_argument(
        "--fault",
        choices=["crash", "fail", "delay"],
        default="crash",
        help="crash before and after each commit (default), or fail it: the node lives on and"
        " the client re-sends what was refused, or delay it: the commit waits 2 s",
    )
    args = parser.parse_args(argv)
    wheres = {"fail": FAIL, "delay": DELAY}.get(args.fault, WHERES)
    scenarios = args.scenario or list(SCENARIOS)
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    if args.survivor:
        stores = ["postgres"]
    pg_dsn = os.environ.get("TURNSTILE_TEST_PG_DSN")
    if "postgres" in stores and not pg_dsn:
        parser.error("PostgreSQL runs need TURNSTILE_TEST_PG_DSN (scripts/ensure-postgres.sh)")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="turnstile-crash-"))
    print(f"work directory: {workdir}", flush=True)

    def progress(line: str) -> None:
        print(line, flush=True)

    if args.full:
        rows = trio.run(
            run_full,
            scenarios,
            stores,
            workdir,
            pg_dsn,
            args.parallel,
            progress,
            args.survivor,
            wheres,
        )
    else:
        seed = seed_from(args.seed)
        print(f"seed {seed} ({SEED_ENV}={seed} repeats this sample)", flush=True)
        outcomes = trio.run(
            run_sample,
            scenarios,
            stores,
            args.sample,
            seed,
            workdir,
            pg_dsn,
            args.parallel,
            args.survivor,
            wheres,
        )
        rows = []
        for o in outcomes:
            if not rows or (rows[-1].scenario, rows[-1].store) != (o.scenario, o.store):
                rows.append(Row(o.scenario, o.store, SCENARIOS[o.scenario].points))
            rows[-1].runs += 1
            rows[-1].crashes += o.crashed
            rows[-1].seconds += o.seconds
            rows[-1].violations += [(o, v) for v in o.violations]
            progress(f"  {o.describe()}: {'VIOLATION' if o.violations else 'ok'}")
    print(table(rows), flush=True)
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
