"""Two real ``turnstile serve`` processes on one PostgreSQL (loopback, a throw-away schema).

Node A runs a long turn. Node B restarts: its start-up recovery and its periodic sweeps leave
A's running input alone, since A is alive. Then A is killed with SIGKILL: once A's lease has
expired, B declares A dead and closes A's cut-off turn as ``interrupted``; the session then
works on B. And two processes given one node id (here: on one SQLite file, where every node is
``local``) cannot both serve: the later start takes the id over and the earlier stops.

Leases are short (``[node] lease_seconds = 2``) to keep the test bounded; nothing sleeps to
synchronise: the test waits for frames, for metrics and for rows, each with a deadline.

Every deadline here is a hang guard, not a promise: generous (``SETTLE``, ``GUARD``), so that
the tests pass on a 2-core box at load 8 where processes take seconds to start and a store
write can wait a second for a core. How fast a failover, a takeover or a burst of timers is,
is measured by ``turnstile bench cluster`` (``bench/scenarios/cluster.py``) against its target;
the tests print their figures.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import msgspec
import pytest
import trio

from tests.runtime.store._support import pg_run
from tests.support.node import Node, connect, new_session
from tests.support.polling import eventually
from tests.support.serve import launch
from turnstile.actors.scheduling.spec import JobSpec, Schedule
from turnstile.runtime.membership import owner_of
from turnstile.runtime.store import NodeRef, open_store

TOKEN = "cluster-e2e-token-0123456789"
LEASE = 2.0
INTERVAL = LEASE / 3
#: hang guards (seconds, real clock): for one thing to happen, and for a whole test
SETTLE = 60
GUARD = 600


def config_file(
    tmp_path: Path, name: str, store: str, node_id: str | None, extra: str = ""
) -> Path:
    path = tmp_path / f"{name}.toml"
    node = f'id = "{node_id}"\n' if node_id else ""
    path.write_text(f'store = "{store}"\nport = 0\n{extra}[node]\n{node}lease_seconds = {LEASE}\n')
    return path


class Serving:
    """A ``turnstile serve`` subprocess, its address and what it wrote to stderr."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config, self.log = config, log
        self.process: trio.Process | None = None
        self.node: Node | None = None

    async def start(self) -> Serving:
        try:
            self.process, url = await launch(
                ["--config", str(self.config), "--dev-token", TOKEN, "--agent", "scripted"],
                stderr=self.log.open("ab"),
            )
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {self.log.read_text()[-2000:]}") from None
        self.node = Node(url=url, ws_url=url.replace("http://", "ws://") + "/ws")
        return self

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.process.send_signal(sig)
        with trio.fail_after(SETTLE):
            return await self.process.wait()

    async def dump_tasks_after(self, seconds: float) -> None:
        """Unless cancelled first: after ``seconds``, have the node write what each of its
        tasks waits on to its log (``SIGUSR1``), so that a hang names its await."""
        await trio.sleep(seconds)
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGUSR1)

    async def metric(self, name: str) -> float:
        async with self.node.http(TOKEN) as http:
            for line in (await http.get("/metrics")).text.splitlines():
                if line.startswith(f"{name} "):
                    return float(line.split()[1])
        raise AssertionError(f"no metric {name}")

    def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


async def turnstile_nodes(config: Path) -> dict[str, dict]:
    """``turnstile nodes --json`` as a real process: the nodes by id."""
    done = await trio.run_process(
        [sys.executable, "-m", "turnstile.actors.cli", "nodes", "--config", str(config), "--json"],
        capture_stdout=True,
        capture_stderr=True,
    )
    return {node["id"]: node for node in json.loads(done.stdout)["nodes"]}


