"""The API document the gateway generates from ``HttpRoute``s: what each route declares (its
body, query, headers, answers and errors) becomes an OpenAPI 3.1 operation, with what the
gateway does to every request added (the id rule, 400/401/408), schemas shared under
``#/components/schemas`` and patterns a non-Python validator reads. Served at
``/openapi.json`` with the gateway's own routes in it."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import jsonschema
import msgspec
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31

from turnstile.runtime.gateway import Auth, ConnectionLimits, HttpRoute, build_app
from turnstile.runtime.gateway.openapi import UndescribedRoute, openapi_document
from turnstile.runtime.gateway.routes import Param, Reply, decode_query

TOKEN = "a-token-0123456789abcdef"


class Note(msgspec.Struct, forbid_unknown_fields=True):
    """A note to keep."""

    text: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    tags: list[str] = []


class Kept(msgspec.Struct):
    """A note as kept."""

    id: str
    note: Note


class NotesQuery(msgspec.Struct, forbid_unknown_fields=True):
    """How many notes, from where."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=50, description="at most this many")] = 10
    tag: str | None = None


class Notes(msgspec.Struct):
    notes: list[Kept]


async def _handler(request):
    return {"id": "n1", "note": {"text": "hi", "tags": []}}


ROUTES = [
    HttpRoute(
        "POST",
        "/books/{book}/notes",
        _handler,
        status=201,
        summary="Keep a note",
        body=Note,
        response=Kept,
        headers=(Param("Idempotency-Key", description="once only"),),
        errors=(404, 429),
    ),
    HttpRoute(
        "GET",
        "/notes",
        _handler,
        summary="List notes",
        query=NotesQuery,
        response=Notes,
    ),
    HttpRoute(
        "POST",
        "/hooks/in",
        _handler,
        status=202,
        auth="signature",
        summary="A signed delivery",
        body=dict[str, Any],
        headers=(Param("X-Signature", required=True),),
        responses={202: Reply(None, "Taken"), 200: Reply(Kept, "Seen before")},
        errors=(413,),
    ),
    HttpRoute("DELETE", "/notes/{id}", _handler, status=204, summary="Forget a note"),
    HttpRoute("GET", "/page", _handler, auth="public", summary="A page", response=str),
]


def document() -> dict[str, Any]:
    return openapi_document(ROUTES, title="Test", version="1.2.3", strict=True)


def test_the_document_is_openapi_3_1_and_its_schemas_are_json_schema_2020_12():
    doc = document()
    assert doc["openapi"] == "3.1.0"
    assert doc["info"] == {"title": "Test", "version": "1.2.3", "description": ""}
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_an_operation_carries_its_body_answers_headers_and_every_error_it_can_give():
    post = document()["paths"]["/books/{book}/notes"]["post"]
    assert post["operationId"] == "post_books_book_notes"
    assert post["summary"] == "Keep a note"
    assert post["requestBody"] == {
        "required": True,  # ``text`` is required
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Note"}}},
    }
    book, key = post["parameters"]
    assert book == {
        "name": "book",
        "in": "path",
        "required": True,
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": 128,
            "pattern": "^[A-Za-z0-9_.:-]{1,128}$",  # the id rule, as ECMA-262 reads it
        },
    }
    assert key == {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "description": "once only",
        "schema": {"type": "string"},
    }
    # its own (404, 429), the gateway's (400 path/body, 401 token, 408 slow body), success
    assert sorted(post["responses"]) == ["201", "400", "401", "404", "408", "429"]
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorAnswer"}}}
    assert post["responses"]["404"]["content"] == error
    assert "security" not in post  # the document's default: bearer


def test_a_query_struct_becomes_one_parameter_per_field_with_its_limits():
    get = document()["paths"]["/notes"]["get"]
    assert get["parameters"] == [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": "at most this many",
            "schema": {
                "description": "at most this many",
                "type": "integer",
                "minimum": 1,
                "maximum": 50,
                "default": 10,
            },
        },
        {
            "name": "tag",
            "in": "query",
            "required": False,
            "schema": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
    ]
    assert "NotesQuery" not in document()["components"]["schemas"]  # inlined, not a schema
    assert sorted(get["responses"]) == ["200", "400", "401"]


