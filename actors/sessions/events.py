"""A session's event log: events stored in batches, in order, then offered to subscribers.

Events are appended to the session's log in the store (which assigns the gap-free ``seq``)
and only then offered to every attached subscriber; offering never blocks the session, so a
slow client cannot stall a turn. Streamed deltas do not wait for their commit (see
``EventLog.emit``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from turnstile.runtime.errors import ConflictError, Fenced, NotFound, StoreError, StoreUnavailable
from turnstile.runtime.gateway.backend import Subscriber
from turnstile.runtime.store import EventRecord, InboxItem, Step, Store

__all__ = ["Closure", "EventLog", "MAX_UNSTORED_EVENTS"]

log = logging.getLogger("turnstile.session")

#: Events an agent may stream ahead of the store before its next one waits for a commit.
MAX_UNSTORED_EVENTS = 256
#: How long a batch the store refuses as unavailable is tried again before it fails.
RETRY_SECONDS = 60.0
#: Tries again of a batch the store refused for another reason than an outage.
RETRIES = 3


class Closure(msgspec.Struct, frozen=True, kw_only=True):
    """A turn's input closed in the same transaction as the batch its closing events are in
    (``Store.close_input``).

    Attributes:
        input_id: the turn's input, ``running``.
        state: ``done``, ``failed`` or ``interrupted``.
        detail: the input's detail.
        steps: further writes of that transaction (the input's kind settles what it keeps).
    """

    input_id: int
    state: str
    detail: dict[str, Any] | None = None
    steps: tuple[Step, ...] = ()


class _EventBatch:
    """Events stored together; ``done`` is set once they are stored and offered, or failed.
    With ``closure``, the batch also closes a turn's input, in the same transaction."""

    __slots__ = ("events", "done", "error", "closure", "closed", "queued")

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.closure: Closure | None = None
        #: the closed input, as stored
        self.closed: InboxItem | None = None
        #: whether the session had an input queued at the closure (None: not known)
        self.queued: bool | None = None


class EventLog:
    """The event log of one session actor.

    Args:
        store: where events are appended.
        session_id: the session's store id.
        public_id: the name its event frames carry.
        encode_event: turns a stored event into a frame.
        subscribers: the actor's attached subscribers (shared, not copied): a subscriber that
            falls too far behind is dropped from it.
        nursery: returns the actor's nursery, for the background writer.
    """

    __slots__ = (
        "_store",
        "_session_id",
        "_public_id",
        "_encode",
        "_subscribers",
        "_nursery",
        "last_seq",
        "_batch",
        "_storing",
        "_flushing",
        "fence",
        "on_fenced",
        "on_stored",
        "queued_at_close",
        "_unsure",
        "_deferred",
    )

    def __init__(
        self,
        store: Store,
        session_id: str,
        public_id: str,
        encode_event: Callable[[str, EventRecord], bytes],
        subscribers: set[Subscriber],
        nursery: Callable[[], trio.Nursery],
    ) -> None:
        self._store = store
        self._session_id = session_id
        self._public_id = public_id
        self._encode = encode_event
        self._subscribers = subscribers
        self._nursery = nursery
        #: The ``seq`` of the last event stored.
        self.last_seq = 0
        #: Events emitted but not yet handed to the store, and the batch being stored.
        self._batch: _EventBatch | None = None
        self._storing: _EventBatch | None = None
        self._flushing = False
        #: The session's lease epoch, carried by every append (None: unfenced, one node).
        self.fence: int | None = None
        #: Called once an append was refused because the lease moved (``Fenced``).
        self.on_fenced: Callable[[Fenced], None] | None = None
        #: Called with the session id and the last seq after each stored batch (several
        #: nodes: the announcement other nodes' followers wait for).
        self.on_stored: Callable[[str, int], None] | None = None
        #: After :meth:`close`: whether the session had another input queued when the turn
        #: closed, as the store said in the closing statement (None: it did not say). The
        #: runner takes False as its next claim's answer.
        self.queued_at_close: bool | None = None
        #: How many of the next batch's first events were in a write that was cut or refused
        #: with an outcome nobody knows (a commit cut mid-flight may have gone through): the
        #: next write asks the store first (``_settle``).
        self._unsure = 0
        #: Whether events wait that were emitted with ``defer`` and no writer started for.
        self._deferred = False

    @property
    def deferring(self) -> bool:
        """Whether all that waits was emitted with ``defer`` and no write is under way."""
        return self._deferred and self._storing is None and not self._flushing

    @property
    def idle(self) -> bool:
        """Whether no event waits to be stored and no write is under way."""
        return self._batch is None and self._storing is None and not self._flushing

    async def emit(
        self, type_: str, payload: dict[str, Any], *, durable: bool = True, defer: bool = False
    ) -> None:
        """Append an event to the session's log; once stored, offer it to every subscriber.

        Events are stored in batches, in order, one batch at a time: while one is being
        written the next one fills. ``durable`` waits until this event is stored (and offered),
        writing its batch from the caller's own task when no write is under way, so a shielded
        caller (a turn closing at shutdown) still gets its event stored; it raises if storing
        failed. Otherwise the caller goes on at once and a background task stores the batch:
        an agent streaming deltas is not held up by a commit per delta, and a client gets a
        burst of them in one write. Only once ``MAX_UNSTORED_EVENTS`` wait does it wait too.
        An event is never offered before it is stored, so a client never sees a ``seq`` that
        a crash could take back.

        ``defer`` (not durable) starts no write either: the event waits for the next write,
        another emit's or :meth:`flush_deferred`'s. A session that is about to claim and start
        a turn announces its input so: the ``turn_queued`` (and a fire's ``job_update``) go in
        with the turn's first write rather than a commit of their own (issue 26: two round
        trips of a fire's six).
        """
        batch = self._batch
        if batch is None:
            batch = self._batch = _EventBatch()
        batch.events.append((type_, payload))
        if durable or len(batch.events) >= MAX_UNSTORED_EVENTS:
            await self._until_stored(batch)
        elif defer:
            self._deferred = True
        elif not self._flushing:
            self._start_flush()

    def flush_deferred(self) -> None:
        """Start writing events emitted with ``defer``, if any still wait: the turn they were
        held for is not starting at once (nothing to claim, a wait for a slot or the store)."""
        if self._deferred:
            self._deferred = False
            if self._batch is not None and not self._flushing:
                self._start_flush()

    def _start_flush(self) -> None:
        self._flushing = True
        self._nursery().start_soon(self._flush, name=f"events of session {self._session_id}")

    async def close(self, events: list[tuple[str, dict[str, Any]]], closure: Closure) -> InboxItem:
        """Append a turn's closing ``events`` (``stream_end``…; may be none) and close its
        input (``closure``) in one transaction, after every event emitted before them; once
        stored, offer the events. Either all of it is stored or none of it is: a crash between
        the two can no longer leave a turn that ended with its input ``running``.

        Returns:
            the closed input, as stored.

        Raises:
            whatever storing raised (``Fenced``, ``ConflictError``, ``StoreError``…).
        """
        batch = self._batch
        if batch is None or batch.closure is not None:
            await self.all_stored()
            batch = self._batch  # (what a write cut meanwhile left: ``_keep_cut``)
            if batch is None or batch.closure is not None:
                batch = self._batch = _EventBatch()
        batch.events.extend(events)
        batch.closure = closure
        self.queued_at_close = None
        await self._until_stored(batch)
        assert batch.closed is not None, "a stored closure has its input"
        self.queued_at_close = batch.queued
        return batch.closed

    async def enqueue(
        self,
        source: str,
        payload: dict[str, Any],
        event: tuple[str, dict[str, Any]],
        key: str | None = None,
    ) -> tuple[InboxItem, bool] | None:
        """Store an input (under ``key``, when given) and append ``event``, which announces it
        (its payload without the ``input_id`` the store puts first), in one transaction
        (``Store.enqueue_announced``); once stored, offer the event. One commit instead of two
        for every input the session stores itself (issue 26). A key already taken stores and
        announces nothing.

        Only while the log is idle: otherwise (events wait or are being stored, a turn
        streaming) and when the lease moved (``Fenced``: nothing was stored), the answer is
        None and the caller stores the input and emits its announcement as two writes, in
        order behind the rest. Emits meanwhile are stored after it.

        Returns:
            the input (new, or the key's) and whether this call stored it; None when nothing
            was stored.

        Raises:
            whatever ``enqueue_input`` and ``enqueue_keyed`` raise (``NotFound``,
            ``IdempotencyKeyReused``, ``StoreError``…).
        """
        if not self.idle:
            return None
        batch = self._storing = _EventBatch()  # whoever emits meanwhile waits behind it
        try:
            item, record = await self._store.enqueue_announced(
                self._session_id, source, payload, event, idempotency_key=key, fence=self.fence
            )
        except Fenced:
            return None
        finally:
            self._storing = None
            batch.done.set()
        if record is None:
            return item, False
        self._offer([record])
        if self.on_stored is not None:
            self.on_stored(self._session_id, record.seq)
        return item, True

    async def all_stored(self) -> None:
        """Wait until every event emitted so far is stored (or failed to be)."""
        batch = self._batch or self._storing
        if batch is not None:
            await self._wait_stored(batch)

    async def _until_stored(self, batch: _EventBatch) -> None:
        """Wait until ``batch`` is stored, storing it from this task if nobody else is."""
        await self._wait_stored(batch)
        if batch.error is not None:
            raise batch.error

    async def _wait_stored(self, batch: _EventBatch) -> None:
        while not batch.done.is_set():
            storing = self._storing
            if storing is None:
                await self._store_next()  # the oldest waiting batch: ``batch`` or one before
            else:
                await storing.done.wait()

    async def _flush(self) -> None:
        """The background writer of events nobody waits for."""
        try:
            while (batch := self._batch) is not None:
                await self._wait_stored(batch)
        finally:
            self._flushing = False

    async def _store_next(self) -> None:
        """Store the oldest waiting batch and offer its events. Never raises ``Exception``:
        an error is kept on the batch for whoever waits for it."""
        batch, self._batch = self._batch, None
        # only ``_wait_stored`` calls this, for a batch neither stored nor being stored: the
        # waiting one
        assert batch is not None, "no batch waits to be stored"
        self._storing = batch
        self._deferred = False  # (what was deferred is in this write)
        try:
            self._stored(await self._write(batch))
        except Fenced as exc:  # the session moved to another node: nothing was stored
            batch.error = exc
            self._unsure = 0
            if self.on_fenced is not None:
                self.on_fenced(exc)
        except Exception as exc:
            batch.error = exc
            self._unsure = 0  # (the batch is dropped: nothing of the next one is in doubt)
            log.error(
                "storing %d events of session %s failed: %r",
                len(batch.events),
                self._session_id,
                exc,
            )
        except BaseException:
            batch.error = RuntimeError("the session stopped before its events were stored")
            self._keep_cut(batch)
            raise
        finally:
            self._storing = None
            batch.done.set()

    async def _write(self, batch: _EventBatch) -> list[EventRecord]:
        """Store ``batch`` (with its closure, if any), tried again while the store refuses it:
        for up to ``RETRY_SECONDS`` while it is unavailable, else ``RETRIES`` times, with a
        growing pause. Nothing else is stored meanwhile, so the log keeps its order.

        Before, a refused batch was dropped: the turn went on, and its ``stream_start`` or
        ``turn_queued`` was missing from the log for good (issue 23: "one failed event batch
        dropped a stream_start"; the crash harness with the fault ``fail:N``).
        """
        delay, waited, refused = 0.1, 0.0, 0
        while True:
            try:
                if self._unsure:
                    await self._settle(batch)
                closure = batch.closure
                if closure is None:
                    if not batch.events:  # all of it was stored by the cut write
                        return []
                    return await self._store.append_events(
                        self._session_id, batch.events, fence=self.fence
                    )
                records, batch.closed, batch.queued = await self._store.close_input_peek(
                    self._session_id,
                    batch.events,
                    closure.input_id,
                    closure.state,
                    closure.detail,
                    fence=self.fence,
                    steps=closure.steps,
                )
                return records
            except (ConflictError, NotFound):
                raise  # fenced, closed already, or gone: trying again changes nothing
            except StoreError as exc:
                refused += 1
                outage = isinstance(exc, StoreUnavailable)
                if (waited >= RETRY_SECONDS) if outage else (refused > RETRIES):
                    raise
                # a commit cut with its connection may have gone through: ask before again
                self._unsure = len(batch.events)
                log.warning(
                    "storing %d events of session %s failed (%s); trying again in %g s",
                    len(batch.events),
                    self._session_id,
                    exc,
                    delay,
                )
                await trio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 5.0)

    def _keep_cut(self, batch: _EventBatch) -> None:
        """Put the events of ``batch``, whose write was cut (the session is stopping), back at
        the head of the waiting batch, so that the next write (the turn's closure, shielded)
        stores them ahead of its ``stream_end``. Before, they were dropped: a write cut at
        shutdown lost the ``stream_start`` of a turn whose ``stream_end interrupted`` was then
        stored alone (the suite's crash sample, seed 1959230062).

        Only a cut write's: a batch the store refused past its tries (an outage over
        ``RETRY_SECONDS``, or what the store cannot take) is still dropped, so one batch never
        holds up the session's log for good; and a closure's batch is not kept, since nobody
        closes the turn after its closure was cut (the node's recovery does)."""
        if batch.closure is not None or not batch.events:
            return
        waiting = self._batch
        if waiting is None:
            waiting = self._batch = _EventBatch()
        waiting.events[:0] = batch.events
        self._unsure = len(batch.events)

    async def _settle(self, batch: _EventBatch) -> None:
        """Whether the write that was cut or refused last stored its events after all: ask
        the store for the session's last seq. Whatever it stored beyond ``last_seq`` is read
        back (to be offered) and taken off the head of ``batch``, which holds those events
        first; an append never stores part of a batch, and under a lease nobody else
        appends (another node that took the session over fences this write anyway)."""
        stored = await self._store.last_seq(self._session_id) - self.last_seq
        stored = min(stored, self._unsure, len(batch.events))
        if stored > 0:
            records = await self._store.read_events(
                self._session_id, after_seq=self.last_seq, limit=stored
            )
            del batch.events[: len(records)]
            self._stored(records)
        self._unsure = 0

    def _stored(self, records: list[EventRecord]) -> None:
        """Offer stored events and announce them (``on_stored``)."""
        if records:
            self._offer(records)
            if self.on_stored is not None:
                self.on_stored(self._session_id, records[-1].seq)

    def _offer(self, records: list[EventRecord]) -> None:
        """Offer stored events to every subscriber, dropping those that fell too far behind."""
        self.last_seq = records[-1].seq
        subscribers = self._subscribers
        if not subscribers:
            return
        encode = self._encode
        name = self._public_id
        for record in records:
            frame = encode(name, record)
            for subscriber in list(subscribers):
                if not subscriber.offer(name, record.seq, frame):
                    subscribers.discard(subscriber)
                    subscriber.lagged(name, record.seq - 1)
