"""Live events of sessions another node holds, followed for this node's clients.

Several nodes (``remote``): a client connected to a node that does not hold its session still
attaches there. That node follows the session (one :class:`_Feed` per session, whatever the
number of its clients): it says so on the sessions' channel (``w <key>``, again every
:data:`WATCH_SECONDS`), and the holder then announces each stored batch of that session
(``e <key> <seq>``, which ``RemoteSessions`` turns into :meth:`SessionFeeds.poke`). The follower
reads the events after the last one it offered from the store, by ``seq``, on each
announcement and every :data:`POLL_SECONDS` besides, and offers them to its clients. A lost
notification delays an event by at most that long; it never loses one, and the order and
gaplessness are the store's. A session deleted (or created again under its key) ends its
feed: its clients are told it was deleted.

It is apart from ``remote`` because following is the one remote operation with state of its
own (the feeds and their tasks); it reaches the channel only through the ``notify`` it is
given, and hears it through ``RemoteSessions``, which owns the channel's one handler.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from datetime import datetime

import trio

from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import NotFound, StoreError
from turnstile.runtime.gateway.backend import Attached, Subscriber
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.store import EventRecord, Store

__all__ = ["FOLLOW_LAG", "PAGE", "POLL_SECONDS", "WATCH_SECONDS", "SessionFeeds"]

log = logging.getLogger("turnstile.session")

#: how often a followed session is read even without an announcement (and how often the
#: requests to a session's holder are read: ``remote``)
POLL_SECONDS = 1.0
#: The histogram of a followed event's lag (``SessionFeeds``' ``metrics``).
FOLLOW_LAG = "turnstile_follow_lag_seconds"
#: how often a follower says again that it follows; a holder announces a session's batches
#: for three times as long after it last heard so
WATCH_SECONDS = 10.0
#: events (and requests, in ``remote``) read per store round trip
PAGE = 500


class _Feed:
    """One session another node holds, followed for this node's clients."""

    __slots__ = ("key", "public_id", "subscribers", "last_seq", "poked", "created_at", "recheck")

    def __init__(self, key: str, public_id: str, last_seq: int, created_at: datetime) -> None:
        self.key = key
        self.public_id = public_id
        self.subscribers: set[Subscriber] = set()
        self.last_seq = last_seq
        self.poked = trio.Event()
        #: the followed session's, to tell it from a later one of the same key
        self.created_at = created_at
        #: a delete of the key was announced (or may have been missed): read its row again
        self.recheck = False


