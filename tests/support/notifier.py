"""The notifier as the tests build it (``make_notifier`` over a ``node()``), the frames a
``Recorder`` got of one type (``events``), and ``NoSockets``, a socket layer that fails the
test if any connection is attempted."""

from __future__ import annotations

import json

import httpcore
import trio

from tests.support.sessions import Recorder
from turnstile.actors.notifications.actor import Notifier, NotifierConfig
from turnstile.actors.notifications.tools import guarded_webhook_post
from turnstile.tools.netguard import NetPolicy

LOCAL = NetPolicy(allowed_hosts=("127.0.0.1",))


def make_notifier(
    n, *channels, policy=LOCAL, resolver=None, backend=None, user_resolver=None, **config
) -> Notifier:
    async def ask(session_id, message):
        return await n.registry.ref(f"session:{session_id}").ask(message)

    post = guarded_webhook_post(policy, resolver=resolver, backend=backend)
    return Notifier(
        n.store,
        n.clock,
        ask,
        NotifierConfig(channels=tuple(channels), **config),
        webhook_post=post,
        user_resolver=user_resolver,
    )


def events(recorder: Recorder, type_: str) -> list[dict]:
    decoded = [json.loads(frame) for frame in recorder.frames]
    return [e for e in decoded if e["type"] == type_]


class NoSockets(httpcore.AsyncNetworkBackend):
    """A socket layer that fails the test if the guard lets any connection through."""

    def __init__(self) -> None:
        self.hosts: list[str] = []

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # noqa: ASYNC109
        self.hosts.append(host)
        raise AssertionError(f"a connection to {host} was attempted")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)
