"""Fixtures of the agent tests: no ambient OpenAI settings, and a strict stand-in server."""

from __future__ import annotations

import pytest

from tests.support.agents import ENV_VARS
from tests.support.fake_openai import OpenAIStandIn, start_standin


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def standin(nursery) -> OpenAIStandIn:
    """A stand-in on loopback that must refuse nothing: a test expecting a 400 empties
    ``rejected`` itself."""
    standin = await start_standin(nursery)
    yield standin
    assert standin.rejected == []
