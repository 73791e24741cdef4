"""Reading GitHub's CI events, source keys and routing templates."""

from __future__ import annotations

import json

import pytest

from tests.support.github import check_run_event, workflow_run_event
from turnstile.actors.webhooks.github import parse_event, parse_source_key
from turnstile.actors.webhooks.template import RouteTemplate, RoutingFieldError, TemplateError
from turnstile.runtime.errors import DecodeError, InvalidArgument


def test_a_failing_check_run_carries_what_the_reference_lists():
    body = json.dumps(check_run_event(conclusion="failure", pr=3, branch="fix-3")).encode()
    failure = parse_event("check_run", body)
    assert failure.source_ref == "Acme/App#check_run:4242"
    assert failure.source_keys == ["github:acme/app#3", "github:acme/app:branch:fix-3"]
    assert failure.payload == {
        "type": "check_run_failed",
        "name": "tests",
        "conclusion": "failure",
        "output_title": "2 tests failed",
        "output_summary": "test_login and test_logout failed",
        "details_url": "https://ci.example/runs/4242",
        "html_url": "https://github.com/Acme/App/runs/4242",
        "branch": "fix-3",
        "commit_sha": "0123456789abcdef0123456789abcdef01234567",
        "pr_number": 3,
        "owner": "Acme",
        "repo": "App",
        "run_id": 4242,
    }
    assert failure.content.splitlines() == [
        '[CI FAILED] Acme/App: check run "tests" concluded failure',
        "PR #3 · branch fix-3 · commit 0123456789ab",
        "Output: 2 tests failed",
        "test_login and test_logout failed",
        "Details: https://ci.example/runs/4242",
        "Run: https://github.com/Acme/App/runs/4242",
    ]


@pytest.mark.parametrize(
    ("action", "conclusion"),
    [
        ("completed", "success"),
        ("completed", "neutral"),
        ("completed", "skipped"),
        ("completed", "cancelled"),
        ("created", None),
        ("rerequested", "failure"),
    ],
)
def test_successes_and_unfinished_runs_wake_nobody(action, conclusion):
    body = json.dumps(check_run_event(action=action, conclusion=conclusion)).encode()
    assert parse_event("check_run", body) == "ignored"


def test_timed_out_is_a_failure_and_a_run_without_pr_is_keyed_by_branch():
    body = json.dumps(check_run_event(conclusion="timed_out", pr=None)).encode()
    failure = parse_event("check_run", body)
    assert failure.source_keys == ["github:acme/app:branch:main"]
    assert failure.payload["pr_number"] is None


def test_workflow_runs_count_cancelled_only_when_configured():
    body = json.dumps(workflow_run_event(conclusion="cancelled")).encode()
    assert parse_event("workflow_run", body) == "ignored"
    failure = parse_event("workflow_run", body, workflow_cancelled=True)
    assert failure.source_ref == "Acme/App#workflow_run:99"
    assert failure.payload["type"] == "workflow_run_failed"
    assert failure.payload["conclusion"] == "cancelled"


def _workflow(conclusion: str = "failure", attempt: int | None = 1) -> dict:
    body = workflow_run_event(conclusion=conclusion)
    if attempt is None:
        del body["workflow_run"]["run_attempt"]
    else:
        body["workflow_run"]["run_attempt"] = attempt
    return body


@pytest.mark.parametrize(
    ("event", "body", "identity"),
    [
        ("check_run", check_run_event(), "github:acme/app#check_run:4242:1:failure"),
        (
            "check_run",
            check_run_event(conclusion="timed_out", run_id=7),
            "github:acme/app#check_run:7:1:timed_out",
        ),
        ("workflow_run", _workflow(), "github:acme/app#workflow_run:99:1:failure"),
        ("workflow_run", _workflow(attempt=3), "github:acme/app#workflow_run:99:3:failure"),
        ("workflow_run", _workflow(attempt=None), "github:acme/app#workflow_run:99:1:failure"),
    ],
)
def test_an_event_is_identified_by_repository_run_attempt_and_conclusion(event, body, identity):
    failure = parse_event(event, json.dumps(body).encode())
    assert failure.identity == identity


def test_a_long_summary_is_cut():
    event = check_run_event(conclusion="failure")
    event["check_run"]["output"]["summary"] = "x" * 70_000
    failure = parse_event("check_run", json.dumps(event).encode())
    assert len(failure.payload["output_summary"]) == 4000


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"[]", "body"),
        (
            b'{"action": "completed", "repository": {"name": "a", "owner": {"login": "b"}}}',
            "$.check_run",
        ),
    ],
)
def test_a_malformed_payload_names_the_field(body, field):
    with pytest.raises(DecodeError) as refused:
        parse_event("check_run", body)
    assert refused.value.field == field
    event = check_run_event(conclusion="failure")
    event["check_run"]["id"] = "4242"
    with pytest.raises(DecodeError) as refused:
        parse_event("check_run", json.dumps(event).encode())
    assert refused.value.field == "$.check_run.id"


def test_source_keys_are_normalised_and_anything_else_refused():
    assert str(parse_source_key("github:Acme/App#3")) == "github:acme/app#3"
    assert str(parse_source_key("github:Acme/App:branch:Fix/Login")) == (
        "github:acme/app:branch:Fix/Login"
    )
    for bad in (
        "github:acme/app",
        "github:acme/app#0",
        "gitlab:a/b#1",
        "github:a/b#3 ",
        "github:a/b:branch:",
        "github:a/b:branch:has space",
        "github:-a/b#1",
    ):
        with pytest.raises(InvalidArgument) as refused:
            parse_source_key(bad)
        assert refused.value.field == "source"


def test_templates_route_by_payload_fields_only():
    template = RouteTemplate.parse("deploy-{payload.service.name}-{payload.items.0.id}")
    payload = {"service": {"name": "api"}, "items": [{"id": 7}]}
    assert template.render(payload) == "deploy-api-7"
    assert RouteTemplate.parse("ci").render({}) == "ci"
    # a placeholder reads JSON keys, never attributes: this is a key like any other
    dunder = RouteTemplate.parse("{payload.__class__}")
    assert dunder.render({"__class__": "x"}) == "x"
    with pytest.raises(RoutingFieldError):
        dunder.render({})


@pytest.mark.parametrize(
    "text",
    [
        "{payload}",
        "{headers.x}",
        "{payload.a.b.c.d.e.f.g.h.i}",
        "{0.__class__}",
        "{payload.a!r}",
        "{payload.a:>10}",
        "a/{payload.b}",
        "}{payload.a}",
        "{payload.a}{payload.b}{payload.c}{payload.d}{payload.e}",
        "",
    ],
)
def test_templates_that_are_not_the_safe_form_are_refused(text):
    with pytest.raises(TemplateError):
        RouteTemplate.parse(text)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "$.session"),
        ({"session": None}, "$.session"),
        ({"session": True}, "$.session"),
        ({"session": {"a": 1}}, "$.session"),
        ({"session": "a/b"}, "$.session"),
        ({"session": "x" * 129}, "$.session"),
        ([], "$.session"),
    ],
)
def test_a_payload_the_template_cannot_route_names_the_field(payload, field):
    with pytest.raises(RoutingFieldError) as refused:
        RouteTemplate.parse("{payload.session}").render(payload)
    assert refused.value.field == field
