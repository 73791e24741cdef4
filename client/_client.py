"""``Client``: a node's HTTP API and its WebSocket sessions, for one user's token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import msgspec
from httpx_ws import aconnect_ws

from turnstile.client._errors import ConnectionLost
from turnstile.client._events import Event, decode_event
from turnstile.client._routes import HttpRoutes
from turnstile.client._session import SessionStream
from turnstile.client._stream import Stream
from turnstile.client._topic import TopicStream
from turnstile.client._wire import (
    call_result,
    connection_error,
    decode_answer,
    encode,
    new_client_msg_id,
)
from turnstile.protocol import CallFrame, ErrorFrame, Result, ServerFrame
from turnstile.protocol.sessions import (
    ListedSession,
    MessageAccepted,
    SessionList,
    SessionView,
    Stopped,
)

__all__ = ["Client", "open_client"]

#: The largest frame the client accepts from the node (a tool's result can be large).
MAX_FRAME_BYTES = 16 * 1024 * 1024


class _Events(msgspec.Struct):
    events: list[dict[str, Any]]


class Client(HttpRoutes):
    """A node's API for one user: REST calls, and ``attach`` for a session's live events.

    The WebSocket and the sessions' routes are here; ``request`` and the other features' routes
    are ``HttpRoutes``'s (``_routes.py``).

    Made by ``open_client`` (which closes it); works under trio and asyncio (anyio).
    Every method raises ``TurnstileClientError`` (by the node's error code: ``NotFound``,
    ``Conflict`` …) when the node refuses, and ``ConnectionLost`` when it cannot be reached.

    Args:
        http: the httpx client, with the node's ``base_url`` and the ``Authorization`` header.
    """

    # ---- the WebSocket ---------------------------------------------------------------------

    @asynccontextmanager
    async def attach(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        max_buffer: int = 1024,
        reconnect_attempts: int = 8,
    ) -> AsyncIterator[SessionStream]:
        """Attach to a session over a WebSocket of its own, for as long as the block runs.

        The stream reconnects when its connection drops and resumes after the last event it
        received: no event is missed or seen twice (``SessionStream``).

        Args:
            session_id: the session (yours).
            after_seq: first replay the events after this ``seq``; None: live events only.
            max_buffer: events kept for a reader that is behind (>= 1).
            reconnect_attempts: connections tried in a row after a drop before the stream
                fails with ``ConnectionLost`` (>= 0).

        Raises:
            NotFound: no such session (or not yours).
            Unauthorized: the token is refused.
            ConnectionLost: the node cannot be reached.
        """
        stream = SessionStream(
            self._connect,
            session_id,
            after_seq=after_seq,
            max_buffer=max_buffer,
            reconnect_attempts=reconnect_attempts,
        )
        async with _running(stream):
            yield stream

    @asynccontextmanager
    async def subscribe(
        self,
        topic: str,
        *,
        after_seq: int | None = None,
        max_buffer: int = 1024,
        reconnect_attempts: int = 8,
    ) -> AsyncIterator[TopicStream]:
        """Your events of a user topic (``memory``) over a WebSocket of its own, for as long
        as the block runs; reconnected as ``attach`` is, from the last ``seq`` received.

        Args:
            topic: the topic.
            after_seq: first replay what the topic's log holds after it; None: live only.
            max_buffer: events kept for a reader that is behind (>= 1).
            reconnect_attempts: connections tried in a row after a drop (>= 0).

        Raises:
            NotFound: no such topic.
            ConnectionLost: the node cannot be reached.
        """
        stream = TopicStream(
            self._connect,
            topic,
            after_seq=after_seq,
            max_buffer=max_buffer,
            reconnect_attempts=reconnect_attempts,
        )
        async with _running(stream):
            yield stream

    async def call(
        self, session_id: str, tool: str, arguments: dict[str, Any] | None = None
    ) -> Any:
        """Call a tool or primitive by name as the session, without attaching to it (its
        events are not received: notifications it sends stay buffered for a later attach), over
        a WebSocket opened for the call.

        Raises:
            ToolError: the tool answered ``ok: false``.
            NotFound: no such session of yours.
            ConnectionLost: the node could not be reached, or the connection dropped first.
        """
        frame = CallFrame(id="call", session_id=session_id, tool=tool, arguments=arguments or {})
        answer: ServerFrame | None = None
        try:
            async with self._connect() as ws:
                await ws.send_text(encode(frame))
                while answer is None:
                    found = decode_answer(await ws.receive_text())
                    if isinstance(found, Result | ErrorFrame) and found.id == "call":
                        answer = found
                    elif isinstance(found, ErrorFrame) and found.code == "unauthorized":
                        answer = found  # refused before the call was read
        except BaseException as exc:
            reason = connection_error(exc)
            if reason is None:
                raise
            raise ConnectionLost(f"the connection to the node dropped: {reason}") from None
        return call_result(answer)

    def _connect(self) -> Any:
        return aconnect_ws(
            "/ws",
            self._http,
            max_message_size_bytes=MAX_FRAME_BYTES,
        )

    # ---- sessions' routes ------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        metadata: dict[str, Any] | None = None,
        policy: str | None = None,
    ) -> SessionView:
        """``POST /sessions``: a new session (named at random when ``session_id`` is None).

        Raises:
            BadRequest: a malformed id or policy.
            LimitExceeded: too many sessions.
        """
        body: dict[str, Any] = {}
        if session_id is not None:
            body["id"] = session_id
        if metadata is not None:
            body["metadata"] = metadata
        if policy is not None:
            body["policy"] = policy
        return await self._typed(SessionView, "POST", "/sessions", json=body)

    async def list_sessions(
        self, *, limit: int | None = None, after: str | None = None, has_recall: bool | None = None
    ) -> list[ListedSession]:
        """``GET /sessions``: your sessions, by id (a page of ``limit``, after ``after``)."""
        params = {"limit": limit, "after": after, "has_recall": has_recall}
        answer = await self._typed(SessionList, "GET", "/sessions", params=params)
        return answer.sessions

    async def get_session(self, session_id: str) -> SessionView:
        """``GET /sessions/{id}``.

        Raises:
            NotFound: no such session of yours.
        """
        return await self._typed(SessionView, "GET", f"/sessions/{session_id}")

    async def delete_session(self, session_id: str, *, confirm: bool = False) -> None:
        """``DELETE /sessions/{id}``: the session and everything it owns.

        Raises:
            Conflict: ``blocked_by_automations`` (``details["automations"]``) unless
                ``confirm``, which cancels them first.
            NotFound: no such session of yours.
        """
        await self.request("DELETE", f"/sessions/{session_id}", params={"confirm": confirm})

    async def history(self, session_id: str) -> list[dict[str, Any]]:
        """``GET /sessions/{id}/history``: the transcript, oldest first (last 1,000 entries)."""
        answer: list[dict[str, Any]] = (
            await self.request("GET", f"/sessions/{session_id}/history")
        )["history"]
        return answer

    async def events(self, session_id: str, *, after_seq: int = 0) -> list[Event]:
        """``GET /sessions/{id}/events``: stored events after ``after_seq`` (up to 1,000)."""
        page = await self._typed(
            _Events, "GET", f"/sessions/{session_id}/events", params={"after_seq": after_seq}
        )
        return [decode_event(frame) for frame in page.events]

    async def post_message(
        self,
        session_id: str,
        content: str,
        *,
        client_msg_id: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> MessageAccepted:
        """``POST /sessions/{id}/messages`` with an ``Idempotency-Key`` (made when
        ``client_msg_id`` is None): posted again with the same key, the node answers the first
        post again and starts no second turn. ``traceparent`` and ``tracestate`` (W3C trace
        context) are sent as the headers of those names: when the node traces, the message's
        turn is part of that trace and carries that state (``docs/tracing.md``).

        Raises:
            Conflict: ``busy`` (policy ``reject``), ``idempotency_key_reused``.
        """
        headers = {"Idempotency-Key": client_msg_id or new_client_msg_id()}
        if traceparent is not None:
            headers["traceparent"] = traceparent
        if tracestate is not None:
            headers["tracestate"] = tracestate
        return await self._typed(
            MessageAccepted,
            "POST",
            f"/sessions/{session_id}/messages",
            json={"content": content},
            headers=headers,
        )

    async def stop(self, session_id: str) -> bool:
        """``POST /sessions/{id}/stop``: whether a turn was running (it ends ``stopped``)."""
        return (await self._typed(Stopped, "POST", f"/sessions/{session_id}/stop")).stopped


@asynccontextmanager
async def open_client(
    url: str,
    token: str,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[Client]:
    """A ``Client`` of the node at ``url`` for the user whose bearer token is ``token``.

    Args:
        url: the node's base URL (``http://127.0.0.1:8765``).
        token: the user's bearer token.
        transport: an httpx transport (tests); None talks to ``url`` over the network.
    """
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"),
        headers={"Authorization": f"Bearer {token}"},
        transport=transport,
        timeout=httpx.Timeout(30.0),
    ) as http:
        yield Client(http)


@asynccontextmanager
async def _running(stream: Stream[Any]) -> AsyncIterator[None]:
    """``stream`` connected and attached for as long as the block runs (its task cancelled
    after); its refusal or ``ConnectionLost`` raised as it is."""
    async with _unwrapped(), anyio.create_task_group() as tasks:
        await tasks.start(stream.run, tasks)
        try:
            yield
        finally:
            tasks.cancel_scope.cancel()


@asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """Raise the one exception a task group wrapped in a group as it is, so ``except
    NotFound`` works around ``async with client.attach(…)``; several stay a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        cancelled = anyio.get_cancelled_exc_class()
        real = [e for e in leaves if not isinstance(e, cancelled)]
        if len(real) == 1:
            raise real[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for inner in group.exceptions:
        if isinstance(inner, BaseExceptionGroup):
            found.extend(_leaves(inner))
        else:
            found.append(inner)
    return found
