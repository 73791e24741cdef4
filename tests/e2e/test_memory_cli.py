"""``turnstile memory`` against a live node: the CLI's ``main()`` (in a worker thread: each
command runs its own ``trio.run`` on ``turnstile.client``) talks to a real gateway on loopback
with a user's token, and prints tables, or the node's JSON with ``--json``; refusals exit 2
with the node's own message. ``watch`` also runs as a subprocess, as a person runs it, to see a
change arrive live, and through a TCP proxy that cuts its connection."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from urllib.parse import urlsplit

import pytest
import trio

from tests.e2e.test_cli import WAIT, read_until
from tests.support.node import ALICE, BOB, new_session, running_node
from tests.support.tcpproxy import open_tcp_proxy
from turnstile.actors.cli import main
from turnstile.actors.config import MemoryConfig


class Cli:
    """Runs ``turnstile memory …`` as a user of ``url``; keeps what it printed."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture) -> None:
        self.url = url
        self.capsys = capsys

    async def __call__(
        self, *argv: str, token: str | None = ALICE, stdin: str | None = None
    ) -> tuple[int, str, str]:
        args = ["memory", *argv, "--url", self.url]
        if token is not None:
            args += ["--token", token]

        def run() -> int:
            saved = sys.stdin
            if stdin is not None:
                sys.stdin = io.StringIO(stdin)
            try:
                return main(args)
            finally:
                sys.stdin = saved

        self.capsys.readouterr()
        code = await trio.to_thread.run_sync(run)
        out, err = self.capsys.readouterr()
        return code, out, err


async def test_put_list_search_forget_and_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TURNSTILE_TOKEN", raising=False)
    async with running_node(tmp_path) as node:
        cli = Cli(node.url, capsys)
        code, out, _ = await cli("put", "preferences", "coffee", "dark roast, no sugar")
        assert code == 0
        assert out == (
            "saved preferences / coffee: dark roast, no sugar (confidence 90, user_explicit)\n"
        )
        code, out, _ = await cli(
            "put", "home", "city", "Porto", "--confidence", "60", "--source", "conversation"
        )
        assert code == 0 and "(confidence 60, conversation)" in out
        code, out, _ = await cli("put", "home", "trip", "Lisbon", "--expires-days", "3", "--json")
        saved = json.loads(out)["fact"]
        assert (saved["key"], saved["value"], saved["source"]) == (
            "trip",
            "Lisbon",
            "user_explicit",
        )
        assert saved["expires_at"] is not None

        code, out, _ = await cli("list", "--sort", "key", "--order", "asc")
        lines = out.splitlines()
        assert code == 0
        assert lines[0].split() == ["CATEGORY", "KEY", "VALUE", "CONF", "SOURCE", "UPDATED"]
        assert [line.split()[1] for line in lines[1:-1]] == ["city", "coffee", "trip"]
        assert "dark roast, no sugar" in lines[2] and " 90 " in lines[2]
        assert lines[-1] == "facts 1-3 of 3"
        code, out, _ = await cli("list", "--category", "home", "--limit", "1", "--sort", "key")
        assert out.splitlines()[1].split()[:3] == ["home", "trip", "Lisbon"]
        assert out.splitlines()[-1] == "facts 1-1 of 2; next page: --offset 1"
        code, out, _ = await cli("list", "--search", "ROAST", "--json")
        page = json.loads(out)
        assert page["total"] == 1 and page["facts"][0]["key"] == "coffee"

        code, out, _ = await cli("search", "roast")
        assert code == 0 and out.splitlines()[1].split()[:2] == ["preferences", "coffee"]
        code, out, _ = await cli("search", "nothing like it")
        assert (code, out) == (0, "no facts found\n")
        # bob's memory is his own
        code, out, _ = await cli("list", token=BOB)
        assert (code, out) == (0, "no facts\n")

        code, out, _ = await cli("forget", "city", "--category", "home")
        assert (code, out) == (0, "forgot 1 fact\n")
        code, out, _ = await cli("list", "--category", "home", "--json")
        assert [f["key"] for f in json.loads(out)["facts"]] == ["trip"]

        code, out, _ = await cli("summary")
        assert (code, out) == (0, "no summary\n")
        code, out, _ = await cli("summary", "--set", "Likes dark roast.")
        assert (code, out) == (0, "summary saved (17 characters)\n")
        code, out, _ = await cli("summary", "--set", "-", stdin="Line one.\nLine two.\n")
        assert code == 0
        code, out, _ = await cli("summary")
        assert out == "Line one.\nLine two.\n\n"
        code, out, _ = await cli("summary", "--json")
        assert json.loads(out)["summary"] == "Line one.\nLine two.\n"
        code, out, _ = await cli("summary", token=BOB)
        assert out == "no summary\n"

        code, _, err = await cli("delete-all")
        assert code == 2 and "add --yes" in err
        code, out, _ = await cli("delete-all", "--yes")
        assert (code, out) == (0, "deleted 2 facts, 1 summary, 0 session extraction states\n")
        assert await cli("list") == (0, "no facts\n", "")


