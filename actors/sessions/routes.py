"""The sessions feature's HTTP endpoints: create, list, read, delete, send, stop, history, events.

Every answer names sessions by the caller's own name, never by key (``actors.sessions.ids``); a
session of another user is ``404`` like one that does not exist. Query parameters are checked
before they reach the store, so a bad one is a ``400`` naming it.

Each route describes itself for the API document (``/openapi.json``): the Structs below are
what the handlers decode and answer, so the document says what goes over the wire.

It is over 400 lines because every endpoint's wire Structs stand beside the handler that decodes and
answers them, in one closure over the directory, so the API document and the code are read in one
place.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from starlette.responses import Response

from turnstile.actors.sessions.agents.base import HistoryEntry
from turnstile.actors.sessions.directory import SessionDirectory
from turnstile.actors.sessions.ids import session_key
from turnstile.protocol.sessions import (
    Activity,
    ListedSession,
    MessageAccepted,
    SessionList,
    SessionView,
    Stopped,
)
from turnstile.runtime.codec import MAX_JSON_DEPTH, Codec
from turnstile.runtime.errors import DecodeError, InvalidArgument, NotFound
from turnstile.runtime.gateway.app import ID_RULE
from turnstile.runtime.gateway.backend import submit_from_client
from turnstile.runtime.gateway.frames import (
    MAX_SEQ,
    ClientMsgId,
    SessionId,
    encode_event,
    is_valid_id,
)
from turnstile.runtime.gateway.routes import (
    ApiError,
    ApiRequest,
    HttpRoute,
    Param,
    Reply,
    decode_query,
)

__all__ = ["SessionView", "session_json", "session_routes"]

_UNSIGNED = re.compile(r"\A[0-9]{1,19}\Z")
#: The header that makes ``POST /sessions/{id}/messages`` idempotent (as ``client_msg_id``).
IDEMPOTENCY_HEADER = "Idempotency-Key"
_encoder = msgspec.json.Encoder()


class CreateSession(msgspec.Struct, forbid_unknown_fields=True):
    """The body of ``POST /sessions``."""

    id: SessionId | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    policy: Literal["enqueue", "reject", "interrupt", "inject"] = "enqueue"


class PostMessage(msgspec.Struct, forbid_unknown_fields=True):
    """The body of ``POST /sessions/{id}/messages``. ``client_msg_id``, like the
    ``Idempotency-Key`` header, makes the post idempotent: the same id again answers the
    first post's input and starts no second turn."""

    content: str
    client_msg_id: ClientMsgId | None = None


_CREATE = Codec(CreateSession, max_depth=MAX_JSON_DEPTH)
_MESSAGE = Codec(PostMessage, max_depth=MAX_JSON_DEPTH)


class ListSessionsQuery(msgspec.Struct):
    """``GET /sessions``'s query string."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    after: SessionId | None = None
    has_recall: bool | None = None


class DeleteQuery(msgspec.Struct):
    """``DELETE /sessions/{id}``'s query string: ``confirm=true`` (or ``1``) cancels the jobs
    a user created that would otherwise block the delete; anything but a boolean is refused,
    so a mistyped confirmation never reads as "no"."""

    confirm: bool = False


class EventsQuery(msgspec.Struct):
    """``GET /sessions/{id}/events``'s query string."""

    after_seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)] = 0


class HistoryAnswer(msgspec.Struct):
    """``GET /sessions/{id}/history``: the transcript, oldest first (the last 1,000 entries)."""

    history: list[HistoryEntry]


class EventFrame(msgspec.Struct):
    """A stored session event as the WebSocket sends it: its type's own fields
    (``docs/protocol.md``) with these four."""

    type: str
    session_id: str
    seq: int
    ts: str


class EventPage(msgspec.Struct):
    """``GET /sessions/{id}/events``: stored events after ``after_seq``, at most 1,000."""

    events: list[EventFrame]


class BlockedDelete(msgspec.Struct):
    """``DELETE /sessions/{id}`` refused: jobs a user created are bound to the session; send
    ``confirm=true`` to cancel them and delete.

    Attributes:
        error: code ``blocked_by_automations``.
        deleted: false.
        blocked_by_automations: true.
        automations: the jobs (``id``, ``name``, ``enabled``, ``kind``, ``state``,
            ``schedule``, ``next_run_at``).
    """

    error: ApiError
    deleted: bool
    blocked_by_automations: bool
    automations: list[dict[str, Any]]


def session_json(session) -> SessionView:
    """A session as the HTTP API shows it."""
    return SessionView(
        id=session.id,
        owner=session.owner,
        metadata=session.metadata,
        policy=session.policy,
        created_at=session.created_at,
        updated_at=session.updated_at,
        last_seq=session.last_seq,
    )


async def _activity(directory: SessionDirectory, user: str, name: str) -> tuple[Activity, int]:
    """What a session is doing, from its inbox (the truth, on any node): its status
    (``running`` a turn, ``queued`` inputs waiting, or ``idle``) and the number of inputs
    waiting."""
    try:
        waiting = await directory.store.list_inputs(
            session_key(user, name), states=("queued", "running")
        )
    except NotFound:  # deleted since it was listed
        waiting = []
    queued = sum(1 for item in waiting if item.state == "queued")
    running = any(item.state == "running" for item in waiting)
    return ("running" if running else "queued" if queued else "idle"), queued


