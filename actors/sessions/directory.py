"""The session directory: the gateway's ``SessionBackend``, on top of session actors.

Clients name sessions; the directory turns each name into the session's key in the caller's own
namespace (``actors.sessions.ids``), so another user's session is not merely refused but simply
not there: it answers exactly like a name nobody uses, and creating a name another user also
uses is an ordinary create. Every answer carries names, never keys. The directory enforces the
per-user and per-session limits, turns each request into a message to the session's virtual
actor, and makes everything a session owns end with it (derived sessions, jobs and recalls,
watchers, background tasks, pending approvals, buffered notifications). Reads that need no
actor (events, history) go straight to the store.

Which sessions exist is cached per node (``owners.OwnerCache``); with several nodes a delete
is announced to every node, which forgets the key (see ``owners.py`` for the bounds when an
announcement is lost).

It is over 400 lines because it is the one ``SessionBackend``: every request goes through the same
name-to-key mapping, limits and owner cache, and a session's end reaches everything it owns from
here.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import msgspec
import trio

from turnstile.actors.sessions.actor import (
    POLICIES,
    Attach,
    DeleteSession,
    Detach,
    SetPolicy,
    StopTurn,
    Submit,
    ToolCaller,
    load_history,
)
from turnstile.actors.sessions.agents.base import HistoryEntry, ToolResult
from turnstile.actors.sessions.hooks import SessionHooks
from turnstile.actors.sessions.ids import (
    DERIVED_SUFFIXES,
    MAX_NAME_CHARS,
    OWNER_SEPARATOR,
    derived_key,
    is_derived,
    public_id,
    public_result,
    public_view,
    session_key,
)
from turnstile.actors.sessions.messages import HandOver
from turnstile.actors.sessions.owners import OWNER_CACHE_SECONDS, OwnerCache
from turnstile.actors.sessions.remote import RemoteSessions
from turnstile.runtime.errors import (
    ActorStopped,
    AlreadyExists,
    BlockedByAutomations,
    Busy,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    PlacedElsewhere,
    StoreError,
)
from turnstile.runtime.gateway.backend import Attached, Submitted, Subscriber
from turnstile.runtime.metrics import Metrics
from turnstile.runtime.registry import Registry
from turnstile.runtime.store import EventRecord, Session, Store

__all__ = ["SessionDirectory", "create_derived_session"]

log = logging.getLogger("turnstile.session")

#: Transcript entries ``GET /sessions/{id}/history`` returns at most.
HISTORY_LIMIT = 1000


#: Tries of each feature's end of a deleted session (``on_session_end``) the store refuses.
END_TRIES = 3


class SessionDirectory:
    """Implements ``runtime.gateway.SessionBackend``.

    Args:
        store: the node's store.
        registry: where ``session:<id>`` actors live.
        tools: runs tools for ``call`` frames.
        max_sessions_per_user: creation beyond it is ``LimitExceeded``.
        metrics: where request counts go.
        hooks: what the other features plug in (what ends with a session, what blocks its
            deletion, pending recalls, approvals).
        owner_cache_seconds: how long a session's existence is kept here without reading
            the store again (``owners.OwnerCache``).
    """

    def __init__(
        self,
        store: Store,
        registry: Registry,
        tools: ToolCaller,
        *,
        max_sessions_per_user: int,
        metrics: Metrics,
        hooks: SessionHooks | None = None,
        owner_cache_seconds: float = OWNER_CACHE_SECONDS,
    ) -> None:
        self.store = store
        self.registry = registry
        self.tools = tools
        self.max_sessions_per_user = max_sessions_per_user
        self._metrics = metrics
        #: which sessions exist, as this node last read them
        self.owners = OwnerCache(owner_cache_seconds)
        self.hooks = hooks or SessionHooks()
        #: With several nodes: sessions another node holds (``remote``); None on one node,
        #: where no session is ever placed elsewhere.
        self.remote: RemoteSessions | None = None

    async def ping(self) -> None:
        await self.store.ping()

    # -- ownership --

    async def owned_key(self, user: str, session_id: str, *, fresh: bool = False) -> str:
        """The key of ``user``'s session named ``session_id``.

        Args:
            fresh: read the store even if this node has the session cached: for a request
                that creates rows under the session, which must not outlive a session deleted
                through another node a moment ago (and reach a later one of the same name).

        Raises:
            NotFound: ``user`` has no session of that name (whoever else may have one).
        """
        if not session_id or OWNER_SEPARATOR in session_id:
            raise NotFound(f"no session with id {session_id!r}")
        key = session_key(user, session_id)
        owner = None if fresh else self.owners.get(key)
        if owner is None:
            generation = self.owners.generation()
            try:
                owner = (await self.store.get_session(key)).owner
            except NotFound:
                if fresh:  # what this node kept is stale
                    self.owners.forget(key)
                raise NotFound(f"no session with id {session_id!r}") from None
            self.owners.put(key, owner, generation)
        if owner != user:  # a key is in its owner's namespace; this only guards the store
            raise NotFound(f"no session with id {session_id!r}")
        return key

    async def _ask(self, session_id: str, message: Any) -> Any:
        ref = await self.registry.resolve(f"session:{session_id}")
        if ref.mailbox_depth >= ref.mailbox_capacity:
            raise Busy(f"session {session_id!r} has too many messages waiting; try again")
        return await ref.ask(message)

    # -- sessions --

    async def create_session(
        self,
        user: str,
        *,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        policy: str = "enqueue",
    ) -> Session:
        if policy not in POLICIES:
            raise InvalidArgument(
                f"policy must be one of {', '.join(POLICIES)}, got {policy!r}", field="policy"
            )
        if session_id is not None:
            if not session_id or len(session_id) > MAX_NAME_CHARS or OWNER_SEPARATOR in session_id:
                raise InvalidArgument(
                    f"id must be 1 to {MAX_NAME_CHARS} characters without {OWNER_SEPARATOR!r}",
                    field="id",
                )
            if is_derived(session_id):
                raise InvalidArgument(
                    f"ids ending in {' or '.join(DERIVED_SUFFIXES)} are reserved for sessions "
                    "the runtime derives from a session",
                    field="id",
                )
        key = session_key(user, session_id or uuid.uuid4().hex)
        generation = self.owners.generation()
        try:  # the limit is counted and taken in the insert's transaction
            session = await self.store.create_session(
                key,
                user,
                metadata=metadata or {},
                policy=policy,
                max_per_owner=self.max_sessions_per_user,
            )
        except AlreadyExists:
            raise AlreadyExists(f"session {session_id!r} already exists") from None
        self.owners.put(key, user, generation)
        self._metrics.inc("turnstile_sessions_created_total")
        for created in self.hooks.on_session_created:
            try:
                created(user, key)
            except Exception:  # the session exists: a feature's reaction cannot undo that
                log.exception("a hook on the creation of session %s failed", key)
        return _public_session(session)

    async def list_sessions(
        self,
        user: str,
        *,
        limit: int = 100,
        after_id: str | None = None,
        has_recall: bool | None = None,
    ) -> list[Session]:
        """``user``'s sessions by id, ``limit`` at most, after ``after_id``; with
        ``has_recall``, only those that have (True) or have not (False) a pending recall —
        pages are read on until ``limit`` match, so the ``after`` cursor still works."""
        after = None
        if after_id is not None:
            if not after_id or OWNER_SEPARATOR in after_id:
                raise InvalidArgument(
                    f"after must be a session id, got {after_id!r}", field="after"
                )
            after = session_key(user, after_id)
        if has_recall is None:
            sessions = await self.store.list_sessions(owner=user, limit=limit, after_id=after)
            return [_public_session(s) for s in sessions]
        pending = self.hooks.pending_recall
        if pending is None:  # no recalls on this node: no session has one
            return (
                [] if has_recall else await self.list_sessions(user, limit=limit, after_id=after_id)
            )
        found: list[Session] = []
        while len(found) < limit:
            page = await self.store.list_sessions(owner=user, limit=limit, after_id=after)
            for session in page:
                if (await pending(session.id) is not None) == has_recall:
                    found.append(_public_session(session))
                    if len(found) == limit:
                        break
            if len(page) < limit:
                break
            after = page[-1].id
        return found

    async def pending_recalls(self, user: str, session_ids: list[str]) -> dict[str, str | None]:
        """Of ``user``'s sessions named in ``session_ids``, those with a pending recall, each
        with its trigger time (what ``GET /sessions`` shows); an empty map without recalls."""
        if self.hooks.pending_recall is None:
            return {}
        out: dict[str, str | None] = {}
        for name in session_ids:
            recall = await self.hooks.pending_recall(session_key(user, name))
            if recall is not None:
                out[name] = recall.get("trigger_at")
        return out

    async def get_session(self, user: str, session_id: str) -> Session:
        key = await self.owned_key(user, session_id)
        return _public_session(await self.store.get_session(key))

    async def delete_session(self, user: str, session_id: str, *, confirm: bool = False) -> None:
        """Delete a session with its derived sessions and everything they own.

        Raises:
            BlockedByAutomations: jobs are bound to it (or to a session derived from it) and
                ``confirm`` is False; nothing is deleted.
        """
        key = await self.owned_key(user, session_id)
        # with several nodes, only the node that holds the session deletes it: find out before
        # anything ends, and ask that node (through the store) when it is another
        try:
            await self.registry.resolve(f"session:{key}")
        except PlacedElsewhere:
            if self.remote is None:
                raise
            await self._check_automations(await self._with_derived(key), session_id, confirm)

            async def taken_here() -> bool:  # (found by the crash harness's survivor runs)
                try:
                    await self.registry.resolve(f"session:{key}")
                except PlacedElsewhere:
                    return False
                return True

            if not await self.remote.delete(key, taken_here):  # the holder announces it
                self.owners.forget(key)
                return
        keys = await self._with_derived(key)
        await self._check_automations(keys, session_id, confirm)
        await self._delete_keys(keys)

    async def delete_here(self, key: str) -> None:
        """Delete the session ``key`` that this node holds, for another node that was asked
        (and has checked the confirmation): with its derived sessions and their jobs."""
        await self._delete_keys(await self._with_derived(key))

    async def _with_derived(self, key: str) -> list[str]:
        """``key`` and the keys of its derived sessions that exist."""
        keys = [key]
        for suffix in DERIVED_SUFFIXES:
            try:
                derived = derived_key(key, suffix)
            except ValueError:
                continue
            try:
                await self.store.get_session(derived)
            except NotFound:
                continue
            keys.append(derived)
        return keys

    async def _check_automations(self, keys: list[str], session_id: str, confirm: bool) -> None:
        """Raise ``BlockedByAutomations`` when jobs are bound to ``keys`` and not ``confirm``."""
        if self.hooks.automations is None or confirm:
            return
        bound = [job for k in keys for job in await self.hooks.automations(k)]
        if bound:
            raise BlockedByAutomations(
                f"session {session_id!r} has {len(bound)} scheduled job(s); "
                "delete with confirm=true to remove them too",
                [public_view(job) for job in bound],
            )

    async def _delete_keys(self, keys: list[str]) -> None:
        if self.hooks.cancel_automations is not None:
            for k in keys:
                await self.hooks.cancel_automations(k)
        for k in reversed(keys):  # derived first: the parent goes last
            await self._end(k)

    async def _end(self, key: str) -> None:
        """Delete one session and end everything it owns, so nothing of it reaches a session
        created later under the same name."""
        try:
            await self._ask(key, DeleteSession())
        finally:  # deleted, or maybe: every node reads it again
            await self._gone(key)
        # Each feature ends what it keeps for it: every one of them, each tried again a few
        # times when the store refuses it. The session is gone already, so a re-sent DELETE is
        # a 404 and would not get here again: a feature given up on would keep its rows (a
        # watcher running for nobody until the next start; issue 23's crash harness with the
        # fault ``fail:N``).
        refused: StoreError | None = None
        for end in self.hooks.on_session_end:
            for attempt in range(END_TRIES):
                try:
                    await end(key)
                    break
                except StoreError as exc:
                    if isinstance(exc, NotFound) or attempt == END_TRIES - 1:
                        refused = refused or exc
                        break
                    await trio.sleep(0.2 * 2**attempt)
        if refused is not None:
            raise refused

    async def _gone(self, key: str) -> None:
        """The session ``key`` was (or may have been) deleted through this node: forget it
        here and, with several nodes, tell the others to (``g <key>``)."""
        self.owners.forget(key)
        if self.remote is not None:
            await self.remote.gone(key)

    def heard_gone(self, key: str | None) -> None:
        """Another node deleted the session ``key``, or (None) deletes may have gone unheard:
        forget it (everything) here (``RemoteSessions.on_gone``)."""
        if key is None:
            self.owners.forget_all()
        else:
            self.owners.forget(key)

    # -- turns --

    async def submit(
        self,
        user: str,
        session_id: str,
        content: str,
        payload: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Submitted:
        """Store ``user``'s message as an input of their session ``session_id``.

        ``idempotency_key`` (1 to 255 visible ASCII characters) makes it happen at most once
        per session and key, across retries, concurrent duplicates and restarts: a key already
        taken answers the first submit's ``Submitted`` with ``replayed=True`` and starts
        nothing (see ``messages.Submit``). Clients' message ids arrive here as
        ``client:<id>`` (``runtime.gateway.backend.submit_from_client``); other ingress
        names its keys by itself (``github:<delivery id>``) and sends ``Submit`` to the
        session's actor with the same field.

        Raises:
            NotFound: ``user`` has no session of that name.
            InvalidArgument: the content is too long, or the key malformed.
            IdempotencyKeyReused: the key names another input of the session.
            Busy, LimitExceeded: the session refuses the input now (a replay never is).
        """
        key = await self.owned_key(user, session_id)
        try:
            submitted = await self._ask(
                key,
                Submit(
                    source="user",
                    content=content,
                    payload=payload or {},
                    idempotency_key=idempotency_key,
                ),
            )
        except PlacedElsewhere:
            if self.remote is None:
                raise
            submitted = await self.remote.submit(
                key, "user", content, payload or {}, idempotency_key=idempotency_key
            )
        if submitted.replayed:
            self._metrics.inc("turnstile_inputs_replayed_total")
        else:
            self._metrics.inc("turnstile_inputs_total")
        return submitted

    async def stop(self, user: str, session_id: str) -> bool:
        key = await self.owned_key(user, session_id)
        try:
            return await self._ask(key, StopTurn())
        except PlacedElsewhere:
            if self.remote is None:
                raise
            return await self.remote.stop(key)

    async def set_policy(self, user: str, session_id: str, policy: str) -> str:
        key = await self.owned_key(user, session_id)
        try:
            return await self._ask(key, SetPolicy(policy=policy))
        except PlacedElsewhere:
            if self.remote is None:
                raise
            return await self.remote.set_policy(key, policy)

    # -- watching --

    async def attach(self, user: str, session_id: str, subscriber: Subscriber) -> Attached:
        key = await self.owned_key(user, session_id)
        try:
            attached = await self._ask(key, Attach(subscriber=subscriber))
        except PlacedElsewhere:
            if self.remote is None:
                raise
            attached = await self.remote.attach(key, session_id, subscriber)
        for attached_hook in self.hooks.on_attach:  # e.g. what was held while nobody watched
            await attached_hook(key)
        return attached

    async def hand_over(self) -> int:
        """A draining node (several nodes): give up every session active here that has no
        turn running; the clients watching it here, if any, from then on follow it from the
        store through this node (``RemoteSessions``) until they leave or the node stops. Its
        lease is released, so another node runs what waits in it. Returns how many were
        handed over."""
        if self.remote is None:
            return 0
        handed = 0
        for address in self.registry.active("session"):
            try:
                answer = await self.registry.ref(address).ask(HandOver())
            except (ActorStopped, PlacedElsewhere, NotFound):
                continue  # stopping, moved or gone already
            if answer is None:
                continue  # a turn runs: asked again when one ends
            key = address.partition(":")[2]
            handed += 1
            for subscriber in answer.subscribers:
                try:
                    await self.remote.attach(
                        key, answer.public_id, subscriber, after_seq=answer.last_seq
                    )
                except NotFound:  # deleted meanwhile
                    subscriber.deleted(answer.public_id)
        return handed

    async def detach(self, user: str, session_id: str, subscriber: Subscriber) -> None:
        key = await self.owned_key(user, session_id)
        if self.remote is not None and self.remote.detach(key, subscriber):
            return
        if self.registry.is_active(f"session:{key}"):
            await self._ask(key, Detach(subscriber=subscriber))

    async def read_events(
        self, user: str, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[EventRecord]:
        key = await self.owned_key(user, session_id)
        return await self.store.read_events(key, after_seq=after_seq, limit=limit)

    async def history(self, user: str, session_id: str) -> list[HistoryEntry]:
        key = await self.owned_key(user, session_id)
        return await load_history(self.store, key, HISTORY_LIMIT)

    async def call_tool(
        self, user: str, session_id: str, tool: str, arguments: dict[str, Any]
    ) -> ToolResult:
        key = await self.owned_key(user, session_id, fresh=True)  # a tool may create rows
        self._metrics.inc("turnstile_tool_calls_total")
        return public_result(await self.tools.call(key, user, tool, arguments))

    # -- approvals (the WebSocket ``approve`` / ``deny`` frames) --

    async def resolve_approval(self, user: str, approval_id: str, approved: bool) -> dict[str, Any]:
        if self.hooks.resolve_approval is None:
            raise NotFound(f"no pending approval with id {approval_id!r}")
        return public_view(await self.hooks.resolve_approval(user, approval_id, approved))


def _public_session(session: Session) -> Session:
    """``session`` as its owner sees it: named, not keyed."""
    return msgspec.structs.replace(session, id=public_id(session.id))


async def create_derived_session(
    store: Store, max_sessions_per_user: int, parent_key: str, suffix: str
) -> str:
    """The key of the session derived from ``parent_key`` (created now unless it exists).

    Only the runtime calls this (``set_heartbeat``); the derived session has its parent's owner,
    counts against that owner's session limit and is deleted with its parent.

    Raises:
        InvalidArgument: the parent cannot have such a derived session (see ``derived_key``).
        LimitExceeded: the owner is at the session limit.
    """
    try:
        key = derived_key(parent_key, suffix)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    parent = await store.get_session(parent_key)
    try:
        await store.get_session(key)
        return key
    except NotFound:
        pass
    try:  # the limit is counted and taken in the insert's transaction
        await store.create_session(
            key,
            parent.owner,
            metadata={"derived_from": public_id(parent.id)},
            max_per_owner=max_sessions_per_user,
        )
    except AlreadyExists:
        pass  # created meanwhile by a concurrent call: same key, same owner
    except LimitExceeded as refused:
        # a concurrent call that created this very session may be what took the last place
        try:
            await store.get_session(key)
        except NotFound:
            raise refused from None
    return key
