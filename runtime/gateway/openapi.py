"""The OpenAPI 3.1 document of a node's HTTP API, generated from its routes.

Nothing here is written by hand: every operation comes from an ``HttpRoute`` (the features'
routes and the gateway's own) and every schema from the msgspec types the route names, through
``msgspec.json.schema_components`` (shared types under ``#/components/schemas``). What the
gateway itself does to every request is added the same way for every route: path parameters
follow the id rule (else ``400``), a bearer route answers ``401`` without a token, a route with
a body or a query string answers ``400`` for a malformed one and ``408`` for a body too slow.
Error answers share one schema, ``ErrorAnswer``.

Security: ``bearer`` (``Authorization: Bearer <token>``) on every route but the ``signature``
ones (webhook receivers, whose headers carry a signature over the body instead, listed as
their parameters) and the ``public`` ones (probes, the console's files), which need nothing.

The module names no feature: a feature describes its own routes where it declares them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from turnstile.runtime.gateway.frames import SESSION_ID_PATTERN
from turnstile.runtime.gateway.routes import ErrorAnswer, HttpRoute, Param, Reply

__all__ = ["OPENAPI_VERSION", "UndescribedRoute", "openapi_document"]

#: The OpenAPI version of the document.
OPENAPI_VERSION = "3.1.0"

_REF = "#/components/schemas/{name}"
_PARAM = re.compile(r"{([^}:]+)(?::[^}]*)?}")
_STATUS_TEXT = {
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    304: "Not Modified",
    400: "Bad input: malformed JSON, an unknown or missing field, a value out of bounds "
    "(`field` names it)",
    401: "No token, an unknown token, or (signed routes) a bad signature",
    403: "Not allowed for this user",
    404: "Not found, or not yours",
    408: "The request body did not arrive in time",
    409: "Busy, or a conflict with the current state",
    413: "The body is larger than the limit",
    421: "Several nodes: another node holds the session; `node` and `node_address` name it",
    429: "A limit was reached",
    503: "Unavailable",
}


class UndescribedRoute(ValueError):
    """A route lacks what the document needs (a summary, a described success answer)."""


def openapi_document(
    routes: Sequence[HttpRoute],
    *,
    title: str,
    version: str,
    description: str = "",
    strict: bool = False,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document describing ``routes``.

    Args:
        routes: every HTTP route the app mounts, in mounting order.
        title: the API's name.
        version: the API's version (the package's).
        description: the document's introduction (Markdown).
        strict: raise for a route that does not describe itself; otherwise such a route is
            documented as answering any JSON.

    Raises:
        UndescribedRoute: with ``strict``, a route without a summary or a described success
            answer (the message names it).
        ValueError: two routes with one method and path.
    """
    types: list[Any] = [ErrorAnswer]
    for route in routes:
        if strict:
            _check_described(route)
        types.extend(_types_of(route))
    unique = list(dict.fromkeys(types))
    schemas, components = msgspec.json.schema_components(unique, ref_template=_REF)
    schema_of = dict(zip(unique, schemas, strict=True))
    queries = {route.query for route in routes if route.query is not None}
    query_names = {q.__name__ for q in queries}

    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        path = _PARAM.sub(lambda m: "{" + m[1] + "}", route.path)
        method = route.method.lower()
        operations = paths.setdefault(path, {})
        if method in operations:
            raise ValueError(f"two routes for {route.method} {route.path}")
        operations[method] = _operation(route, path, schema_of, components)

    for name in query_names:  # inlined as parameters; not schemas of their own
        if not _referenced(name, paths, components):
            components.pop(name, None)
    document = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A user's token (`[[users]]` in the config, or the dev "
                    "token). Browsers that cannot set the header may send `?token=`.",
                }
            },
        },
        "security": [{"bearer": []}],
    }
    return _ecma_patterns(document)


def _check_described(route: HttpRoute) -> None:
    where = f"{route.method} {route.path}"
    if not route.summary:
        raise UndescribedRoute(f"route {where} has no summary")
    if route.response is None and route.status != 204 and route.status not in route.responses:
        raise UndescribedRoute(
            f"route {where} does not describe its {route.status} answer (response=)"
        )


def _reply(value: Reply | Any) -> Reply:
    return value if isinstance(value, Reply) else Reply(value)


def _types_of(route: HttpRoute) -> Iterable[Any]:
    for value in (route.body, route.response, route.query):
        if value is not None:
            yield value
    for reply in route.responses.values():
        reply = _reply(reply)
        if reply.type is not None and reply.media_type == "application/json":
            yield reply.type
        yield from (header.type for header in reply.headers)
    yield from (header.type for header in route.headers)


