"""How watchers are written to the store, and restored from it at start.

``PersistenceMixin`` is the half of ``WatcherActor`` that talks to the store: the write-through
of start, pause and resume, the write-behind of check results, and the reload at start. It is
separate from the actor so that the storage layout and its crash guarantees live in one place.
The mixin uses the actor's ``store``, ``clock``, ``watchers``, ``persist_interval``,
``stats``, its dirty sets, event and write lock, and ``_add``/``_schedule`` when loading.

**Persistence** (store key-value namespace ``watchers``). Key ``<watcher_id>`` holds the
watcher's full state (session, owner, tool, params, strategy and config, running/paused, counts,
last result hash and bounded value, error streak, debounce/cooldown state, summary batch, next
check time). The history ring (100 entries) is stored in chunks of ``HISTORY_CHUNK`` entries
under ``<watcher_id>/hNN``, so a check rewrites one small chunk rather than the whole ring.
Start, pause, resume and stop are written through at once. Check results are written behind:
dirty watchers (and dirty chunks) are flushed together, in one commit, at most every
``persist_interval`` seconds, and on stop. So a kill -9 loses at most the checks of the last
flush window (counts and history a second behind); it never loses a watcher.

At start the actor reloads every watcher: running ones resume on their own grid — the next
check is the first multiple of the interval after now, counted from the last planned check —
paused ones stay paused, counts and history are kept.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

from turnstile.actors.watchers.base import WatcherBase
from turnstile.actors.watchers.state import HISTORY_CHUNKS, HISTORY_SIZE, Watcher
from turnstile.runtime.errors import NotFound

log = logging.getLogger("turnstile.watcher")

NAMESPACE = "watchers"
#: Several nodes: a copy of each watcher's row under ``index_key`` (``cluster.py``), so that
#: a session's or a user's watchers are one range read.
INDEX = "watchers.index"


def _chunk_keys(watcher_id: str) -> list[str]:
    """The keys of a watcher's history chunks in ``NAMESPACE``."""
    return [f"{watcher_id}/h{k:02d}" for k in range(HISTORY_CHUNKS)]


def index_key(session_id: str, watcher_id: str) -> str:
    """The watcher's key in the ``INDEX`` namespace: its session's key, ``\x1f``, its id."""
    return f"{session_id}\x1f{watcher_id}"


