"""What other people send (issue 23), through the gateway's app on both backends.

A repository's CI events go only to sessions of users it lets bind (its ``user``, and its
``users`` written out), checked when binding and again when routing; a source bound by one
user's session is refused to every other user, however many bind at once. A failure is one
turn however often its delivery is resent under new ``X-GitHub-Delivery`` ids; a re-run is a
new attempt and runs one.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import trio

from tests.actors.webhooks.test_ingress_node import (
    ADA,
    BOB,
    PR3,
    auth,
    node_with,
    session,
    webhook_inputs,
)
from tests.support.github import GITHUB_SECRET, check_run_event, deliver, workflow_run_event
from turnstile.actors.webhooks.bindings import BIND
from turnstile.actors.webhooks.queries import DELIVERIES
from turnstile.actors.webhooks.schema import WEBHOOKS
from turnstile.actors.webhooks.settings import GitHubConfig, RepoConfig
from turnstile.runtime.store import MigrationSet, open_store, ops

_PREVIOUS_RECORD = ops.count(
    "test.previous_record",
    "INSERT INTO webhook_deliveries (id, hook, event, source_ref, source_keys, owner, state,"
    " content, payload, received_at) VALUES (:id, 'github', 'check_run',"
    " 'Acme/App#check_run:1', :keys, NULL, 'unrouted', '[CI FAILED] an old one', '{}', :now)",
)


def github(**repos: RepoConfig) -> GitHubConfig:
    """``[webhooks.github]`` with ``repos`` (``acme_app`` for ``acme/app``)."""
    return GitHubConfig(
        secret=GITHUB_SECRET,
        repos={name.replace("_", "/", 1): repo for name, repo in repos.items()},
    )


async def bind(http: httpx.AsyncClient, token: str, name: str, source: str) -> httpx.Response:
    return await http.post(
        f"/sessions/{name}/bindings", json={"source": source}, headers=auth(token)
    )


def refused(answer: httpx.Response) -> tuple[int, str, str]:
    error = answer.json()["error"]
    return answer.status_code, error["code"], error["field"]


async def test_bob_cannot_bind_anns_repository_and_her_default_session_gets_the_failure(
    store_url,
):
    """The default ``users = []`` lets the repository's ``user`` alone; a repository with no
    settings lets nobody."""
    config = github(acme_app=RepoConfig(user="ada", session="ci"))
    async with node_with(store_url, github=config) as (node, http, ingress):
        ci = await session(node, http, ADA, "ci")
        await session(node, http, BOB, "steal")
        answer = await bind(http, BOB, "steal", "github:Acme/App#7")
        assert refused(answer) == (403, "forbidden", "source")
        assert answer.json()["error"]["message"] == (
            "acme/app does not let this user bind to it (its configured user and users only)"
        )
        # nor by the tool, nor by opening a pull request (the same check)
        tool = await node.directory.call_tool("bob", "steal", "bind_source", {"source": PR3})
        assert not tool.ok and tool.error["code"] == "forbidden"
        assert (await http.get("/sessions/steal/bindings", headers=auth(BOB))).json() == {
            "bindings": []
        }
        # the repository's own user may; a repository without settings lets nobody
        assert (await bind(http, ADA, "ci", "github:acme/app#7")).status_code == 201
        nobodys = await bind(http, ADA, "ci", "github:someone/else#1")
        assert refused(nobodys) == (403, "forbidden", "source")
        # ann's failing check runs in her session, and nothing reaches bob's
        answer = await deliver(http, "check_run", check_run_event(pr=7))
        assert answer.json() == {"accepted": True, "sessions": 1, "unrouted": False}
        await ci.until(b'"stream_end"')
        assert len(await webhook_inputs(node, "ada/ci")) == 1
        assert await webhook_inputs(node, "bob/steal") == []


async def test_a_wider_users_list_lets_the_listed_user_bind(store_url):
    config = github(
        acme_app=RepoConfig(user="ada", users=["bob"]),
        acme_open=RepoConfig(users=["*"]),
        acme_mine=RepoConfig(user="ada", users=["carl"]),
    )
    async with node_with(store_url, github=config) as (node, http, ingress):
        mine = await session(node, http, BOB, "mine")
        assert (await bind(http, BOB, "mine", PR3)).status_code == 201
        assert (await bind(http, BOB, "mine", "github:acme/open:branch:main")).status_code == 201
        assert refused(await bind(http, BOB, "mine", "github:acme/mine#1"))[0] == 403
        answer = await deliver(http, "check_run", check_run_event(pr=3))
        assert answer.json()["sessions"] == 1
        await mine.until(b'"stream_end"')
        assert len(await webhook_inputs(node, "bob/mine")) == 1


async def test_a_source_bound_by_another_users_session_is_refused(store_url):
    async with node_with(store_url, github=github(acme_app=RepoConfig("ada", users=["bob"]))) as (
        node,
        http,
        ingress,
    ):
        await session(node, http, ADA, "pr3", PR3)
        await session(node, http, BOB, "b")
        taken = await bind(http, BOB, "b", "github:ACME/app#3")
        assert refused(taken) == (409, "conflict", "source")
        assert taken.json()["error"]["message"] == (
            "github:acme/app#3 is bound to another user's session"
        )
        tool = await node.directory.call_tool("bob", "b", "bind_source", {"source": PR3})
        assert not tool.ok and tool.error["code"] == "conflict"
        # another session of the same user may; another source of the repository is free
        await session(node, http, ADA, "also", PR3)
        assert (await bind(http, BOB, "b", "github:acme/app#4")).status_code == 201
        # once ada's sessions let it go, bob may take it
        for name in ("pr3", "also"):
            gone = await http.delete(
                f"/sessions/{name}/bindings", params={"source": PR3}, headers=auth(ADA)
            )
            assert gone.status_code == 204
        assert (await bind(http, BOB, "b", PR3)).status_code == 201
        assert refused(await bind(http, ADA, "pr3", PR3))[:2] == (409, "conflict")


async def test_concurrent_binds_of_one_source_by_two_users_end_with_one(store_url):
    """Forty sources, each bound by ada and bob at the same moment: each ends with one
    user's session, the other told 409."""
    sources = [f"github:acme/app#{n}" for n in range(1, 41)]
    config = github(acme_app=RepoConfig("ada", users=["bob"]))
    async with node_with(store_url, github=config) as (node, http, ingress):
        await session(node, http, ADA, "a")
        await session(node, http, BOB, "b")
        answers: dict[tuple[str, str], int] = {}

        async def one(token: str, name: str, source: str) -> None:
            answers[token, source] = (await bind(http, token, name, source)).status_code

        async with trio.open_nursery() as nursery:
            for source in sources:
                nursery.start_soon(one, ADA, "a", source)
                nursery.start_soon(one, BOB, "b", source)
        for source in sources:
            assert sorted((answers[ADA, source], answers[BOB, source])) == [201, 409], source
        held = {
            b["source"]
            for token, name in ((ADA, "a"), (BOB, "b"))
            for b in (await http.get(f"/sessions/{name}/bindings", headers=auth(token))).json()[
                "bindings"
            ]
        }
        assert sorted(held) == sorted(sources)  # each held once: by one of the two
        both = len((await http.get("/sessions/a/bindings", headers=auth(ADA))).json()["bindings"])
        assert both == sum(answers[ADA, s] == 201 for s in sources)


