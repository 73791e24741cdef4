"""A stand-in for an OpenAI chat-completions server: real HTTP, scripted answers, strict checks.

``OpenAIStandIn`` is a Starlette app with ``POST /v1/chat/completions``. Every request is first
checked against the request rules OpenAI documents and enforces; a request that breaks one is
answered ``400`` with OpenAI's error body (``{"error": {"message", "type", "param", "code"}}``)
and recorded in ``rejected`` — the agent sees exactly what the real server would say. The rules:

* ``model`` is a string, ``messages`` a non-empty list, every ``role`` one OpenAI knows;
* every tool is ``{"type": "function", "function": {...}}`` whose ``name`` matches
  ``^[a-zA-Z0-9_-]{1,64}$`` (names unique) and whose ``parameters`` is a valid JSON Schema
  (checked against the 2020-12 meta-schema) of type ``object`` where every ``$ref`` resolves
  inside the parameters themselves;
* every ``tool`` message answers an id of the closest preceding assistant ``tool_calls``, and an
  assistant's ``tool_calls`` are all answered before any other message;
* ``stream_options`` only with ``stream: true``;
* with ``context_tokens`` set (the model's context window), the messages and tools together,
  plus the answer's ``max_tokens`` when given, take no more: counted here as one token per
  four characters of their JSON (a real tokenizer counts fewer for English, so the stand-in is
  the stricter), refused as OpenAI refuses it (``code: context_length_exceeded``).

A request that passes pops the next scripted reply (``Stream``, ``Reply`` or ``Stall``) and is
recorded (JSON body and headers) in ``requests``. ``start_standin(nursery)`` serves it with
hypercorn on 127.0.0.1, port 0; ``standin.transport()`` answers in-process where a test runs
on a ``MockClock``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx2
import jsonschema
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

__all__ = [
    "OpenAIStandIn",
    "Reply",
    "Seen",
    "Stall",
    "Stream",
    "chunk",
    "check_parameters",
    "finish",
    "start_standin",
    "text_stream",
    "tool_piece",
    "tool_stream",
    "usage_chunk",
]

FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
ROLES = ("system", "assistant", "user", "function", "tool", "developer")


class Rejected(Exception):
    """A request broke a rule; carries OpenAI's error fields."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": "invalid_request_error",
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class Stream:
    """An SSE answer: each chunk (a dict, or a raw ``data:`` payload), then ``[DONE]``.

    ``split`` sends every event in two pieces of bytes, cut mid-line; ``cut`` drops the
    connection after the chunks, before the stream's proper end (no ``[DONE]``, no final
    zero-length chunk), as a crashed or restarted server does.
    """

    chunks: list[dict[str, Any] | str]
    split: bool = False
    done: bool = True
    cut: bool = False


@dataclass
class Reply:
    """A plain HTTP answer, with optional extra headers (``Retry-After``)."""

    status: int
    body: str
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Stall:
    """Never answer (until the server is cancelled)."""


@dataclass
class Seen:
    """A request the stand-in received."""

    body: dict[str, Any]
    headers: dict[str, str]


class _Cut(Exception):
    """Raised inside a streaming body to drop the connection mid-answer."""


@dataclass
class OpenAIStandIn:
    """The server; see the module docstring."""

    replies: list[Stream | Reply | Stall] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""
    context_tokens: int | None = None

    def script(self, *replies: Stream | Reply | Stall) -> None:
        """Queue answers for the next requests that pass the checks, in order."""
        self.replies.extend(replies)

    def _answer(self, raw: bytes, headers: dict[str, str]) -> Stream | Reply | Stall:
        """Check a request and pick its answer (a 400 ``Reply`` if it breaks a rule)."""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        try:
            check_request(body)
            if self.context_tokens is not None:
                _check_context(body, self.context_tokens)
        except Rejected as exc:
            self.rejected.append(exc.body())
            return Reply(400, json.dumps(exc.body()))
        self.requests.append(Seen(body, headers))
        no_reply = Reply(500, '{"error": {"message": "no scripted reply", "type": "server_error"}}')
        return self.replies.pop(0) if self.replies else no_reply

    async def _completions(self, request: Request) -> Response:
        reply = self._answer(await request.body(), dict(request.headers))
        if isinstance(reply, Stall):
            await trio.sleep_forever()
        if isinstance(reply, Reply):
            return Response(
                reply.body, reply.status, headers=reply.headers, media_type=reply.content_type
            )
        return StreamingResponse(_events(reply), media_type="text/event-stream")

    def transport(self) -> httpx2.MockTransport:
        """The same server in-process, for tests on a ``MockClock`` (no socket, no real time).

        A stream arrives whole (no ``split``, no ``cut``); use the HTTP server for those.
        """

        async def handle(request: httpx2.Request) -> httpx2.Response:
            reply = self._answer(await request.aread(), dict(request.headers))
            if isinstance(reply, Stall):
                await trio.sleep_forever()
            if isinstance(reply, Reply):
                headers = {"content-type": reply.content_type, **reply.headers}
                return httpx2.Response(reply.status, headers=headers, content=reply.body)
            events = b"".join([piece async for piece in _events(reply)])
            return httpx2.Response(
                200, headers={"content-type": "text/event-stream"}, content=events
            )

        return httpx2.MockTransport(handle)

    @property
    def app(self) -> Starlette:
        route = Route("/v1/chat/completions", self._completions, methods=["POST"])
        return Starlette(routes=[route])


