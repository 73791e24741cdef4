"""Benchmark scenarios by name: each module exposes ``run(quick: bool = False)``."""

SCENARIOS: dict[str, str] = {
    "mailbox": "bench.scenarios.mailbox",
    "timers": "bench.scenarios.timers",
    "idle": "bench.scenarios.idle",
    "sessions": "bench.scenarios.sessions",
    "scheduler": "bench.scenarios.scheduler",
    "watchers": "bench.scenarios.watchers",
    "parallel": "bench.scenarios.parallel",
    "schemas": "bench.scenarios.schemas",
    "memory": "bench.scenarios.memory",
    "pgdriver": "bench.scenarios.pgdriver",
    "cluster": "bench.scenarios.cluster",
    "history": "bench.scenarios.history",
    "scale": "bench.scenarios.scale",
    "cells": "bench.scenarios.cells",
}
