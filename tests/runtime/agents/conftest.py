"""Fixtures of the agent tests: no ambient OpenAI settings, and a strict stand-in server."""

from __future__ import annotations

import pytest

from tests.runtime.agents.fake_openai import OpenAIStandIn, start_standin

#: Environment variables the openai agent reads; cleared so a developer's own never leak in.
ENV_VARS = (
    "TURNSTILE_OPENAI_BASE_URL",
    "OPENAI_BASE_URL",
    "TURNSTILE_OPENAI_MODEL",
    "OPENAI_MODEL",
    "TURNSTILE_OPENAI_API_KEY",
    "OPENAI_API_KEY",
)


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
