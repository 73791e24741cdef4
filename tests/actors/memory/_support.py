"""Helpers of the memory feature's node tests: a node whose wall clock the test sets, with
Ada's sessions s1 and s2 and Bob's s1, reached through the gateway's ASGI app; and the openai
agent on the stand-in model server, in-process."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import httpx
import openai._base_client as openai_base_client
import trio

from tests.support.fake_openai import OpenAIStandIn
from turnstile.actors.config import Config, MemoryConfig
from turnstile.actors.node import default_features, open_node
from turnstile.actors.sessions.agents import OpenAIAgent, ScriptedAgent
from turnstile.actors.sessions.agents.base import TurnInput
from turnstile.runtime.clock import Clock

ADA, BOB = "ada-token-0123456789", "bob-token-0123456789"
T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def iso(when: datetime) -> str:
    """A time as the routes answer it (msgspec's JSON: ``Z`` for UTC)."""
    return when.isoformat().replace("+00:00", "Z")


class SetClock(Clock):
    """Wall time that moves only when the test moves it."""

    def __init__(self, start: datetime) -> None:
        self.at = start
        super().__init__(lambda: self.at)


@asynccontextmanager
async def node_with(store_url, *, model=None, **memory):
    """Ada's sessions s1 and s2 and Bob's s1, all created at ``T0``."""
    clock = SetClock(T0)
    config = Config(store=store_url, memory=MemoryConfig(**memory))
    agent = ScriptedAgent(token_delay=0)
    features = default_features(agent)
    (feature,) = [f for f in features if f.name == "memory"]
    feature.extraction_model = model
    async with open_node(
        config,
        tokens={ADA: "ada", BOB: "bob"},
        agent=agent,
        clock=clock,
        features=features,
        serve=False,
    ) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            for token, name in ((ADA, "s1"), (ADA, "s2"), (BOB, "s1")):
                created = await http.post("/sessions", json={"id": name}, headers=auth(token))
                assert created.status_code == 201
            yield node, http, clock, feature


def model_for(standin: OpenAIStandIn) -> OpenAIAgent:
    """The openai agent on the stand-in, in-process."""
    agent = OpenAIAgent(
        base_url="http://standin/v1", model="m", max_retries=0, transport=standin.transport()
    )
    agent._openai()._platform = openai_base_client.get_platform()
    return agent


class RecordingAgent:
    """Keeps each turn's input and history; ``turns(n)`` waits until ``n`` turns ran."""

    name = "recording"

    def __init__(self) -> None:
        self.inputs: list[TurnInput] = []
        self.histories: list[list] = []
        self._ran = trio.Event()

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn) -> str:
        self.inputs.append(turn.input)
        self.histories.append(list(turn.history))
        self._ran.set()
        return f"reply:{turn.input.content}"

    async def turns(self, n: int) -> list[TurnInput]:
        while len(self.inputs) < n:
            self._ran = trio.Event()
            await self._ran.wait()
        return self.inputs
