"""The terminal client: ``turnstile attach`` and ``turnstile sessions`` against a live node."""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from tests.support.node import ALICE, new_session, running_node

#: a hang guard (real clock: a node and a client in other processes), not a promise: generous,
#: so that a 2-core box at load 8 passes; each wait ends as soon as what it waits for comes
WAIT = 60


async def read_until(stream, needle: bytes, buffer: bytearray) -> None:
    with trio.fail_after(WAIT):
        while needle not in buffer:
            chunk = await stream.receive_some()
            if not chunk:
                raise AssertionError(f"stream closed before {needle!r}: {bytes(buffer)!r}")
            buffer += chunk


@pytest.mark.slow
async def test_attach_streams_turns_to_the_terminal_and_sessions_lists(tmp_path):
    async with running_node(tmp_path) as node:
        await new_session(node, "cli")
        cli = [sys.executable, "-m", "turnstile.actors.cli"]
        process = await trio.lowlevel.open_process(
            [*cli, "attach", "cli", "--url", node.url, "--token", ALICE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out = bytearray()
        try:
            await read_until(process.stdout, b"[attached to cli", out)
            await process.stdin.send_all(b"hello from a terminal\n")
            await read_until(process.stdout, b"[turn completed]", out)
            assert b"You said: hello from a terminal" in out
            await process.stdin.send_all(b"/quit\n")
            with trio.fail_after(WAIT):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

        listed = await trio.run_process(
            [*cli, "sessions", "--url", node.url, "--token", ALICE], capture_stdout=True
        )
        rows = listed.stdout.decode().splitlines()[1:]  # under the table's header
        assert [row.split()[:4] for row in rows] == [["cli", "idle", "0", "enqueue"]]


@pytest.mark.slow
async def test_attach_at_the_end_of_piped_input_waits_for_the_answers(tmp_path):
    """``printf 'a\nb\n' | turnstile attach``: both lines are answered on the terminal before
    it leaves (it left at once, printing no answer, when its input ended)."""
    async with running_node(tmp_path) as node:
        await new_session(node, "piped")
        done = await trio.run_process(
            [
                sys.executable,
                "-m",
                "turnstile.actors.cli",
                "attach",
                "piped",
                "--url",
                node.url,
                "--token",
                ALICE,
            ],
            stdin=b"first line\nsecond line\n",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        out = done.stdout.decode()
        assert done.returncode == 0, done.stderr.decode()
        assert "You said: first line" in out and "You said: second line" in out
        assert out.count("[turn completed]") == 2


@pytest.mark.slow
async def test_attach_prints_no_library_logs(tmp_path):
    """``turnstile attach`` without a session id creates one over HTTP: httpx's INFO line for
    that request reached the terminal (``INFO httpx: HTTP Request: POST …/sessions``)."""
    async with running_node(tmp_path) as node:
        done = await trio.run_process(
            [sys.executable, "-m", "turnstile.actors.cli", "attach", "--url", node.url,
             "--token", ALICE],
            stdin=b"hello\n",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        assert "You said: hello" in done.stdout.decode()
        assert done.stderr.decode() == ""


def test_bench_hands_its_options_to_the_bench_from_a_checkout(monkeypatch):
    """``turnstile bench --quick …`` reaches the bench's own parser (argparse's REMAINDER alone
    refused ``--quick`` as an option of ``turnstile``), from the root of a checkout."""
    from pathlib import Path

    from turnstile.actors.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    with pytest.raises(SystemExit, match="unknown scenario 'no-such-scenario'"):
        main(["bench", "--quick", "no-such-scenario"])
