"""``mcp-server-fetch`` through the node's guard proxy, and ``mcp-server-git`` on a throw-away
repository: two more real MCP servers nobody here wrote, over stdio."""

from __future__ import annotations

import subprocess

from tests.actors.mcp.conftest import installed, mcp_node, mcp_server, session_key
from turnstile.actors.mcp import McpServerConfig
from turnstile.tools.policy import Policy


def fetch_server() -> dict[str, McpServerConfig]:
    # its own private-address check is turned off, so that what refuses is the node's guard
    command = [installed("mcp-server-fetch"), "--ignore-robots-txt", "--allow-private-ips"]
    return {"fetch": McpServerConfig(command=command)}


async def test_fetches_go_through_the_guard_which_refuses_loopback(tmp_path, site):
    async with mcp_node(tmp_path, fetch_server()) as node:
        key = await session_key(node)
        # read-only by its annotations: AUTO, so the guard is what stands in the way
        assert node.tools.policy_of("fetch.fetch") is Policy.AUTO
        result = await node.tools.call(key, "alice", "fetch.fetch", {"url": f"{site}/text"})
        assert result.ok is False and result.error["code"] == "tool_error"
        assert "403" in result.error["message"]
        proxy = node.features["mcp"].proxy
        assert proxy.refused[-1] == (
            "127.0.0.1",
            "refusing 127.0.0.1 (loopback address) for host '127.0.0.1'",
        )


async def test_a_destination_the_config_allows_is_fetched_and_a_redirect_out_of_it_is_not(
    tmp_path, site
):
    port = site.rsplit(":", 1)[1]
    mcp = {"allowed_hosts": ["localhost"]}  # by name: its addresses, not 127.0.0.2's
    async with mcp_node(tmp_path, fetch_server(), mcp=mcp) as node:
        key = await session_key(node)
        url = f"http://localhost:{port}/text"
        result = await node.tools.call(key, "alice", "fetch.fetch", {"url": url})
        assert result.ok, result.error
        assert "hello" in result.data["text"]
        hop = f"http://localhost:{port}/redirect?to=http://127.0.0.2:{port}/text"
        redirected = await node.tools.call(key, "alice", "fetch.fetch", {"url": hop}, approved=True)
        assert redirected.error["code"] == "tool_error"
        proxy = node.features["mcp"].proxy
        assert proxy.refused[-1][0] == "127.0.0.2"


def git(repo, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1"}
    identity = ["-c", "user.name=Ada", "-c", "user.email=ada@example.com"]
    done = subprocess.run(
        ["git", *identity, *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    )
    return done.stdout


async def test_git_on_a_throw_away_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "notes.txt").write_text("one\n")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-q", "-m", "first note")
    server = McpServerConfig(
        command=[installed("mcp-server-git"), "--repository", str(repo)],
        inherit_env=["PATH"],  # GitPython runs the git program
        env={
            "HOME": str(tmp_path),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "Turnstile",
            "GIT_AUTHOR_EMAIL": "turnstile@example.com",
            "GIT_COMMITTER_NAME": "Turnstile",
            "GIT_COMMITTER_EMAIL": "turnstile@example.com",
        },
        egress="none",
    )
    async with mcp_node(tmp_path, {"git": server}, policies={"git.git_add": "AUTO"}) as node:
        key = await session_key(node)
        assert node.tools.policy_of("git.git_status") is Policy.AUTO
        assert node.tools.policy_of("git.git_commit") is Policy.APPROVE
        log = await node.tools.call(key, "alice", "git.git_log", {"repo_path": str(repo)})
        assert "first note" in log.data["text"]
        (repo / "notes.txt").write_text("one\ntwo\n")
        diff = await node.tools.call(
            key, "alice", "git.git_diff_unstaged", {"repo_path": str(repo)}
        )
        assert "+two" in diff.data["text"]
        added = await node.tools.call(
            key, "alice", "git.git_add", {"repo_path": str(repo), "files": ["notes.txt"]}
        )
        assert added.ok, added.error
        # a write waits for a person: not asked here, refused as such
        unasked = await node.tools.call(
            key,
            "alice",
            "git.git_commit",
            {"repo_path": str(repo), "message": "second note"},
            ask_approval=False,
        )
        assert unasked.error["code"] == "requires_approval"
        committed = await node.tools.call(
            key,
            "alice",
            "git.git_commit",
            {"repo_path": str(repo), "message": "second note"},
            approved=True,
        )
        assert committed.ok, committed.error
        assert git(repo, "log", "--format=%s").splitlines() == ["second note", "first note"]
        # the server's own jail: a path outside its repository is its tool's error
        outside = await node.tools.call(key, "alice", "git.git_status", {"repo_path": "/"})
        assert outside.error["code"] == "tool_error"
        assert "outside the allowed repository" in outside.error["message"]
        assert mcp_server(node, "git").starts == 1
