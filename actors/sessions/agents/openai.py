"""An agent backed by any OpenAI-compatible chat-completions server.

OpenAI itself and the local servers that speak its protocol (Ollama, vLLM, llama.cpp server)
all accept ``POST {base_url}/chat/completions`` with ``stream: true`` and answer with
server-sent events. A turn is a loop: send the conversation, stream the answer (``content``
as ``stream_delta``, ``reasoning_content``/``reasoning`` as ``thinking_delta``), and when the
model asks for tools, run them through the turn, append the results and ask again — at most
``max_tool_rounds`` times. A turn that reaches the limit closes with the model's last text and
a visible note (hitting the iteration limit is a success, not a failure). Before each request
the conversation is fitted into the turn's ``context_tokens`` (long tool results cut, the oldest
earlier turns dropped: ``context.fit_messages``), so a large tool result does not push a
request past the model's context window.

What the servers are sent follows OpenAI's request rules: tools are advertised under
``function_name(name)`` (``clock.now`` as ``clock__now``) and mapped back; every ``tool``
message answers the assistant ``tool_calls`` id right before it. What the runtime tells the
session (a background task's end, a watcher's escalation, a job's delivery: ``source``
``notification``) is a ``system`` message, as the execution-primitives reference injects it;
cron, recall, heartbeat and webhook inputs are ``user`` messages labelled ``[cron] …`` and so
on. What they send back may vary:
tool-call arguments split over chunks, parallel calls told apart by ``index`` (or by position
where a server omits it), a missing call ``id`` (one is made up), ``reasoning`` or
``reasoning_content``, a final chunk with no choices and the ``usage``, arguments as an object
instead of a string, or a plain JSON answer from a server that ignored ``stream``.

HTTP, server-sent events, retries (429 and 5xx, honouring ``Retry-After`` up to two minutes,
with exponential backoff otherwise, at most ``max_retries`` times) and error bodies are the
official ``openai`` package's work; it runs on trio through anyio. It is imported on first use,
so a node running another agent does not pay its import time.

Failures become ``AgentError`` with one short line (the runtime shows it on the stream); the API
key is never part of a message or a repr.

It is over 400 lines because the turn's loop and the readers of what servers stream back (chunks
merged into calls, the variants listed above) are one protocol adapter; the helpers serve only it.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from turnstile.actors.sessions.agents.base import (
    AgentError,
    HistoryEntry,
    ToolSpec,
    TurnContext,
    Usage,
    function_name,
    tool_name,
)
from turnstile.actors.sessions.agents.context import estimate_tokens, fit_messages
from turnstile.runtime import tracing

if TYPE_CHECKING:
    import httpx2
    import openai

__all__ = ["OpenAIAgent"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
CONFIG_KEYS = {
    "base_url",
    "model",
    "api_key",
    "system_prompt",
    "max_tool_rounds",
    "timeout",
    "max_retries",
    "include_usage",
    "notification_role",
}
MALFORMED = "model server sent malformed data"
CUT = "model server cut the answer off mid-stream"


@dataclass
class _ToolCall:
    """One tool call as it accumulates over stream chunks."""

    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass
class _Answer:
    """What one model call produced."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _ToolCall] = field(default_factory=dict)
    finished: bool = False
    usage: Usage | None = None
    #: each choice's ``finish_reason`` as the server said it (``stop``, ``tool_calls``…)
    finish_reasons: list[str] = field(default_factory=list)
    #: the model that answered and the answer's id, as the server said them
    model: str | None = None
    id: str | None = None


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
        max_retries: how often a refused (429, 5xx) or unreachable call is tried again.
        include_usage: ask for the token counts at the end of each stream
            (``stream_options.include_usage``); turn off for a server that refuses the option.
        notification_role: how a notification reaches the model: ``system`` (the reference's
            system message), or ``user`` (a user message labelled ``[notification]``) for a
            server whose chat template takes a system message only at the start.
        transport: an httpx2 transport (for tests or custom networking).

    Raises:
        ValueError: a setting out of range.
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
        max_retries: int = 2,
        include_usage: bool = True,
        notification_role: str = "system",
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        if max_tool_rounds < 0:
            raise ValueError("max_tool_rounds must be >= 0")
        if not timeout > 0:
            raise ValueError("timeout must be > 0")
        if not 0 <= max_retries <= 10:
            raise ValueError("max_retries must be between 0 and 10")
        if notification_role not in ("system", "user"):
            raise ValueError(f"notification_role must be system or user, got {notification_role!r}")
        base_url = base_url or _env("TURNSTILE_OPENAI_BASE_URL", "OPENAI_BASE_URL")
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.model = model or _env("TURNSTILE_OPENAI_MODEL", "OPENAI_MODEL") or DEFAULT_MODEL
        self._api_key = api_key or _env("TURNSTILE_OPENAI_API_KEY", "OPENAI_API_KEY")
        self.system_prompt = system_prompt
        self.max_tool_rounds = max_tool_rounds
        self.timeout = timeout
        self.max_retries = max_retries
        self.include_usage = include_usage
        self.notification_role = notification_role
        self._transport = transport
        self._client: openai.AsyncOpenAI | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> OpenAIAgent:
        """Build from a config-file table; unknown keys are an error (they are usually typos).

        Raises:
            ValueError: an unknown key or a setting out of range.
        """
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
            await client.close()

    def _openai(self) -> openai.AsyncOpenAI:
        if self._client is None:
            import openai

            http = None
            if self._transport is not None:  # tests, custom networking
                import httpx2  # the HTTP client the openai package is built on

                http = httpx2.AsyncClient(transport=self._transport)
            self._client = openai.AsyncOpenAI(
                # The package insists on a key; local servers ignore the header, and without a
                # key of ours we send none (see ``_headers``).
                api_key=self._api_key or "unused",
                base_url=self.base_url,
                timeout=self.timeout,  # for connecting and for each read, as httpx reads it
                max_retries=self.max_retries,
                http_client=http,
            )
        return self._client

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    async def run_turn(self, turn: TurnContext) -> str:
        """Talk to the model until it answers without tool calls; return that answer.

        Raises:
            AgentError: the server refused, failed or could not be reached (after retries),
                or cut the stream off.
        """
        messages: list[dict[str, Any]] = []
        # The runtime's default prompt first, then the configured one, then the turn's own
        # segment (heartbeats add one).
        parts = (turn.input.system_prompt, self.system_prompt, turn.input.system_segment)
        system = "\n\n".join(p for p in parts if p)
        if system:
            messages.append({"role": "system", "content": system})
        # What the node's features add for this turn (memory's summary), each on its own.
        messages.extend({"role": "system", "content": m} for m in turn.input.system_messages)
        history_start = len(messages)
        role = self.notification_role
        for entry in turn.history:
            messages.extend(_history_messages(entry, role))
        history_end = len(messages)
        source = NOTIFICATION_SOURCE if turn.input.notice else turn.input.source
        messages.append(_user_message(source, turn.input.content, role))
        tools = [_tool_json(spec) for spec in turn.tools]
        tools_tokens = estimate_tokens(json.dumps(tools)) if tools else 0
        names = {function_name(spec.name): spec.name for spec in turn.tools}
        rounds = 0
        last_text = ""
        while True:
            # Inputs that arrived since the last call (mid-turn messages, background results).
            messages.extend(
                _user_message(e.source, e.content, role) for e in turn.take_injections()
            )
            if turn.input.context_tokens is not None:  # the call as a whole within the budget
                history_end -= fit_messages(
                    messages,
                    # the answer's tokens count against the model's window too
                    turn.input.context_tokens - (turn.input.max_tokens or 0),
                    history=(history_start, history_end),
                    fixed_tokens=tools_tokens,
                )
            answer = await self._complete(turn, messages, tools)
            if answer.usage is not None:
                turn.add_usage(answer.usage)
            text = "".join(answer.text)
            last_text = text or last_text
            calls = [answer.calls[i] for i in sorted(answer.calls)]
            if not calls:
                return text
            if rounds >= self.max_tool_rounds:
                # The calls of this round are not run, and are not sent anywhere either: an
                # unanswered ``tool_calls`` would make the next request invalid.
                note = f"[stopped after {self.max_tool_rounds} rounds of tool calls]"
                closing = f"\n\n{note}" if last_text else note
                await turn.emit("stream_delta", closing)
                return last_text + closing
            rounds += 1
            for call in calls:
                call.id = call.id or _new_call_id()
            messages.append(_assistant_tool_calls(text, calls))
            for call in calls:
                content = await _run_tool(turn, call, names.get(call.name))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})

    async def _complete(
        self, turn: TurnContext, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> _Answer:
        """One streamed model call: emit deltas, return the text, tool calls and usage.

        When the node traces, a span ``chat <model>`` (OpenTelemetry's GenAI conventions):
        the model asked for and the one that answered, the tokens in and out as the server
        counted them, the finish reasons, the server's address; a failure's ``error.type``.
        """
        model = turn.input.model or self.model
        if not tracing.active():
            return await self._call_model(turn, model, messages, tools)
        with tracing.span(
            f"chat {model}", kind="client", attributes=self._span_attributes(model)
        ) as span:
            try:
                answer = await self._call_model(turn, model, messages, tools)
            except AgentError as exc:
                span.fail(type(exc).__name__, str(exc))
                raise
            span.update(
                {
                    "gen_ai.response.model": answer.model,
                    "gen_ai.response.id": answer.id,
                    "gen_ai.response.finish_reasons": answer.finish_reasons or None,
                }
            )
            if answer.usage is not None:
                span.set("gen_ai.usage.input_tokens", answer.usage.prompt_tokens)
                span.set("gen_ai.usage.output_tokens", answer.usage.completion_tokens)
            return answer

    def _span_attributes(self, model: str) -> dict[str, Any]:
        """A model call span's attributes known before the call."""
        address = urlsplit(self.base_url)
        return {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
            "server.address": address.hostname,
            "server.port": address.port or (443 if address.scheme == "https" else 80),
        }

    async def _call_model(
        self,
        turn: TurnContext,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
    ) -> _Answer:
        import openai

        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
        }
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if turn.input.max_tokens:
            body["max_tokens"] = turn.input.max_tokens
        if tools:
            body["tools"] = tools
        answer = _Answer()
        streaming = False
        try:
            # ``cast_to=object`` keeps every chunk the plain dict the server sent: local servers
            # add fields (``reasoning``) and leave some out (``index``) that typed chunks hide.
            stream = await self._openai().post(
                "/chat/completions",
                cast_to=object,
                body=body,
                options={"headers": self._headers()},
                stream=True,
                stream_cls=openai.AsyncStream[object],
            )
            streaming = True
            async with stream:
                if stream.response.headers.get("content-type", "").startswith("application/json"):
                    # A server that ignored ``stream``: one complete message, same handling.
                    await stream.response.aread()
                    completion = _decode(stream.response.content)
                    await _absorb(turn, completion, "message", answer)
                    answer.finished = True
                else:
                    async for chunk in stream:
                        await _absorb(turn, chunk, "delta", answer)
        except openai.APIStatusError as exc:
            raise AgentError(self._redact(_status_message(exc))) from None
        except openai.APITimeoutError:
            where = "stopped mid-answer" if streaming else "unreachable"
            raise AgentError(f"model server {where}: timed out") from None
        except openai.APIConnectionError as exc:
            if streaming:
                raise AgentError(CUT) from None
            reason = str(exc.__cause__ or exc) or type(exc.__cause__ or exc).__name__
            reason = " ".join(reason.split())[:200]
            raise AgentError(self._redact(f"model server unreachable: {reason}")) from None
        except openai.APIError as exc:  # an ``error`` event mid-stream (OpenAI, vLLM)
            message = f"model server error: {_error_text(exc.message)}"
            raise AgentError(self._redact(message)) from None
        except (ValueError, TypeError, AttributeError):  # the SSE data was not JSON objects
            raise AgentError(MALFORMED) from None
        if not answer.finished:
            # Every server ends a choice with ``finish_reason``; a stream closed cleanly but
            # without one was cut short (a proxy or a restarting server).
            raise AgentError(CUT)
        return answer

    def _headers(self) -> dict[str, Any]:
        if self._api_key:
            return {}
        import openai

        # No key of ours: send no Authorization header at all (the package would send its
        # placeholder), so a local server's logs do not show a fake credential.
        return {"Authorization": openai.Omit()}


