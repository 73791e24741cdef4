"""The HTTP and WebSocket surface of a node (Starlette, served by hypercorn's trio worker).

Every route but ``/healthz`` and ``/metrics`` needs a bearer token. Errors are JSON
``{"error": {"code", "message", "field"?}}`` with a matching status: 400 bad input, 401 no or bad
token, 404 unknown (including someone else's session: ids do not leak), 409 busy or conflict,
429 a limit reached.

Hostile input is a clean 4xx, never a 500: bodies are bounded (``max_frame_bytes``), nested at
most ``MAX_JSON_DEPTH`` levels and valid UTF-8; ids in the path (``{id}``, ``{task_id}``) and
the ``after`` cursor follow the session id rule, so a malformed one is ``400 bad_message``
naming the parameter; numbers in the query are range-checked before they reach the store. An
unexpected exception is answered ``500 internal`` and logged with its traceback.

Slow clients are bounded too: a body must arrive whole within ``body_timeout`` seconds of the
handler starting to read it (else ``408 request_timeout`` and the connection is closed), and a
body whose ``Content-Length`` is over the limit is refused before any of it is read. (Slow
request heads are the server's job: ``runtime.server.serve_app``'s ``header_timeout``.)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from turnstile.runtime.codec import MAX_JSON_DEPTH, Codec
from turnstile.runtime.errors import (
    BlockedByAutomations,
    Busy,
    ConflictError,
    DecodeError,
    LimitExceeded,
    NotFound,
    RequestTimeout,
    TurnstileError,
    Unauthorized,
)
from turnstile.runtime.gateway.auth import Auth
from turnstile.runtime.gateway.backend import SessionBackend
from turnstile.runtime.gateway.connection import Connection, ConnectionLimits
from turnstile.runtime.gateway.frames import (
    MAX_SEQ,
    PROTOCOL_VERSION,
    ClientMsgId,
    SessionId,
    encode_event,
    error_frame,
    is_valid_id,
)

__all__ = ["build_app"]

log = logging.getLogger("turnstile.gateway")

#: The rule for ids in paths and cursors, as said in error messages.
_ID_RULE = "1-128 characters of A-Z a-z 0-9 _ . : -"
_UNSIGNED = re.compile(r"\A[0-9]{1,19}\Z")

_STATUS = {
    Unauthorized: 401,
    NotFound: 404,
    Busy: 409,
    ConflictError: 409,
    LimitExceeded: 429,
    RequestTimeout: 408,
}


class CreateSession(msgspec.Struct, forbid_unknown_fields=True):
    id: SessionId | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    policy: str = "enqueue"


class PostMessage(msgspec.Struct, forbid_unknown_fields=True):
    content: str
    client_msg_id: ClientMsgId | None = None


_CREATE = Codec(CreateSession, max_depth=MAX_JSON_DEPTH)
_MESSAGE = Codec(PostMessage, max_depth=MAX_JSON_DEPTH)
_ANY = Codec(Any, max_depth=MAX_JSON_DEPTH)
_encoder = msgspec.json.Encoder()


class _Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return _encoder.encode(content)


def _error_response(exc: BaseException, request: Request | None = None) -> Response:
    """The JSON error answer for ``exc``; anything but a ``TurnstileError`` is a bug, which is
    logged with its traceback (a 500 is never silent) and answered without details."""
    if not isinstance(exc, TurnstileError):
        where = f"{request.method} {request.url.path}" if request is not None else "a request"
        log.error("%s failed", where, exc_info=exc)
        return _Json({"error": {"code": "internal", "message": "internal error"}}, 500)
    status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 400)
    body: dict[str, Any] = {"code": exc.code, "message": str(exc)}
    if getattr(exc, "field", None):
        body["field"] = exc.field
    if isinstance(exc, BlockedByAutomations):
        # cron-session-binding.md's fields, next to the usual ``error`` object
        answer = {"deleted": False, "blocked_by_automations": True}
        return _Json({"error": body, **answer, "automations": exc.automations}, status)
    if isinstance(exc, RequestTimeout):  # the rest of the body is not worth waiting for
        return _Json({"error": body}, status, headers={"connection": "close"})
    return _Json({"error": body}, status)


def _session_json(session) -> dict[str, Any]:
    return {
        "id": session.id,
        "owner": session.owner,
        "metadata": session.metadata,
        "policy": session.policy,
        "created_at": session.created_at,
        "updated_at": session.updated_at,
        "last_seq": session.last_seq,
    }


class _AsgiApp:
    """Marks a function as a plain ASGI app for Starlette's routes (functions are endpoints)."""

    __slots__ = ("_app",)

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self._app = app

    async def __call__(self, scope, receive, send) -> None:
        await self._app(scope, receive, send)


