"""What ``Memory`` tells whoever keeps a copy of its data: which user's memory was written, and
what of it.

A cache of memory's rows (``injection.SummaryCache``) must forget an entry when the row
changes, whoever changed it: a route, a tool, extraction, or another node on the same database.
``Memory`` is the one place every write goes through, so it is the one that says so: a
subscriber registered with ``Memory.subscribe`` is called with a ``UserChanged`` after each
write of this node (committed, failed or cancelled: telling too often costs a read, telling
too little serves stale data), and with what other nodes announce.

Across nodes (PostgreSQL): the writes a cache on another node depends on (a summary set, a
user's memory deleted) announce a ``UserChanged`` on the notification channel ``CHANNEL``, from
inside the write's own transaction (``changes.py``), so it is sent exactly when the change
commits. Each node's ``Memory.listen`` hears them and tells its subscribers. Saves and forgets
are not announced: no node keeps facts (the SQLite vector stage's matrices are one node's and
checked against a version row at every search), and a notification per save would make every
save's commit wait on PostgreSQL's notification queue.

A notification is a hint, not a delivery: one sent while a node's listening connection is down
is lost. So after every (re)connection ``listen`` tells its subscribers ``AllChanged`` (forget
everything), and a cache still bounds how long it keeps an entry (``[memory]
summary_cache_seconds``), for whatever writes without announcing (a node of an older release,
SQL typed by hand).

The payload is the notice as JSON, one type for the writer and the reader. A user name too long
for a notification (PostgreSQL takes under 8000 bytes) is announced as ``AllChanged``.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import msgspec
import trio

__all__ = [
    "CHANNEL",
    "AllChanged",
    "MemoryNotice",
    "Notices",
    "Subscriber",
    "UserChanged",
    "announcement",
    "read_announcement",
]

log = logging.getLogger("turnstile.memory")

#: The memory feature's notification channel (``Store.notify`` / ``Store.listen``).
CHANNEL = "turnstile_memory"

#: The longest payload announced (PostgreSQL refuses 8000 bytes or more).
MAX_PAYLOAD_BYTES = 7900


class UserChanged(msgspec.Struct, tag="user", frozen=True, kw_only=True):
    """One user's memory was written.

    Attributes:
        owner: whose memory.
        what: ``facts`` (a save or a forget, expired facts deleted with it), ``summary`` (set:
            ``PUT /memory/summary``, extraction) or ``deleted`` (everything, ``DELETE /memory``).
        origin: the ``Memory`` that wrote (``Memory.origin``, one per node process), so a node
            ignores its own announcements; ``""`` when not known.
    """

    owner: str
    what: Literal["facts", "summary", "deleted"]
    origin: str = ""


class AllChanged(msgspec.Struct, tag="all", frozen=True, kw_only=True):
    """Any user's memory may have changed: forget every copy.

    Attributes:
        why: for the log: announcements may have been missed (the listener (re)connected), one
            could not be read, or a user's name was too long to announce.
        origin: as ``UserChanged.origin``.
    """

    why: str
    origin: str = ""


#: What a subscriber is told.
MemoryNotice = UserChanged | AllChanged

#: ``Memory.subscribe``'s callable: called in the task that wrote (or the listener's), it must
#: not block; one that raises is logged and the others are still told.
Subscriber = Callable[[MemoryNotice], None]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(MemoryNotice).decode


def announcement(notice: UserChanged) -> str:
    """The notification payload of ``notice``: itself as JSON, or an ``AllChanged`` when the
    owner's name makes it too long to send."""
    payload = _encode(notice)
    if len(payload) > MAX_PAYLOAD_BYTES:
        payload = _encode(AllChanged(why="a user name too long to announce", origin=notice.origin))
    return payload.decode()


def read_announcement(payload: str) -> MemoryNotice:
    """The notice another node announced; ``AllChanged`` (logged) for a payload that does not
    decode, since something was written and we cannot tell what."""
    try:
        return _decode(payload)
    except msgspec.DecodeError as exc:  # (a ValidationError too: its subclass)
        log.warning("memory: an announcement that does not decode (%s): forgetting every copy", exc)
        return AllChanged(why="an announcement that does not decode")


class Notices:
    """One ``Memory``'s subscribers, and how they are told.

    Attributes:
        origin: this ``Memory``'s name in what it announces (random, one per node process),
            so that its own announcements, heard back, are not told twice.
        listening: set once ``Memory.listen`` has connected (what others announce from then
            on is heard).
    """

    def __init__(self) -> None:
        self.origin = secrets.token_hex(8)
        self.listening = trio.Event()
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Tell ``subscriber`` every notice from now on; returns what ends that."""
        self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

        return unsubscribe

    def tell(self, notice: MemoryNotice) -> None:
        """Call every subscriber with ``notice``; one that raises is logged, the rest are
        still told."""
        for subscriber in list(self._subscribers):
            try:
                subscriber(notice)
            except Exception:
                log.exception("memory: a subscriber failed on %r", notice)

    @contextmanager
    def telling(
        self, owner: str, what: Literal["facts", "summary", "deleted"]
    ) -> Iterator[UserChanged]:
        """Around one write of ``owner``'s memory: tell the subscribers once it ended, however
        it ended (a write that failed or was cancelled may still have committed; telling in
        vain costs a cache one read, not telling serves stale data). Yields the notice."""
        notice = UserChanged(owner=owner, what=what, origin=self.origin)
        try:
            yield notice
        finally:
            self.tell(notice)

    def heard(self, payload: str | None) -> None:
        """``Store.listen``'s callback: tell the subscribers what another node announced, or
        ``AllChanged`` (``None``: listening anew, announcements may have been missed)."""
        if payload is None:
            self.tell(AllChanged(why="listening anew: announcements may have been missed"))
            self.listening.set()
            return
        notice = read_announcement(payload)
        if notice.origin != self.origin:  # this node's own writes were told as they ended
            self.tell(notice)
