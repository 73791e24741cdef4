"""The HTTP and WebSocket surface of a node (Starlette, served by hypercorn's trio worker).

Every route but the probes (``/healthz``, ``/readyz``), ``/metrics`` and the routes a feature
deliberately declares ``auth="signature"`` (webhook receivers, which verify a signature over
the raw body instead) or ``auth="public"`` (static files that belong to nobody, such as the
console's page and scripts: ``routes.HttpRoute``) needs a bearer token. Errors are JSON
``{"error": {"code", "message", "field"?}}`` with a matching status: 400 bad input, 401 no or bad
token (or signature), 404 unknown (including someone else's session: ids do not leak), 409 busy
or conflict, 413 a body over its route's limit, 429 a limit reached. Only a request that is
itself wrong is a 4xx: a store that cannot be reached is ``503 store_unavailable`` with
``Retry-After``, and any other store failure ``500 store_error``, neither with the database's
text (host, port, SQL), which the log keeps.

Hostile input is a clean 4xx, never a 500: bodies are bounded (``max_frame_bytes``), nested at
most ``MAX_JSON_DEPTH`` levels and valid UTF-8; ids in the path (``{id}``, ``{task_id}``) and
the ``after`` cursor follow the session id rule, so a malformed one is ``400 bad_message``
naming the parameter; numbers in the query are range-checked before they reach the store. An
unexpected exception is answered ``500 internal`` and logged with its traceback.

The API is described by the OpenAPI 3.1 document at ``GET /openapi.json``, generated at the
first request from every mounted route (``runtime.gateway.openapi``), the gateway's own
included; ``/ws`` is a WebSocket, described in ``docs/protocol.md`` instead.

Slow clients are bounded too: a body must arrive whole within ``body_timeout`` seconds of the
handler starting to read it (else ``408 request_timeout`` and the connection is closed), and a
body whose ``Content-Length`` is over the limit is refused before any of it is read. (Slow
request heads are the server's job: ``runtime.server.serve_app``'s ``header_timeout``.)

It is over 400 lines because the routes, the front door (auth, body limits, the error mapping) and
the WebSocket endpoint are closures over one ``build_app`` call's state (the backend, limits,
metrics, the connection count).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar, cast

import msgspec
import trio
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from turnstile.runtime import tracing
from turnstile.runtime.codec import Codec
from turnstile.runtime.errors import (
    BlockedByAutomations,
    Busy,
    ConflictError,
    DecodeError,
    Forbidden,
    LimitExceeded,
    NotFound,
    PayloadTooLarge,
    PlacedElsewhere,
    RequestTimeout,
    StoreUnavailable,
    TurnstileError,
    Unauthorized,
)
from turnstile.runtime.gateway.auth import Auth
from turnstile.runtime.gateway.backend import SessionBackend
from turnstile.runtime.gateway.connection import Connection, ConnectionLimits, declare_metrics
from turnstile.runtime.gateway.frames import (
    PROTOCOL_VERSION,
    error_frame,
    is_server_error,
    is_valid_id,
    public_error,
)
from turnstile.runtime.gateway.openapi import openapi_document
from turnstile.runtime.gateway.routes import ApiError, ApiRequest, HttpRoute, Reply
from turnstile.runtime.gateway.topics import UserTopics
from turnstile.runtime.metrics import CONTENT_TYPE, Metrics

__all__ = ["ID_RULE", "Health", "Unhealthy", "build_app"]

log = logging.getLogger("turnstile.gateway")

#: The rule for ids in paths and cursors, as said in error messages.
ID_RULE = "1-128 characters of A-Z a-z 0-9 _ . : -"

#: ``/readyz``: how long the store may take to answer its ping, and how long an answer is
#: reused (a balancer probing every second, from several places, costs one query a second)
READY_PING_SECONDS = 2.0
READY_CACHE_SECONDS = 1.0

_STATUS = {
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Busy: 409,
    ConflictError: 409,
    LimitExceeded: 429,
    RequestTimeout: 408,
    PayloadTooLarge: 413,
    PlacedElsewhere: 421,
}


_encoder = msgspec.json.Encoder()

T = TypeVar("T")

#: What ``/ws`` is, for the API document (OpenAPI describes no WebSocket).
_INTRO = (
    "The HTTP API of a Turnstile node, generated from its routes and their msgspec types "
    "(`docs/api.md`). Every route but the probes, the webhook receivers and the console's "
    'files needs `Authorization: Bearer <token>`. Errors are `{"error": {"code", '
    '"message", "field"?}}`. The WebSocket protocol at `/ws` (attach to sessions, send, '
    "watch turns stream) is described in `docs/protocol.md`."
)


class Health(msgspec.Struct):
    """``GET /healthz``: the node's process is alive and serves requests (liveness; whether
    its store answers is ``/readyz``'s)."""

    status: Literal["ok"]
    version: str
    protocol: int


