"""The notifier: every channel, fallback, webhook retries, and the per-session buffer.

Webhooks go to a tiny HTTP server on 127.0.0.1 through the real SSRF guard, which allow-lists
``127.0.0.1`` only in the tests that need it; refusals are checked with a socket layer that
fails the test if any connection is attempted. Email goes to a fake SMTP server on loopback.
Timed tests run on trio's MockClock; those with real sockets use a small autojump threshold,
so the clock only jumps when every task has been idle for a moment of real time.
"""

from __future__ import annotations

import email
import email.policy
import functools
import json
import logging
from datetime import timedelta
from http import HTTPStatus

import pytest
import trio
import trio.testing

from tests.support.mock_node import DAY, T0, node
from tests.support.notifier import NoSockets, events, make_notifier
from tests.support.sessions import Recorder
from turnstile.actors.config import load_config
from turnstile.actors.node import open_node
from turnstile.actors.notifications.actor import (
    MAX_MESSAGE_CHARS,
    ChannelConfig,
    NotificationFailed,
    Notifier,
    NotifierConfig,
    UnknownChannel,
    notification_text,
)
from turnstile.actors.sessions.actor import Attach, Detach, Submit
from turnstile.actors.sessions.ids import session_key
from turnstile.runtime.errors import (
    InvalidArgument,
    LimitExceeded,
    NotFound,
    PlacedElsewhere,
    StoreError,
)
from turnstile.tools.netguard import NetPolicy

HOUR = 3600
#: Real seconds every task must be idle before the mock clock jumps (tests with real sockets).
IDLE = 0.05


async def agent_saw(n, session_id: str) -> list[str]:
    """Every notification text the session's agent was given (turn inputs and injections)."""
    seen = []
    for event in await n.store.read_events(session_id, after_seq=0, limit=10_000):
        content = event.payload.get("content", "")
        if event.type in ("stream_start", "user_message") and content.startswith("[NOTIF"):
            seen.append(content)
    return seen


# -- a loopback webhook receiver and SMTP server ---------------------------------------------


class Hook:
    """A minimal HTTP/1.1 server: records each request with trio's time, answers scripted
    statuses (the last one repeats), or never answers (``hang``)."""

    def __init__(self, *statuses: int, hang: bool = False) -> None:
        self.statuses = list(statuses or (200,))
        self.hang = hang
        self.requests: list[tuple[float, str, dict[str, str], bytes]] = []
        self.url = ""

    async def handle(self, stream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        line, *rest = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in rest)}
        while len(body) < int(headers.get("content-length", 0)):
            body += await stream.receive_some(65536)
        self.requests.append((trio.current_time(), line, headers, body))
        if self.hang:
            await trio.sleep_forever()
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        await stream.send_all(
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-length: 0\r\n"
            "connection: close\r\n\r\n".encode()
        )
        await stream.aclose()

    def times(self) -> list[float]:
        return [t - self.requests[0][0] for t, *_ in self.requests]


async def serve(nursery, handler) -> int:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


@pytest.fixture
async def hook(nursery, request) -> Hook:
    statuses, hang = getattr(request, "param", ((200,), False))
    receiver = Hook(*statuses, hang=hang)
    receiver.url = f"http://127.0.0.1:{await serve(nursery, receiver.handle)}/hook"
    return receiver


class FakeSMTP:
    """Speaks just enough SMTP for ``smtplib``: records envelopes and message bodies."""

    def __init__(self, reject_mail: bool = False) -> None:
        self.reject_mail = reject_mail
        self.mails: list[dict] = []

    async def handle(self, stream) -> None:
        buffer = bytearray()

        async def line() -> bytes:
            while b"\r\n" not in buffer:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    raise EOFError
                buffer.extend(chunk)
            end = buffer.index(b"\r\n")
            out = bytes(buffer[:end])
            del buffer[: end + 2]
            return out

        async def say(text: str) -> None:
            await stream.send_all(text.encode() + b"\r\n")

        envelope: dict = {"from": None, "to": []}
        await say("220 fake ESMTP")
        try:
            while True:
                command = await line()
                verb = command[:4].upper()
                if verb in (b"EHLO", b"HELO"):
                    envelope["helo"] = command[5:].decode()
                    await say("250-fake\r\n250 8BITMIME")
                elif verb == b"MAIL":
                    if self.reject_mail:
                        await say("550 5.7.1 sender rejected")
                        continue
                    envelope["from"] = command.decode()
                    await say("250 OK")
                elif verb == b"RCPT":
                    envelope["to"].append(command.decode())
                    await say("250 OK")
                elif verb == b"DATA":
                    await say("354 go ahead")
                    lines = []
                    while (text := await line()) != b".":
                        lines.append(text[1:] if text.startswith(b"..") else text)
                    self.mails.append({**envelope, "data": b"\r\n".join(lines)})
                    envelope = {"from": None, "to": []}
                    await say("250 queued")
                elif verb == b"QUIT":
                    await say("221 bye")
                    return
                else:
                    await say("250 OK")
        except EOFError:
            return


# -- llm_notification ---------------------------------------------------------------------------


