"""Signed webhook deliveries are not lost to a store outage (issue 23, 'Store outages and slow
stores'): a delivery that meets an unavailable store is written to the node's spool (``fsync``
before the 202) and ingested once the store is back, once; a node that starts with spooled
files ingests them first; a file the store already has is removed without a second turn.

A node served on loopback on PostgreSQL through a TCP proxy the test controls
(``tests.support.tcpproxy``), sent real signed GitHub ``check_run`` deliveries over HTTP.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from tests.runtime.store._support import pg_schema
from tests.support.agents import SeeingAgent
from tests.support.github import GITHUB_SECRET, check_run_event, deliver, standard
from tests.support.node import TOKENS, Node
from tests.support.polling import eventually
from tests.support.tcpproxy import open_tcp_proxy
from turnstile.actors.config import Config
from turnstile.actors.node import open_node
from turnstile.actors.webhooks.settings import (
    GitHubConfig,
    HookConfig,
    RepoConfig,
    WebhooksConfig,
)

#: acme/app's events go to alice's session "ci" when no session is bound to them
GITHUB = GitHubConfig(
    secret=GITHUB_SECRET, repos={"acme/app": RepoConfig(user="alice", session="ci")}
)
DELIVERY = "5f0c8b2a-0000-4000-8000-00000000abcd"
DEPLOYS = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#: a Standard Webhooks hook whose timestamps are good for a second only
HOOKS = {"deploys": HookConfig(user="alice", secret=DEPLOYS, session="ci", tolerance_seconds=1)}


@pytest.fixture
async def database(pg_dsn):
    """(store URL through the proxy, proxy) on a schema of the test's own."""
    target = urlsplit(pg_dsn)
    async with (
        pg_schema(pg_dsn) as (url, _),
        open_tcp_proxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy,
    ):
        yield proxy.rewrite(url), proxy


@asynccontextmanager
async def node_on(url: str, spool: Path, agent: SeeingAgent):
    config = Config(
        port=0, store=url, webhooks=WebhooksConfig(github=GITHUB, hooks=HOOKS, spool_dir=str(spool))
    )
    async with open_node(config, tokens=TOKENS, agent=agent) as node:
        yield Node(url=node.url, ws_url=node.url.replace("http://", "ws://") + "/ws")


def spooled(spool: Path) -> list[Path]:
    return sorted(spool.glob("*.delivery"))


async def spool_during_a_cut(node: Node, proxy, spool: Path) -> None:
    """With the store cut, a signed check_run delivery is answered 202 spooled, kept on disk."""
    await proxy.cut()
    async with httpx.AsyncClient(base_url=node.url) as github:
        answer = await deliver(
            github, "check_run", check_run_event(conclusion="failure"), delivery=DELIVERY
        )
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"accepted": True, "spooled": True}
    assert len(spooled(spool)) == 1


def webhook_turns(*agents: SeeingAgent) -> list:
    return [i for agent in agents for i in agent.inputs if i.source == "webhook"]


async def test_a_delivery_during_a_cut_is_202_and_its_turn_runs_once_after(database, tmp_path):
    url, proxy = database
    spool, agent = tmp_path / "spool", SeeingAgent()
    async with node_on(url, spool, agent) as node, node.http() as http:
        assert (await http.post("/sessions", json={"id": "ci"})).status_code == 201
        await spool_during_a_cut(node, proxy, spool)
        await trio.sleep(2)  # the outage lasts: the replayer meets it and keeps the file
        assert spooled(spool) and not webhook_turns(agent)
        proxy.heal()

        async def ran() -> bool:
            return len(webhook_turns(agent)) == 1 and not spooled(spool)

        await eventually(ran)
        (turn,) = webhook_turns(agent)
        assert turn.content.startswith('[CI FAILED] Acme/App: check run "tests"')
        # GitHub's "Redeliver" of the same delivery: a duplicate, no second turn
        async with httpx.AsyncClient(base_url=node.url) as github:
            again = await deliver(
                github, "check_run", check_run_event(conclusion="failure"), delivery=DELIVERY
            )
        assert (again.status_code, again.json()) == (200, {"duplicate": True})
        answer = await http.get("/webhooks/deliveries")
        (recorded,) = answer.json()["deliveries"]
        assert recorded["delivery_id"] == f"github:{DELIVERY}"
        await trio.sleep(1)
        assert len(webhook_turns(agent)) == 1
        assert not list((spool / "failed").iterdir())


