"""The webhooks feature in a node, through the gateway's app (ASGI transport): deliveries
recorded once and put in their sessions' inboxes, crashes between the two steps, routing
(bindings, default sessions, unrouted), bindings per user and per session; both backends."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import trio
import trio.testing

from tests.support.agents import GatedAgent, SeeingAgent
from tests.support.github import GITHUB_SECRET, check_run_event, deliver
from tests.support.sessions import Recorder
from turnstile.actors.config import Config, Limits
from turnstile.actors.node import open_node
from turnstile.actors.sessions.messages import Submit
from turnstile.actors.webhooks.queries import CLAIM, RECORD, TARGETS
from turnstile.actors.webhooks.service import inbox_payload
from turnstile.actors.webhooks.settings import GitHubConfig, RepoConfig, WebhooksConfig
from turnstile.runtime.clock import MockWallClock
from turnstile.tools.modules.http import HttpModule

ADA, BOB = "ada-token-0123456789", "bob-token-0123456789"
PR3 = "github:acme/app#3"
#: acme/app is ada's, and bob may bind to it too (a repository with no settings lets nobody).
ACME_APP = {"acme/app": RepoConfig(user="ada", users=["bob"])}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def node_with(store_url, agent=None, clock=None, config=None, **webhooks):
    github = webhooks.pop("github", GitHubConfig(secret=GITHUB_SECRET, repos=ACME_APP))
    config = config or Config(store=store_url)
    config = Config(
        **{
            **{f: getattr(config, f) for f in config.__struct_fields__},
            "webhooks": WebhooksConfig(github=github, **webhooks),
        }
    )
    agent = agent or SeeingAgent()
    async with open_node(
        config, tokens={ADA: "ada", BOB: "bob"}, agent=agent, clock=clock, serve=False
    ) as node:
        transport = httpx.ASGITransport(app=node.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as http:
            yield node, http, node.features["webhooks"].ingress


async def session(node, http, token, name, *sources) -> Recorder:
    """Create ``name`` for ``token``'s user, bind it to ``sources``, attach a recorder."""
    assert (await http.post("/sessions", json={"id": name}, headers=auth(token))).status_code == 201
    for source in sources:
        bound = await http.post(
            f"/sessions/{name}/bindings", json={"source": source}, headers=auth(token)
        )
        assert bound.status_code == 201, bound.text
    recorder = Recorder()
    user = {ADA: "ada", BOB: "bob"}[token]
    await node.directory.attach(user, name, recorder)
    return recorder


async def webhook_inputs(node, key: str) -> list:
    return [item for item in await node.store.list_inputs(key) if item.source == "webhook"]


async def test_a_redelivery_storm_of_100_identical_deliveries_makes_one_turn(store_url):
    async with node_with(store_url) as (node, http, ingress):
        seen = await session(node, http, ADA, "pr3", PR3)
        answers: list[httpx.Response] = []
        body = check_run_event(conclusion="failure")

        async def one() -> None:
            answers.append(await deliver(http, "check_run", body, delivery="storm-1"))

        async with trio.open_nursery() as nursery:
            for _ in range(100):
                nursery.start_soon(one)
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200] * 99 + [202]
        assert [a.json() for a in answers if a.status_code == 202] == [
            {"accepted": True, "sessions": 1, "unrouted": False}
        ]
        assert all(a.json() == {"duplicate": True} for a in answers if a.status_code == 200)
        await seen.until(b'"stream_end"')
        (item,) = await webhook_inputs(node, "ada/pr3")
        assert item.payload["delivery_id"] == "github:storm-1"
        (target,) = await node.store.run(TARGETS, delivery_id="github:storm-1")
        assert (target.state, target.input_id, target.attempts) == ("delivered", item.id, 1)
        # the same delivery again later: still nothing
        again = await deliver(http, "check_run", body, delivery="storm-1")
        assert again.json() == {"duplicate": True}
        assert len(await webhook_inputs(node, "ada/pr3")) == 1
        deliveries = "turnstile_webhook_deliveries_total"
        assert node.metrics.value(deliveries, hook="github", outcome="duplicate") == 100


def _recorded(delivery_id: str, key: str, owner: str = "ada") -> dict:
    return {
        "delivery": {
            "id": delivery_id,
            "hook": "github",
            "event": "check_run",
            "source_ref": "Acme/App#check_run:1",
            "source_keys": [PR3],
            "owner": None,
            "content": "[CI FAILED] recorded before a crash",
            "payload": {"type": "check_run_failed", "name": "tests"},
        },
        "lookup": [PR3],
        "owners": None,
        "fallback": [],
    }


