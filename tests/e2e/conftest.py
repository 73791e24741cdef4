"""End-to-end fixtures. The real node on loopback and its WebSocket client are in
``tests.support.node``; nothing here sleeps to synchronise: tests wait for the frames they
expect."""

from __future__ import annotations

import pytest

from tests.support.agents import GatedAgent


@pytest.fixture
def gated() -> GatedAgent:
    return GatedAgent()
