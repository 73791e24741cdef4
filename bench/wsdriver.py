"""WebSocket clients for ``bench sessions``, in a process of their own (issue 26).

``bench sessions`` used to run its trio-websocket clients in the node's own trio run, so every
gateway figure charged the clients' CPU (a JSON encode per send, a WebSocket parse and a
``json.loads`` per frame, their tasks' scheduling) to the node, while its in-process baseline
carried no client at all. Here the clients live in a child process, ``python -m bench.wsdriver``,
started by :func:`open_driver` in the scenario's trio run: the node's process carries only the
node, and the two processes' CPU is measured apart.

The protocol is one JSON object a line each way: the scenario writes a command on the driver's
standard input, the driver answers it on its standard output before reading the next (its own
output, if any, goes to standard error). Commands (``op``):

* ``connect`` (``url``, ``ids``): a WebSocket per session id, each attached to its session;
  answers ``{}``.
* ``phase`` (``ids``, ``m``, ``content``, ``busy``): every client of ``ids`` sends ``m``
  messages in a closed loop while the ``busy`` client (if any) streams long replies, cut off
  when the others are done; answers ``tally`` (a :class:`Tally`), ``busy`` (the busy client's
  tally, summed over every phase it ran in) and ``cpu`` (the driver's CPU seconds over the
  phase).
* ``seqs`` (``ids``): ``next_seq`` per session id, the seq each client expects next.
* ``close`` (``ids``): hang up those clients; answers ``{}``.
* ``bare`` (``url``, ``n``, ``m``, ``per_turn``): the bare trio-websocket baseline's clients:
  ``n`` connections to ``url``, each sending ``m`` requests and reading ``per_turn`` frames
  after each; answers ``tally`` and ``cpu``.
* ``quit``: close everything and exit.

A command that fails is answered ``{"error": "..."}``; :class:`Driver` raises it as a
``RuntimeError``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio_websocket

TOKEN = "bench-token-0123456789abcdef"
AUTH = [(b"authorization", f"Bearer {TOKEN}".encode())]
#: Words in the busy session's messages (each reply streams this many deltas, plus two).
BUSY_WORDS = 300
CONNECT_CONCURRENCY = 50
#: A turn whose ack or stream_end has not come after this long counts as lost.
TURN_TIMEOUT = 60.0

_CHECKOUT = Path(__file__).resolve().parent.parent


@dataclass
class Tally:
    """What one load phase delivered, summed over its clients."""

    turns: int = 0
    events: int = 0
    frames: int = 0
    seconds: float = 0.0
    to_start: list[float] = field(default_factory=list)
    to_end: list[float] = field(default_factory=list)
    gaps: int = 0  # a seq skipped: an event lost
    disorder: int = 0  # a seq repeated or going back: duplicated or reordered
    missing_ends: int = 0  # a message whose stream_end (or ack) never came
    bad_status: int = 0  # a turn that closed other than "completed"
    lagged: int = 0
    errors: list[str] = field(default_factory=list)
    gc_seconds: float = 0.0
    gc_full: int = 0
    #: CPU seconds of the bench's own process over the phase: the node's (its trio thread and
    #: its store's threads), plus, in-process, the subscribers that stand in for clients
    cpu: float = 0.0
    #: CPU seconds of the client process over the phase (0 when the clients ran in process)
    client_cpu: float = 0.0

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0

    @property
    def lost_or_reordered(self) -> int:
        return self.gaps + self.disorder + self.missing_ends

    def cpu_ms_per_turn(self, which: str = "cpu") -> float:
        """``cpu`` or ``client_cpu`` per turn, in milliseconds."""
        return getattr(self, which) * 1000 / self.turns if self.turns else float("nan")

    def check_seq(self, expected: int, seq: int) -> int:
        """Account for one event's seq; returns the next expected seq."""
        if seq > expected:
            self.gaps += seq - expected
        elif seq < expected:
            self.disorder += 1
            return expected
        return seq + 1


# -- the clients (in the driver's process) ------------------------------------------------------


