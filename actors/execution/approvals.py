"""The approval desk: a person decides whether an ``APPROVE`` tool call may run.

When a tool whose policy is ``APPROVE`` is called, the desk records a pending approval, emits
``approval_required`` into the calling session (so every attached client sees it, and a client
that reconnects gets it by replay), and waits. A client answers with an ``approve`` or ``deny``
frame (or ``POST /approvals/{id}/approve|deny``); the desk emits ``approval_resolved`` and the
call runs or is refused. No answer within the timeout is a denial. If the call that asked is
cancelled while it waits (its WebSocket client went away, its turn was stopped), the approval is
withdrawn: it leaves the pending list and ``approval_resolved`` says ``cancelled``.

With a store (a node), every pending approval is also a row of the ``approvals`` table
(``schema.py``), so any node lists it and answers it: the answer is a compare-and-set
on that row (the first answer wins, through whichever node; a second one is refused as on one
node), and the node whose call waits learns it at once when it was answered there, by an
announcement (``a <session> <id>``, on the sessions' channel) when it was answered elsewhere,
and by reading its row every :data:`POLL_SECONDS` besides (several nodes only), so a lost
announcement delays the call by at most that long. The call stops waiting by deleting its
row, in the same statement that reads the last answer: an answer recorded before that counts,
even one that came as the timeout ran out; after it, the approval is gone (``not_found``).
The waiting itself stays in memory: a node that restarts has also lost the turn that was
waiting, and the row it leaves reads as gone once it expired (``STALE`` later).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import trio

from turnstile.actors.execution import schema as table
from turnstile.actors.execution.events import ApprovalRequired, ApprovalResolved
from turnstile.actors.sessions.actor import Publish
from turnstile.actors.sessions.remote import CHANNEL, POLL_SECONDS
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument, NotFound, StoreError
from turnstile.runtime.membership import ended_by
from turnstile.runtime.store import ClusterView, NodeRef, Store

__all__ = ["ApprovalDesk"]

log = logging.getLogger("turnstile.approvals")

#: Arguments larger than this are cut in the approval_required event (the call gets them whole).
MAX_SHOWN_ARGUMENT_CHARS = 4000

#: Seconds the ``approval_resolved`` event may take to reach a busy session before it is given
#: up (it is published shielded, even while the waiting call is being cancelled).
RESOLVED_PUBLISH_GRACE = 10.0


class _Pending:
    __slots__ = ("id", "session_id", "owner", "tool", "decided", "poked", "approved", "by")

    def __init__(self, id: str, session_id: str, owner: str, tool: str) -> None:
        self.id = id
        self.session_id = session_id
        self.owner = owner
        self.tool = tool
        self.decided = trio.Event()
        #: set when it may have been answered: decided here, or announced by another node
        self.poked = trio.Event()
        self.approved = False
        self.by: str | None = None

    def decide(self, decision: str, by: str | None) -> None:
        self.approved = decision == "approved"
        self.by = by
        self.decided.set()
        self.poked.set()


class ApprovalDesk:
    """Pending approvals, by id.

    Args:
        publish: ``async (session_id, message)`` — tells a session actor (``Publish``).
        clock: for the ``expires_at`` shown to people.
        timeout: seconds before an unanswered approval counts as denied.
        store: where pending approvals are recorded (the ``approvals`` set must be applied);
            None keeps them in this desk's memory only (``pending``, ``resolve``).
        shared: other nodes share ``store`` (answers may come through them): a waiting call
            also reads its row every :data:`POLL_SECONDS`, and answers are announced.
    """

    def __init__(
        self,
        publish: Callable[[str, Any], Awaitable[None]],
        clock: Clock,
        timeout: float = 300.0,
        *,
        store: Store | None = None,
        shared: bool = False,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.publish = publish
        self.clock = clock
        self.timeout = timeout
        self.store = store
        self.shared = shared and store is not None
        self._pending: dict[str, _Pending] = {}

    def pending(self, session_id: str) -> list[dict[str, Any]]:
        """The approvals a session is waiting on in this desk's memory (the calls waiting on
        this node; ``list_pending`` is every node's)."""
        return [
            {"approval_id": p.id, "tool": p.tool}
            for p in self._pending.values()
            if p.session_id == session_id
        ]

    async def request(self, call, tool: str, arguments: dict[str, Any]) -> bool:
        """Ask the session's people; True only if someone approves in time (the ``Approver``)."""
        pending = _Pending(uuid.uuid4().hex[:16], call.session_id, call.owner, tool)
        now = self.clock.now()
        expires = now + timedelta(seconds=self.timeout)
        if self.store is not None:
            store = self.store
            node = store.claimer  # this incarnation: its end drops the row (``drop_lost``)
            await store.run(
                table.REQUEST,
                id=pending.id,
                session_id=call.session_id,
                owner=call.owner,
                tool=tool,
                now=store.db_time(now),
                expires_at=store.db_time(expires),
                node_id=None if node is None else node.id,
                node_epoch=None if node is None else node.epoch,
                stale_before=store.db_time(now - table.STALE),
            )
        self._pending[pending.id] = pending
        shown = {
            k: (v if len(repr(v)) <= MAX_SHOWN_ARGUMENT_CHARS else "…(too long to show)")
            for k, v in arguments.items()
        }
        announced = timed_out = False
        try:
            await self.publish(
                call.session_id,
                Publish(
                    event=ApprovalRequired(
                        approval_id=pending.id,
                        tool=tool,
                        arguments=shown,
                        expires_at=expires.isoformat().replace("+00:00", "Z"),
                    )
                ),
            )
            announced = True
            timed_out = await self._wait(pending)
        finally:
            # Also when the caller is cancelled: nobody can decide any more, and the people
            # shown approval_required must not be left with a question that means nothing.
            self._pending.pop(pending.id, None)
            if self.store is not None:
                await self._close(pending)
            if announced:
                if pending.decided.is_set():
                    decision = "approved" if pending.approved else "denied"
                else:
                    decision = "timed_out" if timed_out else "cancelled"
                with trio.move_on_after(RESOLVED_PUBLISH_GRACE, shield=True):
                    await self.publish(
                        call.session_id,
                        Publish(
                            event=ApprovalResolved(
                                approval_id=pending.id, decision=decision, by=pending.by
                            )
                        ),
                    )
        return pending.approved

    async def _wait(self, pending: _Pending) -> bool:
        """Wait until ``pending`` is decided (True: it timed out first)."""
        deadline = trio.current_time() + self.timeout
        while not pending.decided.is_set():
            left = deadline - trio.current_time()
            if left <= 0:
                return True
            with trio.move_on_after(min(left, POLL_SECONDS) if self.shared else left):
                await pending.poked.wait()
            pending.poked = trio.Event()
            if self.shared and not pending.decided.is_set():
                await self._read(pending)  # answered through another node?
        return False

    async def _read(self, pending: _Pending) -> None:
        assert self.store is not None
        try:
            row = await self.store.run(table.READ, id=pending.id)
        except StoreError as exc:  # read again at the next poll
            log.warning("reading approval %s: %s", pending.id, exc)
            return
        if row is None:  # dropped with its session (deleted through another node)
            pending.decide("denied", None)
        elif row[0] is not None:
            pending.decide(row[0], row[1])

    async def _close(self, pending: _Pending) -> None:
        """Delete ``pending``'s row, taking the answer it holds if none was seen yet (an
        answer through another node that came as the call stopped waiting)."""
        assert self.store is not None
        row = None
        with trio.move_on_after(RESOLVED_PUBLISH_GRACE, shield=True):
            try:
                row = await self.store.run(table.CLOSE, id=pending.id)
            except StoreError as exc:  # the row reads as gone once it expired
                log.warning("closing approval %s: %s", pending.id, exc)
        if row is not None and row[0] is not None and not pending.decided.is_set():
            pending.decide(row[0], row[1])

    async def drop_lost(self, view: ClusterView) -> list[tuple[str, str]]:
        """Delete the approvals whose calls waited on a node incarnation ``view`` shows ended
        (a crash, a node declared dead: the call, and the turn, are gone with it) and tell
        their sessions ``approval_resolved`` ``cancelled``, as when a waiting call is
        cancelled. However many nodes pass at once, each row is deleted, and told, by one.
        Returns ``[(approval_id, session_id)]`` of those it deleted.

        Raises:
            StoreError: the store did not answer (the next pass does it).
        """
        if self.store is None:
            return []
        dropped: list[tuple[str, str]] = []
        for node_id, epoch in await self.store.run(table.LOST_INCARNATIONS):
            if ended_by(view, NodeRef(node_id, epoch)) is None:
                continue
            rows = await self.store.run(table.DROP_LOST, node_id=node_id, node_epoch=epoch)
            for approval_id, session_id in rows:
                log.warning(
                    "approval %s of session %s withdrawn: node %r epoch %d ended while its call"
                    " waited",
                    approval_id,
                    session_id,
                    node_id,
                    epoch,
                )
                event = ApprovalResolved(approval_id=approval_id, decision="cancelled", by=None)
                try:
                    await self.publish(session_id, Publish(event=event))
                except Exception as exc:  # the row is gone: listing no longer shows it
                    log.warning("telling session %s: %s", session_id, exc)
            dropped.extend(rows)
        return dropped

    def poke(self, approval_id: str) -> None:
        """Another node recorded an answer to ``approval_id``: if a call waits for it here,
        it reads the answer now."""
        pending = self._pending.get(approval_id)
        if pending is not None:
            pending.poked.set()

    async def list_pending(self, session_id: str) -> list[dict[str, Any]]:
        """The approvals a session is waiting on, on whichever node (``[{approval_id, tool}]``,
        oldest first)."""
        if self.store is None:
            return self.pending(session_id)
        live = self.store.db_time(self.clock.now() - table.STALE)
        rows = await self.store.run(table.PENDING, session_id=session_id, live_after=live)
        return [{"approval_id": id, "tool": tool} for id, tool in rows]

    async def answer(self, user: str, approval_id: str, approved: bool) -> dict[str, Any]:
        """Record a person's decision, through any node: the first answer wins.

        Raises:
            NotFound: no pending approval with that id for this user's sessions.
            InvalidArgument: it was decided already.
        """
        if self.store is None:
            return self.resolve(user, approval_id, approved)
        decision = "approved" if approved else "denied"
        outcome = await self.store.run(
            table.DECIDE,
            id=approval_id,
            owner=user,
            decision=decision,
            live_after=self.store.db_time(self.clock.now() - table.STALE),
        )
        if outcome is None:
            raise NotFound(f"no pending approval with id {approval_id!r}")
        won, session_id = outcome
        if not won:
            raise InvalidArgument(f"approval {approval_id!r} is already decided")
        pending = self._pending.get(approval_id)
        if pending is not None:  # the call waits here
            pending.decide(decision, user)
        elif self.shared:  # it waits on another node: tell it (its poll is the fallback)
            try:
                await self.store.notify(CHANNEL, f"a {session_id} {approval_id}")
            except StoreError as exc:
                log.warning("announcing the answer to approval %s: %s", approval_id, exc)
        return {"approval_id": approval_id, "decision": decision, "session_id": session_id}

    async def drop_session(self, session_id: str) -> int:
        """Deny every approval a deleted session is waiting on (nobody can answer them any
        more, and none may be answered for a later session of the same name): those waiting
        here at once, those waiting on other nodes when they next read their row (gone);
        returns how many there were."""
        mine = [p for p in self._pending.values() if p.session_id == session_id]
        for pending in mine:
            if not pending.decided.is_set():
                pending.decide("denied", None)
            self._pending.pop(pending.id, None)
        if self.store is None:
            return len(mine)
        dropped = await self.store.run(table.DROP, session_id=session_id)
        return max(dropped, len(mine))

    def resolve(self, user: str, approval_id: str, approved: bool) -> dict[str, Any]:
        """Record a person's decision on an approval in this desk's memory (a desk without a
        store; with one, ``answer``).

        Raises:
            NotFound: no pending approval with that id for this user's sessions.
        """
        pending = self._pending.get(approval_id)
        if pending is None or pending.owner != user:
            raise NotFound(f"no pending approval with id {approval_id!r}")
        if pending.decided.is_set():
            raise InvalidArgument(f"approval {approval_id!r} is already decided")
        pending.decide("approved" if approved else "denied", user)
        return {
            "approval_id": approval_id,
            "decision": "approved" if approved else "denied",
            "session_id": pending.session_id,
        }