@pytest.mark.guard(DAY)
async def test_llm_notification_reaches_the_agent_and_the_attached_client(autojump_clock):
    async with node() as n:
        notifier = make_notifier(n)
        result = await notifier.notify(
            "s",
            "ada",
            "llm_notification",
            "disk 91% full",
            title="Disk",
            priority="high",
            tags=["ops"],
            structured_data={"disk": "/dev/sda1", "used": 0.91},
        )
        assert result["notification_id"].startswith("ntf-")
        assert {k: result[k] for k in ("channel", "delivered", "fallback", "buffered")} == {
            "channel": "llm_notification",
            "delivered": True,
            "fallback": False,
            "buffered": False,
        }
        await n.seen.until(b'"stream_end"')
        (event,) = events(n.seen, "notification")
        assert (event["message"], event["title"], event["priority"], event["tags"]) == (
            "disk 91% full",
            "Disk",
            "high",
            ["ops"],
        )
        assert event["structured_data"] == {"disk": "/dev/sda1", "used": 0.91}
        assert event["created_at"] == "2026-11-21T12:00:00Z" and event["fallback"] is False
        (start,) = events(n.seen, "stream_start")  # an idle session: a turn of its own
        assert start["source"] == "notification"
        assert start["content"] == (
            "[NOTIFICATION] Disk (priority=high, tags=ops)\n"
            "disk 91% full\n"
            'Data: {"disk": "/dev/sda1", "used": 0.91}'
        )


@pytest.mark.guard(DAY)
async def test_llm_notification_folds_into_a_running_turn(autojump_clock):
    async with node() as n:
        notifier = make_notifier(n)
        await n.registry.ref("session:s").ask(Submit(content="wait:work"))
        await n.seen.until(b'"stream_start"')
        await notifier.notify("s", "ada", "llm_notification", "build is green")
        (folded,) = events(n.seen, "user_message")
        assert folded["source"] == "notification" and folded["injected_into"] is not None
        assert folded["content"] == "[NOTIFICATION] (priority=normal)\nbuild is green"
        n.agent.gate("wait:work").set()
        await n.seen.until(b'"stream_end"')
        (end,) = events(n.seen, "stream_end")
        assert end["text"].endswith("+[NOTIFICATION] (priority=normal)\nbuild is green")


async def test_arguments_are_checked(autojump_clock):
    async with node() as n:
        notifier = make_notifier(
            n, ChannelConfig(name="audit", type="log", path="/nonexistent/audit.jsonl")
        )
        with pytest.raises(UnknownChannel) as unknown:
            await notifier.notify("s", "ada", "slack", "hi")
        assert str(unknown.value) == (
            "no channel named 'slack'; configured channels: audit, llm_notification"
        )
        assert unknown.value.code == "unknown_channel" and unknown.value.field == "channel"
        too_long = "x" * (MAX_MESSAGE_CHARS + 1)
        with pytest.raises(InvalidArgument, match="message is longer than 10000 characters"):
            await notifier.notify("s", "ada", "llm_notification", too_long)
        cut = await notifier.notify("s", "ada", "llm_notification", too_long, truncate=True)
        assert cut["delivered"]
        (event,) = events(n.seen, "notification")
        assert len(event["message"]) == MAX_MESSAGE_CHARS
        assert event["message"].endswith("… (truncated from 10001 chars)")
        with pytest.raises(InvalidArgument, match="priority must be one of"):
            await notifier.notify("s", "ada", "llm_notification", "hi", priority="meh")
        with pytest.raises(LimitExceeded, match="structured_data is"):
            await notifier.notify(
                "s", "ada", "llm_notification", "hi", structured_data={"x": "y" * 20_000}
            )
        with pytest.raises(InvalidArgument) as config:
            await notifier.notify("s", "ada", "audit", "hi", output_config={"to_address": "a@b.c"})
        assert str(config.value) == (
            "output_config key 'to_address' is not supported by log channels (supported: none)"
        )
        await trio.testing.wait_all_tasks_blocked()
        assert len(await agent_saw(n, "s")) == 1  # nothing but the truncated one got through


# -- the buffer ---------------------------------------------------------------------------------


@pytest.mark.guard(DAY)
async def test_105_while_detached_100_delivered_in_order_on_attach_5_dropped(autojump_clock):
    async with node() as n:
        await n.store.create_session("t", "ada")
        notifier = make_notifier(n)
        for i in range(105):
            result = await notifier.notify("t", "ada", "llm_notification", f"n{i}")
            assert result["buffered"] is True and result["injected"] is True
        await trio.testing.wait_all_tasks_blocked()
        # The agent got every one with nobody watching (an injection that arrives as a turn
        # closes becomes a turn of its own, so a text may be seen twice).
        assert set(await agent_saw(n, "t")) == {
            f"[NOTIFICATION] (priority=normal)\nn{i}" for i in range(105)
        }
        assert not any(e.type == "notification" for e in await n.store.read_events("t", 0, 10_000))

        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        assert await notifier.deliver_buffered("t") == 100
        (dropped,) = events(client, "notifications_dropped")
        assert dropped["dropped"] == 5 and dropped["message"].startswith("5 dropped")
        delivered = events(client, "notification")
        assert [e["message"] for e in delivered] == [f"n{i}" for i in range(5, 105)]
        assert all(e["buffered"] for e in delivered)
        assert dropped["seq"] < delivered[0]["seq"]
        assert await notifier.deliver_buffered("t") == 0  # delivered once
        assert await n.store.kv_list("notify:t") == []
        assert notifier._locks == {}