def check_request(body: Any) -> None:
    """Enforce OpenAI's request rules (see the module docstring).

    Raises:
        Rejected: the first rule broken, with OpenAI's message, ``param`` and ``code``.
    """
    if not isinstance(body, dict):
        raise Rejected("We could not parse the JSON body of your request.")
    if not isinstance(body.get("model"), str):
        raise Rejected("you must provide a model parameter", "model")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise Rejected(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    _check_tools(body.get("tools"))
    _check_messages(body.get("messages"))


def _check_context(body: dict[str, Any], window: int) -> None:
    used = len(json.dumps([body.get("messages"), body.get("tools")])) // 4
    answer = body.get("max_tokens") or 0
    if used + answer > window:
        asked = f"your messages resulted in {used} tokens"
        if answer:
            asked = (
                f"you requested {used + answer} tokens ({used} in the messages, {answer} in "
                "the completion)"
            )
        raise Rejected(
            f"This model's maximum context length is {window} tokens. However, {asked}. "
            "Please reduce the length of the messages or completion.",
            "messages",
            "context_length_exceeded",
        )


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list) or not tools:
        raise Rejected("Invalid 'tools': empty array.", "tools", "empty_array")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise Rejected(f"Invalid value for 'tools[{i}].type'.", f"tools[{i}].type")
        name = function.get("name") if isinstance(function, dict) else None
        param = f"tools[{i}].function.name"
        if not isinstance(name, str):
            raise Rejected(f"Missing required parameter: '{param}'.", param, "missing_required")
        if len(name) > 64:
            raise Rejected(
                f"Invalid '{param}': string too long. Expected a string with maximum length 64, "
                f"but got a string with length {len(name)} instead.",
                param,
                "string_above_max_length",
            )
        if not FUNCTION_NAME.match(name):
            raise Rejected(
                f"Invalid '{param}': string does not match pattern. Expected a string that "
                "matches the pattern '^[a-zA-Z0-9_-]+$'.",
                param,
                "invalid_value",
            )
        if name in names:
            raise Rejected(
                f"Invalid 'tools': duplicate function name {name!r}.", "tools", "invalid_value"
            )
        names.add(name)
        parameters = function.get("parameters")
        if parameters is not None:
            try:
                check_parameters(parameters)
            except ValueError as exc:
                raise Rejected(
                    f"Invalid schema for function '{name}': {exc}",
                    f"tools[{i}].function.parameters",
                    "invalid_function_parameters",
                ) from None


def check_parameters(schema: Any) -> None:
    """A function's ``parameters``: a valid JSON Schema object whose ``$ref``s resolve in it.

    Raises:
        ValueError: why not, in one line.
    """
    if not isinstance(schema, dict):
        raise ValueError(f"{json.dumps(schema)[:80]} is not of type 'object'.")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"{exc.message}.") from None
    if schema.get("type") != "object":
        raise ValueError("schema must be a JSON Schema of 'type: \"object\"', got 'type: None'.")
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise ValueError(f"reference {ref!r} points outside the schema.")
        try:
            _resolve(schema, ref)
        except LookupError:
            raise ValueError(f"reference {ref!r} can't be resolved.") from None


