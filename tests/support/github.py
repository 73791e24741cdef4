"""GitHub as a sender, for tests: CI event payloads shaped like GitHub's, signed as GitHub signs
them (``X-Hub-Signature-256``), and Standard Webhooks signing."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from typing import Any

import httpx

from turnstile.actors.webhooks.settings import decode_whsec
from turnstile.actors.webhooks.signatures import standard_signature

GITHUB_SECRET = "a-github-webhook-secret"
SHA = "0123456789abcdef0123456789abcdef01234567"


def check_run_event(
    *,
    action: str = "completed",
    conclusion: str | None = "failure",
    pr: int | None = 3,
    branch: str = "main",
    run_id: int = 4242,
    owner: str = "Acme",
    repo: str = "App",
) -> dict[str, Any]:
    """A ``check_run`` delivery's body, with the fields GitHub sends that matter here and some
    that do not."""
    return {
        "action": action,
        "check_run": {
            "id": run_id,
            "name": "tests",
            "node_id": "CR_kwDO",
            "head_sha": SHA,
            "external_id": "",
            "status": "completed" if action == "completed" else "in_progress",
            "conclusion": conclusion,
            "details_url": f"https://ci.example/runs/{run_id}",
            "html_url": f"https://github.com/{owner}/{repo}/runs/{run_id}",
            "started_at": "2026-11-21T12:00:00Z",
            "output": {
                "title": "2 tests failed",
                "summary": "test_login and test_logout failed",
                "text": None,
                "annotations_count": 0,
            },
            "check_suite": {"id": 1, "head_branch": branch, "head_sha": SHA},
            "app": {"id": 15368, "slug": "github-actions"},
            "pull_requests": []
            if pr is None
            else [{"id": 1, "number": pr, "head": {"ref": branch, "sha": SHA}}],
        },
        "repository": {
            "id": 1,
            "name": repo,
            "full_name": f"{owner}/{repo}",
            "owner": {"login": owner, "id": 2},
        },
        "sender": {"login": "github-actions[bot]"},
    }


def workflow_run_event(*, conclusion: str = "failure", pr: int | None = 3) -> dict[str, Any]:
    """A ``workflow_run`` delivery's body."""
    return {
        "action": "completed",
        "workflow_run": {
            "id": 99,
            "name": "CI",
            "head_branch": "fix-3",
            "head_sha": SHA,
            "display_title": "Fix the login",
            "run_attempt": 1,
            "status": "completed",
            "conclusion": conclusion,
            "html_url": "https://github.com/Acme/App/actions/runs/99",
            "logs_url": "https://api.github.com/repos/Acme/App/actions/runs/99/logs",
            "pull_requests": [] if pr is None else [{"number": pr}],
        },
        "repository": {"name": "App", "owner": {"login": "Acme"}},
    }


def signed(
    event: str,
    body: dict[str, Any] | bytes,
    *,
    secret: str = GITHUB_SECRET,
    delivery: str | None = None,
) -> dict[str, Any]:
    """``httpx`` request arguments for a delivery signed as GitHub signs it."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    signature = hmac.new(secret.encode(), content, hashlib.sha256).hexdigest()
    return {
        "content": content,
        "headers": {
            "content-type": "application/json",
            "user-agent": "GitHub-Hookshot/abc123",
            "x-github-event": event,
            "x-github-delivery": delivery or str(uuid.uuid4()),
            "x-github-hook-id": "1",
            "x-hub-signature-256": f"sha256={signature}",
        },
    }


async def deliver(http: httpx.AsyncClient, event: str, body: Any, **kwargs: Any) -> httpx.Response:
    """POST a signed delivery to ``/webhooks/github``."""
    return await http.post("/webhooks/github", **signed(event, body, **kwargs))


def standard(
    secret: str, body: dict[str, Any] | bytes, *, msg_id: str, timestamp: int
) -> dict[str, Any]:
    """``httpx`` request arguments for a Standard Webhooks delivery."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    signature = standard_signature(decode_whsec(secret), msg_id, str(timestamp), content)
    return {
        "content": content,
        "headers": {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature,
        },
    }
