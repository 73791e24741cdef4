"""The console in a real browser (Debian's Chromium through Playwright) against a real node
(``turnstile serve``, the scripted agent streaming a word every 80 ms): what a person does with
it, checked where a person sees it. One browser and one node for the module; each test has its
own browser context (its own tab storage) and its own session."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.console.conftest import ConsoleNode

pytestmark = pytest.mark.slow

WORDS = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
#: About 2.2 s of streaming: time enough to reload or drop the connection in the middle.
LONG = f"{WORDS} {WORDS}"
#: About 4.5 s: the reload test needs the turn still streaming once the reloaded page has
#: replayed the log, and a reload took more than LONG's remaining 2 s on a busy box (a CI run).
LONGER = f"{LONG} {LONG}"


def api(node: ConsoleNode) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"Authorization": f"Bearer {node.token}"})


def new_session(node: ConsoleNode, name: str) -> None:
    with api(node) as http:
        assert http.post("/sessions", json={"id": name}).status_code == 201


def open_page(browser, node: ConsoleNode, where: str = "#/sessions", **context):
    """A new tab signed in through the link form (``#token=…``, which the console takes and
    drops from the address), showing ``where``."""
    page = browser.new_context(**context).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    page.goto(f"{node.console}#token={node.token}")
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    assert "token" not in page.url
    if where != "#/sessions":
        page.goto(f"{node.console}{where}")
    return page


def send(page, text: str) -> None:
    box = page.get_by_label("Message", exact=True)
    box.fill(text)
    box.press("Enter")


def turn(page, index: int):
    return page.locator("article.turn").nth(index)


def watch_text(page) -> None:
    """Record every state of the transcript's answer text as it changes (a MutationObserver in
    the page), so a test can tell what the person saw on the way, not only at the end."""
    page.evaluate(
        """() => {
            window.seen = [];
            const log = document.querySelector('.transcript');
            new MutationObserver(() => {
                const texts = [...log.querySelectorAll('.turn-text')];
                const text = texts.map(t => t.textContent).join('|');
                if (window.seen.at(-1) !== text) window.seen.push(text);
            }).observe(log, {subtree: true, childList: true, characterData: true});
        }"""
    )


def test_signing_out_leaves_the_sign_in_form_alone(browser, console_node):
    page = open_page(browser, console_node)
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("Token")).to_be_visible()
    expect(page.get_by_role("navigation", name="Console", include_hidden=True)).to_be_hidden()
    expect(page.get_by_role("button", name="Sign out", include_hidden=True)).to_be_hidden()
    assert page.evaluate("() => sessionStorage.length") == 0
    assert page.errors == []


def test_sign_in_create_a_session_and_watch_the_answer_stream_token_by_token(browser, console_node):
    page = browser.new_context().new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(console_node.console)
    # signed out, the page is the sign-in form alone, and it says where the token comes from
    expect(page.get_by_label("Token")).to_be_visible()
    expect(page.get_by_role("navigation", name="Console", include_hidden=True)).to_be_hidden()
    expect(page.get_by_role("button", name="Sign out", include_hidden=True)).to_be_hidden()
    expect(page.locator("#token-hint")).to_contain_text("serve.sh")
    expect(page.locator("#token-hint")).to_contain_text("dev token (user 'dev')")
    expect(page.locator("#token-hint")).to_contain_text("[[users]]")
    page.get_by_label("Token").fill("not-a-token-of-this-node")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("This node does not know that token.")
    page.get_by_label("Token").fill(console_node.token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    expect(page.get_by_role("navigation", name="Console")).to_be_visible()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    # kept for this tab only
    stored = page.evaluate("() => [sessionStorage.length, localStorage.length]")
    assert stored == [1, 0]

    page.get_by_label("New session").fill("demo")
    page.get_by_role("button", name="Create session").click()
    expect(page.get_by_role("heading", name="demo")).to_be_visible()
    expect(page.locator("#link-state")).to_have_text("Live")
    watch_text(page)
    send(page, WORDS)
    first = turn(page, 0)
    expect(first.locator(".turn-input")).to_have_text(WORDS)
    expect(page.locator(".session-status")).to_have_text("Running a turn")
    expect(first).to_have_attribute("data-status", "completed")
    final = f"You said: {WORDS}"
    expect(first.locator(".turn-text")).to_have_text(final)
    expect(first.locator(".turn-closure")).to_have_text("Completed")
    expect(page.locator(".session-status")).to_have_text("Idle")
    seen = [s for s in page.evaluate("() => window.seen") if s]
    # the answer grew a word at a time, each state a prefix of the last: streamed, not dumped
    assert len(seen) >= 10, seen
    assert all(final.startswith(state) for state in seen), seen
    assert seen == sorted(seen, key=len) and seen[-1] == final

    send(page, "/think weighing the options")  # thinking arrives collapsed
    second = turn(page, 1)
    expect(second).to_have_attribute("data-status", "completed")
    thinking = second.locator("details.thinking")
    expect(thinking).not_to_have_attribute("open", "")
    expect(second.locator(".turn-text")).to_have_text("Done thinking.")
    thinking.locator("summary").click()
    expect(thinking.locator(".thinking-text")).to_have_text("weighing the options")
    assert errors == []


def test_stop_a_long_turn(browser, console_node):
    new_session(console_node, "long")
    page = open_page(browser, console_node, "#/sessions/long")
    send(page, "/sleep 60")
    expect(page.locator(".session-status")).to_have_text("Running a turn")
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_enabled()
    stop.click()
    expect(turn(page, 0)).to_have_attribute("data-status", "stopped")
    expect(turn(page, 0).locator(".turn-closure")).to_contain_text("Stopped")
    expect(page.locator(".session-status")).to_have_text("Idle")
    expect(stop).to_be_disabled()


def test_a_recall_shows_a_banner_that_counts_down_and_goes_when_it_fires(browser, console_node):
    new_session(console_node, "later")
    new_session(console_node, "other")
    page = open_page(browser, console_node, "#/sessions/later")
    arguments = {
        "call_type": "once",
        "when": "in 5 seconds",
        "additional_context_message": "check the build",
    }
    send(page, f"/call schedule_recall {json.dumps(arguments)}")
    banner = page.get_by_role("region", name=re.compile("Recall in"))
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("check the build")
    clock = banner.locator("time.countdown")
    expect(clock).to_have_text(re.compile(r"0:0[1-5]"))
    first = clock.inner_text()
    expect(clock).not_to_have_text(first)  # it counts down
    assert clock.inner_text() < first

    # meanwhile the list shows the badge, and the filter finds the session
    page.get_by_role("link", name="Sessions").click()
    row = page.locator("tr[data-session=later]")
    expect(row.locator(".recall-badge")).to_be_visible()
    expect(page.locator("tr[data-session=other] .recall-badge")).to_have_count(0)
    page.get_by_label("With a pending recall").check()
    expect(page.locator("tbody tr")).to_have_count(1)
    expect(page.locator("tbody tr")).to_have_attribute("data-session", "later")

    page.get_by_role("link", name="later").click()
    banner = page.get_by_role("region", name=re.compile("Recall in"))
    expect(banner).to_be_visible()
    expect(banner).to_be_hidden(timeout=15_000)  # it fired
    recall_turn = page.locator("article.turn", has=page.locator(".pill-recall"))
    expect(recall_turn).to_have_count(1)
    expect(recall_turn).to_contain_text("recall: check the build")
    expect(recall_turn).to_have_attribute("data-status", "completed")


def test_approve_a_tool_call(browser, console_node):
    new_session(console_node, "tools")
    page = open_page(browser, console_node, "#/sessions/tools")
    send(page, '/call echo {"text": "hi"}')
    card = page.get_by_role("article", name="Approval for echo")
    expect(card).to_contain_text('"text": "hi"')
    expect(turn(page, 0).locator("details.tool")).to_contain_text("running")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_have_count(0)
    done = turn(page, 0)
    expect(done).to_have_attribute("data-status", "completed")
    expect(done.locator(".turn-text")).to_have_text('echo returned {"text": "hi"}')
    tool = done.locator("details.tool")
    expect(tool.locator("summary")).to_contain_text("ok")
    tool.locator("summary").click()
    expect(tool.locator(".tool-result pre")).to_contain_text('"text": "hi"')
    expect(page.locator(".event-line", has_text="Approval approved by alice")).to_be_visible()


def test_pause_a_watcher_from_the_automations_view(browser, console_node):
    new_session(console_node, "watched")
    spec = {"tool": "clock.now", "params": {}, "interval": 60, "label": "clock"}
    with api(console_node) as http:
        created = http.post("/sessions/watched/watchers", json=spec)
        assert created.status_code == 201, created.text
        watcher_id = created.json()["watcher_id"]
    page = open_page(browser, console_node, "#/automations/watched")
    card = page.get_by_role("article", name="Watcher clock")
    expect(card.locator(".pill")).to_have_text("running")
    card.get_by_role("button", name="Pause clock").click()
    expect(card.locator(".pill")).to_have_text("paused")
    expect(card.get_by_role("button", name="Resume clock")).to_be_visible()
    with api(console_node) as http:
        assert http.get(f"/watchers/{watcher_id}").json()["status"] == "paused"
    card.get_by_role("button", name="History").click()
    expect(card.locator(".history ol.checks li")).to_have_count(1)


def test_pause_and_resume_a_job_from_the_automations_view(browser, console_node):
    new_session(console_node, "scheduled")
    arguments = {"cron": "every day at 9am", "prompt": "standup", "label": "standup"}
    with api(console_node) as http:
        sent = http.post(
            "/sessions/scheduled/messages",
            json={"content": "/call schedule_cron " + json.dumps(arguments)},
        )
        assert sent.status_code == 202, sent.text
    page = open_page(browser, console_node, "#/automations/scheduled")
    row = page.locator("tr[data-job]")
    expect(row).to_have_count(1, timeout=15_000)  # once the turn made it (a refresh later)
    job_id = row.get_attribute("data-job")
    expect(row.locator(".pill")).to_have_text("active")
    row.get_by_role("button", name=f"Pause {job_id}").click()
    expect(row.locator(".pill")).to_have_text("paused")
    with api(console_node) as http:
        assert http.get(f"/jobs/{job_id}").json()["job"]["state"] == "paused"
    row.get_by_role("button", name=f"Resume {job_id}").click()
    expect(row.locator(".pill")).to_have_text("active")
    expect(row.get_by_role("button", name=f"Pause {job_id}")).to_be_visible()
    assert page.errors == []


def test_reload_mid_stream_shows_no_gap_and_no_duplicate(browser, console_node):
    new_session(console_node, "reload")
    page = open_page(browser, console_node, "#/sessions/reload")
    send(page, LONGER)
    expect(turn(page, 0).locator(".turn-text")).to_contain_text("three")
    page.reload()
    expect(page.get_by_role("heading", name="reload")).to_be_visible()
    # the turn is still streaming after the reload: what came before it was replayed
    expect(page.locator(".session-status")).to_have_text("Running a turn")
    expect(turn(page, 0).locator(".turn-text")).not_to_have_text(f"You said: {LONGER}", timeout=0)
    expect(turn(page, 0)).to_have_attribute("data-status", "completed")
    # every word once, in order
    expect(turn(page, 0).locator(".turn-text")).to_have_text(f"You said: {LONGER}")
    expect(page.locator("article.turn")).to_have_count(1)


def test_a_dropped_connection_resumes_from_the_last_seq(browser, console_node):
    new_session(console_node, "drop")
    page = browser.new_context().new_page()
    sockets = []

    def proxy(ws) -> None:  # every WebSocket of the page goes through here to the node
        ws.connect_to_server()
        sockets.append(ws)

    page.route_web_socket(re.compile(r".*/ws\?.*"), proxy)
    page.goto(f"{console_node.console}#token={console_node.token}")
    page.goto(f"{console_node.console}#/sessions/drop")
    expect(page.locator("#link-state")).to_have_text("Live")
    send(page, LONG)
    text = turn(page, 0).locator(".turn-text")
    expect(text).to_contain_text("two")
    sockets[-1].close(code=1001, reason="network drop")
    expect(page.locator("#link-state")).to_have_text("Live")  # reconnected
    expect(turn(page, 0)).to_have_attribute("data-status", "completed")
    expect(text).to_have_text(f"You said: {LONG}")
    assert len(sockets) == 2
    seqs = page.evaluate(
        "() => [...document.querySelectorAll('.event-line')].map(e => e.dataset.seq)"
    )
    assert len(seqs) == len(set(seqs))


def test_deleting_a_session_with_jobs_shows_them_and_asks_again(browser, console_node):
    new_session(console_node, "cron")
    page = open_page(browser, console_node, "#/sessions/cron")
    send(page, '/call schedule_cron {"cron": "0 9 * * *", "prompt": "daily report"}')
    expect(turn(page, 0)).to_have_attribute("data-status", "completed")
    page.get_by_role("link", name="Sessions").click()
    page.get_by_role("button", name="Delete session cron").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Delete session cron?")
    dialog.get_by_role("button", name="Delete").click()
    expect(dialog).to_contain_text("cron has 1 scheduled job")
    expect(dialog).to_contain_text("daily report")
    dialog.get_by_role("button", name="Delete with its 1 job").click()
    expect(page.locator("tr[data-session=cron]")).to_have_count(0)
    with api(console_node) as http:
        assert http.get("/sessions/cron").status_code == 404


def test_the_sessions_list_reads_at_a_phone_width(browser, console_node):
    new_session(console_node, "phone")
    page = open_page(browser, console_node, viewport={"width": 390, "height": 800})
    row = page.locator("tr[data-session=phone]")
    expect(row).to_be_visible()
    delete = row.get_by_role("button", name="Delete session phone")
    delete.scroll_into_view_if_needed()
    box = delete.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    wide = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0  # nothing to scroll sideways
    page.get_by_role("link", name="phone").click()
    expect(page.get_by_label("Message", exact=True)).to_be_in_viewport()
    assert page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth") <= 0