async def test_a_delivery_recorded_before_a_crash_is_delivered_at_start_up(store_url):
    async with node_with(store_url) as (node, http, ingress):
        await session(node, http, ADA, "pr3", PR3)
        # the crash: recorded, never submitted
        targets = await node.store.run(
            RECORD,
            **_recorded("github:crashed", "ada/pr3"),
            now=node.store.db_time(node.context.clock.now()),
        )
        assert targets == [("ada/pr3", "ada")]
        assert await webhook_inputs(node, "ada/pr3") == []
    async with node_with(store_url) as (node, http, ingress):
        await ingress.wait_sweeps(1)
        (item,) = await webhook_inputs(node, "ada/pr3")
        assert item.payload["content"] == "[CI FAILED] recorded before a crash"
        (target,) = await node.store.run(TARGETS, delivery_id="github:crashed")
        assert (target.state, target.input_id) == ("delivered", item.id)


async def test_a_crash_after_the_inbox_row_and_before_delivered_does_not_run_it_twice(store_url):
    async with node_with(store_url) as (node, http, ingress):
        seen = await session(node, http, ADA, "pr3", PR3)
        now = node.context.clock.now()
        await node.store.run(
            RECORD, **_recorded("github:half", "ada/pr3"), now=node.store.db_time(now)
        )
        # the first attempt claims the target and stores the inbox row, then "dies": its
        # lease is let run out at once, and the target is never marked delivered
        claimed = await node.store.run(
            CLAIM,
            delivery_id="github:half",
            session_key="ada/pr3",
            now=node.store.db_time(now),
            until=node.store.db_time(now - timedelta(seconds=1)),
        )
        first = await node.context.ask_session(
            "ada/pr3",
            Submit(
                source="webhook",
                content=claimed.content,
                payload=inbox_payload(claimed),
                idempotency_key="github:half",
            ),
        )
        await seen.until(b'"stream_end"')
    async with node_with(store_url) as (node, http, ingress):
        await ingress.wait_sweeps(1)
        (item,) = await webhook_inputs(node, "ada/pr3")
        assert item.id == first.input_id
        (target,) = await node.store.run(TARGETS, delivery_id="github:half")
        assert (target.state, target.input_id, target.attempts) == ("delivered", item.id, 2)


async def test_unbound_events_go_to_the_repos_default_session_or_are_listed_unrouted(store_url):
    repos = {
        "Acme/App": RepoConfig(user="ada", session="ci"),
        "acme/other": RepoConfig(user="bob"),
    }
    github = GitHubConfig(secret=GITHUB_SECRET, repos=repos)
    async with node_with(store_url, github=github, admins=["ada"]) as (node, http, ingress):
        ci = await session(node, http, ADA, "ci")
        answer = await deliver(http, "check_run", check_run_event(pr=7))
        assert answer.json() == {"accepted": True, "sessions": 1, "unrouted": False}
        await ci.until(b'"stream_end"')
        (item,) = await webhook_inputs(node, "ada/ci")
        assert item.payload["pr_number"] == 7
        # bob's repository has no default session: recorded, and listed to bob only
        other = await deliver(http, "check_run", check_run_event(repo="other", run_id=5))
        assert other.json() == {"accepted": True, "sessions": 0, "unrouted": True}
        # a repository nobody configured: listed to admins only
        await deliver(http, "check_run", check_run_event(owner="someone", repo="else", run_id=6))
        bobs = (await http.get("/webhooks/unrouted", headers=auth(BOB))).json()["unrouted"]
        assert [u["source_ref"] for u in bobs] == ["Acme/other#check_run:5"]
        assert bobs[0]["source_keys"] == ["github:acme/other#3", "github:acme/other:branch:main"]
        assert bobs[0]["payload"]["conclusion"] == "failure" and "owner" not in bobs[0]
        assert (await http.get("/webhooks/unrouted", headers=auth(ADA))).json() == {"unrouted": []}
        everyone = await http.get("/webhooks/unrouted?all_users=true", headers=auth(ADA))
        assert {(u["source_ref"], u["owner"]) for u in everyone.json()["unrouted"]} == {
            ("Acme/other#check_run:5", "bob"),
            ("someone/else#check_run:6", None),
        }
        refused = await http.get("/webhooks/unrouted?all_users=true", headers=auth(BOB))
        assert refused.status_code == 403 and refused.json()["error"]["field"] == "all_users"


