"""kill -9 a real ``turnstile serve`` with queued inputs: after restart, none is lost.

The turn cut off by the crash is closed in history as ``interrupted`` and not run again; every
other acknowledged input runs exactly once, in order.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter

import pytest
import trio

from tests.e2e.conftest import Node, connect, new_session

TOKEN = "crash-test-token-0123456789"


async def start_server(db: str) -> tuple[trio.Process, Node]:
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "runtime.cli",
            "serve",
            "--port",
            "0",
            "--store",
            f"sqlite:///{db}",
            "--dev-token",
            TOKEN,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    buffer = b""
    with trio.fail_after(20):
        while b"serving on " not in buffer:
            chunk = await process.stdout.receive_some()
            if not chunk:
                raise RuntimeError(f"server exited early: {buffer!r}")
            buffer += chunk
    url = buffer.split(b"serving on ")[1].split()[0].decode()
    return process, Node(url=url, ws_url=url.replace("http://", "ws://") + "/ws")


@pytest.mark.slow
async def test_kill_9_loses_no_acknowledged_input(tmp_path):
    db = str(tmp_path / "crash.db")
    process, node = await start_server(db)
    try:
        await new_session(node, "c", token=TOKEN)
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="c")
            await client.expect("session_sync")
            contents = ["/sleep 600", "one", "two", "three", "four"]
            acked = []
            for i, content in enumerate(contents):
                await client.send(
                    type="send", session_id="c", content=content, client_msg_id=str(i)
                )
                acked.append((await client.expect("ack", client_msg_id=str(i)))["input_id"])
            await client.expect("stream_start", input_id=acked[0])  # the long turn is running
            process.send_signal(signal.SIGKILL)
            with trio.fail_after(10):
                await process.wait()
        assert process.returncode == -signal.SIGKILL
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    process, node = await start_server(db)
    try:
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="c", after_seq=0)
            await client.expect("stream_end", input_id=acked[-1])
            events = client.events("c")
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await process.wait()

    starts = Counter(e["input_id"] for e in events if e["type"] == "stream_start")
    ends = {e["input_id"]: e for e in events if e["type"] == "stream_end"}
    assert starts == Counter(acked)  # each acknowledged input started exactly once
    assert ends[acked[0]]["status"] == "interrupted"
    assert ends[acked[0]]["error"] == "the node stopped during this turn"
    assert [ends[i]["text"] for i in acked[1:]] == [f"You said: {c}" for c in contents[1:]]
    started_order = [e["input_id"] for e in events if e["type"] == "stream_start"]
    assert started_order == acked
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
