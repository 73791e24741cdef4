"""HTTP servers for tests: reading a request's head off a raw stream (the e2e tests' tiny
servers), and ``APP``, the site the http module's tests fetch from (served on 127.0.0.1 by the
``server`` fixture of tests/tools/conftest.py), with ``make_tools`` for the http tools."""

from __future__ import annotations

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from turnstile.tools.modules.filesystem import Sandbox
from turnstile.tools.modules.http import HttpConfig, register_http_module
from turnstile.tools.policy import PolicyTable
from turnstile.tools.registry import ToolRegistry


async def read_request_head(stream: trio.SocketStream) -> bytes | None:
    """Read an HTTP request's head off ``stream`` (for the tests' own tiny servers); None if
    the client hung up first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        data += chunk
    return data


BIG = 2 * 1024 * 1024


async def _text(request: Request) -> Response:
    return PlainTextResponse("hello")


async def _json(request: Request) -> Response:
    return JSONResponse({"items": [{"price": 3}], "ok": True})


async def _bytes(request: Request) -> Response:
    return Response(b"\x89PNG\x00\xff", media_type="image/png")


async def _big(request: Request) -> Response:
    async def chunks():
        for _ in range(BIG // 65536):
            yield b"a" * 65536

    return StreamingResponse(chunks(), media_type="text/plain")


async def _slow(request: Request) -> Response:
    await trio.sleep(30)
    return PlainTextResponse("late")


async def _redirect(request: Request) -> Response:
    status = int(request.query_params.get("status", "302"))
    return RedirectResponse(request.query_params["to"], status_code=status)


async def _loop(request: Request) -> Response:
    return RedirectResponse("/loop")


async def _echo(request: Request) -> Response:
    body = await request.body()
    return JSONResponse(
        {
            "method": request.method,
            "body": body.decode(),
            "content_type": request.headers.get("content-type"),
        }
    )


async def _headers(request: Request) -> Response:
    return JSONResponse(dict(request.headers))


async def _cookie(request: Request) -> Response:
    response = PlainTextResponse("here is a cookie")
    response.set_cookie("session", "secret-of-the-first-caller")
    return response


async def _status(request: Request) -> Response:
    return PlainTextResponse("nope", status_code=int(request.path_params["code"]))


async def _file(request: Request) -> Response:
    return Response(bytes(range(256)) * 4, media_type="application/octet-stream")


APP = Starlette(
    routes=[
        Route("/text", _text),
        Route("/json", _json),
        Route("/bytes", _bytes),
        Route("/big", _big),
        Route("/slow", _slow),
        Route("/redirect", _redirect, methods=["GET", "POST"]),
        Route("/loop", _loop),
        Route("/echo", _echo, methods=["GET", "POST"]),
        Route("/headers", _headers, methods=["GET", "POST"]),
        Route("/cookie", _cookie),
        Route("/status/{code:int}", _status),
        Route("/file", _file),
    ]
)


def make_tools(tmp_path=None, *, resolver=None, backend=None, **config):
    registry = ToolRegistry(PolicyTable({"http.*": "AUTO"}))
    sandbox = Sandbox(tmp_path / "root") if tmp_path is not None else None
    register_http_module(
        registry, HttpConfig(**config), sandbox=sandbox, resolver=resolver, backend=backend
    )

    async def call(name, idempotency_key=None, **arguments):
        return await registry.call("s", "ada", name, arguments, idempotency_key=idempotency_key)

    return call, sandbox


LOCAL = {"allowed_hosts": ("127.0.0.1",)}
