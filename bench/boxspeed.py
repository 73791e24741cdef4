"""How fast this box runs plain Python right now: a fixed reference loop, timed.

This project's CI and bench machines are virtual, and their speed moves by up to 2x between
runs minutes apart with nothing else running (measured 2026-11-28: the same 10-million-step
loop took 1.28-2.48 s of CPU within an hour, and the same suite's CI 298-598 s). A figure
without the box's speed beside it cannot tell a slower box from slower code, so the bench
records this before and after each scenario, and ``scripts/test.sh`` prints it before and
after the suite.

``python -m bench.boxspeed`` prints one reading.
"""

from __future__ import annotations

import time

__all__ = ["box_speed", "describe"]

#: steps of the reference loop per timing: about 0.1-0.15 s on this box
STEPS = 1_000_000


def _loop(steps: int) -> int:
    total = 0
    for i in range(steps):
        total += i ^ (i >> 3)
    return total


def box_speed(repeats: int = 3, steps: int = STEPS) -> float:
    """Nanoseconds of CPU per step of the reference loop, the best of ``repeats`` timings
    (the best, not the mean: a timing is only ever slowed by what else happens)."""
    if repeats < 1 or steps < 1:
        raise ValueError("repeats and steps must be at least 1")
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time_ns()
        _loop(steps)
        best = min(best, (time.process_time_ns() - start) / steps)
    return best


def describe(ns: float) -> str:
    """One reading as a line of a report."""
    return f"box speed: {ns:.1f} ns per reference step (lower is faster)"


if __name__ == "__main__":
    print(describe(box_speed()))
