"""The console's files over HTTP, without a browser: served to anyone (they hold no data), with
the headers that keep a page with a token in it safe, only the files the package ships, and
none at all when ``[console] enabled = false``."""

from __future__ import annotations

import re

import httpx

from tests.support.node import ALICE, running_node
from turnstile.actors.console.routes import CSP, load_assets
from turnstile.actors.console.settings import ConsoleConfig


async def test_the_page_and_its_files_need_no_token_and_carry_a_strict_policy(tmp_path):
    async with running_node(tmp_path) as node, httpx.AsyncClient(base_url=node.url) as http:
        page = await http.get("/console")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert page.headers["content-security-policy"] == CSP
        assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["referrer-policy"] == "no-referrer"
        script = await http.get("/console/app.js")
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        # the same answer with or without a token: public files act for nobody
        with_token = await http.get("/console/app.js", headers={"Authorization": f"Bearer {ALICE}"})
        assert with_token.content == script.content
        # a reload costs a 304
        again = await http.get("/console", headers={"if-none-match": page.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        # the API next to it still wants the token
        assert (await http.get("/sessions")).status_code == 401


async def test_only_the_shipped_files_are_served(tmp_path):
    async with running_node(tmp_path) as node, httpx.AsyncClient(base_url=node.url) as http:
        missing = await http.get("/console/nothing.js")
        assert missing.status_code == 404
        assert missing.json() == {
            "error": {"code": "not_found", "message": "no console file 'nothing.js'"}
        }
        for path in ("/console/..%2Fconfig.py", "/console/%2e%2e", "/console/feature.py"):
            answer = await http.get(path)
            assert answer.status_code in (400, 404), path
            assert answer.headers["content-type"] == "application/json"


def test_every_file_the_page_and_its_modules_name_is_shipped():
    assets = load_assets()
    page = assets["index.html"].body.decode()
    named = set(re.findall(r'(?:src|href)="/console/([^"]+)"', page))
    for name, asset in assets.items():
        if name.endswith(".js"):
            named |= set(re.findall(r'from "\./([^"]+)"', asset.body.decode()))
            named |= set(re.findall(r'import\("\./([^"]+)"\)', asset.body.decode()))
    assert {"app.js", "console.css", "view-session.js"} <= named
    assert named <= set(assets), named - set(assets)


async def test_a_node_can_leave_the_console_out(tmp_path):
    async with running_node(tmp_path, console=ConsoleConfig(enabled=False)) as node:
        async with httpx.AsyncClient(base_url=node.url) as http:
            assert (await http.get("/console")).status_code == 404
            assert (await http.get("/console/app.js")).status_code == 404
