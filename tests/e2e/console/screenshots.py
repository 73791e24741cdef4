"""Screenshots of the console's main views for docs/console.md (not a test; run by hand):

    .venv/bin/python -m tests.e2e.console.screenshots [docs/console]

It starts a node of its own (``turnstile serve`` in a temporary directory, the scripted agent,
a GitHub secret so webhook deliveries can be shown), gives it something to show through the
public API (sessions with turns, a tool call waiting for approval, a recall, a cron job,
watchers, a heartbeat, a buffered notification, facts, deliveries), drives Debian's chromium
through the views at a laptop and a phone width, and writes one PNG per view.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect, sync_playwright

from tests.e2e.console.conftest import CONFIG, TOKEN, chromium_path, serve
from tests.support.github import GITHUB_SECRET, check_run_event, signed

SCREENSHOT_CONFIG = (
    CONFIG
    + f"""
[memory]
admins = ["alice"]

[webhooks]
admins = ["alice"]

[webhooks.github]
secret = "{GITHUB_SECRET}"

[webhooks.github.repos."acme/app"]
user = "alice"
"""
)
LAPTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


def seed(http: httpx.Client) -> None:
    """What the views show, put in through the API as any client would."""

    def post(path: str, body: dict | None = None, status: int = 201) -> dict:
        answer = http.post(path, json=body or {})
        assert answer.status_code == status, answer.text
        return answer.json() if answer.content else {}

    def message(session: str, content: str) -> None:
        post(f"/sessions/{session}/messages", {"content": content}, 202)

    for name in ("deploy", "triage", "standup", "ops"):
        post("/sessions", {"id": name})
    message(
        "standup",
        "/call schedule_cron " + json.dumps({"cron": "0 9 * * 1-5", "prompt": "standup notes"}),
    )
    message(
        "triage",
        "/call schedule_recall "
        + json.dumps(
            {
                "call_type": "recurring",
                "interval_seconds": 3600,
                "additional_context_message": "re-run the flaky test and compare",
            }
        ),
    )
    message(
        "deploy",
        "/call send_notification "
        + json.dumps({"title": "disk", "message": "/var is 91% full", "priority": "high"}),
    )
    message(
        "deploy",
        "/call set_heartbeat "
        + json.dumps(
            {"enabled": True, "interval_minutes": 30, "checklist": "CI status; open incidents"}
        ),
    )
    message("deploy", "/call background_run " + json.dumps({"name": "clock.now"}))
    for label, interval in (("health", 30), ("queue depth", 60)):
        post(
            "/sessions/deploy/watchers", {"tool": "clock.now", "interval": interval, "label": label}
        )
    watchers = http.get("/sessions/deploy/watchers").json()["watchers"]
    post(f"/watchers/{watchers[-1]['watcher_id']}/pause", status=200)
    for category, key, value in (
        ("preferences", "editor", "helix, with vim keys"),
        ("work", "on_call", "second week of each month"),
        ("drinks", "coffee", "dark roast, no sugar"),
    ):
        assert (
            http.put(
                "/memory/facts", json={"category": category, "key": key, "value": value}
            ).status_code
            == 200
        )
    post("/sessions/deploy/bindings", {"source": "github:acme/app#3"})
    plain = httpx.Client(base_url=str(http.base_url))
    body = check_run_event(pr=3)
    for kwargs in ({"delivery": "a1"}, {"delivery": "a1"}, {"secret": "forged"}):
        plain.post("/webhooks/github", **signed("check_run", body, **kwargs))
    plain.post(
        "/webhooks/github",
        **signed("check_run", check_run_event(repo="other", run_id=9, pr=None), delivery="a2"),
    )


def shoot(page: Page, out: Path, name: str, full_page: bool = True) -> None:
    page.wait_for_timeout(300)  # let the last frame paint; a picture, not a test
    page.evaluate("() => window.scrollTo(0, 0)")  # the sticky header stays on top
    page.screenshot(path=str(out / f"{name}.png"), full_page=full_page)
    print("wrote", out / f"{name}.png")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = chromium_path()
    if path is None:
        sys.exit("no chromium: run scripts/ensure-chromium.sh")
    with tempfile.TemporaryDirectory() as directory:
        process, url = serve(Path(directory), SCREENSHOT_CONFIG)
        try:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                seed(http)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=path)
                page = browser.new_page(viewport=LAPTOP)
                page.goto(f"{url}/console")
                shoot(page, out, "login")
                page.get_by_label("Token").fill(TOKEN)
                page.get_by_role("button", name="Sign in").click()
                expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
                shoot(page, out, "sessions")

                page.goto(f"{url}/console#/sessions/triage")
                box = page.get_by_label("Message", exact=True)
                for text in (
                    "/think the test failed twice on CI, once locally",
                    '/call echo {"text": "rerun tests/test_flaky.py"}',
                ):
                    box.fill(text)
                    box.press("Enter")
                expect(page.get_by_role("button", name="Approve")).to_be_visible()
                box.fill("and what changed since yesterday in the scheduler and the store?")
                box.press("Enter")
                page.locator("article.turn details.thinking summary").first.click()
                page.set_viewport_size({"width": 1280, "height": 1200})
                shoot(page, out, "session", full_page=False)
                page.set_viewport_size(LAPTOP)
                page.get_by_role("button", name="Approve").click()
                expect(page.locator("article.turn").last).to_have_attribute(
                    "data-status", "completed"
                )

                page.goto(f"{url}/console#/automations/deploy")
                expect(page.get_by_role("article", name="Watcher health")).to_be_visible()
                page.get_by_role("article", name="Watcher health").get_by_role(
                    "button", name="History"
                ).click()
                expect(page.locator(".history")).to_be_visible()
                shoot(page, out, "automations")

                page.goto(f"{url}/console#/memory")
                expect(page.locator("table.facts")).to_be_visible()
                shoot(page, out, "memory")

                page.goto(f"{url}/console#/webhooks")
                page.get_by_label("All users, with the node's counts").check()
                expect(page.locator(".counts table")).to_be_visible()
                shoot(page, out, "webhooks")

                phone = browser.new_page(viewport=PHONE)
                phone.goto(f"{url}/console#token={TOKEN}")
                expect(phone.get_by_role("heading", name="Sessions")).to_be_visible()
                shoot(phone, out, "sessions-phone")
                phone.goto(f"{url}/console#/sessions/triage")
                expect(phone.locator("article.turn").first).to_be_visible()
                shoot(phone, out, "session-phone", full_page=False)  # the first screen only
                browser.close()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(10)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/console"))
