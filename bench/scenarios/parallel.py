"""Scenario ``parallel``: ``run_parallel`` of 50 HTTP calls with 100 ms latency, vs sequential.

A trio-native loopback server (``bench.scenarios.loopback.LoopbackServer``, 127.0.0.1, port 0)
answers ``GET /item/<k>`` after ``trio.sleep(0.1)``; it also counts how many requests it holds
at once (``max_in_flight``). Every call goes through the real ``ToolRegistry`` and the http
module (netguard, 127.0.0.1 allow-listed):

* **sequential** — 50 ``http.get`` calls one after another (``registry.call`` each);
* **run_parallel** — one ``registry.call("run_parallel", actions=[50 x http.get])``
  (``register_execution_tools``, with a real ``BackgroundActor`` behind the background tools),
  once with the http module's default concurrency limit (16: 50 calls need at least
  ceil(50/16) = 4 waves of 100 ms) and once with ``max_concurrency=50``;
* **one call** — a single ``http.get``: the slowest action, the floor run_parallel aims at.

Each is repeated (sequential 3 times, run_parallel 5 times; quick: 1 and 3) and the median
reported; every run checks that all 50 calls answered 200.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

import trio

from bench.harness import Measure, ScenarioResult
from bench.scenarios.loopback import HOST, LoopbackServer
from turnstile.actors.execution.background import BackgroundActor
from turnstile.actors.execution.tools import register_execution_tools
from turnstile.runtime.clock import SystemClock
from turnstile.runtime.supervisor import open_supervisor
from turnstile.tools.modules.http import HttpConfig, register_http_module
from turnstile.tools.registry import ToolRegistry

LATENCY = 0.100
CALLS = 50
DEFAULT_LIMIT = HttpConfig().max_concurrency


def _check(results: list[Any]) -> None:
    bad = [r for r in results if not (r.ok and r.data.get("status_code") == 200)]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(results)} calls failed: {bad[0]}")


async def _measure(limit: int | None, base: str, repeat_seq: int, repeat_par: int, server):
    registry = ToolRegistry()
    config = (
        HttpConfig(allowed_hosts=(HOST,))
        if limit is None
        else HttpConfig(allowed_hosts=(HOST,), max_concurrency=limit)
    )
    register_http_module(registry, config)

    async def publish(session_id: str, message: Any) -> None:
        pass

    out: dict[str, Any] = {"limit": config.max_concurrency}
    async with open_supervisor() as sup:
        background = await sup.spawn(
            lambda: BackgroundActor(registry.call, publish, SystemClock()), name="background"
        )
        register_execution_tools(registry, background)
        urls = [f"{base}/item/{k}" for k in range(CALLS)]

        async def get(url: str):
            return await registry.call("s", "bench", "http.get", {"url": url})

        with trio.fail_after(30):
            await get(urls[0])  # warm up (imports, SSL context)
            singles = []
            for _ in range(5):
                t0 = time.perf_counter()
                _check([await get(urls[0])])
                singles.append(time.perf_counter() - t0)
        out["single"] = statistics.median(singles)

        seqs = []
        for _ in range(repeat_seq):
            with trio.fail_after(60):
                t0 = time.perf_counter()
                _check([await get(u) for u in urls])
                seqs.append(time.perf_counter() - t0)
        out["sequential"] = seqs

        pars = []
        actions = [{"name": "http.get", "params": {"url": u}} for u in urls]
        server.max_in_flight = 0
        c0 = time.process_time()
        for _ in range(repeat_par):
            with trio.fail_after(30):
                t0 = time.perf_counter()
                result = await registry.call("s", "bench", "run_parallel", {"actions": actions})
                pars.append(time.perf_counter() - t0)
            if not result.ok or result.data["succeeded"] != CALLS:
                raise RuntimeError(f"run_parallel failed: {result}")
            elapsed = [r["data"]["elapsed_ms"] for r in result.data["results"]]
            out["slowest_ms"] = max(elapsed)
        out["parallel_cpu"] = (time.process_time() - c0) / repeat_par
        out["parallel"] = pars
        out["max_in_flight"] = server.max_in_flight
    return out


async def _scenario(repeat_seq: int, repeat_par: int) -> dict[str, Any]:
    server = LoopbackServer(delay=LATENCY)
    async with trio.open_nursery() as nursery:
        base = await server.start(nursery)
        default = await _measure(None, base, repeat_seq, repeat_par, server)
        wide = await _measure(CALLS, base, 0, repeat_par, server)
        nursery.cancel_scope.cancel()
    return {"default": default, "wide": wide, "requests": server.requests}


def run(quick: bool = False) -> ScenarioResult:
    repeat_seq, repeat_par = (1, 3) if quick else (3, 5)
    load = os.getloadavg()
    r = trio.run(_scenario, repeat_seq, repeat_par)
    d, w = r["default"], r["wide"]
    seq = statistics.median(d["sequential"])
    par_d = statistics.median(d["parallel"])
    par_w = statistics.median(w["parallel"])
    single = statistics.median([d["single"], w["single"]])
    waves = math.ceil(CALLS / DEFAULT_LIMIT)
    floor_d = waves * LATENCY
    measures = [
        Measure(f"{CALLS} x http.get sequential", seq, "s", target=f"~ {CALLS} x {LATENCY:g} s"),
        Measure(
            "one http.get (the slowest action)",
            single,
            "s",
            target=f"~ {LATENCY:g} s",
        ),
        Measure(
            f"run_parallel {CALLS} x http.get, default limit {DEFAULT_LIMIT}",
            par_d,
            "s",
            "sequential",
            seq,
            f"<= {floor_d + 0.1:g} s ({waves} waves x {LATENCY:g} s + 0.1)",
            par_d <= floor_d + 0.1,
        ),
        Measure(
            f"run_parallel {CALLS} x http.get, max_concurrency={CALLS}",
            par_w,
            "s",
            "sequential",
            seq,
            "<= 0.2 s (~ the slowest action)",
            par_w <= 0.2,
        ),
        Measure(
            f"run_parallel {CALLS} x http.get, max_concurrency={CALLS}",
            par_w,
            "s",
            "one http.get",
            single,
            "<= 2x the slowest action",
            par_w <= 2 * single,
        ),
        Measure(
            f"speed-up vs sequential, limit {DEFAULT_LIMIT}",
            seq / par_d,
            "x",
            target=">= 10x",
            ok=seq / par_d >= 10,
        ),
        Measure(
            f"speed-up vs sequential, max_concurrency={CALLS}",
            seq / par_w,
            "x",
            target=">= 25x",
            ok=seq / par_w >= 25,
        ),
    ]
    per_call = (seq / CALLS - LATENCY) * 1e3
    notes = [
        f"Loopback server (trio-native, 127.0.0.1) answering after trio.sleep({LATENCY:g}); "
        f"every call through ToolRegistry -> http module -> netguard (127.0.0.1 allow-listed). "
        f"Medians of {repeat_seq} sequential and {repeat_par} run_parallel runs "
        f"(sequential: {', '.join(f'{x:.2f}' for x in d['sequential'])} s; run_parallel limit "
        f"{DEFAULT_LIMIT}: {', '.join(f'{x:.3f}' for x in d['parallel'])} s; limit {CALLS}: "
        f"{', '.join(f'{x:.3f}' for x in w['parallel'])} s).",
        f"Requests the server held at once: at most {d['max_in_flight']} with the default limit, "
        f"{w['max_in_flight']} with max_concurrency={CALLS}. With the default limit {CALLS} "
        f"calls take at least ceil({CALLS}/{DEFAULT_LIMIT}) = {waves} waves x {LATENCY * 1e3:g} "
        f"ms = {floor_d:g} s; run_parallel does not raise the module's limit (by design: every "
        "action goes through the registry exactly like a direct call).",
        f"Overhead per call: {per_call:.1f} ms beyond the {LATENCY * 1e3:g} ms of latency "
        f"(sequential); CPU per run_parallel of {CALLS}: {d['parallel_cpu'] * 1e3:.0f} ms "
        f"(limit {DEFAULT_LIMIT}), {w['parallel_cpu'] * 1e3:.0f} ms (limit {CALLS}); slowest "
        f"action's own elapsed_ms in the last run: {d['slowest_ms']} / {w['slowest_ms']} ms. "
        f"Load average before the run: {load[0]:.2f}.",
    ]
    return ScenarioResult("parallel", measures, notes)
