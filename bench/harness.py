"""The benchmark harness: run scenarios, print a table, write JSON and Markdown results.

A scenario is a module in ``bench/scenarios/`` with ``run(quick: bool = False) ->
ScenarioResult``. It measures Turnstile *and* its baselines in the same process run, so every
figure comes with a ratio taken on the same machine at the same moment.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.boxspeed import box_speed
from bench.scenarios import SCENARIOS

RESULTS_DIR = Path(__file__).parent / "results"


@dataclass
class Measure:
    """One measured figure, optionally against a baseline and a target.

    Attributes:
        name: what was measured, e.g. ``"tell 1->1"``.
        value: Turnstile's figure.
        unit: e.g. ``"msg/s"``, ``"µs"``, ``"bytes"``.
        baseline: the baseline's name (``"raw trio channel"``), if any.
        baseline_value: the baseline's figure in the same unit.
        target: the target in words, e.g. ``">= 50% of raw"``.
        ok: whether the target was met (None when there is no target).
    """

    name: str
    value: float
    unit: str
    baseline: str | None = None
    baseline_value: float | None = None
    target: str | None = None
    ok: bool | None = None

    @property
    def ratio(self) -> float | None:
        """Turnstile's value divided by the baseline's."""
        if not self.baseline_value:
            return None
        return self.value / self.baseline_value


@dataclass
class ScenarioResult:
    """Everything one scenario measured, and how fast the box was meanwhile."""

    scenario: str
    measures: list[Measure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: ``bench/boxspeed.py``'s reading before and after the scenario (ns per reference step)
    box_speed: tuple[float, float] | None = None


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def to_markdown(result: ScenarioResult) -> str:
    """The scenario's table, as Markdown."""
    lines = [
        f"### {result.scenario}",
        "",
        "| measure | turnstile | unit | baseline | baseline value | ratio | target | met |",
        "|---|---:|---|---|---:|---:|---|---|",
    ]
    for m in result.measures:
        met = "" if m.ok is None else ("yes" if m.ok else "**no**")
        lines.append(
            f"| {m.name} | {_fmt(m.value)} | {m.unit} | {m.baseline or ''} | "
            f"{_fmt(m.baseline_value)} | {_fmt(m.ratio)} | {m.target or ''} | {met} |"
        )
    for note in result.notes:
        lines.append(f"\n{note}")
    return "\n".join(lines) + "\n"


def run_scenario(name: str, quick: bool = False) -> ScenarioResult:
    """Import and run one scenario by name."""
    if name not in SCENARIOS:
        raise SystemExit(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    module = importlib.import_module(SCENARIOS[name])
    gc.collect()
    before = box_speed()
    start = time.perf_counter()
    result = module.run(quick=quick)
    result.seconds = time.perf_counter() - start
    after = box_speed()
    result.box_speed = (before, after)
    result.notes.append(
        f"Box speed before and after: {before:.1f} and {after:.1f} ns per reference step"
        " (`bench/boxspeed.py`; lower is faster): figures of two runs compare only at about"
        " the same speed."
    )
    return result


def write_results(results: list[ScenarioResult], out_dir: Path = RESULTS_DIR) -> Path:
    """Write ``<stamp>.json`` and ``<stamp>.md`` (and ``latest.*``) to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    payload = {
        "when": stamp,
        "machine": machine(),
        "scenarios": [
            {
                "scenario": r.scenario,
                "seconds": r.seconds,
                "box_speed_ns": r.box_speed,
                "notes": r.notes,
                "measures": [asdict(m) | {"ratio": m.ratio} for m in r.measures],
            }
            for r in results
        ],
    }
    m = machine()
    md = [f"Measured {stamp} on {m['cores']} cores, Python {m['python']} ({m['platform']}).\n"]
    md += [to_markdown(r) for r in results]
    for name in (stamp, "latest"):
        (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=2, ensure_ascii=False))
        (out_dir / f"{name}.md").write_text("\n".join(md))
    return out_dir / f"{stamp}.md"


def main(argv: list[str] | None = None) -> int:
    """``turnstile bench [SCENARIO ...] [--quick]``: run scenarios (all by default)."""
    import argparse

    parser = argparse.ArgumentParser(prog="turnstile bench", description=main.__doc__)
    parser.add_argument("scenarios", nargs="*", help=f"any of: {', '.join(SCENARIOS)}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    args = parser.parse_args(argv)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)  # a baseline, not our output
    names = args.scenarios or list(SCENARIOS)
    results = []
    for name in names:
        print(f"running {name}…", file=sys.stderr, flush=True)
        result = run_scenario(name, quick=args.quick)
        print(to_markdown(result), flush=True)
        results.append(result)
    path = write_results(results, args.out)
    print(f"results written to {path}", file=sys.stderr)
    return 0 if all(m.ok is not False for r in results for m in r.measures) else 1
