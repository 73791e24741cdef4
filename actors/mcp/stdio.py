"""The stdio transport: an MCP server run as a child process, JSON-RPC lines over its pipes.

Written here rather than taken from the SDK (``mcp.client.stdio.stdio_client``) for three
reasons, each a promise of this feature:

* **The environment.** The SDK merges the node's ``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``,
  ``TERM`` and ``USER`` into every server's environment; here a server gets exactly what its
  config gives it (``env`` and ``inherit_env``), and its command is looked up in the node's
  ``PATH`` beforehand, so it need not inherit one.
* **Death.** The caller gets the process, so a server that exits is noticed at once (its
  calls fail with ``mcp_server_died`` and it is started again), not at the next request.
* **Bounds.** A line longer than ``MAX_LINE_BYTES`` breaks the connection instead of growing
  memory without limit; the server's standard error is kept as its last ``STDERR_LINES``
  lines for the log and the status, never written to the node's own.

Everything else follows the SDK: newline-delimited JSON-RPC parsed by ``mcp_types``, and the
spec's shutdown (close stdin, wait, then ``SIGTERM`` and ``SIGKILL`` to the process group the
server leads).
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types
import trio
from mcp.shared.message import SessionMessage

__all__ = [
    "EXIT_GRACE",
    "MAX_LINE_BYTES",
    "STDERR_LINES",
    "StdioProcess",
    "find_command",
    "open_stdio",
]

log = logging.getLogger("turnstile.mcp")

MAX_LINE_BYTES = 16 * 1024 * 1024
STDERR_LINES = 50
#: Seconds a server has to exit once its stdin is closed, then again after SIGTERM.
EXIT_GRACE = 2.0


def find_command(command: str, path: str | None = None) -> str:
    """The absolute path of ``command``, looked up in ``path`` (the node's ``PATH``).

    Raises:
        FileNotFoundError: there is no such executable.
    """
    if os.sep in command:
        if os.access(command, os.X_OK) and os.path.isfile(command):
            return os.path.abspath(command)
        raise FileNotFoundError(f"{command!r} is not an executable file")
    found = shutil.which(command, path=path if path is not None else os.environ.get("PATH"))
    if found is None:
        raise FileNotFoundError(f"command {command!r} is not found in the node's PATH")
    return found


@dataclass
class StdioProcess:
    """The running server, as its connection sees it.

    Attributes:
        exited: set when the process has exited.
        returncode: its exit status once it has.
        stderr: its last lines of standard error.
    """

    pid: int
    exited: trio.Event = field(default_factory=trio.Event)
    returncode: int | None = None
    stderr: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_LINES)
    )

    def describe(self) -> str:
        """``exited with status 3: <last line of stderr>``, or ``running``."""
        if self.returncode is None:
            return "running"
        last = self.stderr[-1] if self.stderr else ""
        how = (
            f"killed by signal {-self.returncode}"
            if self.returncode < 0
            else f"exited with status {self.returncode}"
        )
        return f"{how}: {last[:300]}" if last else how


@asynccontextmanager
async def open_stdio(
    argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None
) -> AsyncIterator[tuple[Any, Any, StdioProcess]]:
    """Run ``argv`` and yield ``(read_stream, write_stream, process)`` for an MCP client.

    ``argv[0]`` must already be an absolute path (``find_command``). Leaving the block stops
    the server (stdin closed, then SIGTERM, then SIGKILL to its process group), shielded and
    bounded.

    Raises:
        OSError: the process cannot be started.
    """
    process = await anyio.open_process(list(argv), env=dict(env), cwd=cwd, start_new_session=True)
    state = StdioProcess(pid=process.pid)
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)

    async def stdout_reader() -> None:
        assert process.stdout is not None
        buffer = b""
        async with read_writer:
            try:
                async for chunk in process.stdout:
                    buffer += chunk
                    if len(buffer) > MAX_LINE_BYTES and b"\n" not in buffer[-len(chunk) - 1 :]:
                        await read_writer.send(
                            ValueError(f"the server sent a line over {MAX_LINE_BYTES} bytes")
                        )
                        return
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        await read_writer.send(_parse(line))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(text.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the end instead of waiting

    async def stderr_reader() -> None:
        assert process.stderr is not None
        partial = b""
        try:
            async for chunk in process.stderr:
                *lines, partial = (partial + chunk).split(b"\n")
                partial = partial[-4096:]
                for line in lines:
                    text = line.decode("utf-8", "replace").rstrip()
                    if text:
                        state.stderr.append(text[:1000])
                        log.debug("mcp server pid %d: %s", state.pid, text[:1000])
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass

    async def waiter() -> None:
        state.returncode = await process.wait()
        state.exited.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(stdout_reader)
        tasks.start_soon(stdin_writer)
        tasks.start_soon(stderr_reader)
        tasks.start_soon(waiter)
        try:
            yield read_stream, write_stream, state
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, state)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return ValueError(f"the server sent a line that is not JSON-RPC: {str(exc)[:200]}")
    return SessionMessage(message)


async def _stop(process: anyio.abc.Process, state: StdioProcess) -> None:
    """Close stdin, give the server ``EXIT_GRACE`` to go, then SIGTERM, then SIGKILL; called
    shielded (the tasks that watch the process may be cancelled already)."""
    if process.stdin is not None:
        try:
            await process.stdin.aclose()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL, None):
        with trio.move_on_after(EXIT_GRACE):
            state.returncode = await process.wait()
            state.exited.set()
            break
        if sig is None:
            log.warning("mcp server pid %d is still alive after SIGKILL", state.pid)
        else:
            _kill_group(state.pid, sig)
    _kill_group(state.pid, signal.SIGKILL)  # what it started and left behind goes with it


def _kill_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
