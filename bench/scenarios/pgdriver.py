"""Scenario ``pgdriver``: which way to PostgreSQL is fastest from trio, on a turn's queries.

A turn of a session, as the store runs it, is five operations: ``enqueue_input``,
``claim_next_input``, ``append_events`` twice (what streamed during a commit: ``stream_start``,
then a delta and ``stream_end``) and ``finish_input``. This scenario runs exactly that mix from
trio tasks (one per session, closed loop: the next turn starts when the last one closed)
through each candidate way of reaching PostgreSQL, with the same SQL:

* ``trio-asyncio`` (the baseline: the store before this scenario): asyncpg's pool on a
  trio-asyncio loop, every operation through ``trio_asyncio.aio_as_trio``;
* ``asyncio thread (asyncpg.Pool)``: asyncpg's pool on a plain asyncio loop in a thread of its
  own, each operation handed over with ``call_soon_threadsafe`` and its outcome handed back
  with ``TrioToken.run_sync_soon`` (the store's :class:`~runtime.store.postgres.AsyncioThread`);
* ``the store``: the store's PostgreSQL backend as it ships: that thread with its wake-ups
  batched both ways, its own light pool (no reset query after every operation), and
  ``append_events`` as one statement (a data-modifying ``WITH``: the same row lock, seqs and
  rows in one round trip instead of BEGIN, UPDATE, INSERT, COMMIT); ``the store, append_events
  as a transaction`` runs it with the old four-round-trip ``append_events`` (``_append_tx``),
  as the two candidates above do;
* ``psycopg threads``: psycopg 3 (libpq, C speed-ups) with its ``ConnectionPool``, each
  operation a blocking call in a trio worker thread (``trio.to_thread.run_sync``);
* ``psycopg asyncio thread``: psycopg 3's ``AsyncConnectionPool`` on the same asyncio thread
  bridge as asyncpg;
* ``psycopg threads, pipeline``: the psycopg thread path with ``append_events`` in pipeline
  mode (its statements sent without waiting for each answer).

Each candidate runs in a fresh Python process (trio-asyncio patches asyncio globally when it is
imported, which would tax the others), one after another and twice in alternating order, on
the same schema; reported: the better of the two runs. Two loads: the queries alone, and with
1 ms of pure-Python work per turn on the trio thread in 0.1 ms slices (about what a node
spends per turn besides its queries: SQLite in-process turns run at ~1,000/s on one core), which
is where a second thread has to win the GIL from a busy trio thread.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import trio

from bench.harness import Measure, ScenarioResult
from bench.pgschema import PG_DSN, PostgresUnavailable, temporary_schema

#: operations per turn, for the per-operation figures
OPS_PER_TURN = 5
POOL_SIZE = 10
WORK_SLICE = 0.0001

CANDIDATES = {
    "trio-asyncio": "asyncpg on trio-asyncio (today)",
    "thread": "asyncpg on an asyncio thread (asyncpg.Pool)",
    "store-tx": "the store, append_events as a transaction",
    "store": "the store (asyncio thread, batched wake-ups, own pool, 1-statement append)",
    "psycopg-threads": "psycopg 3 pool in trio worker threads",
    "psycopg-aio-thread": "psycopg 3 async pool on an asyncio thread",
    "psycopg-pipeline": "psycopg 3 threads, append_events pipelined",
}
BASELINE = "trio-asyncio"

START = json.dumps({"type": "stream_start", "content": "m"})
DELTA = json.dumps({"type": "stream_delta", "text": "You said: m"})
END = json.dumps({"type": "stream_end", "status": "completed", "text": "You said: m"})
PAYLOAD = json.dumps({"text": "m"})


# -- asyncpg: the store's own query functions, and append_events as it was -------------------


async def _append_tx(conn: Any, session_id: str, events: list, now: datetime) -> int | None:
    """append_events before it became one statement: BEGIN, UPDATE, INSERT, COMMIT."""
    async with conn.transaction():
        last = await conn.fetchval(
            "UPDATE sessions SET last_seq = last_seq + $2, updated_at = $3 WHERE id = $1"
            " RETURNING last_seq",
            session_id,
            len(events),
            now,
        )
        if last is None:
            return None
        await conn.execute(
            "INSERT INTO events (session_id, seq, type, payload, ts)"
            " SELECT $1, s, t, p::jsonb, $5"
            " FROM unnest($2::bigint[], $3::text[], $4::text[]) AS x(s, t, p)",
            session_id,
            list(range(last - len(events) + 1, last + 1)),
            [t for t, _ in events],
            [p for _, p in events],
            now,
        )
    return last


def _asyncpg_ops(one_round_trip: bool) -> dict[str, Any]:
    """The PostgreSQL sides of the store's operations for a turn (no decoding)."""
    from functools import partial

    from turnstile.runtime.store import claims, events, inbox

    return {
        "enqueue": inbox.ENQUEUE_INPUT.postgres,
        "claim": claims.CLAIM_NEXT_INPUT.postgres,
        "append": events.APPEND_EVENTS.postgres if one_round_trip else _append_tx,
        "finish": partial(claims.MOVE_INPUT.postgres, was="running"),
    }


