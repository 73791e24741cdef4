"""``SessionStream``: one attached session over its own WebSocket (``Client.attach``).

A message is sent with an idempotency key (``client_msg_id``), made for it when the caller
gives none, and sent again with the same key when the connection drops before its ``ack``: the
node stores it once and answers the first ``ack`` again (``docs/protocol.md``, "Resending a
message"). ``stop``, ``approve``, ``deny``, ``set_policy`` and ``call`` are not sent again.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from turnstile.client._errors import ConnectionLost, SessionDeleted
from turnstile.client._events import Event, decode_event
from turnstile.client._stream import Stream, Waiter
from turnstile.client._wire import Connector, call_result, new_client_msg_id
from turnstile.protocol import (
    Ack,
    ApprovalDecided,
    ApproveFrame,
    AttachFrame,
    CallFrame,
    ClientFrame,
    DenyFrame,
    ErrorFrame,
    PolicySet,
    SendFrame,
    ServerFrame,
    SessionSyncFrame,
    SetPolicyFrame,
    StopFrame,
    Stopping,
)
from turnstile.protocol import SessionDeleted as SessionDeletedFrame

__all__ = ["SessionStream"]


class SessionStream(Stream[Event]):
    """A session attached over a WebSocket: its events, and what can be done to it.

    Made by ``Client.attach`` (an async context manager); never constructed by hand. Iterate
    it (``async for event in stream``) or call ``receive()`` for the session's events
    (``Event``).

    Args:
        connect: opens a WebSocket to the node.
        session_id: the session.
        after_seq: replay the events after this ``seq`` first; None: live events only.
        max_buffer: events kept for the reader before it falls behind.
        reconnect_attempts: connections tried in a row when the connection drops, before the
            stream fails with ``ConnectionLost``.
    """

    def __init__(
        self,
        connect: Connector,
        session_id: str,
        *,
        after_seq: int | None,
        max_buffer: int,
        reconnect_attempts: int,
    ) -> None:
        super().__init__(
            connect,
            session_id,
            after_seq=after_seq,
            max_buffer=max_buffer,
            reconnect_attempts=reconnect_attempts,
        )
        self.session_id = session_id
        self._call_ids = itertools.count(1)

    async def send(
        self,
        content: str,
        *,
        client_msg_id: str | None = None,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Ack:
        """Send a user message; return its ``ack`` once the node has stored it.

        Args:
            content: the message.
            client_msg_id: its idempotency key in the session; one is made when None. If the
                connection drops before the ``ack``, the message is sent again with the same
                key: the node stores it once and answers the first ``ack`` again.
            traceparent: a W3C trace context: when the node traces, the message's turn is
                part of that trace (``docs/tracing.md``).
            tracestate: the W3C ``tracestate`` that goes with ``traceparent``; the node keeps
                what W3C allows of it and drops a malformed one.

        Returns:
            The ``ack``: ``input_id`` (or ``injected``) and the ``client_msg_id`` used.

        Raises:
            Conflict: ``busy`` (policy ``reject``), ``idempotency_key_reused``.
            BadRequest: ``content`` too long, a malformed ``client_msg_id``.
            ConnectionLost: the connection dropped and could not be opened again.
        """
        frame = SendFrame(
            session_id=self.session_id,
            content=content,
            client_msg_id=client_msg_id or new_client_msg_id(),
            traceparent=traceparent,
            tracestate=tracestate,
        )
        while True:
            try:
                answer = await self._request(frame)
            except ConnectionLost:
                if self._failure is not None or self._closed:
                    raise
                continue  # sent again, with the same key, once reconnected
            assert isinstance(answer, Ack)
            return answer

    async def stop(self) -> bool:
        """Stop the running turn (it ends with ``stream_end`` status ``stopped``).

        Returns:
            Whether a turn was running.

        Raises:
            ConnectionLost: the connection dropped before the answer (not sent again: a
                second stop could stop the next turn).
        """
        answer = await self._request(StopFrame(session_id=self.session_id))
        assert isinstance(answer, Stopping)
        return answer.running

    async def set_policy(self, policy: str) -> str:
        """Set what a message sent during a turn does: ``enqueue``, ``reject``, ``interrupt``
        or ``inject``. Returns the policy set.

        Raises:
            BadRequest: an unknown policy.
        """
        answer = await self._request(SetPolicyFrame(session_id=self.session_id, policy=policy))
        assert isinstance(answer, PolicySet)
        return answer.policy

    async def approve(self, approval_id: str) -> ApprovalDecided:
        """Approve a pending tool call (an ``approval_required`` event's ``approval_id``).

        Raises:
            NotFound: no such pending approval (decided already, or not yours).
        """
        frame = ApproveFrame(session_id=self.session_id, approval_id=approval_id)
        answer = await self._request(frame)
        assert isinstance(answer, ApprovalDecided)
        return answer

    async def deny(self, approval_id: str) -> ApprovalDecided:
        """Refuse a pending tool call.

        Raises:
            NotFound: no such pending approval.
        """
        answer = await self._request(DenyFrame(session_id=self.session_id, approval_id=approval_id))
        assert isinstance(answer, ApprovalDecided)
        return answer

    async def call(self, tool: str, arguments: dict[str, Any] | None = None) -> Any:
        """Call a tool or primitive by name, as the session, and return what it returned.

        Calls run concurrently (at most 16 in flight on a connection); a tool whose policy is
        ``APPROVE`` answers once a person decided.

        Raises:
            ToolError: the tool answered ``ok: false`` (``unknown_tool``, ``bad_arguments``,
                ``blocked``, ``denied`` …).
            LimitExceeded: too many calls in flight.
            ConnectionLost: the connection dropped before the result (a call is not sent
                again: it may have run).
        """
        call_id = f"call-{next(self._call_ids)}"
        frame = CallFrame(
            id=call_id, session_id=self.session_id, tool=tool, arguments=arguments or {}
        )
        link = await self._current()
        waiter = Waiter()
        link.calls[call_id] = waiter
        await self._write(link, frame)
        return call_result(await waiter.wait())

    def _open_frame(self) -> ClientFrame:
        return AttachFrame(session_id=self.session_id, after_seq=self._last_seq)

    def _item(self, frame: dict[str, Any]) -> Event | None:
        if frame.get("session_id") != self.session_id:
            return None
        try:
            return decode_event(frame)
        except msgspec.ValidationError:
            return None

    def _mine(self, lagged: ErrorFrame) -> bool:
        return lagged.session_id == self.session_id

    def _note(self, answer: ServerFrame) -> bool:
        if isinstance(answer, SessionSyncFrame):
            self._sync = answer
            return True
        if isinstance(answer, SessionDeletedFrame) and answer.session_id == self.session_id:
            self._fail(SessionDeleted("not_found", f"session {self.session_id!r} was deleted"))
            return True
        return False
