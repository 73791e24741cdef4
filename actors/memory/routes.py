"""The memory feature's HTTP endpoints; always the caller's own data.

============================================  =================================================
``GET /memory/facts``                         a page: ``limit``, ``offset``, ``search``,
                                              ``category``, ``sort_by``, ``sort_order``;
                                              ``all_users=true`` for holders of
                                              ``memory.read_all`` (else 403)
``GET /memory/search?query=…&limit=…``        the caller's facts best first, as
                                              ``memory.search`` (by meaning, then by words)
``PUT /memory/facts``                         upsert one fact (JSON body, as ``memory.save``;
                                              ``source`` defaults to ``user_explicit``)
``DELETE /memory/facts?key=…&category=…``     forget by key (optionally in one category);
                                              404 when nothing matched
``GET /memory/summary``                       the caller's summary (``null`` when none)
``PUT /memory/summary``                       replace it: ``{"content": "…"}``
``GET /memory/extraction``                    the caller's sessions with their extraction
                                              state (``due`` or not), by name: ``limit``,
                                              ``after``, ``due``; ``all_users=true`` as above
``GET /memory/changes?after_seq=…``          the caller's change log after ``after_seq``
                                              (the ``memory`` topic's events, as WebSocket
                                              frames), ``reset`` when it no longer holds them
``DELETE /memory``                            everything memory holds about the caller:
                                              facts, summary, their sessions' extraction state
============================================  =================================================

Delete takes the key and category as query parameters, not path segments: path parameters
must follow the gateway's id rule, and keys and categories may hold spaces, slashes or any
printable character; a query string carries them percent-encoded, and a body on ``DELETE`` is
something many clients and proxies drop.

``all_users`` without the permission raises ``Forbidden`` (the gateway's 403).

Search over HTTP is the owner's own only: the vector and lexical stages take one owner, and
what an admin needs across users is the list (``all_users=true`` with ``search``).

Each route describes itself for the API document (``/openapi.json``): the query Structs are
the ones ``_query`` decodes; the answer Structs below describe the dicts the handlers build
(checked against live answers by the schemathesis run, ``tests/e2e/test_api_contract.py``).

It is over 400 lines because the memory API's routes (facts, search, summary, extraction state,
changes, deletion) share their request and response Structs, which the OpenAPI document is
generated from; splitting them would scatter those types.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from turnstile.actors.feature import NodeContext
from turnstile.actors.memory.changes import TOPIC
from turnstile.actors.memory.extraction import Extractor
from turnstile.actors.memory.service import Memory
from turnstile.actors.memory.settings import MemoryConfig
from turnstile.actors.memory.state_queries import SessionState
from turnstile.actors.memory.tools import (
    Category,
    Confidence,
    ExpiresDays,
    FactKey,
    Limit,
    Query,
    SortKey,
    Source,
    SourceContext,
    Value,
    fact_view,
)
from turnstile.actors.sessions.ids import public_id, session_key
from turnstile.runtime.codec import Codec
from turnstile.runtime.errors import DecodeError, Forbidden, NotFound
from turnstile.runtime.gateway.frames import MAX_SEQ, SESSION_ID_PATTERN, encode_topic_event
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute, decode_query

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
    category: Category | None = None
    sort_by: SortKey = "category"
    sort_order: Literal["asc", "desc"] = "desc"
    all_users: bool = False


class SearchQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``GET /memory/search``'s query string."""

    query: Query
    limit: Limit | None = None


#: A session key as a cursor: ``<owner>/<name>`` (users' names hold no ``/``).
_KEY_PATTERN = r"\A[^/\x00-\x1f\x7f]{1,128}/" + SESSION_ID_PATTERN.removeprefix(r"\A")


class ExtractionQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``GET /memory/extraction``'s query string. ``after`` is a session name, or with
    ``all_users`` a session key (``owner/name``, as ``next_after`` gives it)."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    after: Annotated[str, msgspec.Meta(min_length=1, max_length=260)] | None = None
    due: bool | None = None
    all_users: bool = False


class ChangesQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``GET /memory/changes``'s query string."""

    after_seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 500


class ForgetQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``DELETE /memory/facts``'s query string."""

    key: FactKey
    category: Category | None = None


class FactView(msgspec.Struct, kw_only=True):
    """A fact. ``owner`` only in an admin's ``all_users`` list.

    Attributes:
        source: how it was learnt: ``conversation``, ``tool_call``, ``auto_discovery`` or
            ``user_explicit``.
        confidence: 0-100.
        last_verified_at: when it was last stated or confirmed.
        expires_at: after this it is never returned (null: never).
        source_context: where it came from, in a few words.
    """

    owner: str | msgspec.UnsetType = msgspec.UNSET
    category: str
    key: str
    value: str
    source: str
    confidence: int
    created_at: datetime
    updated_at: datetime
    last_verified_at: datetime | None
    expires_at: datetime | None
    source_context: str | None