# -- psycopg 3: the same statements -----------------------------------------------------------

_P_ENQUEUE = (
    "INSERT INTO inbox (session_id, source, payload, state, created_at, updated_at)"
    " VALUES (%s, %s, %s::jsonb, 'queued', %s, %s) RETURNING *"
)
_P_CLAIM = (
    "UPDATE inbox SET state = 'running', updated_at = %s, claimed_by = %s, claimed_epoch = %s"
    " WHERE id = (SELECT id FROM inbox WHERE session_id = %s AND state = 'queued'"
    " ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING *"
)
_P_SEQ = (
    "UPDATE sessions SET last_seq = last_seq + %s, updated_at = %s WHERE id = %s RETURNING last_seq"
)
_P_INSERT = (
    "INSERT INTO events (session_id, seq, type, payload, ts)"
    " SELECT %s, s, t, p::jsonb, %s FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS x(s, t, p)"
)
_P_INSERT_PIPE = (
    "INSERT INTO events (session_id, seq, type, payload, ts)"
    " SELECT %s, s.last_seq - %s + x.n, x.t, x.p::jsonb, %s"
    " FROM sessions s, unnest(%s::text[], %s::text[]) WITH ORDINALITY AS x(t, p, n)"
    " WHERE s.id = %s"
)
_P_FINISH = (
    "UPDATE inbox SET state = %s, detail = %s::jsonb, updated_at = %s"
    " WHERE id = %s AND state = 'running' RETURNING *"
)


def _p_enqueue(conn, session_id, source, payload, now):
    return conn.execute(_P_ENQUEUE, (session_id, source, payload, now, now)).fetchone()


def _p_claim(conn, session_id, now, node, epoch):
    return conn.execute(_P_CLAIM, (now, node, epoch, session_id)).fetchone()


def _p_append(conn, session_id, events, now):
    with conn.transaction():
        last = conn.execute(_P_SEQ, (len(events), now, session_id)).fetchone()
        if last is None:
            return None
        last = last["last_seq"]
        seqs = list(range(last - len(events) + 1, last + 1))
        conn.execute(
            _P_INSERT, (session_id, now, seqs, [t for t, _ in events], [p for _, p in events])
        )
    return last


def _p_append_pipeline(conn, session_id, events, now):
    # BEGIN, UPDATE, INSERT (seqs from the row the UPDATE just wrote), COMMIT sent at once
    with conn.pipeline(), conn.transaction():
        cur = conn.execute(_P_SEQ, (len(events), now, session_id))
        conn.execute(
            _P_INSERT_PIPE,
            (
                session_id,
                len(events),
                now,
                [t for t, _ in events],
                [p for _, p in events],
                session_id,
            ),
        )
    row = cur.fetchone()
    return None if row is None else row["last_seq"]


