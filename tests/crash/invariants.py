"""What must hold in the store after any crash, once the scenario has finished (issue 23).

:func:`check` answers a list of violations, each one sentence naming what broke, empty when
everything holds:

* every input (acknowledged or not: what a client re-sent is the same row) ends with exactly
  one ``stream_start`` and one ``stream_end``, the start first; a cut turn ends
  ``interrupted`` once and is never started again. A suppressed heartbeat (``suppressed`` in
  its input's detail) streams nothing by design: it is ``done`` with exactly one
  ``heartbeat_suppressed`` event and no ``stream_start`` or ``stream_end``; a
  ``heartbeat_suppressed`` beside a turn is allowed only for a heartbeat cut between that
  event and its closing (``interrupted``, the event first);
* no input stays ``queued`` or ``running``;
* each session's events are numbered 1, 2, … without a gap, up to its ``last_seq``;
* every acknowledged idempotency key is one row, the one every acknowledgement named;
* each job occurrence has one run, settled (not ``queued``), whose input had one turn, and
  each input one run at most;
* a delivery answered 2xx is stored, and makes one input in each session it targets;
* nothing of a deleted session remains (inputs, events, jobs, kv).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tests.crash.stores import Snapshot

FINAL = {"done", "failed", "interrupted"}
#: what a quiet heartbeat stores instead of its stream (actors/scheduling/turns.py)
SUPPRESSED = "heartbeat_suppressed"


@dataclass
class Record:
    """What the client was told, over every attempt of a run."""

    #: (session key, idempotency key) -> every input id an acknowledgement named
    acked: dict[tuple[str, str], set[int]] = field(default_factory=lambda: defaultdict(set))
    #: session keys whose deletion was acknowledged
    deleted: set[str] = field(default_factory=set)
    #: delivery ids the node answered 2xx
    deliveries: set[str] = field(default_factory=set)


def _input_id(payload: object) -> int | None:
    if isinstance(payload, dict):
        value = payload.get("input_id")
        if isinstance(value, int):
            return value
    return None


def _folded(snap: Snapshot, row: dict, into: int, turns: dict[int, list[dict]]) -> list[str]:
    """An input folded into the turn of ``into``: its ``user_message`` lies inside that
    turn (between its ``stream_start`` and ``stream_end``), or, when that turn closed first,
    it ran as a turn of its own (an input ``was_injected`` with its content)."""
    content = (row["payload"] or {}).get("content") if isinstance(row["payload"], dict) else None
    window = [e["seq"] for e in turns.get(into, []) if e["type"] in ("stream_start", "stream_end")]
    told = [
        e["seq"]
        for e in snap["events"]
        if e["session_id"] == row["session_id"]
        and e["type"] == "user_message"
        and e["payload"].get("injected_into") == into
        and e["payload"].get("content") == content
    ]
    if len(window) == 2 and any(window[0] < seq < window[1] for seq in told):
        return []
    ran = [
        other
        for other in snap["inbox"]
        if other["session_id"] == row["session_id"]
        and isinstance(other["payload"], dict)
        and other["payload"].get("was_injected")
        and other["payload"].get("content") == content
    ]
    if len(ran) == 1:
        return []
    return [
        f"input {row['id']} ({row['source']}) was folded into the turn of input {into} but is"
        f" not inside it (user_message at {told or 'none'}, turn {window}) and ran as"
        f" {len(ran)} turns of its own"
    ]


def check(snap: Snapshot, record: Record) -> list[str]:
    """The violations of the module docstring's invariants in ``snap`` (see there)."""
    out: list[str] = []
    inputs = {row["id"]: row for row in snap["inbox"]}

    # -- inputs: final, one turn each ------------------------------------------------------
    turns: dict[int, list[dict]] = defaultdict(list)
    for event in sorted(snap["events"], key=lambda e: (e["session_id"], e["seq"])):
        if event["type"] in ("stream_start", "stream_end", SUPPRESSED):
            input_id = _input_id(event["payload"])
            if input_id is not None:
                turns[input_id].append(event)
    for input_id, row in sorted(inputs.items()):
        if row["state"] not in FINAL:
            out.append(f"input {input_id} ({row['source']}) stays {row['state']}")
            continue
        detail = row["detail"] if isinstance(row["detail"], dict) else {}
        if "injected_into" in detail:  # folded into a running turn: no turn of its own
            out += _folded(snap, row, detail["injected_into"], turns)
            continue
        every = [e["type"] for e in turns.get(input_id, [])]
        if detail.get("suppressed"):
            # a quiet heartbeat: logged in its run record, not streamed (by design)
            if row["state"] != "done" or every != [SUPPRESSED]:
                out.append(
                    f"suppressed input {input_id} ({row['source']}, {row['state']}) has"
                    f" {every or 'no events'} instead of one {SUPPRESSED}, done"
                )
            continue
        kinds = [k for k in every if k != SUPPRESSED]
        if len(kinds) != len(every) and (
            row["state"] != "interrupted" or every[0] != SUPPRESSED or len(every) - len(kinds) > 1
        ):
            # a heartbeat cut between its heartbeat_suppressed and its closing is closed
            # interrupted, visibly: that is the only way one may hold both
            out.append(
                f"input {input_id} ({row['source']}, {row['state']}) has {every}: a"
                f" {SUPPRESSED} with a turn that was not cut by a crash"
            )
        if kinds != ["stream_start", "stream_end"]:
            out.append(
                f"input {input_id} ({row['source']}, {row['state']}) has {kinds or 'no events'}"
                " instead of one stream_start then one stream_end"
            )
    for input_id in turns.keys() - inputs.keys():
        if turns[input_id][0]["session_id"] in {r["id"] for r in snap["sessions"]}:
            out.append(f"events name input {input_id}, which the inbox does not hold")

    # -- sequence numbers -------------------------------------------------------------------
    seqs: dict[str, list[int]] = defaultdict(list)
    for event in snap["events"]:
        seqs[event["session_id"]].append(event["seq"])
    for session in snap["sessions"]:
        got = sorted(seqs.get(session["id"], []))
        if got != list(range(1, len(got) + 1)) or len(got) != session["last_seq"]:
            out.append(
                f"session {session['id']}: seqs {_ranges(got)} with last_seq"
                f" {session['last_seq']} (expected 1..{session['last_seq']} without a gap)"
            )

    # -- idempotency keys -------------------------------------------------------------------
    keyed: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row in inputs.values():
        if row.get("idempotency_key"):
            keyed[(row["session_id"], row["idempotency_key"])].append(row["id"])
    for (session, key), ids in sorted(record.acked.items()):
        if session in record.deleted:
            continue
        stored = keyed.get((session, key), [])
        if len(stored) != 1 or set(stored) != ids:
            out.append(
                f"key {key!r} of {session}: acknowledged as input(s) {sorted(ids)},"
                f" stored as {sorted(stored) or 'nothing'}"
            )

    # -- job occurrences --------------------------------------------------------------------
    occurrences = Counter((run["job_id"], str(run["scheduled_for"])) for run in snap["job_runs"])
    for (job_id, when), n in occurrences.items():
        if n > 1:
            out.append(f"job {job_id}: {n} runs for the occurrence at {when}")
    per_input = Counter(run["input_id"] for run in snap["job_runs"] if run["input_id"])
    for input_id, n in per_input.items():
        if n > 1:
            out.append(f"input {input_id}: {n} job runs name it")
    for run in snap["job_runs"]:
        if run["state"] == "queued":
            out.append(f"job {run['job_id']}: run {run['id']} stays queued (never settled)")
    by_job = Counter(run["job_id"] for run in snap["job_runs"])
    for job in snap["jobs"]:
        if job["run_count"] > by_job.get(job["id"], 0):
            out.append(
                f"job {job['id']} counts {job['run_count']} runs and has"
                f" {by_job.get(job['id'], 0)} run records"
            )

    # -- webhook deliveries -----------------------------------------------------------------
    stored = {row["id"] for row in snap["webhook_deliveries"]}  # the delivery id is the key
    for delivery in sorted(record.deliveries - stored):
        out.append(f"delivery {delivery} was answered 2xx and is not stored")
    per_target = Counter(
        (row["session_id"], row["payload"]["delivery_id"])
        for row in inputs.values()
        if isinstance(row.get("payload"), dict) and row["payload"].get("delivery_id")
    )
    for (session, delivery), n in sorted(per_target.items()):
        if n > 1:
            out.append(f"delivery {delivery} made {n} inputs in {session} (one turn each)")
    for target in snap["webhook_targets"]:
        if target["state"] == "delivered" and target["input_id"] not in inputs:
            if target["session_key"] not in record.deleted:
                out.append(
                    f"delivery {target['delivery_id']} to {target['session_key']} is delivered"
                    f" as input {target['input_id']}, which the inbox does not hold"
                )

    # -- deleted sessions -------------------------------------------------------------------
    for session in sorted(record.deleted):
        left = [
            f"{table} ({n})"
            for table, rows in (
                ("sessions", [r for r in snap["sessions"] if r["id"] == session]),
                ("inbox", [r for r in snap["inbox"] if r["session_id"] == session]),
                ("events", [r for r in snap["events"] if r["session_id"] == session]),
                ("jobs", [r for r in snap["jobs"] if r["session_id"] == session]),
                ("kv", [r for r in snap["kv"] if _names(r, session)]),
                (
                    "background_tasks",
                    [r for r in snap["background_tasks"] if r["session_key"] == session],
                ),
                ("approvals", [r for r in snap["approvals"] if r["session_id"] == session]),
                (
                    "webhook_bindings",
                    [r for r in snap["webhook_bindings"] if session in r.values()],
                ),
            )
            if (n := len(rows))
        ]
        if left:
            out.append(f"deleted session {session} left {', '.join(left)}")
    return out


def _names(row: dict, session: str) -> bool:
    """Whether a kv row belongs to ``session``: its namespace or key names it
    (``notify:<session>``, ``recall:<session>``, …) or its value is that session's (a
    watcher's row: ``{"session_id": …}``)."""
    for column in ("namespace", "key"):
        value = str(row.get(column, ""))
        if value == session or value.endswith(f":{session}") or f":{session}:" in value:
            return True
        if value.startswith((f"{session}:", f"{session}/", f"{session}\x1f")):  # (watchers)
            return True
    value = row.get("value")
    if isinstance(value, str):  # (a JSON column is decoded by stores.py; kv's is not listed)
        try:
            value = json.loads(value)
        except ValueError:
            return False
    return isinstance(value, dict) and value.get("session_id") == session  # (watchers)


def _ranges(values: list[int]) -> str:
    """``[1, 2, 3, 5]`` as ``1-3,5``: short enough for a report line."""
    if not values:
        return "none"
    parts: list[str] = []
    start = prev = values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)