async def input_row(store_url: str, session_key: str, input_id: int):
    async with open_store(store_url) as store:
        (item,) = [i for i in await store.list_inputs(session_key) if i.id == input_id]
        return item


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
@pytest.mark.guard(GUARD)
async def test_a_restart_spares_a_live_nodes_turn_and_a_killed_nodes_turn_is_recovered(
    tmp_path, pg_store
):
    a = Serving(config_file(tmp_path, "a", pg_store, "a"), tmp_path / "a.log")
    b = Serving(config_file(tmp_path, "b", pg_store, "b"), tmp_path / "b.log")
    try:
        await a.start()
        await b.start()
        await new_session(a.node, "long", token=TOKEN)
        async with connect(a.node, TOKEN) as on_a:
            await on_a.send(type="attach", session_id="long")
            await on_a.expect("session_sync")
            await on_a.send(type="send", session_id="long", content="/sleep 600", client_msg_id="1")
            input_id = (await on_a.expect("ack", client_msg_id="1"))["input_id"]
            await on_a.expect("stream_start", input_id=input_id)  # A runs the long turn

            nodes = await turnstile_nodes(a.config)
            assert {k: (n["epoch"], n["state"], n["alive"]) for k, n in nodes.items()} == {
                "a": (1, "running", True),
                "b": (1, "running", True),
            }
            assert nodes["a"]["address"] == a.node.url  # advertised once it served

            # B restarts: start-up recovery, then sweeps, while A's turn runs.
            assert await b.stop() == 0
            await b.start()

            async def swept_thrice() -> bool:
                return await b.metric("turnstile_node_sweeps_total") >= 3

            await eventually(swept_thrice, SETTLE)
            assert await b.metric("turnstile_nodes_live") == 2
            assert await b.metric("turnstile_node_epoch") == 2
            item = await input_row(pg_store, "dev/long", input_id)
            assert (item.state, item.claimed_by) == ("running", NodeRef("a", 1))
            assert not [f for f in on_a.frames if f["type"] == "stream_end"]

            # A dies without a word. Its lease runs out, and B takes its turn over.
            killed = trio.current_time()
            await a.stop(signal.SIGKILL)

        async def recovered() -> bool:
            return (await input_row(pg_store, "dev/long", input_id)).state != "running"

        await eventually(recovered, SETTLE)
        recovered_after = trio.current_time() - killed
        # How soon (LEASE + 2 * INTERVAL: A's last beat at most an interval before the kill,
        # B's next sweep at most an interval after the lease ran out) is bench cluster's
        # "takeover of a killed node's running input", measured over 20 kills; on a loaded box
        # a sweep can wait seconds for a core, so here it is a figure, not an assertion.
        print(f"A's input recovered {recovered_after:.2f} s after SIGKILL (lease {LEASE} s)")
        assert (await input_row(pg_store, "dev/long", input_id)).state == "interrupted"
        assert await b.metric("turnstile_inputs_taken_over_total") == 1
        nodes = await turnstile_nodes(b.config)
        assert {k: (n["epoch"], n["state"], n["alive"]) for k, n in nodes.items()} == {
            "a": (1, "stopped", False),  # declared dead by B
            "b": (2, "running", True),
        }

        async with connect(b.node, TOKEN) as on_b:  # the session goes on, on B
            await on_b.send(type="attach", session_id="long", after_seq=0)
            end = await on_b.expect("stream_end", input_id=input_id)
            assert (end["status"], end["error"]) == (
                "interrupted",
                "the node stopped during this turn",
            )
            await on_b.send(type="send", session_id="long", content="after", client_msg_id="2")
            await on_b.expect("stream_end", text="You said: after")
        starts = [e for e in on_b.events("long") if e["type"] == "stream_start"]
        assert [s["input_id"] for s in starts].count(input_id) == 1  # it did not run twice
        assert await b.stop() == 0
    finally:
        a.close()
        b.close()


@pytest.mark.slow
async def test_a_second_process_with_the_same_node_id_takes_over_and_the_first_stops(tmp_path):
    store = f"sqlite:///{tmp_path}/one.db"
    first = Serving(config_file(tmp_path, "first", store, None), tmp_path / "first.log")
    second = Serving(config_file(tmp_path, "second", store, None), tmp_path / "second.log")
    try:
        await first.start()
        await second.start()  # the same file, so the same node: "local"
        with trio.fail_after(SETTLE):  # its next heartbeat (an interval) finds it taken over
            status = await first.process.wait()
        assert status == 3
        assert "stopped serving: node 'local' epoch 1 was taken over by epoch 2" in (
            first.log.read_text()
        )
        async with second.node.http(TOKEN) as http:  # the later one serves on
            assert (await http.get("/healthz")).status_code == 200
        with pytest.raises(httpx.ConnectError):
            async with first.node.http(TOKEN) as http:
                await http.get("/healthz")
        assert await second.stop() == 0
    finally:
        first.close()
        second.close()


@asynccontextmanager
async def two_nodes_with_session(tmp_path: Path, pg_store: str):
    """Nodes A and B serving one store, and a session ``s`` created through A; both are
    killed on the way out if they still run."""
    a = Serving(config_file(tmp_path, "a", pg_store, "a"), tmp_path / "a.log")
    b = Serving(config_file(tmp_path, "b", pg_store, "b"), tmp_path / "b.log")
    try:
        await a.start()
        await b.start()
        await new_session(a.node, "s", token=TOKEN)
        yield a, b
    finally:
        a.close()
        b.close()


async def every_second(pg_store: str, session_key: str) -> list[str]:
    """Two jobs firing every second into ``session_key``, inserted behind the nodes' backs
    (the API keeps recurrences to a minute or more; the nodes find them by their next fire
    time): the first owned by node a, the second by node b (rendezvous hashing)."""
    ids = [f"tick-{n}" for n in range(100)]
    chosen = [next(i for i in ids if owner_of(i, ["a", "b"]) == node) for node in ("a", "b")]
    spec = msgspec.json.encode(
        JobSpec(schedule=Schedule(type="interval", interval_seconds=1.0), deliver={"prompt": "t"})
    ).decode()
    await pg_run(
        pg_store,
        "INSERT INTO jobs (id, session_id, kind, spec, state, next_fire_at, created_at,"
        " updated_at) SELECT id, $2, 'cron', $3::jsonb, 'active', now() + interval '1 second',"
        " now(), now() FROM unnest($1::text[]) AS id",
        chosen,
        session_key,
        spec,
    )
    return chosen


