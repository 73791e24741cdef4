"""What a server's tool list becomes (names, schemas, policies), the backoff, the result's
shape and cap: pure functions, table-driven."""

from __future__ import annotations

import json

import pytest

from turnstile.actors.mcp.catalog import MAX_TOOLS, catalog, check_schema, local_name
from turnstile.actors.mcp.feature import cap, result_data, session_servers
from turnstile.actors.mcp.server import backoff_delay
from turnstile.tools.policy import Policy

OBJECT = {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("mcp_name", "local"),
    [
        ("get_current_time", "get_current_time"),
        ("get-weather", "get_weather"),
        ("getWeather", "getWeather"),
        ("a.b", "a_b"),
        ("../../etc/passwd", "etc_passwd"),
        ("  spaced  out ", "spaced_out"),
        ("a__b", "a_b"),
        ("_x_", "x"),
        ("日本語", None),
        ("", None),
        ("...", None),
    ],
)
def test_local_names(mcp_name, local):
    assert local_name(mcp_name) == local


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (None, "the input schema is not an object"),
        ([], "the input schema is not an object"),
        ({"type": "string"}, "the input schema's type is not 'object'"),
        ({"properties": {}}, "the input schema's type is not 'object'"),
        (
            {"type": "object", "properties": {"a": {"type": 5}}},
            "the input schema is not valid JSON Schema: 5 is not valid under any of the given "
            "schemas",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://x/y"}}},
            "the input schema refers outside itself ('https://x/y')",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/B"}}},
            "the input schema's $ref '#/$defs/B' does not resolve",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "#anchor"}}},
            "the input schema's $ref '#anchor' does not resolve",
        ),
        (
            {"type": "object", "description": "x" * 40_000},
            "the input schema is over 32000 characters",
        ),
    ],
)
def test_schemas_refused(schema, why):
    with pytest.raises(ValueError) as caught:
        check_schema(schema)
    assert str(caught.value) == why


def test_schemas_taken():
    nested = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#"}},
        "$defs": {"A": {"type": "object", "properties": {"x~/y": {"type": "string"}}}},
    }
    assert check_schema(nested) is nested
    assert check_schema(OBJECT) is OBJECT


def test_the_catalog_keeps_order_maps_names_and_reads_the_read_only_hint():
    found = catalog(
        "srv",
        [
            {"name": "read", "inputSchema": OBJECT, "annotations": {"readOnlyHint": True}},
            {"name": "write", "inputSchema": OBJECT, "annotations": {"destructiveHint": False}},
            {"name": "write", "inputSchema": OBJECT},
            {"name": "odd-name", "description": "  does it  ", "inputSchema": OBJECT},
            {"name": "liar", "inputSchema": OBJECT, "annotations": {"readOnlyHint": "true"}},
            {"name": "x" * 70, "inputSchema": OBJECT},
        ],
    )
    assert [(t.name, t.mcp_name, t.policy) for t in found.tools] == [
        ("srv.read", "read", Policy.AUTO),
        ("srv.write", "write", Policy.APPROVE),
        ("srv.odd_name", "odd-name", Policy.APPROVE),
        ("srv.liar", "liar", Policy.APPROVE),
    ]
    assert found.tools[2].description == "[MCP server srv] does it"
    assert found.skipped == (
        ("write", "another tool of the server is also named 'srv.write'"),
        ("x" * 70, "the name is too long"),
    )


def test_the_catalog_takes_at_most_max_tools():
    found = catalog("s", [{"name": f"t{i}", "inputSchema": OBJECT} for i in range(MAX_TOOLS + 2)])
    assert len(found.tools) == MAX_TOOLS
    assert found.skipped[-1] == (f"t{MAX_TOOLS + 1}", f"more than {MAX_TOOLS} tools")


@pytest.mark.parametrize(
    ("failures", "delay"), [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (50, 60.0)]
)
def test_backoff_doubles_up_to_its_maximum(failures, delay):
    assert backoff_delay(failures, 1.0, 60.0) == delay


def test_results_become_text_structured_content_and_described_blocks():
    data = result_data(
        {
            "content": [
                {"type": "text", "text": "one"},
                {"type": "image", "mimeType": "image/png", "data": "AAAA"},
                {"type": "resource", "resource": {"uri": "file:///a", "text": "two"}},
                {"type": "resource_link", "uri": "file:///b", "name": "b"},
            ],
            "structuredContent": {"n": 1},
        }
    )
    assert data == {
        "text": "one\n\ntwo",
        "structured": {"n": 1},
        "content": [
            {"type": "image", "mimeType": "image/png", "bytes": 3},
            {"type": "resource_link", "uri": "file:///b", "name": "b"},
        ],
    }
    same = result_data(
        {"content": [{"type": "text", "text": '{"n": 1}'}], "structuredContent": {"n": 1}}
    )
    assert same == {"structured": {"n": 1}}


@pytest.mark.parametrize("text", ["a" * 5000, '"\\' * 3000, "é" * 4000])
def test_cap_keeps_a_result_within_its_limit(text):
    cut = cap({"text": text, "structured": {"big": text}}, 500)
    assert cut["truncated"] is True
    assert cut["text"].endswith("… [truncated]")
    assert len(json.dumps(cut, separators=(",", ":"), ensure_ascii=False)) <= 500
    assert "structured" not in cut
    assert cap({"text": "short"}, 500) == {"text": "short"}


@pytest.mark.parametrize(
    ("metadata", "servers"),
    [
        ({}, None),
        ({"mcp": {}}, None),
        ({"mcp": {"servers": ["a", "b"]}}, frozenset({"a", "b"})),
        ({"mcp": {"servers": []}}, frozenset()),
        ({"mcp": {"servers": "a"}}, frozenset()),
        ({"mcp": {"servers": [1]}}, frozenset()),
        ({"mcp": "a"}, frozenset()),
    ],
)
def test_a_sessions_metadata_narrows_its_servers(metadata, servers):
    assert session_servers(metadata) == servers
