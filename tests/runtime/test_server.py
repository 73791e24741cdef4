"""hypercorn as a node serves it: several WebSocket messages in one socket write.

Also the guard for runtime/server.py's patches of hypercorn internals: they were written
against hypercorn 0.18 (pyproject.toml pins ``>=0.18,<0.19``). When a hypercorn release moves
or reshapes what they replace or use, the ``test_hypercorn_*`` tests below fail with a message
saying what changed, instead of the node misbehaving under load. Run them before widening the pin.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from importlib.metadata import version

import pytest
import trio
import trio_websocket
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.events import Data
from hypercorn.protocol.ws_stream import ASGIWebsocketState, Handshake, WSStream
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import UnexpectedMessageError
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage
from wsproto.extensions import PerMessageDeflate
from wsproto.frame_protocol import FrameProtocol

from turnstile.runtime import server
from turnstile.runtime.server import WS_SEND_MANY, serve_app

HYPERCORN = f"hypercorn {version('hypercorn')}"
PORT_IT = (
    "runtime/server.py's patches were written for hypercorn 0.18: port them to this hypercorn, "
    "or keep pyproject.toml's pin (hypercorn>=0.18,<0.19)"
)


async def _serving(nursery: trio.Nursery, app) -> str:
    (url,) = await nursery.start(
        lambda task_status: serve_app(
            app, host="127.0.0.1", port=0, max_frame_bytes=1 << 20, task_status=task_status
        )
    )
    return url.replace("http://", "ws://")


@pytest.fixture
def writes(monkeypatch) -> list[bytes]:
    """Every socket write the server makes (after wrapping hypercorn's send)."""
    seen: list[bytes] = []
    original = TCPServer.protocol_send

    async def counting(self, event):
        data = getattr(event, "data", None)
        if isinstance(data, bytes):
            seen.append(data)
        await original(self, event)

    monkeypatch.setattr(TCPServer, "protocol_send", counting)
    return seen


async def test_send_many_delivers_each_text_as_its_own_message_in_one_write(nursery, writes):
    texts = ['{"seq": 1}', '{"seq": 2}', "é" * 200, '{"seq": 4}']
    sent = trio.Event()
    writes_for_them: list[int] = []

    async def app(scope, receive, send):
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        writes.clear()
        await send({"type": WS_SEND_MANY, "texts": texts})
        writes_for_them.append(len(writes))
        sent.set()
        while (await receive())["type"] != "websocket.disconnect":
            pass

    url = await _serving(nursery, app)
    async with trio_websocket.open_websocket_url(url + "/") as ws:
        received = [await ws.get_message() for _ in texts]
        await sent.wait()
    assert received == texts
    assert writes_for_them == [1]


async def test_send_many_before_accept_is_refused_and_after_close_is_quiet(nursery):
    outcomes: list[str] = []
    done = trio.Event()

    async def app(scope, receive, send):
        await receive()
        try:
            await send({"type": WS_SEND_MANY, "texts": ["too early"]})
        except UnexpectedMessageError:
            outcomes.append("refused before accept")
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass
        await send({"type": WS_SEND_MANY, "texts": ["too late"]})  # the client is gone
        outcomes.append("quiet after close")
        done.set()

    url = await _serving(nursery, app)
    async with trio_websocket.open_websocket_url(url + "/"):
        pass
    await done.wait()
    assert outcomes == ["refused before accept", "quiet after close"]


async def test_a_write_the_kernel_takes_in_part_goes_out_whole_and_in_order(nursery, monkeypatch):
    """Most writes go straight to the socket; one larger than the socket's buffers is written
    in part at once and the rest by trio's send_all (under the send deadline), still in order."""
    partial: list[tuple[int, int]] = []
    original = server._send_now

    def recording(stream, data):
        sent = original(stream, data)
        if sent < len(data):
            partial.append((sent, len(data)))
        return sent

    monkeypatch.setattr(server, "_send_now", recording)
    texts = ["first", "x" * (8 << 20), "last"]

    async def app(scope, receive, send):
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await send({"type": WS_SEND_MANY, "texts": texts})
        while (await receive())["type"] != "websocket.disconnect":
            pass

    url = await _serving(nursery, app)
    async with trio_websocket.open_websocket_url(url + "/", max_message_size=16 << 20) as ws:
        received = [await ws.get_message() for _ in texts]
    assert received == texts
    assert partial and all(sent < size for sent, size in partial)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_a_text_frame_is_the_one_wsproto_would_build(size):
    text = ("é" * size)[:size]
    payload = text.encode()
    assert server._text_frame(payload) == bytes(FrameProtocol(False, []).send_data(text))


async def test_send_many_takes_utf8_bytes_as_text_messages(nursery, writes):
    texts = [b'{"seq": 1}', "é".encode() * 100, b"x" * 70000]
    writes_for_them: list[int] = []

    async def app(scope, receive, send):
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        writes.clear()
        await send({"type": WS_SEND_MANY, "texts": texts})
        writes_for_them.append(len(writes))
        while (await receive())["type"] != "websocket.disconnect":
            pass

    url = await _serving(nursery, app)
    async with trio_websocket.open_websocket_url(url + "/") as ws:
        received = [await ws.get_message() for _ in texts]
    assert received == [text.decode() for text in texts]  # str: text messages
    assert writes_for_them == [1]


async def test_send_many_to_a_client_using_permessage_deflate_is_framed_by_wsproto(
    nursery, monkeypatch
):
    """A client that negotiated an extension gets what wsproto frames (here compressed)."""
    framed_here: list[bytes] = []
    monkeypatch.setattr(server, "_text_frame", framed_here.append)
    texts = [b'{"seq": 1}', "é".encode() * 300, '{"seq": 3}']

    async def app(scope, receive, send):
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await send({"type": WS_SEND_MANY, "texts": texts})
        while (await receive())["type"] != "websocket.disconnect":
            pass

    url = await _serving(nursery, app)
    host, port = url.removeprefix("ws://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    client = WSConnection(ConnectionType.CLIENT)
    request = Request(host=host, target="/", extensions=[PerMessageDeflate()])
    await stream.send_all(client.send(request))
    accepted, received = False, []
    with trio.fail_after(5):
        while len(received) < len(texts):
            data = await stream.receive_some(65536)
            client.receive_data(data)
            for event in client.events():
                if isinstance(event, AcceptConnection):
                    accepted = bool(event.extensions)
                elif isinstance(event, TextMessage):
                    received.append(event.data)
    await stream.aclose()
    assert accepted
    assert framed_here == []
    assert received == [t.decode() if isinstance(t, bytes) else t for t in texts]


# --- guard: the hypercorn internals runtime/server.py patches and relies on -----------------


def test_hypercorn_methods_the_patches_replace_have_the_expected_signatures():
    """The originals the patches wrap and delegate to: async, same parameters, and replaced."""
    originals = {
        (TCPServer, "protocol_send"): (
            server._original_protocol_send,
            server._protocol_send_with_deadline,
        ),
        (TCPServer, "_read_data"): (server._original_read_data, server._read_data),
        (WSStream, "app_send"): (server._original_ws_app_send, server._ws_app_send),
    }
    assert {(cls, name) for cls, name, _ in server.PATCHED_METHODS} == set(originals)
    for cls, name, params in server.PATCHED_METHODS:
        original, patch = originals[cls, name]
        where = f"{HYPERCORN}: {cls.__module__}.{cls.__qualname__}.{name}"
        assert inspect.iscoroutinefunction(original), f"{where} is no longer async; {PORT_IT}"
        found = tuple(inspect.signature(original).parameters)
        assert found == params, f"{where} takes {found}, the patch expects {params}; {PORT_IT}"
        assert tuple(inspect.signature(patch).parameters) == params
        assert original.__module__ == cls.__module__, (
            f"{where}: the saved original is not hypercorn's"
        )
        assert getattr(cls, name) is patch, f"{where} is not patched (import order?)"


def test_hypercorn_tcp_server_has_what_the_send_deadline_patch_uses():
    """``_protocol_send_with_deadline`` uses ``self.send_lock``, ``self.stream``,
    ``self.protocol.handle(Closed())`` and ``RawData.data``."""
    stream = object()
    tcp = TCPServer(app=None, config=Config(), context=None, state=None, stream=stream)
    where = f"{HYPERCORN}: TCPServer"
    assert isinstance(getattr(tcp, "send_lock", None), trio.Lock), f"{where}.send_lock; {PORT_IT}"
    assert getattr(tcp, "stream", None) is stream, f"{where}.stream; {PORT_IT}"
    assert "self.protocol = ProtocolWrapper(" in inspect.getsource(TCPServer.run), (
        f"{where}.run no longer sets self.protocol to a ProtocolWrapper; {PORT_IT}"
    )
    assert tuple(inspect.signature(ProtocolWrapper.handle).parameters) == ("self", "event"), (
        f"{HYPERCORN}: ProtocolWrapper.handle(event) changed; {PORT_IT}"
    )
    assert RawData(data=b"x").data == b"x", f"{HYPERCORN}: RawData.data; {PORT_IT}"
    Closed()


def test_hypercorn_read_data_is_what_the_patch_replaces():
    """``_read_data`` (replaced when ``read_timeout`` is None) reads ``MAX_RECV`` at a time
    under ``fail_after(read_timeout or inf)``, hands each read to ``self.protocol.handle`` as
    ``RawData`` and ends with ``Closed()``: the replacement does the same without the scope."""
    source = inspect.getsource(server._original_read_data)
    where = f"{HYPERCORN}: TCPServer._read_data"
    for part in (
        "fail_after(self.config.read_timeout or inf)",
        "self.stream.receive_some(MAX_RECV)",
        "self.protocol.handle(RawData(bytes(data)))",
        'if data == b"":',
        "self.protocol.handle(Closed())",
    ):
        assert part in source, f"{where} no longer has {part!r}; {PORT_IT}"
    assert Config().read_timeout is None, f"{HYPERCORN}: read_timeout is set by default"


async def test_reads_without_read_timeout_skip_the_scope_and_with_one_use_hypercorns(
    nursery, monkeypatch
):
    """Both paths serve a WebSocket echo; with ``read_timeout`` set, hypercorn's own reader
    (and its timeout) is used."""
    used: list[str] = []
    original = server._original_read_data

    async def hypercorns(self):
        used.append("hypercorn")
        await original(self)

    monkeypatch.setattr(server, "_original_read_data", hypercorns)

    async def app(scope, receive, send):
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] != "websocket.disconnect":
            await send({"type": "websocket.send", "text": message["text"]})

    for read_timeout in (None, 30):
        monkeypatch.setattr(Config, "read_timeout", read_timeout)
        url = await _serving(nursery, app)
        async with trio_websocket.open_websocket_url(url + "/") as ws:
            await ws.send_message("ping")
            assert await ws.get_message() == "ping"
    assert used == ["hypercorn"]


def test_hypercorn_ws_stream_has_what_the_send_many_patch_uses():
    """``_ws_app_send`` uses ``self.closed``, ``self.state``, ``self.connection.send``,
    ``self.send``, ``self.stream_id``, ``ASGIWebsocketState.CONNECTED``,
    ``UnexpectedMessageError(state, type)`` and ``Data(stream_id=, data=)``."""

    async def send(event):
        pass

    ws = WSStream(
        app=None, config=Config(), context=None, task_group=None, ssl=False,
        client=None, server=None, send=send, stream_id=7,
    )  # fmt: skip
    where = f"{HYPERCORN}: WSStream"
    assert getattr(ws, "closed", None) is False, f"{where}.closed; {PORT_IT}"
    assert getattr(ws, "state", None) is ASGIWebsocketState.HANDSHAKE, f"{where}.state; {PORT_IT}"
    assert getattr(ws, "send", None) is send, f"{where}.send; {PORT_IT}"
    assert getattr(ws, "stream_id", None) == 7, f"{where}.stream_id; {PORT_IT}"
    assert "CONNECTED" in ASGIWebsocketState.__members__, f"{where}: state CONNECTED; {PORT_IT}"
    assert "self.connection" in inspect.getsource(WSStream._accept), (
        f"{where}._accept no longer sets self.connection (a wsproto Connection); {PORT_IT}"
    )
    assert "self.handshake = Handshake(" in inspect.getsource(WSStream.handle), (
        f"{where}.handle no longer sets self.handshake; {PORT_IT}"
    )
    assert Handshake([], "1.1").extensions is None, (
        f"{HYPERCORN}: Handshake.extensions is not None without the header; {PORT_IT}"
    )
    assert Handshake([(b"sec-websocket-extensions", b"permessage-deflate")], "1.1").extensions, (
        f"{HYPERCORN}: Handshake.extensions does not hold the offered extensions; {PORT_IT}"
    )
    assert tuple(inspect.signature(UnexpectedMessageError).parameters) == (
        "state",
        "message_type",
    ), f"{HYPERCORN}: UnexpectedMessageError(state, message_type) changed; {PORT_IT}"
    data = Data(stream_id=7, data=b"x")
    assert (data.stream_id, data.data) == (7, b"x"), f"{HYPERCORN}: Data event; {PORT_IT}"


def test_the_import_time_check_names_what_is_missing_and_the_hypercorn_version():
    class TCPServerLike:
        async def protocol_send(self, event, extra): ...

    class WSStreamLike:
        def app_send(self, message): ...

    for methods, problem in [
        ([(TCPServerLike, "protocol_send", ("self", "event"))], "takes (self, event, extra)"),
        ([(WSStreamLike, "app_send", ("self", "message"))], "is not an async function"),
        ([(WSStreamLike, "gone", ("self",))], "WSStreamLike.gone does not exist"),
    ]:
        with pytest.raises(RuntimeError) as caught:
            server._require_hypercorn_internals(methods)
        assert problem in str(caught.value)
        assert f"installed hypercorn {version('hypercorn')}" in str(caught.value)
        assert "written for hypercorn 0.18" in str(caught.value)


def test_importing_the_server_with_reshaped_hypercorn_raises_a_clear_error():
    """In a fresh interpreter: a hypercorn whose ``WSStream.app_send`` changed shape."""
    code = textwrap.dedent(
        """
        from hypercorn.protocol.ws_stream import WSStream

        async def app_send(self, message, *, more): ...

        WSStream.app_send = app_send
        try:
            import turnstile.runtime.server
        except RuntimeError as exc:
            print(exc)
        else:
            print("imported without complaint")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "WSStream.app_send takes (self, message, more)" in out, out
    assert f"hypercorn {version('hypercorn')}" in out, out
