"""Webhook ingress end to end: a real node on loopback, deliveries sent over real HTTP and
signed as GitHub (``X-Hub-Signature-256``) and Standard Webhooks senders sign them, the bound
session watched over a real WebSocket."""

from __future__ import annotations

import json
import time

import httpx
import trio

from tests.support.agents import SeeingAgent
from tests.support.github import (
    GITHUB_SECRET,
    check_run_event,
    deliver,
    signed,
    standard,
    workflow_run_event,
)
from tests.support.node import ALICE, BOB, WAIT, new_session, running_node
from turnstile.actors.webhooks.settings import (
    GitHubConfig,
    HookConfig,
    RepoConfig,
    WebhooksConfig,
)
from turnstile.client import SessionStream, StreamEnd, StreamStart, open_client

DEPLOYS = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
PR3 = "github:acme/app#3"


def webhooks(**overrides) -> WebhooksConfig:
    hooks = {
        "deploys": HookConfig(
            user="alice", secret=DEPLOYS, session="deploy-{payload.service}", **overrides
        )
    }
    # acme/app is alice's: she may bind her sessions to it (a repository without settings
    # lets nobody)
    github = GitHubConfig(secret=GITHUB_SECRET, repos={"acme/app": RepoConfig(user="alice")})
    return WebhooksConfig(github=github, hooks=hooks)


def unsigned(node) -> httpx.AsyncClient:
    """A client with no token: what GitHub and other senders are."""
    return httpx.AsyncClient(base_url=node.url)


async def metrics(node) -> list[str]:
    async with unsigned(node) as http:
        return (await http.get("/metrics")).text.splitlines()


async def next_data(stream: SessionStream, kind: type, matches=lambda data: True):
    """The data of the stream's next event that is a ``kind`` and ``matches``."""
    async for event in stream:
        if isinstance(event.data, kind) and matches(event.data):
            return event.data
    raise AssertionError(f"the stream ended before a {kind.__name__}")


async def bind(node, session: str, source: str, token: str = ALICE) -> None:
    async with node.http(token) as http:
        answer = await http.post(f"/sessions/{session}/bindings", json={"source": source})
        assert answer.status_code == 201, answer.text


async def test_a_failing_check_run_wakes_the_bound_session_with_what_failed(tmp_path):
    agent = SeeingAgent()
    async with running_node(tmp_path, agent=agent, webhooks=webhooks()) as node:
        await new_session(node, "pr3")
        await bind(node, "pr3", PR3)
        async with (
            open_client(node.url, ALICE) as client,
            client.attach("pr3") as stream,
            unsigned(node) as github,
        ):
            answer = await deliver(github, "check_run", check_run_event(conclusion="failure"))
            assert answer.status_code == 202
            assert answer.json() == {"accepted": True, "sessions": 1, "unrouted": False}
            start = await next_data(stream, StreamStart, lambda s: s.source == "webhook")
            assert start.content.startswith('[CI FAILED] Acme/App: check run "tests"')
            await next_data(stream, StreamEnd, lambda e: e.input_id == start.input_id)
        (turn,) = agent.inputs
        assert (turn.source, turn.content) == ("webhook", start.content)
        delivery = answer.request.headers["x-github-delivery"]
        assert turn.payload == {
            "type": "check_run_failed",
            "name": "tests",
            "conclusion": "failure",
            "output_title": "2 tests failed",
            "output_summary": "test_login and test_logout failed",
            "details_url": "https://ci.example/runs/4242",
            "html_url": "https://github.com/Acme/App/runs/4242",
            "branch": "main",
            "commit_sha": "0123456789abcdef0123456789abcdef01234567",
            "pr_number": 3,
            "owner": "Acme",
            "repo": "App",
            "run_id": 4242,
            "hook": "github",
            "event": "check_run",
            "delivery_id": f"github:{delivery}",
            "source_ref": "Acme/App#check_run:4242",
        }
        async with node.http() as http:
            history = (await http.get("/sessions/pr3/history")).json()["history"]
        assert history[0] == {"role": "user", "content": start.content, "source": "webhook"}


