"""``turnstile sessions``, ``jobs`` and ``watchers`` against a live node: the CLI's ``main()``
(in a worker thread: each command runs its own ``trio.run`` on ``turnstile.client``) talks to a
real gateway on loopback with a user's token. Tables for people, the node's JSON with
``--json``; every command exits 0 done, 2 for a wrong command line or a request the node
refused (with the node's own message), 1 when the node cannot be reached or fails. ``attach``
agrees, run as a person runs it."""

from __future__ import annotations

import argparse
import io
import json
import socket
import subprocess
import sys

import httpx
import pytest
import trio

from tests.support.node import ALICE, BOB, connect, new_session, running_node
from turnstile.actors.cli import main
from turnstile.client.commands.jobs import run_jobs

#: a hang guard (real clock), not a promise: generous, so that a 2-core box at load 8 passes
WAIT = 60


class Cli:
    """Runs ``turnstile <argv>`` as a user of ``url``; keeps what it printed."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture) -> None:
        self.url = url
        self.capsys = capsys

    async def __call__(self, *argv: str, token: str | None = ALICE) -> tuple[int, str, str]:
        args = [*argv, "--url", self.url]
        if token is not None:
            args += ["--token", token]
        self.capsys.readouterr()
        code = await trio.to_thread.run_sync(main, args)
        out, err = self.capsys.readouterr()
        return code, out, err


async def schedule_cron(node, session: str, prompt: str) -> str:
    async with connect(node) as client:
        arguments = {"cron": "every day at 9am", "timezone": "Europe/Paris", "prompt": prompt}
        await client.send(
            type="call", id="c", session_id=session, tool="schedule_cron", arguments=arguments
        )
        result = await client.expect("result", id="c")
        assert result["ok"] is True, result
        return result["data"]["job_id"]


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv("TURNSTILE_TOKEN", raising=False)
    monkeypatch.delenv("TURNSTILE_DEV_TOKEN", raising=False)


async def test_jobs_list_show_and_cancel(tmp_path, capsys):
    async with running_node(tmp_path) as node:
        for name in ("ops", "reports"):
            await new_session(node, name)
        ops = await schedule_cron(node, "ops", "daily report")
        reports = await schedule_cron(node, "reports", "weekly digest")
        cli = Cli(node.url, capsys)

        code, out, err = await cli("jobs")
        assert (code, err) == (0, "")
        header, *rows = out.splitlines()
        assert header.split() == [
            "JOB", "SESSION", "KIND", "STATE", "SCHEDULE", "NEXT", "RUN", "RUNS", "LABEL",
        ]  # fmt: skip
        assert [row.split()[:4] for row in rows] == [
            [ops, "ops", "cron", "active"],
            [reports, "reports", "cron", "active"],
        ]
        assert "cron 0 9 * * * Europe/Paris" in rows[0] and rows[0].endswith("daily report")

        code, out, _ = await cli("jobs", "--session", "reports", "--json")
        async with node.http() as http:
            expected = (await http.get("/jobs", params={"session": "reports"})).json()
        assert code == 0 and json.loads(out) == expected
        assert [job["id"] for job in expected["jobs"]] == [reports]

        code, out, _ = await cli("jobs", "show", ops)
        assert code == 0
        assert out.splitlines()[1].split()[:4] == [ops, "ops", "cron", "active"]
        assert out.splitlines()[-1] == "no runs yet"

        code, out, _ = await cli("jobs", "cancel", ops)
        assert (code, out) == (0, f"job {ops} is cancelled\n")
        code, out, _ = await cli("jobs", "--state", "active", "--json")
        assert [job["id"] for job in json.loads(out)["jobs"]] == [reports]
        code, out, _ = await cli("jobs", "show", ops, "--json")
        assert json.loads(out)["job"]["state"] == "cancelled"

        # refused by the node: 2, with its message
        code, out, err = await cli("jobs", "cancel", reports, token=BOB)
        assert (code, out) == (2, "")
        assert err == f"turnstile jobs cancel: 404 not_found: no job with id {reports!r}\n"
        code, _, err = await cli("jobs", "--session", "nope")
        assert code == 2 and err.startswith("turnstile jobs list: 404 not_found: ")
        code, _, err = await cli("jobs", token="not-a-token-of-anyone")
        assert (code, err) == (2, "turnstile jobs list: 401 unauthorized: invalid token\n")
        code, _, err = await cli("jobs", token=None)
        assert (code, err) == (2, "turnstile jobs: give --token or set TURNSTILE_TOKEN\n")
        assert (await cli("jobs", token=BOB))[1] == "no jobs\n"


async def test_watchers_list_show_pause_resume_stop(tmp_path, capsys):
    async with running_node(tmp_path) as node:
        await new_session(node, "w")
        spec = {"tool": "echo", "params": {"text": "steady"}, "interval": 3600, "label": "echo"}
        async with connect(node) as client, node.http() as http:
            await client.send(type="attach", session_id="w")
            await client.expect("session_sync")
            made = await http.post("/sessions/w/watchers", json=spec)
            assert made.status_code == 201, made.text
            wid = made.json()["watcher_id"]
            # its first check (the baseline) runs at once and escalates
            await client.expect("watcher_update", watcher_id=wid, what="escalated")
        cli = Cli(node.url, capsys)

        code, out, _ = await cli("watchers")
        lines = out.splitlines()
        assert code == 0 and lines[0].split()[:4] == ["WATCHER", "SESSION", "TOOL", "STATUS"]
        assert lines[1].split()[:6] == [wid, "w", "echo", "running", "3600s", "on_change"]
        assert lines[-1] == "1 running, 0 paused"

        code, out, _ = await cli("watchers", "pause", wid)
        assert (code, out) == (0, f"watcher {wid} is paused\n")
        code, out, _ = await cli("watchers", "--session", "w", "--json")
        listed = json.loads(out)
        assert (listed["total"], listed["running"], listed["paused"]) == (1, 0, 1)
        code, out, _ = await cli("watchers", "resume", wid)
        assert (code, out) == (0, f"watcher {wid} is running\n")

        code, out, _ = await cli("watchers", "show", wid)
        checks = out.split("\n\n")[1].splitlines()
        assert checks[0].split() == ["CHECK", "AT", "OUTCOME", "ESCALATED", "RESULT"]
        assert checks[1].split()[0] == "1" and "ok" in checks[1].split()

        code, out, _ = await cli("watchers", "stop", wid, "--json")
        assert code == 0 and json.loads(out)["status"] == "stopped"
        code, out, err = await cli("watchers", "show", wid)
        assert (code, out) == (2, "")
        assert err.startswith("turnstile watchers show: 404 not_found: ")
        assert (await cli("watchers"))[1] == "no watchers\n"


async def test_sessions_table_and_json(tmp_path, capsys):
    async with running_node(tmp_path) as node:
        await new_session(node, "alpha")
        await new_session(node, "beta", policy="reject")
        cli = Cli(node.url, capsys)
        code, out, _ = await cli("sessions")
        header, *rows = out.splitlines()
        assert code == 0 and header.split()[:4] == ["SESSION", "STATUS", "QUEUED", "POLICY"]
        assert [row.split()[:4] for row in rows] == [
            ["alpha", "idle", "0", "enqueue"],
            ["beta", "idle", "0", "reject"],
        ]
        code, out, _ = await cli("sessions", "--json")
        assert [s["id"] for s in json.loads(out)["sessions"]] == ["alpha", "beta"]
        assert (await cli("sessions", token=BOB))[1] == "no sessions\n"


async def test_a_command_line_mistake_exits_2_before_any_request(capsys):
    for argv in (["jobs", "show"], ["jobs", "list", "j1"], ["watchers", "pause"],
                 ["watchers", "show", "w1", "--session", "s"], ["jobs", "frobnicate"]):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            await trio.to_thread.run_sync(main, [*argv, "--token", ALICE])
        assert exited.value.code == 2, argv
    assert "needs the job's id" in capsys.readouterr().err


async def test_an_unreachable_node_exits_1(capsys):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    for argv in (["sessions"], ["jobs"], ["watchers", "stop", "w1"]):
        code, out, err = await Cli(url, capsys)(*argv)
        assert (code, out) == (1, ""), argv
        assert err.endswith(f"cannot reach the node at {url}: connection refused\n")


def test_a_node_that_fails_exits_1_and_one_that_refuses_exits_2():
    """The mapping of the client's errors to exit statuses, on answers a healthy node does not
    give (a 500, a proxy's page without the node's error body)."""

    def answer(status: int, **body) -> httpx.MockTransport:
        return httpx.MockTransport(lambda request: httpx.Response(status, **body))

    error = {"json": {"error": {"code": "internal", "message": "internal error"}}}
    cases = [
        (answer(500, **error), 1, "500 internal: internal error"),
        (answer(503, **error), 1, "503 internal: internal error"),
        (answer(400, **error), 2, "400 internal: internal error"),
        (answer(429, **error), 2, "429 internal: internal error"),
        (answer(502), 1, "502 Bad Gateway"),
        (answer(502, text="<html>upstream gone</html>"), 1, "502 <html>upstream gone</html>"),
    ]
    args = argparse.Namespace(url="http://node", action="list", session=None, state=None)
    args.json = False
    for transport, exit_status, message in cases:
        out, err = io.StringIO(), io.StringIO()
        code = run_jobs(args, "t", out=out, err=err, transport=transport)
        assert (code, out.getvalue()) == (exit_status, "")
        assert err.getvalue() == f"turnstile jobs list: {message}\n"


async def test_attach_exits_2_when_refused_and_1_when_the_node_is_gone(tmp_path):
    async def attach(url: str, *args: str) -> tuple[int, bytes]:
        """``turnstile attach`` as a person runs it, its input left open: it must not wait
        for a line to say it was refused."""
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "turnstile.actors.cli", "attach", *args, "--url", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            with trio.fail_after(WAIT):
                code = await process.wait()
                return code, await process.stderr.receive_some()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()

    async with running_node(tmp_path) as node:
        await new_session(node, "mine", token=BOB)
        code, err = await attach(node.url, "mine", "--token", ALICE)  # Bob's: not found
        assert code == 2 and err.startswith(b"turnstile attach: not_found: "), err
        code, err = await attach(node.url, "x", "--token", "not-a-token-of-anyone")
        assert code == 2, err
    code, err = await attach(node.url, "x", "--token", ALICE)
    assert code == 1 and b"cannot reach the node" in err, err
