"""``shell.read``: the read-only shell commands of the heartbeat profile. An allowlist of
programs, each with the options it may take; path operands inside the workspace; no shell;
anything else refused before it runs, saying what is allowed. Real programs for the runs."""

from __future__ import annotations

import os
import stat

import pytest

from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.modules.filesystem import Sandbox
from turnstile.tools.modules.shell import ShellConfig, register_shell_module
from turnstile.tools.modules.shell_read import (
    READ_COMMANDS,
    CommandNotAllowed,
    check_read_command,
    find_program,
)
from turnstile.tools.registry import ToolRegistry

COMMANDS = ", ".join(sorted(READ_COMMANDS))
LS = "-l, -a, -A, -h, -t, -r, -R, -1, -S, -d, -F, -i, -n"
GREP = (
    "-i, -n, -r, -l, -L, -c, -v, -E, -F, -w, -x, -H, -h, -o, -s, -I, -q, --color=never, "
    "--exclude, --exclude-dir, --include, -A, -B, -C, -e, -m"
)


def not_listed(program: str) -> str:
    return (
        f"shell.read runs only these read-only commands: {COMMANDS}; {program!r} is not one of them"
    )


@pytest.fixture
def root(tmp_path):
    top = tmp_path / "root"
    (top / "logs").mkdir(parents=True)
    (top / "logs" / "app.log").write_text("ok\nERROR disk full\nok\n")
    (top / "notes.txt").write_text("hello\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    return top


def resolved(root, rel: str) -> str:
    return os.path.realpath(os.path.join(root, rel))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["ls"], ["ls"]),
        (["ls", "-la", "logs"], ["ls", "-la", "@logs"]),
        (["cat", "notes.txt"], ["cat", "@notes.txt"]),
        (["head", "-n", "5", "logs/app.log"], ["head", "-n", "5", "@logs/app.log"]),
        (["tail", "-n", "-2", "logs/app.log"], ["tail", "-n", "-2", "@logs/app.log"]),
        (["wc", "-l", "notes.txt"], ["wc", "-l", "@notes.txt"]),
        (["grep", "-in", "error", "logs"], ["grep", "-in", "error", "@logs"]),
        (["grep", "-e", "-x", "notes.txt"], ["grep", "-e", "-x", "@notes.txt"]),
        (["grep", "-r", "--include=*.log", "ERR"], ["grep", "-r", "--include=*.log", "ERR"]),
        (
            ["find", "logs", "-name", "*.log", "-type", "f", "-mtime", "-1"],
            ["find", "@logs", "-name", "*.log", "-type", "f", "-mtime", "-1"],
        ),
        (["find", "-maxdepth", "1"], ["find", "-maxdepth", "1"]),
        (["du", "-sh", "logs"], ["du", "-sh", "@logs"]),
        (["df", "-h"], ["df", "-h"]),
        (["date", "-u", "+%Y-%m-%d"], ["date", "-u", "+%Y-%m-%d"]),
        (["stat", "-c", "%s %y", "notes.txt"], ["stat", "-c", "%s %y", "@notes.txt"]),
        (["uname", "-a"], ["uname", "-a"]),
        (["ps", "aux"], ["ps", "aux"]),
        (["uptime"], ["uptime"]),
        (["free", "-h"], ["free", "-h"]),
    ],
)
def test_allowed_commands_get_their_paths_resolved(root, argv, expected):
    want = [resolved(root, a[1:]) if a.startswith("@") else a for a in expected]
    assert check_read_command(argv, Sandbox(root)) == want


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["rm", "-rf", "logs"],
            not_listed("rm"),
        ),
        (
            ["/bin/ls"],
            not_listed("/bin/ls"),
        ),
        (
            ["sh", "-c", "ls"],
            not_listed("sh"),
        ),
        (
            ["git", "status"],
            not_listed("git"),
        ),
        (
            ["ls;", "rm"],
            not_listed("ls;"),
        ),
        (
            ["find", ".", "-delete"],
            "find does not allow '-delete' (allowed tests and operators: !, (, ), -a, -and, "
            "-empty, -iname, -ipath, -maxdepth, -mindepth, -mmin, -mtime, -name, -not, -o, "
            "-or, -path, -print, -size, -type)",
        ),
        (
            ["find", ".", "-name", "x", "-exec", "rm", "{}", ";"],
            "find does not allow '-exec' (allowed tests and operators: !, (, ), -a, -and, "
            "-empty, -iname, -ipath, -maxdepth, -mindepth, -mmin, -mtime, -name, -not, -o, "
            "-or, -path, -print, -size, -type)",
        ),
        (["find", ".", "-type", "p"], "find -type does not take 'p'"),
        (
            ["tail", "-f", "logs/app.log"],
            "tail does not allow the option '-f' (allowed: -q, -v, -c, -n)",
        ),
        (["head", "-n", "ten", "notes.txt"], "head -n does not take 'ten'"),
        (["head", "-n"], "head -n needs a value"),
        (
            ["grep", "-f", "notes.txt", "logs"],
            f"grep does not allow the option '-f' (allowed: {GREP})",
        ),
        (
            ["grep", "-e=x", "notes.txt"],
            f"grep does not allow the option '-e=x' (allowed: {GREP})",
        ),
        (["grep"], "grep needs a pattern"),
        (["date", "-s", "2020-01-01"], "date does not allow the option '-s' (allowed: -u, -R, -I)"),
        (["date", "tomorrow"], "date takes only +FORMAT, got 'tomorrow'"),
        (["hostname", "evil"], "hostname takes no operands here, got 'evil'"),
        (["ps", "aux", "1"], "ps takes no operands here, got '1'"),
        (
            ["ls", "--", "x"],
            f"ls does not allow the option '--' (allowed: {LS})",
        ),
        (["grep", "-R", "x"], f"grep does not allow the option '-R' (allowed: {GREP})"),
        (
            ["ls", "--hyperlink"],
            f"ls does not allow the option '--hyperlink' (allowed: {LS})",
        ),
    ],
)
def test_anything_else_is_refused_saying_what_is_allowed(root, argv, message):
    with pytest.raises(CommandNotAllowed) as refused:
        check_read_command(argv, Sandbox(root))
    assert str(refused.value) == message
    assert (refused.value.code, refused.value.field) == ("command_not_allowed", "command")


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "~/x", "logs/../../secret.txt"])
def test_paths_stay_inside_the_workspace(root, path):
    with pytest.raises(InvalidArgument) as refused:
        check_read_command(["cat", path], Sandbox(root))
    assert refused.value.code == "path_outside_root"