class FactPage(msgspec.Struct):
    """``GET /memory/facts``: a page of facts, how many match in all, and the page's start."""

    facts: list[FactView]
    total: int
    offset: int


class FoundFacts(msgspec.Struct):
    """``GET /memory/search``: the caller's facts, best first."""

    facts: list[FactView]


class SavedFact(msgspec.Struct):
    """``PUT /memory/facts``: the fact as stored."""

    fact: FactView


class Forgotten(msgspec.Struct):
    """``DELETE /memory/facts``: how many facts were forgotten."""

    deleted: int


class SummaryView(msgspec.Struct):
    """The caller's summary; both null when there is none."""

    summary: str | None
    updated_at: datetime | None


class ExtractionSession(msgspec.Struct, kw_only=True):
    """A session as extraction sees it. ``owner`` only with ``all_users``.

    Attributes:
        state: ``extracted`` (nothing new since), ``due`` (the next sweep takes it) or
            ``waiting`` (active lately; due at ``due_at``).
    """

    id: str
    owner: str | msgspec.UnsetType = msgspec.UNSET
    updated_at: datetime
    extracted_at: datetime | None
    state: Literal["extracted", "due", "waiting"]
    due: bool
    due_at: datetime | None


class ExtractionInfo(msgspec.Struct, kw_only=True):
    """Whether extraction runs on this node, with what timing, or (``reason``) why not."""

    enabled: bool
    stale_after_minutes: float
    interval_seconds: float
    reason: str | msgspec.UnsetType = msgspec.UNSET


class ExtractionPage(msgspec.Struct):
    """``GET /memory/extraction``: sessions, the next page's cursor (null: no more), and the
    extraction set-up."""

    sessions: list[ExtractionSession]
    next_after: str | None
    extraction: ExtractionInfo


class TopicFrame(msgspec.Struct):
    """A ``memory`` topic event as the WebSocket sends it: its type's own fields
    (``docs/protocol.md``) with these four."""

    type: str
    topic: str
    seq: int
    ts: str


class ChangePage(msgspec.Struct):
    """``GET /memory/changes``: the caller's change log after ``after_seq``, oldest first;
    ``reset`` (and no changes) when the log no longer holds them all."""

    changes: list[TopicFrame]
    last_seq: int
    pruned_seq: int
    reset: bool


class DeletedCounts(msgspec.Struct):
    """Rows deleted: facts, the summary, sessions' extraction state."""

    facts: int
    summary: int
    sessions: int


class DeletedMemory(msgspec.Struct):
    """``DELETE /memory``: what was deleted."""

    deleted: DeletedCounts


_FACT = Codec(FactBody, max_depth=4)
_SUMMARY = Codec(SummaryBody, max_depth=4)


def _query(request: ApiRequest, type_: type[msgspec.Struct]) -> Any:
    """The query string as ``type_`` (the gateway's ``decode_query``)."""
    return decode_query(request.query, type_)


def _cursor(q: ExtractionQuery, user: str) -> str | None:
    """``after`` as a session key: the caller's name turned into their key, or (all users)
    a key as given.

    Raises:
        DecodeError: not a session name (a key, with ``all_users``); ``field="after"``.
    """
    if q.after is None:
        return None
    if q.all_users:
        if re.search(_KEY_PATTERN, q.after) is None:
            raise DecodeError("after must be a session key, owner/name", field="after")
        return q.after
    if re.search(SESSION_ID_PATTERN, q.after) is None:
        raise DecodeError("after must be 1-128 characters of A-Z a-z 0-9 _ . : -", "after")
    return session_key(user, q.after)


def _session_state(
    state: SessionState, memory: Memory, cutoff: datetime, *, owner: bool
) -> dict[str, Any]:
    """One session's extraction state as the route shows it: ``extracted`` (nothing new
    since), ``due`` (the next sweep takes it) or ``waiting`` (active lately; due at
    ``due_at``). ``cutoff`` is what the query judged ``due`` against."""
    extracted = state.extracted_at is not None and state.extracted_at >= state.updated_at
    due_at = None if extracted else state.updated_at + memory.stale_after
    due = not extracted and state.updated_at < cutoff
    view: dict[str, Any] = {"id": public_id(state.key)}
    if owner:
        view["owner"] = state.owner
    view.update(
        updated_at=state.updated_at,
        extracted_at=state.extracted_at,
        state="extracted" if extracted else "due" if due else "waiting",
        due=due,
        due_at=due_at,
    )
    return view


def _extraction_info(node: NodeContext, extractor: Extractor | None) -> dict[str, Any]:
    """Whether extraction runs on this node, and with what timing (or why not)."""
    config = node.section("memory", MemoryConfig)
    info: dict[str, Any] = {
        "enabled": extractor is not None,
        "stale_after_minutes": config.stale_after_minutes,
        "interval_seconds": config.extraction_interval_seconds,
    }
    if extractor is None:
        info["reason"] = (
            "[memory] extraction = false"
            if not config.extraction
            else "no model server (a model-less agent and no [openai] base_url)"
        )
    return info


