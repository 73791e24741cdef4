"""The ``llm_notification`` channel: into the session, and the buffer for unattached clients.

An ``llm_notification`` goes into the session. The agent gets it as an ``Inject`` (folded into
the running turn, or a turn of its own when the session is idle) whose text starts with
``[NOTIFICATION]`` (``notification_text``); attached clients get a ``notification`` event
(``Publish``).

**What is injected, what is buffered.** The agent always gets an ``llm_notification`` (and every
fallback) as an ``Inject``, whether or not a client is attached — the agent never misses one.
The *client-facing* ``notification`` event is published at once when the session has an
attached client; when it has none, the event is not written to the session log but kept in the
store's key-value table (namespace ``notify:<session_id>``, keys a zero-padded number — the
arrival time in nanoseconds, or one more than the newest key's if that is later — and a random
suffix, so key order is arrival order and two nodes buffering for one session at once never
take the same key; expiring after ``buffer_ttl_seconds``, at most ``max_buffered`` per session,
oldest dropped first). ``deliver_buffered`` publishes them, in order, when a client
attaches: a ``notifications_dropped`` event first when some were dropped (``dropped: 5``), then
each as a ``notification`` event with ``buffered: true`` and its original ``created_at``.
Notifications to external channels (webhook, log, email) that succeed produce no session event.

**Order.** Everything the notifier does for one session — the attached-or-not decision, the
publish or buffer, the inject, delivering the buffer — happens under that session's lock, and a
notification for an attached session first flushes anything still buffered, so clients see
notifications in arrival order even if a notification races with an attach.

**A crash.** Publishing a buffered notification and forgetting it are two commits. A flush
first records which notifications it publishes and where the session's log stood (the
``publishing`` key of ``notify-meta:<session_id>``); the flush after a crash between the two
finds those already in the log and forgets them without publishing them again: each is
published once.

``SessionBufferMixin`` is the part of ``Notifier`` that does this. It is separate from the
notifier because it is the part with ordering rules and stored state (the buffer), and every
other channel falls back to it. The mixin uses the notifier's ``ask_session``, ``store``,
``clock``, ``config`` and ``_lock``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import msgspec
import trio
from msgspec import UNSET

from turnstile.actors.notifications.base import NotifierBase
from turnstile.actors.notifications.config import LLM, ChannelConfig, _Notification
from turnstile.actors.notifications.events import Notification, NotificationsDropped
from turnstile.actors.sessions.actor import GetStatus, Inject, Publish
from turnstile.runtime.errors import NotFound, PlacedElsewhere, StoreError

log = logging.getLogger("turnstile.notifications")

#: A buffer key is its number, zero-padded to this many digits (``Store.kv_append``).
_KEY_DIGITS = 20

#: Shielded clean-up after a cancelled buffer delivery is bounded by this.
CLEANUP_GRACE_SECONDS = 5.0
#: how often an attach's delivery of the buffer is tried when the store refuses one of its
#: writes (half a second more between each): each try finds what the one before published
FLUSH_TRIES = 3
#: the buffer's meta key naming the notifications a flush is publishing (``_flush``)
_PUBLISHING = "publishing"
#: how often an attach whose session another node held asks again (``_deliver_once_held``)
ELSEWHERE_RETRY_SECONDS = 1.0


def notification_text(
    *,
    message: str,
    title: str = "",
    priority: str = "normal",
    tags: Sequence[str] = (),
    structured_data: Mapping[str, Any] | None = None,
    failed: tuple[ChannelConfig, str] | None = None,
) -> str:
    """The text the agent gets for a notification.

    ``[NOTIFICATION] <title> (priority=…, tags=…)``, then — for a fallback — ``Note: delivery
    via <type> failed: <reason>; delivered here instead (channel '<name>').``, the message, and
    ``Data: <json>`` when there is structured data.
    """
    head = "[NOTIFICATION]" + (f" {title}" if title else "")
    meta = [f"priority={priority}"]
    if tags:
        meta.append(f"tags={','.join(tags)}")
    lines = [f"{head} ({', '.join(meta)})"]
    if failed is not None:
        channel, reason = failed
        lines.append(
            f"Note: delivery via {channel.type} failed: {reason}; delivered here instead "
            f"(channel '{channel.name}')."
        )
    lines.append(message)
    if structured_data:
        lines.append("Data: " + json.dumps(structured_data, ensure_ascii=False, default=str))
    return "\n".join(lines)


class SessionBufferMixin(NotifierBase):
    """``Notifier``'s session channel and buffer. See the module docstring."""

    async def _deliver_llm(
        self, note: _Notification, failed: tuple[ChannelConfig, str] | None = None
    ) -> dict[str, Any]:
        event = Notification(
            notification_id=note.id,
            channel=LLM,
            title=note.title,
            message=note.message,
            priority=note.priority,
            tags=list(note.tags),
            structured_data=note.structured_data,
            source=note.source,
            created_at=note.created_at,
            fallback=failed is not None,
            requested_channel=UNSET if failed is None else failed[0].name,
            fallback_reason=UNSET if failed is None else failed[1],
        )
        text = notification_text(
            message=note.message,
            title=note.title,
            priority=note.priority,
            tags=note.tags,
            structured_data=note.structured_data,
            failed=failed,
        )
        session_id = note.session_id
        inject = Inject(source="notification", content=text, payload={"notification_id": note.id})
        async with self._lock(session_id):
            try:
                status = await self.ask_session(session_id, GetStatus())
            except PlacedElsewhere:  # another node holds the session (several nodes)
                status = None
            buffered = status is None or status.subscribers == 0
            if buffered:
                await self._buffer(session_id, event)
            else:
                await self._flush(session_id)  # anything older goes first
                await self.ask_session(session_id, Publish(event=event))
            if status is None and self.tell_session is not None:
                # stored as the session's input and announced to its node (NodeContext)
                await self.tell_session(session_id, inject)
            else:
                await self.ask_session(session_id, inject)
        return {
            "notification_id": note.id,
            "channel": LLM,
            "channel_type": LLM,
            "delivered": True,
            "fallback": failed is not None,
            "injected": True,
            "buffered": buffered,
        }

    def _namespaces(self, session_id: str) -> tuple[str, str]:
        return f"notify:{session_id}", f"notify-meta:{session_id}"

    async def _buffered(self, session_id: str) -> list[tuple[str, dict[str, Any]]]:
        namespace, _ = self._namespaces(session_id)
        items: list[tuple[str, dict[str, Any]]] = []
        after: str | None = None
        while True:
            page = await self.store.kv_list(namespace, after_key=after, limit=500)
            items.extend(page)
            if len(page) < 500:
                return items
            after = page[-1][0]

    async def _buffer(self, session_id: str, event: Notification) -> int:
        """Keep ``event`` for the next attach (its stored payload: ``_flush`` converts it
        back) under the session's next buffer number; the oldest beyond ``max_buffered`` go
        in the same transaction. Returns the number."""
        namespace, _ = self._namespaces(session_id)
        expires = self.clock.now() + timedelta(seconds=self.config.buffer_ttl_seconds)
        return await self.store.kv_append(
            namespace, event.stored()[1], expires_at=expires, keep=self.config.max_buffered
        )

    async def _pending(self, session_id: str) -> tuple[list[tuple[str, dict[str, Any]]], int, int]:
        """What waits: the buffered items up to the newest number, how many of the numbers
        since the last delivery are gone (dropped beyond ``max_buffered``, or expired), and
        that newest number (0 when nothing was numbered yet).

        Numbers are gapless per session whichever node buffered (``Store.kv_append``), so
        what is missing between the last delivered number and the newest one was dropped.
        """
        namespace, meta = self._namespaces(session_id)
        counter = await self.store.kv_get(namespace, "")  # read first: items after it wait
        top = int(counter["seq"]) if counter else 0
        older, numbered = [], []  # an older release's keys (time and suffix) came first
        for key, stored in await self._buffered(session_id):
            if len(key) != _KEY_DIGITS:
                older.append((key, stored))
            elif int(key) <= top:
                numbered.append((key, stored))
        seen = await self.store.kv_get(meta, "delivered")
        legacy = await self.store.kv_get(meta, "dropped")  # an older release's count
        dropped = int(legacy.get("dropped", 0)) if legacy else 0
        dropped += top - (int(seen["seq"]) if seen else 0) - len(numbered)
        return older + numbered, max(dropped, 0), top

    async def _flush(self, session_id: str) -> int:
        """Publish the buffered events in order, then forget them (the lock is held)."""
        namespace, meta = self._namespaces(session_id)
        items, dropped, top = await self._pending(session_id)
        if dropped:
            await self.ask_session(
                session_id,
                Publish(
                    event=NotificationsDropped(
                        dropped=dropped,
                        max_buffered=self.config.max_buffered,
                        message=f"{dropped} dropped: more than "
                        f"{self.config.max_buffered} notifications arrived while no client "
                        "was attached (the oldest were dropped), or they waited longer than "
                        f"{self.config.buffer_ttl_seconds:g} s",
                    )
                ),
            )
            await self.store.kv_delete(meta, ["dropped"])
        if top:  # what is missing up to here is accounted for
            await self.store.kv_put(meta, [("delivered", {"seq": top}, None)])
        items = await self._unpublished(session_id, items)
        if items:
            # Publishing and forgetting are two commits: say first what is being published
            # and from where in the log, so the next flush after a crash between them finds
            # what was published and does not publish it again.
            ids = [str(stored.get("notification_id", "")) for _, stored in items]
            after = await self.store.last_seq(session_id)
            await self.store.kv_put(meta, [(_PUBLISHING, {"after": after, "ids": ids}, None)])
        delivered = 0
        try:
            for key, stored in items:
                event = _from_buffer(session_id, key, stored)
                if event is not None:
                    await self.ask_session(session_id, Publish(event=event))
                delivered += 1
        finally:
            if delivered:
                with trio.move_on_after(CLEANUP_GRACE_SECONDS, shield=True):
                    await self.store.kv_delete(namespace, [key for key, _ in items[:delivered]])
                    if delivered == len(items):
                        await self.store.kv_delete(meta, [_PUBLISHING])
        return delivered

    async def _unpublished(
        self, session_id: str, items: list[tuple[str, dict[str, Any]]]
    ) -> list[tuple[str, dict[str, Any]]]:
        """``items`` but those a flush cut short (a crash after publishing them, before
        forgetting them) already published: those are forgotten now. Reads the log only
        after such a cut, from where that flush began."""
        namespace, meta = self._namespaces(session_id)
        marker = await self.store.kv_get(meta, _PUBLISHING)
        if not marker:
            return items
        wanted = {str(i) for i in marker.get("ids", ())}
        seen: set[str] = set()
        after = int(marker.get("after", 0))
        while items:
            page = await self.store.read_events(session_id, after, 1000)
            for record in page:
                if record.type == "notification":
                    ident = str(record.payload.get("notification_id", ""))
                    if ident in wanted:
                        seen.add(ident)
            if len(page) < 1000:
                break
            after = page[-1].seq
        done = [key for key, stored in items if str(stored.get("notification_id", "")) in seen]
        if done:
            log.info(
                "%d buffered notification(s) of session %s were published before a restart:"
                " not published again",
                len(done),
                session_id,
            )
            await self.store.kv_delete(namespace, done)
        await self.store.kv_delete(meta, [_PUBLISHING])  # settled: the rest is published anew
        return [(key, stored) for key, stored in items if key not in set(done)]

    async def deliver_buffered(self, session_id: str) -> int:
        """Publish the notifications buffered while no client was attached, oldest first.

        Call it right after a client attaches (outside the session actor's ``receive``: it
        asks the session). A ``notifications_dropped`` event comes first when the buffer
        overflowed; each notification then arrives as a ``notification`` event with
        ``buffered: true``, and is deleted from the buffer once published.

        Returns:
            How many notifications were delivered.
        """
        async with self._lock(session_id):
            for attempt in range(1, FLUSH_TRIES + 1):
                try:
                    return await self._flush(session_id)
                except PlacedElsewhere:  # (a client of a node that does not hold the session)
                    self._once_held(session_id)
                    return 0  # nothing was published yet
                except StoreError as exc:
                    # A refused write (issue 23's crash harness, ``--fault fail``) failed the
                    # attach and left the buffer for the next one. Each step is safe to run
                    # again: what a cut flush published is found and not published twice.
                    if isinstance(exc, NotFound) or attempt == FLUSH_TRIES:
                        raise
                    log.warning(
                        "delivering session %s's buffered notifications failed (trying again): %s",
                        session_id,
                        exc,
                    )
                    await trio.sleep(0.5 * attempt)
            raise AssertionError("unreachable")

    def _once_held(self, session_id: str) -> None:
        """Deliver the buffer in the background once the session is held here or by nobody
        (``_deliver_once_held``), when the feature gave a way to (``spawn``)."""
        if self.spawn is not None and session_id not in self._retrying:
            self._retrying.add(session_id)
            self.spawn(self._deliver_once_held, session_id, name=f"buffer of {session_id}")

    async def _deliver_once_held(self, session_id: str) -> None:
        """An attach found the session held by another node: ask again every
        ``ELSEWHERE_RETRY_SECONDS``, for ``elsewhere_seconds``, and deliver the buffer once
        the session answers here. The holder may be dying: once its lease expired the session
        activates here and the clients attached here get what was buffered, rather than
        waiting for their next attach (issue 23's survivor runs, ``notification``: the client
        attached to the survivor before the dead node's lease expired, and never got it). A
        holder that lives on keeps the buffer for its own clients' attach, as before."""
        try:
            deadline = trio.current_time() + self.elsewhere_seconds
            while trio.current_time() < deadline:
                await trio.sleep(ELSEWHERE_RETRY_SECONDS)
                if not (await self._buffered(session_id)):
                    return  # delivered by another attach meanwhile, or expired
                try:
                    await self.ask_session(session_id, GetStatus())  # held here now?
                    async with self._lock(session_id):
                        await self._flush(session_id)
                    return
                except PlacedElsewhere:
                    continue
                except NotFound:
                    return
                except StoreError as exc:
                    log.warning("delivering session %s's buffer: %s", session_id, exc)
        finally:
            self._retrying.discard(session_id)

    async def buffered(self, session_id: str) -> tuple[list[Notification], int]:
        """What waits for a client to attach, without delivering or forgetting any of it.

        Returns:
            The buffered notifications, oldest first (as ``deliver_buffered`` would publish
            them, ``buffered: true``), and how many were dropped from the buffer since it was
            last delivered.
        """
        async with self._lock(session_id):
            items, dropped, _ = await self._pending(session_id)
        waiting = [_from_buffer(session_id, key, stored) for key, stored in items]
        return [event for event in waiting if event is not None], dropped

    async def discard_buffered(self, session_id: str) -> int:
        """Forget a session's buffered notifications (when the session is deleted).

        Returns:
            How many were discarded.
        """
        namespace, meta = self._namespaces(session_id)
        async with self._lock(session_id):
            items = await self._buffered(session_id)
            await self.store.kv_delete(meta, ["dropped", "delivered"])
            await self.store.kv_delete(namespace, [""])  # the numbering ends with the session
            return await self.store.kv_delete(namespace, [key for key, _ in items])


def _from_buffer(session_id: str, key: str, stored: dict[str, Any]) -> Notification | None:
    """A buffered notification as it is published on attach (``buffered: true``); None
    (logged) for a row that is not one (damaged, or written by hand): it is dropped."""
    try:
        event = msgspec.convert(stored, Notification)
    except msgspec.ValidationError as exc:
        log.warning("dropped buffered notification %s of session %s: %s", key, session_id, exc)
        return None
    return msgspec.structs.replace(event, buffered=True)
