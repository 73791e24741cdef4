"""``/mcp``: the node's sessions as an MCP server (streamable HTTP, the node's bearer tokens).

A user's MCP client (an IDE, a desktop assistant) reaches Turnstile as it reaches any MCP
server, and through it the user's sessions, so work outlives the client's own conversation:

* ``list_sessions``, ``create_session``, ``read_history``;
* ``send_message``: the message is stored as the session's input (as ``POST
  /sessions/{id}/messages`` stores it) and the call answers with the turn's end (``status``,
  ``text``, ``error``), or, when the turn takes longer than ``wait_seconds``, with its
  ``input_id`` and ``status: "running"`` (the turn goes on; ``read_history`` shows it later);
* the primitives, each with its own parameters plus ``session_id``: ``schedule_once``,
  ``schedule_cron``, ``schedule_list``, ``schedule_cancel``, ``schedule_recall``,
  ``manage_recall``, ``watch_start``, ``watch_list``, ``watch_status``, ``watch_stop``,
  ``memory`` (its ``action``: ``save``, ``search``, ``list``, ``forget``), those the node has.
  They run as a client's ``call`` frame runs a tool: in that session (one that takes a
  ``session_id`` of its own, ``manage_recall``, runs in the session it names), under the same
  policies (an ``APPROVE`` tool waits for a person's answer in the session's stream).

Every call is the token's user's: a session id is looked up in that user's namespace only, so
another user's session answers ``not_found``, exactly as over HTTP. Errors are tool results
with ``isError`` and the text ``<code>: <message>``.

The SDK serves it (``StreamableHTTPSessionManager``, stateless, JSON answers: no session state
on the node, any node serves any request); the gateway's front door checks the token first,
and the user travels to the handlers in the request's ASGI scope.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import msgspec
import trio
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from turnstile.runtime.errors import InvalidArgument, NotFound, TurnstileError
from turnstile.runtime.gateway.routes import ApiRequest
from turnstile.tools.registry import ToolRegistry

__all__ = ["PRIMITIVES", "McpEndpoint"]

#: The node's tools an MCP client may call in a session (those the node has).
PRIMITIVES = (
    "schedule_once",
    "schedule_cron",
    "schedule_list",
    "schedule_cancel",
    "schedule_recall",
    "manage_recall",
    "watch_start",
    "watch_list",
    "watch_status",
    "watch_stop",
    "memory",
)
#: How long ``send_message`` waits for the turn by default, and at most.
DEFAULT_WAIT = 120.0
MAX_WAIT = 600.0
USER_KEY = "turnstile.user"

SESSION_ID = {"type": "string", "minLength": 1, "maxLength": 128, "description": "the session"}
OWN_TOOLS = [
    types.Tool(
        name="list_sessions",
        description="Your Turnstile sessions (id, created_at, metadata), newest last.",
        input_schema={"type": "object", "properties": {}},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="create_session",
        description="Create a session (named at random unless you give an id).",
        input_schema={
            "type": "object",
            "properties": {
                "session_id": SESSION_ID,
                "metadata": {"type": "object", "description": "the session's metadata"},
            },
        },
    ),
    types.Tool(
        name="send_message",
        description=(
            "Send a message to a session and wait for the turn's answer (status, text); if "
            "the turn takes longer than wait_seconds it goes on, and read_history shows it."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "session_id": SESSION_ID,
                "content": {"type": "string", "minLength": 1},
                "wait_seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT},
            },
            "required": ["session_id", "content"],
        },
    ),
    types.Tool(
        name="read_history",
        description="A session's transcript, oldest first (the last `limit` entries).",
        input_schema={
            "type": "object",
            "properties": {
                "session_id": SESSION_ID,
                "limit": {"type": "integer", "minimum": 1, "maximum": 200},
            },
            "required": ["session_id"],
        },
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
]


class McpEndpoint:
    """The ``/mcp`` server over a node's sessions and tools.

    Args:
        directory: the sessions feature's directory (owner checks, submit, attach, history).
        tools: the node's tool registry (the primitives).
        max_body: the largest request body (the gateway's ``max_frame_bytes``).
    """

    def __init__(self, directory: Any, tools: ToolRegistry, max_body: int) -> None:
        self.directory = directory
        self.tools = tools
        self.server: Server[Any] = Server(
            "turnstile", on_list_tools=self._list_tools, on_call_tool=self._call_tool
        )
        self.manager = StreamableHTTPSessionManager(
            self.server, stateless=True, json_response=True, max_request_body_size=max_body
        )

    def answer(self, request: ApiRequest) -> Response:
        """The SDK's answer to ``request``, as the token's user (``lazy_endpoint`` routes
        ``POST /mcp`` here; the caller runs ``manager.run()``)."""
        return _Delegate(self.manager, request.user)

    # -- the MCP server's handlers ---------------------------------------------------------

    def _primitives(self) -> list[str]:
        names = set(self.tools.names())
        return [name for name in PRIMITIVES if name in names]

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        tools = list(OWN_TOOLS)
        by_name = {spec.name: spec for spec in self.tools.specs()}
        for name in self._primitives():
            spec = by_name.get(name)
            if spec is None:
                continue  # registered offered=False: not offered here either
            schema = dict(spec.parameters)
            properties = {**schema.get("properties", {}), "session_id": SESSION_ID}
            schema["properties"] = properties
            required = [n for n in schema.get("required", []) if n != "session_id"]
            schema["required"] = ["session_id", *required]
            tools.append(types.Tool(name=name, description=spec.description, input_schema=schema))
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        request = getattr(ctx, "request", None)
        user = request.scope.get(USER_KEY) if request is not None else None
        if not user:
            return _error("unauthorized", "no user for this request")
        arguments = dict(params.arguments or {})
        try:
            data = await self._run(user, params.name, arguments)
        except TurnstileError as exc:
            return _error(exc.code, str(exc))
        return _result(data)

    async def _run(self, user: str, name: str, arguments: dict[str, Any]) -> Any:
        directory = self.directory
        if name == "list_sessions":
            sessions = await directory.list_sessions(user, limit=100)
            return {"sessions": [_session(s) for s in sessions]}
        if name == "create_session":
            metadata = arguments.get("metadata")
            if metadata is not None and not isinstance(metadata, dict):
                raise InvalidArgument("metadata must be an object", field="metadata")
            session = await directory.create_session(
                user, session_id=_text(arguments, "session_id", None), metadata=metadata
            )
            return _session(session)
        session_id = _text(arguments, "session_id")
        if name == "send_message":
            wait = arguments.get("wait_seconds", DEFAULT_WAIT)
            if not isinstance(wait, int | float) or not 0 <= wait <= MAX_WAIT:
                raise InvalidArgument(
                    f"wait_seconds must be 0 to {MAX_WAIT:g}", field="wait_seconds"
                )
            return await self._send(user, session_id, _text(arguments, "content"), float(wait))
        if name == "read_history":
            limit = arguments.get("limit", 20)
            if not isinstance(limit, int) or not 1 <= limit <= 200:
                raise InvalidArgument("limit must be 1 to 200", field="limit")
            entries = await directory.history(user, session_id)
            return {"entries": msgspec.to_builtins(entries[-limit:])}
        if name in self._primitives():
            if not _takes_session_id(self.tools, name):
                del arguments["session_id"]
            result = await directory.call_tool(user, session_id, name, arguments)
            if not result.ok:
                error = result.error or {}
                raise _ToolFailed(str(error.get("code")), str(error.get("message")))
            return result.data
        raise NotFound(f"no tool named {name!r}")

    async def _send(self, user: str, session_id: str, content: str, wait: float) -> Any:
        """Submit ``content`` and wait (at most ``wait`` seconds) for its turn's end."""
        ends = _TurnEnds()
        await self.directory.attach(user, session_id, ends)  # before: no end can be missed
        try:
            submitted = await self.directory.submit(user, session_id, content)
            if submitted.input_id is None:
                return {"status": "injected", "note": "folded into the turn already running"}
            input_id = submitted.input_id
            with trio.move_on_after(wait):
                while input_id not in ends.seen and ends.lost is None:
                    await ends.wait()
            end = ends.seen.get(input_id)
            if end is None:
                return {"input_id": input_id, "status": "running"}
            answer = {"input_id": input_id, "status": end.get("status"), "text": end.get("text")}
            if end.get("error"):
                answer["error"] = end["error"]
            return answer
        finally:
            with trio.move_on_after(5, shield=True):
                try:
                    await self.directory.detach(user, session_id, ends)
                except NotFound:
                    pass  # deleted meanwhile


class _ToolFailed(TurnstileError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _TurnEnds:
    """A subscriber that keeps the ``stream_end`` events of a session (``Subscriber``)."""

    def __init__(self) -> None:
        self.seen: dict[int, dict[str, Any]] = {}
        self.lost: str | None = None
        self._changed = trio.Event()

    async def wait(self) -> None:
        await self._changed.wait()
        self._changed = trio.Event()

    def offer(self, session_id: str, seq: int, frame: bytes) -> bool:
        if b'"stream_end"' in frame:
            event = json.loads(frame)
            if event.get("type") == "stream_end" and isinstance(event.get("input_id"), int):
                self.seen[event["input_id"]] = event
                self._changed.set()
        return True

    def lagged(self, session_id: str, last_seq: int) -> None:
        self.lost = "lagged"
        self._changed.set()

    def deleted(self, session_id: str) -> None:
        self.lost = "deleted"
        self._changed.set()


#: The API's error code for each status the SDK refuses a request with.
_CODES = {
    400: "bad_message",
    403: "forbidden",
    404: "not_found",
    406: "bad_message",
    409: "conflict",
    413: "payload_too_large",
    415: "bad_message",
    421: "bad_message",
}


class _Delegate(Response):
    """An answer that is the SDK's ASGI app, with the user in the scope.

    The SDK refuses a request in its own words (a JSON-RPC error, or plain text such as
    ``Invalid Content-Type header``); such an answer is rewritten into the API's error shape
    (``{"error": {"code", "message"}}``, the same status), so ``/mcp`` answers like every
    other route and as ``/openapi.json`` says. Successful answers go through untouched."""

    def __init__(self, manager: StreamableHTTPSessionManager, user: str) -> None:
        self.manager, self.user = manager, user

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        held: dict[str, Any] = {}
        body = bytearray()

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held["status"] = message["status"]
                return
            if "status" not in held:
                await send(message)
                return
            if message["type"] == "http.response.body":
                body.extend(message.get("body", b"")[: 64 * 1024 - len(body)])
                if not message.get("more_body", False):
                    await send_error(held["status"], bytes(body))

        async def send_error(status: int, text: bytes) -> None:
            message = text.decode("utf-8", "replace").strip()
            try:  # a JSON-RPC error: its message
                message = str(json.loads(message)["error"]["message"])
            except (ValueError, KeyError, TypeError):
                pass
            code = _CODES.get(status, "internal" if status >= 500 else "bad_message")
            error = msgspec.json.encode({"error": {"code": code, "message": message[:1000]}})
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(error)).encode()),
            ]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": error})

        await self.manager.handle_request({**scope, USER_KEY: self.user}, receive, answer)


def _takes_session_id(tools: ToolRegistry, name: str) -> bool:
    """Whether the tool ``name`` has a ``session_id`` parameter of its own."""
    for spec in tools.specs():
        if spec.name == name:
            return "session_id" in spec.parameters.get("properties", {})
    return False


def _text(arguments: dict[str, Any], name: str, default: Any = ...) -> Any:
    value = arguments.get(name, default)
    if value is ...:
        raise InvalidArgument(f"{name} is required", field=name)
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string", field=name)
    return value


def _session(session: Any) -> dict[str, Any]:
    return {
        "id": session.id,
        "created_at": session.created_at.isoformat(),
        "metadata": session.metadata,
        "policy": session.policy,
    }


def _result(data: Any) -> types.CallToolResult:
    text = msgspec.json.encode(data).decode()
    structured = data if isinstance(data, dict) else None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=structured
    )


def _error(code: str, message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{code}: {message}")], is_error=True
    )