def memory_routes(
    node: NodeContext, memory: Memory, extractor: Extractor | None = None
) -> list[HttpRoute]:
    """The endpoints over ``memory``; every one acts on the caller's (``request.user``) data.

    Args:
        node: the node (its config says how extraction is set up).
        memory: the feature's service.
        extractor: the running extraction sweep, None when extraction is off.
    """

    async def list_facts(request: ApiRequest) -> Any:
        q = _query(request, FactsQuery)
        if q.all_users and not memory.is_admin(request.user):
            raise Forbidden("all_users needs the memory.read_all permission", "all_users")
        facts, total = await memory.list_facts(
            None if q.all_users else request.user,
            limit=q.limit,
            offset=q.offset,
            search=q.search,
            sort_by=q.sort_by,
            sort_order=q.sort_order,
            category=q.category,
        )
        views = [msgspec.to_builtins(f) if q.all_users else fact_view(f) for f in facts]
        return {"facts": views, "total": total, "offset": q.offset}

    async def search_facts(request: ApiRequest) -> Any:
        q = _query(request, SearchQuery)
        facts = await memory.search(request.user, q.query, q.limit)
        return {"facts": [fact_view(f) for f in facts]}

    async def extraction_state(request: ApiRequest) -> Any:
        q = _query(request, ExtractionQuery)
        if q.all_users and not memory.is_admin(request.user):
            raise Forbidden("all_users needs the memory.read_all permission", "all_users")
        sessions, cutoff = await memory.extraction_state(
            None if q.all_users else request.user,
            after=_cursor(q, request.user),
            limit=q.limit,
            due=q.due,
        )
        next_after = None
        if len(sessions) == q.limit:  # perhaps more: the cursor of the next page
            last = sessions[-1].key
            next_after = last if q.all_users else public_id(last)
        return {
            "sessions": [_session_state(s, memory, cutoff, owner=q.all_users) for s in sessions],
            "next_after": next_after,
            "extraction": _extraction_info(node, extractor),
        }

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

    async def changes(request: ApiRequest) -> Any:
        q = _query(request, ChangesQuery)
        if memory.changes is None:
            raise NotFound("this node keeps no memory change log")
        head, events = await memory.changes.page(request.user, q.after_seq, q.limit)
        # a client that saw less than what was pruned, or more than there is: reload
        reset = not head.pruned_seq <= q.after_seq <= head.last_seq
        frames = [] if reset else [msgspec.Raw(encode_topic_event(TOPIC, e)) for e in events]
        return {
            "changes": frames,
            "last_seq": head.last_seq,
            "pruned_seq": head.pruned_seq,
            "reset": reset,
        }

    async def delete_all(request: ApiRequest) -> Any:
        return {"deleted": await memory.delete_user(request.user)}

    admins_only = "403 `forbidden` for `all_users=true` without `memory.read_all`."
    return [
        HttpRoute(
            "DELETE",
            "/memory",
            delete_all,
            summary="Delete everything memory holds about you",
            response=DeletedMemory,
        ),
        HttpRoute(
            "GET",
            "/memory/facts",
            list_facts,
            summary="A page of your facts (an admin's: everyone's)",
            query=FactsQuery,
            response=FactPage,
            errors=(403,),
            description=admins_only,
        ),
        HttpRoute(
            "GET",
            "/memory/search",
            search_facts,
            summary="Search your facts by meaning, then by words",
            query=SearchQuery,
            response=FoundFacts,
        ),
        HttpRoute(
            "GET",
            "/memory/extraction",
            extraction_state,
            summary="Your sessions' extraction state",
            query=ExtractionQuery,
            response=ExtractionPage,
            errors=(403,),
            description=admins_only,
        ),
        HttpRoute(
            "GET",
            "/memory/changes",
            changes,
            summary="Your memory's change log after a seq",
            query=ChangesQuery,
            response=ChangePage,
            errors=(404,),
            description="404 when the node keeps no change log.",
        ),
        HttpRoute(
            "PUT",
            "/memory/facts",
            put_fact,
            summary="Save a fact (replacing the one with its category and key)",
            body=FactBody,
            response=SavedFact,
            errors=(429,),
            description="429 for a new key beyond `[memory] max_facts_per_user`.",
        ),
        HttpRoute(
            "DELETE",
            "/memory/facts",
            delete_fact,
            summary="Forget facts by key (in every category, or in one)",
            query=ForgetQuery,
            response=Forgotten,
            errors=(404,),
        ),
        HttpRoute(
            "GET",
            "/memory/summary",
            get_summary,
            summary="Your summary",
            response=SummaryView,
        ),
        HttpRoute(
            "PUT",
            "/memory/summary",
            put_summary,
            summary="Replace your summary",
            body=SummaryBody,
            response=SummaryView,
        ),
    ]
