"""User topics: per-user event streams that a feature keeps and the gateway pushes live.

Session events reach whoever attached to the session. Some events belong to a *user* instead
(what a user's long-term memory holds changed, say): they must reach every WebSocket of that
user, whatever sessions those watch, and nobody else's. A feature offers such a stream as a
*topic*: it keeps the events durably in a log of its own, each with a per-user ``seq`` that only
grows, registers the log here under the topic's name (``UserTopics.register``), and after each
commit publishes the new events (``UserTopics.publish(user, topic, events)``). The kernel knows
topics by name only; what they carry is the feature's business.

A client subscribes with a ``subscribe`` frame (``runtime.gateway.connection``), optionally
``after_seq`` the last one it saw; it gets what the log holds after that, then live events, each
once and in order, exactly as attaching to a session with ``after_seq`` works. ``publish`` never
blocks: a connection whose outbox is full is dropped from the topic (``lagged``) and catches up
by subscribing again from the last ``seq`` it got.

Logs may forget (``TopicHead.pruned_seq``): an event a later one makes moot can be removed (a
saved value later deleted), so ``seq`` may have gaps, and a log may cap what it keeps per user.
A client whose ``after_seq`` is older than what the log still holds in full is told ``reset``:
it reloads the state the topic describes and goes on live.

Publishing happens on the node that made the change. Clients of other nodes sharing the
database see the events when they subscribe again with ``after_seq`` (or read the feature's
own catch-up route); there is no cross-node push.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

import msgspec

from turnstile.runtime.errors import NotFound
from turnstile.runtime.gateway.frames import TOPIC_PATTERN, TopicEvent, encode_topic_event

__all__ = [
    "TOPIC_PATTERN",
    "TopicEvent",
    "TopicHead",
    "TopicLog",
    "TopicSubscriber",
    "UserTopics",
    "UserTopicsStatistics",
]

_NAME = re.compile(TOPIC_PATTERN)


class TopicHead(msgspec.Struct, frozen=True):
    """Where a user's log of a topic stands.

    Attributes:
        last_seq: the ``seq`` of the latest event (0: none yet).
        pruned_seq: events up to this ``seq`` may have been dropped without being made moot
            (the log keeps a bounded number per user): a client that saw less than this must
            reload (0: nothing was).
    """

    last_seq: int = 0
    pruned_seq: int = 0


class TopicLog(Protocol):
    """A feature's durable per-user log behind a topic."""

    async def head(self, user: str) -> TopicHead:
        """Where ``user``'s log stands."""
        ...

    async def read(self, user: str, after_seq: int, limit: int) -> list[TopicEvent]:
        """``user``'s events after ``after_seq``, oldest first, at most ``limit``."""
        ...


class TopicSubscriber(Protocol):
    """A client's connection, as a topic sees it."""

    def offer_topic(self, topic: str, seq: int, frame: bytes) -> bool:
        """Queue an encoded event without blocking; False means the client fell behind."""
        ...

    def topic_lagged(self, topic: str) -> None:
        """The topic dropped this client because it fell behind."""
        ...


class UserTopicsStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of ``UserTopics``.

    Attributes:
        topics: registered topic names.
        subscriptions: (user, topic, connection) subscriptions now.
        published: events published so far.
        delivered: events offered to a subscribed connection and queued.
        lagged: subscriptions dropped because their client fell behind.
    """

    topics: tuple[str, ...]
    subscriptions: int
    published: int
    delivered: int
    lagged: int


class UserTopics:
    """The node's topics, and which of each user's connections listen to which.

    Every method is synchronous except through the logs, and ``publish`` never waits: it is
    safe to call right after a feature's commit, from any task.
    """

    def __init__(self) -> None:
        self._logs: dict[str, TopicLog] = {}
        self._subscribers: dict[tuple[str, str], set[TopicSubscriber]] = {}
        self._published = 0
        self._delivered = 0
        self._lagged = 0

    def register(self, name: str, log: TopicLog) -> None:
        """Offer the topic ``name`` backed by ``log``.

        Raises:
            ValueError: a name that does not follow ``TOPIC_PATTERN``, or one already taken.
        """
        if _NAME.search(name) is None:
            raise ValueError(f"topic name must match {TOPIC_PATTERN}: {name!r}")
        if name in self._logs:
            raise ValueError(f"topic {name!r} is already registered")
        self._logs[name] = log

    def names(self) -> tuple[str, ...]:
        """The registered topics, in registration order."""
        return tuple(self._logs)

    def log(self, name: str) -> TopicLog:
        """The log behind ``name``.

        Raises:
            NotFound: no such topic on this node.
        """
        try:
            return self._logs[name]
        except KeyError:
            raise NotFound(f"no topic {name!r} on this node") from None

    def subscribe(self, user: str, name: str, subscriber: TopicSubscriber) -> TopicLog:
        """Offer ``user``'s events of ``name`` to ``subscriber`` from now on; the topic's log.

        Raises:
            NotFound: no such topic.
        """
        log = self.log(name)
        self._subscribers.setdefault((user, name), set()).add(subscriber)
        return log

    def unsubscribe(self, user: str, name: str, subscriber: TopicSubscriber) -> None:
        """Stop offering ``name`` to ``subscriber`` (nothing if it was not subscribed)."""
        subscribers = self._subscribers.get((user, name))
        if subscribers is None:
            return
        subscribers.discard(subscriber)
        if not subscribers:
            del self._subscribers[(user, name)]

    def publish(self, user: str, name: str, events: Sequence[TopicEvent]) -> int:
        """Offer ``events`` (committed, in ``seq`` order) to ``user``'s subscribed connections
        and to nobody else's; a connection that cannot take one is dropped from the topic.

        Returns:
            how many connections were offered the events.

        Raises:
            NotFound: no such topic.
        """
        self.log(name)
        self._published += len(events)
        subscribers = self._subscribers.get((user, name))
        if not subscribers or not events:
            return 0
        frames = [(e.seq, encode_topic_event(name, e)) for e in events]
        offered = 0
        for subscriber in list(subscribers):
            offered += 1
            for seq, frame in frames:
                if not subscriber.offer_topic(name, seq, frame):
                    self._lagged += 1
                    self.unsubscribe(user, name, subscriber)
                    subscriber.topic_lagged(name)
                    break
                self._delivered += 1
        return offered

    def statistics(self) -> UserTopicsStatistics:
        """Topics, subscriptions and events so far."""
        return UserTopicsStatistics(
            topics=self.names(),
            subscriptions=sum(len(s) for s in self._subscribers.values()),
            published=self._published,
            delivered=self._delivered,
            lagged=self._lagged,
        )
