"""What the streams and the client share on the wire: the WebSocket they need, idempotency
keys, the answers to ``call``, and why a connection failed.

The node answers frames other than ``call`` one at a time, in the order sent; a ``call`` is
answered by its ``id`` (``docs/protocol.md``). Errors come back as ``ErrorFrame``s and become
the client's exceptions by their code (``_errors.error_for``).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import httpx
import msgspec
from httpx_ws import HTTPXWSException

from turnstile.client._errors import ConnectionLost, ToolError, TurnstileClientError, error_for
from turnstile.protocol import ErrorFrame, Result, ServerFrame

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

__all__ = [
    "Connector",
    "WebSocket",
    "call_result",
    "connection_error",
    "decode_answer",
    "encode",
    "frame_error",
    "frames",
    "new_client_msg_id",
    "why_failed",
]

_encoder = msgspec.json.Encoder()
#: Decodes a frame as JSON values (an event's or an answer's: which is told by its fields).
frames = msgspec.json.Decoder()


def encode(frame: msgspec.Struct) -> str:
    """A frame as the text the WebSocket sends."""
    return _encoder.encode(frame).decode()


def new_client_msg_id() -> str:
    """A fresh idempotency key for a message (``tsc-`` and 24 hex digits)."""
    return f"tsc-{secrets.token_hex(12)}"


class WebSocket(Protocol):
    """What the stream needs of a WebSocket (httpx-ws's ``AsyncWebSocketSession``)."""

    async def send_text(self, data: str) -> None: ...
    async def receive_text(self) -> str: ...
    async def close(self, code: int = 1000, reason: str | None = None) -> Any: ...


class Connector(Protocol):
    """Opens a WebSocket to the node's ``/ws`` (the ``Client``'s)."""

    def __call__(self) -> AbstractAsyncContextManager[WebSocket]: ...


def call_result(answer: ServerFrame) -> Any:
    """What a call's answer (``result`` or ``error`` with its ``id``) returned.

    Raises:
        ToolError: the tool answered ``ok: false``.
        TurnstileClientError: the node refused the call (by its code).
    """
    if isinstance(answer, ErrorFrame):
        raise frame_error(answer)
    assert isinstance(answer, Result)
    if not answer.ok:
        error = answer.error
        code = error.code if error is not None else "tool_failed"
        raise ToolError(code, error.message if error else "", field=error.field if error else None)
    return answer.data


def decode_answer(text: str) -> ServerFrame | None:
    """A server answer frame, or None for anything else (an event, a frame this client does
    not know)."""
    try:
        frame = frames.decode(text)
    except msgspec.DecodeError:
        return None
    if not isinstance(frame, dict) or "ts" in frame:
        return None
    try:
        answer: ServerFrame = msgspec.convert(frame, ServerFrame)
    except msgspec.ValidationError:
        return None
    return answer


def frame_error(frame: ErrorFrame) -> TurnstileClientError:
    """The exception for an ``error`` frame (by its code; ``last_seq`` in ``details``)."""
    details: dict[str, Any] = {}
    if frame.last_seq is not None:
        details["last_seq"] = frame.last_seq
    return error_for(frame.code, frame.message, field=frame.field, details=details)


def why_failed(exc: BaseException) -> str:
    """Why a connection failed, in a few words ("connection refused" when anything in its
    chain of causes says so: under anyio, httpx says "All connection attempts failed")."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        found = todo.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, ConnectionRefusedError) or "refused" in str(found).lower():
            return "connection refused"
        if isinstance(found, BaseExceptionGroup):
            todo.extend(found.exceptions)
        todo.extend(e for e in (found.__cause__, found.__context__) if e is not None)
    return str(exc) or type(exc).__name__


def connection_error(exc: BaseException) -> str | None:
    """Why a connection failed, when ``exc`` (or every error of a group) says it did."""
    if isinstance(exc, BaseExceptionGroup):
        reasons = [
            connection_error(inner)
            for inner in exc.exceptions
            if not isinstance(inner, anyio.get_cancelled_exc_class())
        ]
        if reasons and all(r is not None for r in reasons):
            return reasons[0]
        return None
    if isinstance(exc, ConnectionLost):
        return exc.message
    if isinstance(
        exc,
        (
            HTTPXWSException,
            httpx.TransportError,
            OSError,
            anyio.BrokenResourceError,
            anyio.EndOfStream,
            anyio.ClosedResourceError,
        ),
    ):
        return why_failed(exc)
    return None