class _DiesBeforeForgetting:
    """The store, but deleting from a notification buffer fails, as a node that dies between
    publishing the buffered notifications and forgetting them leaves it (issue 23)."""

    def __init__(self, store) -> None:
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def kv_delete(self, namespace, keys):
        if namespace.startswith("notify:"):
            raise RuntimeError("the node died here")
        return await self._store.kv_delete(namespace, keys)


class _RefusesOnce:
    """The store, but the ``at``-th write to a notification buffer (its items or its
    bookkeeping) is refused once, as a failed commit is (issue 23's ``--fault fail``)."""

    def __init__(self, store, at: int) -> None:
        self._store, self._at, self._writes = store, at, 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def _count(self, namespace: str) -> None:
        if namespace.startswith("notify"):
            self._writes += 1
            if self._writes == self._at:
                raise StoreError("sqlite: transaction failed: refused by the test")

    async def kv_put(self, namespace, rows):
        self._count(namespace)
        return await self._store.kv_put(namespace, rows)

    async def kv_delete(self, namespace, keys):
        self._count(namespace)
        return await self._store.kv_delete(namespace, keys)


@pytest.mark.guard(DAY)
@pytest.mark.parametrize("at", [1, 2, 3, 4])
async def test_an_attach_whose_delivery_write_is_refused_delivers_once(autojump_clock, at):
    """Found by the crash harness's ``--fault fail`` at every point (scenario
    ``notification``): a refused write while an attach delivered the buffer (the delivered
    mark, the publishing marker, forgetting the items, clearing the marker) failed the
    attach, and the notification stayed buffered, or was published and stayed buffered too.
    The delivery is tried again: the client gets it once, and the buffer is empty."""
    async with node() as n:
        await n.store.create_session("t", "ada")
        notifier = make_notifier(n)
        await notifier.notify("t", "ada", "llm_notification", "once")
        await trio.testing.wait_all_tasks_blocked()
        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        notifier.store = _RefusesOnce(n.store, at)
        await notifier.deliver_buffered("t")
        assert notifier.store._writes >= at  # the refusal happened
        assert [e["message"] for e in events(client, "notification")] == ["once"]
        assert await n.store.kv_list("notify:t") == []
        assert await n.store.kv_list("notify-meta:t") == [("delivered", {"seq": 1})]


@pytest.mark.guard(DAY)
async def test_a_buffered_notification_published_before_a_crash_is_not_published_again(
    autojump_clock,
):
    """Found by the crash harness (scenario ``notification``, a crash right after the
    notification's event is stored and before the buffer forgets it): the next attach
    published it a second time."""
    async with node() as n:
        await n.store.create_session("t", "ada")
        first = make_notifier(n)
        await first.notify("t", "ada", "llm_notification", "once")
        await trio.testing.wait_all_tasks_blocked()
        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        first.store = _DiesBeforeForgetting(n.store)
        with pytest.raises(RuntimeError):
            await first.deliver_buffered("t")
        restarted = make_notifier(n)
        assert await restarted.deliver_buffered("t") == 0
        published = [
            e for e in await n.store.read_events("t", 0, 10_000) if e.type == "notification"
        ]
        assert [e.payload["message"] for e in published] == ["once"]
        assert await n.store.kv_list("notify:t") == []
        assert await n.store.kv_list("notify-meta:t") == [("delivered", {"seq": 1})]
        # the buffer goes on as before
        await n.registry.ref("session:t").ask(Detach(subscriber=client))
        await restarted.notify("t", "ada", "llm_notification", "later")
        again = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=again))
        assert await restarted.deliver_buffered("t") == 1
        assert [e["message"] for e in events(again, "notification")] == ["later"]
        assert events(again, "notifications_dropped") == []