async def start_turn(client, content: str, msg_id: str) -> int:
    """Send ``content`` to ``s`` as attached ``client``; its input id once its turn started."""
    await client.send(type="send", session_id="s", content=content, client_msg_id=msg_id)
    input_id = (await client.expect("ack", client_msg_id=msg_id))["input_id"]
    await client.expect("stream_start", input_id=input_id)
    return input_id


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
@pytest.mark.guard(GUARD)
async def test_a_node_paused_past_its_lease_writes_nothing_when_it_resumes(tmp_path, pg_store):
    """Fencing with a real SIGSTOP: A holds session ``s`` and runs a turn of it; A is stopped
    for twice its lease. A message sent through B meanwhile is stored at once; once A's lease
    ran out, B takes the session over (A's turn closed as interrupted) and runs it. When A
    resumes, its heartbeat finds it declared dead and it exits 3; the turn it was running
    closes as it stops, and the store refuses every write of it: the session's log is exactly
    what it was, gapless, with A's input closed once. Two jobs firing every second into
    session ``c`` (one A's, one B's) run through it all: B fires A's while A is stopped, and
    no occurrence fires twice or runs two turns."""
    async with two_nodes_with_session(tmp_path, pg_store) as (a, b):
        await new_session(b.node, "c", token=TOKEN)
        ticks = await every_second(pg_store, "dev/c")
        async with connect(a.node, TOKEN) as on_a:
            await on_a.send(type="attach", session_id="s")
            await on_a.expect("session_sync")
            input_id = await start_turn(on_a, "/sleep 600", "1")
        paused = trio.current_time()
        paused_at = datetime.now(UTC)
        a.process.send_signal(signal.SIGSTOP)
        try:
            async with b.node.http(TOKEN) as http:  # stored by B, for whoever holds s
                sent = await http.post("/sessions/s/messages", json={"content": "on b"})
                assert sent.status_code == 202, sent.text
                on_b_id = sent.json()["input_id"]

            async def ran_on_b() -> bool:
                return (await input_row(pg_store, "dev/s", on_b_id)).state == "done"

            await eventually(ran_on_b, SETTLE)
            moved_after = trio.current_time() - paused
            async with connect(b.node, TOKEN) as on_b:
                await on_b.send(type="attach", session_id="s", after_seq=0)
                await on_b.expect("stream_end", text="You said: on b")
            with trio.fail_after(2 * LEASE):  # A stays stopped for twice its lease
                await trio.sleep_until(paused + 2 * LEASE)
        finally:
            resumed_at = datetime.now(UTC)
            a.process.send_signal(signal.SIGCONT)
        async with open_store(pg_store) as store:
            before = [(e.seq, e.type, e.payload) for e in await store.read_events("dev/s")]
        with trio.fail_after(SETTLE):  # its next heartbeat finds it declared dead
            status = await a.process.wait()
        assert status == 3  # declared dead while stopped: it stops serving
        assert "the session is at" in a.log.read_text()  # its closing write was refused
        async with open_store(pg_store) as store:
            after = [(e.seq, e.type, e.payload) for e in await store.read_events("dev/s")]
            inputs = {i.id: i.state for i in await store.list_inputs("dev/s")}
        assert after == before  # not one write of A's reached the store once it resumed
        assert [seq for seq, _, _ in after] == list(range(1, len(after) + 1))  # no gap
        ends = [p for _, t, p in after if t == "stream_end" and p["input_id"] == input_id]
        assert [e["status"] for e in ends] == ["interrupted"]  # closed once, by B
        assert inputs[input_id] == "interrupted"
        assert sorted(inputs.values()) == ["done", "interrupted"]
        assert await b.metric("turnstile_leases_acquired_total") >= 1  # s is held by B now
        print(f"session s moved to B {moved_after:.2f} s after SIGSTOP (lease {LEASE} s)")
        await pg_run(pg_store, "UPDATE jobs SET state = 'cancelled' WHERE id = ANY($1)", ticks)
        runs = await pg_run(
            pg_store,
            "SELECT job_id, scheduled_for, created_at, input_id FROM job_runs"
            " WHERE job_id = ANY($1)",
            ticks,
        )
        for job_id in ticks:  # no occurrence fired twice
            times = [r["scheduled_for"] for r in runs if r["job_id"] == job_id]
            assert len(times) == len(set(times)) >= 2, (job_id, times)
        a_job = ticks[0]  # A's: fired by B while A was stopped
        assert any(
            paused_at < r["created_at"] < resumed_at for r in runs if r["job_id"] == a_job
        ), sorted(r["created_at"] for r in runs if r["job_id"] == a_job)

        async def c_settled() -> bool:
            async with open_store(pg_store) as store:
                return not await store.list_inputs("dev/c", ["running", "queued"])

        await eventually(c_settled, SETTLE)
        async with open_store(pg_store) as store:
            c_log = await store.read_events("dev/c", 0, 10_000)
        starts = [e.payload["input_id"] for e in c_log if e.type == "stream_start"]
        assert len(starts) == len(set(starts))  # no cron turn ran twice
        fired = {r["input_id"] for r in runs if r["input_id"] is not None}
        assert fired <= set(starts)  # every fire's turn ran
        assert [e.seq for e in c_log] == list(range(1, len(c_log) + 1))
        assert await b.stop() == 0


