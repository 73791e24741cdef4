"""Scenario ``scheduler``: 100k pending jobs, reload, firing lateness, against APScheduler 3.

Per backend (SQLite in a temp dir, then PostgreSQL in a fresh schema), in one trio run with
the real clock (``SystemClock``):

* **Scheduling.** 1,000 sessions x 100 jobs = 100k pending jobs, mixed once / interval / cron
  (one third each; cron daily in UTC and Europe/Paris), all due hours or days ahead. The first
  part goes through the actor (``ask(AddJob)`` from 100 concurrent askers), the bulk straight
  into the store (``create_job`` from many concurrent tasks, so SQLite's group commit batches
  them), and a last sample through the actor again at ~100k pending. The actor handles one
  ``AddJob`` at a time and each does a per-session ``list_jobs`` first, so its cost per add is
  measured at both ends and the time for all 100k through the actor is projected from a linear
  fit of cost per add against jobs already pending (running it would take many minutes).
* **Reload.** The scheduler actor is stopped and a new one spawned over the same store;
  ``spawn`` returns once ``on_start`` has loaded and indexed every active job.
* **Firing lateness, scheduler alone.** Once-jobs due at 1,000/s over a window (10 s; quick
  3 s), created in the store before a new scheduler loads them, next to the 100k pending ones.
  Lateness is the scheduler's own sample, due time -> its fire committed (``fire_jobs`` for
  the occurrences that come together, ``fire_job`` for one on its own; the turn input is in
  the inbox). ``publish`` only counts.
* **Firing lateness, with sessions.** The same at 1,000/s (5 s; quick 2 s), now with 1,000
  real ``SessionActor``\\ s (``ScriptedAgent(token_delay=0)``) behind ``publish``, as a node
  wires them, each with an attached in-process subscriber that records the wall time at which
  a ``stream_start`` for a job input reaches it. Reported: due -> inbox commit under that load,
  due -> ``stream_start``, and how many turns started within the drain bound.
* **Baseline, same run.** APScheduler 3 ``BackgroundScheduler`` (memory job store, its default
  thread pool) holding the same mix of 100k pending jobs, then the same 1,000/s of date jobs;
  the job function records ``time.time()`` minus its due time. Also its ``add_job`` rate.
* **Cron next-fire.** 100k chained ``CronSchedule.next_fire(previous)`` calls against a bare
  reused ``croniter(expr, start).get_next(datetime)`` loop.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
import trio

from bench.harness import Measure, ScenarioResult
from bench.pgschema import PostgresUnavailable, temporary_schema
from turnstile.actors.scheduling.actor import (
    AddJob,
    Schedule,
    SchedulerActor,
    SchedulerLimits,
    first_occurrence,
)
from turnstile.actors.scheduling.cronexpr import CronSchedule
from turnstile.actors.scheduling.schema import SCHEDULING
from turnstile.actors.scheduling.store import JobStore
from turnstile.actors.scheduling.turns import register_scheduled_kinds
from turnstile.actors.sessions.actor import Attach, SessionActor, SessionLimits, SessionServices
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.runtime.clock import SystemClock
from turnstile.runtime.gateway.frames import encode_event
from turnstile.runtime.registry import Registry
from turnstile.runtime.server import tune_gc
from turnstile.runtime.store import open_store
from turnstile.runtime.supervisor import open_supervisor

SESSIONS = 1000
RATE = 1000  # jobs falling due per second in the firing windows
ASKERS = 100
DELIVER = {"prompt": "scheduled ping", "source": "schedule"}
LIMITS = SchedulerLimits(max_jobs_per_session=200, min_interval_seconds=60)
TARGET_P99_MS = 20.0
TARGET_RELOAD_S = 5.0
TARGET_CRON_RATIO = 1.5


@dataclass
class Sizes:
    jobs: int
    actor_first: int  # added through the actor from an empty store
    actor_last: int  # added through the actor at ~jobs pending
    window_a: float  # seconds of 1,000/s firing, scheduler alone
    window_b: float  # seconds of 1,000/s firing, with sessions
    drain_b: float  # the most seconds to wait for the sessions' backlog after window B
    cron_calls: int
    #: reload once more under tracemalloc: the live scheduler's bytes per pending job
    #: (scenario ``scale``; tracing slows the reload, so its time is the first reload's)
    memory: bool = False


FULL = Sizes(100_000, 10_000, 500, 10.0, 5.0, 15.0, 100_000)
QUICK = Sizes(10_000, 1_000, 200, 3.0, 2.0, 3.0, 10_000)


def _pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def _sid(i: int, prefix: str = "s") -> str:
    return f"{prefix}{i % SESSIONS:04d}"


def _schedule(i: int, now: datetime) -> Schedule:
    """Job ``i`` of the pending mix: nothing here falls due within the next hour."""
    kind = i % 3
    if kind == 0:
        return Schedule(type="once", run_at=now + timedelta(days=1, seconds=i))
    if kind == 1:
        return Schedule(type="interval", interval_seconds=3600 + i % 3600)
    # Daily, 4 to 23 hours ahead of the current hour (a Paris hour is 1-2 h behind in UTC).
    hour = (now.hour + 4 + i % 20) % 24
    return Schedule(
        type="cron",
        cron=f"{i % 60} {hour} * * *",
        timezone="Europe/Paris" if i % 2 else "UTC",
    )


def _spec(schedule: Schedule) -> dict[str, Any]:
    """The spec the scheduler's ``_add`` stores for a job with default options."""
    return {
        "schedule": msgspec.to_builtins(schedule),
        "deliver": DELIVER,
        "label": "",
        "misfire": "coalesce",
        "misfire_grace_seconds": 60.0,
        "max_runs": 0,
        "jitter_seconds": 0.0,
    }