class SessionFeeds:
    """The sessions held elsewhere that this node's clients follow (see the module docstring).

    Args:
        store: the shared store.
        encode_event: the gateway frame of a stored event (``SessionServices.encode_event``).
        notify: says something on the sessions' channel (a hint: it never raises).
        clock: the wall clock a followed event's lag is measured by.
        metrics: where the follow lag goes (``turnstile_follow_lag_seconds``: a followed
            event's time in the store, by the holder's clock, to its offer to this node's
            clients; a lost notification shows as up to ``POLL_SECONDS`` more).
    """

    def __init__(
        self,
        store: Store,
        encode_event: Callable[[str, EventRecord], bytes],
        notify: Callable[[str], Awaitable[None]],
        *,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self.store = store
        self.clock = clock
        self._encode = encode_event
        self._notify = notify
        self._metrics = metrics
        metrics.histogram(
            FOLLOW_LAG,
            "Several nodes: a session event stored by the node that holds the session, to its"
            " offer to the clients of this node that follow it (announcement, then read by seq).",
        )
        self._feeds: dict[str, _Feed] = {}
        #: where the feeds' tasks run (``RemoteSessions.run`` sets it)
        self.nursery: trio.Nursery | None = None

    async def attach(
        self, key: str, public_id: str, subscriber: Subscriber, *, after_seq: int | None = None
    ) -> Attached:
        """Follow ``key`` for ``subscriber``: its state now, then its events as stored (those
        after ``after_seq`` when given: a client this node's activation of the session was
        offering them to, handed over as the node drains).

        Raises:
            NotFound: the session is gone.
        """
        session = await self.store.get_session(key)
        feed = self._feeds.get(key)
        if feed is None:
            last = session.last_seq if after_seq is None else after_seq
            feed = self._feeds[key] = _Feed(key, public_id, last, session.created_at)
            assert self.nursery is not None, "RemoteSessions.run is not running"
            self.nursery.start_soon(self._follow, feed, name=f"follow session {key}")
        feed.subscribers.add(subscriber)
        running = await self.store.list_inputs(key, ["running", "queued"])
        current = next((i.id for i in running if i.state == "running"), None)
        return Attached(
            last_seq=feed.last_seq,
            busy=current is not None,
            policy=session.policy,
            queued=sum(1 for i in running if i.state == "queued"),
            current_input_id=current,
        )

    def detach(self, key: str, subscriber: Subscriber) -> bool:
        """Stop following ``key`` for ``subscriber``; False if it was not following here."""
        feed = self._feeds.get(key)
        if feed is None or subscriber not in feed.subscribers:
            return False
        feed.subscribers.discard(subscriber)
        feed.poked.set()  # the follower ends once nobody is left
        return True

    def poke(self, key: str) -> None:
        """The holder announced stored events of ``key``: read them now, if followed here."""
        feed = self._feeds.get(key)
        if feed is not None:
            feed.poked.set()

    def poke_all(self) -> None:
        """Read every followed session now (announcements may have been missed)."""
        for feed in self._feeds.values():
            feed.poked.set()

    def recheck(self, key: str | None) -> None:
        """A delete of ``key`` (None: of any session) was announced, or may have been missed:
        read its row again now, and end its feed if it is gone or is a later session."""
        feeds = self._feeds.values() if key is None else filter(None, [self._feeds.get(key)])
        for feed in feeds:
            feed.recheck = True
            feed.poked.set()

    async def _follow(self, feed: _Feed) -> None:
        said = -math.inf
        try:
            while feed.subscribers:
                if trio.current_time() - said >= WATCH_SECONDS:
                    said = trio.current_time()
                    await self._notify(f"w {feed.key}")
                with trio.move_on_after(POLL_SECONDS):
                    await feed.poked.wait()
                feed.poked = trio.Event()
                try:
                    if feed.recheck:
                        feed.recheck = False
                        await self._same_session(feed)
                    await self._catch_up(feed)
                except NotFound:  # deleted: nothing more will come
                    for subscriber in list(feed.subscribers):
                        subscriber.deleted(feed.public_id)
                    feed.subscribers.clear()
                except StoreError as exc:
                    log.warning("following session %s: %s", feed.key, exc)
        finally:
            if self._feeds.get(feed.key) is feed:
                del self._feeds[feed.key]

    async def _same_session(self, feed: _Feed) -> None:
        """Raise ``NotFound`` unless ``feed``'s session is still the one it followed (not
        deleted, nor created again under its key since)."""
        session = await self.store.get_session(feed.key)
        if session.created_at != feed.created_at:
            raise NotFound(f"no session with id {feed.public_id!r}")

    async def _catch_up(self, feed: _Feed) -> None:
        while feed.subscribers:
            page = await self.store.read_events(feed.key, feed.last_seq, PAGE)
            now = self.clock.now()
            for record in page:
                self._metrics.observe(FOLLOW_LAG, max(0.0, (now - record.ts).total_seconds()))
                frame = self._encode(feed.public_id, record)
                for subscriber in list(feed.subscribers):
                    if not subscriber.offer(feed.public_id, record.seq, frame):
                        feed.subscribers.discard(subscriber)
                        subscriber.lagged(feed.public_id, record.seq - 1)
                feed.last_seq = record.seq
            if len(page) < PAGE:
                return
