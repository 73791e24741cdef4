"""Scenario ``history``: what activating a long session costs in reading its transcript.

A session activates (its first message, after passivation, on another node after a failover)
by loading the last ``history_entries`` (200) transcript entries from its event log; the memory
feature's extraction and ``GET /sessions/{id}/history`` load it the same way. The log holds
every event the session streamed: a turn of a 100-word answer is about 104 events, of which 3
stand for transcript entries.

Measured on SQLite and PostgreSQL, for a session of ``TURNS`` turns of ``DELTAS`` deltas each,
best of ``ROUNDS``: ``load_history`` as it is (the newest transcript events only, read back from
the end of the log), against the baseline in the same run: the whole log read forward in
pages of 1,000 and rebuilt, keeping the end (what ``load_history`` did before). Both answer
the same entries (checked here).
"""

from __future__ import annotations

import tempfile
import time

import trio

from bench.harness import Measure, ScenarioResult
from bench.pgschema import PostgresUnavailable, temporary_schema
from turnstile.actors.sessions.history import history_from_events, load_history
from turnstile.runtime.store import Store, open_store

KEEP = 200
DELTAS = 100
ROUNDS = 5


def _turn(i: int) -> list[tuple[str, dict]]:
    events = [("turn_queued", {"input_id": i, "source": "user", "ahead": 0})]
    events.append(("stream_start", {"input_id": i, "source": "user", "content": f"question {i}"}))
    events += [("stream_delta", {"input_id": i, "text": "word "}) for _ in range(DELTAS)]
    events.append(("stream_end", {"input_id": i, "status": "completed", "text": "word " * DELTAS}))
    events.append(("session_sync", {"busy": False, "queued": 0}))
    return events


async def _whole_log(store: Store, session_id: str, keep: int):
    """The baseline: every event read forward, the transcript rebuilt, its end kept."""
    entries = []
    after = 0
    while page := await store.read_events(session_id, after_seq=after, limit=1000):
        entries.extend(history_from_events(page))
        del entries[: max(0, len(entries) - keep)]
        after = page[-1].seq
    return entries


async def _best(fn, *args) -> tuple[float, object]:
    best, answer = float("inf"), None
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        answer = await fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, answer


async def _measure(url: str, turns: int) -> tuple[float, float, int]:
    async with open_store(url) as store:
        await store.create_session("long", "ada")
        for i in range(turns):
            await store.append_events("long", _turn(i))
        events = await store.last_seq("long")
        now, ours = await _best(load_history, store, "long", KEEP)
        before, theirs = await _best(_whole_log, store, "long", KEEP)
        assert ours == theirs, "load_history and the whole-log rebuild disagree"
        return now, before, events


def run(quick: bool = False) -> ScenarioResult:
    """Time ``load_history`` against the whole-log rebuild on both backends."""
    turns = 200 if quick else 1_000
    result = ScenarioResult(scenario="history")
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-") as tmp:
        figures = {"SQLite": trio.run(_measure, f"sqlite:///{tmp}/history.db", turns)}
    try:
        with temporary_schema() as url:
            figures["PostgreSQL"] = trio.run(_measure, url, turns)
    except PostgresUnavailable as exc:
        result.notes.append(f"PostgreSQL skipped: {exc}")
    for label, (now, before, events) in figures.items():
        result.measures.append(
            Measure(
                f"{label}: load the last {KEEP} entries, {turns:,} turns ({events:,} events)",
                now * 1e3,
                "ms",
                baseline="the whole log read and rebuilt",
                baseline_value=before * 1e3,
            )
        )
    result.notes.append(
        f"A session of {turns:,} turns, each a stream_start, {DELTAS} stream_deltas, a "
        f"stream_end and the turn_queued and session_sync around it; best of {ROUNDS} loads "
        f"of the last {KEEP} transcript entries (the sessions' default history_entries). "
        "Both ways give the same entries."
    )
    return result
