"""Scenario ``idle``: what idle virtual actors cost in memory, live and passivated.

N virtual actors (10k and 100k) are activated by one message each, then left idle until the
registry passivates them (on a MockClock, so the idle timeout passes instantly). Memory is
traced with ``tracemalloc`` around each phase. The baseline, traced the same way, is what any
trio program pays for an idle "actor": a bare task parked on its own memory channel.

Targets: a passivated actor costs under 1 KB (nothing is left but, at most, a registry entry);
a live idle actor costs within 1.5x of the bare task and channel; both flat from 10k to 100k.
"""

from __future__ import annotations

import gc
import tracemalloc

import trio
import trio.testing

from bench.harness import Measure, ScenarioResult
from turnstile.runtime.actor import Actor
from turnstile.runtime.registry import Registry
from turnstile.runtime.supervisor import open_supervisor


class _Idle(Actor):
    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    async def receive(self, message):
        return None


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def _turnstile(n: int) -> tuple[float, float]:
    async with open_supervisor("actors", escalate=False) as sup:
        registry = Registry(sup, idle_timeout=60.0)
        registry.register("idle", _Idle)
        refs = [registry.ref(f"idle:{i}") for i in range(n)]
        await trio.testing.wait_all_tasks_blocked()
        before = _traced()
        for ref in refs:
            ref.tell_nowait(None)
        await trio.testing.wait_all_tasks_blocked()
        live = _traced()
        assert registry.statistics().active == n
        await trio.sleep(61)  # every actor passes its idle timeout
        await trio.testing.wait_all_tasks_blocked()
        assert registry.statistics().active == 0
        after = _traced()
        return (live - before) / n, max(0, after - before) / n


async def _bare(n: int) -> float:
    async def parked(receive) -> None:
        async for _ in receive:
            pass

    async with trio.open_nursery() as nursery:
        await trio.testing.wait_all_tasks_blocked()
        before = _traced()
        keep = []
        for _ in range(n):
            send, receive = trio.open_memory_channel(1000)
            keep.append(send)
            nursery.start_soon(parked, receive)
        await trio.testing.wait_all_tasks_blocked()
        live = _traced()
        nursery.cancel_scope.cancel()
        return (live - before) / n


def _run(fn, n):
    return trio.run(fn, n, clock=trio.testing.MockClock(autojump_threshold=0))


def run(quick: bool = False) -> ScenarioResult:
    sizes = [10_000] if quick else [10_000, 100_000]
    measures = []
    live_by_n = {}
    passive_by_n = {}
    tracemalloc.start()
    try:
        for n in sizes:
            live, passive = _run(_turnstile, n)
            bare = _run(_bare, n)
            live_by_n[n], passive_by_n[n] = live, passive
            label = f"{n:,}"
            measures.append(
                Measure(
                    f"live idle actor @{label}",
                    live,
                    "bytes",
                    "bare task + channel",
                    bare,
                    "<= 1.5x bare",
                    live <= 1.5 * bare,
                )
            )
            measures.append(
                Measure(
                    f"passivated actor @{label}",
                    passive,
                    "bytes",
                    target="< 1 KB",
                    ok=passive < 1024,
                )
            )
    finally:
        tracemalloc.stop()
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        growth = live_by_n[large] / live_by_n[small]
        measures.append(
            Measure(
                f"live cost growth {small:,} -> {large:,}",
                growth,
                "x",
                target="<= 1.2x (flat)",
                ok=growth <= 1.2,
            )
        )
    notes = [
        "Memory traced with tracemalloc (Python allocations: task frames, objects, buffers); "
        "the idle timeout passes on trio's MockClock."
    ]
    return ScenarioResult("idle", measures, notes)
