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
dirty watchers (and dirty chunks) are flushed together, in one ``kv_put``, at most every
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

from turnstile.actors.watchers.state import HISTORY_CHUNKS, HISTORY_SIZE, Watcher

log = logging.getLogger("turnstile.watcher")

NAMESPACE = "watchers"


class PersistenceMixin:
    """``WatcherActor``'s store: write-through, write-behind, reload. See the module docstring."""

    # -- loading --

    async def _load(self) -> None:
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
        now_wall = self.clock.now().timestamp()
        orphans = [
            f"{wid}/h{k:02d}" for wid in chunks if wid not in states for k in range(HISTORY_CHUNKS)
        ]
        for wid, state in states.items():
            try:
                watcher = Watcher.from_state(state)
            except Exception:
                log.exception("watcher %s could not be restored; it is left in the store", wid)
                continue
            entries = sorted(chunks.get(wid, []), key=lambda e: e[0])[-HISTORY_SIZE:]
            watcher.history.extend(tuple(e) for e in entries)
            self._add(watcher)
            if watcher.state == "running":
                self._schedule(watcher, self._resume_in(watcher, now_wall))
        if orphans:
            await self.store.kv_delete(NAMESPACE, orphans)
        log.info("watchers loaded: %d", len(self.watchers))

    def _resume_in(self, watcher: Watcher, now_wall: float) -> float:
        """Seconds to the watcher's next grid point after a restart (strictly after now)."""
        delay = watcher.delay()
        planned = watcher.next_check_at
        if planned is None:
            return delay
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
            await self.store.kv_put(NAMESPACE, [(w.id, w.to_state(), None)])

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
        """Write every dirty watcher and history chunk, in one ``kv_put``."""
        async with self._write_lock:
            dirty, self._dirty = self._dirty, set()
            chunks, self._dirty_chunks = self._dirty_chunks, set()
            items: list[tuple[str, dict[str, Any], None]] = []
            for wid in dirty:
                watcher = self.watchers.get(wid)
                if watcher is not None:
                    items.append((wid, watcher.to_state(), None))
            for wid, chunk in chunks:
                watcher = self.watchers.get(wid)
                if watcher is not None:
                    entries = watcher.chunk_entries(chunk)
                    items.append((f"{wid}/h{chunk:02d}", {"entries": entries}, None))
            if not items:
                return
            try:
                await self.store.kv_put(NAMESPACE, items)
            except BaseException:
                self._dirty |= dirty
                self._dirty_chunks |= chunks
                raise
            self.stats["flushes"] += 1
            self.stats["flushed_items"] += len(items)