@pytest.mark.guard(DAY)
async def test_two_nodes_buffering_for_one_session_number_gapless_and_none_is_lost(autojump_clock):
    """Two notifiers on one store (two nodes: each has its own in-memory locks) buffer for the
    same detached session at once: the buffer numbers are 1..N without a gap or a repeat,
    every notification is delivered once on attach, and none is reported dropped."""
    async with node() as n:
        await n.store.create_session("t", "ada")
        a, b = make_notifier(n), make_notifier(n)

        async def send(notifier, name: str) -> None:
            for i in range(20):
                await notifier.notify("t", "ada", "llm_notification", f"{name}{i}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, a, "a")
            nursery.start_soon(send, b, "b")
        keys = [key for key, _ in await n.store.kv_list("notify:t")]
        assert keys == [f"{seq:020d}" for seq in range(1, 41)]
        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        assert await a.deliver_buffered("t") == 40
        assert await b.deliver_buffered("t") == 0  # delivered once, whichever node asks
        messages = [e["message"] for e in events(client, "notification")]
        assert sorted(messages) == sorted(
            [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]
        )
        assert [m for m in messages if m[0] == "a"] == [f"a{i}" for i in range(20)]  # in order
        assert events(client, "notifications_dropped") == []


@pytest.mark.guard(DAY)
async def test_expired_notifications_are_reported_dropped_on_attach(autojump_clock):
    async with node() as n:
        await n.store.create_session("t", "ada")
        notifier = make_notifier(n, buffer_ttl_seconds=60)
        for i in range(3):
            await notifier.notify("t", "ada", "llm_notification", f"old{i}")
        await trio.sleep(61)  # (mock time) they expire unseen
        await notifier.notify("t", "ada", "llm_notification", "new")
        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        assert await notifier.deliver_buffered("t") == 1
        (dropped,) = events(client, "notifications_dropped")
        assert dropped["dropped"] == 3 and "longer than 60 s" in dropped["message"]
        assert [e["message"] for e in events(client, "notification")] == ["new"]
        await notifier.notify("t", "ada", "llm_notification", "later")  # attached: published
        await n.registry.ref("session:t").ask(Detach(subscriber=client))
        await notifier.notify("t", "ada", "llm_notification", "after")
        again = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=again))
        assert await notifier.deliver_buffered("t") == 1
        assert events(again, "notifications_dropped") == []  # counted from the last delivery


@pytest.mark.guard(3 * DAY)
async def test_buffered_notifications_expire_after_24_hours(autojump_clock):
    async with node() as n:
        await n.store.create_session("t", "ada")
        notifier = make_notifier(n)
        await notifier.notify("t", "ada", "llm_notification", "old")
        await trio.sleep(13 * HOUR)
        await notifier.notify("t", "ada", "llm_notification", "new")
        await trio.sleep(12 * HOUR)  # "old" is 25 h old, "new" 12 h
        assert n.clock.now() == T0 + timedelta(hours=25)
        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        assert await notifier.deliver_buffered("t") == 1
        assert [e["message"] for e in events(client, "notification")] == ["new"]
        assert events(client, "notification")[0]["created_at"] == "2026-11-22T01:00:00Z"

        await n.registry.ref("session:t").ask(Detach(subscriber=client))
        await notifier.notify("t", "ada", "llm_notification", "forgotten")
        await trio.sleep(25 * HOUR)
        # "old" (expired, never delivered) and "forgotten": each kept its own key
        assert await n.store.kv_purge_expired() == 2
        assert await notifier.deliver_buffered("t") == 0


@pytest.mark.guard(DAY)
async def test_a_notification_racing_an_attach_comes_after_the_buffered_ones(autojump_clock):
    async with node() as n:
        await n.store.create_session("t", "ada")
        notifier = make_notifier(n)
        for i in range(3):
            await notifier.notify("t", "ada", "llm_notification", f"b{i}")
        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        async with trio.open_nursery() as nursery:  # the live one wins the lock
            nursery.start_soon(notifier.notify, "t", "ada", "llm_notification", "live")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(notifier.deliver_buffered, "t")
        messages = [e["message"] for e in events(client, "notification")]
        assert messages == ["b0", "b1", "b2", "live"]
        assert [e.get("buffered", False) for e in events(client, "notification")] == [
            True,
            True,
            True,
            False,
        ]


async def test_discard_buffered(autojump_clock):
    async with node() as n:
        await n.store.create_session("t", "ada")
        notifier = make_notifier(n, max_buffered=2)
        for i in range(3):
            await notifier.notify("t", "ada", "llm_notification", f"b{i}")
        assert await notifier.discard_buffered("t") == 2
        assert await n.store.kv_list("notify:t") == []
        assert await n.store.kv_list("notify-meta:t") == []


# -- webhook ------------------------------------------------------------------------------------


def webhook(url: str, **fields) -> ChannelConfig:
    fields.setdefault("headers", {"Authorization": "Bearer hook-secret"})
    return ChannelConfig(name="ops", type="webhook", url=url, **fields)


async def test_a_webhook_gets_the_json(hook):
    async with node() as n:
        notifier = make_notifier(n, webhook(hook.url))
        result = await notifier.notify(
            "s", "ada", "ops", "deployed v2", title="Deploy", structured_data={"v": 2}
        )
        assert (result["channel"], result["fallback"], result["attempts"]) == ("ops", False, 1)
        assert result["status_code"] == 200
        ((_, line, headers, body),) = hook.requests
        assert line == "POST /hook HTTP/1.1"
        assert headers["content-type"] == "application/json"
        assert headers["authorization"] == "Bearer hook-secret"
        sent = json.loads(body)
        assert (sent["message"], sent["title"], sent["channel"], sent["session_id"]) == (
            "deployed v2",
            "Deploy",
            "ops",
            "s",
        )
        assert sent["structured_data"] == {"v": 2} and sent["id"] == result["notification_id"]
        assert events(n.seen, "notification") == []  # an external success is not echoed