async def test_success_ping_and_other_events_wake_nobody(tmp_path):
    agent = SeeingAgent()
    async with running_node(tmp_path, agent=agent, webhooks=webhooks()) as node:
        await new_session(node, "pr3")
        await bind(node, "pr3", PR3)
        async with unsigned(node) as github:
            ping = await deliver(
                github, "ping", {"zen": "Keep it logically awesome.", "hook_id": 1}
            )
            assert (ping.status_code, ping.json()) == (200, {"ok": True, "event": "ping"})
            for event, body in (
                ("check_run", check_run_event(conclusion="success")),
                ("check_run", check_run_event(action="created", conclusion=None)),
                ("workflow_run", workflow_run_event(conclusion="success")),
                ("workflow_run", workflow_run_event(conclusion="cancelled")),
                ("push", {"ref": "refs/heads/main"}),
            ):
                answer = await deliver(github, event, body)
                assert answer.status_code == 200 and answer.json()["ignored"] is True
        async with node.http() as http:
            events = (await http.get("/sessions/pr3/events")).json()["events"]
            assert [e["type"] for e in events] == ["source_binding"]  # no turn was queued
            assert (await http.get("/webhooks/unrouted")).json() == {"unrouted": []}
        assert agent.inputs == []
        lines = await metrics(node)
        assert 'turnstile_webhook_deliveries_total{hook="github",outcome="ignored"} 5.0' in lines
        assert 'turnstile_webhook_deliveries_total{hook="github",outcome="pong"} 1.0' in lines


async def test_a_bad_or_missing_signature_is_401_and_nothing_happens(tmp_path):
    agent = SeeingAgent()
    async with running_node(tmp_path, agent=agent, webhooks=webhooks()) as node:
        await new_session(node, "pr3")
        await bind(node, "pr3", PR3)
        body = check_run_event(conclusion="failure")
        good = signed("check_run", body, delivery="d-1")
        async with unsigned(node) as github:
            forged = signed("check_run", body, secret="not-the-secret", delivery="d-1")
            missing = {**good, "headers": {**good["headers"]}}
            del missing["headers"]["x-hub-signature-256"]
            tampered = {**good, "content": good["content"].replace(b"failure", b"timed_out")}
            for request in (forged, missing, tampered):
                answer = await github.post("/webhooks/github", **request)
                assert answer.status_code == 401
                assert answer.json()["error"]["code"] == "bad_signature"
                assert answer.json()["error"]["field"] == "X-Hub-Signature-256"
                assert GITHUB_SECRET not in answer.text
            # the genuine delivery with the same id is new: nothing was recorded before
            assert (await github.post("/webhooks/github", **good)).status_code == 202
        lines = await metrics(node)
        refusals = 'turnstile_webhook_refusals_total{hook="github",reason="%s"}'
        assert f"{refusals % 'bad_signature'} 2.0" in lines
        assert f"{refusals % 'missing_signature'} 1.0" in lines


async def test_a_redelivery_storm_over_real_http_makes_one_turn(tmp_path):
    agent = SeeingAgent()
    async with running_node(tmp_path, agent=agent, webhooks=webhooks()) as node:
        await new_session(node, "pr3")
        await bind(node, "pr3", PR3)
        request = signed("check_run", check_run_event(conclusion="failure"), delivery="storm")
        statuses: list[int] = []
        limits = httpx.Limits(max_connections=100)
        async with (
            open_client(node.url, ALICE) as client,
            client.attach("pr3") as stream,
            # a hundred at once: httpx's own 5 s is not a hang guard on a box at load 8
            httpx.AsyncClient(base_url=node.url, limits=limits, timeout=WAIT) as github,
        ):

            async def one() -> None:
                statuses.append((await github.post("/webhooks/github", **request)).status_code)

            async with trio.open_nursery() as nursery:
                for _ in range(100):
                    nursery.start_soon(one)
            await next_data(stream, StreamEnd)
        assert sorted(statuses) == [200] * 99 + [202]
        async with node.http() as http:
            events = (await http.get("/sessions/pr3/events")).json()["events"]
        assert [e["source"] for e in events if e["type"] == "stream_start"] == ["webhook"]
        assert len(agent.inputs) == 1