def three_nodes(tmp_path: Path, pg_store: str) -> list[Serving]:
    """Nodes a, b and c on one store (not started), room for many sessions per user."""
    extra = "[limits]\nmax_sessions_per_user = 500\n"
    return [
        Serving(config_file(tmp_path, name, pg_store, name, extra), tmp_path / f"{name}.log")
        for name in ("a", "b", "c")
    ]


FENCED_SESSIONS = 30


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
@pytest.mark.guard(GUARD)
async def test_the_paused_owner_of_a_third_of_the_sessions_writes_nothing_on_resume(
    tmp_path, pg_store
):
    """Three nodes, 30 sessions each running a turn on the node they were sent through; node
    A (a third of them) is stopped with SIGSTOP for twice its lease. B and C take A's
    sessions over and run the messages sent to them meanwhile; when A resumes it exits 3, and
    not one write of it reaches the store: A's sessions' logs are exactly what they were
    before it resumed, gapless, each of A's turns closed once, as interrupted."""
    nodes = three_nodes(tmp_path, pg_store)
    a, b, c = nodes
    names = [f"f{i}" for i in range(FENCED_SESSIONS)]
    on_a = names[0::3]  # sent through A: A holds them
    try:
        for node in nodes:
            await node.start()
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(node.node.http(TOKEN)) for node in nodes]
            for i, name in enumerate(names):
                http = clients[i % 3]
                assert (await http.post("/sessions", json={"id": name})).status_code == 201
                sent = await http.post(f"/sessions/{name}/messages", json={"content": "/sleep 600"})
                assert sent.status_code == 202, sent.text

        async def all_running() -> bool:
            logs = await session_logs(pg_store, names)
            return all(any(i.state == "running" for i in inputs) for _, inputs in logs.values())

        await eventually(all_running, SETTLE)
        paused = trio.current_time()
        a.process.send_signal(signal.SIGSTOP)
        try:
            async with b.node.http(TOKEN) as http:
                for name in on_a:  # stored by B, for whoever holds them
                    sent = await http.post(f"/sessions/{name}/messages", json={"content": "hi"})
                    assert sent.status_code == 202, sent.text

            async def moved() -> bool:
                logs = await session_logs(pg_store, on_a)
                return all(
                    [i.state for i in inputs] == ["interrupted", "done"]
                    for _, inputs in logs.values()
                )

            await eventually(moved, SETTLE)
            moved_after = trio.current_time() - paused
            with trio.fail_after(2 * LEASE):  # A stays stopped for twice its lease
                await trio.sleep_until(paused + 2 * LEASE)
            before = await session_logs(pg_store, on_a)
        finally:
            a.process.send_signal(signal.SIGCONT)
        with trio.fail_after(SETTLE):
            assert await a.process.wait() == 3  # declared dead while stopped
        after = await session_logs(pg_store, on_a)
        for name in on_a:
            events, inputs = after[name]
            assert [(e.seq, e.type) for e in events] == [
                (e.seq, e.type) for e in before[name][0]
            ], name  # not one write of A's reached the store once it resumed
            assert [e.seq for e in events] == list(range(1, len(events) + 1))  # no gap
            ends = [e.payload["status"] for e in events if e.type == "stream_end"]
            assert ends == ["interrupted", "completed"], name  # A's turn closed once, by B or C
            assert [i.state for i in inputs] == ["interrupted", "done"]
        print(f"{len(on_a)} sessions moved off the paused node in {moved_after:.2f} s")
    finally:
        for node in nodes:
            node.close()


SESSIONS = 200


async def post_all(
    nodes: list[Serving], sessions: list[str], round_: int, acked: dict, failed: list
) -> None:
    """One message to every session, each through node ``i % len(nodes)``, all at once;
    ``acked`` keeps the input id of every message the node acknowledged (202), ``failed``
    what else happened."""

    async def one(i: int, name: str, http: httpx.AsyncClient) -> None:
        key = f"{name}-r{round_}"
        try:
            sent = await http.post(
                f"/sessions/{name}/messages",
                # round 1's turns take a while: C dies with some of them running
                json={"content": "/sleep 0.5" if round_ == 1 else f"round {round_}"},
                headers={"Idempotency-Key": key},
            )
        except httpx.TransportError as exc:
            failed.append((key, repr(exc)))
            return  # the node died under the request: not acknowledged, so not owed
        if sent.status_code == 202:
            acked[key] = (name, sent.json()["input_id"])
        else:
            failed.append((key, f"{sent.status_code} {sent.text[:200]}"))

    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(node.node.http(TOKEN)) for node in nodes]
        for client in clients:
            client.timeout = httpx.Timeout(SETTLE)
        async with trio.open_nursery() as nursery:
            for i, name in enumerate(sessions):
                nursery.start_soon(one, i, name, clients[i % len(clients)])


