"""The scripted agent: deterministic, no model server; what the tests and benchmarks run
(``agent = "scripted"``). ``turnstile serve``'s default, the demo agent (``actors/demo``), is
built on it and answers the commands below as it does.

* Plain text: streams a short echo reply word by word ("You said: …").
* ``/call <tool> <json>``: calls the tool with the JSON object as arguments and reports the
  result (or the error).
* ``/think <text>``: streams ``text`` as thinking, then replies.
* ``/fail <text>``: raises ``AgentError(text)`` (for trying out failure closure).
* ``/sleep <seconds>``: waits, then replies (for trying out stop and interrupt).
* ``/context``: replies with the system messages the node's features added to the turn
  (``TurnInput.system_messages``, such as what memory remembers about the user), or says there
  are none. Other turns ignore them, as they ignore the system prompt.
* Injected inputs that arrive mid-turn are acknowledged in the reply.

``token_delay`` (seconds per streamed word) simulates model latency for benchmarks.
"""

from __future__ import annotations

import json
from typing import Literal

import trio

from turnstile.actors.sessions.agents.base import AgentError, TurnContext

__all__ = ["ScriptedAgent"]

MAX_SLEEP_SECONDS = 3600.0


class ScriptedAgent:
    """A deterministic agent for demos, tests and benchmarks.

    Args:
        token_delay: seconds to wait before each streamed word (0 streams at once).
    """

    name = "scripted"

    def __init__(self, token_delay: float = 0.0) -> None:
        if token_delay < 0:
            raise ValueError("token_delay must be >= 0")
        self.token_delay = token_delay

    async def aclose(self) -> None:
        """Nothing to release."""

    async def _stream(
        self,
        turn: TurnContext,
        text: str,
        kind: Literal["stream_delta", "thinking_delta"] = "stream_delta",
    ) -> None:
        words = text.split(" ")
        for i, word in enumerate(words):
            if self.token_delay:
                await trio.sleep(self.token_delay)
            await turn.emit(kind, word if i == len(words) - 1 else word + " ")

    async def run_turn(self, turn: TurnContext) -> str:
        """Answer the turn's input as the module docstring describes."""
        text = turn.input.content.strip()
        if text.startswith("/call"):
            reply = await self._call(turn, text)
        elif text.startswith("/think "):
            await self._stream(turn, text.removeprefix("/think ").strip(), "thinking_delta")
            reply = "Done thinking."
        elif text.startswith("/fail"):
            raise AgentError(text.removeprefix("/fail").strip() or "scripted failure")
        elif text.startswith("/sleep"):
            seconds = _number(text.removeprefix("/sleep").strip())
            await trio.sleep(min(seconds, MAX_SLEEP_SECONDS))
            reply = f"Slept {seconds:g}s."
        elif text == "/context":
            extra = turn.input.system_messages
            reply = "\n\n".join(extra) if extra else "No system messages for this turn."
        elif not text:
            return ""
        else:
            reply = f"You said: {text}"
        injected = turn.take_injections()
        if injected:
            reply += (
                f" (also noted {len(injected)} more: "
                + "; ".join(entry.content for entry in injected)
                + ")"
            )
        await self._stream(turn, reply)
        return reply

    async def _call(self, turn: TurnContext, text: str) -> str:
        parts = text.split(maxsplit=2)
        if len(parts) < 2:
            return "Usage: /call <tool> <json arguments>"
        tool = parts[1]
        try:
            arguments = json.loads(parts[2]) if len(parts) == 3 else {}
        except json.JSONDecodeError as exc:
            return f"Bad arguments for {tool}: {exc.msg} at position {exc.pos}."
        if not isinstance(arguments, dict):
            return f"Bad arguments for {tool}: expected a JSON object."
        result = await turn.call_tool(tool, arguments)
        if result.ok:
            return f"{tool} returned {json.dumps(result.data, sort_keys=True, default=str)}"
        return f"{tool} failed: {result.error.get('message') if result.error else 'unknown'}"


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise AgentError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise AgentError(f"not a number of seconds: {text!r}")
    return value