async def test_deliveries_are_listed_to_whom_they_concern_and_admins_see_the_counts(store_url):
    repos = {**ACME_APP, "acme/other": RepoConfig(user="bob")}
    github = GitHubConfig(secret=GITHUB_SECRET, repos=repos)
    async with node_with(store_url, github=github, admins=["ada"]) as (node, http, ingress):
        await session(node, http, ADA, "pr3", PR3)
        await session(node, http, BOB, "mine", "github:acme/app:branch:main")
        body = check_run_event(pr=3)
        assert (await deliver(http, "check_run", body, delivery="d1")).json()["sessions"] == 2
        assert (await deliver(http, "check_run", body, delivery="d1")).json() == {"duplicate": True}
        other = check_run_event(repo="other", run_id=5)
        assert (await deliver(http, "check_run", other, delivery="d2")).json()["unrouted"]
        forged = await deliver(http, "check_run", body, secret="not-the-secret")
        assert forged.status_code == 401

        async def listed(token: str, query: str = "") -> dict:
            answer = await http.get(f"/webhooks/deliveries{query}", headers=auth(token))
            assert answer.status_code == 200, answer.text
            return answer.json()

        def outline(deliveries: list[dict]) -> list[tuple]:
            return [
                (
                    d["delivery_id"],
                    d["state"],
                    [(t["session"], t["state"], t["attempts"]) for t in d["targets"]],
                )
                for d in deliveries
            ]

        # each sees their own sessions of a delivery, never another user's
        ada = await listed(ADA)
        assert outline(ada["deliveries"]) == [("github:d1", "routed", [("pr3", "delivered", 1)])]
        assert ada["deliveries"][0]["source_ref"] == "Acme/App#check_run:4242"
        assert "counts" not in ada and "owner" not in ada["deliveries"][0]
        bob = await listed(BOB)
        assert outline(bob["deliveries"]) == [
            ("github:d2", "unrouted", []),
            ("github:d1", "routed", [("mine", "delivered", 1)]),
        ]
        # an admin sees everyone's, with the owners, and what no delivery row records
        everyone = await listed(ADA, "?all_users=true")
        assert [(d["delivery_id"], d["owner"]) for d in everyone["deliveries"]] == [
            ("github:d2", "bob"),
            ("github:d1", "ada"),
        ]
        assert [(t["session"], t["owner"]) for t in everyone["deliveries"][1]["targets"]] == [
            ("pr3", "ada"),
            ("mine", "bob"),
        ]
        assert everyone["counts"] == {
            "github": {
                "accepted": 1,
                "duplicate": 1,
                "unrouted": 1,
                "refused": {"bad_signature": 1},
            }
        }
        assert (await listed(ADA, "?all_users=true&limit=1"))["deliveries"][0][
            "delivery_id"
        ] == "github:d2"
        refused = await http.get("/webhooks/deliveries?all_users=true", headers=auth(BOB))
        assert refused.status_code == 403 and refused.json()["error"]["field"] == "all_users"
        bad = await http.get("/webhooks/deliveries?limit=0", headers=auth(ADA))
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "limit"


async def test_every_session_bound_to_the_event_gets_it_once(store_url):
    async with node_with(store_url) as (node, http, ingress):
        by_pr = await session(node, http, ADA, "pr3", PR3)
        # bound to both the PR and its branch: still one turn
        both = await session(node, http, ADA, "mine", PR3, "github:acme/app:branch:fix-3")
        answer = await deliver(http, "check_run", check_run_event(pr=3, branch="fix-3"))
        assert answer.json()["sessions"] == 2
        await by_pr.until(b'"stream_end"')
        await both.until(b'"stream_end"')
        assert len(await webhook_inputs(node, "ada/pr3")) == 1
        assert len(await webhook_inputs(node, "ada/mine")) == 1


