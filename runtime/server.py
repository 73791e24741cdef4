"""Serving an ASGI app with hypercorn's trio worker, the way a node needs it.

Two hypercorn internals are patched when this module is imported, because hypercorn has no
public hook for either:

* ``hypercorn.trio.tcp_server.TCPServer.protocol_send`` gets a deadline on socket writes
  (``SEND_DEADLINE``): hypercorn shields them from cancellation, so a client that stops
  reading would otherwise pin its connection and hang a graceful shutdown forever. What the
  kernel takes at once is written directly; only a write that must wait goes through trio's
  socket stream under that deadline.
* ``hypercorn.trio.tcp_server.TCPServer._read_data`` reads without a cancel scope per read
  when ``read_timeout`` is unset (``serve_app`` leaves it unset); hypercorn opens
  ``fail_after(inf)`` around every read, about a tenth of what a WebSocket message costs to
  read on the node (issue 26).
* ``hypercorn.protocol.ws_stream.WSStream.app_send`` learns ``WS_SEND_MANY``: several
  WebSocket text messages in one socket write.

The patches also lean on private names next to those methods (``TCPServer.send_lock``,
``.stream``, ``.protocol``, ``.config``; ``WSStream.closed``, ``.state``, ``.connection``,
``.handshake.extensions``, ``.send``, ``.stream_id``; ``ASGIWebsocketState``,
``UnexpectedMessageError``, ``MAX_RECV``, the ``RawData``, ``Closed`` and ``Data`` events).
They were written against hypercorn 0.18, which is why pyproject.toml pins
``hypercorn>=0.18,<0.19``. Private code can change in any release, so before patching this
module checks that the replaced methods are there with the signatures the patches expect and
raises a ``RuntimeError`` naming the installed hypercorn version otherwise, instead of failing
obscurely mid-request. tests/runtime/test_server.py checks the same and the instance attributes
in more depth: run it before widening the pin.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable
from typing import Final, Literal, TypedDict, cast

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework, ASGISendEvent
from starlette.types import ASGIApp
from wsproto.connection import ConnectionState
from wsproto.events import TextMessage
from wsproto.utilities import LocalProtocolError

__all__ = ["serve_app", "package_version", "tune_gc", "SEND_DEADLINE", "WS_SEND_MANY"]


def _hypercorn_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hypercorn")
    except PackageNotFoundError:
        return "(version unknown)"


#: What the patches were written for; named in the error when the internals do not match.
HYPERCORN_WRITTEN_FOR = "hypercorn 0.18.x (pyproject.toml pins hypercorn>=0.18,<0.19)"


def _internals_error(problem: str) -> RuntimeError:
    return RuntimeError(
        f"turnstile.runtime.server patches private internals of hypercorn, and the installed "
        f"hypercorn {_hypercorn_version()} does not have them as expected: {problem}. "
        f"The patches were written for {HYPERCORN_WRITTEN_FOR}: install that, or port the "
        f"patches in runtime/server.py (tests/runtime/test_server.py lists what they rely on)."
    )


try:  # hypercorn's private modules: a missing name is reported as the version mismatch it is
    from hypercorn.events import Closed, Event, RawData
    from hypercorn.protocol.events import Data
    from hypercorn.protocol.ws_stream import ASGIWebsocketState, WSStream
    from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
    from hypercorn.utils import UnexpectedMessageError
except ImportError as exc:
    raise _internals_error(str(exc)) from exc

#: The methods this module replaces, with the parameters the replacements take and pass on.
PATCHED_METHODS: tuple[tuple[type, str, tuple[str, ...]], ...] = (
    (TCPServer, "protocol_send", ("self", "event")),
    (TCPServer, "_read_data", ("self",)),
    (WSStream, "app_send", ("self", "message")),
)


def _require_hypercorn_internals(methods: Iterable[tuple[type, str, tuple[str, ...]]]) -> None:
    """Raise a ``RuntimeError`` naming the hypercorn version unless every method in ``methods``
    is an async function with exactly the expected parameters (and ``ASGIWebsocketState`` has
    ``CONNECTED``). Called once, before patching."""
    for cls, name, params in methods:
        where = f"{cls.__module__}.{cls.__qualname__}.{name}"
        method = getattr(cls, name, None)
        if method is None:
            raise _internals_error(f"{where} does not exist")
        if not inspect.iscoroutinefunction(method):
            raise _internals_error(f"{where} is not an async function")
        found = tuple(inspect.signature(method).parameters)
        if found != params:
            raise _internals_error(
                f"{where} takes ({', '.join(found)}), the patch expects ({', '.join(params)})"
            )
    if not hasattr(ASGIWebsocketState, "CONNECTED"):
        raise _internals_error("hypercorn.protocol.ws_stream.ASGIWebsocketState has no CONNECTED")


_require_hypercorn_internals(PATCHED_METHODS)

#: Seconds a single socket write may wait for a peer that stopped reading before the
#: connection is aborted. Without it a stalled client would pin its connection forever and
#: make a graceful shutdown hang (hypercorn shields socket writes from cancellation).
SEND_DEADLINE = 10.0

#: The largest HTTP request head (request line and headers) hypercorn buffers.
MAX_HEAD_BYTES = 64 * 1024

_original_protocol_send = TCPServer.protocol_send


def _send_now(stream: object, data: bytes) -> int:
    """How much of ``data`` the kernel takes at once from a plain TCP stream, without waiting:
    0 when it takes nothing now or the stream is not a ``trio.SocketStream`` (TLS).

    Raises:
        OSError: the peer is gone or the socket is closed (its ``fileno()`` is then -1).
    """
    if type(stream) is not trio.SocketStream or not data:
        return 0
    try:
        return os.write(stream.socket.fileno(), data)
    except BlockingIOError:
        return 0


async def _protocol_send_with_deadline(self: TCPServer, event: Event) -> None:
    """hypercorn's ``protocol_send`` with a deadline on raw writes (see ``SEND_DEADLINE``).

    What the kernel takes at once is written straight away (the lock's acquisition is the
    checkpoint); only a write that has to wait for the peer pays for the shielded scope with
    its deadline and trio's socket machinery. Most writes of a node (a turn's frames, small
    answers) never wait: issue 26 measured that machinery at about a fifth of a WebSocket
    write's cost on the node."""
    if not isinstance(event, RawData):
        return await _original_protocol_send(self, event)
    data = event.data
    async with self.send_lock:
        try:
            sent = _send_now(self.stream, data)
        except OSError:
            await self.protocol.handle(Closed())  # as trio's BrokenResourceError below
            return
        if sent == len(data):
            return
        try:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + SEND_DEADLINE
                await self.stream.send_all(memoryview(data)[sent:] if sent else data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            # Busy: the reader saw the peer hang up and is closing the stream (hypercorn's
            # ``_close`` sends EOF outside the send lock); the peer is gone either way.
            await self.protocol.handle(Closed())
            return
    if scope.cancelled_caught:  # the peer has not read for SEND_DEADLINE: give up on it
        await trio.aclose_forcefully(self.stream)
        await self.protocol.handle(Closed())


_original_read_data = TCPServer._read_data


async def _read_data(self: TCPServer) -> None:
    """hypercorn's ``_read_data``, without its ``fail_after`` around each read when
    ``config.read_timeout`` is None (it would be ``fail_after(inf)``: a cancel scope per read
    that can never fire)."""
    if self.config.read_timeout is not None:
        return await _original_read_data(self)
    while True:
        try:
            data = await self.stream.receive_some(MAX_RECV)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            break
        await self.protocol.handle(RawData(bytes(data)))
        if data == b"":
            break
    await self.protocol.handle(Closed())


# mypy refuses assigning to a method; this module exists to do it (see its docstring), and the
# check that the replacement's signature fits the method still applies.
TCPServer.protocol_send = _protocol_send_with_deadline  # type: ignore[method-assign]
TCPServer._read_data = _read_data  # type: ignore[method-assign]

#: An ASGI message type this server understands besides the standard ones:
#: ``{"type": WS_SEND_MANY, "texts": [str | bytes, ...]}`` sends each text (bytes: UTF-8 text,
#: as a JSON encoder gives it) as its own WebSocket text
#: message, in order, with one socket write for all of them. A client sees exactly what
#: ``websocket.send`` once per text would give it; the server saves a write, a lock and a few
#: scheduler passes per message, which is most of what a small event frame costs to deliver.
WS_SEND_MANY: Final = "turnstile.websocket.send_many"


class _SendMany(TypedDict):
    """The ``WS_SEND_MANY`` message."""

    type: Literal["turnstile.websocket.send_many"]
    texts: list[str] | list[bytes]


_original_ws_app_send = WSStream.app_send


def _text_frame(payload: bytes) -> bytes:
    """One unfragmented, unmasked WebSocket text frame (a server's, RFC 6455 section 5.2)
    carrying ``payload``, UTF-8 text."""
    size = len(payload)
    if size < 126:
        return bytes((0x81, size)) + payload
    if size < 1 << 16:
        return b"\x81\x7e" + size.to_bytes(2, "big") + payload
    return b"\x81\x7f" + size.to_bytes(8, "big") + payload


async def _ws_app_send(self: WSStream, message: ASGISendEvent | _SendMany | None) -> None:
    """hypercorn's ``WSStream.app_send``, plus ``WS_SEND_MANY``.

    When the client asked for no extension (``Sec-WebSocket-Extensions`` absent, so none is
    in use) and the connection is open, the frames are built here: a text frame is a 2-10
    byte header and the UTF-8 payload, which is most of what wsproto's per-frame work would
    produce, at a sixth of the cost (issue 26). Otherwise (permessage-deflate, a closing
    connection) wsproto frames them as before.
    """
    if message is None or message["type"] != WS_SEND_MANY:
        return await _original_ws_app_send(self, message)
    if self.closed:
        return  # like websocket.send after close: the app may finish quietly
    if self.state != ASGIWebsocketState.CONNECTED:
        raise UnexpectedMessageError(self.state, message["type"])
    texts = message["texts"]
    if self.handshake.extensions is None and self.connection.state is ConnectionState.OPEN:
        data = b"".join(
            _text_frame(text if isinstance(text, bytes) else text.encode()) for text in texts
        )
    else:
        try:
            data = b"".join(
                self.connection.send(
                    TextMessage(data=text.decode() if isinstance(text, bytes) else text)
                )
                for text in texts
            )
        except LocalProtocolError:
            return  # the connection is closing; hypercorn drops sends then too
    await self.send(Data(stream_id=self.stream_id, data=data))


# as for TCPServer.protocol_send above
WSStream.app_send = _ws_app_send  # type: ignore[method-assign]


def tune_gc() -> None:
    """GC settings for a serving process.

    A node keeps many long-lived objects (sessions, connections, in-flight turns); with the
    default thresholds, full collections over all of them took most of the CPU at 1,000
    clients (bench ``sessions``). Collect young objects less often; ``gc.freeze()`` after
    start-up keeps what start-up built out of every later collection.
    """
    import gc

    gc.set_threshold(50_000, 20, 10)


def package_version() -> str:
    """The installed distribution's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turnstile-runtime")
    except PackageNotFoundError:
        return "0+unknown"


async def serve_app(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    max_frame_bytes: int,
    header_timeout: float = 10.0,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until cancelled; ``task_status.started`` gets the bound URLs.

    WebSocket messages larger than ``max_frame_bytes`` are refused by hypercorn itself (close
    code 1009) before they are buffered. A request head larger than ``MAX_HEAD_BYTES`` is
    answered 400 by hypercorn.

    Args:
        header_timeout: seconds a request head may take to arrive, from the connection's start
            or the end of the previous request; then the connection is closed (no answer).
            This is hypercorn's ``keep_alive_timeout``: its idle timer runs until a whole
            request head has been parsed, whatever trickles in meanwhile. hypercorn's
            ``read_timeout`` (a bound on each socket read) is left unset: a byte now and then
            defeats it, and it would close quiet WebSockets that only listen.
    """
    config = HypercornConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # our logging reports what matters
    config.graceful_timeout = 5.0
    config.websocket_max_message_size = max_frame_bytes
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.keep_alive_timeout = header_timeout
    # One protocol, two typings: Starlette types ASGI messages as mappings, hypercorn as
    # TypedDicts, so neither library's app type is the other's to a type checker.
    await hypercorn_serve(cast(ASGIFramework, app), config, task_status=task_status)