async def test_refusals_exit_2_with_the_nodes_message(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TURNSTILE_TOKEN", raising=False)
    monkeypatch.delenv("TURNSTILE_DEV_TOKEN", raising=False)
    async with running_node(tmp_path) as node:
        cli = Cli(node.url, capsys)
        code, out, err = await cli("list", token="not-a-token-of-anyone")
        assert (code, out) == (2, "")
        assert err == "turnstile memory list: 401 unauthorized: invalid token\n"
        code, _, err = await cli("forget", "nothing")
        assert code == 2
        assert err == "turnstile memory forget: 404 not_found: no fact with key 'nothing'\n"
        code, _, err = await cli("put", "c", "k", "v", "--confidence", "101")
        assert code == 2 and err.startswith("turnstile memory put: 400 bad_message: ")
        assert err.endswith("(field $.confidence)\n")
        code, _, err = await cli("list", "--all-users")
        assert code == 2 and err == (
            "turnstile memory list: 403 forbidden: all_users needs the memory.read_all"
            " permission (field all_users)\n"
        )
        code, _, err = await cli("list", "--limit", "0")
        assert code == 2 and "(field limit)" in err
        code, _, err = await cli("list", token=None)
        assert (code, err) == (2, "turnstile memory: give --token or set TURNSTILE_TOKEN\n")

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for command in ("list", "watch"):
        code, out, err = await Cli(f"http://127.0.0.1:{port}", capsys)(command)
        assert (code, out) == (1, "")
        assert err == (
            f"turnstile memory {command}: cannot reach the node at http://127.0.0.1:{port}:"
            " connection refused\n"
        )


async def test_extraction_and_admins_across_users(tmp_path, capsys):
    async with running_node(tmp_path, memory=MemoryConfig(admins=["alice"])) as node:
        cli = Cli(node.url, capsys)
        await new_session(node, "one")
        await new_session(node, "two")
        await new_session(node, "main", token=BOB)
        code, out, _ = await cli("extraction")
        lines = out.splitlines()
        assert code == 0
        assert lines[0] == (
            "extraction off: no model server (a model-less agent and no [openai] base_url)"
        )
        assert lines[1].split() == [
            "SESSION",
            "STATE",
            "LAST",
            "ACTIVITY",
            "EXTRACTED",
            "DUE",
            "AT",
        ]
        assert [line.split()[:2] for line in lines[2:]] == [["one", "waiting"], ["two", "waiting"]]
        code, out, _ = await cli("extraction", "--limit", "1")
        assert out.splitlines()[-1] == "next page: --after one"
        code, out, _ = await cli("extraction", "--after", "one", "--json")
        assert [s["id"] for s in json.loads(out)["sessions"]] == ["two"]
        code, out, _ = await cli("extraction", "--due")
        assert out.splitlines()[-1] == "no sessions"
        code, out, _ = await cli("extraction", "--all-users")
        assert [line.split()[:2] for line in out.splitlines()[2:]] == [
            ["alice", "one"],
            ["alice", "two"],
            ["bob", "main"],
        ]
        code, _, err = await cli("extraction", "--all-users", token=BOB)
        assert code == 2 and "403 forbidden" in err

        assert (await cli("put", "drinks", "coffee", "black", token=BOB))[0] == 0
        assert (await cli("put", "drinks", "tea", "green"))[0] == 0
        code, out, _ = await cli("list", "--all-users", "--sort", "value")
        lines = out.splitlines()
        assert lines[0].split()[:2] == ["OWNER", "CATEGORY"]
        assert [line.split()[:3] for line in lines[1:-1]] == [
            ["alice", "drinks", "tea"],
            ["bob", "drinks", "coffee"],
        ]


async def test_changes_and_watch_follow_the_users_memory(tmp_path, capsys):
    async with running_node(tmp_path) as node:
        cli = Cli(node.url, capsys)
        assert (await cli("put", "drinks", "coffee", "dark roast"))[0] == 0
        assert (await cli("summary", "--set", "Likes coffee."))[0] == 0
        code, out, _ = await cli("changes")
        lines = out.splitlines()
        assert code == 0 and len(lines) == 2
        assert lines[0].startswith("#1 ") and lines[0].endswith(
            " saved drinks / coffee: dark roast (new, confidence 90)"
        )
        assert lines[1].startswith("#2 ") and lines[1].endswith(" summary changed (13 characters)")
        code, out, _ = await cli("changes", "--after-seq", "1", "--json")
        assert [c["type"] for c in json.loads(out)["changes"]] == ["summary_changed"]
        code, out, _ = await cli("changes", "--limit", "1")
        assert out.splitlines()[-1] == "more: --after-seq 1"
        code, out, _ = await cli("changes", "--after-seq", "2")
        assert out == "no changes after 2 (latest #2)\n"
        code, out, _ = await cli("changes", "--after-seq", "9")  # more than there is
        assert out.startswith("the log no longer holds every change after 9: reload")
        code, out, _ = await cli("changes", token=BOB)
        assert out == "no changes after 0 (latest #0)\n"

        # watch: the kept changes after a point, then stop after --count
        code, out, _ = await cli("watch", "--after-seq", "0", "--count", "2")
        lines = out.splitlines()
        assert code == 0 and lines[0] == "watching memory changes after #2"
        assert [line.split()[0] for line in lines[1:]] == ["#1", "#2"]
        code, out, _ = await cli("watch", "--after-seq", "1", "--count", "1", "--json")
        assert json.loads(out)["type"] == "summary_changed"
        code, out, err = await cli("watch", "--count", "1", token="not-a-token-of-anyone")
        assert (code, err) == (2, "turnstile memory watch: unauthorized: invalid token\n")

        # live, as a person runs it: a change made elsewhere shows up as it happens
        process = await trio.lowlevel.open_process(
            [
                *(sys.executable, "-m", "turnstile.actors.cli", "memory", "watch"),
                *("--count", "1", "--url", node.url, "--token", ALICE),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out = bytearray()
        try:
            await read_until(process.stdout, b"watching memory changes after #2\n", out)
            async with node.http(ALICE) as http:
                gone = await http.request("DELETE", "/memory/facts", params={"key": "coffee"})
                assert gone.status_code == 200
            await read_until(process.stdout, b"forgot drinks / coffee\n", out)
            with trio.fail_after(WAIT):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert b"#3 " in out


async def watch(url: str, *args: str) -> trio.Process:
    """``turnstile memory watch`` as a person runs it, its output piped."""
    return await trio.lowlevel.open_process(
        [
            *(sys.executable, "-m", "turnstile.actors.cli", "memory", "watch", *args),
            *("--url", url, "--token", ALICE),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def ended(process: trio.Process) -> int:
    with trio.fail_after(WAIT):
        return await process.wait()


async def test_watch_prints_the_frames_the_node_sent(tmp_path, capsys):
    async with running_node(tmp_path) as node, node.http(ALICE) as http:
        cli = Cli(node.url, capsys)
        assert (await cli("put", "drinks", "coffee", "dark roast"))[0] == 0
        assert (await cli("summary", "--set", "Likes coffee."))[0] == 0
        code, out, _ = await cli("watch", "--after-seq", "0", "--count", "2", "--json")
        frames = (await http.get("/memory/changes")).json()["changes"]
        assert code == 0 and len(frames) == 2
        assert out.splitlines() == [json.dumps(f, ensure_ascii=False) for f in frames]


async def test_watch_goes_on_after_its_connection_drops_and_says_a_reset(tmp_path):
    async with (
        running_node(tmp_path) as node,
        open_tcp_proxy("127.0.0.1", urlsplit(node.url).port or 80) as proxy,
        node.http(ALICE) as http,
    ):
        await http.put("/memory/facts", json={"category": "drinks", "key": "tea", "value": "x"})
        process = await watch(f"http://127.0.0.1:{proxy.port}", "--count", "2")
        out = bytearray()
        try:
            await read_until(process.stdout, b"watching memory changes after #1\n", out)
            await proxy.cut()  # the watch's connection is reset; a new one is refused
            food = {"category": "food", "key": "lunch", "value": "soup"}
            assert (await http.put("/memory/facts", json=food)).status_code == 200
            assert (await http.put("/memory/summary", json={"content": "eats"})).status_code == 200
            proxy.heal()  # it connects again and reads what it missed, once
            assert await ended(process) == 0
            assert proxy.statistics().accepted >= 2
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        while chunk := await process.stdout.receive_some():  # the rest, to the end
            out += chunk
        lines = bytes(out).decode().splitlines()
        assert lines[0] == "watching memory changes after #1"
        assert [line.split(" ", 3)[0] for line in lines[1:]] == ["#2", "#3"]
        assert lines[1].endswith(" saved food / lunch: soup (new, confidence 90)")
        assert lines[2].endswith(" summary changed (4 characters)")

        # after more than the log holds: the first line says so, then what comes live
        process = await watch(node.url, "--after-seq", "99", "--count", "1")
        out = bytearray()
        try:
            first = b"after #3 (reset: reload, the log no longer holds it all)\n"
            await read_until(process.stdout, first, out)
            assert (await http.delete("/memory/facts", params={"key": "lunch"})).status_code == 200
            await read_until(process.stdout, b"forgot food / lunch\n", out)
            assert await ended(process) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert bytes(out).startswith(b"watching memory changes after #3 (reset")