async def session_logs(store_url: str, sessions: list[str]) -> dict[str, tuple[list, list]]:
    async with open_store(store_url) as store:
        return {
            name: (
                await store.read_events(f"dev/{name}", 0, 10_000),
                await store.list_inputs(f"dev/{name}"),
            )
            for name in sessions
        }


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
@pytest.mark.guard(GUARD)
async def test_three_nodes_under_load_lose_nothing_when_one_is_killed(tmp_path, pg_store):
    """Three nodes, 200 sessions, clients spread over all of them; node C is killed with
    SIGKILL while messages are in flight. Every acknowledged message is stored and closed
    (done, or interrupted where C was running it), no session ever ran two turns at once, no
    session's log has a gap, and a message sent to each session after the kill runs (within a
    lease plus five seconds: bench cluster's failover measures that; the test prints it)."""
    nodes = three_nodes(tmp_path, pg_store)
    sessions = [f"s{i}" for i in range(SESSIONS)]
    try:
        for node in nodes:
            await node.start()
        async with nodes[0].node.http(TOKEN) as http:
            for name in sessions:
                assert (await http.post("/sessions", json={"id": name})).status_code == 201
        acked: dict[str, tuple[str, int]] = {}
        failed: list[tuple[str, str]] = []
        await post_all(nodes, sessions, 0, acked, failed)  # sessions spread over the three nodes
        async with trio.open_nursery() as nursery:  # round 1, and C dies in the middle of it
            nursery.start_soon(post_all, nodes, sessions, 1, acked, failed)
            await trio.sleep(0.5)
            await nodes[2].stop(signal.SIGKILL)
        killed = trio.current_time()
        await post_all(nodes[:2], sessions, 2, acked, failed)
        # only what went through C while it died may have failed
        assert [f for f in failed if not f[0].endswith("-r1")] == []
        assert sum(1 for key in acked if key.endswith("-r2")) == SESSIONS

        async def all_closed() -> bool:
            logs = await session_logs(pg_store, sessions)
            return all(
                all(i.state in ("done", "interrupted") for i in inputs)
                for _, inputs in logs.values()
            )

        await eventually(all_closed, 3 * SETTLE)
        settled = trio.current_time() - killed
        logs = await session_logs(pg_store, sessions)
        stored = {(name, i.id) for name, (_, inputs) in logs.items() for i in inputs}
        assert set(acked.values()) <= stored  # 0 acknowledged inputs lost
        for name, (events, _) in logs.items():
            assert [e.seq for e in events] == list(range(1, len(events) + 1)), name  # no gap
            running = None
            for e in events:  # turns never overlap: a start only after the previous end
                if e.type == "stream_start":
                    assert running is None, (name, running, e.payload["input_id"])
                    running = e.payload["input_id"]
                elif e.type == "stream_end":
                    assert running == e.payload["input_id"], (name, running, e.payload)
                    running = None
            starts = [e.payload["input_id"] for e in events if e.type == "stream_start"]
            assert len(starts) == len(set(starts)), name  # no input ran twice
        interrupted = sum(
            1 for _, inputs in logs.values() for i in inputs if i.state == "interrupted"
        )
        print(
            f"{len(acked)} acknowledged; all closed {settled:.1f} s after SIGKILL"
            f" (lease {LEASE} s); {interrupted} interrupted by the kill"
        )
        # the target, LEASE + 5 (4.0-4.4 s here on a quiet box), is bench cluster's failover
    finally:
        for node in nodes:
            node.close()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
