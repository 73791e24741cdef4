"""The bench harness records how fast the box was around each scenario (``bench/boxspeed.py``),
so that a figure from a slow moment of a virtual machine is not read as slower code."""

from __future__ import annotations

import json
import sys
import types

import pytest

from bench import harness
from bench.boxspeed import box_speed, describe


def test_box_speed_is_a_positive_time_per_step_and_refuses_nothing_to_time():
    ns = box_speed(repeats=1, steps=10_000)
    assert 0 < ns < 100_000
    assert describe(12.34) == "box speed: 12.3 ns per reference step (lower is faster)"
    with pytest.raises(ValueError, match="at least 1"):
        box_speed(repeats=0)
    with pytest.raises(ValueError, match="at least 1"):
        box_speed(steps=0)


def test_each_scenario_result_carries_the_box_speed_before_and_after(monkeypatch, tmp_path):
    module = types.ModuleType("fake_scenario")

    def run(quick: bool = False) -> harness.ScenarioResult:
        return harness.ScenarioResult("fake", [harness.Measure("x", 1.0, "op/s")])

    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_scenario", module)
    monkeypatch.setitem(harness.SCENARIOS, "fake", "fake_scenario")
    monkeypatch.setattr(harness, "box_speed", lambda: 42.0)
    result = harness.run_scenario("fake", quick=True)
    assert result.box_speed == (42.0, 42.0)
    assert "Box speed before and after: 42.0 and 42.0 ns" in harness.to_markdown(result)
    harness.write_results([result], tmp_path)
    written = json.loads((tmp_path / "latest.json").read_text())
    assert written["scenarios"][0]["box_speed_ns"] == [42.0, 42.0]