def _operation(
    route: HttpRoute, path: str, schema_of: dict[Any, Any], components: dict[str, Any]
) -> dict[str, Any]:
    parameters = [_path_parameter(name) for name in _PARAM.findall(route.path)]
    if route.query is not None:
        component = components[route.query.__name__]
        required = set(component.get("required", ()))
        for name, schema in component.get("properties", {}).items():
            parameter = {"name": name, "in": "query", "required": name in required}
            if "description" in schema:
                parameter["description"] = schema["description"]
            parameter["schema"] = schema
            parameters.append(parameter)
    for header in route.headers:
        parameters.append(_header_parameter(header, schema_of))

    responses: dict[str, Any] = {}
    if route.status not in route.responses:
        success = Reply(route.response) if route.response is not None else Reply()
        if route.response is None and route.status != 204:
            success = Reply(Any, "Any JSON (this route does not describe its answer)")
        responses[str(route.status)] = _response(route.status, success, schema_of)
    for status, reply in sorted(route.responses.items()):
        responses[str(status)] = _response(status, _reply(reply), schema_of)
    for status in sorted(_errors(route)):
        if str(status) not in responses:
            responses[str(status)] = _response(status, Reply(ErrorAnswer), schema_of)

    operation: dict[str, Any] = {
        "operationId": _operation_id(route.method, path),
        "summary": route.summary or f"{route.method} {route.path}",
    }
    if route.description:
        operation["description"] = route.description
    if parameters:
        operation["parameters"] = parameters
    if route.body is not None:
        body_schema = schema_of[route.body]
        operation["requestBody"] = {
            "required": _body_required(body_schema, components),
            "content": {"application/json": {"schema": body_schema}},
        }
    operation["responses"] = dict(sorted(responses.items()))
    if route.auth != "bearer":
        operation["security"] = []
    return operation


def _errors(route: HttpRoute) -> set[int]:
    """The error statuses of ``route``: its own, and those the gateway gives it."""
    errors = set(route.errors)
    if route.auth == "bearer":
        errors.add(401)
    if _PARAM.search(route.path) or route.query is not None or route.body is not None:
        errors.add(400)
    if any(header.required for header in route.headers):
        errors.add(400 if route.auth != "signature" else 401)
    if route.body is not None:
        errors.add(408)
    return errors


def _path_parameter(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": 128,
            "pattern": SESSION_ID_PATTERN,
        },
    }


def _header_parameter(header: Param, schema_of: dict[Any, Any]) -> dict[str, Any]:
    parameter: dict[str, Any] = {"name": header.name, "in": "header", "required": header.required}
    if header.description:
        parameter["description"] = header.description
    parameter["schema"] = schema_of[header.type]
    return parameter


def _response(status: int, reply: Reply, schema_of: dict[Any, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": reply.description or _STATUS_TEXT.get(status, "")}
    if reply.headers:
        answer["headers"] = {
            h.name: {"required": h.required, "schema": schema_of[h.type]}
            | ({"description": h.description} if h.description else {})
            for h in reply.headers
        }
    if reply.type is None:
        return answer
    if reply.media_type != "application/json":
        types = (reply.media_type,) if isinstance(reply.media_type, str) else reply.media_type
        answer["content"] = {media: {"schema": {"type": "string"}} for media in types}
    elif reply.type is Any:
        answer["content"] = {"application/json": {"schema": {}}}
    else:
        answer["content"] = {"application/json": {"schema": schema_of[reply.type]}}
    return answer


def _body_required(schema: dict[str, Any], components: dict[str, Any]) -> bool:
    """Whether a body must be sent: an empty body reads as ``{}``, so only a body type with
    required fields needs one."""
    ref = schema.get("$ref", "")
    target = components.get(ref.rpartition("/")[2], schema) if ref else schema
    return bool(target.get("required"))


def _operation_id(method: str, path: str) -> str:
    words = re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_") or "root"
    return f"{method.lower()}_{words}"


def _referenced(name: str, *trees: Any) -> bool:
    needle = _REF.format(name=name)

    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            return any(v == needle or walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return False

    return any(walk(tree) for tree in trees)


def _ecma_patterns(schema: dict[str, Any]) -> dict[str, Any]:
    """Patterns as JSON Schema reads them (ECMA-262): msgspec keeps Python's ``\\A`` / ``\\Z``
    anchors, which other regex engines do not know; ``^`` / ``$`` mean the same there."""

    def walk(node: object) -> object:
        if isinstance(node, dict):
            return _ecma_patterns(node)
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "pattern" and isinstance(value, str):
            value = re.sub(r"^\\A", "^", value)
            value = re.sub(r"\\Z$", "$", value)
        out[key] = walk(value)
    return out