async def test_bindings_are_the_callers_own_and_end_with_the_session(store_url):
    repos = {**ACME_APP, "acme/private": RepoConfig(users=["ada"])}
    github = GitHubConfig(secret=GITHUB_SECRET, repos=repos)
    async with node_with(store_url, github=github) as (node, http, ingress):
        watching = await session(node, http, ADA, "pr3", PR3)
        await node.directory.detach("ada", "pr3", watching)
        # bob cannot see or bind ada's session: it is not there for him
        for call in (
            http.get("/sessions/pr3/bindings", headers=auth(BOB)),
            http.post("/sessions/pr3/bindings", json={"source": PR3}, headers=auth(BOB)),
        ):
            assert (await call).status_code == 404
        listed = (await http.get("/sessions/pr3/bindings", headers=auth(ADA))).json()
        assert [(b["source"], b["via"]) for b in listed["bindings"]] == [(PR3, "http")]
        again = await http.post(
            "/sessions/pr3/bindings", json={"source": "github:Acme/App#3"}, headers=auth(ADA)
        )
        assert again.status_code == 200 and again.json()["created"] is False
        for source, field in (("acme#3", "$.source"), ("gitlab:acme/app#3", "source")):
            bad = await http.post(
                "/sessions/pr3/bindings", json={"source": source}, headers=auth(ADA)
            )
            assert (bad.status_code, bad.json()["error"]["field"]) == (400, field)
        unknown = await http.post("/sessions/pr3/bindings", json={"src": PR3}, headers=auth(ADA))
        assert unknown.status_code == 400
        # a repository that lets only its configured users bind
        await session(node, http, BOB, "b")
        private = "github:acme/private#1"
        refused = await http.post(
            "/sessions/b/bindings", json={"source": private}, headers=auth(BOB)
        )
        assert (refused.status_code, refused.json()["error"]["field"]) == (403, "source")
        allowed = await http.post(
            "/sessions/pr3/bindings", json={"source": private}, headers=auth(ADA)
        )
        assert allowed.status_code == 201
        # deleting the session ends its bindings: the next event is unrouted, and a session
        # made later under the same name starts with none
        assert (await http.delete("/sessions/pr3", headers=auth(ADA))).status_code == 204
        answer = await deliver(http, "check_run", check_run_event())
        assert answer.json()["unrouted"] is True
        await session(node, http, ADA, "pr3")
        listed = (await http.get("/sessions/pr3/bindings", headers=auth(ADA))).json()
        assert listed == {"bindings": []}
        gone = await http.delete(
            "/sessions/pr3/bindings", params={"source": PR3}, headers=auth(ADA)
        )
        assert gone.status_code == 404
        await http.post("/sessions/pr3/bindings", json={"source": PR3}, headers=auth(ADA))
        unbound = await http.delete(
            "/sessions/pr3/bindings", params={"source": PR3}, headers=auth(ADA)
        )
        assert unbound.status_code == 204


async def test_the_tools_bind_the_calling_session_and_say_so_in_it(store_url):
    async with node_with(store_url) as (node, http, ingress):
        seen = await session(node, http, ADA, "s")
        bound = await node.directory.call_tool("ada", "s", "bind_source", {"source": PR3})
        assert bound.ok and bound.data["created"] is True and bound.data["via"] == "tool"
        await seen.until(b'"source_binding"')
        assert b'"action":"bound","source":"github:acme/app#3","via":"tool"' in seen.frames[-1]
        listed = await node.directory.call_tool("ada", "s", "list_sources", {})
        assert [b["source"] for b in listed.data["bindings"]] == [PR3]
        removed = await node.directory.call_tool("ada", "s", "unbind_source", {"source": PR3})
        assert removed.data == {"source": PR3, "removed": True}
        await seen.until(b'"unbound"')
        again = await node.directory.call_tool("ada", "s", "unbind_source", {"source": PR3})
        assert again.data["removed"] is False