class WsClient:
    """One session's client: attaches, then sends messages one turn at a time."""

    def __init__(self, ws: trio_websocket.WebSocketConnection, session_id: str) -> None:
        self.ws = ws
        self.session_id = session_id
        self.next_seq = 1
        #: messages this client sent: each gets its own client_msg_id (an id sent again is a
        #: resend, answered with the first ack and no turn)
        self.sent = 0

    async def attach(self) -> None:
        await self.ws.send_message(json.dumps({"type": "attach", "session_id": self.session_id}))
        while True:
            frame = json.loads(await self.ws.get_message())
            if frame["type"] == "attached":
                self.next_seq = frame["last_seq"] + 1
            elif frame["type"] == "session_sync":
                return
            elif frame["type"] == "error":
                raise RuntimeError(f"attach {self.session_id} failed: {frame}")

    async def turns(self, m: int, tally: Tally, content: str | None = None) -> None:
        ws, sid = self.ws, self.session_id
        perf = time.perf_counter
        for i in range(m):
            text = content or f"m{i}"
            self.sent += 1
            msg_id = f"{sid}-{self.sent}"
            t0 = perf()
            await ws.send_message(
                json.dumps(
                    {"type": "send", "session_id": sid, "content": text, "client_msg_id": msg_id}
                )
            )
            input_id = None
            acked = ended = False
            deadline = trio.current_time() + TURN_TIMEOUT
            while not (acked and ended):
                with trio.move_on_at(deadline) as waited:
                    raw = await ws.get_message()
                if waited.cancelled_caught:
                    tally.errors.append(
                        f"{sid}: {msg_id} had no {'ack' if not acked else 'stream_end'} after "
                        f"{TURN_TIMEOUT}s (started: {input_id is not None}, next seq "
                        f"{self.next_seq})"
                    )
                    tally.missing_ends += m - i
                    return
                frame = json.loads(raw)
                tally.frames += 1
                kind = frame["type"]
                seq = frame.get("seq")
                if seq is not None and kind != "session_sync":
                    tally.events += 1
                    self.next_seq = tally.check_seq(self.next_seq, seq)
                if kind == "stream_start" and input_id is None and frame["content"] == text:
                    tally.to_start.append(perf() - t0)
                    input_id = frame["input_id"]
                elif (
                    kind == "stream_end" and input_id is not None and frame["input_id"] == input_id
                ):
                    tally.to_end.append(perf() - t0)
                    if frame["status"] != "completed":
                        tally.bad_status += 1
                    ended = True
                elif kind == "ack" and frame.get("client_msg_id") == msg_id:
                    acked = True
                elif kind == "error":
                    if frame.get("code") == "lagged":
                        tally.lagged += 1
                    tally.errors.append(f"{sid}: {frame}")
                    tally.missing_ends += m - i
                    return
            tally.turns += 1


async def _connect(nursery: trio.Nursery, url: str, ids: list[str]) -> dict[str, WsClient]:
    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)
    clients: dict[str, WsClient] = {}

    async def connect(session_id: str) -> None:
        async with limiter:
            ws = await trio_websocket.connect_websocket_url(nursery, url, extra_headers=AUTH)
            client = WsClient(ws, session_id)
            await client.attach()
            clients[session_id] = client

    async with trio.open_nursery() as connecting:
        for session_id in ids:
            connecting.start_soon(connect, session_id)
    return clients


async def _phase(
    clients: list[WsClient],
    m: int,
    content: str | None,
    busy: tuple[WsClient, Tally] | None,
) -> Tally:
    tally = Tally()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        if busy is not None:
            long_text = " ".join(["w"] * BUSY_WORDS)
            nursery.start_soon(busy[0].turns, 1_000_000, busy[1], long_text)
        async with trio.open_nursery() as load:
            for client in clients:
                load.start_soon(client.turns, m, tally, content)
        tally.seconds = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    return tally


async def _bare(nursery: trio.Nursery, url: str, n: int, m: int, per_turn: int) -> Tally:
    """The bare server's clients: each request answered with ``per_turn`` frames."""
    tally = Tally()

    async def client(ws: trio_websocket.WebSocketConnection) -> None:
        perf = time.perf_counter
        for i in range(m):
            t0 = perf()
            await ws.send_message(
                json.dumps({"type": "send", "session_id": "s", "content": f"m{i}"})
            )
            for _ in range(per_turn):
                frame = json.loads(await ws.get_message())
                tally.frames += 1
                if frame["type"] == "stream_start":
                    tally.to_start.append(perf() - t0)
            tally.to_end.append(perf() - t0)
            tally.turns += 1

    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)
    conns: list[trio_websocket.WebSocketConnection] = []

    async def connect() -> None:
        async with limiter:
            conns.append(await trio_websocket.connect_websocket_url(nursery, url))

    async with trio.open_nursery() as connecting:
        for _ in range(n):
            connecting.start_soon(connect)
    start = time.perf_counter()
    async with trio.open_nursery() as load:
        for ws in conns:
            load.start_soon(client, ws)
    tally.seconds = time.perf_counter() - start
    for ws in conns:
        await ws.aclose()
    return tally


