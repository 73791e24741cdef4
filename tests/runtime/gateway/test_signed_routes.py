"""A feature may mount a route without the bearer token only by saying so: ``auth="signature"``
(its handler gets the raw body to verify) or ``auth="public"`` (static files that belong to
nobody; no user, even when a token is sent); every other route still needs a token."""

from __future__ import annotations

import httpx
import pytest

from turnstile.runtime.errors import Unauthorized
from turnstile.runtime.gateway import Auth, ConnectionLimits, HttpRoute, build_app

TOKEN = "a-token-0123456789abcdef"


async def _echo_user(request):
    return {"user": request.user}


async def _signed(request):
    body = await request.raw_body(max_bytes=16)
    if request.headers.get("x-signature") != "ok":
        raise Unauthorized("bad signature")
    return {"user": request.user, "body": body.decode()}


def _client() -> httpx.AsyncClient:
    app = build_app(
        backend=None,
        routes=[
            HttpRoute("POST", "/hooks/in", _signed, auth="signature"),
            HttpRoute("POST", "/plain", _echo_user),
            HttpRoute("GET", "/page", _echo_user, auth="public"),
        ],
        auth=Auth({TOKEN: "ada"}),
        limits=ConnectionLimits(max_frame_bytes=1024),
        version="test",
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node")


async def test_a_signed_route_needs_no_token_and_gets_the_raw_body_with_no_user():
    async with _client() as http:
        answer = await http.post("/hooks/in", content=b'{"a": 1}', headers={"x-signature": "ok"})
        assert answer.status_code == 200
        assert answer.json() == {"user": "", "body": '{"a": 1}'}
        refused = await http.post("/hooks/in", content=b"{}", headers={"x-signature": "no"})
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthorized"


async def test_a_body_over_the_routes_own_limit_is_413_before_the_handler_reads_on():
    async with _client() as http:
        answer = await http.post("/hooks/in", content=b"x" * 17, headers={"x-signature": "ok"})
        assert answer.status_code == 413
        assert answer.json()["error"] == {
            "code": "payload_too_large",
            "message": "body is larger than 16 bytes",
        }


async def test_every_other_route_still_needs_the_token():
    async with _client() as http:
        assert (await http.post("/plain", json={})).status_code == 401
        answer = await http.post("/plain", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.json() == {"user": "ada"}


async def test_a_public_route_needs_no_token_and_never_has_a_user():
    async with _client() as http:
        assert (await http.get("/page")).json() == {"user": ""}
        sent = await http.get("/page", headers={"Authorization": f"Bearer {TOKEN}"})
        assert sent.json() == {"user": ""}  # a token changes nothing: it acts for nobody
        assert (await http.post("/page")).status_code == 405


def test_a_route_says_how_it_authenticates_or_is_token_protected():
    assert HttpRoute("GET", "/x", _echo_user).auth == "bearer"
    with pytest.raises(ValueError, match="route auth"):
        HttpRoute("GET", "/x", _echo_user, auth="none")
