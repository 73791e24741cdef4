"""What a server's ``tools/list`` becomes in the registry: names, schemas, descriptions,
policies. Pure functions; a server is not trusted, so everything it says is checked here.

* **Names.** A tool joins as ``<server>.<tool>``. An MCP tool name may hold characters a tool
  name cannot (``get-weather``, ``a.b``, ``../x``, spaces, non-ASCII): each run of characters
  other than ASCII letters and digits becomes one ``_``, leading and trailing ones go. A name
  that is then empty, too long for a model's function name, or equal to another tool's of the
  same server is left out (logged), never renamed into something else.
* **Schemas.** A tool's ``inputSchema`` must be a JSON object schema (``type: object``), at
  most ``MAX_SCHEMA_CHARS`` as JSON and ``MAX_SCHEMA_DEPTH`` deep, valid by the JSON Schema
  meta-schema, with every ``$ref`` local (``#...``) and resolvable: a model server refuses a
  request whose schema is not, which would fail every turn that carries it. A tool whose
  schema does not pass is left out.
* **Descriptions** are cut to ``MAX_DESCRIPTION_CHARS`` and say which server the tool is from.
* **Policies.** ``readOnlyHint: true`` is ``AUTO``; anything else ``APPROVE``. These are the
  server's own words: ``[policies]`` overrides them (``"time.*" = "AUTO"``).
* **Count.** At most ``MAX_TOOLS`` tools per server; the rest are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from turnstile.runtime.codec import check_json_depth
from turnstile.runtime.errors import DecodeError
from turnstile.tools.policy import Policy
from turnstile.tools.spec import FUNCTION_NAME, function_name

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_SCHEMA_CHARS",
    "MAX_SCHEMA_DEPTH",
    "MAX_TOOLS",
    "Catalog",
    "McpTool",
    "catalog",
    "check_schema",
    "local_name",
]

MAX_SCHEMA_CHARS = 32_000
MAX_SCHEMA_DEPTH = 32
MAX_DESCRIPTION_CHARS = 1_000
MAX_TOOLS = 128

_NOT_NAME = re.compile(r"[^A-Za-z0-9]+")


def local_name(mcp_name: str) -> str | None:
    """The action part of a tool's name for an MCP tool name, or None if nothing is left.

    >>> local_name("get-weather"), local_name("../x"), local_name("日本")
    ('get_weather', 'x', None)
    """
    name = _NOT_NAME.sub("_", mcp_name).strip("_")
    return name or None


def check_schema(schema: Any) -> dict[str, Any]:
    """``schema`` if it is fit to be shown to a model as a tool's parameters.

    Raises:
        ValueError: it is not; the message says why.
    """
    if not isinstance(schema, dict):
        raise ValueError("the input schema is not an object")
    if schema.get("type") != "object":
        raise ValueError("the input schema's type is not 'object'")
    try:
        text = msgspec.json.encode(schema)
    except (TypeError, OverflowError, RecursionError):
        raise ValueError("the input schema is not JSON") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise ValueError(f"the input schema is over {MAX_SCHEMA_CHARS} characters")
    try:
        check_json_depth(text, MAX_SCHEMA_DEPTH)
    except DecodeError:
        raise ValueError(f"the input schema is nested over {MAX_SCHEMA_DEPTH} levels") from None
    import jsonschema  # only with MCP servers (~0.04 s of every node's start otherwise)

    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"the input schema is not valid JSON Schema: {exc.message}") from None
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise ValueError(f"the input schema refers outside itself ({ref[:100]!r})")
        try:
            _resolve(schema, ref)
        except LookupError:
            raise ValueError(f"the input schema's $ref {ref[:100]!r} does not resolve") from None
    return schema


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _resolve(schema: dict[str, Any], ref: str) -> Any:
    """The node a local ``$ref`` (``#/$defs/X``) points at; LookupError if none."""
    node: Any = schema
    path = ref[1:]
    if not path:
        return node
    if not path.startswith("/"):
        raise LookupError(ref)  # an anchor (#name): not resolved by model servers either
    for part in path[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise LookupError(ref)
    return node


@dataclass(frozen=True)
class McpTool:
    """One of a server's tools as it joins the registry.

    Attributes:
        name: the registry's name, ``<server>.<local name>``.
        mcp_name: the name the server knows it by.
        description: what a model is shown.
        schema: its input schema (checked).
        policy: its default policy (from the server's annotations).
    """

    name: str
    mcp_name: str
    description: str
    schema: dict[str, Any]
    policy: Policy


@dataclass(frozen=True)
class Catalog:
    """A server's tools as the registry takes them, and those left out with the reason."""

    tools: tuple[McpTool, ...]
    skipped: tuple[tuple[str, str], ...]


def catalog(server: str, listed: Iterable[Mapping[str, Any]]) -> Catalog:
    """The tools of ``server`` fit to join the registry, from its ``tools/list`` answer.

    Args:
        server: the server's name in the config.
        listed: each tool as the server described it (``name``, ``description``,
            ``inputSchema``, ``annotations``), in its order.
    """
    tools: list[McpTool] = []
    skipped: list[tuple[str, str]] = []
    taken: set[str] = set()
    for entry in listed:
        mcp_name = str(entry.get("name", ""))
        shown = mcp_name[:100]
        if len(tools) >= MAX_TOOLS:
            skipped.append((shown, f"more than {MAX_TOOLS} tools"))
            continue
        local = local_name(mcp_name)
        if local is None:
            skipped.append((shown, "no usable characters in the name"))
            continue
        name = f"{server}.{local}"
        if not FUNCTION_NAME.fullmatch(function_name(name)):
            skipped.append((shown, "the name is too long"))
            continue
        if name in taken:
            skipped.append((shown, f"another tool of the server is also named {name!r}"))
            continue
        try:
            schema = check_schema(entry.get("inputSchema"))
        except ValueError as exc:
            skipped.append((shown, str(exc)))
            continue
        annotations = entry.get("annotations") or {}
        read_only = isinstance(annotations, Mapping) and annotations.get("readOnlyHint") is True
        text = str(entry.get("description") or "").strip()
        if len(text) > MAX_DESCRIPTION_CHARS:
            text = text[: MAX_DESCRIPTION_CHARS - 1] + "…"
        description = f"[MCP server {server}] {text}" if text else f"[MCP server {server}]"
        taken.add(name)
        tools.append(
            McpTool(
                name=name,
                mcp_name=mcp_name,
                description=description,
                schema=schema,
                policy=Policy.AUTO if read_only else Policy.APPROVE,
            )
        )
    return Catalog(tuple(tools), tuple(skipped))