@pytest.mark.guard(GUARD)
async def test_sigterm_drains_a_node_its_turn_finishes_and_what_waits_moves(tmp_path, pg_store):
    """A graceful stop with several nodes: on SIGTERM node A takes no new work, lets the turn
    it runs finish (completed, not interrupted), claims nothing more, answers its readiness
    probe 503 `draining`, and exits 0; a message sent through A while it drains runs on B once
    A has stopped."""
    async with two_nodes_with_session(tmp_path, pg_store) as (a, b):
        async with connect(a.node, TOKEN) as on_a:
            await on_a.send(type="attach", session_id="s")
            await on_a.expect("session_sync")
            long_id = await start_turn(on_a, "/sleep 2", "1")
            a.process.send_signal(signal.SIGTERM)
            await on_a.send(type="send", session_id="s", content="after", client_msg_id="2")
            after_id = (await on_a.expect("ack", client_msg_id="2"))["input_id"]
            async with a.node.http(TOKEN) as http_a, b.node.http(TOKEN) as http_b:
                # a load balancer's readiness probe sends new clients to B meanwhile (the
                # signal is handled in its own time: ask until it says so, within the turn)
                with trio.move_on_after(SETTLE):  # a hang guard; the turn ends it sooner
                    while True:
                        if (not_ready := await http_a.get("/readyz")).status_code != 200:
                            break
                        await trio.sleep(0.02)
                assert not_ready.status_code == 503
                assert not_ready.json()["status"] == "draining"
                assert (await http_b.get("/readyz")).json() == {"status": "ready"}
            end = await on_a.expect("stream_end", input_id=long_id)
            assert (end["status"], end["text"]) == ("completed", "Slept 2s.")
        with trio.fail_after(SETTLE):
            assert await a.process.wait() == 0
        log = a.log.read_text()
        assert "turnstile draining" in log and "turnstile drained" in log
        async with connect(b.node, TOKEN) as on_b:  # what waited runs on B
            await on_b.send(type="attach", session_id="s", after_seq=0)
            done = await on_b.expect("stream_end", input_id=after_id)
            assert done["text"] == "You said: after"
        item = await input_row(pg_store, "dev/s", long_id)
        assert item.state == "done"
        assert await b.stop() == 0


TIMERS = 10_000


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
@pytest.mark.guard(GUARD)
async def test_three_nodes_fire_ten_thousand_timers_once_each(tmp_path, pg_store):
    """Three nodes, 10,000 one-shot timers over 100 sessions, 20% of them due in the same
    second and 10% cancelled (through the HTTP API of any node) before they are due: each
    other one fires exactly once, none cancelled fires, and every node takes a share. The p99
    lateness (due to the fire's commit) is printed."""
    nodes = three_nodes(tmp_path, pg_store)
    try:
        for node in nodes:
            await node.start()
        async with nodes[0].node.http(TOKEN) as http:
            for i in range(100):
                assert (await http.post("/sessions", json={"id": f"t{i}"})).status_code == 201
        # Each timer's time in the window, from its start: 20% all in one second, the rest
        # spread over 15 s. They are inserted an hour out, the 10% cancelled (1,000 requests,
        # which take many seconds on a loaded box), and only then moved into the window, in
        # one statement: so every cancel is in before its timer is due, whatever the load,
        # and a cancel that did not take would leave its timer active, moved and fired.
        offset = {
            f"timer-{n}": timedelta(seconds=10, milliseconds=(n * 7) % 1000)
            if n % 5 == 0
            else timedelta(seconds=5 + (n % 1500) / 100)
            for n in range(TIMERS)
        }
        cancelled = [job_id for n, job_id in enumerate(offset) if n % 10 == 3]  # 10%

        def specs(due: dict[str, datetime]) -> list[str]:
            return [
                msgspec.json.encode(
                    JobSpec(schedule=Schedule(type="once", run_at=at), deliver={"prompt": "t"})
                ).decode()
                for at in due.values()
            ]

        later = datetime.now(UTC) + timedelta(hours=1)
        due = {job_id: later + at for job_id, at in offset.items()}
        await pg_run(  # one statement: the nodes find them by their next fire time
            pg_store,
            "INSERT INTO jobs (id, session_id, kind, spec, state, next_fire_at, created_at,"
            " updated_at) SELECT id, 'dev/t' || (n % 100), 'once', spec::jsonb, 'active', at,"
            " now(), now() FROM unnest($1::text[], $2::int[], $3::text[], $4::timestamptz[])"
            " AS x(id, n, spec, at)",
            list(due),
            list(range(TIMERS)),
            specs(due),
            list(due.values()),
        )
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(node.node.http(TOKEN)) for node in nodes]
            for client in clients:
                client.timeout = httpx.Timeout(2 * SETTLE)  # a hang guard: 30 at once, loaded
            limit = trio.CapacityLimiter(30)

            async def cancel(i: int, job_id: str) -> None:
                async with limit:
                    answer = await clients[i % 3].post(f"/jobs/{job_id}/cancel")
                assert answer.status_code == 200, answer.text

            cancelling = trio.current_time()
            async with trio.open_nursery() as nursery:
                for i, job_id in enumerate(cancelled):
                    nursery.start_soon(cancel, i, job_id)
            cancelled_in = trio.current_time() - cancelling
        start = datetime.now(UTC)
        due = {job_id: start + at for job_id, at in offset.items()}
        await pg_run(  # into the window: every timer still active (none of the cancelled)
            pg_store,
            "UPDATE jobs SET next_fire_at = x.at, spec = x.spec::jsonb, updated_at = now()"
            " FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS x(id, spec, at)"
            " WHERE jobs.id = x.id AND jobs.state = 'active'",
            list(due),
            specs(due),
            list(due.values()),
        )
        expected = len(due) - len(cancelled)

        async def runs() -> list:
            return await pg_run(
                pg_store,
                "SELECT job_id, count(*), max(extract(epoch FROM created_at - scheduled_for))"
                " FROM job_runs GROUP BY job_id",
            )

        async def all_fired() -> bool:
            return len(await runs()) >= expected

        await eventually(all_fired, 5 * SETTLE)
        rows = await runs()
        counts = {job_id: count for job_id, count, _ in rows}
        assert set(counts) == set(due) - set(cancelled)  # no cancelled one fired
        assert set(counts.values()) == {1}  # each exactly once
        late = sorted(float(lateness) for _, _, lateness in rows)
        p99 = late[int(len(late) * 0.99)]
        # a node counts a fire just after its commit, so the counts can be short of the fires
        # (job_runs, checked above, is the truth): the last counts can be read before they are
        # made, and a scheduler that crashes between a commit and its count leaves that fire
        # committed and uncounted (8,997 of 9,000 at load 8, before a re-read that timed out
        # stopped crashing it: tests/actors/scheduling/test_scheduler.py)
        fires = [await node.metric("turnstile_scheduler_fires_total") for node in nodes]
        print(
            f"{expected} timers fired once each; p99 lateness {p99 * 1000:.0f} ms; {fires};"
            f" 1,000 cancels took {cancelled_in:.1f} s"
        )
        assert all(count > 0 for count in fires)  # every node takes a share
        assert sum(fires) <= expected  # none counted twice (lateness: docs/cluster.md's figure)
    finally:
        for node in nodes:
            node.close()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