@pytest.mark.parametrize("hook", [((503,), False)], indirect=True)
async def test_webhook_5xx_retries_with_backoff_then_falls_back(hook, mock_clock):
    mock_clock.autojump_threshold = IDLE
    async with node() as n:
        notifier = make_notifier(n, webhook(hook.url))
        result = await notifier.notify("s", "ada", "ops", "deployed v2")
        assert hook.times() == [0, 0.5, 1.5, 3.5]  # 4 attempts: 0.5 s, 1 s, 2 s apart
        reason = "HTTP 503 Service Unavailable after 4 attempts"
        assert result["fallback"] is True and result["fallback_reason"] == reason
        assert (result["channel"], result["requested_channel"]) == ("llm_notification", "ops")
        assert result["attempts"] == 4
        await n.seen.until(b'"stream_start"')
        (event,) = events(n.seen, "notification")
        assert (event["fallback"], event["fallback_reason"], event["requested_channel"]) == (
            True,
            reason,
            "ops",
        )
        (start,) = events(n.seen, "stream_start")
        assert start["content"] == (
            "[NOTIFICATION] (priority=normal)\n"
            f"Note: delivery via webhook failed: {reason}; delivered here instead "
            "(channel 'ops').\n"
            "deployed v2"
        )


@pytest.mark.parametrize("hook", [((502, 200), False)], indirect=True)
async def test_webhook_recovers_on_retry(hook, mock_clock):
    mock_clock.autojump_threshold = IDLE
    async with node() as n:
        result = await make_notifier(n, webhook(hook.url)).notify("s", "ada", "ops", "hi")
        assert (result["fallback"], result["attempts"], result["status_code"]) == (False, 2, 200)
        assert hook.times() == [0, 0.5]


async def test_a_webhook_carries_the_calls_idempotency_key_and_a_stable_id(hook):
    """A turn's call sends its key on; the same call run again (its turn re-run after a crash)
    is the same notification to the receiver: the same key and the same body id."""
    async with node() as n:
        notifier = make_notifier(n, webhook(hook.url))
        key = "turnstile-0123456789abcdef0123456789abcdef"
        first = await notifier.notify("s", "ada", "ops", "deployed", idempotency_key=key)
        again = await notifier.notify("s", "ada", "ops", "deployed", idempotency_key=key)
        other = await notifier.notify("s", "ada", "ops", "deployed", idempotency_key=key + ".2")
        keys = [headers["idempotency-key"] for _, _, headers, _ in hook.requests]
        ids = [json.loads(body)["id"] for _, _, _, body in hook.requests]
        assert keys == [key, key, key + ".2"]
        assert ids[0] == ids[1] == first["notification_id"] == again["notification_id"]
        assert ids[2] == other["notification_id"] != ids[0]


@pytest.mark.parametrize("hook", [((502, 200), False)], indirect=True)
async def test_without_a_call_s_key_every_retry_carries_the_notification_id(hook, mock_clock):
    mock_clock.autojump_threshold = IDLE
    async with node() as n:
        result = await make_notifier(n, webhook(hook.url)).notify("s", "ada", "ops", "hi")
        keys = [headers["idempotency-key"] for _, _, headers, _ in hook.requests]
        assert keys == [result["notification_id"]] * 2


@pytest.mark.parametrize("hook", [((404,), False)], indirect=True)
async def test_webhook_4xx_is_not_retried(hook, mock_clock):
    mock_clock.autojump_threshold = IDLE
    async with node() as n:
        result = await make_notifier(n, webhook(hook.url)).notify("s", "ada", "ops", "hi")
        assert len(hook.requests) == 1
        assert result["fallback_reason"] == "HTTP 404 Not Found (not retried)"
        assert (result["attempts"], result["status_code"]) == (1, 404)


@pytest.mark.parametrize("hook", [((200,), True)], indirect=True)
async def test_webhook_timeouts_are_retried(hook, mock_clock):
    mock_clock.autojump_threshold = IDLE
    async with node() as n:
        notifier = make_notifier(n, webhook(hook.url, timeout=2, retries=1))
        start = trio.current_time()
        result = await notifier.notify("s", "ada", "ops", "hi")
        assert trio.current_time() - start == pytest.approx(4.5)  # 2 s, 0.5 s, 2 s
        assert result["fallback_reason"] == "timed out after 2 s after 2 attempts"
        assert len(hook.requests) == 2


async def test_webhook_connection_refused_is_retried_then_falls_back(nursery, mock_clock):
    mock_clock.autojump_threshold = IDLE
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with node() as n:
        notifier = make_notifier(n, webhook(f"http://127.0.0.1:{port}/", retries=2))
        result = await notifier.notify("s", "ada", "ops", "hi")
        assert result["fallback"] and result["attempts"] == 3
        assert result["fallback_reason"].startswith("ConnectError")
        assert result["fallback_reason"].endswith("after 3 attempts")


async def test_webhook_to_a_private_address_is_refused_by_the_guard(autojump_clock):
    async with node() as n:
        sockets = NoSockets()

        async def resolver(host, port):
            return {"hooks.example.com": ["10.0.0.7"]}[host]

        notifier = make_notifier(
            n,
            webhook("http://10.1.2.3/hook"),
            ChannelConfig(name="named", type="webhook", url="https://hooks.example.com/x"),
            resolver=resolver,
            backend=sockets,
        )
        direct = await notifier.notify("s", "ada", "ops", "hi")
        assert (
            direct["fallback_reason"] == "refusing 10.1.2.3 (private address) for host '10.1.2.3'"
        )
        assert direct["attempts"] == 1  # a refusal is not retried
        named = await notifier.notify("s", "ada", "named", "hi")  # vetted after resolution
        assert named["fallback_reason"] == (
            "refusing 10.0.0.7 (private address) for host 'hooks.example.com'"
        )
        assert sockets.hosts == []
        await n.seen.until(b'"notification"', 2)
        reasons = [e["fallback_reason"] for e in events(n.seen, "notification")]
        assert reasons == [direct["fallback_reason"], named["fallback_reason"]]


