"""Scenario ``mailbox``: how fast messages move through actors, against raw trio and pykka.

Shapes, each measured for Turnstile and its baselines in the same run:

* tell 1→1 — one producer awaits ``tell`` for every message; baseline: a raw trio memory
  channel with ``await send`` / ``async for``, and pykka's ``tell``.
* tell 1→1,000 — one producer feeds 1,000 actors round-robin; baseline: 1,000 raw channels.
* pile-up drain — messages queued with ``tell_nowait`` faster than they are handled; the actor
  drains them without a scheduling round trip per message. Baseline: the ``send_nowait`` /
  ``receive_nowait`` batch ceiling of a raw channel.
* ask round trip p50/p99 — baseline: a request carrying its own one-slot reply channel, and
  pykka's ``ask``.
"""

from __future__ import annotations

import statistics
import time

import trio

from bench.harness import Measure, ScenarioResult
from turnstile.runtime.actor import Actor
from turnstile.runtime.supervisor import open_supervisor


class _Sink(Actor):
    __slots__ = ("count", "done", "target")

    def __init__(self, target: int = 0, done: trio.Event | None = None) -> None:
        self.count = 0
        self.target = target
        self.done = done

    async def receive(self, message):
        self.count += 1
        if self.count == self.target:
            self.done.set()
        return message


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def _pct(samples: list[float], q: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(q * len(samples)))]


async def _turnstile_tell_1to1(n: int) -> float:
    done = trio.Event()
    async with open_supervisor() as sup:
        ref = await sup.spawn(lambda: _Sink(n, done), name="sink", mailbox_size=1000)
        start = time.perf_counter()
        for i in range(n):
            await ref.tell(i)
        await done.wait()
        return _rate(n, time.perf_counter() - start)


async def _raw_tell_1to1(n: int) -> float:
    send, receive = trio.open_memory_channel(1000)
    done = trio.Event()

    async def consumer() -> None:
        count = 0
        async for _ in receive:
            count += 1
            if count == n:
                done.set()
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        start = time.perf_counter()
        for i in range(n):
            await send.send(i)
        await done.wait()
        return _rate(n, time.perf_counter() - start)


async def _turnstile_tell_fanout(n: int, actors: int) -> float:
    per = n // actors
    dones = [trio.Event() for _ in range(actors)]
    async with open_supervisor() as sup:
        refs = [
            await sup.spawn(lambda d=d: _Sink(per, d), name=f"s{i}", mailbox_size=1000)
            for i, d in enumerate(dones)
        ]
        start = time.perf_counter()
        for _ in range(per):
            for ref in refs:
                await ref.tell(0)
        for d in dones:
            await d.wait()
        return _rate(per * actors, time.perf_counter() - start)


async def _raw_tell_fanout(n: int, actors: int) -> float:
    per = n // actors
    dones = [trio.Event() for _ in range(actors)]

    async def consumer(receive, done) -> None:
        count = 0
        async for _ in receive:
            count += 1
            if count == per:
                done.set()
                return

    async with trio.open_nursery() as nursery:
        sends = []
        for d in dones:
            send, receive = trio.open_memory_channel(1000)
            sends.append(send)
            nursery.start_soon(consumer, receive, d)
        start = time.perf_counter()
        for _ in range(per):
            for send in sends:
                await send.send(0)
        for d in dones:
            await d.wait()
        return _rate(per * actors, time.perf_counter() - start)