def test_signed_and_public_routes_need_no_bearer_token_and_say_so():
    doc = document()
    assert doc["security"] == [{"bearer": []}]
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    hook = doc["paths"]["/hooks/in"]["post"]
    assert hook["security"] == []
    assert hook["parameters"][0]["name"] == "X-Signature" and hook["parameters"][0]["required"]
    assert sorted(hook["responses"]) == ["200", "202", "400", "401", "408", "413"]
    assert "content" not in hook["responses"]["202"]  # Reply(None): no body
    page = doc["paths"]["/page"]["get"]
    assert page["security"] == [] and sorted(page["responses"]) == ["200"]


def test_a_204_route_has_no_body_and_an_undescribed_route_fails_strict_generation():
    gone = document()["paths"]["/notes/{id}"]["delete"]["responses"]
    assert gone["204"] == {"description": "No Content"}
    bare = HttpRoute("GET", "/bare", _handler)
    with pytest.raises(UndescribedRoute, match=r"^route GET /bare has no summary$"):
        openapi_document([bare], title="T", version="1", strict=True)
    said = HttpRoute("GET", "/bare", _handler, summary="Bare")
    with pytest.raises(UndescribedRoute, match=r"does not describe its 200 answer"):
        openapi_document([said], title="T", version="1", strict=True)
    loose = openapi_document([bare], title="T", version="1")  # documented as any JSON
    assert loose["paths"]["/bare"]["get"]["responses"]["200"]["content"] == {
        "application/json": {"schema": {}}
    }
    with pytest.raises(ValueError, match=r"^two routes for GET /bare$"):
        openapi_document([said, said], title="T", version="1")


def test_a_route_refuses_a_query_that_is_not_a_struct_and_errors_that_are_not_errors():
    with pytest.raises(ValueError, match="route query must be a msgspec Struct type"):
        HttpRoute("GET", "/x", _handler, query=dict[str, str])
    with pytest.raises(ValueError, match="route errors must be 4xx or 5xx statuses"):
        HttpRoute("GET", "/x", _handler, errors=(200,))


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ({"limit": "x"}, "limit", "expected `int`, got `str`"),
        ({"limit": "51"}, "limit", "expected `int` <= 50"),
        ({"what": "1"}, "what", "unknown query parameter 'what'"),
    ],
)
def test_decode_query_names_the_parameter_at_fault(query, field, message):
    from turnstile.runtime.errors import DecodeError

    with pytest.raises(DecodeError) as caught:
        decode_query(query, NotesQuery)
    assert (caught.value.field, str(caught.value)) == (field, message)
    assert decode_query({"limit": "5", "tag": "a"}, NotesQuery) == NotesQuery(5, "a")


async def test_the_gateway_serves_the_document_with_its_own_routes_and_no_token():
    app = build_app(
        backend=None,
        routes=ROUTES,
        auth=Auth({TOKEN: "ada"}),
        limits=ConnectionLimits(),
        version="9.9.9",
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://n") as c:
        answer = await c.get("/openapi.json")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    doc = answer.json()
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)
    assert doc["info"]["version"] == "9.9.9"
    assert {"/healthz", "/metrics", "/openapi.json", "/notes", "/page"} <= set(doc["paths"])
    health = doc["paths"]["/healthz"]["get"]
    assert health["security"] == [] and sorted(health["responses"]) == ["200"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]


async def test_the_token_query_parameter_is_the_gateways_not_the_routes():
    """A browser's ``?token=`` authenticates; a route that refuses unknown parameters does not
    see it (it was refused as one before)."""

    async def notes(request):
        return msgspec.structs.asdict(decode_query(request.query, NotesQuery))

    app = build_app(
        backend=None,
        routes=[HttpRoute("GET", "/notes", notes, summary="Notes", query=NotesQuery)],
        auth=Auth({TOKEN: "ada"}),
        limits=ConnectionLimits(),
        version="1",
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://n") as c:
        answer = await c.get("/notes", params={"token": TOKEN, "limit": "3"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"limit": 3, "tag": None}
