"""An agent backed by any OpenAI-compatible chat-completions server.

OpenAI itself and the local servers that speak its protocol (Ollama, vLLM, llama.cpp server)
all accept ``POST {base_url}/chat/completions`` with ``stream: true`` and answer with
server-sent events. A turn is a loop: send the conversation, stream the answer (``content``
as ``stream_delta``, ``reasoning_content``/``reasoning`` as ``thinking_delta``), and when the
model asks for tools, run them through the turn, append the results and ask again — at most
``max_tool_rounds`` times.

Failures become ``AgentError`` with one short line (the runtime shows it on the stream); the API
key is never part of a message or a repr.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.agents.base import AgentError, HistoryEntry, ToolSpec, TurnContext

__all__ = ["OpenAIAgent"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
CONFIG_KEYS = {"base_url", "model", "api_key", "system_prompt", "max_tool_rounds", "timeout"}
MALFORMED = "model server sent malformed data"


@dataclass
class _ToolCall:
    """One tool call as it accumulates over stream chunks."""

    id: str | None = None
    name: str = ""
    arguments: str = ""


class OpenAIAgent:
    """Runs turns against an OpenAI-compatible chat-completions endpoint, streaming.

    Args:
        base_url: the API root (``…/v1``); else ``TURNSTILE_OPENAI_BASE_URL``, then
            ``OPENAI_BASE_URL``, then OpenAI's.
        model: the model name; else ``TURNSTILE_OPENAI_MODEL``, then ``OPENAI_MODEL``, then
            ``gpt-4o-mini``.
        api_key: sent as a bearer token; else ``TURNSTILE_OPENAI_API_KEY``, then
            ``OPENAI_API_KEY``; local servers need none.
        system_prompt: prepended to every conversation when given.
        max_tool_rounds: how many rounds of tool calls one turn may make.
        timeout: seconds for connecting and for each read of the stream.
        transport: an httpx transport (for tests or custom networking).
    """

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        system_prompt: str | None = None,
        max_tool_rounds: int = 8,
        timeout: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if max_tool_rounds < 0:
            raise ValueError("max_tool_rounds must be >= 0")
        if not timeout > 0:
            raise ValueError("timeout must be > 0")
        base_url = base_url or _env("TURNSTILE_OPENAI_BASE_URL", "OPENAI_BASE_URL")
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.model = model or _env("TURNSTILE_OPENAI_MODEL", "OPENAI_MODEL") or DEFAULT_MODEL
        self._api_key = api_key or _env("TURNSTILE_OPENAI_API_KEY", "OPENAI_API_KEY")
        self.system_prompt = system_prompt
        self.max_tool_rounds = max_tool_rounds
        self.timeout = timeout
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> OpenAIAgent:
        """Build from a config-file table; unknown keys are an error (they are usually typos)."""
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise ValueError(f"unknown openai agent settings: {', '.join(unknown)}")
        return cls(**dict(config))

    def __repr__(self) -> str:
        return f"OpenAIAgent(base_url={self.base_url!r}, model={self.model!r})"

    async def aclose(self) -> None:
        """Close the HTTP client (a later turn opens a new one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(self.timeout), transport=self._transport
            )
        return self._client

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    async def run_turn(self, turn: TurnContext) -> str:
        """Talk to the model until it answers without tool calls; return that answer."""
        messages: list[dict[str, Any]] = []
        # A turn may add a segment to the system prompt (heartbeats do); it is appended.
        system = "\n\n".join(p for p in (self.system_prompt, turn.input.system_segment) if p)
        if system:
            messages.append({"role": "system", "content": system})
        for entry in turn.history:
            messages.extend(_history_messages(entry))
        messages.append(_user_message(turn.input.source, turn.input.content))
        tools = [_tool_json(spec) for spec in turn.tools]
        rounds = 0
        while True:
            # Inputs that arrived since the last call (mid-turn messages, background results).
            messages.extend(_user_message(e.source, e.content) for e in turn.take_injections())
            text, calls = await self._complete(turn, messages, tools)
            if not calls:
                return text
            if rounds >= self.max_tool_rounds:
                raise AgentError(f"tool call limit reached ({self.max_tool_rounds} rounds)")
            rounds += 1
            for call in calls:
                call.id = call.id or _new_call_id()
            messages.append(_assistant_tool_calls(text, calls))
            for call in calls:
                content = await _run_tool(turn, call)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})

    async def _complete(
        self, turn: TurnContext, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[str, list[_ToolCall]]:
        """One streamed model call: emit deltas, return the text and the tool calls."""
        body: dict[str, Any] = {
            "model": turn.input.model or self.model,
            "messages": messages,
            "stream": True,
        }
        if turn.input.max_tokens:
            body["max_tokens"] = turn.input.max_tokens
        if tools:
            body["tools"] = tools
        text: list[str] = []
        calls: dict[int, _ToolCall] = {}
        url = f"{self.base_url}/chat/completions"
        try:
            async with self._http().stream("POST", url, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise AgentError(self._redact(_status_message(response)))
                if response.headers.get("content-type", "").startswith("application/json"):
                    # A server that ignored ``stream``: one complete message, same handling.
                    await response.aread()
                    await _absorb(turn, _decode(response.content), "message", text, calls)
                else:
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue  # blank separators, ``event:`` and ``:`` comment lines
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        await _absorb(turn, _decode(data), "delta", text, calls)
        except httpx.HTTPError as exc:
            reason = "timed out" if isinstance(exc, httpx.TimeoutException) else str(exc)
            reason = " ".join((reason or type(exc).__name__).split())[:200]
            raise AgentError(self._redact(f"model server unreachable: {reason}")) from exc
        return "".join(text), [calls[i] for i in sorted(calls)]


def _env(*names: str) -> str | None:
    for name in names:
        if value := os.environ.get(name):
            return value
    return None


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _user_message(source: str | None, content: str) -> dict[str, Any]:
    """An input as a user message; non-user sources are labelled so the model can tell."""
    if source and source != "user":
        content = f"[{source}] {content}"
    return {"role": "user", "content": content}


def _history_messages(entry: HistoryEntry) -> list[dict[str, Any]]:
    if entry.role == "user":
        return [_user_message(entry.source, entry.content)]
    if entry.role == "assistant":
        return [{"role": "assistant", "content": entry.content}] if entry.content else []
    call = _ToolCall(
        id=entry.call_id or _new_call_id(),
        name=entry.tool or "unknown",
        arguments=json.dumps(entry.arguments or {}),
    )
    return [
        _assistant_tool_calls("", [call]),
        {"role": "tool", "tool_call_id": call.id, "content": entry.content},
    ]


def _assistant_tool_calls(text: str, calls: list[_ToolCall]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }


def _tool_json(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _decode(data: str | bytes) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise AgentError(MALFORMED) from None
    if not isinstance(chunk, dict):
        raise AgentError(MALFORMED)
    return chunk


async def _absorb(
    turn: TurnContext, chunk: dict[str, Any], key: str, text: list[str], calls: dict[int, _ToolCall]
) -> None:
    """Fold one chunk's ``choices[0][key]`` into the text and tool calls, emitting as we go."""
    if "error" in chunk:  # OpenAI and vLLM report some failures mid-stream
        raise AgentError(f"model server error: {_error_text(chunk['error'])}")
    choices = chunk.get("choices") or []  # empty in usage-only chunks
    if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
        raise AgentError(MALFORMED)
    delta = choices[0].get(key) if choices else None
    if delta is None:
        return
    if not isinstance(delta, dict):
        raise AgentError(MALFORMED)
    thinking = delta.get("reasoning_content") or delta.get("reasoning")
    if isinstance(thinking, str) and thinking:
        await turn.emit("thinking_delta", thinking)
    content = delta.get("content")
    if isinstance(content, str) and content:
        text.append(content)
        await turn.emit("stream_delta", content)
    pieces = delta.get("tool_calls") or []
    if not isinstance(pieces, list):
        raise AgentError(MALFORMED)
    for position, piece in enumerate(pieces):
        function = (piece.get("function") or {}) if isinstance(piece, dict) else None
        if not isinstance(function, dict):
            raise AgentError(MALFORMED)
        index = piece.get("index", position)  # servers that send whole calls may omit it
        call = calls.setdefault(index if isinstance(index, int) else position, _ToolCall())
        call.id = piece.get("id") or call.id
        call.name = function.get("name") or call.name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments += arguments
        elif isinstance(arguments, dict):  # some servers send the object itself
            call.arguments = json.dumps(arguments)


async def _run_tool(turn: TurnContext, call: _ToolCall) -> str:
    """Run one requested call; its result (or why it could not run) as JSON for the model."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError as exc:
        return json.dumps(_bad_arguments(call, f"were not valid JSON ({exc})"))
    if not isinstance(arguments, dict):
        return json.dumps(_bad_arguments(call, "must be a JSON object"))
    result = await turn.call_tool(call.name, arguments, call_id=call.id)
    payload = result.data if result.ok else {"error": result.error or {"message": "failed"}}
    return json.dumps(payload, default=str)


def _bad_arguments(call: _ToolCall, why: str) -> dict[str, Any]:
    message = f"the arguments for {call.name} {why}; call it again with a JSON object"
    return {"error": {"code": "invalid_arguments", "message": message}}


def _error_text(error: Any) -> str:
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        error = error["message"]
    return " ".join(str(error).split())[:200]


def _status_message(response: httpx.Response) -> str:
    """``model server answered <status>: <the error's message, or the body's start>``."""
    body = response.content.decode("utf-8", "replace")
    detail = " ".join(body.split())[:200]
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and payload.get("error"):  # {"error": {"message": …}} or str
        detail = _error_text(payload["error"])
    detail = detail or response.reason_phrase or "empty answer"
    return f"model server answered {response.status_code}: {detail}"
