"""The memory feature's HTTP endpoints; always the caller's own data.

============================================  =================================================
``GET /memory/facts``                         a page: ``limit``, ``offset``, ``search``,
                                              ``sort_by``, ``sort_order``; ``all_users=true``
                                              for holders of ``memory.read_all`` (else 403)
``PUT /memory/facts``                         upsert one fact (JSON body, as ``memory.save``;
                                              ``source`` defaults to ``user_explicit``)
``DELETE /memory/facts?key=…&category=…``     forget by key (optionally in one category);
                                              404 when nothing matched
``GET /memory/summary``                       the caller's summary (``null`` when none)
``PUT /memory/summary``                       replace it: ``{"content": "…"}``
``DELETE /memory``                            everything memory holds about the caller:
                                              facts, summary, their sessions' extraction state
============================================  =================================================

Delete takes the key and category as query parameters, not path segments: path parameters
must follow the gateway's id rule, and keys and categories may hold spaces, slashes or any
printable character; a query string carries them percent-encoded, and a body on ``DELETE`` is
something many clients and proxies drop.

There is no error type for "forbidden" in ``runtime/errors.py`` (the gateway maps its errors
to 400, 401, 404, 408, 409 and 429), so the 403 for ``all_users`` without the permission is
answered here, in the same ``{"error": {...}}`` shape.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from starlette.responses import Response

from turnstile.actors.feature import NodeContext
from turnstile.actors.memory.service import Memory
from turnstile.actors.memory.tools import (
    Category,
    Confidence,
    ExpiresDays,
    FactKey,
    Limit,
    SortKey,
    Source,
    SourceContext,
    Value,
    fact_view,
)
from turnstile.runtime.codec import Codec
from turnstile.runtime.errors import DecodeError, NotFound
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute

__all__ = ["memory_routes"]


class FactBody(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /memory/facts``: a person writing their own memory, hence ``user_explicit``."""

    category: Category
    key: FactKey
    value: Value
    source: Source = "user_explicit"
    confidence: Confidence | None = None
    expires_days: ExpiresDays | None = None
    source_context: SourceContext | None = None


class SummaryBody(msgspec.Struct, forbid_unknown_fields=True):
    """``PUT /memory/summary``."""

    content: Annotated[str, msgspec.Meta(max_length=64_000)]


class FactsQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``GET /memory/facts``'s query string."""

    limit: Limit | None = None
    offset: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)] = 0
    search: Annotated[str, msgspec.Meta(max_length=500)] | None = None
    sort_by: SortKey = "category"
    sort_order: Literal["asc", "desc"] = "desc"
    all_users: bool = False


class ForgetQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``DELETE /memory/facts``'s query string."""

    key: FactKey
    category: Category | None = None


_FACT = Codec(FactBody, max_depth=4)
_SUMMARY = Codec(SummaryBody, max_depth=4)
_AT = re.compile(r" - at `\$\.?(?P<field>[^`]*)`$")


def _query(request: ApiRequest, type_: type[msgspec.Struct]) -> Any:
    """The query string as ``type_`` (strings converted: ``limit=5``, ``all_users=true``).

    Raises:
        DecodeError: an unknown parameter or a bad value; ``field`` names it.
    """
    try:
        return msgspec.convert(dict(request.query), type_, strict=False)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _AT.search(text)
        if text.startswith("Object contains unknown field"):
            name = text.split("`")[1]
            raise DecodeError("unknown query parameter", field=name) from None
        if text.startswith("Object missing required field"):
            name = text.split("`")[1]
            raise DecodeError("missing query parameter", field=name) from None
        field = match["field"] if match else None
        message = text[: match.start()] if match else text
        raise DecodeError(message[:1].lower() + message[1:], field=field) from None


def _forbidden(message: str, field: str) -> Response:
    body = {"error": {"code": "forbidden", "message": message, "field": field}}
    return Response(msgspec.json.encode(body), 403, media_type="application/json")


def memory_routes(node: NodeContext, memory: Memory) -> list[HttpRoute]:
    """The endpoints over ``memory``; every one acts on the caller's (``request.user``) data."""

    async def list_facts(request: ApiRequest) -> Any:
        q = _query(request, FactsQuery)
        if q.all_users and not memory.is_admin(request.user):
            return _forbidden("all_users needs the memory.read_all permission", "all_users")
        facts, total = await memory.list_facts(
            None if q.all_users else request.user,
            limit=q.limit,
            offset=q.offset,
            search=q.search,
            sort_by=q.sort_by,
            sort_order=q.sort_order,
        )
        views = [msgspec.to_builtins(f) if q.all_users else fact_view(f) for f in facts]
        return {"facts": views, "total": total, "offset": q.offset}

    async def put_fact(request: ApiRequest) -> Any:
        body = await request.body(_FACT)
        fact = await memory.save(
            request.user,
            category=body.category,
            key=body.key,
            value=body.value,
            source=body.source,
            confidence=body.confidence,
            expires_days=body.expires_days,
            source_context=body.source_context,
        )
        return {"fact": fact_view(fact)}

    async def delete_fact(request: ApiRequest) -> Any:
        q = _query(request, ForgetQuery)
        deleted = await memory.forget(request.user, q.key, q.category)
        if not deleted:
            where = "" if q.category is None else f" in category {q.category!r}"
            raise NotFound(f"no fact with key {q.key!r}{where}")
        return {"deleted": deleted}

    async def get_summary(request: ApiRequest) -> Any:
        summary = await memory.get_summary(request.user)
        if summary is None:
            return {"summary": None, "updated_at": None}
        return {"summary": summary.content, "updated_at": summary.updated_at}

    async def put_summary(request: ApiRequest) -> Any:
        body = await request.body(_SUMMARY)
        summary = await memory.set_summary(request.user, body.content)
        return {"summary": summary.content, "updated_at": summary.updated_at}

    async def delete_all(request: ApiRequest) -> Any:
        return {"deleted": await memory.delete_user(request.user)}

    return [
        HttpRoute("DELETE", "/memory", delete_all),
        HttpRoute("GET", "/memory/facts", list_facts),
        HttpRoute("PUT", "/memory/facts", put_fact),
        HttpRoute("DELETE", "/memory/facts", delete_fact),
        HttpRoute("GET", "/memory/summary", get_summary),
        HttpRoute("PUT", "/memory/summary", put_summary),
    ]