def _refs(node: Any):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _resolve(document: Any, ref: str) -> Any:
    """Follow a ``#/a/b`` JSON pointer (RFC 6901) inside ``document``; LookupError if absent."""
    node = document
    pointer = ref[1:]
    if not pointer:
        return node
    if not pointer.startswith("/"):
        raise LookupError(ref)
    for raw in pointer[1:].split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise LookupError(ref)
    return node


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise Rejected(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            "messages",
            "empty_array",
        )
    pending: list[str] = []  # tool_call ids of the last assistant message not yet answered
    answerable: set[str] = set()
    pending_at = 0
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise Rejected(
                f"Invalid value: {role!r}. Supported values are: 'system', 'assistant', 'user', "
                "'function', 'tool', and 'developer'.",
                f"messages[{i}].role",
                "invalid_value",
            )
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in answerable:
                raise Rejected(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            answerable.discard(call_id)
            pending = [p for p in pending if p != call_id]
            if not isinstance(message.get("content"), str):
                raise Rejected(f"Invalid 'messages[{i}].content'.", f"messages[{i}].content")
            continue
        if pending:
            raise Rejected(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}",
                f"messages.[{pending_at}].role",
            )
        answerable = set()
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is not None:
                _check_tool_calls(i, calls)
                pending = [c["id"] for c in calls]
                answerable = set(pending)
                pending_at = i
            elif not isinstance(message.get("content"), str):
                raise Rejected(
                    "Invalid value for 'content': expected a string, got null.",
                    f"messages.[{i}].content",
                )
        elif not isinstance(message.get("content"), str | list):
            raise Rejected(f"Invalid 'messages[{i}].content'.", f"messages[{i}].content")
    if pending:
        raise Rejected(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}",
            f"messages.[{pending_at}].role",
        )


def _check_tool_calls(i: int, calls: Any) -> None:
    if not isinstance(calls, list) or not calls:
        raise Rejected(
            f"Invalid 'messages[{i}].tool_calls': empty array.",
            f"messages[{i}].tool_calls",
            "empty_array",
        )
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise Rejected(f"Missing required parameter: '{where}.id'.", f"{where}.id")
        if call.get("type") != "function" or not isinstance(function, dict):
            raise Rejected(f"Invalid value for '{where}.type'.", f"{where}.type")
        if not isinstance(function.get("name"), str) or not isinstance(
            function.get("arguments"), str
        ):
            raise Rejected(f"Invalid '{where}.function'.", f"{where}.function")


async def _events(stream: Stream):
    payloads = [c if isinstance(c, str) else json.dumps(c) for c in stream.chunks]
    if stream.done and not stream.cut:
        payloads.append("[DONE]")
    for payload in payloads:
        event = f"data: {payload}\n\n".encode()
        if stream.split:
            yield event[: len(event) // 2]
            await trio.lowlevel.checkpoint()
            yield event[len(event) // 2 :]
        else:
            yield event
    if stream.cut:
        raise _Cut("connection dropped mid-answer")


async def start_standin(nursery: trio.Nursery) -> OpenAIStandIn:
    """Serve a fresh stand-in in ``nursery`` (cancel the nursery to stop it)."""
    standin = OpenAIStandIn()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    (bind,) = await nursery.start(hypercorn_serve, standin.app, config)
    standin.base_url = f"{bind}/v1"
    return standin


def chunk(finish_reason: str | None = None, **delta: Any) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice whose delta is ``delta``."""
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "standin",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def finish(reason: str = "stop") -> dict[str, Any]:
    """The chunk that ends a choice: an empty delta and ``finish_reason``."""
    return chunk(finish_reason=reason)


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage`` is set: no choices, just usage."""
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "standin",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def text_stream(*pieces: str, split: bool = False, usage: tuple[int, int] | None = None) -> Stream:
    """A stream answering ``pieces`` as content deltas, closed with ``finish_reason: stop``."""
    chunks: list[dict[str, Any] | str] = [chunk(role="assistant", content="")]
    chunks += [chunk(content=p) for p in pieces]
    chunks.append(finish("stop"))
    if usage is not None:
        chunks.append(usage_chunk(*usage))
    return Stream(chunks, split)


def tool_piece(
    index: int | None, *, id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    """A delta fragment of tool call ``index`` (name and id come only in the first one)."""
    piece: dict[str, Any] = {"function": {"arguments": arguments}}
    if index is not None:
        piece["index"] = index
    if id is not None:
        piece["id"] = id
        piece["type"] = "function"
    if name is not None:
        piece["function"]["name"] = name
    return piece


def tool_stream(*calls: tuple[str, str, dict[str, Any]], text: str = "") -> Stream:
    """Whole tool calls ``(id, function name, arguments)`` as OpenAI streams them: the first
    fragment with id and name, the arguments in two more, ``finish_reason: tool_calls``."""
    chunks: list[dict[str, Any] | str] = [chunk(role="assistant", content=text or None)]
    for index, (call_id, name, arguments) in enumerate(calls):
        encoded = json.dumps(arguments)
        half = len(encoded) // 2
        chunks.append(chunk(tool_calls=[tool_piece(index, id=call_id, name=name)]))
        chunks.append(chunk(tool_calls=[tool_piece(index, arguments=encoded[:half])]))
        chunks.append(chunk(tool_calls=[tool_piece(index, arguments=encoded[half:])]))
    chunks.append(finish("tool_calls"))
    return Stream(chunks)
