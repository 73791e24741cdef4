"""Screenshots of the demo agent in the console for docs/console.md (not a test; run by hand):

    .venv/bin/python -m tests.e2e.console.demo_screenshots [docs/console]

It starts ``turnstile serve`` with the demo agent (the default without a model) in a temporary
directory, and a tiny site on 127.0.0.1 for the watcher and the background fetch (allowed
through ``[modules.http] allowed_networks``, as the SSRF guard refuses loopback otherwise);
then types README's quick-start requests into a session in Debian's chromium, as a person
would, waits for what comes back by itself (the watcher's first look, the fetch's end, the
reminder, set for 5 seconds rather than 2 minutes), and writes ``demo-requests.png`` (the
first requests, a tool call open), ``demo.png`` (the session once the reminder came) and
``demo-scheduled.png`` (then "what's scheduled?").
"""

from __future__ import annotations

import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect, sync_playwright

from tests.e2e.console.conftest import TOKEN, chromium_path, serve
from tests.e2e.console.screenshots import shoot

CONFIG = f"""
agent = "demo"

[modules.http]
allowed_networks = ["127.0.0.0/8"]

[[users]]
name = "alice"
token = "{TOKEN}"
"""


class Status(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"all systems go"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def say(page: Page, text: str, answers: int) -> None:
    """Type ``text`` and wait until the session shows ``answers`` completed turns."""
    box = page.get_by_label("Message", exact=True)
    box.fill(text)
    box.press("Enter")
    expect(page.locator('article.turn[data-status="completed"]')).to_have_count(answers)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = chromium_path()
    if path is None:
        sys.exit("no chromium: run scripts/ensure-chromium.sh")
    site = ThreadingHTTPServer(("127.0.0.1", 0), Status)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{site.server_address[1]}/status"
    with tempfile.TemporaryDirectory() as directory:
        process, node = serve(Path(directory), CONFIG)
        try:
            made = httpx.post(
                f"{node}/sessions",
                json={"id": "demo"},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert made.status_code == 201, made.text
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=path)
                page = browser.new_page(viewport={"width": 1280, "height": 1100})
                page.goto(f"{node}/console#token={TOKEN}")
                expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
                page.goto(f"{node}/console#/sessions/demo")
                page.get_by_label("Message", exact=True).wait_for()
                say(page, "remember that I like dark roast", 1)
                say(page, "remind me in 5 seconds to stretch", 2)
                say(page, "every weekday at 9am say standup", 3)
                say(page, f"watch {url} every 30 seconds and tell me when it changes", 5)
                turns = page.locator("article.turn")
                turns.nth(1).locator("details summary").first.click()  # schedule_recall's call
                turns.first.scroll_into_view_if_needed()
                shoot(page, out, "demo-requests", full_page=False)
                say(page, f"fetch {url} in the background", 7)
                reminder = page.locator("article.turn", has_text="⏰ Reminder: stretch")
                expect(reminder).to_have_count(1, timeout=15_000)
                reminder.scroll_into_view_if_needed()  # the last turns: what came back
                shoot(page, out, "demo", full_page=False)
                say(page, "what's scheduled?", 9)
                page.locator("article.turn").last.scroll_into_view_if_needed()
                shoot(page, out, "demo-scheduled", full_page=False)
                browser.close()
        finally:
            process.terminate()
            process.wait(10)
            site.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/console"))
