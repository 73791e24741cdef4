"""A session's transcript, derived from its event log.

The transcript (``history``) is not stored apart: ``stream_start`` (a turn's input),
``user_message`` (an input folded into a running turn), ``tool_call`` and ``stream_end`` events
stand for its entries, one each, so it is rebuilt from the log at start-up (``load_history``)
and by the history route (``history_from_events``). Start-up reads only those events, from
the newest back, until it has the entries it keeps: a long session's deltas (most of its log)
and its old turns are never read (``Store.read_events_back``).

``unified_history`` is the ``unified_session`` mode's history (``[execution] unified_session``,
after cron-session-binding.md): a user's sessions as one conversation.
"""

from __future__ import annotations

from typing import Any

import msgspec

from turnstile.actors.sessions.agents.base import HistoryEntry, ToolResult
from turnstile.actors.sessions.ids import is_derived
from turnstile.runtime.errors import NotFound
from turnstile.runtime.store import EventRecord, Store

__all__ = [
    "TRANSCRIPT_EVENTS",
    "answer_entry",
    "answer_origin",
    "history_from_events",
    "input_entry",
    "load_history",
    "tool_result_text",
    "unified_history",
]


#: The events that stand for transcript entries (one entry each; see ``history_from_events``).
TRANSCRIPT_EVENTS = ("stream_start", "user_message", "tool_call", "stream_end")


async def load_history(store: Store, session_id: str, keep: int) -> list[HistoryEntry]:
    """The last ``keep`` transcript entries of the session's event log (as rebuilding the
    whole transcript and keeping its end would give), reading the log from its end."""
    if keep <= 0:
        return []
    newest_first: list[EventRecord] = []
    before: int | None = None
    while len(newest_first) < keep:
        page = await store.read_events_back(
            session_id, TRANSCRIPT_EVENTS, before_seq=before, limit=min(keep, 1000)
        )
        newest_first.extend(page)
        if len(page) < min(keep, 1000):
            break  # the log's start
        before = page[-1].seq
    return history_from_events(newest_first[:keep][::-1])


#: A unified history reads the transcripts of at most this many of the owner's sessions (the
#: most recently active, the turn's own always among them): a bound on each turn's reads.
UNIFIED_SESSIONS = 20


async def unified_history(
    store: Store, owner: str, key: str, input_id: int, keep: int
) -> list[HistoryEntry]:
    """The history a turn of ``owner``'s session ``key`` sees in the ``unified_session`` mode:
    the owner's sessions as one conversation, their transcripts merged in the order their
    events were stored, the last ``keep`` entries, without the entries of the turn's own
    input (``input_id``, what the agent answers).

    Derived sessions (a dedicated heartbeat's) are left out, and so is every other owner's
    session: the sessions are listed by owner. At most ``UNIFIED_SESSIONS`` sessions are read,
    the most recently active. A session deleted meanwhile is skipped.
    """
    if keep <= 0:
        return []
    sessions, after = [], None
    while True:
        page = await store.list_sessions(owner=owner, limit=100, after_id=after)
        sessions += [s for s in page if s.owner == owner and not is_derived(s.id)]
        if len(page) < 100:
            break
        after = page[-1].id
    sessions.sort(key=lambda s: s.updated_at, reverse=True)
    keys = [key, *(s.id for s in sessions if s.id != key)][:UNIFIED_SESSIONS]
    records: list[EventRecord] = []
    for each in keys:
        try:
            found = await store.read_events_back(each, TRANSCRIPT_EVENTS, limit=min(keep, 1000))
        except NotFound:
            continue
        records += [r for r in found if not (each == key and r.payload.get("input_id") == input_id)]
    records.sort(key=lambda r: (r.ts, r.session_id, r.seq))
    return history_from_events(records[-keep:])


def input_entry(start: dict[str, Any]) -> HistoryEntry:
    """The transcript entry of a turn's input, from its ``stream_start`` payload.

    A scheduled input keeps what triggered it: ``is_recall`` for a recall, else the
    cron-turn marker and the job, its name, its run and (cron) its prompt reference as
    ``cron_turn``, ``cron_job_id``, ``cron_job_name``, ``cron_run_id``, ``cron_prompt_ref``
    (cron-session-binding.md), so a later turn and the history route know which firing the
    entry stands for.
    """
    job_id, run_id, ref = start.get("job_id"), start.get("run_id"), start.get("prompt_ref")
    label = start.get("label")
    from_job = isinstance(job_id, str) and not start.get("is_recall")
    return HistoryEntry(
        role="user",
        content=start.get("content", ""),
        source=start.get("source"),
        is_recall=bool(start.get("is_recall")),
        cron_turn=from_job,
        cron_job_id=job_id if from_job else None,
        cron_job_name=label if from_job and isinstance(label, str) and label else None,
        cron_run_id=run_id if from_job and isinstance(run_id, int) else None,
        cron_prompt_ref=ref if from_job and isinstance(ref, dict) else None,
        notice=start.get("notice") is True,
    )


def answer_origin(start: dict[str, Any]) -> dict[str, Any]:
    """What a turn's ``stream_end`` says of the input it answered, from the turn's
    ``stream_start`` payload: its source when not ``user``, and a scheduled job's id and
    label (not a recall's: its entry is marked ``is_recall`` instead), so the answer renders
    as the job's (cron-session-binding.md: "source metadata suitable for rendering")."""
    source = start.get("source")
    if not isinstance(source, str) or source == "user":
        return {}
    origin: dict[str, Any] = {"source": source}
    job_id, label = start.get("job_id"), start.get("label")
    if isinstance(job_id, str) and not start.get("is_recall"):
        origin["job_id"] = job_id
        if isinstance(label, str) and label:
            origin["label"] = label
    return origin


def answer_entry(end: dict[str, Any]) -> HistoryEntry:
    """The transcript entry of a turn's answer, from its ``stream_end`` payload."""
    job_id, label = end.get("job_id"), end.get("label")
    return HistoryEntry(
        role="assistant",
        content=end.get("text") or end.get("error") or "",
        status=end.get("status"),
        source=end.get("source"),
        cron_job_id=job_id if isinstance(job_id, str) else None,
        cron_job_name=label if isinstance(job_id, str) and isinstance(label, str) else None,
    )


def history_from_events(events: list[EventRecord]) -> list[HistoryEntry]:
    """The transcript entries that a list of events stands for, in order."""
    out: list[HistoryEntry] = []
    for event in events:
        p = event.payload
        if event.type == "stream_start":
            out.append(input_entry(p))
        elif event.type == "user_message":
            out.append(
                HistoryEntry(role="user", content=p.get("content", ""), source=p.get("source"))
            )
        elif event.type == "tool_call":
            body = p.get("result") if p.get("ok") else {"error": p.get("error")}
            out.append(
                HistoryEntry(
                    role="tool",
                    content=msgspec.json.encode(body).decode(),
                    tool=p.get("tool"),
                    arguments=p.get("arguments"),
                    call_id=p.get("call_id"),
                )
            )
        elif event.type == "stream_end":
            out.append(answer_entry(p))
    return out


def tool_result_text(result: ToolResult) -> str:
    """A tool result as the transcript (and the agent) sees it: its data, or its error, as JSON."""
    body = result.data if result.ok else {"error": result.error}
    return msgspec.json.encode(body).decode()