@pytest.mark.guard(GUARD)
async def test_a_rolling_restart_of_three_nodes_under_load_loses_and_doubles_nothing(
    tmp_path, pg_store
):
    """Three nodes; clients keep sending (each message with its idempotency key, sent again
    through another node if the first did not answer); each node in turn gets SIGTERM
    (drains), exits 0 and starts again. Every message is acknowledged, stored once and run
    once, and completes."""
    nodes = three_nodes(tmp_path, pg_store)
    up = [True, True, True]
    sessions = [f"r{i}" for i in range(30)]
    acked: dict[str, int] = {}
    clients_of: list[httpx.AsyncClient] = []  # by node
    opened: list[httpx.AsyncClient] = []  # to close
    try:
        for node in nodes:
            await node.start()
        async with nodes[0].node.http(TOKEN) as http:
            for name in sessions:
                assert (await http.post("/sessions", json={"id": name})).status_code == 201

        # one client per node incarnation, as a real client keeps its connections: a new
        # httpx client costs ~50 ms of CPU (its TLS context), and one per message made this
        # process, not the nodes, the bottleneck on a loaded box (requests sat unsent 30 s)

        def connect(i: int) -> None:
            client = nodes[i].node.http(TOKEN)
            client.timeout = httpx.Timeout(SETTLE / 2)
            opened.append(client)
            if i < len(clients_of):
                clients_of[i] = client
            else:
                clients_of.append(client)

        for i in range(3):
            connect(i)

        async def post_watched(i: int, name: str, key: str) -> httpx.Response | None:
            async with trio.open_nursery() as watch:
                # a request still unanswered after 10 s: the node's log shows where its
                # tasks wait
                watch.start_soon(nodes[i].dump_tasks_after, 10)
                try:
                    return await clients_of[i].post(
                        f"/sessions/{name}/messages",
                        json={"content": "/sleep 0.2"},
                        headers={"Idempotency-Key": key},
                    )
                except httpx.TransportError:
                    return None
                finally:
                    watch.cancel_scope.cancel()

        in_flight = dict.fromkeys(sessions, 0)

        async def send(key: str, name: str, first: int) -> None:
            # through the next node that is up, until acknowledged: a client retries for as
            # long as a restart takes (a second on a quiet box, many on a loaded one), so the
            # bound is a hang guard on time, not a count of attempts
            attempts = 0
            in_flight[name] += 1
            try:
                with trio.move_on_after(2 * SETTLE):
                    while True:
                        i = (first + attempts) % 3
                        attempts += 1
                        if not up[i]:
                            await trio.sleep(0.05)
                            continue
                        sent = await post_watched(i, name, key)
                        if sent is None:  # not answered: refused, reset or timed out
                            await trio.sleep(0.05)
                            continue
                        if sent.status_code == 202:
                            acked[key] = sent.json()["input_id"]
                            return
                        await trio.sleep(0.05)
            finally:
                in_flight[name] -= 1
            raise AssertionError(f"{key} was never acknowledged ({attempts} attempts)")

        async def clients(stop: trio.Event) -> None:
            # every 0.5 s a message to each session that has fewer than two unacknowledged
            # (a client waits for its answers instead of piling up requests without bound)
            n = 0
            async with trio.open_nursery() as nursery:
                while not stop.is_set():
                    for j, name in enumerate(sessions):
                        if in_flight[name] < 2:
                            nursery.start_soon(send, f"{name}-{n}", name, n + j)
                    n += 1
                    with trio.move_on_after(0.5):
                        await stop.wait()

        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(clients, stop)
            for i, node in enumerate(nodes):
                await trio.sleep(1)
                up[i] = False
                assert await node.stop(signal.SIGTERM) == 0  # drained, then stopped
                await node.start()
                connect(i)  # its new address
                up[i] = True
            await trio.sleep(1)
            stop.set()
        logs = await session_logs(pg_store, sessions)

        async def all_done() -> bool:
            nonlocal logs
            logs = await session_logs(pg_store, sessions)
            return all(i.state == "done" for _, inputs in logs.values() for i in inputs)

        await eventually(all_done, 5 * SETTLE)
        stored = {i.id for _, inputs in logs.values() for i in inputs}
        assert set(acked.values()) == stored  # each acknowledged once, nothing else stored
        for name, (events, _) in logs.items():
            starts = [e.payload["input_id"] for e in events if e.type == "stream_start"]
            assert len(starts) == len(set(starts)), name  # nothing ran twice
        print(f"{len(acked)} messages through a rolling restart of three nodes, each run once")
    finally:
        for client in opened:
            await client.aclose()
        for node in nodes:
            node.close()