async def _bulk_create(store, items, concurrency: int) -> float:
    """``create_job`` for every ``(id, session_id, schedule, next_fire_at)``; seconds taken."""
    it = iter(items)
    jobs = JobStore(store)

    async def worker() -> None:
        for job_id, session_id, schedule, nfa in it:
            await jobs.create_job(
                job_id,
                kind=schedule.type,
                spec=_spec(schedule),
                session_id=session_id,
                next_fire_at=nfa,
            )

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return time.perf_counter() - start


async def _actor_add(ref, indices: range, now: datetime) -> float:
    """``ask(AddJob)`` for every index from ``ASKERS`` concurrent askers; seconds taken."""
    it = iter(indices)

    async def asker() -> None:
        for i in it:
            schedule = _schedule(i, now)
            await ref.ask(
                AddJob(
                    session_id=_sid(i),
                    kind=schedule.type,
                    schedule=schedule,
                    deliver=DELIVER,
                    job_id=f"j{i}",
                )
            )

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(ASKERS):
            nursery.start_soon(asker)
    return time.perf_counter() - start


class _StartRecorder:
    """A subscriber on every session: when each job's ``stream_start`` arrived (wall time)."""

    def __init__(self) -> None:
        self.starts: dict[str, float] = {}
        self.lagged_count = 0

    def offer(self, session_id, seq, frame) -> bool:
        if b'"stream_start"' in frame:
            now = time.time()
            job_id = msgspec.json.decode(frame).get("job_id")
            if job_id is not None:
                self.starts.setdefault(job_id, now)
        return True

    def lagged(self, session_id, last_seq) -> None:
        self.lagged_count += 1