def _p_finish(conn, input_id, state, detail, now):
    return conn.execute(_P_FINISH, (state, detail, now, input_id)).fetchone()


async def _pa_enqueue(conn, session_id, source, payload, now):
    cur = await conn.execute(_P_ENQUEUE, (session_id, source, payload, now, now))
    return await cur.fetchone()


async def _pa_claim(conn, session_id, now, node, epoch):
    return await (await conn.execute(_P_CLAIM, (now, node, epoch, session_id))).fetchone()


async def _pa_append(conn, session_id, events, now):
    async with conn.transaction():
        last = await (await conn.execute(_P_SEQ, (len(events), now, session_id))).fetchone()
        if last is None:
            return None
        last = last["last_seq"]
        seqs = list(range(last - len(events) + 1, last + 1))
        await conn.execute(
            _P_INSERT, (session_id, now, seqs, [t for t, _ in events], [p for _, p in events])
        )
    return last


async def _pa_finish(conn, input_id, state, detail, now):
    return await (await conn.execute(_P_FINISH, (state, detail, now, input_id))).fetchone()


def _libpq_conninfo(url: str) -> str:
    """The store URL with ``?search_path=x`` as libpq's ``options=-csearch_path=x``."""
    base, _, query = url.partition("?")
    schema = query.removeprefix("search_path=")
    return f"{base}?options=-csearch_path%3D{schema}"


# -- the runners: each gives ``call(op_name, **args)`` to trio tasks ----------------------------


async def _run_trio_asyncio(url: str, body) -> Any:
    import asyncpg
    import trio_asyncio

    ops = _asyncpg_ops(False)
    async with trio_asyncio.open_loop() as loop:
        pool = await trio_asyncio.aio_as_trio(asyncpg.create_pool, loop=loop)(
            url, min_size=POOL_SIZE, max_size=POOL_SIZE
        )

        async def with_conn(op, kwargs):
            async with pool.acquire() as conn:
                return await op(conn, **kwargs)

        aio_with_conn = trio_asyncio.aio_as_trio(with_conn, loop=loop)

        async def call(name: str, **kwargs: Any) -> Any:
            return await aio_with_conn(ops[name], kwargs)

        try:
            return await body(call)
        finally:
            await trio_asyncio.aio_as_trio(pool.close, loop=loop)()


async def _run_thread(url: str, body) -> Any:
    """asyncpg.Pool (its default reset after every operation) on the store's asyncio thread."""
    import asyncpg

    from turnstile.runtime.store.postgres import open_asyncio_thread

    ops = _asyncpg_ops(False)
    async with open_asyncio_thread() as aio:

        async def create():
            return await asyncpg.create_pool(url, min_size=POOL_SIZE, max_size=POOL_SIZE)

        pool = await aio.call(create)

        async def with_conn(op, kwargs):
            async with pool.acquire() as conn:
                return await op(conn, **kwargs)

        async def call(name: str, **kwargs: Any) -> Any:
            return await aio.call(with_conn, ops[name], kwargs)

        try:
            return await body(call)
        finally:
            await aio.call(pool.close)


async def _run_store(url: str, body, one_round_trip: bool) -> Any:
    """The store's own PostgreSQL backend, as it ships (operations without the front)."""
    from turnstile.runtime.store import ops as store_ops
    from turnstile.runtime.store.kernel import KERNEL
    from turnstile.runtime.store.postgres import open_postgres_backend

    ops = {
        name: store_ops.procedure(name, sqlite=None, postgres=fn, writes=True)
        for name, fn in _asyncpg_ops(one_round_trip).items()
    }
    now = datetime.now(UTC)
    async with open_postgres_backend(url, [KERNEL], now, max_size=POOL_SIZE) as backend:

        async def call(name: str, **kwargs: Any) -> Any:
            return await backend.run(ops[name], **kwargs)

        return await body(call)


