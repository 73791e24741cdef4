"""Hypothesis over every HTTP route of a real node: generated ids, query strings and bodies
(JSON of every shape, known fields with wrong values, raw bytes) never get a 5xx, and every
refusal is the documented JSON error.

The node runs on the test's trio loop; Hypothesis drives it from a worker thread, each example
one real HTTP request sent back on the loop (``trio.from_thread.run``), so every request goes
through hypercorn, Starlette and the actors like a client's. Examples are derandomized: CI sees
the same requests every run (set ``TURNSTILE_FUZZ_EXAMPLES``, the examples per route,
to explore more).
"""

from __future__ import annotations

import logging
import os
from urllib.parse import quote

import httpx
import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.node import ALICE, BOB, new_session, running_node

ROUTES: list[tuple[str, str]] = [
    ("POST", "/sessions"),
    ("GET", "/sessions"),
    ("GET", "/sessions/{id}"),
    ("DELETE", "/sessions/{id}"),
    ("GET", "/sessions/{id}/history"),
    ("GET", "/sessions/{id}/events"),
    ("POST", "/sessions/{id}/messages"),
    ("POST", "/sessions/{id}/stop"),
    ("GET", "/sessions/{id}/jobs"),
    ("GET", "/jobs/{id}"),
    ("GET", "/sessions/{id}/approvals"),
    ("POST", "/approvals/{id}/approve"),
    ("POST", "/approvals/{id}/deny"),
    ("POST", "/sessions/{id}/watchers"),
    ("GET", "/sessions/{id}/watchers"),
    ("GET", "/watchers/{id}"),
    ("DELETE", "/watchers/{id}"),
    ("POST", "/watchers/{id}/pause"),
    ("POST", "/watchers/{id}/resume"),
    ("GET", "/sessions/{id}/tasks"),
    ("GET", "/sessions/{id}/tasks/{task_id}"),
    ("POST", "/sessions/{id}/tasks/{task_id}/cancel"),
    ("GET", "/sessions/{id}/recall"),
    ("DELETE", "/sessions/{id}/recall"),
    ("POST", "/sessions/{id}/recall/skip"),
    ("GET", "/sessions/{id}/heartbeat"),
]

#: Every field name some route reads, so generated objects reach past "unknown field".
FIELDS = [
    "id",
    "metadata",
    "policy",
    "content",
    "client_msg_id",
    "tool_name",
    "params",
    "interval",
    "condition",
    "escalate_on",
    "name",
    "threshold",
    "batch",
    "confirm",
]
QUERY_KEYS = ["after_seq", "limit", "after", "confirm", "token", "x"]
#: a hang guard for one answer (real clock), not a promise: generous for a 2-core box at load 8
WAIT = 60

ids = st.one_of(
    st.just("s1"),  # Alice's own session: requests get past "not found" to the body
    st.sampled_from(["s1", "bob-s1", "nobody", "s1.heartbeat", "alice/s1", "..", "%2F"]),
    st.text(min_size=0, max_size=140),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
known_objects = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5)


@st.composite
def deep_in_a_field(draw) -> bytes:
    """A known field holding arrays or objects nested past the limit."""
    depth = draw(st.integers(min_value=65, max_value=3000))
    field = draw(st.sampled_from(FIELDS))
    value = b"[" * depth + b"]" * depth if draw(st.booleans()) else b'{"a":' * depth + b"}" * depth
    return b'{"' + field.encode() + b'": ' + value + b"}"


@st.composite
def bad_utf8_in_a_string(draw) -> bytes:
    """A known object whose first string value holds bytes that are not UTF-8."""
    field = draw(st.sampled_from(FIELDS))
    poison = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80", b"\xf5\x80"]))
    return b'{"' + field.encode() + b'": "a' + poison + b'b"}'


bodies = st.one_of(
    st.none(),
    known_objects.map(msgspec.json.encode),
    json_values.map(msgspec.json.encode),
    st.binary(max_size=200),
    deep_in_a_field(),
    bad_utf8_in_a_string(),
)
numbers = st.sampled_from(
    ["0", "-1", str(2**63), str(2**63 - 1), str(2**64), "1" * 40, "1e3", "", "abc", "5", "\u0661"]
)
queries = st.fixed_dictionaries(
    {}, optional={key: numbers | st.text(max_size=20) for key in QUERY_KEYS}
)


KNOWN_500S: list[tuple[str, str, dict, bytes | None]] = [
    ("GET", "/sessions/s1/events", {"after_seq": str(2**63)}, None),
    ("POST", "/sessions", {}, b'{"metadata": ' + b"[" * 1000 + b"]" * 1000 + b"}"),
    ("POST", "/sessions/s1/watchers", {}, b'{"params": ' + b"[" * 1000 + b"]" * 1000 + b"}"),
    ("POST", "/sessions/s1/messages", {}, b'{"content": "caf\xc3"}'),
]


def _path(template: str, session_id: str, object_id: str) -> str:
    return template.format(id=quote(session_id, safe=""), task_id=quote(object_id, safe=""))


def check(response: httpx.Response, request: str) -> None:
    """No 5xx; every refusal is ``{"error": {"code", "message", "field"?}}``."""
    assert response.status_code < 500, (request, response.status_code, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str) and error["code"], (request, error)
        assert isinstance(error["message"], str) and error["message"], (request, error)
        assert set(error) <= {"code", "message", "field"}, (request, error)


@pytest.mark.slow
async def test_generated_requests_over_every_route_never_get_a_5xx(tmp_path, caplog):
    per_route = int(os.environ.get("TURNSTILE_FUZZ_EXAMPLES", "60"))
    async with running_node(tmp_path) as node:
        await new_session(node, "s1")
        await new_session(node, "bob-s1", token=BOB)
        async with node.http(ALICE) as http:

            async def send(method: str, path: str, query: dict, body: bytes | None) -> None:
                with trio.fail_after(WAIT):
                    response = await http.request(method, path, params=query, content=body)
                check(response, f"{method} {path} {query} {body!r:.200}")

            def fuzz_route(method: str, template: str) -> None:
                @settings(
                    max_examples=per_route,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                @given(session_id=ids, object_id=ids, query=queries, body=bodies)
                def fuzz(session_id, object_id, query, body):
                    path = _path(template, session_id, object_id)
                    trio.from_thread.run(send, method, path, query, body)

                fuzz()

            def fuzz_every_route() -> None:
                # What the hostile-client report found (each was a 500), always tried.
                for method, path, query, body in KNOWN_500S:
                    trio.from_thread.run(send, method, path, query, body)
                for method, template in ROUTES:
                    fuzz_route(method, template)

            with caplog.at_level(logging.ERROR, logger="turnstile"):
                await trio.to_thread.run_sync(fuzz_every_route)
            # The node still serves both users as before.
            assert (await http.get("/healthz")).status_code == 200
            listed = (await http.get("/sessions")).json()["sessions"]
            assert "bob-s1" not in [s["id"] for s in listed]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