async def test_a_binding_stored_before_the_rule_wakes_nothing(store_url):
    """Bob's binding to ada's repository, stored as the previous release let him: the event
    goes to ada's default session, not to him, and the delivery does not name his session."""
    config = github(acme_app=RepoConfig(user="ada", session="ci"))
    async with node_with(store_url, github=config) as (node, http, ingress):
        ci = await session(node, http, ADA, "ci")
        await session(node, http, BOB, "steal")
        made, created = await node.store.run(
            BIND,
            owner="bob",
            session_key="bob/steal",
            source=PR3,
            via="http",
            now=node.store.db_time(node.context.clock.now()),
            limit=100,
        )
        assert created
        answer = await deliver(http, "check_run", check_run_event(pr=3))
        assert answer.json() == {"accepted": True, "sessions": 1, "unrouted": False}
        await ci.until(b'"stream_end"')
        assert len(await webhook_inputs(node, "ada/ci")) == 1
        assert await webhook_inputs(node, "bob/steal") == []
        listed = (await http.get("/webhooks/deliveries", headers=auth(BOB))).json()
        assert listed == {"deliveries": []}


async def test_a_resent_failure_under_a_new_delivery_id_runs_no_second_turn(store_url):
    async with node_with(store_url) as (node, http, ingress):
        seen = await session(node, http, ADA, "pr3", PR3)
        body = check_run_event(conclusion="failure")
        first = await deliver(http, "check_run", body, delivery="captured")
        assert first.status_code == 202
        await seen.until(b'"stream_end"')
        # the captured body and signature, resent under new ids, one after the other and at once
        for n in range(3):
            again = await deliver(http, "check_run", body, delivery=f"resent-{n}")
            assert (again.status_code, again.json()) == (200, {"duplicate": True})
        answers: list[httpx.Response] = []

        async def resend(n: int) -> None:
            answers.append(await deliver(http, "check_run", body, delivery=f"storm-{n}"))

        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(resend, n)
        assert all(a.json() == {"duplicate": True} for a in answers)
        (item,) = await webhook_inputs(node, "ada/pr3")
        assert item.payload["delivery_id"] == "github:captured"
        duplicates = node.metrics.value(
            "turnstile_webhook_deliveries_total", hook="github", outcome="duplicate"
        )
        assert duplicates == 23
        # the same run concluding otherwise is another event; so is a re-run's new check run
        timed_out = await deliver(http, "check_run", check_run_event(conclusion="timed_out"))
        rerun = await deliver(http, "check_run", check_run_event(run_id=4243))
        assert [timed_out.status_code, rerun.status_code] == [202, 202]
        await seen.until(b'"stream_end"', 3)
        assert len(await webhook_inputs(node, "ada/pr3")) == 3