async def _run_psycopg_threads(url: str, body, pipeline: bool) -> Any:
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    ops = {
        "enqueue": _p_enqueue,
        "claim": _p_claim,
        "append": _p_append_pipeline if pipeline else _p_append,
        "finish": _p_finish,
    }
    limiter = trio.CapacityLimiter(POOL_SIZE)
    pool = ConnectionPool(
        _libpq_conninfo(url),
        min_size=POOL_SIZE,
        max_size=POOL_SIZE,
        kwargs={"autocommit": True, "row_factory": dict_row},
        open=False,
    )
    await trio.to_thread.run_sync(lambda: pool.open(wait=True))

    def run(op, kwargs):
        with pool.connection() as conn:
            return op(conn, **kwargs)

    async def call(name: str, **kwargs: Any) -> Any:
        return await trio.to_thread.run_sync(run, ops[name], kwargs, limiter=limiter)

    try:
        return await body(call)
    finally:
        await trio.to_thread.run_sync(pool.close)


async def _run_psycopg_aio_thread(url: str, body) -> Any:
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    from turnstile.runtime.store.postgres import open_asyncio_thread

    ops = {"enqueue": _pa_enqueue, "claim": _pa_claim, "append": _pa_append, "finish": _pa_finish}
    async with open_asyncio_thread() as aio:

        async def create():
            pool = AsyncConnectionPool(
                _libpq_conninfo(url),
                min_size=POOL_SIZE,
                max_size=POOL_SIZE,
                kwargs={"autocommit": True, "row_factory": dict_row},
                open=False,
            )
            await pool.open(wait=True)
            return pool

        pool = await aio.call(create)

        async def with_conn(op, kwargs):
            async with pool.connection() as conn:
                return await op(conn, **kwargs)

        async def call(name: str, **kwargs: Any) -> Any:
            return await aio.call(with_conn, ops[name], kwargs)

        try:
            return await body(call)
        finally:
            await aio.call(pool.close)


RUNNERS = {
    "trio-asyncio": _run_trio_asyncio,
    "thread": _run_thread,
    "store-tx": lambda url, body: _run_store(url, body, False),
    "store": lambda url, body: _run_store(url, body, True),
    "psycopg-threads": lambda url, body: _run_psycopg_threads(url, body, False),
    "psycopg-aio-thread": _run_psycopg_aio_thread,
    "psycopg-pipeline": lambda url, body: _run_psycopg_threads(url, body, True),
}


# -- the workload -----------------------------------------------------------------------------


def _work(seconds: float) -> None:
    """Pure-Python work on the trio thread (holds the GIL like a node's own code)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for i in range(50):
            x += i * i


async def _turns(call, sessions: list[str], turns: int, work: float) -> dict[str, Any]:
    latencies: list[float] = []
    now = datetime.now(UTC)

    async def session(sid: str) -> None:
        for _ in range(turns):
            t0 = time.perf_counter()
            await call("enqueue", session_id=sid, source="user", payload=PAYLOAD, now=now)
            item = await call("claim", session_id=sid, now=now, node=None, epoch=None)
            for _ in range(round(work / WORK_SLICE)):
                _work(WORK_SLICE)
                await trio.lowlevel.checkpoint()
            await call("append", session_id=sid, events=[("stream_start", START)], now=now)
            await call(
                "append",
                session_id=sid,
                events=[("stream_delta", DELTA), ("stream_end", END)],
                now=now,
            )
            await call("finish", input_id=item["id"], state="done", detail=None, now=now)
            latencies.append(time.perf_counter() - t0)

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for sid in sessions:
            nursery.start_soon(session, sid)
    seconds = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    latencies.sort()
    n = len(latencies)
    return {
        "turns": n,
        "seconds": seconds,
        "turns_per_s": n / seconds,
        "p50_ms": latencies[n // 2] * 1000,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000,
        "cpu_ms_per_turn": cpu / n * 1000,
    }


async def _child(candidate: str, url: str, n: int, turns: int, work: float) -> dict[str, Any]:
    sessions = [f"d{i:04d}" for i in range(n)]

    async def body(call):
        await _turns(call, sessions[:1], 3, 0.0)  # warm: connections, prepared statements
        return await _turns(call, sessions, turns, work)

    return await RUNNERS[candidate](url, body)


def _spawn(candidate: str, url: str, n: int, turns: int, work: float) -> dict[str, Any] | str:
    """One candidate in a fresh process; its figures, or why there are none."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scenarios.pgdriver",
            candidate,
            url,
            str(n),
            str(turns),
            str(work),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"failed: {last}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def _prepare(url: str, n: int) -> None:
    from turnstile.runtime.store import open_store

    async with open_store(url) as store:
        for i in range(n):
            await store.create_session(f"d{i:04d}", "bench")


