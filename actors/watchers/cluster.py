"""Watchers across several nodes: each watcher is checked by one node, and moves with its state.

``ClusterMixin`` is the half of ``WatcherActor`` that only runs when the node shares its store
with other nodes (``share``, the node's ``runtime.membership.Membership``; None on one node,
where none of this runs and nothing costs more). The mixin uses the actor's ``store``,
``share``, ``watchers``, ``nursery``, the persistence mixin's reads and writes and the actor's
own ``_pause``/``_resume``/``_stop``.

**Who checks a watcher.** The live node that rendezvous hashing of the watcher's id picks
(``share.owns``), as for jobs. The store is the truth: every node reads and writes the same
rows (``persistence.py``). A watcher's row also names the node that checks it (``holder``), so
that a move is a handover rather than a race: a node adopts a watcher it owns only when the
row names nobody, itself, or a node that is not live; the node that loses a watcher (another
node joined, or it drains) stops checking it and writes its state with ``holder`` cleared.
Every ``share.interval`` (a third of the lease) a node looks at the live set and the nodes
table; when either changed (a node joined, or ended: epochs only grow, so a node that came and
went between two looks still shows) or a handover is pending, it reads every watcher's row,
gives up those it no longer owns and adopts those it gained, with their persisted state:
counts, history, the last result and the strategy's state (what was last notified, the error
streak, debounce and cooldown), so the watcher does not escalate again what it escalated on
the node before. A dead node's watchers are adopted by their new owners right after the sweep
that declares it dead (the live set is looked at four times an interval): within the lease
plus about one interval of its last heartbeat. They resume on their grid (the next multiple
of the interval after now); a watcher that had never been checked is checked at once.

**Controls through any node.** A watcher is reached through any node; a user still reaches
only their own (another user's is "not found", as on one node):

* creating one through a node that does not own it writes its row and a *request* row
  (namespace ``watchers.requests``, key ``<watcher id>/<stamp>``) and announces it on the
  notification channel ``turnstile_watchers`` (``r <watcher id>``); the owner adopts it and
  checks it at once;
* pausing, resuming, stopping, and a deleted session's watchers, through a node that does not
  hold the watcher, are request rows too: the owner applies them in order and deletes them.
  The node asked waits (in the asker's task, not the actor's: ``Forwarded``) until the row is
  gone, at most ``REQUEST_WAIT`` seconds, then answers from the store. A lost announcement is
  caught by the owner's look at the requests every interval, so it only delays; past the wait
  the answer says what was asked, and the request is still applied;
* reading one, its history and lists read the store (the holder's rows, written at most
  ``persist_interval`` behind its checks); lists use an index (namespace ``watchers.index``,
  key ``<session key>\\x1f<watcher id>``, a copy of each watcher's row written with it), so a
  session's or a user's watchers are one range read, not a scan of every watcher.

**Not guaranteed.** While nodes disagree on the live set (one interval around a change) a
handover is what keeps a watcher single; a node that was paused past its lease (SIGSTOP) checks
its watchers until its next heartbeat tells it it was declared dead, and a check may then run
twice. A watcher's state written by a node that died is as old as its last flush (one
``persist_interval``): the checks of that window are run again, and an escalation of that
window may be repeated. The per-session limit is counted in the store, in the
transaction that writes the new watcher's rows (``Store.kv_put_within``), so creations at once
through several nodes never pass it.

It is over 400 lines because adoption, release and forwarded requests all turn on the same
``holder`` field and live set, and must be read together to see that a watcher is checked by one
node at a time.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from turnstile.actors.sessions.ids import OWNER_SEPARATOR
from turnstile.actors.watchers.base import WatcherBase, WatcherShare
from turnstile.actors.watchers.persistence import INDEX, NAMESPACE, index_key
from turnstile.actors.watchers.spec import _Scoped
from turnstile.actors.watchers.state import HISTORY_CHUNKS, HISTORY_SIZE, Watcher
from turnstile.runtime.errors import NotFound, StoreError

log = logging.getLogger("turnstile.watcher")

#: The notification channel of the watchers feature: ``r <watcher id>`` (a request waits).
CHANNEL = "turnstile_watchers"
#: Requests to the node that checks a watcher: ``<watcher id>/<stamp>`` → ``{"op": …}``.
REQUESTS = "watchers.requests"
#: How long the node asked waits for the owner to apply a request before it answers.
REQUEST_WAIT = 10.0
_SEP = "\x1f"
_PAGE = 1000


class Forwarded:
    """An answer that waits for another node to apply a request.

    The watcher actor returns it instead of waiting itself, so that its mailbox is not held
    while another node works; whoever asked settles it in their own task (``settled``).
    """

    def __init__(
        self, store: Any, keys: list[str], answer: Callable[[bool], Awaitable[Any]]
    ) -> None:
        self.store = store
        self.keys = keys
        self.answer = answer

    async def settle(self) -> Any:
        """Wait until every request was applied (at most ``REQUEST_WAIT``), then answer."""
        pending = list(self.keys)
        delay = 0.01
        with trio.move_on_after(REQUEST_WAIT):
            while pending:
                pending = [k for k in pending if await self.store.kv_get(REQUESTS, k) is not None]
                if pending:
                    await trio.sleep(delay)
                    delay = min(delay * 2, 0.25)
        return await self.answer(not pending)


async def settled(answer: Any) -> Any:
    """``answer`` itself, or what a ``Forwarded`` answer settles to."""
    if isinstance(answer, Forwarded):
        return await answer.settle()
    return answer


#: ``_cluster_receive``'s answer for a message the actor handles as on one node.
LOCAL = object()


class ClusterMixin(WatcherBase):
    """``WatcherActor`` on several nodes. See the module docstring."""

    def _cluster_init(self) -> None:
        #: watchers this node owns whose row still names another live node
        self._waiting: set[str] = set()
        #: watchers stopped here since the last full read (not to be adopted from it)
        self._gone: set[str] = set()
        self._heard: set[str | None] = set()
        self._poke = trio.Event()
        self._nodes: frozenset[tuple[str, int, str]] = frozenset()
        #: the nodes alive (by their lease) at the last look at the nodes table
        self._alive: set[str] = set()

    # -- who checks what --

    @property
    def _share(self) -> WatcherShare:
        """``share``, which is there whenever this half runs (several nodes)."""
        share = self.share
        if share is None:
            raise RuntimeError("the watcher actor runs on one node: it has no share")
        return share

    @property
    def _me(self) -> str:
        return self._share.ref.id

    def _may_adopt(self, state: dict[str, Any]) -> bool:
        """Whether the row names no node that may still check it: nobody, this node, or a node
        neither the last sweep nor the last look at the nodes table saw alive (a node that
        has just started knows only itself until its first sweep: the table tells it who else
        holds watchers)."""
        holder = state.get("holder")
        return (
            holder is None
            or holder == self._me
            or not (holder in self._share.live_ids or holder in self._alive)
        )

    async def _nodes_changed(self) -> bool:
        """Whether a node registered, or one ended, since the last look (epochs only grow,
        so a node that came and went between two looks still shows)."""
        view = await self.store.list_nodes()
        self._alive = {n.id for n in view.nodes if n.alive}
        nodes = frozenset((n.id, n.epoch, n.state) for n in view.nodes)
        changed, self._nodes = nodes != self._nodes, nodes
        return changed

    async def _cluster_start(self) -> None:
        """At start (instead of loading every watcher): adopt this node's share."""
        await self._nodes_changed()
        await self._rebalance()
        self._tasks.start_soon(self.store.listen, CHANNEL, self._hear, name="watcher listener")
        self._tasks.start_soon(self._cluster_loop, name="watcher share")

    def _hear(self, payload: str | None) -> None:
        if payload is None:  # (re)connected: what was announced meanwhile is lost
            self._heard.add(None)
        else:
            kind, _, wid = payload.partition(" ")
            if kind == "r" and wid:
                self._heard.add(wid)
        self._poke.set()

    async def _cluster_loop(self) -> None:
        share = self._share
        live = share.live_ids
        tick = trio.current_time() + share.interval
        stale = False  # the rows must be read again (kept until a read succeeds)
        while True:
            # The live set is looked at four times an interval (memory only: a sweep changes
            # it), so a dead node's watchers move right after the sweep that saw it die; the
            # store (the nodes table, the requests) once an interval.
            with trio.move_on_at(min(tick, trio.current_time() + share.interval / 4)):
                await self._poke.wait()
            self._poke = trio.Event()
            heard, self._heard = self._heard, set()
            try:
                full = trio.current_time() >= tick
                if full:
                    tick = trio.current_time() + share.interval
                    stale |= await self._nodes_changed()
                if share.live_ids != live:
                    live, stale = share.live_ids, True
                if stale or (full and self._waiting):
                    await self._rebalance()
                    stale = False
                if full or None in heard:
                    await self._apply_requests()
                else:
                    for wid in heard:
                        if wid is not None and share.owns(wid):
                            await self._apply_requests(wid)
            except StoreError as exc:
                log.warning("watchers: looking at the share failed (%s); again in %gs", exc,
                            share.interval)  # fmt: skip

    async def _rebalance(self) -> None:
        """Read every watcher's row; give up those this node no longer owns, adopt those it
        gained (and may: their row names no other live node)."""
        self._gone.clear()
        states, chunks = await self._read_all()
        lost = [w for wid, w in self.watchers.items() if not self._share.owns(wid)]
        if lost:
            await self._release(lost)
        self._waiting.clear()
        gained: list[Watcher] = []
        for wid, state in states.items():
            if wid in self.watchers or wid in self._gone or not self._share.owns(wid):
                continue
            if not self._may_adopt(state):
                self._waiting.add(wid)
                continue
            watcher = self._restore(wid, state, chunks.get(wid, ()))
            if watcher is not None:
                gained.append(watcher)
        if gained:
            await self._claim(gained)
        if lost or gained:
            log.info(
                "watchers: node %r now checks %d (gained %d, gave up %d, %d waiting)",
                self._me, len(self.watchers), len(gained), len(lost), len(self._waiting),
            )  # fmt: skip

    async def _release(self, watchers: list[Watcher]) -> None:
        for watcher in watchers:
            self._forget(watcher)
            watcher.holder = None
        await self._write_out(watchers)

    async def _claim(self, watchers: list[Watcher]) -> None:
        """Write these adopted watchers' rows naming this node, unless their session is gone:
        a session deleted while its watcher was held by a node that died leaves a ``drop``
        request, but the row was read before, so adopting it would write it back and check
        it for nobody (the survivor's ``delete`` in issue 23's crash harness). Those are
        deleted instead, and so are any stopped here while this adoption was under way."""
        gone = await self._gone_sessions({w.session_id for w in watchers})
        dropped = [w for w in watchers if w.session_id in gone]
        if dropped:
            log.warning("watchers: %d adopted watcher(s) of deleted sessions dropped", len(dropped))
            await self._stop(dropped, announce=False)
        for watcher in watchers:
            watcher.holder = self._me
        await self._write_out([w for w in watchers if w.session_id not in gone], still_held=True)

    async def _adopt(self, wid: str, state: dict[str, Any]) -> Watcher | None:
        """Adopt one watcher now (its row was just read), with its history."""
        entries = await self._read_history(wid)
        if wid in self.watchers:  # adopted meanwhile
            return self.watchers[wid]
        watcher = self._restore(wid, state, entries)
        if watcher is not None:
            await self._claim([watcher])
        return watcher

    async def _read_history(self, wid: str) -> list[list[Any]]:
        entries: list[list[Any]] = []
        for _, value in await self._scan(NAMESPACE, f"{wid}/", HISTORY_CHUNKS):
            entries.extend(value.get("entries", []))
        return entries

    async def _scan(
        self, namespace: str, prefix: str, limit: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """The rows of ``namespace`` whose key starts with ``prefix`` (at most ``limit``)."""
        out: list[tuple[str, dict[str, Any]]] = []
        after = prefix
        while True:
            page = await self.store.kv_list(namespace, after_key=after, limit=_PAGE)
            for key, value in page:
                if not key.startswith(prefix):
                    return out
                out.append((key, value))
                if limit is not None and len(out) >= limit:
                    return out
            if len(page) < _PAGE:
                return out
            after = page[-1][0]

    # -- requests --

    async def _request(self, wid: str, op: str) -> str:
        """Store a request for the node that checks ``wid`` and announce it."""
        stamp = f"{self.clock.now().timestamp():020.6f}-{secrets.token_hex(4)}"
        key = f"{wid}/{stamp}"
        await self.store.kv_put(REQUESTS, [(key, {"op": op, "by": self._me}, None)])
        try:
            await self.store.notify(CHANNEL, f"r {wid}")
        except StoreError as exc:  # a hint: the owner's look every interval finds it
            log.info("watchers: announcing a request failed: %s", exc)
        return key

    async def _apply_requests(self, wid: str | None = None) -> None:
        """Apply the requests for the watchers this node owns (of ``wid`` alone, when given)."""
        rows = await self._scan(REQUESTS, "" if wid is None else f"{wid}/")
        done: list[str] = []
        for key, request in rows:
            target = key.partition("/")[0]
            if not self._share.owns(target):
                continue
            watcher = self.watchers.get(target)
            if watcher is None:
                state = await self.store.kv_get(NAMESPACE, target)
                if state is None or target in self._gone:  # stopped already
                    done.append(key)
                    continue
                if not self._may_adopt(state):
                    self._waiting.add(target)
                    continue
                watcher = await self._adopt(target, state)
                if watcher is None:
                    done.append(key)
                    continue
            if self.watchers.get(target) is watcher:
                await self._perform(watcher, request.get("op"))
            done.append(key)
        if done:
            await self.store.kv_delete(REQUESTS, done)

    async def _perform(self, watcher: Watcher, op: Any) -> None:
        if op == "pause":
            await self._pause(watcher)
        elif op == "resume":
            await self._resume(watcher)
        elif op == "stop":
            await self._stop([watcher])
        elif op == "drop":
            await self._stop([watcher], announce=False)
        elif op != "start":  # start: adopting it was the work
            log.warning("watchers: unknown request %r for watcher %s", op, watcher.id)

    # -- answering through any node --

    def _scoped_state(self, msg: _Scoped, state: dict[str, Any] | None) -> dict[str, Any]:
        if (
            state is None
            or (msg.session_id is not None and state.get("session_id") != msg.session_id)
            or (msg.owner is not None and state.get("owner") != msg.owner)
        ):
            raise NotFound(f"no watcher with id {msg.watcher_id!r}")
        return state

    async def _stored(self, msg: _Scoped) -> Watcher:
        """The watcher as the store has it, with its history (another node checks it)."""
        state = self._scoped_state(msg, await self.store.kv_get(NAMESPACE, msg.watcher_id))
        watcher = Watcher.from_state(state)
        entries = sorted(await self._read_history(watcher.id), key=lambda e: e[0])
        watcher.history.extend(tuple(e) for e in entries[-HISTORY_SIZE:])
        return watcher

    async def _forward(self, msg: _Scoped, op: str) -> Any:
        """Pause, resume or stop a watcher this node does not hold."""
        wid = msg.watcher_id
        state = self._scoped_state(msg, await self.store.kv_get(NAMESPACE, wid))
        if self._share.owns(wid) and self._may_adopt(state):
            if await self._adopt(wid, state) is not None:
                return LOCAL  # held here now: handled as on one node
        before = Watcher.from_state(state)
        key = await self._request(wid, op)

        async def answer(applied: bool) -> dict[str, Any]:
            if op == "stop":
                view = before.summary_view()
                view["status"], view["next_check_at"] = "stopped", None
                return view
            now = await self.store.kv_get(NAMESPACE, wid) if applied else None
            watcher = before if now is None else Watcher.from_state(now)
            if not applied:  # still waiting to be applied: say what was asked
                watcher.state = "paused" if op == "pause" else "running"
            return watcher.summary_view()

        return Forwarded(self.store, [key], answer)

    async def _save_first(self, watcher: Watcher) -> None:
        """Write a new watcher's row and index row, unless its session has
        ``max_per_session`` watchers already: counted in the index and written in one
        transaction, so creations at once through several nodes never pass the limit.

        Raises:
            LimitExceeded: the session is at the limit; nothing was written.
        """
        async with self._write_lock:
            state = watcher.to_state()
            found = await self.store.kv_put_within(
                [
                    (NAMESPACE, watcher.id, state, None),
                    (INDEX, index_key(watcher.session_id, watcher.id), state, None),
                ],
                namespace=INDEX,
                prefix=index_key(watcher.session_id, ""),
                limit=self.max_per_session,
            )
        if found is not None:
            raise self._full(found)

    async def _list_stored(self, session_id: str | None, owner: str | None) -> list[Watcher]:
        """Every watcher of a session (or of an owner), as the index has it; the ones held
        here as they are now."""
        prefix = (
            index_key(session_id, "") if session_id is not None else f"{owner}{OWNER_SEPARATOR}"
        )
        found: list[Watcher] = []
        for key, state in await self._scan(INDEX, prefix):
            wid = key.rpartition(_SEP)[2]
            watcher = self.watchers.get(wid)
            if watcher is None:
                try:
                    watcher = Watcher.from_state(state)
                except Exception:
                    log.warning("watcher %s: its index row could not be read", wid)
                    continue
            if owner is not None and watcher.owner != owner:
                continue
            if session_id is not None and watcher.session_id != session_id:
                continue
            found.append(watcher)
        return found

    async def _drop_everywhere(self, session_id: str) -> Any:
        """A deleted session's watchers: those held here stop now, the others by request."""
        rows = await self._scan(INDEX, index_key(session_id, ""))
        mine: list[Watcher] = []
        keys: list[str] = []
        for key, _ in rows:
            wid = key.rpartition(_SEP)[2]
            watcher = self.watchers.get(wid)
            if watcher is not None:
                mine.append(watcher)
            else:
                keys.append(await self._request(wid, "drop"))
        if mine:
            await self._stop(mine, announce=False)
        count = len(rows)

        async def answer(applied: bool) -> int:
            return count

        return Forwarded(self.store, keys, answer) if keys else count