def _env(*names: str) -> str | None:
    for name in names:
        if value := os.environ.get(name):
            return value
    return None


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


#: The source of what the runtime tells the session (a background task's end, a watcher's
#: escalation, a job's delivery): each text says what it is ("[BACKGROUND TASK COMPLETED] …").
NOTIFICATION_SOURCE = "notification"


def _user_message(
    source: str | None, content: str, notification_role: str = "system"
) -> dict[str, Any]:
    """An input as a message. A notification is a system message, as the execution-primitives
    reference injects it: the runtime speaking, not the user (``notification_role = "user"``:
    a labelled user message). Other non-user sources (cron, recall, heartbeat, webhook) are
    user messages labelled so the model can tell."""
    if source == NOTIFICATION_SOURCE and notification_role == "system":
        return {"role": "system", "content": content}
    if source and source != "user":
        content = f"[{source}] {content}"
    return {"role": "user", "content": content}


def _history_messages(
    entry: HistoryEntry, notification_role: str = "system"
) -> list[dict[str, Any]]:
    """A transcript entry as messages; a tool entry is its own call and answer, in order."""
    if entry.role == "user":
        source = NOTIFICATION_SOURCE if entry.notice else entry.source
        return [_user_message(source, entry.content, notification_role)]
    if entry.role == "assistant":
        return [{"role": "assistant", "content": entry.content}] if entry.content else []
    call = _ToolCall(
        id=entry.call_id or _new_call_id(),
        name=function_name(entry.tool or "unknown"),
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
            "name": function_name(spec.name),
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


async def _absorb(turn: TurnContext, chunk: Any, key: str, answer: _Answer) -> None:
    """Fold one chunk's ``choices[0][key]`` and ``usage`` into ``answer``, emitting as we go."""
    if not isinstance(chunk, dict):
        raise AgentError(MALFORMED)
    if "error" in chunk:  # an error object without a message slips past the package
        raise AgentError(f"model server error: {_error_text(chunk['error'])}")
    if isinstance(chunk.get("model"), str):
        answer.model = chunk["model"]
    if isinstance(chunk.get("id"), str):
        answer.id = chunk["id"]
    usage = chunk.get("usage")
    if isinstance(usage, dict):  # the final usage chunk (or, on some servers, the last choice)
        answer.usage = Usage(
            prompt_tokens=_count(usage.get("prompt_tokens")),
            completion_tokens=_count(usage.get("completion_tokens")),
        )
    choices = chunk.get("choices") or []  # empty in usage-only chunks
    if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
        raise AgentError(MALFORMED)
    if not choices:
        return
    reason = choices[0].get("finish_reason")
    if reason:
        answer.finished = True
        if isinstance(reason, str):
            answer.finish_reasons.append(reason)
    delta = choices[0].get(key)
    if delta is None:
        return
    if not isinstance(delta, dict):
        raise AgentError(MALFORMED)
    thinking = delta.get("reasoning_content") or delta.get("reasoning")
    if isinstance(thinking, str) and thinking:
        await turn.emit("thinking_delta", thinking)
    content = delta.get("content")
    if isinstance(content, str) and content:
        answer.text.append(content)
        await turn.emit("stream_delta", content)
    pieces = delta.get("tool_calls") or []
    if not isinstance(pieces, list):
        raise AgentError(MALFORMED)
    calls = answer.calls
    for position, piece in enumerate(pieces):
        function = (piece.get("function") or {}) if isinstance(piece, dict) else None
        if not isinstance(function, dict):
            raise AgentError(MALFORMED)
        index = piece.get("index")
        if not isinstance(index, int):
            # No index (some Ollama versions): a piece with an id or a name starts a new call,
            # one without continues the last; whole calls in one chunk go by position.
            starts = piece.get("id") or function.get("name")
            index = len(calls) if starts or not calls else max(calls)
            index = max(index, position)
        call = calls.setdefault(index, _ToolCall())
        call.id = piece.get("id") or call.id
        call.name = function.get("name") or call.name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments += arguments
        elif isinstance(arguments, dict):  # some servers send the object itself
            call.arguments = json.dumps(arguments)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


async def _run_tool(turn: TurnContext, call: _ToolCall, runtime_name: str | None) -> str:
    """Run one requested call; its result (or why it could not run) as JSON for the model.

    ``runtime_name`` is the tool the call's function name was advertised for; a name the turn
    did not advertise is mapped back all the same (the registry then answers if it is unknown).
    """
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError as exc:
        return json.dumps(_bad_arguments(call, f"were not valid JSON ({exc})"))
    if not isinstance(arguments, dict):
        return json.dumps(_bad_arguments(call, "must be a JSON object"))
    name = runtime_name or tool_name(call.name)
    result = await turn.call_tool(name, arguments, call_id=call.id)
    payload = result.data if result.ok else {"error": result.error or {"message": "failed"}}
    return json.dumps(payload, default=str)


def _bad_arguments(call: _ToolCall, why: str) -> dict[str, Any]:
    message = f"the arguments for {call.name} {why}; call it again with a JSON object"
    return {"error": {"code": "invalid_arguments", "message": message}}


def _error_text(error: Any) -> str:
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        error = error["message"]
    return " ".join(str(error).split())[:200]


def _status_message(exc: openai.APIStatusError) -> str:
    """``model server answered <status>: <the error's message, or the body's start>``."""
    body = exc.body
    if isinstance(body, dict) and body.get("error"):  # {"error": {"message": …}} or a string
        detail = _error_text(body["error"])
    elif isinstance(body, dict) and isinstance(body.get("message"), str):
        detail = _error_text(body)
    elif isinstance(body, str):
        detail = " ".join(body.split())[:200]
    else:
        detail = ""
    detail = detail or exc.response.reason_phrase or "empty answer"
    return f"model server answered {exc.status_code}: {detail}"
