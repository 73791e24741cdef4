"""The shell module: real programs, no shell, bounded time and output."""

from __future__ import annotations

import json
import os
import sys

import pytest
import trio

from turnstile.tools.modules.filesystem import Sandbox
from turnstile.tools.modules.shell import POLICIES, ShellConfig, register_shell_module, run_command
from turnstile.tools.policy import Policy, PolicyTable
from turnstile.tools.registry import ToolRegistry

PY = sys.executable
#: a hang guard (real clock), not a promise: generous, so that a 2-core box at load 8 passes
WAIT = 60


def make_tools(root, **config):
    registry = ToolRegistry(PolicyTable({"shell.*": "AUTO"}))
    register_shell_module(registry, ShellConfig(**config), Sandbox(root))

    async def call(name, **arguments):
        return await registry.call("s", "ada", name, arguments)

    return call


@pytest.fixture
def call(tmp_path):
    return make_tools(tmp_path / "root")


async def test_runs_a_program(call):
    result = await call("shell.run", command=["echo", "hello", "world"])
    assert result.ok, result.error
    data = result.data
    assert (data["exit_code"], data["stdout"], data["stderr"]) == (0, "hello world\n", "")
    assert (data["timed_out"], data["stdout_truncated"], data["signal"]) == (False, False, None)
    assert data["cwd"] == "."
    failing = await call("shell.run", command=[PY, "-c", "import sys; sys.exit('bad')"])
    assert (failing.data["exit_code"], failing.data["stderr"]) == (1, "bad\n")


async def test_a_command_string_is_split_not_interpreted(call):
    result = await call("shell.run", command="echo $HOME; rm -rf / `id` | cat > x")
    assert result.ok, result.error
    assert result.data["argv"] == ["echo", "$HOME;", "rm", "-rf", "/", "`id`", "|", "cat", ">", "x"]
    assert result.data["stdout"] == "$HOME; rm -rf / `id` | cat > x\n"
    quoted = await call("shell.run", command=f"{PY} -c 'import sys; print(sys.argv[1:])' 'a b' c")
    assert quoted.data["stdout"] == "['a b', 'c']\n"
    unbalanced = await call("shell.run", command="echo 'oops")
    assert (unbalanced.error["code"], unbalanced.error["field"]) == ("invalid_argument", "command")


async def test_a_timeout_kills_the_whole_process_group(call, tmp_path):
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    started = trio.current_time()
    result = await call("shell.run", command=[PY, "-c", script], timeout=0.5)
    # far sooner than the script's 60 s; generous, for a loaded box (starting Python there
    # alone can take seconds)
    assert trio.current_time() - started < 20
    data = result.data
    assert (data["timed_out"], data["exit_code"], data["signal"]) == (True, -9, "SIGKILL")
    child = int(data["stdout"])  # the output so far is kept
    await _until_gone(child)


async def test_leftover_children_are_killed_when_the_program_exits(call):
    script = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid)\n"
    )
    result = await call("shell.run", command=[PY, "-c", script])
    assert (result.data["exit_code"], result.data["timed_out"]) == (0, False)
    await _until_gone(int(result.data["stdout"]))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return not f.read().split(") ", 1)[1].startswith("Z")  # a zombie is dead
    except FileNotFoundError:
        return False


def _real(path) -> str:
    return os.path.realpath(path)


async def _until_gone(pid: int) -> None:
    with trio.fail_after(WAIT):  # a killed process is gone at once on a quiet box
        while True:  # polling /proc: there is nothing to wait on for a process not ours
            if not _alive(pid):
                return
            await trio.sleep(0.01)


async def test_output_is_capped(tmp_path):
    call = make_tools(tmp_path / "root", max_output_bytes=1000)
    script = "import sys; sys.stdout.write('x' * 200000); sys.stderr.write('e' * 10)"
    result = await call("shell.run", command=[PY, "-c", script])
    data = result.data
    assert data["stdout"] == "x" * 1000
    assert (data["stdout_truncated"], data["stdout_bytes"]) == (True, 200000)
    assert (data["stderr"], data["stderr_truncated"]) == ("e" * 10, False)
    assert data["exit_code"] == 0  # drained, never blocked on a full pipe


async def test_cwd_stays_in_the_workspace(tmp_path):
    root = tmp_path / "root"
    call = make_tools(root)
    (root / "sub").mkdir()
    inside = await call("shell.run", command=[PY, "-c", "import os; print(os.getcwd())"], cwd="sub")
    assert inside.data["stdout"] == f"{_real(root / 'sub')}\n"
    assert inside.data["cwd"] == "sub"
    for cwd in ("..", "/tmp", "sub/../../x"):
        escape = await call("shell.run", command=["pwd"], cwd=cwd)
        assert (escape.error["code"], escape.error["field"]) == ("path_outside_root", "cwd")
    os.symlink(tmp_path, root / "up")
    via_link = await call("shell.run", command=["pwd"], cwd="up")
    assert via_link.error["code"] == "path_outside_root"
    missing = await call("shell.run", command=["pwd"], cwd="nope")
    assert (missing.error["code"], missing.error["field"]) == ("not_found", "cwd")


async def test_environment_is_an_allow_list(call, monkeypatch, tmp_path):
    monkeypatch.setenv("TURNSTILE_SECRET", "s3cret")
    show = "import os, json; print(json.dumps(dict(os.environ)))"
    result = await call("shell.run", command=[PY, "-c", show], env={"TZ": "UTC"})
    env = json.loads(result.data["stdout"])
    assert "TURNSTILE_SECRET" not in env
    assert env["TZ"] == "UTC"
    assert env["HOME"] == _real(tmp_path / "root")
    refused = await call("shell.run", command=["true"], env={"LD_PRELOAD": "/x.so"})
    assert (refused.error["code"], refused.error["field"]) == ("invalid_argument", "env")


async def test_stdin_and_unknown_commands(call):
    fed = await call("shell.run", command=["cat"], stdin="to cat")
    assert fed.data["stdout"] == "to cat"
    missing = await call("shell.run", command="no-such-program-xyz --flag")
    assert missing.error == {
        "code": "invalid_argument",
        "message": "command not found: 'no-such-program-xyz'",
        "field": "command",
    }
    too_long = await call("shell.run", command=["sleep", "1"], timeout=601)
    assert too_long.error["code"] == "bad_arguments"


async def test_run_command_is_reusable(tmp_path):
    result = await run_command(
        ["sh", "-c", "echo $0", "literal"],  # the caller may choose a shell; the tool never does
        cwd=str(tmp_path),
        env={"PATH": os.environ["PATH"]},
        timeout=5,
        max_output_bytes=100,
    )
    assert result["stdout"] == "literal\n"


async def test_policies_are_data(tmp_path):
    registry = ToolRegistry()
    register_shell_module(registry, ShellConfig(), Sandbox(tmp_path))
    assert POLICIES == {"shell.run": "BLOCK", "shell.read": "AUTO"}
    assert registry.policy_of("shell.run") is Policy.BLOCK
    assert registry.policy_of("shell.read") is Policy.AUTO
    blocked = await registry.call("s", "ada", "shell.run", {"command": ["true"]})
    assert blocked.error["code"] == "blocked"
