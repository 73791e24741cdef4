"""Outbound URLs reach the log without their secrets: query strings and userinfo are cut.

The http module logs each request at DEBUG (an httpx client's line, which httpx logs at INFO).
"""

from __future__ import annotations

import logging

from tests.support.http import LOCAL, make_tools


async def test_a_secret_in_a_query_string_or_userinfo_never_reaches_the_log(server, caplog):
    call, _ = make_tools(**LOCAL)
    host = server.removeprefix("http://")
    with caplog.at_level(logging.DEBUG, logger="httpx"):
        got = await call("http.get", url=f"{server}/text?token=SECRET-QUERY&x=1#SECRET-FRAGMENT")
        assert got.ok, got.error
        got = await call("http.get", url=f"http://ada:SECRET-PASSWORD@{host}/text")
        assert got.ok, got.error
    assert "SECRET" not in caplog.text
    requests = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert (
        requests == [f'HTTP Request: GET {server}/text "HTTP/1.1 200 "'] * 2
    )  # hypercorn: no phrase
