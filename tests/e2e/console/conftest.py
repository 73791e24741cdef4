"""Fixtures of the console's browser tests: a real node (``turnstile serve`` in a subprocess,
the scripted agent streaming slowly enough to watch) and Debian's Chromium driven by Playwright
for Python, one browser per module.

Chromium is found as ``scripts/ensure-chromium.sh`` leaves it (``TURNSTILE_CHROMIUM``, else
``chromium`` on the PATH) and launched by its path: Playwright's own browser download is never
used. Without it the browser tests skip with the reason, except under ``CI=true``, where that is
a failure (``scripts/test.sh`` installs it first).

The tests are plain (not trio) functions: Playwright's sync API runs its own loop, and the node
is another process, so nothing here blocks a trio loop. They wait with Playwright's
auto-waiting assertions, never with sleeps.
"""

from __future__ import annotations

# Only to give Playwright a plain asyncio loop (see ``plain_asyncio``); nothing here runs on it.
import asyncio  # noqa: TID251
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.conftest import IN_CI

TOKEN = "alice-console-token-0123456789"
#: Seconds per streamed word: a 20-word answer takes about 1.6 s, long enough to watch.
TOKEN_DELAY = 0.08
CONFIG = f"""
agent = "scripted"
policies = {{ "echo" = "APPROVE" }}

[scripted]
token_delay = {TOKEN_DELAY}

[[users]]
name = "alice"
token = "{TOKEN}"
"""


def chromium_path() -> str | None:
    """Debian's chromium as ``scripts/ensure-chromium.sh`` leaves it, or None."""
    named = os.environ.get("TURNSTILE_CHROMIUM")
    if named and os.access(named, os.X_OK):
        return named
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class ConsoleNode:
    """A node serving the console: its address and the user's token."""

    url: str
    token: str = TOKEN

    @property
    def console(self) -> str:
        return f"{self.url}/console"


def serve(directory: Path, config_text: str = CONFIG) -> tuple[subprocess.Popen, str]:
    """``turnstile serve`` with ``config_text`` on a fresh SQLite file in ``directory``;
    returns the process and its URL once it says where it serves."""
    config = directory / "node.toml"
    config.write_text(config_text)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "turnstile.actors.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            "0",
            "--store",
            f"sqlite:///{directory}/node.db",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    seen = b""
    while b"serving on " not in seen:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, left))
        chunk = os.read(process.stdout.fileno(), 4096) if ready else b""
        if not chunk:
            process.kill()
            raise RuntimeError(f"turnstile serve did not start: {seen!r}")
        seen += chunk
    return process, seen.split(b"serving on ")[1].split()[0].decode()


@pytest.fixture(scope="module")
def console_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleNode]:
    process, url = serve(tmp_path_factory.mktemp("console-node"))
    try:
        yield ConsoleNode(url)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def plain_asyncio() -> Iterator[None]:
    """A default asyncio event loop policy for this thread while the block runs.

    Playwright's sync API makes its own loop with ``asyncio.new_event_loop()``. Once
    trio-asyncio is imported (the PostgreSQL backend imports it), that call makes a trio-asyncio
    loop, which cannot host Playwright's driver, and a suite that ran a PostgreSQL test first
    failed here and left the broken loop behind for every test after. trio-asyncio honours a
    policy set for the thread, so this one is set for the browser's lifetime and dropped after.
    """
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(None)


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        why = "no chromium (scripts/ensure-chromium.sh installs Debian's)"
        if IN_CI:
            pytest.fail(f"{why}; CI=true requires the console's browser tests to run")
        pytest.skip(why)
    expect.set_options(timeout=10_000)
    with plain_asyncio(), sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path)
        try:
            yield launched
        finally:
            launched.close()
