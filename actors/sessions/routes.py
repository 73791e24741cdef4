"""The sessions feature's HTTP endpoints: create, list, read, delete, send, stop, history, events.

Every answer names sessions by the caller's own name, never by key (``actors.sessions.ids``); a
session of another user is ``404`` like one that does not exist. Query parameters are checked
before they reach the store, so a bad one is a ``400`` naming it.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from starlette.responses import Response

from turnstile.actors.sessions.directory import SessionDirectory
from turnstile.actors.sessions.ids import session_key
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
from turnstile.runtime.gateway.routes import ApiRequest, HttpRoute

__all__ = ["session_json", "session_routes"]

_UNSIGNED = re.compile(r"\A[0-9]{1,19}\Z")
#: The header that makes ``POST /sessions/{id}/messages`` idempotent (as ``client_msg_id``).
IDEMPOTENCY_HEADER = "Idempotency-Key"
_encoder = msgspec.json.Encoder()


class CreateSession(msgspec.Struct, forbid_unknown_fields=True):
    """The body of ``POST /sessions``."""

    id: SessionId | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    policy: str = "enqueue"


class PostMessage(msgspec.Struct, forbid_unknown_fields=True):
    """The body of ``POST /sessions/{id}/messages``. ``client_msg_id``, like the
    ``Idempotency-Key`` header, makes the post idempotent: the same id again answers the
    first post's input and starts no second turn."""

    content: str
    client_msg_id: ClientMsgId | None = None


_CREATE = Codec(CreateSession, max_depth=MAX_JSON_DEPTH)
_MESSAGE = Codec(PostMessage, max_depth=MAX_JSON_DEPTH)


def session_json(session) -> dict[str, Any]:
    """A session as the HTTP API shows it."""
    return {
        "id": session.id,
        "owner": session.owner,
        "metadata": session.metadata,
        "policy": session.policy,
        "created_at": session.created_at,
        "updated_at": session.updated_at,
        "last_seq": session.last_seq,
    }


async def _activity(directory: SessionDirectory, user: str, name: str) -> dict[str, Any]:
    """What a session is doing, from its inbox (the truth, on any node): ``status``
    (``running`` a turn, ``queued`` inputs waiting, or ``idle``) and ``queued``, the number
    of inputs waiting."""
    try:
        waiting = await directory.store.list_inputs(
            session_key(user, name), states=("queued", "running")
        )
    except NotFound:  # deleted since it was listed
        waiting = []
    queued = sum(1 for item in waiting if item.state == "queued")
    running = any(item.state == "running" for item in waiting)
    return {"status": "running" if running else "queued" if queued else "idle", "queued": queued}


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
            entry = session_json(session)
            entry["has_recall"] = session.id in recalls
            entry["recall_trigger_at"] = recalls.get(session.id)
            entry.update(await _activity(directory, request.user, session.id))
            listed.append(entry)
        return {"sessions": listed}

    async def get_session(request: ApiRequest) -> Any:
        return session_json(await directory.get_session(request.user, request.path["id"]))

    async def delete_session(request: ApiRequest) -> Any:
        confirm = request.query.get("confirm", "").lower() in ("1", "true", "yes")
        await directory.delete_session(request.user, request.path["id"], confirm=confirm)
        return Response(status_code=204)

    async def history(request: ApiRequest) -> Any:
        return {"history": await directory.history(request.user, request.path["id"])}

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
        out: dict[str, Any] = {"input_id": submitted.input_id}
        if submitted.injected:
            out["injected"] = True
        if message.client_msg_id is not None:
            out["client_msg_id"] = message.client_msg_id
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
        return {"stopped": await directory.stop(request.user, request.path["id"])}

    return [
        HttpRoute("POST", "/sessions", create_session, status=201),
        HttpRoute("GET", "/sessions", list_sessions),
        HttpRoute("GET", "/sessions/{id}", get_session),
        HttpRoute("DELETE", "/sessions/{id}", delete_session),
        HttpRoute("GET", "/sessions/{id}/history", history),
        HttpRoute("GET", "/sessions/{id}/events", events),
        HttpRoute("POST", "/sessions/{id}/messages", post_message, status=202),
        HttpRoute("POST", "/sessions/{id}/stop", stop),
    ]
