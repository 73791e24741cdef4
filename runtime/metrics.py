"""Counters, gauges and latency summaries, rendered as Prometheus samples.

Deliberately tiny: the node has a handful of series and no label cardinality to manage, so a
dict beats a client library. Names follow Prometheus conventions (``_total`` for counters,
``_seconds`` summaries as ``_sum`` and ``_count``).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Metrics"]


class Metrics:
    """A registry of named samples."""

    def __init__(self) -> None:
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, Callable[[], float]] = {}

    def inc(self, name: str, amount: float = 1.0) -> None:
        """Add to a counter (created at 0)."""
        self._counters[name] = self._counters.get(name, 0.0) + amount

    def observe(self, name: str, seconds: float) -> None:
        """Record one latency into the ``name_sum`` / ``name_count`` summary."""
        self.inc(f"{name}_sum", seconds)
        self.inc(f"{name}_count")

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """Report ``read()`` under ``name`` at every scrape."""
        self._gauges[name] = read

    def value(self, name: str) -> float:
        """A counter's current value (0 if never incremented)."""
        return self._counters.get(name, 0.0)

    def snapshot(self) -> dict[str, float]:
        """Every sample by name."""
        out = dict(self._counters)
        for name, read in self._gauges.items():
            out[name] = float(read())
        return out
