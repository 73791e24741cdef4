"""A node among the nodes sharing its store, in-process: it registers with a new epoch at every
start and shows it in ``/metrics``, and its start-up recovery closes only what dead nodes left
running (multi-process on PostgreSQL: tests/e2e/test_cluster.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import trio

from turnstile.actors.cli import main
from turnstile.actors.config import Config, NodeConfig, load_config
from turnstile.actors.node import open_node, recover
from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import DecodeError
from turnstile.runtime.store import NodeRef, open_store

TOKEN = "cluster-token-0123456789"


async def metrics(node) -> dict[str, float]:
    transport = httpx.ASGITransport(app=node.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
        text = (await http.get("/metrics")).text
    return {
        name: float(value)
        for name, value in (line.split(" ") for line in text.splitlines() if line[0] != "#")
    }


async def test_each_start_is_a_new_epoch_of_the_same_node_and_metrics_show_it(tmp_path):
    config = Config(store=f"sqlite:///{tmp_path}/node.db")
    for epoch in (1, 2):
        async with open_node(config, tokens={TOKEN: "ada"}, serve=False) as node:
            assert node.membership.ref == NodeRef("local", epoch)  # SQLite: one node per file
            seen = await metrics(node)
            assert seen["turnstile_node_epoch"] == epoch
            assert seen["turnstile_nodes_live"] == 1
            assert seen["turnstile_node_heartbeat_failures_total"] == 0
    async with open_store(config.store) as store:
        (row,) = (await store.list_nodes()).nodes
    assert (row.id, row.epoch, row.state, row.alive) == ("local", 2, "stopped", False)


async def shared_store_with_two_cut_off_turns(url: str) -> None:
    """Another node, alive, is running a turn of session ``ada/theirs`` with more queued
    behind it; a node that died an hour ago was running one of ``ada/orphan``, likewise."""
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    async with open_store(url, clock=Clock(lambda: an_hour_ago)) as store:
        dead, _ = await store.register_node("dead", lease_seconds=60)  # expired long ago
    async with open_store(url) as store:
        live, _ = await store.register_node("live", lease_seconds=3600)
        for session_id, claimer in (("ada/theirs", live), ("ada/orphan", dead)):
            await store.create_session(session_id, "ada")
            await store.enqueue_input(session_id, "user", {"content": "the long turn"})
            store.claimer = claimer.ref
            await store.claim_next_input(session_id)
            await store.enqueue_input(session_id, "user", {"content": "waiting"})
        store.claimer = None


async def test_recovery_closes_only_dead_nodes_turns_and_wakes_only_their_sessions(tmp_path):
    url = f"sqlite:///{tmp_path}/shared.db"
    await shared_store_with_two_cut_off_turns(url)
    async with open_store(url) as store:
        me, _ = await store.register_node("me", lease_seconds=60)
        assert await recover(store, node=me.ref) == ["ada/orphan"]
        assert [i.state for i in await store.list_inputs("ada/orphan")] == [
            "interrupted",
            "queued",
        ]
        (end,) = await store.read_events("ada/orphan", after_seq=1)
        assert (end.type, end.payload["status"]) == ("stream_end", "interrupted")
        theirs = await store.list_inputs("ada/theirs")
        assert [(i.state, i.claimed_by) for i in theirs] == [
            ("running", NodeRef("live", 1)),
            ("queued", None),
        ]
        assert await store.read_events("ada/theirs") == []
        nodes = {n.id: (n.state, n.alive) for n in (await store.list_nodes()).nodes}
        assert nodes == {
            "dead": ("stopped", False),  # declared dead by this recovery
            "live": ("running", True),
            "me": ("running", True),
        }


class Recording:
    """An agent that answers at once and says which inputs it ran."""

    name = "recording"

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.first = trio.Event()

    async def run_turn(self, turn) -> str:
        self.ran.append(turn.input.content)
        self.first.set()
        return "ok"

    async def aclose(self) -> None:
        pass


async def test_a_starting_node_runs_what_waited_behind_a_dead_nodes_turn_only(tmp_path):
    url = f"sqlite:///{tmp_path}/shared.db"
    await shared_store_with_two_cut_off_turns(url)
    agent = Recording()
    async with open_node(Config(store=url), tokens={TOKEN: "ada"}, agent=agent, serve=False) as n:
        await agent.first.wait()
        assert agent.ran == ["waiting"]
        (cut, ran) = await n.store.list_inputs("ada/orphan")
        assert cut.state == "interrupted" and ran.claimed_by == n.membership.ref
        theirs = await n.store.list_inputs("ada/theirs")
        assert [i.state for i in theirs] == ["running", "queued"]  # left to the live node


def test_the_node_section_is_checked(tmp_path):
    path = tmp_path / "turnstile.toml"
    path.write_text('[node]\nid = "node-a"\nlease_seconds = 5\naddress = "http://10.0.0.5:8765"\n')
    assert load_config(path).node == NodeConfig(
        id="node-a", lease_seconds=5, address="http://10.0.0.5:8765"
    )
    assert Config().node == NodeConfig(id=None, lease_seconds=15, address=None)
    for bad, field in (
        ('id = "two words"', "$.node.id"),
        ("lease_seconds = 0.5", "$.node.lease_seconds"),
        ("heartbeat = 3", "$.node.heartbeat"),  # unknown keys are errors too
    ):
        path.write_text(f"[node]\n{bad}\n")
        with pytest.raises(DecodeError) as error:
            load_config(path)
        assert error.value.field == field, bad


def test_turnstile_nodes_lists_the_nodes_of_the_configs_store(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/nodes.db"
    config = tmp_path / "turnstile.toml"
    config.write_text(f'store = "{url}"\n')

    async def two_nodes() -> None:
        async with open_store(url) as store:
            await store.register_node("b", lease_seconds=600, address="http://b:1")
            gone, _ = await store.register_node("a", lease_seconds=600)
            await store.stop_node(gone.ref)

    assert main(["nodes", "--config", str(config)]) == 0
    assert capsys.readouterr().out == "no node has registered with this store\n"
    trio.run(two_nodes)
    assert main(["nodes", "--config", str(config)]) == 0
    header, a, b, summary = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "ID", "EPOCH", "STATE", "ALIVE", "STARTED", "LAST", "HEARTBEAT", "LEASE", "EXPIRES",
        "ADDRESS",
    ]  # fmt: skip
    assert a.split()[:4] == ["a", "1", "stopped", "dead"] and a.endswith("-")
    assert b.split()[:4] == ["b", "1", "running", "alive"] and b.endswith("http://b:1")
    assert summary.startswith("1 alive of 2 (as of ") and summary.endswith("by this host's clock)")
    assert main(["nodes", "--store", url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(n["id"], n["state"], n["alive"]) for n in listed["nodes"]] == [
        ("a", "stopped", False),
        ("b", "running", True),
    ]
