"""Serving an ASGI app with hypercorn's trio worker, the way a node needs it."""

from __future__ import annotations

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData
from hypercorn.protocol.events import Data
from hypercorn.protocol.ws_stream import ASGIWebsocketState, WSStream
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import UnexpectedMessageError
from wsproto.events import TextMessage
from wsproto.utilities import LocalProtocolError

__all__ = ["serve_app", "package_version", "tune_gc", "SEND_DEADLINE", "WS_SEND_MANY"]

#: Seconds a single socket write may wait for a peer that stopped reading before the
#: connection is aborted. Without it a stalled client would pin its connection forever and
#: make a graceful shutdown hang (hypercorn shields socket writes from cancellation).
SEND_DEADLINE = 10.0

#: The largest HTTP request head (request line and headers) hypercorn buffers.
MAX_HEAD_BYTES = 64 * 1024

_original_protocol_send = TCPServer.protocol_send


async def _protocol_send_with_deadline(self, event) -> None:
    """hypercorn's ``protocol_send`` with a deadline on raw writes (see ``SEND_DEADLINE``)."""
    if not isinstance(event, RawData):
        return await _original_protocol_send(self, event)
    async with self.send_lock:
        try:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + SEND_DEADLINE
                await self.stream.send_all(event.data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            # Busy: the reader saw the peer hang up and is closing the stream (hypercorn's
            # ``_close`` sends EOF outside the send lock); the peer is gone either way.
            await self.protocol.handle(Closed())
            return
    if scope.cancelled_caught:  # the peer has not read for SEND_DEADLINE: give up on it
        await trio.aclose_forcefully(self.stream)
        await self.protocol.handle(Closed())


TCPServer.protocol_send = _protocol_send_with_deadline

#: An ASGI message type this server understands besides the standard ones:
#: ``{"type": WS_SEND_MANY, "texts": [str, ...]}`` sends each text as its own WebSocket text
#: message, in order, with one socket write for all of them. A client sees exactly what
#: ``websocket.send`` once per text would give it; the server saves a write, a lock and a few
#: scheduler passes per message, which is most of what a small event frame costs to deliver.
WS_SEND_MANY = "turnstile.websocket.send_many"

_original_ws_app_send = WSStream.app_send


async def _ws_app_send(self, message) -> None:
    """hypercorn's ``WSStream.app_send``, plus ``WS_SEND_MANY``."""
    if message is None or message.get("type") != WS_SEND_MANY:
        return await _original_ws_app_send(self, message)
    if self.closed:
        return  # like websocket.send after close: the app may finish quietly
    if self.state != ASGIWebsocketState.CONNECTED:
        raise UnexpectedMessageError(self.state, message["type"])
    try:
        data = b"".join(self.connection.send(TextMessage(data=text)) for text in message["texts"])
    except LocalProtocolError:
        return  # the connection is closing; hypercorn drops sends then too
    await self.send(Data(stream_id=self.stream_id, data=data))


WSStream.app_send = _ws_app_send


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
    app,
    *,
    host: str,
    port: int,
    max_frame_bytes: int,
    header_timeout: float = 10.0,
    task_status=trio.TASK_STATUS_IGNORED,
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
    await hypercorn_serve(app, config, task_status=task_status)
