"""What must hold in the store after any crash, once the scenario has finished (issue 23).

:func:`check` answers a list of violations, each one sentence naming what broke, empty when
everything holds:

* every input (acknowledged or not: what a client re-sent is the same row) ends with exactly
  one ``stream_start`` and one ``stream_end``, the start first; a cut turn ends
  ``interrupted`` once and is never started again;
* no input stays ``queued`` or ``running``;
* each session's events are numbered 1, 2, … without a gap, up to its ``last_seq``;
* every acknowledged idempotency key is one row, the one every acknowledgement named;
* each job occurrence has one run, settled (not ``queued``), whose input had one turn, and
  each input one run at most;
* each delivery id is one delivery, and each of its targets one input;
* nothing of a deleted session remains (inputs, events, jobs, kv).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from tests.crash.stores import Snapshot

FINAL = {"done", "failed", "interrupted"}


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


def check(snap: Snapshot, record: Record) -> list[str]:
    """The violations of the module docstring's invariants in ``snap`` (see there)."""
    out: list[str] = []
    inputs = {row["id"]: row for row in snap["inbox"]}

    # -- inputs: final, one turn each ------------------------------------------------------
    turns: dict[int, list[dict]] = defaultdict(list)
    for event in sorted(snap["events"], key=lambda e: (e["session_id"], e["seq"])):
        if event["type"] in ("stream_start", "stream_end"):
            input_id = _input_id(event["payload"])
            if input_id is not None:
                turns[input_id].append(event)
    for input_id, row in sorted(inputs.items()):
        if row["state"] not in FINAL:
            out.append(f"input {input_id} ({row['source']}) stays {row['state']}")
            continue
        if isinstance(row["detail"], dict) and row["detail"].get("folded"):
            continue  # folded into a running turn: it never had a turn of its own
        kinds = [e["type"] for e in turns.get(input_id, [])]
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
    per_delivery = Counter(row.get("delivery_id") for row in snap["webhook_deliveries"])
    for delivery, n in per_delivery.items():
        if n > 1:
            out.append(f"delivery {delivery} stored {n} times")
    for delivery in record.deliveries:
        if delivery not in per_delivery:
            out.append(f"delivery {delivery} was answered 2xx and is not stored")

    # -- deleted sessions -------------------------------------------------------------------
    for session in sorted(record.deleted):
        left = [
            f"{table} ({n})"
            for table, rows in (
                ("sessions", [r for r in snap["sessions"] if r["id"] == session]),
                ("inbox", [r for r in snap["inbox"] if r["session_id"] == session]),
                ("events", [r for r in snap["events"] if r["session_id"] == session]),
                ("jobs", [r for r in snap["jobs"] if r["session_id"] == session]),
                ("kv", [r for r in snap["kv"] if session in str(r.get("key", ""))]),
            )
            if (n := len(rows))
        ]
        if left:
            out.append(f"deleted session {session} left {', '.join(left)}")
    return out


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
