"""What a gateway turn costs the node, against the same turn in process (issue 26).

``python -m bench.gwturns`` runs, alternating, ``--rounds`` times: ``bench sessions``' gateway
phase (a node with ``open_node`` on SQLite, N sessions, each a WebSocket client in the
``bench.wsdriver`` process sending M 3-word messages in a closed loop, ``ScriptedAgent`` at
0 ms) and its in-process phase (the same node without the server, driven through its
directory), each after a few warm-up turns per session and each in a trio run of its own. Per
round it prints turns/s, the CPU per turn of the node's process (``process_time``: the trio
thread and the store's threads), of its trio thread alone (``thread_time`` in the trio run) and,
for the gateway, of the client process; then the medians.

The trio thread's figure is the one that bounds a node on a quiet box: the in-process path then
runs at about one core, so gateway / in-process turns/s is at most about the ratio of the two
trio-thread figures. Longer phases and the warm-up make these steadier than ``bench sessions
--quick``'s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass

import trio

from bench.scenarios.sessions import (
    USER,
    _create_sessions,
    _directory,
    _in_process_phase,
    _InProcSubscriber,
    _node,
    _phase,
)
from bench.wsdriver import Tally, open_driver
from turnstile.actors.sessions.agents import ScriptedAgent
from turnstile.runtime.server import tune_gc


@dataclass
class _Round:
    turns_per_s: float
    process_ms: float  # node process CPU per turn
    thread_ms: float  # its trio thread's
    client_ms: float = float("nan")  # the driver's (gateway only)


def _round(tally: Tally, thread_seconds: float) -> _Round:
    return _Round(
        tally.turns_per_s,
        tally.cpu_ms_per_turn(),
        thread_seconds * 1000 / tally.turns,
        tally.cpu_ms_per_turn("client_cpu"),
    )


async def _gateway(n: int, m: int, warm: int) -> _Round:
    agent = ScriptedAgent()
    ids = [f"g{n}-{i:04d}" for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-") as tmp:
        async with _node(tmp, agent) as (url, _port), open_driver() as driver:
            await _create_sessions(url, ids)
            await driver.connect(url.replace("http://", "ws://") + "/ws", ids)
            await _phase(driver, ids, warm)
            thread = time.thread_time()
            tally, _ = await _phase(driver, ids, m)
            thread = time.thread_time() - thread
            await driver.close(ids)
    return _round(tally, thread)


async def _in_process(n: int, m: int, warm: int) -> _Round:
    agent = ScriptedAgent()
    ids = [f"p{n}-{i:04d}" for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-") as tmp:
        async with _directory(f"sqlite:///{tmp}/node.db", agent) as directory:
            subs = []
            for sid in ids:
                await directory.create_session(USER, session_id=sid)
                sub = _InProcSubscriber(sid, Tally())
                sub.next_seq = (await directory.attach(USER, sid, sub)).last_seq + 1
                subs.append(sub)
            await _in_process_phase(directory, subs, warm)
            thread = time.thread_time()
            tally = await _in_process_phase(directory, subs, m)
            thread = time.thread_time() - thread
    return _round(tally, thread)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gwturns", description=__doc__)
    parser.add_argument("--sessions", type=int, default=100, help="N (default 100)")
    parser.add_argument("--messages", type=int, default=20, help="M per session (default 20)")
    parser.add_argument("--warm", type=int, default=3, help="warm-up turns per session")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tune_gc()  # as `turnstile serve` and `bench sessions`
    gateway: list[_Round] = []
    inproc: list[_Round] = []
    for i in range(args.rounds):
        for name, run, out in (("gateway", _gateway, gateway), ("in-process", _in_process, inproc)):
            r = trio.run(run, args.sessions, args.messages, args.warm)
            out.append(r)
            client = "" if name == "in-process" else f", client process {r.client_ms:.3f} ms"
            print(
                f"round {i + 1} {name}: {r.turns_per_s:,.0f} turns/s; CPU per turn: node "
                f"process {r.process_ms:.3f} ms, its trio thread {r.thread_ms:.3f} ms{client}",
                flush=True,
            )

    def med(rounds: list[_Round], field: str) -> float:
        return statistics.median(getattr(r, field) for r in rounds)

    print(
        f"median: gateway {med(gateway, 'turns_per_s'):,.0f} / in-process "
        f"{med(inproc, 'turns_per_s'):,.0f} turns/s; node process CPU per turn "
        f"{med(gateway, 'process_ms'):.3f} / {med(inproc, 'process_ms'):.3f} ms; trio thread "
        f"{med(gateway, 'thread_ms'):.3f} / {med(inproc, 'thread_ms'):.3f} ms (bound: "
        f"{med(inproc, 'thread_ms') / med(gateway, 'thread_ms'):.2f}x); client process "
        f"{med(gateway, 'client_ms'):.3f} ms"
    )


if __name__ == "__main__":
    main()
