"""A real ``turnstile serve`` subprocess on a SQLite file, for the crash tests: started, told
apart by the URL it prints, stopped by a signal (SIGKILL is the crash; SIGTERM a graceful
stop)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from tests.support.node import Node


async def launch(
    args: Sequence[str],
    *,
    stderr: Any = subprocess.DEVNULL,
    within: float = 60,
    env: Mapping[str, str] | None = None,
) -> tuple[trio.Process, str]:
    """``turnstile serve`` with ``args`` as a subprocess: it and the URL it serves on, once it
    prints it (the e2e tests and ``bench/scenarios/cluster.py`` start their nodes so). ``env``:
    its environment (this process's when None).

    Raises:
        RuntimeError: it exited before saying where it serves.
        trio.TooSlowError: it said nothing within ``within`` seconds (a hang guard: a start
            takes about a second on a quiet box, ten on a loaded one).
    """
    command = [sys.executable, "-m", "turnstile.actors.cli", "serve", *args]
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=stderr, env=env
    )
    buffer = b""
    with trio.fail_after(within):
        while b"serving on " not in buffer:
            chunk = await process.stdout.receive_some()
            if not chunk:
                raise RuntimeError(f"turnstile serve exited early: {buffer!r}")
            buffer += chunk
    return process, buffer.split(b"serving on ")[1].split()[0].decode()


async def start_server(db: str, token: str, *args: str) -> tuple[trio.Process, Node]:
    """``turnstile serve`` on ``sqlite:///db`` with ``token`` as its dev token and ``args``
    (e.g. ``--config FILE``), the scripted agent unless ``args`` names one; returns once it
    says where it serves."""
    agent = [] if "--agent" in args else ["--agent", "scripted"]
    process, url = await launch(
        [*agent, *args, "--port", "0", "--store", f"sqlite:///{db}", "--dev-token", token]
    )
    return process, Node(url=url, ws_url=url.replace("http://", "ws://") + "/ws")


async def stop(process: trio.Process, sig: signal.Signals = signal.SIGTERM) -> None:
    """Signal the server and wait for it (at most a minute: a hang guard, not a promise)."""
    process.send_signal(sig)
    with trio.fail_after(60):
        await process.wait()


@asynccontextmanager
async def serving(db: str, token: str, *args: str) -> AsyncIterator[tuple[trio.Process, Node]]:
    """A server (``start_server``), stopped (gracefully, else killed) on exit."""
    process, node = await start_server(db, token, *args)
    try:
        yield process, node
    finally:
        if process.returncode is None:
            with trio.CancelScope(shield=True):
                try:
                    await stop(process)
                except trio.TooSlowError:
                    process.kill()
                    await process.wait()


async def run_script(code: str, *args: str) -> str:
    """``python -c code args…`` in a fresh interpreter (what a new process imports, which this
    one has long imported): its stdout, once it exited 0 (else an AssertionError with the end
    of its stderr)."""
    done = await trio.run_process(
        [sys.executable, "-c", code, *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout.decode()
