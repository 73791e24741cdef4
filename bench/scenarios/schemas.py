"""Scenario ``schemas``: how many characters of tool schemas one model call carries.

A real node (``open_node``, SQLite in a temp dir, port 0) runs with an agent that
records what each turn hands it; a plain chat turn ("hi") is sent over HTTP to sessions that
differ only in their ``metadata.execution``:

* **before** — ``tool_mode = "direct"``: every tool's full schema, as every call carried them
  before tool selection existed (the baseline);
* **after** — the node's defaults: compact mode, the primitives plus ``tool_search`` whose
  description indexes every other tool;
* compact with the ``watchers`` and ``scheduler`` groups opted in, for scale.

Measured: the characters the turn's tools take in a chat-completions request's ``tools`` array
(``selection.schema_chars``: compact JSON, as agents send it) — what every model call of
that turn carries — and the tool count; the default system prompt's length for reference. Same
run, same registry, so the ratio compares like with like. Target: at most 6,000 characters for
a plain chat turn with every tool still reachable (the reachability is checked here too: every
tool is either carried or in the index).
"""

from __future__ import annotations

import tempfile
from typing import Any

import httpx
import trio

from bench.harness import Measure, ScenarioResult
from turnstile.actors.config import Config
from turnstile.actors.execution.selection import DISCOVERY, schema_chars
from turnstile.actors.node import open_node
from turnstile.actors.sessions.agents.base import TurnContext

TOKEN = "bench-schemas-token-0123456789"
TARGET_CHARS = 6000


class _Recorder:
    """Keeps the context of every turn and answers "ok"."""

    name = "recorder"

    def __init__(self) -> None:
        self.turns: dict[str, TurnContext] = {}
        self.arrived = trio.Condition()

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn: TurnContext) -> str:
        self.turns[turn.session_id] = turn
        async with self.arrived:
            self.arrived.notify_all()
        return "ok"


async def _measure() -> dict[str, TurnContext]:
    agent = _Recorder()
    sessions: dict[str, dict[str, Any]] = {
        "before": {"tool_mode": "direct"},
        "after": {},
        "groups": {"watchers": True, "scheduler": True},
    }
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(port=0, store=f"sqlite:///{tmp}/bench.db")
        async with open_node(config, tokens={TOKEN: "bench"}, agent=agent) as node:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=node.url, headers=headers) as http:
                for name, execution in sessions.items():
                    body = {"id": name, "metadata": {"execution": execution}}
                    (await http.post("/sessions", json=body)).raise_for_status()
                    sent = await http.post(f"/sessions/{name}/messages", json={"content": "hi"})
                    sent.raise_for_status()
                with trio.fail_after(30):
                    async with agent.arrived:
                        while len(agent.turns) < len(sessions):
                            await agent.arrived.wait()
                    for name in sessions:  # let each turn close before the node stops
                        await _closed(http, name)
    return {name: agent.turns[sid] for name, sid in _ids(agent.turns, sessions).items()}


async def _closed(http: httpx.AsyncClient, name: str) -> None:
    """Wait until session ``name``'s history holds its turn's answer (so stopping the node
    does not cut the closure short). Over HTTP there is no event to wait on, so this polls."""
    while '"assistant"' not in (await http.get(f"/sessions/{name}/history")).text:  # noqa: ASYNC110
        await trio.sleep(0.01)


def _ids(turns: dict[str, TurnContext], names: dict[str, Any]) -> dict[str, str]:
    """Session names to the internal ids the turns carry (``<user>/<name>``)."""
    return {name: next(sid for sid in turns if sid.endswith("/" + name)) for name in names}


def run(quick: bool = False) -> ScenarioResult:
    """Measure schema characters per model call, before and after tool selection."""
    turns = trio.run(_measure)
    before, after, groups = turns["before"], turns["after"], turns["groups"]
    every = {s.name for s in before.tools} | set(DISCOVERY)
    (search,) = [s for s in after.tools if s.name == "tool_search"]
    reachable = all(
        name in {s.name for s in after.tools} or name in search.description for name in every
    )
    chars = {name: schema_chars(turn.tools) for name, turn in turns.items()}
    result = ScenarioResult(scenario="schemas")
    result.measures.append(
        Measure(
            name="plain chat turn, default (compact)",
            value=chars["after"],
            unit="chars/call",
            baseline="every tool (direct)",
            baseline_value=chars["before"],
            target=f"<= {TARGET_CHARS:,} chars, every tool reachable",
            ok=chars["after"] <= TARGET_CHARS and reachable,
        )
    )
    result.measures.append(
        Measure(
            name="compact + watchers + scheduler",
            value=chars["groups"],
            unit="chars/call",
            baseline="every tool (direct)",
            baseline_value=chars["before"],
        )
    )
    result.measures.append(
        Measure(
            name="tools carried, default",
            value=len(after.tools),
            unit="tools",
            baseline="every tool (direct)",
            baseline_value=len(before.tools),
        )
    )
    result.measures.append(
        Measure(
            name="default system prompt",
            value=len(after.input.system_prompt or ""),
            unit="chars",
        )
    )
    result.notes.append(
        f"{len(every)} tools registered; the default turn carries {len(after.tools)} "
        f"({', '.join(s.name for s in after.tools)}) and indexes the other "
        f"{len(every) - len(after.tools)} in tool_search; every tool reachable: {reachable}. "
        f"With groups: {len(groups.tools)} tools. Characters as compact JSON of the "
        "chat-completions `tools` array; about 4 characters a token."
    )
    return result