async def test_a_node_closed_with_a_spooled_delivery_ingests_it_first_at_its_next_start(
    database, tmp_path
):
    url, proxy = database
    spool, first, second = tmp_path / "spool", SeeingAgent(), SeeingAgent()
    with trio.fail_after(120):
        async with node_on(url, spool, first) as node:
            async with node.http() as http:
                assert (await http.post("/sessions", json={"id": "ci"})).status_code == 201
            await spool_during_a_cut(node, proxy, spool)
        # closed during the outage: the file is all that holds the delivery
        assert len(spooled(spool)) == 1 and not webhook_turns(first)
        proxy.heal()
        async with node_on(url, spool, second) as node:
            # the first replay ran before the node opened
            assert not spooled(spool)

            async def ran() -> bool:
                return len(webhook_turns(second)) == 1

            await eventually(ran)
            async with node.http() as http:
                (recorded,) = (await http.get("/webhooks/deliveries")).json()["deliveries"]
            assert recorded["delivery_id"] == f"github:{DELIVERY}"
            assert recorded["state"] == "routed"
    assert not webhook_turns(first)


async def test_a_spooled_delivery_the_store_already_has_is_removed_without_a_second_turn(
    database, tmp_path
):
    url, proxy = database
    spool, agents = tmp_path / "spool", [SeeingAgent(), SeeingAgent(), SeeingAgent()]
    with trio.fail_after(120):
        async with node_on(url, spool, agents[0]) as node:
            async with node.http() as http:
                assert (await http.post("/sessions", json={"id": "ci"})).status_code == 201
            await spool_during_a_cut(node, proxy, spool)
        proxy.heal()
        # meanwhile the sender redelivered it to another node, which ran its turn
        async with node_on(url, tmp_path / "other-spool", agents[1]) as other:
            async with httpx.AsyncClient(base_url=other.url) as github:
                answer = await deliver(
                    github, "check_run", check_run_event(conclusion="failure"), delivery=DELIVERY
                )
            assert answer.status_code == 202, answer.text
            assert answer.json()["sessions"] == 1

            async def ran() -> bool:
                return len(webhook_turns(*agents)) == 1

            await eventually(ran)
        # the spooling node starts again: its file is a duplicate, removed, no second turn
        async with node_on(url, spool, agents[2]):
            assert not spooled(spool)
            assert not list((spool / "failed").iterdir())
            await trio.sleep(2)
    assert len(webhook_turns(*agents)) == 1


async def test_a_standard_webhook_spooled_in_a_cut_runs_after_its_timestamp_went_stale(
    database, tmp_path
):
    url, proxy = database
    spool, agent = tmp_path / "spool", SeeingAgent()
    async with node_on(url, spool, agent) as node, node.http() as http:
        assert (await http.post("/sessions", json={"id": "ci"})).status_code == 201
        await proxy.cut()
        body = {"type": "deploy.finished", "service": "api"}
        async with httpx.AsyncClient(base_url=node.url) as sender:
            answer = await sender.post(
                "/webhooks/deploys",
                **standard(DEPLOYS, body, msg_id="msg_1", timestamp=int(time.time())),
            )
        assert (answer.status_code, answer.json()) == (202, {"accepted": True, "spooled": True})
        await trio.sleep(3)  # past the hook's tolerance: the replay does not check it again
        proxy.heal()

        async def ran() -> bool:
            return len(webhook_turns(agent)) == 1 and not spooled(spool)

        await eventually(ran)
        (turn,) = webhook_turns(agent)
        assert turn.content.startswith("[WEBHOOK deploys] deploy.finished")
        assert not list((spool / "failed").iterdir())