def run(quick: bool = False) -> ScenarioResult:
    loads = [(1, 0.0), (100, 0.0), (100, 0.001)]
    turns = {1: 100 if quick else 400, 100: 5 if quick else 30}
    rounds = 1 if quick else 2
    measures: list[Measure] = []
    notes: list[str] = []
    load_before = os.getloadavg()[0]
    try:
        with temporary_schema() as url:
            trio.run(_prepare, url, max(n for n, _ in loads))
            best: dict[tuple, dict] = {}
            failed: dict[str, str] = {}
            order = list(CANDIDATES)
            for r in range(rounds):
                for n, work in loads:
                    for cand in order if r % 2 == 0 else order[::-1]:
                        if cand in failed:
                            continue
                        got = _spawn(cand, url, n, turns[n], work)
                        if isinstance(got, str):
                            failed[cand] = got
                            continue
                        key = (cand, n, work)
                        if key not in best or got["turns_per_s"] > best[key]["turns_per_s"]:
                            best[key] = got
    except PostgresUnavailable as exc:
        return ScenarioResult("pgdriver", [], [f"No figures: {exc}."])
    for n, work in loads:
        tag = f"N={n}" + (f", {work * 1000:g} ms trio work/turn" if work else ", queries alone")
        base = best.get((BASELINE, n, work))
        for cand, label in CANDIDATES.items():
            got = best.get((cand, n, work))
            if got is None:
                continue
            is_base = cand == BASELINE
            measures.append(
                Measure(
                    f"{label}: turns/s ({tag})",
                    got["turns_per_s"],
                    "turns/s",
                    None if is_base else CANDIDATES[BASELINE],
                    None if is_base or base is None else base["turns_per_s"],
                )
            )
            measures.append(
                Measure(
                    f"{label}: turn p99 ({tag})",
                    got["p99_ms"],
                    "ms",
                    None if is_base else CANDIDATES[BASELINE],
                    None if is_base or base is None else base["p99_ms"],
                )
            )
            measures.append(
                Measure(
                    f"{label}: process CPU per turn ({tag})",
                    got["cpu_ms_per_turn"],
                    "ms",
                    None if is_base else CANDIDATES[BASELINE],
                    None if is_base or base is None else base["cpu_ms_per_turn"],
                )
            )
    for cand, why in failed.items():
        notes.append(f"{CANDIDATES[cand]}: no figures ({why}).")
    notes.append(
        f"A turn = enqueue_input, claim_next_input, append_events x2 (1 and 2 events), "
        f"finish_input: {OPS_PER_TURN} operations, 8 statements plus append_events' BEGIN and "
        f"COMMIT. N sessions, one trio task each, closed loop; {turns[1]} turns at N=1, "
        f"{turns[100]} per session at N=100; pool of {POOL_SIZE} connections everywhere. Each "
        f"candidate in its own process, {rounds} run(s) in alternating order, the better kept. "
        f"PostgreSQL at {PG_DSN} (synchronous_commit as configured), same machine. 1-minute "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after (2 cores; "
        "PostgreSQL and the candidate share them)."
    )
    return ScenarioResult("pgdriver", measures, notes)


if __name__ == "__main__":
    cand, url, n, turns, work = sys.argv[1:6]
    result = trio.run(_child, cand, url, int(n), int(turns), float(work))
    print(json.dumps(result))