class Ready(msgspec.Struct):
    """``GET /readyz`` when the node takes new work: its store answers and it is not draining."""

    status: Literal["ready"]


class NotReady(msgspec.Struct):
    """``GET /readyz`` when a load balancer should send new clients elsewhere: the node is
    draining (a graceful stop has begun), or its store does not answer."""

    status: Literal["draining", "unhealthy"]
    error: ApiError


class Unhealthy(msgspec.Struct):
    """A probe's answer when the store does not answer: why. (``/healthz`` no longer answers
    it: it is liveness only; kept for callers that name it.)"""

    status: Literal["unhealthy"]
    error: ApiError


class _Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return _encoder.encode(content)


class _BodyReader(Protocol):
    """``build_app``'s reader of a request's body through a codec."""

    async def __call__(self, request: Request, codec: Codec[T]) -> T: ...


class _Request:
    """``ApiRequest`` over a Starlette request."""

    __slots__ = ("_request", "_body", "_raw", "user", "path", "query", "headers")

    def __init__(
        self,
        request: Request,
        user: str,
        body: _BodyReader,
        raw: Callable[[Request, int | None], Awaitable[bytes]],
    ) -> None:
        self._request = request
        self._body = body
        self._raw = raw
        self.user = user
        self.path: Mapping[str, str] = request.path_params
        query = request.query_params
        if "token" in query:  # the gateway's (``?token=``), not a parameter of the route
            query = QueryParams([(k, v) for k, v in query.multi_items() if k != "token"])
        self.query: Mapping[str, str] = query
        self.headers: Mapping[str, str] = request.headers

    async def body(self, codec: Codec[T]) -> T:
        return await self._body(self._request, codec)

    async def raw_body(self, max_bytes: int | None = None) -> bytes:
        return await self._raw(self._request, max_bytes)


def _error_response(exc: BaseException, request: Request | None = None) -> Response:
    """The JSON error answer for ``exc``; anything but a ``TurnstileError`` is a bug, which is
    logged with its traceback (a 500 is never silent) and answered without details."""
    if not isinstance(exc, TurnstileError):
        where = f"{request.method} {request.url.path}" if request is not None else "a request"
        log.error("%s failed", where, exc_info=exc)
        return _Json({"error": {"code": "internal", "message": "internal error"}}, 500)
    if isinstance(exc, StoreUnavailable):  # the server's problem, for a few seconds
        body: dict[str, Any] = {"code": exc.code, "message": str(exc)}
        retry = {"retry-after": str(exc.retry_after)}
        return _Json({"error": body}, 503, headers=retry)
    if is_server_error(exc):  # a store failure no rule expected: logged, its text withheld
        code, message, _ = public_error(exc)
        return _Json({"error": {"code": code, "message": message}}, 500)
    status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 400)
    body = {"code": exc.code, "message": str(exc)}
    if exc.field:
        body["field"] = exc.field
    if isinstance(exc, PlacedElsewhere):  # where the session lives: go there
        body["node"] = exc.node
        body["node_address"] = exc.node_address
    if isinstance(exc, BlockedByAutomations):
        # cron-session-binding.md's fields, next to the usual ``error`` object
        answer = {"deleted": False, "blocked_by_automations": True}
        return _Json({"error": body, **answer, "automations": exc.automations}, status)
    if isinstance(exc, RequestTimeout):  # the rest of the body is not worth waiting for
        return _Json({"error": body}, status, headers={"connection": "close"})
    return _Json({"error": body}, status)