async def test_loopback_needs_the_allow_list(hook):
    async with node() as n:
        notifier = make_notifier(n, webhook(hook.url), policy=NetPolicy())
        result = await notifier.notify("s", "ada", "ops", "hi")
        assert result["fallback_reason"] == (
            "refusing 127.0.0.1 (loopback address) for host '127.0.0.1'"
        )
        assert hook.requests == []


async def test_a_channel_without_fallback_raises(autojump_clock):
    async with node() as n:
        notifier = make_notifier(
            n, webhook("http://10.1.2.3/", fallback=False), backend=NoSockets()
        )
        with pytest.raises(NotificationFailed) as failed:
            await notifier.notify("s", "ada", "ops", "hi")
        assert str(failed.value) == (
            "delivery via webhook failed: refusing 10.1.2.3 (private address) for host '10.1.2.3'"
        )
        assert events(n.seen, "notification") == []


async def test_a_missing_session(autojump_clock):
    async with node() as n:
        notifier = make_notifier(n, webhook("http://10.1.2.3/"), backend=NoSockets())
        with pytest.raises(NotFound, match="no session with id 'ghost'"):
            await notifier.notify("ghost", "ada", "llm_notification", "hi")
        with pytest.raises(NotificationFailed) as failed:
            await notifier.notify("ghost", "ada", "ops", "hi")
        assert str(failed.value) == (
            "delivery via webhook failed: refusing 10.1.2.3 (private address) for host "
            "'10.1.2.3'; the fallback to llm_notification failed too: no session with id 'ghost'"
        )
        assert notifier._locks == {}


def test_webhook_channels_need_a_post_function():
    with pytest.raises(ValueError, match="webhook channels need a webhook_post"):
        Notifier(None, None, None, NotifierConfig(channels=(webhook("https://example.com/"),)))
    with pytest.raises(ValueError, match="the url must be http"):
        webhook("ftp://example.com/")


# -- log ----------------------------------------------------------------------------------------


async def test_log_lines_are_json(tmp_path):
    path = tmp_path / "notifications.jsonl"
    async with node() as n:
        notifier = make_notifier(n, ChannelConfig(name="audit", type="log", path=str(path)))
        first = await notifier.notify("s", "ada", "audit", "line one\nline two", tags=["a"])
        await notifier.notify("s", "ada", "audit", "ünïcode ✓", priority="critical")
        assert first == {
            "notification_id": first["notification_id"],
            "channel": "audit",
            "channel_type": "log",
            "delivered": True,
            "fallback": False,
            "path": str(path),
        }
    lines = path.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["message"] for r in records] == ["line one\nline two", "ünïcode ✓"]
    assert [r["priority"] for r in records] == ["normal", "urgent"]
    assert records[0]["owner"] == "ada" and records[0]["tags"] == ["a"]
    assert records[0]["id"] == first["notification_id"]


async def test_a_log_channel_logs_to_a_logger_at_its_level_as_text(tmp_path, caplog):
    """The reference's log channel: ``logger_name``, ``level`` and ``format``."""
    audit = ChannelConfig(
        name="audit", type="log", logger_name="acme.audit", level="warning", format="text"
    )
    path = tmp_path / "both.jsonl"
    both = ChannelConfig(name="both", type="log", logger_name="acme.json", path=str(path))
    caplog.set_level(logging.DEBUG, logger="acme")
    async with node() as n:
        notifier = make_notifier(n, audit, both)
        result = await notifier.notify(
            "s", "ada", "audit", "disk at 91%\nsda1", title="Disk", priority="high"
        )
        assert (result["logger"], result["delivered"], result["fallback"]) == (
            "acme.audit",
            True,
            False,
        )
        assert "path" not in result
        second = await notifier.notify("s", "ada", "both", "json line")
        assert (second["logger"], second["path"]) == ("acme.json", str(path))
    text, json_record = caplog.records
    assert (text.name, text.levelname) == ("acme.audit", "WARNING")
    assert text.getMessage() == (
        "[high] Disk: disk at 91%\\nsda1 (session s, user ada, from tool, id "
        f"{result['notification_id']})"
    )
    assert (json_record.name, json_record.levelname) == ("acme.json", "INFO")
    logged = json.loads(json_record.getMessage())
    assert logged["message"] == "json line" and logged["owner"] == "ada"
    assert json.loads(path.read_text(encoding="utf-8")) == logged


def test_a_log_channel_is_checked():
    with pytest.raises(ValueError, match="a log channel needs a path or a logger_name"):
        ChannelConfig(name="audit", type="log")
    with pytest.raises(ValueError, match="level must be one of DEBUG, INFO, WARNING"):
        ChannelConfig(name="audit", type="log", logger_name="x", level="LOUD")
    with pytest.raises(ValueError, match="format must be json or text, got 'xml'"):
        ChannelConfig(name="audit", type="log", logger_name="x", format="xml")


