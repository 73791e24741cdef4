"""Sessions another node holds, as this node's clients reach them (several nodes, leases).

With session leases (``runtime.placement``) a session is active on one node at a time. A client
connected to another node still attaches, sends and stops there, through the store and
PostgreSQL's ``LISTEN/NOTIFY`` (one channel, :data:`CHANNEL`):

* **Live events.** A node with clients attached to a session it does not hold follows it
  (``follow.SessionFeeds``): it says so (``w <key>``, again every :data:`WATCH_SECONDS`), and the
  holder then announces each stored batch of that session (``e <key> <seq>``, coalesced per
  session; sessions nobody follows elsewhere cost nothing). The follower reads the events after
  the last one it offered from the store, by ``seq``, on each announcement and every
  :data:`POLL_SECONDS` besides, and offers them to its clients. A lost notification delays an
  event by at most that long; it never loses one, and the order and gaplessness are the
  store's.
* **Inputs.** A message sent through a node that does not hold the session is stored in the
  session's inbox by that node (with its idempotency key, under the session's queue limit) and
  announced (``i <key> <id> <source>``): the holder tells its activation, which emits
  ``turn_queued`` and runs it. If the announcement is lost, the holder's periodic look for
  queued inputs finds it (``actors.node``: every ``lease_seconds / 3``).
* **Policy of a message.** The sending node reads whether a turn is running (an input
  ``running`` in the store) and the session's policy: ``reject`` refuses the message there
  (``Busy``, nothing stored); ``interrupt`` stores it and records a request to stop the running
  turn as ``interrupted``; ``inject`` stores it and records a request to fold it into the
  running turn (the holder moves the row to ``done`` and emits ``injected_message``; if that
  turn ended first, the input runs as a turn of its own).
* **Requests** (stops, interrupts, folds) are durable: rows of the store's key-value table
  (namespace :data:`REQUESTS`), each naming the input whose turn it is for, announced
  (``r <key>``) and read by every node on each announcement and every :data:`POLL_SECONDS`
  besides. The holder acts on those of the sessions it runs and deletes them once settled; a
  request for a turn that ended meanwhile is dropped (it never reaches the next turn). A lost
  announcement delays a stop by at most a second.
* **Policy.** Written to the session's row, then announced (``p <key>``); the holder also reads
  it from the store when a message arrives mid-turn, so a lost announcement changes nothing.
* **Delete.** ``x <key>``: the holder deletes the session (with its derived sessions and jobs;
  the confirmation was checked where it was asked), and the asking node waits until the row
  is gone, or until the session is its own (the holder died and its lease expired: it deletes
  it then); if neither within :data:`DELETE_WAIT_SECONDS`, the client is told to try again.
* **Gone.** ``g <key>``: whichever node deleted a session (the holder, or the node asked when
  nobody held it) says so to all, once the row is gone. Every node forgets it in its cache of
  which sessions exist (``on_gone``: ``owners.OwnerCache``), and a node that follows it for
  its clients reads it again at once: if it is gone, or is a later session of the same name
  (another ``created_at``), they are told it was deleted, and none of the later session's
  events reach them. After a (re)connection, when some may have been missed, every node
  forgets every session (``on_gone(None)``) and its followers read theirs again.

Everything here is the sessions feature's; the kernel only carries the notifications.

It is over 400 lines because every remote operation (submit, requests, policy, delete, gone)
rides one channel and its one handler (``_handle``), and the guarantee that a lost announcement only
delays comes from the same polls. Following sessions for this node's clients, the one operation
with state of its own (its feeds), is ``follow``'s: it is handed the channel's ``notify`` and
poked by ``_handle``.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import msgspec
import trio

from turnstile.actors.sessions.event_types import event_types
from turnstile.actors.sessions.follow import PAGE, POLL_SECONDS, WATCH_SECONDS, SessionFeeds
from turnstile.actors.sessions.ids import owner_of, public_id
from turnstile.actors.sessions.kinds import InputKinds, session_kinds
from turnstile.actors.sessions.messages import (
    POLICIES,
    Arrived,
    Delivered,
    FoldInput,
    Inject,
    Publish,
    SetPolicy,
    StopInput,
)
from turnstile.runtime import tracing
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import (
    ActorStopped,
    Busy,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    PlacedElsewhere,
    StoreError,
)
from turnstile.runtime.gateway.backend import Attached, Submitted, Subscriber
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.placement import LeasePlacement
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import EventRecord, Store

__all__ = ["CHANNEL", "POLL_SECONDS", "REQUESTS", "RemoteSessions"]

log = logging.getLogger("turnstile.session")

#: the notification channel of sessions across nodes
CHANNEL = "turnstile_sessions"
#: the key-value namespace of requests to the holder of a session (stop, interrupt, fold)
REQUESTS = "sessions.requests"
#: how long a request nobody settled is kept (its session was deleted, or passivated)
REQUEST_SECONDS = 3600.0
#: how long a delete through another node waits for the holder to have deleted the session
DELETE_WAIT_SECONDS = 10.0
#: notifications waiting to be handled; beyond it they are dropped and every feed reads again
_INBOX = 10_000


class RemoteSessions:
    """This node's side of sessions held elsewhere, and its announcements of its own.

    Args:
        store: the shared store.
        registry: this node's session activations.
        placement: which sessions this node holds.
        encode_event: the gateway frame of a stored event (``SessionServices.encode_event``).
        max_content_chars, max_queued_inputs: the limits an input sent here is held to, as
            the session's own actor holds one sent through its node.
        clock: the wall clock requests expire by.
        metrics: where the follow lag goes (``turnstile_follow_lag_seconds``: a followed
            event's time in the store, by the holder's clock, to its offer to this node's
            clients; a lost notification shows as up to ``POLL_SECONDS`` more).
    """

    def __init__(
        self,
        store: Store,
        registry: Registry,
        placement: LeasePlacement,
        encode_event: Callable[[str, EventRecord], bytes],
        *,
        max_content_chars: int,
        max_queued_inputs: int,
        clock: Clock,
        metrics: Metrics | None = None,
        input_kinds: InputKinds | None = None,
    ) -> None:
        self.clock = clock
        #: the node's input kinds: an input's payload is checked against its source's
        #: Struct before it is stored, as the session's own actor does
        self.input_kinds = input_kinds if input_kinds is not None else session_kinds()
        metrics = metrics if metrics is not None else Metrics()
        #: the sessions held elsewhere that this node's clients follow
        self.feeds = SessionFeeds(store, encode_event, self._notify, clock=clock, metrics=metrics)
        self.max_content_chars = max_content_chars
        self.max_queued_inputs = max_queued_inputs
        self.store = store
        self.registry = registry
        self.placement = placement
        self._pending: dict[str, int] = {}
        #: sessions held here that another node follows, until when (trio time)
        self._watched: dict[str, float] = {}
        self._announce = trio.Event()
        self._requested = trio.Event()
        self._heard_send, self._heard = trio.open_memory_channel[str | None](_INBOX)
        #: deletes a session this node holds (``SessionDirectory.delete_here``), for ``x``
        self.on_delete: Callable[[str], Awaitable[None]] | None = None
        #: an approval was answered through some node (``a <key> <approval id>``): the node
        #: whose call waits for it reads the answer (the execution feature's desk)
        self.on_approval: Callable[[str], None] | None = None
        #: a session was deleted through some node (``g <key>``), or (None) deletes may have
        #: gone unheard (the listener (re)connected): forget what is cached of it
        #: (``SessionDirectory.heard_gone``)
        self.on_gone: Callable[[str | None], None] | None = None

    # -- this node's sessions -------------------------------------------------------------------

    def stored(self, key: str, last_seq: int) -> None:
        """A session held here stored events up to ``last_seq``: announce it (coalesced), if
        another node follows it."""
        until = self._watched.get(key)
        if until is None:
            return
        if until < trio.current_time():
            del self._watched[key]
            return
        if self._pending.get(key, 0) < last_seq:
            self._pending[key] = last_seq
            self._announce.set()

    async def _announcer(self) -> None:
        while True:
            await self._announce.wait()
            self._announce = trio.Event()
            pending, self._pending = self._pending, {}
            for key, seq in pending.items():
                await self._notify(f"e {key} {seq}")

    async def _notify(self, payload: str) -> None:
        try:
            await self.store.notify(CHANNEL, payload)
        except StoreError as exc:  # a hint: the readers' polling catches up
            log.warning("notification %r failed: %s", payload[:200], exc)

    # -- sessions held elsewhere ----------------------------------------------------------------

    async def attach(
        self, key: str, public_id: str, subscriber: Subscriber, *, after_seq: int | None = None
    ) -> Attached:
        """Follow ``key`` for ``subscriber`` (``SessionFeeds.attach``).

        Raises:
            NotFound: the session is gone.
        """
        return await self.feeds.attach(key, public_id, subscriber, after_seq=after_seq)

    def detach(self, key: str, subscriber: Subscriber) -> bool:
        """Stop following ``key`` for ``subscriber``; False if it was not following here."""
        return self.feeds.detach(key, subscriber)

    async def submit(
        self,
        key: str,
        source: str,
        content: str,
        payload: dict[str, Any],
        *,
        idempotency_key: str | None,
        trace: dict[str, str] | None = None,
    ) -> Submitted:
        """Store an input of a session another node holds, and announce it to that node.

        ``trace``: the sender's span (W3C headers: ``traceparent``, ``tracestate``; None: the
        span current here), which
        the input is stored under, so that the holder's turn continues the same trace.

        A user message that arrives while a turn runs follows the session's policy, as on the
        holder (see the module docstring): whether a turn runs is read from the store, so a
        turn that starts or ends in the moment between that read and the write is seen as
        the holder would have seen a message arriving a moment earlier.

        Raises:
            InvalidArgument: the content is too long.
            Busy: a turn is running and the policy is ``reject`` (nothing is stored).
            LimitExceeded: the session's queue is full (a resend of a stored input is not).
            NotFound: the session is gone.
        """
        if not tracing.active():
            return await self._submit(key, source, content, payload, idempotency_key)
        with tracing.span("session submit", parent=trace) as span:
            span.update(
                {
                    "turnstile.session.id": public_id(key),
                    "turnstile.session.owner": owner_of(key),
                    "turnstile.input.source": source,
                    "turnstile.session.remote": True,
                }
            )
            submitted = await self._submit(key, source, content, payload, idempotency_key)
            span.update(
                {
                    "turnstile.input.id": submitted.input_id,
                    "turnstile.input.replayed": submitted.replayed,
                }
            )
            return submitted

    async def _submit(
        self,
        key: str,
        source: str,
        content: str,
        payload: dict[str, Any],
        idempotency_key: str | None,
    ) -> Submitted:
        max_content_chars, max_queued_inputs = self.max_content_chars, self.max_queued_inputs
        if len(content) > max_content_chars:
            raise InvalidArgument(
                f"content is longer than {max_content_chars} characters", field="content"
            )
        stored = {**payload, "content": content}
        self.input_kinds.decode(source, stored)  # refused at the door: InputPayloadError
        if idempotency_key is not None:
            earlier = await self.store.keyed_input(
                key, idempotency_key, source=source, payload=stored
            )
            if earlier is not None:
                return Submitted(input_id=earlier.id, replayed=True)
        waiting = await self.store.list_inputs(key, ["running", "queued"])
        running = next((i.id for i in waiting if i.state == "running"), None)
        queued = sum(1 for i in waiting if i.state == "queued")
        policy = "enqueue"
        if running is not None and source == "user":
            policy = (await self.store.get_session(key)).policy
            if policy == "reject":
                raise Busy("session is busy with a turn and its policy is reject")
        if queued >= max_queued_inputs:
            raise LimitExceeded(f"session has {queued} queued inputs (limit {max_queued_inputs})")
        stored = tracing.carry(stored, tracing.current_trace())
        if idempotency_key is None:
            item = await self.store.enqueue_input(key, source, stored)
        else:
            enqueued = await self.store.enqueue_keyed(key, source, stored, idempotency_key)
            item = enqueued.item
            if not enqueued.created:
                return Submitted(input_id=item.id, replayed=True)
        if policy == "inject":  # no turn_queued: it goes into the running turn if it can
            await self._request(key, f"fold {item.id}", {"input_id": item.id, "into": running})
            return Submitted(input_id=item.id)
        await self._notify(f"i {key} {item.id} {source}")
        if policy == "interrupt":
            await self._request(
                key, f"stop {running}", {"input_id": running, "status": "interrupted"}
            )
        return Submitted(input_id=item.id)

    async def deliver(self, key: str, message: Any) -> None:
        """What another feature tells a session another node holds (``NodeContext.
        tell_session``): a fire's input (``Delivered``: already in the inbox) is announced to
        the holder, which says ``turn_queued`` and runs it; a notice (``Inject``) is stored as
        an input of its own and announced (it cannot fold into a turn running elsewhere); an
        event for clients (``Publish``: a fire's ``job_update``, a watcher's
        ``watcher_update``, an ``approval_required``) is a request the holder carries out in
        the order they were made (appended to the log and offered to its clients, and so to
        every node's followers), while the session stays active there."""
        match message:
            case Delivered(input_id=input_id, source=source):
                await self._notify(f"i {key} {input_id} {source}")
            case Inject():
                await self.submit(
                    key,
                    message.source,
                    message.content,
                    message.payload,
                    idempotency_key=message.idempotency_key,
                    trace=message.trace,
                )
            case Publish(event=event):
                type_, payload = event.stored()
                order = f"{time.time_ns():020d}{secrets.token_hex(4)}"  # keys list in order
                await self._request(key, f"publish {order}", {"type": type_, "payload": payload})
            case _:
                log.debug("%s for session %s, held elsewhere: dropped", type(message).__name__, key)

    async def set_policy(self, key: str, policy: str) -> str:
        """Change the policy of a session another node holds: in the store (which the holder
        reads when a message arrives mid-turn), then announced (``p <key>``).

        Raises:
            InvalidArgument: not a policy.
        """
        if policy not in POLICIES:
            raise InvalidArgument(
                f"policy must be one of {', '.join(POLICIES)}, got {policy!r}", field="policy"
            )
        await self.store.update_session(key, policy=policy)
        await self._notify(f"p {key}")
        return policy

    async def delete(
        self, key: str, taken_here: Callable[[], Awaitable[bool]] | None = None
    ) -> bool:
        """Ask the node that holds ``key`` to delete it (``x <key>``) and wait until it is gone
        from the store, asking ``taken_here`` twice a second whether the session is this
        node's now (the holder died and its lease expired: nobody else will delete it).

        Returns:
            False once the holder deleted it; True when it came here: the caller deletes it.

        Raises:
            Busy: neither within :data:`DELETE_WAIT_SECONDS` (the holder did not hear, or is
                slow): nothing is lost, the client tries again.
        """
        await self._notify(f"x {key}")
        with trio.move_on_after(DELETE_WAIT_SECONDS):
            for tick in itertools.count(1):
                try:
                    await self.store.get_session(key)
                except NotFound:
                    return False
                if taken_here is not None and tick % 10 == 0 and await taken_here():
                    return True
                await trio.sleep(0.05)
        raise Busy(f"the node holding session {key!r} did not delete it in time; try again")

    async def gone(self, key: str) -> None:
        """Tell every node that this node deleted the session ``key`` (``g <key>``): a hint;
        a node that misses it reads the session again within ``owners.OWNER_CACHE_SECONDS``
        (or at its listener's next reconnection)."""
        await self._notify(f"g {key}")

    async def stop(self, key: str) -> bool:
        """Stop the turn running in ``key`` (held by another node): recorded in the store for
        the input it runs, announced, and carried out by the holder (see the module
        docstring). Returns whether a turn was running."""
        running = await self.store.list_inputs(key, ["running"])
        if not running:
            return False
        input_id = running[0].id
        await self._request(key, f"stop {input_id}", {"input_id": input_id, "status": "stopped"})
        return True

    async def _request(self, key: str, name: str, value: dict[str, Any]) -> None:
        """Record a request to the holder of ``key`` (durable), then announce it (a hint)."""
        expires = self.clock.now() + timedelta(seconds=REQUEST_SECONDS)
        await self.store.kv_put(REQUESTS, [(name, {**value, "session": key}, expires)])
        await self._notify(f"r {key}")

    async def _requests(self) -> None:
        """Carry out the requests for the sessions this node runs: on each announcement, and
        every :data:`POLL_SECONDS` besides (a lost announcement delays, never loses one)."""
        while True:
            with trio.move_on_after(POLL_SECONDS):
                await self._requested.wait()
            self._requested = trio.Event()
            after: str | None = None
            while True:  # every page: requests nobody can settle yet must not hide the rest
                try:
                    page = await self.store.kv_list(REQUESTS, after_key=after, limit=PAGE)
                except StoreError as exc:
                    log.warning("reading requests for sessions: %s", exc)
                    break
                settled = [name for name, value in page if await self._carry_out(name, value)]
                if settled:
                    try:
                        await self.store.kv_delete(REQUESTS, settled)
                    except StoreError as exc:  # carried out: settled again next time
                        log.warning("deleting settled requests: %s", exc)
                if len(page) < PAGE:
                    break
                after = page[-1][0]

    async def _carry_out(self, name: str, value: dict[str, Any]) -> bool:
        """Hand one request to the session's activation if it runs here; True once settled."""
        key = value.get("session")
        address = f"session:{key}"
        if not isinstance(key, str) or self.placement.fence(address) is None:
            return False  # not held here: the holder settles it
        if not self.registry.is_active(address):
            return False
        kind = name.partition(" ")[0]
        try:
            if kind == "publish":
                return await self._publish(address, name, value)
            if kind == "stop":
                message: Any = StopInput(input_id=value["input_id"], status=value["status"])
            else:
                message = FoldInput(input_id=value["input_id"], into=value["into"])
            return bool(await self.registry.ref(address).ask(message))
        except NotFound:  # the session is gone: so is its turn
            return True
        except (ActorStopped, PlacedElsewhere, StoreError, KeyError, TypeError) as exc:
            log.info("request %r for session %s not carried out yet: %s", name, key, exc)
            return False

    async def _publish(self, address: str, name: str, value: dict[str, Any]) -> bool:
        """Publish an event another node made for a session this node runs; True once done
        (or once it proved unreadable: it is dropped, and said so)."""
        type_ = value.get("type")
        kind = event_types().get(type_) if isinstance(type_, str) else None
        try:
            if kind is None:
                raise msgspec.ValidationError(f"unknown event type {type_!r}")
            event = msgspec.convert({**value.get("payload", {}), "type": type_}, kind)
        except (msgspec.ValidationError, TypeError) as exc:
            log.warning("request %r: dropped, not an event: %s", name, exc)
            return True
        await self.registry.ref(address).ask(Publish(event=event))
        return True

    # -- the listener ---------------------------------------------------------------------------

    def _hear(self, payload: str | None) -> None:
        try:
            self._heard_send.send_nowait(payload)
        except trio.WouldBlock:  # too many at once: read everything again
            self._gone(None)
            self.feeds.poke_all()

    def _gone(self, key: str | None) -> None:
        """A delete of ``key`` (None: of any session) was announced, or may have been missed."""
        if self.on_gone is not None:
            self.on_gone(key)
        self.feeds.recheck(key)

    async def _handle(self, payload: str | None) -> None:
        if payload is None:  # (re)connected: something may have been missed
            self._gone(None)
            self.feeds.poke_all()
            return
        kind, _, rest = payload.partition(" ")
        key, _, rest = rest.partition(" ")
        if kind == "g":  # a session was deleted (by whichever node)
            self._gone(key)
            return
        if kind == "e":
            self.feeds.poke(key)
            return
        if kind == "w":  # another node follows this session: announce its batches a while
            self._watched[key] = trio.current_time() + 3 * WATCH_SECONDS
            return
        if kind == "r":  # a request for a session's holder: read them now
            self._requested.set()
            return
        if kind == "a":  # an approval was answered: the node whose call waits reads it
            if self.on_approval is not None:
                self.on_approval(rest)
            return
        address = f"session:{key}"
        if self.placement.fence(address) is None or not self.registry.is_active(address):
            return  # not held here: the holder (or the catch-up look) deals with it
        ref = self.registry.ref(address)
        try:
            if kind == "i":
                input_id, _, source = rest.partition(" ")
                await ref.tell(Arrived(input_id=int(input_id), source=source))
            elif kind == "p":
                session = await self.store.get_session(key)
                await ref.ask(SetPolicy(policy=session.policy))
            elif kind == "x" and self.on_delete is not None:
                await self.on_delete(key)
        except (ActorStopped, PlacedElsewhere, NotFound, StoreError, ValueError) as exc:
            log.info("notification %r not delivered: %s", payload[:200], exc)

    async def run(self) -> None:
        """Listen, announce and follow, forever (a task of the node's nursery)."""
        async with trio.open_nursery() as nursery:
            self.feeds.nursery = nursery
            nursery.start_soon(self.store.listen, CHANNEL, self._hear)
            nursery.start_soon(self._announcer)
            nursery.start_soon(self._requests)
            async for payload in self._heard:
                await self._handle(payload)