def test_a_symlink_out_of_the_workspace_is_refused(root):
    os.symlink(root.parent / "secret.txt", root / "link")
    with pytest.raises(InvalidArgument) as refused:
        check_read_command(["cat", "link"], Sandbox(root))
    assert refused.value.code == "path_outside_root"


def test_a_program_in_the_workspace_never_stands_in_for_a_listed_one(root):
    fake = root / "ls"
    fake.write_text("#!/bin/sh\necho pwned\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    path = os.pathsep.join([".", "", str(root), os.environ.get("PATH", "/usr/bin:/bin")])
    found = find_program("ls", path, str(root))
    assert os.path.isabs(found) and not found.startswith(str(root))
    with pytest.raises(CommandNotAllowed) as refused:
        find_program("ls", os.pathsep.join([".", str(root)]), str(root))
    assert str(refused.value) == "'ls' is not installed on this node (looked on PATH)"


def make_tools(root):
    registry = ToolRegistry()  # shell.read's own default policy: AUTO
    register_shell_module(registry, ShellConfig(), Sandbox(root))

    async def call(**arguments):
        return await registry.call("s", "ada", "shell.read", arguments)

    return call


async def test_read_commands_run_without_a_shell(root):
    call = make_tools(root)
    found = await call(command="grep -n ERROR logs/app.log")
    assert found.ok, found.error
    assert (found.data["exit_code"], found.data["stdout"]) == (0, "2:ERROR disk full\n")
    listed = await call(command=["ls", "-1"], cwd="logs")
    assert (listed.data["stdout"], listed.data["cwd"]) == ("app.log\n", "logs")
    counted = await call(command="wc -l app.log", cwd="logs")
    assert counted.data["stdout"].split()[0] == "3"
    # shell syntax is plain text: ';' and 'rm' are files cat does not find; nothing else runs
    semicolon = await call(command=["cat", "notes.txt", ";", "rm", "notes.txt"])
    assert semicolon.data["stdout"] == "hello\nhello\n" and semicolon.data["exit_code"] == 1
    assert "No such file" in semicolon.data["stderr"]
    assert (root / "notes.txt").exists()
    refused = await call(command="rm notes.txt")
    assert refused.error == {
        "code": "command_not_allowed",
        "message": not_listed("rm"),
        "field": "command",
    }
    assert (root / "notes.txt").exists()
    outside = await call(command="cat ../secret.txt")
    assert outside.error["code"] == "path_outside_root"
    # a recursive grep does not follow a symlink out of the workspace (-R is not allowed)
    os.symlink(root.parent, root / "up")
    recursive = await call(command="grep -r outside .")
    assert "outside" not in recursive.data["stdout"] and recursive.data["exit_code"] == 1
    unbalanced = await call(command="cat 'notes.txt")
    assert unbalanced.error["field"] == "command"