async def test_opening_a_pull_request_with_http_post_binds_the_session(store_url, monkeypatch):
    """The http tool, its policy and the registry run for real; only the network exchange is
    GitHub's answer to ``POST /repos/acme/app/pulls``."""
    sent = []

    async def github_answers(self, method, url, headers, timeout, content, consume):  # noqa: ASYNC109
        sent.append((method, url))
        if url.endswith("/pulls"):
            body = {"number": 12, "head": {"ref": "fix-login"}, "state": "open"}
            return {"status_code": 201, "headers": {}, "body": body, "encoding": "json"}
        return {"status_code": 200, "headers": {}, "body": {}, "encoding": "json"}

    monkeypatch.setattr(HttpModule, "_exchange", github_answers)
    config = Config(store=store_url, policies={"http.post": "AUTO"})
    async with node_with(store_url, config=config) as (node, http, ingress):
        await session(node, http, ADA, "s")
        opened = await node.directory.call_tool(
            "ada",
            "s",
            "http.post",
            {"url": "https://api.github.com/repos/Acme/App/pulls", "json": {"head": "fix-login"}},
        )
        assert opened.ok, opened.error
        # a POST elsewhere (a comment) binds nothing
        await node.directory.call_tool(
            "ada", "s", "http.post", {"url": "https://api.github.com/repos/Acme/App/issues/1"}
        )
        assert len(sent) == 2
        listed = (await http.get("/sessions/s/bindings", headers=auth(ADA))).json()
        assert [(b["source"], b["via"]) for b in listed["bindings"]] == [
            ("github:acme/app#12", "pull_request"),
            ("github:acme/app:branch:fix-login", "pull_request"),
        ]


@pytest.mark.guard(3600)
async def test_a_full_queue_keeps_the_delivery_until_the_sweep_gets_it_in(autojump_clock):
    """``[limits] max_queued_inputs = 1``: the session is busy with one turn and one queued;
    the webhook is recorded, waits, and is delivered by a later sweep (MockClock)."""
    agent = GatedAgent()
    config = Config(store="sqlite:///:memory:", limits=Limits(max_queued_inputs=1))
    clock = MockWallClock(datetime(2026, 11, 21, 12, 0, tzinfo=UTC))
    async with node_with(None, agent=agent, clock=clock, config=config) as (node, http, ingress):
        seen = await session(node, http, ADA, "pr3", PR3)
        await node.directory.submit("ada", "pr3", "wait:a")
        await seen.until(b'"stream_start"')  # running: no longer queued
        await node.directory.submit("ada", "pr3", "queued")
        answer = await deliver(http, "check_run", check_run_event())
        assert answer.json() == {"accepted": True, "sessions": 1, "unrouted": False}
        (target,) = await node.store.run(TARGETS, delivery_id=_only_delivery(answer, node))
        assert target.state == "accepted" and target.error.startswith("limit_exceeded")
        agent.gate("wait:a").set()
        await seen.until(b'"stream_end"', 2)
        sweeps = ingress.sweeps
        await trio.sleep(61)  # the next sweep (redeliver_seconds = 60)
        await ingress.wait_sweeps(sweeps + 1)
        await seen.until(b'"stream_end"', 3)
        (item,) = await webhook_inputs(node, "ada/pr3")
        (target,) = await node.store.run(TARGETS, delivery_id=item.payload["delivery_id"])
        assert (target.state, target.input_id) == ("delivered", item.id)


def _only_delivery(answer: httpx.Response, node) -> str:
    return "github:" + answer.request.headers["x-github-delivery"]


@pytest.mark.guard(10 * 86400)
async def test_deliveries_are_remembered_for_the_retention_window_then_pruned(autojump_clock):
    config = Config(store="sqlite:///:memory:")
    clock = MockWallClock(datetime(2026, 11, 21, 12, 0, tzinfo=UTC))
    async with node_with(None, clock=clock, config=config, retention_days=2) as (
        node,
        http,
        ingress,
    ):
        seen = await session(node, http, ADA, "pr3", PR3)
        body = check_run_event()
        assert (await deliver(http, "check_run", body, delivery="d")).status_code == 202
        await seen.until(b'"stream_end"')
        (first,) = await webhook_inputs(node, "ada/pr3")
        await trio.sleep(86400)  # a day later: still remembered
        assert (await deliver(http, "check_run", body, delivery="d")).json() == {"duplicate": True}
        await trio.sleep(86400 + 120)  # past two days, and a sweep has pruned it
        assert await node.store.run(TARGETS, delivery_id="github:d") == []
        # recorded again, but the session's inbox knows the delivery by its key: no new turn
        again = await deliver(http, "check_run", body, delivery="d")
        assert again.status_code == 202
        await ingress.wait_sweeps(ingress.sweeps + 1)  # a sweep may have been delivering it
        (target,) = await node.store.run(TARGETS, delivery_id="github:d")
        assert (target.state, target.input_id) == ("delivered", first.id), target
        # the same one input (its state moved on: the turn closed after stream_end was seen)
        assert [i.id for i in await webhook_inputs(node, "ada/pr3")] == [first.id]