async def test_a_workflow_re_run_attempt_runs_one_turn_and_its_resend_none(store_url):
    async with node_with(store_url) as (node, http, ingress):
        seen = await session(node, http, ADA, "pr3", PR3)
        run = workflow_run_event()
        assert (await deliver(http, "workflow_run", run)).status_code == 202
        assert (await deliver(http, "workflow_run", run)).json() == {"duplicate": True}
        rerun = workflow_run_event()
        rerun["workflow_run"]["run_attempt"] = 2
        assert (await deliver(http, "workflow_run", rerun)).status_code == 202
        assert (await deliver(http, "workflow_run", rerun)).json() == {"duplicate": True}
        await seen.until(b'"stream_end"', 2)
        items = await webhook_inputs(node, "ada/pr3")
        assert len(items) == 2
        assert {i.payload["run_id"] for i in items} == {99}


async def test_a_store_of_the_previous_release_migrates_and_dedups_from_then_on(store_url):
    """A store whose webhooks set is at step 1 (the previous release) holding a delivery: the
    node adds the event identity (step 2), keeps the row, and dedups new events."""
    previous = MigrationSet("webhooks", WEBHOOKS.migrations[:1])
    async with open_store(store_url, migrations=[previous]) as store:
        await store.create_session("ada/pr3", owner="ada")
        # what the previous release's RECORD wrote: no event identity
        written = await store.run(
            _PREVIOUS_RECORD,
            id="github:old",
            keys=f'["{PR3}"]',
            now=store.db_time(datetime.now(UTC)),  # the node runs on the wall clock
        )
        assert written == 1
    async with node_with(store_url) as (node, http, ingress):
        assert ("webhooks", 2, "delivery event identity") in [
            (m.set_name, m.version, m.name) for m in await node.store.migrations()
        ]
        seen = await session(node, http, ADA, "s", PR3)
        body = check_run_event()
        assert (await deliver(http, "check_run", body)).status_code == 202
        assert (await deliver(http, "check_run", body)).json() == {"duplicate": True}
        await seen.until(b'"stream_end"')
        assert len(await webhook_inputs(node, "ada/s")) == 1
        everyone = await node.store.run(DELIVERIES, owner=None, limit=10)
        assert "github:old" in {d.delivery_id for d in everyone}