async def test_an_unwritable_log_falls_back(tmp_path):
    path = tmp_path / "missing" / "notifications.jsonl"
    async with node() as n:
        notifier = make_notifier(n, ChannelConfig(name="audit", type="log", path=str(path)))
        result = await notifier.notify("s", "ada", "audit", "hi")
        assert result["fallback"] is True
        assert result["fallback_reason"] == f"cannot write {path}: No such file or directory"
        await n.seen.until(b'"notification"')


# -- email --------------------------------------------------------------------------------------


def mailer(port: int, **fields) -> ChannelConfig:
    return ChannelConfig(
        name="mail",
        type="email",
        host="127.0.0.1",
        port=port,
        from_address="bot@turnstile.test",
        to=("ops@example.com",),
        timeout=5,
        **fields,
    )


async def test_email_reaches_the_smtp_server(nursery):
    smtp = FakeSMTP()
    port = await serve(nursery, smtp.handle)
    async with node() as n:
        notifier = make_notifier(
            n, mailer(port, allowed_recipients=("*@example.org",), subject_prefix="[tt] ")
        )
        result = await notifier.notify(
            "s",
            "ada",
            "mail",
            "Deployment completed for v2.3.1 ✓",
            title="Deploy\r\nBcc: evil@example.com",
            priority="high",
            structured_data={"version": "2.3.1"},
        )
        assert result["recipients"] == ["ops@example.com"] and not result["fallback"]
        other = await notifier.notify(
            "s", "ada", "mail", "hi", output_config={"to_address": "dev@example.org"}
        )
        assert other["recipients"] == ["dev@example.org"]
        again = await notifier.notify(
            "s", "ada", "mail", "hi", output_config={"to_address": ["OPS@example.com"]}
        )
        assert again["recipients"] == ["OPS@example.com"]  # a default recipient is allowed
        with pytest.raises(InvalidArgument, match="may not send to 'x@evil.com'"):
            await notifier.notify(
                "s", "ada", "mail", "hi", output_config={"to_address": "x@evil.com"}
            )
    first, second, _third = smtp.mails
    assert first["from"].upper() == "MAIL FROM:<BOT@TURNSTILE.TEST>"
    assert [r.upper() for r in first["to"]] == ["RCPT TO:<OPS@EXAMPLE.COM>"]
    assert [r.upper() for r in second["to"]] == ["RCPT TO:<DEV@EXAMPLE.ORG>"]
    assert first["helo"] == "localhost"
    message = email.message_from_bytes(first["data"], policy=email.policy.default)
    assert message["Subject"] == "[tt] Deploy Bcc: evil@example.com"  # no header injection
    assert message["Bcc"] is None
    assert message["X-Priority"] == "2 (High)"
    body = message.get_content()
    assert body.startswith("Deployment completed for v2.3.1 ✓")
    assert '"version": "2.3.1"' in body


async def test_email_goes_to_the_session_owner_through_the_user_resolver(nursery):
    """The reference's ``user_resolver``: with no ``to_address``, the owner's own address
    (before the channel's ``to``); an explicit ``to_address`` still wins; a user without an
    address gets the channel's ``to``, or an error naming what to configure."""
    smtp = FakeSMTP()
    port = await serve(nursery, smtp.handle)
    asked: list[str] = []

    async def users(user: str) -> str | None:
        asked.append(user)
        return {"ada": "ada@example.net"}.get(user)

    async with node() as n:
        resolving = mailer(port, user_resolver="users")
        bare = ChannelConfig(
            name="bare",
            type="email",
            host="127.0.0.1",
            port=port,
            from_address="bot@turnstile.test",
            timeout=5,
            user_resolver="users",
        )
        notifier = make_notifier(n, resolving, bare, user_resolver=users)
        mine = await notifier.notify("s", "ada", "mail", "yours")
        assert mine["recipients"] == ["ada@example.net"]
        named = await notifier.notify(
            "s", "ada", "mail", "named", output_config={"to_address": "ops@example.com"}
        )
        assert named["recipients"] == ["ops@example.com"]
        unknown = await notifier.notify("s", "bob", "mail", "to the default")
        assert unknown["recipients"] == ["ops@example.com"]
        with pytest.raises(InvalidArgument) as nobody:
            await notifier.notify("s", "bob", "bare", "to nobody")
        assert str(nobody.value) == (
            "user 'bob' has no email address ([[users]] email) and channel 'bare' has no "
            "default recipient; give output_config.to_address"
        )
        notifier.check_channel("bare")  # a job for it: the address is found when it fires
    assert asked == ["ada", "bob", "bob"]
    assert [[r.upper() for r in m["to"]] for m in smtp.mails] == [
        ["RCPT TO:<ADA@EXAMPLE.NET>"],
        ["RCPT TO:<OPS@EXAMPLE.COM>"],
        ["RCPT TO:<OPS@EXAMPLE.COM>"],
    ]


