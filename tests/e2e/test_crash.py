"""kill -9 a real ``turnstile serve`` with queued inputs: after restart, none is lost.

The turn cut off by the crash is closed in history as ``interrupted`` and not run again; every
other acknowledged input runs exactly once, in order.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest
import trio

from tests.support.node import connect, new_session
from tests.support.serve import serving, stop

TOKEN = "crash-test-token-0123456789"


@pytest.mark.slow
async def test_kill_9_loses_no_acknowledged_input(tmp_path):
    db = str(tmp_path / "crash.db")
    async with serving(db, TOKEN) as (process, node):
        await new_session(node, "c", token=TOKEN)
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="c")
            await client.expect("session_sync")
            contents = ["/sleep 600", "one", "two", "three", "four"]
            acked = []
            for i, content in enumerate(contents):
                await client.send(
                    type="send", session_id="c", content=content, client_msg_id=str(i)
                )
                acked.append((await client.expect("ack", client_msg_id=str(i)))["input_id"])
            await client.expect("stream_start", input_id=acked[0])  # the long turn is running
            await stop(process, signal.SIGKILL)
        assert process.returncode == -signal.SIGKILL

    async with serving(db, TOKEN) as (process, node):
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="c", after_seq=0)
            await client.expect("stream_end", input_id=acked[-1])
            events = client.events("c")

    starts = Counter(e["input_id"] for e in events if e["type"] == "stream_start")
    ends = {e["input_id"]: e for e in events if e["type"] == "stream_end"}
    assert starts == Counter(acked)  # each acknowledged input started exactly once
    assert ends[acked[0]]["status"] == "interrupted"
    assert ends[acked[0]]["error"] == "the node stopped during this turn"
    assert [ends[i]["text"] for i in acked[1:]] == [f"You said: {c}" for c in contents[1:]]
    started_order = [e["input_id"] for e in events if e["type"] == "stream_start"]
    assert started_order == acked
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


@pytest.mark.slow
async def test_jobs_due_during_downtime_fire_exactly_once_after_restart(tmp_path):
    db = str(tmp_path / "jobs.db")
    async with serving(db, TOKEN) as (process, node):
        await new_session(node, "j", token=TOKEN)
        async with connect(node, TOKEN) as client:
            for i in range(3):
                await client.send(
                    type="call",
                    id=str(i),
                    session_id="j",
                    tool="schedule_once",
                    arguments={"when": "in 2s", "prompt": f"job {i}", "action_type": "llm_prompt"},
                )
                assert (await client.expect("result", id=str(i)))["ok"] is True
        await stop(process, signal.SIGKILL)  # down before any of them is due

    await trio.sleep(2.5)  # the downtime itself: the jobs fall due while nothing runs
    async with serving(db, TOKEN) as (process, node):
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="j", after_seq=0)
            for i in range(3):
                await client.expect("stream_end", text=f"You said: job {i}")
            async with node.http(TOKEN) as http:
                jobs = (await http.get("/sessions/j/jobs")).json()["jobs"]
                runs = [(await http.get(f"/jobs/{job['id']}")).json()["runs"] for job in jobs]
        events = client.events("j")
    starts = [e for e in events if e["type"] == "stream_start"]
    assert sorted(s["content"] for s in starts) == ["job 0", "job 1", "job 2"]  # once each
    assert [job["state"] for job in jobs] == ["completed"] * 3
    assert all(len(r) == 1 and r[0]["state"] == "turn_completed" for r in runs)
    assert all(r[0]["detail"]["late_seconds"] > 0 for r in runs)  # fired late, and said so


@pytest.mark.slow
async def test_an_occurrence_in_flight_at_kill_9_is_neither_lost_nor_doubled(tmp_path):
    db = str(tmp_path / "inflight.db")
    async with serving(db, TOKEN) as (process, node):
        await new_session(node, "f", token=TOKEN)
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="f")
            await client.send(
                type="call",
                id="1",
                session_id="f",
                tool="schedule_once",
                arguments={"when": "in 1s", "prompt": "/sleep 600", "action_type": "llm_prompt"},
            )
            job_id = (await client.expect("result", id="1"))["data"]["job_id"]
            await client.expect("stream_start", job_id=job_id)  # fired; its turn is running
            await stop(process, signal.SIGKILL)

    async with serving(db, TOKEN) as (process, node):
        async with connect(node, TOKEN) as client:
            await client.send(type="attach", session_id="f", after_seq=0)
            await client.expect("stream_end", status="interrupted")
            await client.send(type="send", session_id="f", content="after", client_msg_id="a")
            await client.expect("stream_end", text="You said: after")
            async with node.http(TOKEN) as http:
                detail = (await http.get(f"/jobs/{job_id}")).json()
        events = client.events("f")
    job_starts = [e for e in events if e["type"] == "stream_start" and e.get("job_id") == job_id]
    assert len(job_starts) == 1  # not lost (it ran), not doubled (it did not run again)
    assert detail["job"]["state"] == "completed" and detail["job"]["run_count"] == 1
    (run,) = detail["runs"]
    assert (run["state"], run["detail"]["status"]) == ("turn_interrupted", "interrupted")


@pytest.mark.slow
async def test_watchers_survive_a_real_restart(tmp_path):
    db = str(tmp_path / "watch.db")
    spec = {"tool": "echo", "params": {"text": "steady"}, "interval": 3600}
    async with serving(db, TOKEN) as (process, node):
        await new_session(node, "w", token=TOKEN)
        async with connect(node, TOKEN) as client, node.http(TOKEN) as http:
            await client.send(type="attach", session_id="w")
            await client.expect("session_sync")
            running = (await http.post("/sessions/w/watchers", json=spec)).json()["watcher_id"]
            await client.expect("watcher_update", watcher_id=running, what="escalated")
            paused = (await http.post("/sessions/w/watchers", json=spec)).json()["watcher_id"]
            assert (await http.post(f"/watchers/{paused}/pause")).status_code == 200
            listed = (await http.get("/sessions/w/watchers")).json()["watchers"]
            before = {w["watcher_id"]: w for w in listed}
        await stop(process)  # a graceful stop flushes the watchers' state

    async with serving(db, TOKEN) as (process, node):
        async with node.http(TOKEN) as http:
            after = {
                w["watcher_id"]: w
                for w in (await http.get("/sessions/w/watchers")).json()["watchers"]
            }
    assert after[running]["status"] == "running" and after[paused]["status"] == "paused"
    assert after[running]["check_count"] == before[running]["check_count"] >= 1  # counts kept
    assert after[running]["notification_count"] == before[running]["notification_count"] == 1