class _Lines:
    """Newline-separated JSON objects over a byte stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def receive(self) -> dict[str, Any] | None:
        """The next object, or None at the end of the stream."""
        while (end := self._buffer.find(b"\n")) < 0:
            data = await self._stream.receive_some(1 << 16)
            if not data:
                return None
            self._buffer += data
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return json.loads(line)


async def _serve(commands: trio.abc.ReceiveStream, answers: trio.abc.SendStream) -> None:
    lines = _Lines(commands)
    clients: dict[str, WsClient] = {}
    busy_tallies: dict[str, Tally] = {}
    async with trio.open_nursery() as nursery:
        while (command := await lines.receive()) is not None:
            op = command.pop("op")
            if op == "quit":
                break
            try:
                answer = await _command(nursery, clients, busy_tallies, op, **command)
            except Exception as exc:  # the scenario raises it; the driver stays usable
                answer = {"error": f"{op}: {type(exc).__name__}: {exc}"}
            await answers.send_all(json.dumps(answer).encode() + b"\n")
        for client in clients.values():
            await client.ws.aclose()
        nursery.cancel_scope.cancel()


async def _command(
    nursery: trio.Nursery,
    clients: dict[str, WsClient],
    busy_tallies: dict[str, Tally],
    op: str,
    **args: Any,
) -> dict[str, Any]:
    if op == "connect":
        with trio.fail_after(120):
            clients.update(await _connect(nursery, args["url"], args["ids"]))
        return {}
    if op == "phase":
        busy = None
        if args["busy"] is not None:
            busy_tally = busy_tallies.setdefault(args["busy"], Tally())
            busy = (clients[args["busy"]], busy_tally)
        loaded = [clients[i] for i in args["ids"]]
        cpu = time.process_time()
        with trio.fail_after(300):
            tally = await _phase(loaded, args["m"], args["content"], busy)
        cpu = time.process_time() - cpu
        return {"tally": asdict(tally), "busy": busy and asdict(busy[1]), "cpu": cpu}
    if op == "seqs":
        return {"next_seq": {i: clients[i].next_seq for i in args["ids"]}}
    if op == "close":
        for session_id in args["ids"]:
            await clients.pop(session_id).ws.aclose()
        return {}
    if op == "bare":
        cpu = time.process_time()
        with trio.fail_after(300):
            tally = await _bare(nursery, args["url"], args["n"], args["m"], args["per_turn"])
        return {"tally": asdict(tally), "cpu": time.process_time() - cpu}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    """``python -m bench.wsdriver``: serve commands from standard input until ``quit``."""
    import gc

    gc.set_threshold(50_000, 20, 10)  # as the node's process (turnstile serve's tune_gc)
    answers = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    sys.stdout = sys.stderr  # standard output carries answers only
    commands = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    trio.run(_serve, commands, answers)


# -- the scenario's side ------------------------------------------------------------------------


class Driver:
    """The scenario's handle on a driver process (see the module docstring)."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._in = process.stdin
        self._out = _Lines(process.stdout)

    async def _ask(self, op: str, **args: Any) -> dict[str, Any]:
        await self._in.send_all(json.dumps({"op": op, **args}).encode() + b"\n")
        answer = await self._out.receive()
        if answer is None:
            raise RuntimeError(f"ws driver exited during {op!r} (status {self.process.poll()})")
        if "error" in answer:
            raise RuntimeError(f"ws driver: {answer['error']}")
        return answer

    async def connect(self, url: str, ids: list[str]) -> None:
        """A WebSocket per session id, attached to its session."""
        await self._ask("connect", url=url, ids=ids)

    async def phase(
        self, ids: list[str], m: int, content: str | None = None, busy: str | None = None
    ) -> tuple[Tally, Tally | None]:
        """Run a closed-loop phase; returns its tally (``client_cpu`` set) and the busy
        client's (summed over its phases so far)."""
        answer = await self._ask("phase", ids=ids, m=m, content=content, busy=busy)
        tally = Tally(**answer["tally"])
        tally.client_cpu = answer["cpu"]
        return tally, Tally(**answer["busy"]) if answer["busy"] else None

    async def next_seqs(self, ids: list[str]) -> dict[str, int]:
        """The seq each of these clients expects next."""
        return (await self._ask("seqs", ids=ids))["next_seq"]

    async def close(self, ids: list[str]) -> None:
        """Hang up these clients."""
        await self._ask("close", ids=ids)

    async def bare(self, url: str, n: int, m: int, per_turn: int) -> Tally:
        """The bare baseline's clients (``client_cpu`` set)."""
        answer = await self._ask("bare", url=url, n=n, m=m, per_turn=per_turn)
        tally = Tally(**answer["tally"])
        tally.client_cpu = answer["cpu"]
        return tally


@asynccontextmanager
async def open_driver() -> AsyncIterator[Driver]:
    """Start ``python -m bench.wsdriver`` (this interpreter, this checkout); on exit ask it to
    quit, and kill it if it has not within 10 seconds."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bench.wsdriver"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=_CHECKOUT,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        yield Driver(process)
    finally:
        with trio.move_on_after(10, shield=True) as waited:
            try:
                await process.stdin.send_all(b'{"op": "quit"}\n')
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            await process.wait()
        if waited.cancelled_caught:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.stdin.aclose()
            await process.stdout.aclose()
            await process.wait()


if __name__ == "__main__":
    main()