async def test_a_standard_webhooks_delivery_is_routed_by_its_template(tmp_path):
    agent = SeeingAgent()
    async with running_node(tmp_path, agent=agent, webhooks=webhooks()) as node:
        await new_session(node, "deploy-api")
        body = {"type": "deploy.failed", "service": "api", "error": "health check failed"}
        now = int(time.time())
        async with (
            open_client(node.url, ALICE) as client,
            client.attach("deploy-api") as stream,
            unsigned(node) as sender,
        ):
            request = standard(DEPLOYS, body, msg_id="msg_1", timestamp=now)
            answer = await sender.post("/webhooks/deploys", **request)
            assert (answer.status_code, answer.json()["sessions"]) == (202, 1)
            start = await next_data(stream, StreamStart, lambda s: s.source == "webhook")
            # the same message again (a sender's retry): nothing more
            again = await sender.post("/webhooks/deploys", **request)
            assert again.json() == {"duplicate": True}
            await next_data(stream, StreamEnd, lambda e: e.input_id == start.input_id)
        assert start.content.splitlines()[0] == "[WEBHOOK deploys] deploy.failed"
        assert json.loads(start.content.split("\n", 1)[1]) == body
        (turn,) = agent.inputs
        assert turn.payload["data"] == body
        assert (turn.payload["hook"], turn.payload["delivery_id"]) == (
            "deploys",
            "hook:deploys:msg_1",
        )


async def test_standard_webhooks_refusals_replays_limits_and_malformed_bodies(tmp_path):
    config = webhooks(rate_per_minute=8, max_body_bytes=2048)
    async with running_node(tmp_path, webhooks=config) as node:
        await new_session(node, "deploy-api")
        now = int(time.time())
        good = {"type": "deploy.failed", "service": "api"}
        async with unsigned(node) as sender:

            async def post(body, *, msg_id="m", timestamp=now, hook="deploys", **kwargs):
                request = standard(DEPLOYS, body, msg_id=msg_id, timestamp=timestamp)
                request["headers"].update(kwargs)
                return await sender.post(f"/webhooks/{hook}", **request)

            def error(answer):
                return answer.status_code, answer.json()["error"].get("field")

            # an authentic message replayed an hour later: outside the tolerance
            replay = await post(good, msg_id="old", timestamp=now - 3600)
            assert error(replay) == (401, "webhook-timestamp")
            assert "replay" in replay.json()["error"]["message"]
            assert error(await post(good, **{"webhook-signature": "v1,AAAA"})) == (
                401,
                "webhook-signature",
            )
            assert error(await post(b"{not json", msg_id="m2")) == (400, "body")
            assert error(await post(b"[1, 2]", msg_id="m3")) == (400, "body")
            assert error(await post({"type": "x"}, msg_id="m4")) == (400, "$.service")
            assert error(await post({"service": "a/b"}, msg_id="m5")) == (400, "$.service")
            too_big = await post({"service": "api", "pad": "x" * 4096}, msg_id="m6")
            assert (too_big.status_code, too_big.json()["error"]["code"]) == (
                413,
                "payload_too_large",
            )
            unknown = await post(good, hook="nobody")
            assert unknown.status_code == 404
            # the rate (8 a minute) counts authenticated deliveries only: the four above that
            # passed their signature and this one
            accepted = await post(good, msg_id="m7")
            assert accepted.status_code == 202
            statuses = [(await post(good, msg_id=f"r{i}")).status_code for i in range(4)]
            assert statuses == [202, 202, 202, 429]
            limited = await post(good, msg_id="r9")
            assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        lines = await metrics(node)
        counted = {
            line.split("reason=")[1].split('"')[1]: float(line.split()[-1])
            for line in lines
            if line.startswith('turnstile_webhook_refusals_total{hook="deploys"')
        }
        assert counted == {
            "stale_timestamp": 1.0,
            "bad_signature": 1.0,
            "malformed": 4.0,
            "too_large": 1.0,
            "rate_limited": 2.0,
        }
        assert 'turnstile_webhook_refusals_total{hook="",reason="unknown_hook"} 1.0' in lines


async def test_only_the_signed_routes_go_without_a_token(tmp_path):
    async with running_node(tmp_path, webhooks=webhooks()) as node:
        await new_session(node, "s1")
        async with unsigned(node) as anyone:
            for method, path in (
                ("GET", "/webhooks/unrouted"),
                ("GET", "/sessions/s1/bindings"),
                ("POST", "/sessions/s1/bindings"),
                ("DELETE", "/sessions/s1/bindings"),
                ("GET", "/sessions"),
            ):
                answer = await anyone.request(method, path)
                assert answer.status_code == 401, (method, path)
        async with node.http(BOB) as bob:
            assert (await bob.get("/sessions/s1/bindings")).status_code == 404
