"""A minimal HTTP/1.1 loopback server for the benches, in a process of its own if wanted.

``bench watchers`` polls it 2,000 times a second. It used to run in the node's own trio
thread, so its socket reads and writes and its tasks' scheduling were charged to the node's
CPU per check; in a deployment the polled server is someone else's machine. As
``bench.wsdriver`` did for the gateway's clients, it now runs in a child process:

    python -m bench.scenarios.loopback --change-period S --error-rate R [--track] [--delay D]

serves on 127.0.0.1, port 0, prints one line ``serving http://127.0.0.1:PORT`` on standard
output, then serves until it is killed or its standard input is closed (so it does not
outlive a parent killed outright; run by hand, keep its standard input open).
:class:`LoopbackProcess` starts it from a trio run and talks to it.

Answers (``LoopbackServer``, which ``bench parallel`` still runs in its own trio run):

* ``GET /item/<k>`` — ``{"k": k, "value": v}`` (``application/json``, no ``Date`` header),
  where ``v`` (0-100) changes once every ``change_period`` seconds per item at a phase of its
  own, on ``time.monotonic()`` (``CLOCK_MONOTONIC``: the same clock in every process on
  Linux, unlike trio's, which has a random offset per run). ``error_rate`` of these requests
  are dropped without an answer (the client sees the connection closed); with ``track``, the
  server records per item ``(time.monotonic(), value or None)`` for every request.
* Control, on paths the watchers never use, not counted in any counter:

  - ``GET /_stats`` — ``{"requests", "dropped", "connections", "in_flight",
    "max_in_flight", "cpu"}``: item requests, those dropped, connections that carried at least
    one item request, requests between being read and answered (now and at most), and the
    server process's CPU seconds (``time.process_time``).
  - ``POST /_config`` with a JSON body of any of ``{"error_rate": x, "track": bool,
    "delay": s}`` — sets them; answers the configuration.
  - ``GET /_seen`` — the ``track`` records: ``{"<k>": [[t, value or null], ...]}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

HOST = "127.0.0.1"
#: How long the child may take to print its ``serving`` line (a loaded box: generous).
START_TIMEOUT = 60.0
#: Control calls' timeout (``/_seen`` of a full run is a few MB of JSON).
CONTROL_TIMEOUT = 120.0
_CHECKOUT = Path(__file__).resolve().parent.parent.parent
_ITEM = re.compile(rb"^GET /item/(\d+)")
_CONTROL = re.compile(rb"^(GET|POST) /_(\w+)")
_LENGTH = re.compile(rb"(?im)^content-length:\s*(\d+)\s*$")


def _mix(k: int, epoch: int) -> int:
    """A cheap deterministic hash of ``(item, epoch)`` to 0-100."""
    x = (k * 0x9E3779B1 + epoch * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    x ^= x >> 12
    x = (x * 0x297A2D39) & 0xFFFFFFFF
    x ^= x >> 15
    return x % 101


class LoopbackServer:
    """A minimal HTTP/1.1 server on 127.0.0.1 (trio only): ``GET /item/<k>`` answers JSON.

    Args:
        change_period: seconds between changes of one item's value (``inf``: never).
        error_rate: share of item requests dropped without an answer.
        delay: seconds each answer waits (``trio.sleep``) before it is sent.
        track: record ``(time.monotonic(), value or None)`` per item.

    Counters: ``requests``, ``dropped``, ``connections``, ``in_flight`` / ``max_in_flight``
    (requests between being read and their answer being sent); control requests (the
    module docstring) count in none of them.
    """

    def __init__(
        self,
        *,
        change_period: float = math.inf,
        error_rate: float = 0.0,
        delay: float = 0.0,
        track: bool = False,
        seed: int = 7,
    ) -> None:
        self.change_period = change_period
        self.error_rate = error_rate
        self.delay = delay
        self.track = track
        self.rng = random.Random(seed)
        self.requests = 0
        self.dropped = 0
        self.connections = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.seen: dict[int, list[tuple[float, int | None]]] = {}
        self.base_url = ""

    async def start(self, nursery: trio.Nursery) -> str:
        """Serve in ``nursery`` (cancel it to stop); returns the base URL."""
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, self._serve, 0, host=HOST)
        )
        port = listeners[0].socket.getsockname()[1]
        self.base_url = f"http://{HOST}:{port}"
        return self.base_url

    def value(self, k: int, now: float) -> int:
        if math.isinf(self.change_period):
            return _mix(k, 0)
        phase = (k * 0.6180339887) % 1.0 * self.change_period
        return _mix(k, int((now + phase) // self.change_period))

    def _control(self, method: bytes, name: bytes, body: bytes) -> tuple[int, Any]:
        if method == b"GET" and name == b"stats":
            return 200, {
                "requests": self.requests,
                "dropped": self.dropped,
                "connections": self.connections,
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "cpu": time.process_time(),
            }
        if method == b"GET" and name == b"seen":
            return 200, {str(k): v for k, v in self.seen.items()}
        if method == b"POST" and name == b"config":
            try:
                config = json.loads(body or b"{}")
                unknown = set(config) - {"error_rate", "track", "delay"}
                if unknown:
                    raise ValueError(f"unknown keys {sorted(unknown)}")
                self.error_rate = float(config.get("error_rate", self.error_rate))
                self.track = bool(config.get("track", self.track))
                self.delay = float(config.get("delay", self.delay))
            except (ValueError, TypeError, AttributeError) as exc:
                return 400, {"error": str(exc)}
            return 200, {"error_rate": self.error_rate, "track": self.track, "delay": self.delay}
        return 404, {"error": "unknown control path"}

    async def _serve(self, stream: trio.SocketStream) -> None:
        counted = False  # a connection counts once it carries an item request
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                    if len(buf) > 65536:
                        return
                head, _, buf = buf.partition(b"\r\n\r\n")
                control = _CONTROL.match(head)
                if control:
                    length_match = _LENGTH.search(head)
                    length = int(length_match.group(1)) if length_match else 0
                    while len(buf) < length:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        buf += data
                    body, buf = buf[:length], buf[length:]
                    status, answer = self._control(control.group(1), control.group(2), body)
                    payload = json.dumps(answer).encode()
                    await stream.send_all(
                        b"HTTP/1.1 %d -\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (status, len(payload), payload)
                    )
                    continue
                if not counted:
                    counted = True
                    self.connections += 1
                self.requests += 1
                now = time.monotonic()
                match = _ITEM.match(head)
                k = int(match.group(1)) if match else -1
                if self.error_rate and self.rng.random() < self.error_rate:
                    self.dropped += 1
                    if self.track:
                        self.seen.setdefault(k, []).append((now, None))
                    return  # no answer: the client sees the connection closed
                value = self.value(k, now)
                if self.track:
                    self.seen.setdefault(k, []).append((now, value))
                body = b'{"k":%d,"value":%d}' % (k, value)
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    if self.delay:
                        await trio.sleep(self.delay)
                    await stream.send_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body)
                    )
                finally:
                    self.in_flight -= 1
                if b"connection: close" in head.lower():
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()


# -- the child process --------------------------------------------------------------------------


async def _serve_until_eof(server: LoopbackServer) -> None:
    async with trio.open_nursery() as nursery:
        base = await server.start(nursery)
        print(f"serving {base}", flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        async with stdin:
            while await stdin.receive_some(4096):
                pass
        nursery.cancel_scope.cancel()


def main() -> None:
    """``python -m bench.scenarios.loopback``: serve until killed or standard input closes."""
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios.loopback")
    parser.add_argument("--change-period", type=float, default=math.inf, help="s (default inf)")
    parser.add_argument("--error-rate", type=float, default=0.0)
    parser.add_argument("--delay", type=float, default=0.0, help="s before each answer")
    parser.add_argument("--track", action="store_true", help="record per item what was asked")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    server = LoopbackServer(
        change_period=args.change_period,
        error_rate=args.error_rate,
        delay=args.delay,
        track=args.track,
        seed=args.seed,
    )
    trio.run(_serve_until_eof, server)


# -- the scenario's side ------------------------------------------------------------------------


async def _kill(process: trio.Process) -> None:
    process.kill()


class LoopbackProcess:
    """The scenario's handle on a ``python -m bench.scenarios.loopback`` child.

    ``await start(nursery)`` launches it (this interpreter, this checkout) and returns its base
    URL; the child is killed when ``nursery`` is cancelled or fails, and the scenario fails if
    the child exits on its own. Control calls go through a plain ``httpx.AsyncClient`` — CPU
    of the calling thread, so keep them out of a measured window.
    """

    def __init__(
        self,
        *,
        change_period: float = math.inf,
        error_rate: float = 0.0,
        track: bool = False,
        delay: float = 0.0,
    ) -> None:
        self.command = [
            sys.executable,
            "-m",
            "bench.scenarios.loopback",
            f"--change-period={change_period}",
            f"--error-rate={error_rate}",
            f"--delay={delay}",
            *(["--track"] if track else []),
        ]
        self.base_url = ""
        self._client: httpx.AsyncClient | None = None

    async def start(self, nursery: trio.Nursery) -> str:
        """Launch the child in ``nursery``; returns ``http://127.0.0.1:PORT``."""
        return await nursery.start(self._run)

    async def _run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        process: trio.Process | None = None
        try:
            async with trio.open_nursery() as inner:
                run = functools.partial(
                    trio.run_process,
                    self.command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    cwd=_CHECKOUT,
                    deliver_cancel=_kill,
                )
                process = await inner.start(run)
                try:
                    assert process.stdout is not None
                    with trio.fail_after(START_TIMEOUT):
                        line = b""
                        while not line.endswith(b"\n"):
                            data = await process.stdout.receive_some(4096)
                            if not data:
                                raise RuntimeError(f"loopback server exited: {line!r}")
                            line += data
                    if not line.startswith(b"serving http://"):
                        raise RuntimeError(f"loopback server said {line!r}")
                    self.base_url = line.split()[1].decode()
                    self._client = httpx.AsyncClient(
                        base_url=self.base_url, timeout=CONTROL_TIMEOUT
                    )
                    task_status.started(self.base_url)
                    await trio.sleep_forever()
                finally:
                    inner.cancel_scope.cancel()  # run_process kills the child
        finally:
            with trio.CancelScope(shield=True):
                if self._client is not None:
                    await self._client.aclose()
                if process is not None:
                    for pipe in (process.stdin, process.stdout):
                        if pipe is not None:
                            await pipe.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        if self._client is None:
            raise RuntimeError("LoopbackProcess not started")
        response = await self._client.request(method, path, **kwargs)
        response.raise_for_status()
        return response.json()

    async def configure(
        self, *, error_rate: float | None = None, track: bool | None = None
    ) -> dict[str, Any]:
        """Set the drop rate and/or tracking; returns the server's configuration."""
        config: dict[str, Any] = {}
        if error_rate is not None:
            config["error_rate"] = error_rate
        if track is not None:
            config["track"] = track
        return await self._call("POST", "/_config", json=config)

    async def counters(self) -> dict[str, Any]:
        """``requests``, ``dropped``, ``connections``, ``in_flight``, ``max_in_flight`` and the
        server process's ``cpu`` seconds."""
        return await self._call("GET", "/_stats")

    async def seen(self) -> dict[int, list[tuple[float, int | None]]]:
        """Per item, ``(time.monotonic(), value or None)`` of every request since ``track``."""
        raw = await self._call("GET", "/_seen")
        return {int(k): [(t, v) for t, v in rows] for k, rows in raw.items()}


if __name__ == "__main__":
    main()