def session_routes(directory: SessionDirectory) -> list[HttpRoute]:
    """The endpoints over ``directory``."""

    async def create_session(request: ApiRequest) -> Any:
        spec = await request.body(_CREATE)
        session = await directory.create_session(
            request.user, session_id=spec.id, metadata=spec.metadata, policy=spec.policy
        )
        return session_json(session)

    async def list_sessions(request: ApiRequest) -> Any:
        query = request.query
        try:
            limit = int(query.get("limit", "100"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= 1000:
            raise DecodeError("limit must be an integer from 1 to 1000", field="limit")
        after = query.get("after")
        if after is not None and not is_valid_id(after):
            raise DecodeError(f"after must be {ID_RULE}", field="after")
        flag = query.get("has_recall")
        if flag is not None and flag.lower() not in ("true", "false"):
            raise DecodeError("has_recall must be true or false", field="has_recall")
        has_recall = None if flag is None else flag.lower() == "true"
        sessions = await directory.list_sessions(
            request.user, limit=limit, after_id=after, has_recall=has_recall
        )
        recalls = await directory.pending_recalls(request.user, [s.id for s in sessions])
        listed = []
        for session in sessions:  # recall.md's sidebar: which sessions have a pending recall
            status, queued = await _activity(directory, request.user, session.id)
            listed.append(
                ListedSession(
                    **msgspec.structs.asdict(session_json(session)),
                    has_recall=session.id in recalls,
                    recall_trigger_at=recalls.get(session.id),
                    status=status,
                    queued=queued,
                )
            )
        return SessionList(sessions=listed)

    async def get_session(request: ApiRequest) -> Any:
        return session_json(await directory.get_session(request.user, request.path["id"]))

    async def delete_session(request: ApiRequest) -> Any:
        confirm = decode_query(request.query, DeleteQuery).confirm
        await directory.delete_session(request.user, request.path["id"], confirm=confirm)
        return Response(status_code=204)

    async def history(request: ApiRequest) -> Any:
        return HistoryAnswer(history=await directory.history(request.user, request.path["id"]))

    async def events(request: ApiRequest) -> Any:
        text = request.query.get("after_seq", "0")
        after = int(text) if _UNSIGNED.search(text) else -1
        if not 0 <= after <= MAX_SEQ:
            raise DecodeError(
                f"after_seq must be an integer from 0 to {MAX_SEQ}", field="after_seq"
            )
        sid = request.path["id"]
        page = await directory.read_events(request.user, sid, after, 1000)
        return Response(
            b'{"events":[' + b",".join(encode_event(sid, e) for e in page) + b"]}",
            media_type="application/json",
        )

    async def post_message(request: ApiRequest) -> Any:
        message = await request.body(_MESSAGE)
        header = request.headers.get("idempotency-key")
        if header is not None and message.client_msg_id not in (None, header):
            raise InvalidArgument(
                "the Idempotency-Key header and client_msg_id differ; send one, or the same",
                field=IDEMPOTENCY_HEADER,
            )
        client_id, field = (
            (header, IDEMPOTENCY_HEADER)
            if header is not None
            else (message.client_msg_id, "client_msg_id")
        )
        submitted = await submit_from_client(
            directory, request.user, request.path["id"], message.content, client_id, field
        )
        out = MessageAccepted(
            input_id=submitted.input_id,
            injected=submitted.injected,
            client_msg_id=message.client_msg_id,
        )
        if not submitted.replayed:
            return out
        # The first answer again, marked as such (as Stripe's Idempotent-Replayed does).
        return Response(
            _encoder.encode(out),
            status_code=202,
            media_type="application/json",
            headers={"idempotent-replayed": "true"},
        )

    async def stop(request: ApiRequest) -> Any:
        return Stopped(stopped=await directory.stop(request.user, request.path["id"]))

    idempotency = Param(
        IDEMPOTENCY_HEADER,
        ClientMsgId,
        description="makes the post idempotent, as client_msg_id (equal to it when both are "
        "sent): the same key again answers the first post's 202 and starts nothing",
    )
    replayed = Param("Idempotent-Replayed", description="true: the answer of an earlier post")
    return [
        HttpRoute(
            "POST",
            "/sessions",
            create_session,
            status=201,
            summary="Create a session (named at random without an id)",
            body=CreateSession,
            response=SessionView,
            errors=(429,),
            description="400 `already_exists` when you have a session of that name; "
            "429 at `[limits] max_sessions_per_user`.",
        ),
        HttpRoute(
            "GET",
            "/sessions",
            list_sessions,
            summary="List your sessions by id, with their pending recall and activity",
            query=ListSessionsQuery,
            response=SessionList,
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}",
            get_session,
            summary="Read a session",
            response=SessionView,
            errors=(404,),
        ),
        HttpRoute(
            "DELETE",
            "/sessions/{id}",
            delete_session,
            status=204,
            summary="Delete a session and everything it owns",
            query=DeleteQuery,
            responses={409: Reply(BlockedDelete, "Jobs a user created are bound to it")},
            errors=(404,),
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/history",
            history,
            summary="A session's transcript (the last 1,000 entries)",
            response=HistoryAnswer,
            errors=(404,),
        ),
        HttpRoute(
            "GET",
            "/sessions/{id}/events",
            events,
            summary="A session's stored events after a seq, as WebSocket frames",
            query=EventsQuery,
            response=EventPage,
            errors=(404,),
        ),
        HttpRoute(
            "POST",
            "/sessions/{id}/messages",
            post_message,
            status=202,
            summary="Send a message: stored in the session's inbox, then it runs",
            body=PostMessage,
            headers=(idempotency,),
            responses={
                202: Reply(
                    MessageAccepted, "Stored (or, replayed, stored before)", headers=(replayed,)
                )
            },
            errors=(404, 409, 429),
            description="409 `busy` (policy `reject`, or a full mailbox) or "
            "`idempotency_key_reused`; 429 at `[limits] max_queued_inputs`.",
        ),
        HttpRoute(
            "POST",
            "/sessions/{id}/stop",
            stop,
            summary="Stop the running turn (it closes `stopped`)",
            response=Stopped,
            errors=(404,),
        ),
    ]
