"""Every tool call of a turn carries an idempotency key: its input's and its position's.

What a receiver relies on: the same call of the same input's turn has the same key however
often the turn runs (the key is made from the stored inbox row, which a re-run reads again), and
every other call has another.
"""

from __future__ import annotations

import re

import msgspec

from tests.support.mock_node import node
from turnstile.actors.sessions.actor import Submit
from turnstile.actors.sessions.turn import tool_call_key
from turnstile.tools.registry import ToolRegistry


class Probe(msgspec.Struct, forbid_unknown_fields=True):
    tag: str


class TwoCalls:
    """Calls ``probe.key`` twice per turn, tagging each call with its turn's content."""

    name = "two-calls"

    async def aclose(self) -> None:
        pass

    async def run_turn(self, turn) -> str:
        for n in (1, 2):
            await turn.call_tool("probe.key", {"tag": f"{turn.input.content}#{n}"})
        return "done"


async def test_each_call_has_its_inputs_and_positions_key_and_a_reread_row_gives_it_again(
    autojump_clock,
):
    tools = ToolRegistry()
    seen: dict[str, str | None] = {}

    async def probe(call, params: Probe):
        seen[params.tag] = call.idempotency_key
        return {}

    tools.register("probe.key", Probe, probe, "Record the call's key.")
    async with node(tools=tools, agent=TwoCalls(), start_scheduler=False) as n:
        session = n.registry.ref("session:s")
        for content in ("first", "second"):
            await session.ask(Submit(content=content))
        await n.seen.until(b'"stream_end"', 2)
        first, second = await n.store.list_inputs("s")  # as a re-run after a crash reads them
    assert seen == {
        "first#1": tool_call_key(first, 1),
        "first#2": tool_call_key(first, 2),
        "second#1": tool_call_key(second, 1),
        "second#2": tool_call_key(second, 2),
    }
    assert len(set(seen.values())) == 4
    # A hash: nothing in the key says whose session or which input it was.
    assert all(re.fullmatch(r"turnstile-[0-9a-f]{32}", key) for key in seen.values())
