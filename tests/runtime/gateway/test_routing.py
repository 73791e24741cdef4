"""Routes of one path answer together: a method the path does not have is ``405`` whose
``Allow`` names every method it has (found by Schemathesis's ``allow_header_conformance``:
per-method routes named only the first route's), and ``HEAD`` goes where ``GET`` does."""

from __future__ import annotations

import httpx
import pytest

from turnstile.runtime.gateway import Auth, ConnectionLimits, HttpRoute, build_app

TOKEN = "a-token-0123456789abcdef"


async def _answer(request):
    return {"ok": True}


def _client(routes) -> httpx.AsyncClient:
    app = build_app(
        backend=None,
        routes=routes,
        auth=Auth({TOKEN: "ada"}),
        limits=ConnectionLimits(),
        version="test",
    )
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://node",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )


async def test_a_method_the_path_lacks_is_405_naming_every_method_it_has():
    routes = [
        HttpRoute("POST", "/things", _answer),
        HttpRoute("GET", "/things/{id}", _answer),
        HttpRoute("DELETE", "/things/{id}", _answer),
        HttpRoute("GET", "/things", _answer),
    ]
    async with _client(routes) as http:
        refused = await http.patch("/things/t1")
        assert refused.status_code == 405
        assert set(refused.headers["allow"].split(", ")) == {"GET", "HEAD", "DELETE"}
        assert refused.json()["error"]["code"] == "method_not_allowed"
        listing = await http.put("/things")
        assert set(listing.headers["allow"].split(", ")) == {"POST", "GET", "HEAD"}
        assert (await http.delete("/things/t1")).json() == {"ok": True}
        assert (await http.post("/things")).json() == {"ok": True}
        assert (await http.head("/things/t1")).status_code == 200


def test_two_routes_for_one_method_and_path_are_refused_at_build():
    with pytest.raises(ValueError, match=r"^two routes for GET /things$"):
        _client([HttpRoute("GET", "/things", _answer), HttpRoute("GET", "/things", _answer)])
