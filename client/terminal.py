"""``turnstile attach``: a terminal client, on ``turnstile.client``.

Type a line to send it; ``/stop`` stops the running turn; ``/quit`` leaves at once. At the end
of input (Ctrl-D, or the end of a pipe: ``echo hi | turnstile attach``) it leaves once every
line it sent has been answered and the turns they started have ended, so a script sees its
answers. Turns stream as they happen; the closing status of each turn is printed. A dropped
connection is opened again and the stream resumes where it was (``SessionStream``).

Exit status, as every ``turnstile`` command: 0 left with ``/quit`` or at the end of input; 2
refused (a bad token or origin, a session that is not yours, a name that cannot be created); 1
the node could not be reached, failed, or the session was deleted.
"""

from __future__ import annotations

import sys

import anyio
import anyio.to_thread

from turnstile.actors.sessions.event_types import (
    StreamDelta,
    StreamEnd,
    StreamStart,
    ThinkingDelta,
    ToolCalled,
    TurnQueued,
)
from turnstile.client._client import open_client
from turnstile.client._errors import ConnectionLost, SessionDeleted, TurnstileClientError
from turnstile.client._events import Event
from turnstile.client._session import SessionStream

__all__ = ["attach", "render"]


class _Turns:
    """The turns the lines sent started and that have not ended yet: an ``ack`` names the
    input, and its ``stream_end`` may come before the ``ack`` (replies and events travel
    apart), so ended inputs are remembered too."""

    def __init__(self) -> None:
        self.waiting: set[int] = set()
        self.ended: set[int] = set()
        self._changed = anyio.Event()

    def started(self, input_id: int) -> None:
        if input_id not in self.ended:
            self.waiting.add(input_id)

    def finished(self, input_id: int) -> None:
        self.ended.add(input_id)
        self.waiting.discard(input_id)
        self._changed.set()
        self._changed = anyio.Event()

    async def settled(self) -> None:
        """Wait until every turn the lines started has ended."""
        while self.waiting:
            await self._changed.wait()


def render(event: Event) -> str | None:
    """How one session event looks on a terminal (None: print nothing)."""
    data = event.data
    if isinstance(data, StreamDelta):
        return data.text
    if isinstance(data, ThinkingDelta):
        return f"\x1b[2m{data.text}\x1b[0m"
    if isinstance(data, StreamStart):
        return f"\n[{data.source}] {data.content}\n> "
    if isinstance(data, StreamEnd):
        error = f": {data.error}" if isinstance(data.error, str) and data.error else ""
        return f"\n[turn {data.status}{error}]\n"
    if isinstance(data, ToolCalled):
        outcome = "ok" if data.ok else f"failed: {data.error}"
        return f"\n[tool {data.tool} {outcome}]\n"
    if isinstance(data, TurnQueued) and data.ahead:
        return f"[queued behind {data.ahead}]\n"
    return None


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


async def attach(url: str, token: str, session_id: str | None, after_seq: int | None) -> int:
    """Attach to ``session_id`` (creating a session when None) and relay the terminal."""
    try:
        async with open_client(url, token) as client:
            if session_id is None:
                session_id = (await client.create_session()).id
                _write(f"[new session {session_id}]\n")
            async with client.attach(session_id, after_seq=after_seq) as stream:
                _write(f"[attached to {session_id} at seq {stream.last_seq}]\n")
                turns = _Turns()
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(_print_events, stream, turns)
                    if await _relay_stdin(stream, turns):  # end of input: let it answer
                        await turns.settled()
                    tasks.cancel_scope.cancel()
    except Exception as exc:  # a group when it came out of the task group
        return _exit_status(exc, url)
    return 0


def _exit_status(exc: BaseException, url: str) -> int:
    """Say why the attach ended on an error; the exit status it means (or re-raise a bug)."""
    error = _find(exc)
    if error is None:
        raise exc
    if isinstance(error, SessionDeleted):
        print(f"\n[{error.message}]", file=sys.stderr)
        return 1
    if isinstance(error, ConnectionLost):
        print(f"turnstile attach: cannot reach the node at {url}: {error.message}", file=sys.stderr)
        return 1
    print(f"turnstile attach: {error}", file=sys.stderr)
    return 1 if error.status is not None and error.status >= 500 else 2


def _find(exc: BaseException) -> TurnstileClientError | None:
    """``exc``, or the first client error in it when it is a (nested) group."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner)
            if found is not None:
                return found
        return None
    return exc if isinstance(exc, TurnstileClientError) else None


async def _print_events(stream: SessionStream, turns: _Turns) -> None:
    async for event in stream:
        if isinstance(event.data, StreamEnd):
            turns.finished(event.data.input_id)
        text = render(event)
        if text:
            _write(text)
    raise SessionDeleted("not_found", f"session {stream.session_id!r} was deleted")


async def _relay_stdin(stream: SessionStream, turns: _Turns) -> bool:
    """Send the terminal's lines until ``/quit`` (False) or the end of input (True)."""
    while True:
        # abandoned, not waited for, when the attach ends on its own (a refusal, a close):
        # a thread blocked reading a terminal cannot be interrupted
        line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if not line:
            return True
        line = line.rstrip("\n")
        if line == "/quit":
            return False
        try:
            if line == "/stop":
                await stream.stop()
            elif line:
                ack = await stream.send(line)
                if ack.input_id is not None:
                    turns.started(ack.input_id)
        except ConnectionLost:
            raise
        except TurnstileClientError as exc:  # the line was refused (busy, too long …)
            _write(f"\n[error {exc.code}: {exc.message}]\n")