#: 2,000 in the suite (listeners cut every 0.3 s: dozens of cuts, about 10 s on a quiet box);
#: ``TURNSTILE_CROSS_NODE_MESSAGES=10000`` runs the issue's figure (about 50 s quiet)
CROSS_NODE = int(os.environ.get("TURNSTILE_CROSS_NODE_MESSAGES", "2000"))


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.pg_nodes
@pytest.mark.guard(2 * GUARD)
async def test_messages_between_nodes_survive_listener_connections_being_cut(tmp_path, pg_store):
    """Node A holds 20 sessions; 10,000 messages (the issue's figure) are sent to them through
    node B (stored by B, announced to A over LISTEN/NOTIFY) while the listening connections of
    both nodes are terminated again and again: a lost announcement only delays, so every
    message runs, once. The suite sends 2,000 (``CROSS_NODE``);
    ``TURNSTILE_CROSS_NODE_MESSAGES=10000`` sends the issue's 10,000, about 50 s on a quiet
    2-core box and minutes on a loaded one.

    Only these two nodes' listeners are cut: the PostgreSQL server is shared with other tests
    (and test runs), whose listeners must stay. A node names its listener's connection
    ``turnstile <node id> listen <channel>`` (``application_name``), and the ids here are
    this test's own."""
    tag = secrets.token_hex(4)
    ids = [f"cut-a-{tag}", f"cut-b-{tag}"]
    a = Serving(config_file(tmp_path, "a", pg_store, ids[0]), tmp_path / "a.log")
    b = Serving(config_file(tmp_path, "b", pg_store, ids[1]), tmp_path / "b.log")
    sessions = [f"x{i}" for i in range(20)]
    acked: list[int] = []
    try:
        await a.start()
        await b.start()
        async with a.node.http(TOKEN) as http:
            for name in sessions:
                assert (await http.post("/sessions", json={"id": name})).status_code == 201
                sent = await http.post(f"/sessions/{name}/messages", json={"content": "hold"})
                assert sent.status_code == 202  # A activates the session: A holds it
        cuts = 0

        async def cut(stop: trio.Event) -> None:
            nonlocal cuts
            while not stop.is_set():
                rows = await pg_run(
                    pg_store,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = ANY($1::text[])",
                    [f"turnstile {node} listen turnstile_sessions" for node in ids],
                )
                cuts += len(rows)
                with trio.move_on_after(0.3):
                    await stop.wait()

        async def send_all() -> None:
            limit = trio.CapacityLimiter(20)
            async with b.node.http(TOKEN) as http:
                http.timeout = httpx.Timeout(2 * SETTLE)  # a hang guard: 20 at once, loaded box

                async def one(n: int) -> None:
                    async with limit:
                        sent = await http.post(
                            f"/sessions/{sessions[n % 20]}/messages",
                            json={"content": f"m{n}"},
                            headers={"Idempotency-Key": f"m{n}"},
                        )
                    assert sent.status_code == 202, sent.text
                    acked.append(sent.json()["input_id"])

                async with trio.open_nursery() as nursery:
                    for n in range(CROSS_NODE):
                        nursery.start_soon(one, n)

        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut, stop)
            await send_all()
            stop.set()

        async def all_done() -> bool:
            logs = await session_logs(pg_store, sessions)
            return all(i.state == "done" for _, inputs in logs.values() for i in inputs)

        await eventually(all_done, 5 * SETTLE)
        logs = await session_logs(pg_store, sessions)
        for name, (events, _) in logs.items():
            starts = [e.payload["input_id"] for e in events if e.type == "stream_start"]
            assert len(starts) == len(set(starts)), name  # nothing ran twice
        ran = {e.payload["input_id"] for events, _ in logs.values() for e in events}
        assert set(acked) <= ran and len(acked) == CROSS_NODE  # 0 lost
        assert cuts >= 4, cuts
        print(f"{CROSS_NODE} cross-node messages, listeners cut {cuts} times: none lost")
    finally:
        a.close()
        b.close()
