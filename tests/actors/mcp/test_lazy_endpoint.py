"""``/mcp`` when the SDK cannot be loaded: a 503 naming it, and the node serves on."""

from __future__ import annotations

import json

import trio

from turnstile.actors.mcp import lazy_endpoint
from turnstile.actors.mcp.lazy_endpoint import EndpointOnFirstUse


async def test_an_sdk_that_does_not_load_answers_503_and_ends_nothing(monkeypatch):
    def broken(name: str):
        raise ImportError(f"no module named {name!r} (a broken install)")

    monkeypatch.setattr(lazy_endpoint.importlib, "import_module", broken)
    endpoint = EndpointOnFirstUse(None, None, 1024)  # type: ignore[arg-type]
    (route,) = endpoint.routes()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(endpoint.run)  # ends on its own: nothing to serve
        with trio.fail_after(30):  # a hang guard
            answer = await route.handler(None)  # type: ignore[arg-type]
    assert answer.status_code == 503
    assert json.loads(answer.body)["error"]["code"] == "mcp_unavailable"
    assert endpoint.endpoint is None