async def _turnstile_pileup(n: int, batch: int) -> float:
    done = trio.Event()
    async with open_supervisor() as sup:
        ref = await sup.spawn(lambda: _Sink(n, done), name="sink", mailbox_size=batch)
        tell_nowait = ref.tell_nowait
        start = time.perf_counter()
        for _ in range(n // batch):
            for i in range(batch):
                tell_nowait(i)
            # Yield until drained: an Event here would add the wake-up we are measuring without.
            while ref.mailbox_depth:  # noqa: ASYNC110
                await trio.lowlevel.checkpoint()
        await done.wait()
        return _rate(n, time.perf_counter() - start)


async def _raw_nowait_ceiling(n: int, batch: int) -> float:
    send, receive = trio.open_memory_channel(batch)
    start = time.perf_counter()
    for _ in range(n // batch):
        for i in range(batch):
            send.send_nowait(i)
        for _ in range(batch):
            receive.receive_nowait()
    return _rate(n, time.perf_counter() - start)


async def _turnstile_ask(n: int) -> list[float]:
    async with open_supervisor() as sup:
        ref = await sup.spawn(_Sink, name="echo")
        samples = []
        for i in range(n):
            t0 = time.perf_counter()
            await ref.ask(i)
            samples.append(time.perf_counter() - t0)
        return samples


async def _raw_ask(n: int) -> list[float]:
    requests_send, requests_receive = trio.open_memory_channel(1000)

    async def server() -> None:
        async for message, reply in requests_receive:
            await reply.send(message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        samples = []
        for i in range(n):
            t0 = time.perf_counter()
            reply_send, reply_receive = trio.open_memory_channel(1)
            await requests_send.send((i, reply_send))
            await reply_receive.receive()
            samples.append(time.perf_counter() - t0)
        nursery.cancel_scope.cancel()
        return samples


def _pykka(n_tell: int, n_ask: int) -> tuple[float, list[float]]:
    import pykka

    class Sink(pykka.ThreadingActor):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def on_receive(self, message):
            self.count += 1
            return message

    ref = Sink.start()
    try:
        start = time.perf_counter()
        for i in range(n_tell):
            ref.tell(i)
        ref.ask("sync")  # all tells handled once this answers (FIFO)
        tell_rate = _rate(n_tell + 1, time.perf_counter() - start)
        samples = []
        for i in range(n_ask):
            t0 = time.perf_counter()
            ref.ask(i)
            samples.append(time.perf_counter() - t0)
    finally:
        ref.stop()
    return tell_rate, samples


def _best(fn, *args, repeat: int = 3):
    return max(trio.run(fn, *args) for _ in range(repeat))


def run(quick: bool = False) -> ScenarioResult:
    n = 50_000 if quick else 300_000
    n_ask = 5_000 if quick else 30_000
    batch = 1000
    repeat = 1 if quick else 3

    t_tell = _best(_turnstile_tell_1to1, n, repeat=repeat)
    r_tell = _best(_raw_tell_1to1, n, repeat=repeat)
    t_fan = _best(_turnstile_tell_fanout, n, 1000, repeat=repeat)
    r_fan = _best(_raw_tell_fanout, n, 1000, repeat=repeat)
    t_pile = _best(_turnstile_pileup, n * 4, batch, repeat=repeat)
    r_pile = _best(_raw_nowait_ceiling, n * 4, batch, repeat=repeat)
    t_ask = trio.run(_turnstile_ask, n_ask)
    r_ask = trio.run(_raw_ask, n_ask)
    p_tell, p_ask = _pykka(n // 3, n_ask // 3)

    us = 1e6
    t50, t99 = _pct(t_ask, 0.5) * us, _pct(t_ask, 0.99) * us
    r50, r99 = _pct(r_ask, 0.5) * us, _pct(r_ask, 0.99) * us
    k50, k99 = _pct(p_ask, 0.5) * us, _pct(p_ask, 0.99) * us
    measures = [
        Measure(
            "tell 1->1",
            t_tell,
            "msg/s",
            "raw trio channel",
            r_tell,
            ">= 50% of raw",
            t_tell >= 0.5 * r_tell,
        ),
        Measure("tell 1->1", t_tell, "msg/s", "pykka tell", p_tell),
        Measure(
            "tell 1->1,000 round-robin",
            t_fan,
            "msg/s",
            "1,000 raw channels",
            r_fan,
            ">= 50% of raw",
            t_fan >= 0.5 * r_fan,
        ),
        Measure(
            "pile-up drain (tell_nowait)",
            t_pile,
            "msg/s",
            "raw _nowait ceiling",
            r_pile,
            ">= 20% of ceiling",
            t_pile >= 0.2 * r_pile,
        ),
        Measure(
            "pile-up drain (tell_nowait)",
            t_pile,
            "msg/s",
            "pykka tell",
            p_tell,
            "> pykka",
            t_pile > p_tell,
        ),
        Measure("ask p50", t50, "µs", "raw reply channel", r50, "<= 1.5x raw", t50 <= 1.5 * r50),
        Measure("ask p99", t99, "µs", "raw reply channel", r99, "<= 2x raw", t99 <= 2 * r99),
        Measure("ask p50", t50, "µs", "pykka ask", k50, "< pykka", t50 < k50),
        Measure("ask p99", t99, "µs", "pykka ask", k99, "< pykka", t99 < k99),
    ]
    notes = [
        f"{n:,} tells per run (best of {repeat}); {n_ask:,} asks; mailbox capacity 1,000; "
        f"median ask {statistics.median(t_ask) * us:.1f} µs.",
    ]
    return ScenarioResult("mailbox", measures, notes)