class _GcTimer:
    """Time spent in the cyclic garbage collector while active (a ``gc.callbacks`` hook)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.longest = 0.0
        self.full = 0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            spent = time.perf_counter() - self._t0
            self.seconds += spent
            self.longest = max(self.longest, spent)
            self.full += info["generation"] == 2

    def __enter__(self) -> _GcTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class _NoTools:
    def specs(self):
        return []

    async def call(self, session_id, owner, name, arguments):  # pragma: no cover - unused
        raise RuntimeError("no tools in this bench")


@dataclass
class _Backend:
    """What one backend measured."""

    actor_first_s: float = 0.0
    actor_last_s: float = 0.0
    bulk_s: float = 0.0
    bulk_n: int = 0
    projected_actor_s: float = 0.0
    reload_s: float = 0.0
    reload_loaded: int = 0
    reload_bytes: int = 0  # traced bytes the reloaded scheduler holds (Sizes.memory)
    window: dict[str, dict[str, Any]] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds of each step

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - self._last
        self._last = now

    _last: float = field(default_factory=time.perf_counter)


async def _wait_until(wall: datetime, clock: SystemClock) -> None:
    delay = (wall - clock.now()).total_seconds()
    if delay > 0:
        await trio.sleep(delay)


async def _backend(url: str, sizes: Sizes, bulk_concurrency: int) -> _Backend:
    out = _Backend()
    clock = SystemClock()
    tools = _NoTools()
    with trio.fail_after(600):
        async with open_store(url, clock=clock, migrations=[SCHEDULING]) as store:
            sem = trio.Semaphore(bulk_concurrency)

            async def make_session(session_id: str) -> None:
                async with sem:
                    await store.create_session(session_id, "bench")

            async with trio.open_nursery() as nursery:
                for i in range(SESSIONS):
                    nursery.start_soon(make_session, _sid(i))
                    # Window A's own sessions: its inputs stay queued (no session actor runs
                    # them), so they must not be where window B's sessions would pick them up.
                    nursery.start_soon(make_session, _sid(i, "a"))
            out.mark("sessions")

            forward = [False]
            counted = [0]
            async with open_supervisor("root", escalate=False) as root:
                sessions_sup = await root.spawn_supervisor("sessions", escalate=False)
                registry = Registry(sessions_sup, idle_timeout=3600)
                services = SessionServices(
                    store=store,
                    agent=ScriptedAgent(token_delay=0),
                    tools=tools,
                    limits=SessionLimits(max_queued_inputs=10_000),
                    encode_event=encode_event,
                )
                register_scheduled_kinds(  # the fired inputs settle their runs, as on a node
                    services.input_kinds,
                    store,
                    tool_profiles=dict,
                    notify=lambda: None,
                    disable_job=None,
                )
                registry.register("session", lambda key: SessionActor(key, services))

                async def publish(session_id: str, message: Any) -> None:
                    counted[0] += 1
                    if forward[0]:
                        await registry.ref(f"session:{session_id}").tell(message)

                # 1,000,000 jobs (scenario ``scale``) are 1,000 a session: the limit must let
                # the last ones through the actor
                limits = dataclasses.replace(
                    LIMITS,
                    max_jobs_per_session=max(
                        LIMITS.max_jobs_per_session, 2 * sizes.jobs // SESSIONS
                    ),
                )
                # Only the live scheduler is kept: a stopped one's 100k entries would otherwise
                # stay reachable and slow every later full GC.
                actors: list[SchedulerActor] = []
                serial = [0]

                def factory() -> SchedulerActor:
                    actor = SchedulerActor(store, clock, publish=publish, limits=limits)
                    actors[:] = [actor]
                    return actor

                async def spawn() -> tuple[Any, float]:
                    serial[0] += 1
                    start = time.perf_counter()
                    ref = await root.spawn(factory, name=f"scheduler-{serial[0]}")
                    return ref, time.perf_counter() - start

                async def stop() -> None:
                    await root.stop(f"scheduler-{serial[0]}")

                # -- scheduling 100k --
                ref, _ = await spawn()
                now = clock.now()
                n_first, n_last = sizes.actor_first, sizes.actor_last
                out.actor_first_s = await _actor_add(ref, range(n_first), now)
                bulk = range(n_first, sizes.jobs - n_last)
                cron_cache: dict[tuple[str, str], CronSchedule] = {}

                def item(i: int):
                    schedule = _schedule(i, now)
                    cron = None
                    if schedule.type == "cron":
                        key = (schedule.cron, schedule.timezone)
                        cron = cron_cache.get(key) or cron_cache.setdefault(key, CronSchedule(*key))
                    return f"j{i}", _sid(i), schedule, first_occurrence(schedule, now, cron)

                out.bulk_n = len(bulk)
                out.bulk_s = await _bulk_create(store, (item(i) for i in bulk), bulk_concurrency)
                last = range(sizes.jobs - n_last, sizes.jobs)
                out.actor_last_s = await _actor_add(ref, last, now)
                # Cost per add is linear in jobs pending (a + b*n): fit it through both samples.
                s1, x1 = out.actor_first_s / n_first, n_first / 2
                s2, x2 = out.actor_last_s / n_last, sizes.jobs - n_last / 2
                b = max(0.0, (s2 - s1) / (x2 - x1))
                a = s1 - b * x1
                out.projected_actor_s = a * sizes.jobs + b * sizes.jobs**2 / 2
                out.mark("schedule")

                # -- reload --
                await stop()
                gc.collect()
                ref, out.reload_s = await spawn()
                out.reload_loaded = len(actors[-1].entries)
                out.mark("reload")
                if sizes.memory:
                    await stop()
                    actors.clear()
                    gc.collect()
                    tracemalloc.start()
                    try:
                        before = tracemalloc.get_traced_memory()[0]
                        ref, _ = await spawn()
                        gc.collect()
                        out.reload_bytes = tracemalloc.get_traced_memory()[0] - before
                    finally:
                        tracemalloc.stop()
                    out.mark("reload traced")

                # -- firing windows --
                async def window(name: str, seconds: float, drain: float) -> None:
                    count = int(RATE * seconds)
                    await stop()
                    recorder = None
                    if forward[0]:  # activate every session and attach a recorder to it
                        recorder = _StartRecorder()
                        attach = iter(range(SESSIONS))

                        async def attacher() -> None:
                            for i in attach:
                                address = f"session:{_sid(i)}"
                                await registry.ref(address).ask(Attach(subscriber=recorder))

                        async with trio.open_nursery() as nursery:
                            for _ in range(32):
                                nursery.start_soon(attacher)
                        out.mark(f"{name} attach")
                    # Create the window's jobs, then let a new scheduler load them: leave time
                    # for both (from the rates just measured), plus a margin (a loaded box can
                    # take twice as long as when the rates were measured; a window that starts
                    # late is flagged in the notes).
                    per_job = out.bulk_s / max(1, out.bulk_n)
                    lead = 2.0 * (count * per_job + out.reload_s) + 2.0
                    t0 = clock.now() + timedelta(seconds=lead)
                    due = {f"{name}{i}": t0 + timedelta(seconds=i / RATE) for i in range(count)}
                    prefix = "s" if forward[0] else "a"
                    items = [
                        (job_id, _sid(i, prefix), Schedule(type="once", run_at=at), at)
                        for i, (job_id, at) in enumerate(due.items())
                    ]
                    await _bulk_create(store, items, bulk_concurrency)
                    gc.collect()
                    await spawn()
                    scheduler = actors[-1]
                    slack = (t0 - clock.now()).total_seconds()
                    out.mark(f"{name} setup")
                    commits = getattr(store, "commit_stats", None)
                    await _wait_until(t0, clock)
                    start = time.perf_counter()

                    def busy() -> bool:
                        if len(scheduler.lateness) < count:
                            return True
                        return recorder is not None and len(recorder.starts) < count

                    with _GcTimer() as gc_timer, trio.move_on_after(seconds + drain):
                        while busy():  # noqa: ASYNC110 - polls two counters at 20 Hz
                            await trio.sleep(0.05)
                    elapsed = time.perf_counter() - start
                    lateness = list(scheduler.lateness)
                    result: dict[str, Any] = {
                        "count": count,
                        "fired": len(lateness),
                        "slack": slack,
                        "elapsed": elapsed,
                        "commit": lateness,
                        "gc": (gc_timer.seconds, gc_timer.longest, gc_timer.full),
                    }
                    if commits is not None:
                        c0 = commits
                        c1 = store.commit_stats
                        result["batch"] = (c1[1] - c0[1]) / max(1, c1[0] - c0[0])
                    if recorder is not None:
                        result["start"] = [
                            recorder.starts[j] - due[j].timestamp()
                            for j in due
                            if j in recorder.starts
                        ]
                        result["lagged"] = recorder.lagged_count
                    out.window[name] = result
                    out.mark(f"{name} wait")

                await window("wa", sizes.window_a, 10.0)
                forward[0] = True
                await window("wb", sizes.window_b, sizes.drain_b)
                await stop()
            out.mark("stop")
        out.mark("close")
    return out


def _run_sqlite(sizes: Sizes) -> _Backend:
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-sched-") as tmp:
        return trio.run(_backend, f"sqlite:///{tmp}/scheduler.db", sizes, 256)


def _run_postgres(sizes: Sizes) -> _Backend | str:
    """The PostgreSQL figures, or why there are none."""
    try:
        with temporary_schema() as url:
            return trio.run(_backend, url, sizes, 64)
    except PostgresUnavailable as exc:
        return str(exc)


# -- APScheduler 3 --------------------------------------------------------------------------


def _apscheduler(sizes: Sizes) -> dict[str, Any]:
    from apscheduler.schedulers.background import BackgroundScheduler

    samples: list[float] = []
    lock = threading.Lock()

    def record(due: float) -> None:
        late = time.time() - due
        with lock:
            samples.append(late)

    def noop() -> None:
        pass

    scheduler = BackgroundScheduler(
        timezone=UTC, job_defaults={"misfire_grace_time": None, "coalesce": False}
    )
    scheduler.start(paused=True)
    try:
        now = datetime.now(UTC)
        add = scheduler.add_job
        start = time.perf_counter()
        for i in range(sizes.jobs):
            s = _schedule(i, now)
            if s.type == "once":
                add(noop, "date", run_date=s.run_at)
            elif s.type == "interval":
                add(noop, "interval", seconds=s.interval_seconds)
            else:
                minute, hour = s.cron.split(" ")[:2]
                add(noop, "cron", minute=minute, hour=hour, timezone=ZoneInfo(s.timezone))
        add_s = time.perf_counter() - start
        count = int(RATE * sizes.window_a)
        t0 = time.time() + 1.0 + count * add_s / sizes.jobs * 1.5
        for i in range(count):
            due = t0 + i / RATE
            add(record, "date", run_date=datetime.fromtimestamp(due, UTC), args=(due,))
        scheduler.resume()
        deadline = t0 + sizes.window_a + 10.0
        while time.time() < deadline:
            with lock:
                if len(samples) >= count:
                    break
            time.sleep(0.05)
    finally:
        scheduler.shutdown(wait=False)
    return {"add_rate": sizes.jobs / add_s, "count": count, "lateness": list(samples)}


# -- cron next-fire -------------------------------------------------------------------------

CRON_ROUNDS = 2
CRON_CASES = [("*/5 * * * *", "UTC"), ("30 9 * * 1-5", "Europe/Paris")]


def _cron(calls: int, rounds: int) -> dict[tuple[str, str], tuple[float, float]]:
    """µs per next-fire: (CronSchedule chained next_fire, bare reused croniter)."""
    from croniter import croniter

    start = datetime(2026, 1, 1, tzinfo=UTC)
    out = {}
    for expr, tz in CRON_CASES:
        ours, bare = [], []
        for _ in range(rounds):  # interleaved rounds, the median kept
            gc.collect()
            gc.disable()
            try:
                schedule = CronSchedule(expr, tz)
                t = start
                t0 = time.perf_counter()
                for _ in range(calls):
                    t = schedule.next_fire(t)
                ours.append((time.perf_counter() - t0) / calls * 1e6)
                it = croniter(expr, start.astimezone(ZoneInfo(tz)))
                get_next = it.get_next
                t0 = time.perf_counter()
                for _ in range(calls):
                    get_next(datetime)
                bare.append((time.perf_counter() - t0) / calls * 1e6)
            finally:
                gc.enable()
        out[(expr, tz)] = (statistics.median(ours), statistics.median(bare))
    return out


# -- the scenario ---------------------------------------------------------------------------


def _backend_measures(label: str, r: _Backend, sizes: Sizes, targets: bool) -> list[Measure]:
    k = f"{sizes.jobs // 1000}k"
    ms: list[Measure] = [
        Measure(
            f"{label}: add via actor, first {sizes.actor_first:,}",
            sizes.actor_first / r.actor_first_s,
            "jobs/s",
        ),
        Measure(
            f"{label}: add via actor at ~{k} pending",
            sizes.actor_last / r.actor_last_s,
            "jobs/s",
        ),
        Measure(
            f"{label}: {k} via actor (projected)",
            r.projected_actor_s,
            "s",
        ),
        Measure(
            f"{label}: bulk create_job direct to store",
            r.bulk_n / r.bulk_s,
            "jobs/s",
        ),
        Measure(
            f"{label}: reload {r.reload_loaded:,} jobs",
            r.reload_s,
            "s",
            target=f"< {TARGET_RELOAD_S:g} s" if targets else None,
            ok=r.reload_s < TARGET_RELOAD_S if targets else None,
        ),
    ]
    return ms


def _gc_text(figures: tuple[float, float, int]) -> str:
    seconds, longest, full = figures
    return f"{seconds:.2f} s (longest pause {longest * 1e3:.0f} ms, {full} full)"


def run(quick: bool = False) -> ScenarioResult:
    """Measure the scheduler on both backends and APScheduler; see the module docstring."""
    sizes = QUICK if quick else FULL
    load = os.getloadavg()
    thresholds = gc.get_threshold()
    tune_gc()  # what `turnstile serve` does; every backend and the baseline run under it
    thresholds_served = gc.get_threshold()
    try:
        sqlite = _run_sqlite(sizes)
        pg = _run_postgres(sizes)
        aps = _apscheduler(sizes)
        cron = _cron(sizes.cron_calls, CRON_ROUNDS)
    finally:
        gc.set_threshold(*thresholds)  # leave the process as we found it

    aps_lat = [x * 1e3 for x in aps["lateness"]]
    aps_p50, aps_p99 = _pct(aps_lat, 0.5), _pct(aps_lat, 0.99)
    measures: list[Measure] = []
    notes: list[str] = []
    backends: list[tuple[str, _Backend]] = [("SQLite", sqlite)]
    if isinstance(pg, _Backend):
        backends.append(("PostgreSQL", pg))
    else:
        notes.append(f"PostgreSQL skipped: {pg}.")
    for label, r in backends:
        sqlite_targets = label == "SQLite"
        measures += _backend_measures(label, r, sizes, sqlite_targets)
        wa = r.window["wa"]
        lat = [x * 1e3 for x in wa["commit"]]
        p50, p99 = _pct(lat, 0.5), _pct(lat, 0.99)
        measures += [
            Measure(
                f"{label}: lateness due->inbox commit p50 @1k/s",
                p50,
                "ms",
                baseline="APScheduler 3 due->run",
                baseline_value=aps_p50,
            ),
            Measure(
                f"{label}: lateness due->inbox commit p99 @1k/s",
                p99,
                "ms",
                baseline="APScheduler 3 due->run",
                baseline_value=aps_p99,
                target=f"< {TARGET_P99_MS:g} ms" if sqlite_targets else None,
                ok=(p99 < TARGET_P99_MS and wa["fired"] == wa["count"]) if sqlite_targets else None,
            ),
            Measure(f"{label}: lateness due->inbox commit max", max(lat, default=0), "ms"),
            Measure(f"{label}: fired in window A", wa["fired"], f"of {wa['count']:,}"),
        ]
        wb = r.window["wb"]
        lat_b = [x * 1e3 for x in wb["commit"]]
        start_b = [x * 1e3 for x in wb.get("start", [])]
        measures += [
            Measure(f"{label}+sessions: due->inbox commit p50", _pct(lat_b, 0.5), "ms"),
            Measure(
                f"{label}+sessions: due->inbox commit p99",
                _pct(lat_b, 0.99),
                "ms",
                # issue 14's target for PostgreSQL: 1,000 fires/s next to 1,000 active sessions
                target=None if sqlite_targets else f"<= {TARGET_P99_MS:g} ms",
                ok=None
                if sqlite_targets
                else (_pct(lat_b, 0.99) <= TARGET_P99_MS and len(lat_b) == wb["count"]),
            ),
            Measure(f"{label}+sessions: due->stream_start p50", _pct(start_b, 0.5), "ms"),
            Measure(f"{label}+sessions: due->stream_start p99", _pct(start_b, 0.99), "ms"),
            Measure(
                f"{label}+sessions: fired (inbox commits) / due",
                len(lat_b),
                f"of {wb['count']:,}",
            ),
            Measure(
                f"{label}+sessions: turns started / due",
                len(start_b),
                f"of {wb['count']:,}",
            ),
            Measure(
                f"{label}+sessions: turn starts/s sustained",
                len(start_b) / wb["elapsed"] if wb["elapsed"] else 0.0,
                "turns/s",
            ),
        ]
        for name, w in (("A", wa), ("B", wb)):
            if w["slack"] < 0:
                notes.append(
                    f"{label}: window {name} started {-w['slack']:.1f} s late (its jobs and "
                    "the scheduler's reload took longer than the lead left for them), so its "
                    "first occurrences were already overdue: its lateness figures are not "
                    "comparable."
                )
        extra = ""
        if "batch" in wa:
            extra = (
                f"; group commit held {wa['batch']:.1f} requests per transaction in window A, "
                f"{wb['batch']:.1f} in window B"
            )
        notes.append(
            f"{label}: window A started with {wa['slack']:.1f} s of slack after the reload, "
            f"window B with {wb['slack']:.1f} s; window B waited {wb['elapsed']:.1f} s "
            f"for {len(start_b):,} of {wb['count']:,} stream_starts{extra}. Cost per add "
            f"through the actor: {r.actor_first_s / sizes.actor_first * 1e3:.2f} ms over the "
            f"first {sizes.actor_first:,}, {r.actor_last_s / sizes.actor_last * 1e3:.2f} ms at "
            f"~{sizes.jobs:,} pending. Cyclic GC while waiting: window A "
            f"{_gc_text(wa['gc'])}, window B {_gc_text(wb['gc'])}. Steps (s): "
            + ", ".join(f"{k} {v:.1f}" for k, v in r.phases.items())
            + "."
        )
    measures += [
        Measure(f"APScheduler 3: add_job ({sizes.jobs // 1000}k mix)", aps["add_rate"], "jobs/s"),
        Measure(
            "APScheduler 3: fired in window",
            len(aps_lat),
            f"of {aps['count']:,}",
        ),
    ]
    for (expr, tz), (ours, bare) in cron.items():
        measures.append(
            Measure(
                f"cron next_fire '{expr}' {tz}",
                ours,
                "µs",
                baseline="reused croniter get_next",
                baseline_value=bare,
                target=f"<= {TARGET_CRON_RATIO:g}x",
                ok=ours <= TARGET_CRON_RATIO * bare,
            )
        )
    notes += [
        f"Load average when the scenario started: {load[0]:.2f} (1 min) on {os.cpu_count()} "
        "cores; everything here shares them (trio thread, SQLite writer, PostgreSQL).",
        f"Jobs: {sizes.jobs:,} over {SESSIONS:,} sessions, a third each once (due in a day), "
        "interval (1-2 h) and cron (daily, UTC or Europe/Paris), so none falls due during the "
        f"run. Through the actor: the first {sizes.actor_first:,} and the last "
        f"{sizes.actor_last:,} ({ASKERS} concurrent askers); the rest with create_job straight "
        "to the store (256 concurrent tasks on SQLite, 64 on PostgreSQL) with the spec the "
        "actor would store. The projected time for all of them through the actor integrates "
        "a cost per add linear in the jobs pending, fitted through both actor samples.",
        "Reload: the scheduler actor is stopped and a new one spawned over the same store; the "
        "figure is spawn() returning, i.e. on_start done (list_jobs of every active job, "
        "schedule decode, wheel index).",
        f"Window A: {int(RATE * sizes.window_a):,} once-jobs due at {RATE:,}/s over "
        f"{sizes.window_a:g} s, next to the {sizes.jobs:,} pending ones; publish only counts. "
        "Lateness is the scheduler's own sample: due time -> JobStore.fire_jobs (or fire_job) "
        "committed (run record + inbox input), measured with the real clock; SQLite is "
        "synchronous=FULL (the default), so every group commit is an fsync.",
        f"Window B: {int(RATE * sizes.window_b):,} once-jobs due at {RATE:,}/s over "
        f"{sizes.window_b:g} s, publish tells the real SessionActor (registry, ScriptedAgent "
        "with no token delay), as the node wires it; a subscriber attached to every session "
        "stamps stream_start frames for job inputs. The sessions' turns (claim, events, close: "
        "several writes each) share the store and the one core with the scheduler, so both "
        f"lateness figures are given under that load; the drain after the window is bounded "
        f"to {sizes.drain_b:g} s.",
        "APScheduler 3 baseline: BackgroundScheduler, MemoryJobStore, default 10-thread pool, "
        "misfire_grace_time=None; the same 100k pending mix added paused (date / interval / "
        "cron triggers), then the window's date jobs, then resumed. Its lateness is due -> "
        "the job function running in a pool thread (nothing persisted), for comparison with "
        "due -> durable inbox commit.",
        f"Cron: {sizes.cron_calls:,} chained next_fire(previous) calls per round, median of "
        f"{CRON_ROUNDS} rounds, cyclic GC off while timing; baseline "
        "croniter(expr, start).get_next(datetime) on one reused iterator in the job's zone.",
    ]
    notes.append(
        f"GC thresholds as in `turnstile serve` (runtime.server.tune_gc): {thresholds_served}, "
        "for every part (SQLite, PostgreSQL, APScheduler)."
    )
    if quick:
        notes.append(
            "Quick run: 10k jobs (1k + 200 through the actor), window A 3 s, window B 2 s "
            "(3 s drain), 10k cron calls; the reload target is stated for 100k and is checked "
            "on 10k here."
        )
    return ScenarioResult("scheduler", measures, notes)