class PersistenceMixin(WatcherBase):
    """``WatcherActor``'s store: write-through, write-behind, reload. See the module docstring."""

    # -- loading --

    async def _load(self) -> None:
        """At start on one node: every watcher (on several, ``cluster.py`` adopts a share)."""
        states, chunks = await self._read_all()
        for wid, state in states.items():
            self._restore(wid, state, chunks.get(wid, ()))
        log.info("watchers loaded: %d", len(self.watchers))

    async def _read_all(self) -> tuple[dict[str, dict[str, Any]], dict[str, list[list[Any]]]]:
        """Every watcher's row and history entries; deletes history left by no watcher."""
        rows: list[tuple[str, dict[str, Any]]] = []
        after: str | None = None
        while True:
            page = await self.store.kv_list(NAMESPACE, after_key=after, limit=1000)
            rows.extend(page)
            if len(page) < 1000:
                break
            after = page[-1][0]
        states: dict[str, dict[str, Any]] = {}
        chunks: dict[str, list[list[Any]]] = {}
        for key, value in rows:
            wid, sep, _ = key.partition("/")
            if sep:
                chunks.setdefault(wid, []).extend(value.get("entries", []))
            else:
                states[key] = value
        await self._drop_of_gone_sessions(states, chunks)
        orphans = [
            f"{wid}/h{k:02d}" for wid in chunks if wid not in states for k in range(HISTORY_CHUNKS)
        ]
        if orphans:
            await self.store.kv_delete(NAMESPACE, orphans)
        return states, chunks

    async def _drop_of_gone_sessions(
        self, states: dict[str, dict[str, Any]], chunks: dict[str, list[list[Any]]]
    ) -> None:
        """Delete (and leave out of ``states``) the watchers whose session no longer exists:
        a node that died between deleting a session and deleting its watchers left them
        (issue 23's crash harness, scenario ``delete``); restored, they would run forever for
        nobody."""
        gone = await self._gone_sessions({state.get("session_id") for state in states.values()})
        dead = [wid for wid, state in states.items() if state.get("session_id") in gone]
        if not dead:
            return
        log.warning(
            "%d watcher(s) of deleted sessions (%s) were left by an interrupted delete:"
            " deleted now",
            len(dead),
            ", ".join(sorted(gone)),
        )
        items = [(NAMESPACE, key) for wid in dead for key in (wid, *_chunk_keys(wid))]
        items += [(INDEX, index_key(states[wid]["session_id"], wid)) for wid in dead]
        async with self._write_lock:  # after a flush under way, which would write them back
            # one held here already (adopted before its session went) stops too: its next
            # flush would write its rows back (the survivor's ``delete`` in the crash harness)
            await self.store.kv_delete_items(items)
            for wid in dead:
                held = self.watchers.get(wid)
                if held is not None:
                    self._forget(held)
        for wid in dead:
            del states[wid]
            chunks.pop(wid, None)

    async def _gone_sessions(self, session_ids: set[Any]) -> set[str]:
        """Which of these sessions no longer exist (one read each)."""
        gone: set[str] = set()
        for session_id in session_ids:
            if not isinstance(session_id, str):
                continue
            try:
                await self.store.get_session(session_id)
            except NotFound:
                gone.add(session_id)
        return gone

    def _restore(self, wid: str, state: dict[str, Any], entries) -> Watcher | None:
        """Add a stored watcher and schedule it (running: on its grid); None if unreadable."""
        try:
            watcher = Watcher.from_state(state)
        except Exception:
            log.exception("watcher %s could not be restored; it is left in the store", wid)
            return None
        watcher.history.extend(
            tuple(e) for e in sorted(entries, key=lambda e: e[0])[-HISTORY_SIZE:]
        )
        self._add(watcher)
        if watcher.state == "running":
            self._schedule(watcher, self._resume_in(watcher, self.clock.now().timestamp()))
        return watcher

    def _resume_in(self, watcher: Watcher, now_wall: float) -> float:
        """Seconds to the watcher's next grid point after a restart (strictly after now)."""
        delay = watcher.delay()
        planned = watcher.next_check_at
        if planned is None:
            return delay
        if watcher.check_count == 0:  # never checked (created through another node): at once
            return max(0.0, planned - now_wall)
        if planned > now_wall:
            return planned - now_wall
        steps = math.floor((now_wall - planned) / delay) + 1
        return planned + steps * delay - now_wall

    # -- writing --

    def _mark(self, w: Watcher, chunk: int | None = None) -> None:
        self._dirty.add(w.id)
        if chunk is not None:
            self._dirty_chunks.add((w.id, chunk))
        if not self._dirty_event.is_set():
            self._dirty_event.set()

    async def _save_now(self, w: Watcher) -> None:
        """Write one watcher's state through (start, pause, resume)."""
        async with self._write_lock:
            self._dirty.discard(w.id)
            state = w.to_state()
            items = [(NAMESPACE, w.id, state, None)]
            if self.share is not None:
                items.append((INDEX, index_key(w.session_id, w.id), state, None))
            await self.store.kv_put_items(items)

    async def _persist_loop(self) -> None:
        while True:
            await self._dirty_event.wait()
            await trio.sleep(self.persist_interval)  # gather a window's worth of checks
            self._dirty_event = trio.Event()
            try:
                await self._flush()
            except Exception:
                log.exception("flushing watchers failed; retrying in %ss", self.persist_interval)
                self._dirty_event.set()

    async def _flush(self) -> None:
        """Write every dirty watcher, its index row and history chunks, in one commit."""
        async with self._write_lock:
            dirty, self._dirty = self._dirty, set()
            chunks, self._dirty_chunks = self._dirty_chunks, set()
            items: list[tuple[str, str, dict[str, Any], None]] = []
            for wid in dirty:
                watcher = self.watchers.get(wid)
                if watcher is not None:
                    state = watcher.to_state()
                    items.append((NAMESPACE, wid, state, None))
                    if self.share is not None:
                        items.append((INDEX, index_key(watcher.session_id, wid), state, None))
            for wid, chunk in chunks:
                watcher = self.watchers.get(wid)
                if watcher is not None:
                    entries = watcher.chunk_entries(chunk)
                    items.append((NAMESPACE, f"{wid}/h{chunk:02d}", {"entries": entries}, None))
            if not items:
                return
            try:
                await self.store.kv_put_items(items)
            except BaseException:
                self._dirty |= dirty
                self._dirty_chunks |= chunks
                raise
            self.stats["flushes"] += 1
            self.stats["flushed_items"] += len(items)

    async def _write_out(self, watchers: list[Watcher], still_held: bool = False) -> None:
        """Write these watchers' rows (and index rows) and their unwritten history now: a
        handover on several nodes (``cluster.py``). ``still_held``: only those this node
        still holds once the lock is taken (an adoption: one stopped meanwhile, by a deleted
        session or a request, is not written back)."""
        async with self._write_lock:
            if still_held:
                watchers = [w for w in watchers if self.watchers.get(w.id) is w]
                if not watchers:
                    return
            ids = {w.id for w in watchers}
            self._dirty -= ids
            chunks = {c for c in self._dirty_chunks if c[0] in ids}
            self._dirty_chunks -= chunks
            items: list[tuple[str, str, dict[str, Any], None]] = []
            for w in watchers:
                state = w.to_state()
                items.append((NAMESPACE, w.id, state, None))
                items.append((INDEX, index_key(w.session_id, w.id), state, None))
            for w in watchers:
                for wid, chunk in chunks:
                    if wid == w.id:
                        entries = w.chunk_entries(chunk)
                        items.append((NAMESPACE, f"{wid}/h{chunk:02d}", {"entries": entries}, None))
            await self.store.kv_put_items(items)
