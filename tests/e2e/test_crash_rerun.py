"""kill -9 a real ``turnstile serve`` after a turn's tool POSTed and before the turn closed:
with ``[limits] max_turn_reruns``, the restart runs the turn again, and its POST carries the same
``Idempotency-Key``, so a receiver that honours the header acts once.

The agent is the scripted one (``/call http.post {...}``): no model server. The receiver is a
tiny HTTP server in the test that records every request's key; it never answers the first one,
so the turn is still open (its tool waiting) when the node is killed.
"""

from __future__ import annotations

import json
import signal

import pytest
import trio

from tests.support.http import read_request_head
from tests.support.node import connect, new_session
from tests.support.serve import serving, stop

TOKEN = "rerun-test-token-0123456789"
#: a hang guard (real clock), not a promise: generous, so that a 2-core box at load 8 passes
WAIT = 60


class Receiver:
    """Records the ``Idempotency-Key`` of every request; answers all but the first (``held``)."""

    def __init__(self) -> None:
        self.keys: list[str | None] = []
        self.bodies: list[dict] = []
        self.first = trio.Event()
        self.port = 0

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            head = await read_request_head(stream)
            if head is None:
                return
            top, _, rest = head.partition(b"\r\n\r\n")
            lines = top.decode("latin-1").split("\r\n")[1:]
            headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines)}
            body = rest
            while len(body) < int(headers.get("content-length", "0")):
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                body += chunk
            self.keys.append(headers.get("idempotency-key"))
            self.bodies.append(json.loads(body))
            if len(self.keys) == 1:
                self.first.set()
                await trio.sleep_forever()  # held: the turn stays open until the node dies
            answer = b'{"ok":true}'
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(answer), answer)
            )
        except trio.BrokenResourceError:
            pass  # the node was killed mid-request
        finally:
            await stream.aclose()


@pytest.mark.slow
async def test_a_turn_run_again_after_kill_9_posts_with_the_same_idempotency_key(tmp_path):
    db = str(tmp_path / "rerun.db")
    config = tmp_path / "turnstile.toml"
    config.write_text(
        "[limits]\nmax_turn_reruns = 1\n\n"
        '[policies]\n"http.post" = "AUTO"\n\n'
        '[modules.http]\nallowed_hosts = ["127.0.0.1"]\n'
    )
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        post = {"url": f"http://127.0.0.1:{receiver.port}/orders", "json": {"order": 7}}
        content = f"/call http.post {json.dumps(post)}"

        async with serving(db, TOKEN, "--config", str(config)) as (process, node):
            await new_session(node, "r", token=TOKEN)
            async with connect(node, TOKEN) as client:
                await client.send(type="send", session_id="r", content=content, client_msg_id="o7")
                input_id = (await client.expect("ack", client_msg_id="o7"))["input_id"]
                with trio.fail_after(WAIT):
                    await receiver.first.wait()  # posted; the turn waits for the answer
                await stop(process, signal.SIGKILL)
            assert process.returncode == -signal.SIGKILL

        async with serving(db, TOKEN, "--config", str(config)) as (process, node):
            async with connect(node, TOKEN) as client:
                await client.send(type="attach", session_id="r", after_seq=0)
                end = await client.expect("stream_end", input_id=input_id, status="completed")
                assert end["text"].startswith("http.post returned")
                # Another input posting the same thing is another operation: another key.
                await client.send(type="send", session_id="r", content=content, client_msg_id="o8")
                other = (await client.expect("ack", client_msg_id="o8"))["input_id"]
                await client.expect("stream_end", input_id=other, status="completed")
                events = client.events("r")
        nursery.cancel_scope.cancel()

    first_key = receiver.keys[0]
    assert first_key is not None and first_key.startswith("turnstile-")
    assert receiver.keys == [first_key, first_key, receiver.keys[2]]  # the re-run: same key
    assert receiver.keys[2] != first_key
    assert receiver.bodies == [{"order": 7}] * 3
    mine = [e for e in events if e.get("input_id") == input_id]
    markers = [
        (e["type"], e.get("status"), e.get("rerun"))
        for e in mine
        if e["type"] in ("stream_start", "stream_end")
    ]
    assert markers == [
        ("stream_start", None, None),
        ("stream_end", "interrupted", None),
        ("stream_start", None, 1),
        ("stream_end", "completed", None),
    ]
    interrupted = next(e for e in mine if e.get("status") == "interrupted")
    assert interrupted["error"] == "the node stopped during this turn; it runs again"