def test_a_user_resolver_is_for_email_and_must_be_given():
    with pytest.raises(ValueError, match="only an email channel has a user_resolver"):
        ChannelConfig(name="audit", type="log", path="x", user_resolver="users")
    with pytest.raises(ValueError, match="user_resolver must be 'users', got 'ldap'"):
        mailer(25, user_resolver="ldap")
    with pytest.raises(ValueError, match="channels with a user_resolver need one"):
        Notifier(None, None, None, NotifierConfig(channels=(mailer(25, user_resolver="users"),)))


async def test_email_failures_fall_back(nursery):
    smtp = FakeSMTP(reject_mail=True)
    port = await serve(nursery, smtp.handle)
    async with node() as n:
        notifier = make_notifier(n, mailer(port))
        result = await notifier.notify("s", "ada", "mail", "hi")
        assert result["fallback_reason"] == "SMTP 550 5.7.1 sender rejected"
        assert smtp.mails == []
        await n.seen.until(b'"notification"')


def test_notification_text_without_extras():
    assert notification_text(message="m") == "[NOTIFICATION] (priority=normal)\nm"


async def test_two_nodes_buffering_for_one_session_at_once_keep_both(autojump_clock):
    """Several nodes: two notifiers (one per node) buffer for the same unattached session at
    the same instant; each notification keeps a key of its own (the numbering read the newest
    key and wrote the next one, so the second write replaced the first)."""
    async with node() as n:
        await n.store.create_session("t", "ada")
        first, second = make_notifier(n), make_notifier(n)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.notify, "t", "ada", "llm_notification", "from a")
            nursery.start_soon(second.notify, "t", "ada", "llm_notification", "from b")
        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        assert await first.deliver_buffered("t") == 2
        assert sorted(e["message"] for e in events(client, "notification")) == ["from a", "from b"]


async def test_a_node_reads_the_log_channel_and_the_user_resolver_from_its_config(
    nursery, tmp_path, caplog
):
    """``[channels.*]`` ``logger_name``, ``level``, ``format`` and ``user_resolver``, and
    ``[[users]] email``, from a config file to ``send_notification`` on a running node."""
    smtp = FakeSMTP()
    port = await serve(nursery, smtp.handle)
    path = tmp_path / "turnstile.toml"
    path.write_text(
        f"""
store = "sqlite:///{tmp_path}/node.db"
port = 0

[[users]]
name = "ada"
token = "ada-token-0123456789"
email = "ada@example.net"

[channels.app]
type = "log"
logger_name = "acme.app"
level = "ERROR"
format = "text"

[channels.mail]
type = "email"
host = "127.0.0.1"
port = {port}
from_address = "bot@turnstile.test"
user_resolver = "users"
"""
    )
    config = load_config(path)
    caplog.set_level(logging.INFO, logger="acme")
    async with open_node(config) as running:
        session = await running.directory.create_session("ada")
        key = session_key("ada", session.id)
        for channel in ("app", "mail"):
            sent = await running.tools.call(
                key, "ada", "send_notification", {"channel": channel, "message": "hello"}
            )
            assert sent.ok and not sent.data["fallback"], sent
    (record,) = caplog.records
    assert (record.name, record.levelname) == ("acme.app", "ERROR")
    assert record.getMessage().startswith("[normal] hello (session ")
    (mail,) = smtp.mails
    assert [r.upper() for r in mail["to"]] == ["RCPT TO:<ADA@EXAMPLE.NET>"]


async def test_an_attach_through_a_node_that_does_not_hold_the_session_is_served_once_held(
    autojump_clock,
):
    """Found by issue 23's survivor runs (``notification``): a client attached through the
    surviving node while the dead node's lease had not expired yet; the attach's delivery was
    refused (``PlacedElsewhere``) and the buffer waited for an attach on the holder, which
    never came. Now the node asks again every second, for a few leases, and delivers the
    buffer as soon as the session answers there (the holder's lease expired)."""
    async with node() as n:
        await n.store.create_session("t", "ada")
        notifier = make_notifier(n)
        await notifier.notify("t", "ada", "llm_notification", "ding")
        await trio.testing.wait_all_tasks_blocked()
        held_elsewhere = [True]
        real_ask = notifier.ask_session

        async def ask(session_id, message):
            if held_elsewhere[0]:
                raise PlacedElsewhere("another node holds it")
            return await real_ask(session_id, message)

        notifier.ask_session = ask
        client = Recorder()
        await n.registry.ref("session:t").ask(Attach(subscriber=client))
        async with trio.open_nursery() as nursery:
            notifier.spawn = nursery.start_soon
            notifier.elsewhere_seconds = 30.0
            assert await notifier.deliver_buffered("t") == 0  # refused: held elsewhere
            assert await notifier.deliver_buffered("t") == 0
            await trio.sleep(5)  # (mock time) still held elsewhere: nothing yet
            assert events(client, "notification") == []
            assert notifier._retrying == {"t"}  # one task, however many attaches
            held_elsewhere[0] = False  # the holder's lease expired
            await trio.sleep(2)
            assert [e["message"] for e in events(client, "notification")] == ["ding"]
        assert notifier._retrying == set()
        assert await n.store.kv_list("notify:t") == []
