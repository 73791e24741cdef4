"""A session's transcript at start-up (``actors.sessions.history.load_history``): read from the
end of its event log, it is exactly the end of the transcript rebuilt from the whole log, for
every size kept, on both backends, however many deltas the turns streamed."""

from __future__ import annotations

import pytest

from turnstile.actors.sessions.history import (
    answer_entry,
    answer_origin,
    history_from_events,
    input_entry,
    load_history,
    unified_history,
)
from turnstile.runtime.store import open_store


def turn(i: int, deltas: int, folded: bool = False) -> list[tuple[str, dict]]:
    """One turn's events as a session stores them: its input, deltas, a tool call, maybe a
    message folded in, and its end."""
    events = [("turn_queued", {"input_id": i, "source": "user", "ahead": 0})]
    events.append(("stream_start", {"input_id": i, "source": "user", "content": f"q{i}"}))
    events += [("stream_delta", {"input_id": i, "text": "w "}) for _ in range(deltas)]
    events.append(
        (
            "tool_call",
            {"input_id": i, "tool": "echo", "arguments": {"n": i}, "ok": True, "result": {"n": i}},
        )
    )
    if folded:
        events.append(("user_message", {"input_id": i, "source": "user", "content": f"more{i}"}))
    events.append(("stream_end", {"input_id": i, "status": "completed", "text": f"a{i}"}))
    events.append(("session_sync", {"busy": False}))
    return events


@pytest.mark.parametrize("keep", [1, 2, 5, 7, 200, 10_000])
async def test_the_end_read_back_is_the_end_of_the_whole_transcript(store_url, keep):
    async with open_store(store_url) as store:
        await store.create_session("s", "ada")
        for i in range(60):
            await store.append_events("s", turn(i, deltas=i % 7 * 20, folded=i % 5 == 0))
        whole = history_from_events(await store.read_events("s", limit=100_000))
        assert len(whole) == 60 * 3 + 12  # input, tool, answer per turn; 12 folded messages
        assert await load_history(store, "s", keep) == whole[-keep:]


async def test_an_empty_log_and_nothing_kept(store_url):
    async with open_store(store_url) as store:
        await store.create_session("s", "ada")
        assert await load_history(store, "s", 200) == []
        await store.append_events("s", turn(0, deltas=3))
        assert await load_history(store, "s", 0) == []
        assert [e.content for e in await load_history(store, "s", 200)] == ["q0", '{"n":0}', "a0"]


@pytest.mark.parametrize(
    ("start", "origin"),
    [
        ({"source": "user", "content": "hi"}, {}),
        ({"source": "webhook", "content": "CI failed"}, {"source": "webhook"}),
        (
            {"source": "recall", "content": "[RECALL]", "job_id": "rc_1", "is_recall": True},
            {"source": "recall"},
        ),
        (
            {"source": "cron", "content": "[CRON]", "job_id": "j1", "run_id": 4, "label": "daily"},
            {"source": "cron", "job_id": "j1", "label": "daily"},
        ),
        (
            {"source": "schedule", "content": "x", "job_id": "j2"},
            {"source": "schedule", "job_id": "j2"},
        ),
    ],
)
def test_an_answer_carries_the_source_of_the_input_it_answered(start, origin):
    """cron-session-binding.md: the assistant entry carries its source, for rendering; a
    user's turn's answer carries none (``user`` is the default reading)."""
    assert answer_origin(start) == origin
    end = {"input_id": 1, "status": "completed", "text": "done", **origin}
    entry = answer_entry(end)
    assert (entry.role, entry.content, entry.source) == ("assistant", "done", origin.get("source"))
    assert (entry.cron_job_id, entry.cron_job_name) == (origin.get("job_id"), origin.get("label"))
    user = input_entry({"input_id": 1, **start})
    assert user.cron_turn == ("job_id" in origin)
    assert user.cron_job_name == (origin.get("label") if "job_id" in origin else None)


async def test_a_unified_history_merges_one_owners_sessions_in_order(store_url):
    """``unified_history`` on both backends: the owner's sessions' transcripts in the order
    they were stored, without the turn's own input, derived sessions or another owner's."""
    async with open_store(store_url) as store:
        for key, owner in (
            ("ada/a", "ada"),
            ("ada/b", "ada"),
            ("bob/a", "bob"),
            ("ada/a.heartbeat", "ada"),
        ):
            await store.create_session(key, owner)
        await store.append_events("ada/a", turn(1, deltas=2))
        await store.append_events("bob/a", turn(2, deltas=0))
        await store.append_events("ada/a.heartbeat", turn(3, deltas=0))
        await store.append_events("ada/b", turn(4, deltas=1))
        await store.append_events("ada/a", turn(5, deltas=0)[:2])  # the running turn's start
        merged = await unified_history(store, "ada", "ada/a", 5, keep=200)
        assert [e.content for e in merged] == ["q1", '{"n":1}', "a1", "q4", '{"n":4}', "a4"]
        assert [e.content for e in await unified_history(store, "ada", "ada/a", 5, 2)] == [
            '{"n":4}',
            "a4",
        ]
        assert await unified_history(store, "ada", "ada/a", 5, 0) == []