class _AsgiApp:
    """Marks a function as a plain ASGI app for Starlette's routes (functions are endpoints)."""

    __slots__ = ("_app",)

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def build_app(
    *,
    backend: SessionBackend,
    auth: Auth,
    routes: Sequence[HttpRoute] = (),
    limits: ConnectionLimits,
    version: str,
    metrics: Metrics | None = None,
    ws_send_many: str | None = None,
    body_timeout: float = 30.0,
    topics: UserTopics | None = None,
    draining: Callable[[], bool] | None = None,
) -> Starlette:
    """Build the ASGI app over a session backend.

    Args:
        backend: the sessions, as the WebSocket protocol reaches them.
        routes: the HTTP endpoints the features add (every route but ``/healthz``,
            ``/metrics`` and ``/ws``).
        auth: tokens and origins.
        limits: per-connection bounds.
        version: reported by ``/healthz``.
        metrics: the node's metrics, which ``/metrics`` renders; the gateway adds its own
            series (WebSocket connections, frames sent, event delivery lag). None: a registry
            of the app's own.
        ws_send_many: the ASGI message type with which the server sends several WebSocket
            messages in one write, given as the UTF-8 bytes the frames' encoder made
            (``runtime.server.WS_SEND_MANY`` under ``serve_app``); None sends them one
            ``websocket.send`` at a time, as text, which any ASGI server understands.
        body_timeout: seconds a request body may take to arrive, from the first read.
        topics: the user topics a WebSocket client may subscribe to (None: none).
        draining: whether a graceful stop has begun (``/readyz`` then answers 503, so that a
            load balancer sends new clients to the other nodes); None: never.
    """

    metrics = metrics if metrics is not None else Metrics()
    declare_metrics(metrics)
    connections = [0]
    metrics.gauge(
        "turnstile_websocket_connections", lambda: connections[0], "WebSocket clients connected."
    )

    def mount(routes: Sequence[HttpRoute]) -> list[Route]:
        """Every route behind the front door, one Starlette route per path: a method the path
        does not have is a 405 whose ``Allow`` names all it has (per-method routes would name
        only the first one's)."""
        by_path: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {}
        for route in routes:
            methods = by_path.setdefault(route.path, {})
            if route.method in methods:
                raise ValueError(f"two routes for {route.method} {route.path}")
            methods[route.method] = front_door(route)
            if route.method == "GET":
                methods.setdefault("HEAD", methods["GET"])
        mounted = []
        for path, methods in by_path.items():

            async def endpoint(
                request: Request,
                methods: dict[str, Callable[[Request], Awaitable[Response]]] = methods,
            ) -> Response:
                return await methods[request.method](request)

            mounted.append(Route(path, endpoint, methods=list(methods)))
        return mounted

    def front_door(route: HttpRoute) -> Callable[[Request], Awaitable[Response]]:
        """A route behind the front door: token (unless the route is signed or public), id
        rule, bounded body, errors."""
        tokenless = route.auth in ("signature", "public")
        traced = route.auth != "public"  # probes, /metrics and static files make no traces
        name = f"{route.method} {route.path}"

        async def endpoint(request: Request) -> Response:
            if not (traced and tracing.active()):
                return await answer(request)
            # the request's span, under the caller's ``traceparent`` header if it sent one:
            # what the handler does (a message stored, so the turn that runs it) continues it
            attributes = {"http.request.method": route.method, "http.route": route.path}
            with tracing.span(
                name, parent=request.headers, kind="server", attributes=attributes
            ) as span:
                response = await answer(request)
                span.set("http.response.status_code", response.status_code)
                if response.status_code >= 500:
                    span.fail(str(response.status_code))
                return response

        async def answer(request: Request) -> Response:
            try:
                # A signed route's handler authenticates the raw body itself, a public one
                # serves what belongs to nobody; neither has a user.
                user = "" if tokenless else auth.user_for(request.headers, request.query_params)
                for name, value in request.path_params.items():
                    if not is_valid_id(value):
                        raise DecodeError(f"{name} must be {ID_RULE}", field=name)
                answer = await route.handler(_Request(request, user, body, raw_body))
            except Exception as exc:
                return _error_response(exc, request)
            if isinstance(answer, Response):
                return answer
            return _Json(answer, route.status)

        return endpoint

    async def body(request: Request, codec: Codec[T]) -> T:
        """The request body decoded by ``codec`` (an empty body is ``{}``).

        Raises:
            DecodeError: larger than ``max_frame_bytes``, malformed (invalid UTF-8 and nesting
                deeper than ``MAX_JSON_DEPTH`` included) or not what ``codec`` expects.
        """
        return codec.decode_json(await read_body(request) or b"{}")

    async def raw_body(request: Request, max_bytes: int | None) -> bytes:
        """The body as sent, at most ``max_bytes`` (``max_frame_bytes`` when None).

        Raises:
            PayloadTooLarge: the body is (or says it is) larger than that.
            RequestTimeout: it did not arrive within ``body_timeout`` seconds.
        """
        limit = limits.max_frame_bytes if max_bytes is None else max_bytes
        return await read_body(
            request, PayloadTooLarge(f"body is larger than {limit} bytes"), limit
        )

    async def read_body(
        request: Request, too_large: DecodeError | None = None, limit: int | None = None
    ) -> bytes:
        """The whole body, read as it arrives, never more than ``limit`` bytes of it
        (``max_frame_bytes`` when None).

        Raises:
            DecodeError: the body is (or says it is) larger than the limit (``too_large``).
            RequestTimeout: it did not arrive within ``body_timeout`` seconds.
        """
        limit = limits.max_frame_bytes if limit is None else limit
        too_large = too_large or DecodeError(f"body is larger than {limit} bytes")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(body_timeout) as deadline:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
        if deadline.cancelled_caught:
            raise RequestTimeout(f"the request body did not arrive within {body_timeout:g} s")
        return b"".join(chunks)

    async def healthz(_: ApiRequest) -> Any:
        # Liveness: the process serves requests. Not the store: a node recovers on its own
        # when its store comes back, and a liveness probe that failed with the store would
        # have every node restarted by its orchestrator in an outage (``/readyz`` says it).
        return Health(status="ok", version=version, protocol=PROTOCOL_VERSION)

    #: (when the store was last asked, what was wrong then: None when it answered)
    store_checked: list[Any] = [-float("inf"), None]

    async def store_problem() -> ApiError | None:
        """Why the store cannot serve (None: it answered ``store.ping()`` within
        ``READY_PING_SECONDS``), asked at most once per ``READY_CACHE_SECONDS``."""
        now = trio.current_time()
        if now - store_checked[0] < READY_CACHE_SECONDS:
            return cast(ApiError | None, store_checked[1])
        problem: ApiError | None = None
        try:
            with trio.fail_after(READY_PING_SECONDS):
                await backend.ping()
        except trio.TooSlowError:
            problem = ApiError(code=StoreUnavailable.code, message=str(StoreUnavailable()))
            log.warning("readyz: the store did not answer within %g s", READY_PING_SECONDS)
        except Exception as exc:  # report, don't crash: this is the probe
            code, message, _ = public_error(exc)
            problem = ApiError(code=code, message=message)
        store_checked[:] = [trio.current_time(), problem]
        return problem

    async def readyz(_: ApiRequest) -> Any:
        if draining is not None and draining():
            message = "this node is draining: it finishes its turns and stops; use another node"
            error = ApiError(code="draining", message=message)
            return _Json(NotReady(status="draining", error=error), 503)
        problem = await store_problem()
        if problem is not None:
            retry = {"retry-after": str(StoreUnavailable.retry_after)}
            return _Json(NotReady(status="unhealthy", error=problem), 503, headers=retry)
        return Ready(status="ready")

    async def scrape(_: ApiRequest) -> Any:
        return Response(metrics.render(), headers={"content-type": CONTENT_TYPE})

    document: list[bytes] = []

    async def openapi(_: ApiRequest) -> Any:
        if not document:  # every route is known by now; built once
            built = openapi_document(every, title="Turnstile", version=version, description=_INTRO)
            document.append(_encoder.encode(built))
        return Response(document[0], media_type="application/json")

    own = [
        HttpRoute(
            "GET",
            "/healthz",
            healthz,
            auth="public",
            summary="Whether the node's process is alive (liveness: not its store)",
            response=Health,
        ),
        HttpRoute(
            "GET",
            "/readyz",
            readyz,
            auth="public",
            summary="Whether a load balancer should send the node new clients (its store"
            " answers, it is not draining)",
            response=Ready,
            responses={503: Reply(NotReady, "Draining, or the store does not answer")},
        ),
        HttpRoute(
            "GET",
            "/metrics",
            scrape,
            auth="public",
            summary="The node's metrics, in the Prometheus text format",
            responses={200: Reply(str, "Prometheus text format 0.0.4", media_type="text/plain")},
        ),
        HttpRoute(
            "GET",
            "/openapi.json",
            openapi,
            auth="public",
            summary="This document: the HTTP API, generated from the routes",
            response=dict[str, Any],
        ),
    ]
    every = [*own, *routes]

    async def websocket_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        # A plain ASGI app rather than a Starlette endpoint, to reach ``send`` itself.
        websocket = WebSocket(scope, receive=receive, send=send)
        send_many = None
        if ws_send_many is not None:

            async def send_many(texts: list[bytes]) -> None:
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
        connections[0] += 1
        try:
            await Connection(
                websocket,
                user,
                backend,
                limits,
                metrics=metrics,
                send_many=send_many,
                topics=topics,
            ).serve()
        finally:
            connections[0] -= 1

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
            headers=getattr(exc, "headers", None),  # Allow: the methods the path has
        )

    return Starlette(
        routes=[
            *mount(every),
            WebSocketRoute("/ws", _AsgiApp(websocket_endpoint)),
        ],
        exception_handlers={404: not_found, 405: method_not_allowed, Exception: unexpected},
    )
