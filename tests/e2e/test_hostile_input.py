"""Hostile input is a clean 4xx (or a typed WebSocket ``error`` frame), never a 500 or a
dropped connection: huge numbers, deep nesting, invalid UTF-8, ids with a trailing newline,
unbounded client ids. And when something does become a 500, it is logged."""

from __future__ import annotations

import json
import logging

import httpx

from tests.support.node import ALICE, connect, new_session, running_node
from turnstile.runtime.gateway import Auth, ConnectionLimits, HttpRoute, build_app

DEEP = 1000  # what the issue found: deep enough to exhaust Python's recursion limit


def nested(depth: int) -> str:
    """A JSON value nesting ``depth`` arrays."""
    return "[" * depth + "]" * depth


def error_of(response: httpx.Response) -> tuple[int, str, str, str | None]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["message"], error.get("field")


async def test_after_seq_beyond_the_stores_integers_is_a_400_naming_it(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "s1")
        async with node.http() as http:
            for value in (str(2**63), "1" * 40, "-1", "1e3", " 1", "١"):
                response = await http.get("/sessions/s1/events", params={"after_seq": value})
                assert error_of(response) == (
                    400,
                    "bad_message",
                    "after_seq must be an integer from 0 to 9223372036854775807",
                    "after_seq",
                ), value
            largest = await http.get("/sessions/s1/events", params={"after_seq": str(2**63 - 1)})
            assert (largest.status_code, largest.json()) == (200, {"events": []})


async def test_deeply_nested_json_bodies_are_a_400_naming_the_problem(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "s1")
        deep = f'{{"metadata": {{"x": {nested(DEEP)}}}}}'
        too_deep = "malformed JSON: nested deeper than 64 levels"
        async with node.http() as http:
            response = await http.post("/sessions", content=deep)
            assert error_of(response) == (400, "bad_message", too_deep, None)
            watcher = (
                '{"tool_name": "http.get", "params": {"url": "http://example.com", "x": '
                + nested(DEEP)
                + "}}"
            )
            response = await http.post("/sessions/s1/watchers", content=watcher)
            assert error_of(response) == (400, "bad_message", too_deep, None)
            message = f'{{"content": "hi", "client_msg_id": {nested(DEEP)}}}'
            response = await http.post("/sessions/s1/messages", content=message)
            assert error_of(response) == (400, "bad_message", too_deep, None)
            # 60 levels of real metadata are fine, and brackets inside strings never count.
            fine = {"id": "fine", "metadata": {"x": json.loads(nested(60)), "s": "[" * DEEP}}
            assert (await http.post("/sessions", json=fine)).status_code == 201


async def test_invalid_utf8_in_a_json_body_is_a_400(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "s1")
        async with node.http() as http:
            for path, body in (
                ("/sessions", b'{"id": "x", "metadata": {"k": "\xff\xfe"}}'),
                ("/sessions/s1/messages", b'{"content": "caf\xc3"}'),
                ("/sessions/s1/watchers", b'{"tool_name": "\xed\xa0\x80"}'),
            ):
                response = await http.post(path, content=body)
                assert error_of(response) == (
                    400,
                    "bad_message",
                    "malformed JSON: invalid UTF-8",
                    None,
                ), path


async def test_a_deeply_nested_frame_gets_an_error_frame_and_the_connection_keeps_working(
    tmp_path,
):
    async with running_node(tmp_path) as node:
        await new_session(node, "s1")
        async with connect(node) as client:
            frame = (
                '{"type": "call", "id": "c1", "session_id": "s1", "tool": "echo", '
                f'"arguments": {{"text": {nested(DEEP)}}}}}'
            )
            await client.send_raw(frame)
            error = await client.expect("error")
            assert (error["code"], error["message"]) == (
                "bad_message",
                "malformed JSON: nested deeper than 64 levels",
            )
            await client.ws.send_message(b'{"type": "attach", "session_id": "\xff"}')
            error = await client.expect("error")
            assert (error["code"], error["message"]) == (
                "bad_message",
                "malformed JSON: invalid UTF-8",
            )
            await client.send_raw(
                json.dumps({"type": "attach", "session_id": "s1", "after_seq": 2**63})
            )
            error = await client.expect("error")
            assert (error["code"], error["field"]) == ("bad_message", "$.after_seq")
            await client.send(type="call", id="c2", session_id="s1", tool="echo", arguments={})
            await client.send(
                type="call", id="c3", session_id="s1", tool="echo", arguments={"text": "ok"}
            )
            result = await client.expect("result", id="c3")
            assert (result["ok"], result["data"]) == (True, {"text": "ok"})


async def test_ids_with_a_trailing_newline_are_refused_everywhere(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "nl-test")
        async with node.http() as http:
            response = await http.post("/sessions", json={"id": "nl-test\n"})
            assert error_of(response) == (
                400,
                "bad_message",
                "expected `str` matching regex '\\\\A[A-Za-z0-9_.:-]{1,128}\\\\Z' at $.id",
                "$.id",
            )
            # The same rule for ids in a URL: 400 naming the path parameter.
            for path, field in (
                ("/sessions/nl-test%0A", "id"),
                ("/sessions/nl-test%0A/events", "id"),
                ("/jobs/j%20x", "id"),
                ("/watchers/w%0A", "id"),
                ("/sessions/nl-test/tasks/t%0A", "task_id"),
            ):
                response = await http.get(path)
                assert error_of(response) == (
                    400,
                    "bad_message",
                    f"{field} must be 1-128 characters of A-Z a-z 0-9 _ . : -",
                    field,
                ), path
            response = await http.get("/sessions", params={"after": "a\n"})
            assert error_of(response)[1:] == (
                "bad_message",
                "after must be 1-128 characters of A-Z a-z 0-9 _ . : -",
                "after",
            )
            listed = (await http.get("/sessions")).json()["sessions"]
            assert [s["id"] for s in listed] == ["nl-test"]
        async with connect(node) as client:
            await client.send_raw(json.dumps({"type": "attach", "session_id": "nl-test\n"}))
            error = await client.expect("error")
            assert (error["code"], error["field"]) == ("bad_message", "$.session_id")


async def test_http_client_msg_id_is_capped_at_128_characters_like_the_websocket(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "s1")
        async with node.http() as http:
            response = await http.post(
                "/sessions/s1/messages", json={"content": "hi", "client_msg_id": "m" * 129}
            )
            assert error_of(response) == (
                400,
                "bad_message",
                "expected `str` of length <= 128 at $.client_msg_id",
                "$.client_msg_id",
            )
            response = await http.post(
                "/sessions/s1/messages", json={"content": "hi", "client_msg_id": "m" * 128}
            )
            assert response.status_code == 202
            assert response.json()["client_msg_id"] == "m" * 128


async def _broken(request):
    """A feature's handler with a bug: it raises something no handler expects."""
    raise RuntimeError("the bug")


async def test_a_500_is_logged_with_its_traceback(caplog):
    app = build_app(
        backend=None,
        routes=[HttpRoute("GET", "/sessions/{id}", _broken)],
        auth=Auth({ALICE: "alice"}),
        limits=ConnectionLimits(),
        version="test",
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
        with caplog.at_level(logging.ERROR, logger="turnstile.gateway"):
            response = await http.get("/sessions/s1", headers={"Authorization": f"Bearer {ALICE}"})
    assert error_of(response) == (500, "internal", "internal error", None)
    (record,) = [r for r in caplog.records if r.name == "turnstile.gateway"]
    assert record.getMessage() == "GET /sessions/s1 failed"
    assert record.exc_info is not None and str(record.exc_info[1]) == "the bug"