def build_app(
    *,
    backend: SessionBackend,
    auth: Auth,
    limits: ConnectionLimits,
    version: str,
    on_connection: Callable[[int], None] | None = None,
    on_frames_sent: Callable[[int], None] | None = None,
    ws_send_many: str | None = None,
    body_timeout: float = 30.0,
) -> Starlette:
    """Build the ASGI app over a session backend.

    Args:
        backend: the sessions.
        auth: tokens and origins.
        limits: per-connection bounds.
        version: reported by ``/healthz``.
        on_connection: called with +1 / -1 as WebSockets open and close (metrics).
        on_frames_sent: called with the number of frames of every write to a client (metrics).
        ws_send_many: the ASGI message type with which the server sends several WebSocket
            messages in one write (``runtime.server.WS_SEND_MANY`` under ``serve_app``); None
            sends them one ``websocket.send`` at a time, which any ASGI server understands.
        body_timeout: seconds a request body may take to arrive, from the first read.
    """

    def authed(handler):
        async def endpoint(request: Request) -> Response:
            try:
                user = auth.user_for(request.headers, request.query_params)
                for name, value in request.path_params.items():
                    if not is_valid_id(value):
                        raise DecodeError(f"{name} must be {_ID_RULE}", field=name)
                return await handler(request, user)
            except Exception as exc:
                return _error_response(exc, request)

        return endpoint

    async def body(request: Request, codec: Codec):
        """The request body decoded by ``codec`` (an empty body is ``{}``).

        Raises:
            DecodeError: larger than ``max_frame_bytes``, malformed (invalid UTF-8 and nesting
                deeper than ``MAX_JSON_DEPTH`` included) or not what ``codec`` expects.
        """
        return codec.decode_json(await read_body(request) or b"{}")

    async def read_body(request: Request) -> bytes:
        """The whole body, read as it arrives, never more than ``max_frame_bytes`` of it.

        Raises:
            DecodeError: the body is (or says it is) larger than ``max_frame_bytes``.
            RequestTimeout: it did not arrive within ``body_timeout`` seconds.
        """
        too_large = DecodeError(f"body is larger than {limits.max_frame_bytes} bytes")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_frame_bytes:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(body_timeout) as deadline:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_frame_bytes:
                    raise too_large
                chunks.append(chunk)
        if deadline.cancelled_caught:
            raise RequestTimeout(f"the request body did not arrive within {body_timeout:g} s")
        return b"".join(chunks)

    async def healthz(_: Request) -> Response:
        try:
            await backend.ping()
        except Exception as exc:  # report, don't crash: this is the probe
            return _Json(
                {"status": "unhealthy", "error": {"code": "unhealthy", "message": str(exc)}}, 503
            )
        return _Json({"status": "ok", "version": version, "protocol": PROTOCOL_VERSION})

    async def metrics(_: Request) -> Response:
        lines = []
        seen: set[str] = set()
        for name, value in sorted(backend.metrics().items()):
            family = name.split("{")[0]
            kind = "counter" if family.endswith("_total") else "gauge"
            for suffix in ("_sum", "_count"):
                if family.endswith(suffix):
                    family, kind = family.removesuffix(suffix), "summary"
            if family not in seen:
                seen.add(family)
                lines.append(f"# TYPE {family} {kind}")
            lines.append(f"{name} {value}")
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def create_session(request: Request, user: str) -> Response:
        spec = await body(request, _CREATE)
        session = await backend.create_session(
            user, session_id=spec.id, metadata=spec.metadata, policy=spec.policy
        )
        return _Json(_session_json(session), 201)

    async def list_sessions(request: Request, user: str) -> Response:
        try:
            limit = int(request.query_params.get("limit", "100"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= 1000:
            raise DecodeError("limit must be an integer from 1 to 1000", field="limit")
        after = request.query_params.get("after")
        if after is not None and not is_valid_id(after):
            raise DecodeError(f"after must be {_ID_RULE}", field="after")
        flag = request.query_params.get("has_recall")
        if flag is not None and flag.lower() not in ("true", "false"):
            raise DecodeError("has_recall must be true or false", field="has_recall")
        has_recall = None if flag is None else flag.lower() == "true"
        sessions = await backend.list_sessions(
            user, limit=limit, after_id=after, has_recall=has_recall
        )
        recalls = await backend.pending_recalls(user, [s.id for s in sessions])
        listed = []
        for session in sessions:  # recall.md's sidebar: which sessions have a pending recall
            entry = _session_json(session)
            entry["has_recall"] = session.id in recalls
            entry["recall_trigger_at"] = recalls.get(session.id)
            listed.append(entry)
        return _Json({"sessions": listed})

    async def get_session(request: Request, user: str) -> Response:
        session = await backend.get_session(user, request.path_params["id"])
        return _Json(_session_json(session))

    async def delete_session(request: Request, user: str) -> Response:
        confirm = request.query_params.get("confirm", "").lower() in ("1", "true", "yes")
        await backend.delete_session(user, request.path_params["id"], confirm=confirm)
        return Response(status_code=204)

    async def history(request: Request, user: str) -> Response:
        entries = await backend.history(user, request.path_params["id"])
        return _Json({"history": entries})

    async def events(request: Request, user: str) -> Response:
        text = request.query_params.get("after_seq", "0")
        after = int(text) if _UNSIGNED.search(text) else -1
        if not 0 <= after <= MAX_SEQ:
            raise DecodeError(
                f"after_seq must be an integer from 0 to {MAX_SEQ}", field="after_seq"
            )
        sid = request.path_params["id"]
        page = await backend.read_events(user, sid, after, 1000)
        return Response(
            b'{"events":[' + b",".join(encode_event(sid, e) for e in page) + b"]}",
            media_type="application/json",
        )

    async def post_message(request: Request, user: str) -> Response:
        message = await body(request, _MESSAGE)
        submitted = await backend.submit(user, request.path_params["id"], message.content)
        out: dict[str, Any] = {"input_id": submitted.input_id}
        if submitted.injected:
            out["injected"] = True
        if message.client_msg_id is not None:
            out["client_msg_id"] = message.client_msg_id
        return _Json(out, 202)

    async def stop(request: Request, user: str) -> Response:
        running = await backend.stop(user, request.path_params["id"])
        return _Json({"stopped": running})

    async def session_jobs(request: Request, user: str) -> Response:
        jobs = await backend.list_jobs(user, request.path_params["id"])
        return _Json({"jobs": jobs})

    async def get_job(request: Request, user: str) -> Response:
        job, runs = await backend.get_job(user, request.path_params["id"])
        return _Json({"job": job, "runs": runs})

    async def approve(request: Request, user: str) -> Response:
        return _Json(await backend.resolve_approval(user, request.path_params["id"], True))

    async def deny(request: Request, user: str) -> Response:
        return _Json(await backend.resolve_approval(user, request.path_params["id"], False))

    async def approvals(request: Request, user: str) -> Response:
        pending = await backend.pending_approvals(user, request.path_params["id"])
        return _Json({"approvals": pending})

    async def create_watcher(request: Request, user: str) -> Response:
        spec = await body(request, _ANY)
        if not isinstance(spec, dict):
            raise DecodeError("expected a JSON object")
        view = await backend.start_watcher(user, request.path_params["id"], spec)
        return _Json(view, 201)

    async def session_watchers(request: Request, user: str) -> Response:
        return _Json(await backend.list_watchers(user, request.path_params["id"]))

    def watcher_action(action: str):
        async def endpoint(request: Request, user: str) -> Response:
            return _Json(await backend.watcher(user, request.path_params["id"], action))

        return endpoint

    async def session_tasks(request: Request, user: str) -> Response:
        return _Json({"tasks": await backend.list_tasks(user, request.path_params["id"])})

    async def get_task(request: Request, user: str) -> Response:
        params = request.path_params
        return _Json(await backend.task(user, params["id"], params["task_id"]))

    async def cancel_task(request: Request, user: str) -> Response:
        params = request.path_params
        return _Json(await backend.cancel_task(user, params["id"], params["task_id"]))

    async def get_recall(request: Request, user: str) -> Response:
        return _Json({"recall": await backend.get_recall(user, request.path_params["id"])})

    async def cancel_recall(request: Request, user: str) -> Response:
        return _Json(await backend.cancel_recall(user, request.path_params["id"]))

    async def skip_recall(request: Request, user: str) -> Response:
        return _Json(await backend.skip_recall(user, request.path_params["id"]))

    async def heartbeat(request: Request, user: str) -> Response:
        return _Json(await backend.heartbeat(user, request.path_params["id"]))

    async def websocket_endpoint(scope, receive, send) -> None:
        # A plain ASGI app rather than a Starlette endpoint, to reach ``send`` itself.
        websocket = WebSocket(scope, receive=receive, send=send)
        send_many = None
        if ws_send_many is not None:

            async def send_many(texts: list[str]) -> None:
                await send({"type": ws_send_many, "texts": texts})

        await websocket.accept()
        try:
            user = auth.user_for(websocket.headers, websocket.query_params)
        except Unauthorized as exc:
            await websocket.send_text(error_frame(exc).decode())
            await websocket.close(code=4401)
            return
        if not auth.origin_allowed(websocket.headers.get("origin")):
            await websocket.send_text(error_frame(Unauthorized("origin not allowed")).decode())
            await websocket.close(code=4403)
            return
        if on_connection is not None:
            on_connection(1)
        try:
            await Connection(
                websocket, user, backend, limits, on_frames_sent, send_many=send_many
            ).serve()
        finally:
            if on_connection is not None:
                on_connection(-1)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _Json(
            {"error": {"code": "not_found", "message": f"no route {request.url.path}"}}, 404
        )

    async def unexpected(request: Request, exc: Exception) -> Response:
        return _error_response(exc, request)

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return _Json(
            {"error": {"code": "method_not_allowed", "message": f"{request.method} not allowed"}},
            405,
        )

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/metrics", metrics),
            Route("/sessions", authed(create_session), methods=["POST"]),
            Route("/sessions", authed(list_sessions), methods=["GET"]),
            Route("/sessions/{id}", authed(get_session), methods=["GET"]),
            Route("/sessions/{id}", authed(delete_session), methods=["DELETE"]),
            Route("/sessions/{id}/history", authed(history), methods=["GET"]),
            Route("/sessions/{id}/events", authed(events), methods=["GET"]),
            Route("/sessions/{id}/messages", authed(post_message), methods=["POST"]),
            Route("/sessions/{id}/stop", authed(stop), methods=["POST"]),
            Route("/sessions/{id}/jobs", authed(session_jobs), methods=["GET"]),
            Route("/jobs/{id}", authed(get_job), methods=["GET"]),
            Route("/sessions/{id}/approvals", authed(approvals), methods=["GET"]),
            Route("/approvals/{id}/approve", authed(approve), methods=["POST"]),
            Route("/approvals/{id}/deny", authed(deny), methods=["POST"]),
            Route("/sessions/{id}/watchers", authed(create_watcher), methods=["POST"]),
            Route("/sessions/{id}/watchers", authed(session_watchers), methods=["GET"]),
            Route("/watchers/{id}", authed(watcher_action("get")), methods=["GET"]),
            Route("/watchers/{id}", authed(watcher_action("stop")), methods=["DELETE"]),
            Route("/watchers/{id}/pause", authed(watcher_action("pause")), methods=["POST"]),
            Route("/watchers/{id}/resume", authed(watcher_action("resume")), methods=["POST"]),
            Route("/sessions/{id}/tasks", authed(session_tasks), methods=["GET"]),
            Route("/sessions/{id}/tasks/{task_id}", authed(get_task), methods=["GET"]),
            Route("/sessions/{id}/tasks/{task_id}/cancel", authed(cancel_task), methods=["POST"]),
            Route("/sessions/{id}/recall", authed(get_recall), methods=["GET"]),
            Route("/sessions/{id}/recall", authed(cancel_recall), methods=["DELETE"]),
            Route("/sessions/{id}/recall/skip", authed(skip_recall), methods=["POST"]),
            Route("/sessions/{id}/heartbeat", authed(heartbeat), methods=["GET"]),
            WebSocketRoute("/ws", _AsgiApp(websocket_endpoint)),
        ],
        exception_handlers={404: not_found, 405: method_not_allowed, Exception: unexpected},
    )
