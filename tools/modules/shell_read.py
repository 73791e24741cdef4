"""``shell.read``: the read-only shell commands (the heartbeat profile's "bash (read commands)").

A heartbeat looks and reports; the scheduling-heartbeats reference gives it read commands of a
shell, not the shell. ``shell.read`` runs one program from an allowlist of commands that only
look (``READ_COMMANDS``: ``ls``, ``cat``, ``head``, ``tail``, ``wc``, ``grep``, ``find``,
``stat``, ``du``, ``df``, ``date``, ``uptime``, ``uname``, ``whoami``, ``id``, ``hostname``,
``nproc``, ``free``, ``ps``, ``pwd``), with every argument checked against that command's
entry before anything runs:

* **No shell, no eval.** The command is an argv list, or a string split with ``shlex`` into
  words and nothing else (``ShellModule.argv``); it runs through ``shell.run_command`` (never
  ``sh -c``, so ``;``, ``|``, ``>``, ``$(…)`` and ``*`` are plain characters that no program
  here takes as anything but a name or a pattern).
* **The program** is a bare name on the list, looked up on the node's ``PATH``; a path as the
  program (``/bin/ls``, ``./ls``) is refused, so no file of the workspace can stand in for one.
* **Options** must be ones the command's entry lists: a flag, combined short flags
  (``-la``) when every letter is listed, or an option with a value the entry checks (a
  count, a depth, a ``find -type`` letter, a ``stat -c`` format). Whatever writes, runs
  another program or never ends is not listed: ``find -exec`` / ``-delete`` / ``-fprint``,
  ``tail -f``, ``date -s``, ``hostname NAME``, ``grep -f FILE``, ``sort -o``… and
  ``git``, ``env``, ``xargs``, ``awk``, ``sed`` are not commands here at all (a repository's
  own config can make git run programs; the others run or write what they are told).
* **Operands** are paths inside the workspace root, checked by the filesystem module's
  ``Sandbox`` (absolute paths, ``..`` above the root and symlinks that lead out are
  refused) and handed to the program as the resolved path; ``grep``'s first operand is its
  pattern (unless ``-e`` gives it), ``date`` takes only ``+FORMAT``, and the commands about the
  machine (``uptime``, ``whoami``…) take none.
* The program's working directory is the workspace root (or ``cwd`` inside it), its
  environment the shell module's (inherited ``PATH`` and locale, ``HOME`` the root), its time
  and output bounded by the shell module's settings; it runs under the same concurrency limit.

Anything else is refused before it runs, with ``command_not_allowed`` and a message that
names what was refused and what is allowed. What "read-only" cannot promise: a listed command
reads whatever the node's user may read inside the workspace (and ``ps`` lists the
machine's processes with their arguments); its default policy is AUTO because it changes
nothing, and ``[policies] "shell.read"`` can make it APPROVE or BLOCK.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.modules.filesystem import Sandbox

__all__ = [
    "READ_COMMANDS",
    "CommandNotAllowed",
    "ReadCommand",
    "ReadParams",
    "check_read_command",
    "find_program",
]


class CommandNotAllowed(InvalidArgument):
    """``shell.read`` refused a program, an option or an operand (``field="command"``)."""

    code = "command_not_allowed"


def _count(value: str) -> bool:
    return re.fullmatch(r"[0-9]{1,9}", value) is not None


def _signed_count(value: str) -> bool:  # find -mtime 3, -mtime -3, -mtime +3; head -n -5
    return re.fullmatch(r"[+-]?[0-9]{1,9}", value) is not None


def _size(value: str) -> bool:  # find -size +10M
    return re.fullmatch(r"[+-]?[0-9]{1,12}[cwbkMG]?", value) is not None


def _text(value: str) -> bool:  # a name pattern or a format: any printable text
    return 0 < len(value) <= 1024 and value.isprintable()


Check = Callable[[str], bool]


@dataclass(frozen=True)
class ReadCommand:
    """What one command may be given.

    Attributes:
        short: letters allowed as flags, alone or combined (``"la"``: ``-l``, ``-a``, ``-la``).
        flags: whole options allowed as they are (``--oneline``, ``aux``, ``-maxdepth``'s kin
            that take no value).
        valued: options that take the next argument (or ``--name=value``) as their value, with
            the check that value must pass.
        operands: ``"paths"`` (each inside the workspace), ``"pattern+paths"`` (grep),
            ``"format"`` (``date +FORMAT``) or ``"none"``.
        expression: ``find``: the tests and operators allowed after its start paths.
        max_operands: at most this many operands.
    """

    short: str = ""
    flags: frozenset[str] = frozenset()
    valued: Mapping[str, Check] = field(default_factory=dict)
    operands: str = "paths"
    expression: Mapping[str, Check | None] = field(default_factory=dict)
    max_operands: int = 64


_NONE = ReadCommand(operands="none", max_operands=0)

#: The commands ``shell.read`` runs, and what each may be given (see the module docstring).
READ_COMMANDS: dict[str, ReadCommand] = {
    "ls": ReadCommand(short="laAhtrR1SdFin"),
    "cat": ReadCommand(short="nbsAET"),
    "head": ReadCommand(short="qv", valued={"-n": _signed_count, "-c": _signed_count}),
    "tail": ReadCommand(short="qv", valued={"-n": _signed_count, "-c": _signed_count}),
    "wc": ReadCommand(short="lwcmL"),
    "grep": ReadCommand(
        short="inrlLcvEFwxHhosIq",  # not -R: it follows symlinks out of the workspace
        flags=frozenset({"--color=never"}),
        valued={
            "-e": _text,
            "-m": _count,
            "-A": _count,
            "-B": _count,
            "-C": _count,
            "--include": _text,
            "--exclude": _text,
            "--exclude-dir": _text,
        },
        operands="pattern+paths",
    ),
    "find": ReadCommand(
        operands="paths",
        expression={
            "-name": _text,
            "-iname": _text,
            "-path": _text,
            "-ipath": _text,
            "-type": lambda v: v in {"f", "d", "l"},
            "-maxdepth": _count,
            "-mindepth": _count,
            "-mtime": _signed_count,
            "-mmin": _signed_count,
            "-size": _size,
            "-empty": None,
            "-print": None,
            "-not": None,
            "!": None,
            "-o": None,
            "-or": None,
            "-a": None,
            "-and": None,
            "(": None,
            ")": None,
        },
    ),
    "stat": ReadCommand(short="Lt", valued={"-c": _text}),
    "du": ReadCommand(short="shacb", valued={"-d": _count}),
    "df": ReadCommand(short="hTi"),
    "date": ReadCommand(short="uR", flags=frozenset({"-I"}), operands="format", max_operands=1),
    "uptime": ReadCommand(short="ps", operands="none", max_operands=0),
    "uname": ReadCommand(short="asnrvmo", operands="none", max_operands=0),
    "whoami": _NONE,
    "id": _NONE,
    "hostname": _NONE,
    "nproc": _NONE,
    "pwd": _NONE,
    "free": ReadCommand(short="hmgkbtw", operands="none", max_operands=0),
    "ps": ReadCommand(
        flags=frozenset({"aux", "-e", "-f", "-ef", "-A"}), operands="none", max_operands=0
    ),
}


class ReadParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``shell.read``."""

    command: (
        Annotated[
            str,
            msgspec.Meta(
                min_length=1,
                max_length=4096,
                description="one read-only command: " + ", ".join(sorted(READ_COMMANDS)),
            ),
        ]
        | Annotated[
            list[Annotated[str, msgspec.Meta(max_length=1024)]],
            msgspec.Meta(min_length=1, max_length=64),
        ]
    )
    cwd: Annotated[str, msgspec.Meta(max_length=4096)] = "."
    timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] | None = None


def _refuse(message: str) -> CommandNotAllowed:
    return CommandNotAllowed(message, field="command")


def _options(command: ReadCommand) -> str:
    """What a command's entry allows, for an error message."""
    listed = sorted(command.flags | set(command.valued) | set(command.expression))
    shown = [f"-{c}" for c in command.short] + listed
    return ", ".join(shown) or "no options"


def check_read_command(argv: list[str], sandbox: Sandbox, cwd: str = ".") -> list[str]:
    """Check ``argv`` against ``READ_COMMANDS`` (see the module docstring); the argv to run,
    with every path operand replaced by its resolved path. Blocks (paths): run in a thread.

    Raises:
        CommandNotAllowed: the program, an option, a value or an operand is not allowed.
        PathOutsideRoot: a path operand leads outside the workspace root.
    """
    program, args = argv[0], argv[1:]
    command = READ_COMMANDS.get(program)
    if command is None:
        raise _refuse(
            f"shell.read runs only these read-only commands: {', '.join(sorted(READ_COMMANDS))}"
            f"; {program!r} is not one of them"
        )
    out: list[str] = [program]
    #: where each operand sits in ``out``
    operand_at: list[int] = []
    pattern_given = False
    in_expression = False  # find: past its start paths
    i = 0

    def value_of(option: str) -> str:
        nonlocal i
        i += 1
        if i >= len(args):
            raise _refuse(f"{program} {option} needs a value")
        return args[i]

    while i < len(args):
        arg = args[i]
        if program == "find" and (
            in_expression or arg in command.expression or arg.startswith("-")
        ):
            in_expression = True
            if arg not in command.expression:
                raise _refuse(
                    f"find does not allow {arg!r} (allowed tests and operators: "
                    f"{', '.join(sorted(command.expression))})"
                )
            out.append(arg)
            check = command.expression[arg]
            if check is not None:
                value = value_of(arg)
                if not check(value):
                    raise _refuse(f"find {arg} does not take {value!r}")
                out.append(value)
        elif arg in command.flags:
            out.append(arg)
        elif arg.startswith("-") and arg != "-":
            name, eq, inline = arg.partition("=")
            if name in command.valued and (not eq or name.startswith("--")):
                value = inline if eq else value_of(name)
                if not command.valued[name](value):
                    raise _refuse(f"{program} {name} does not take {value!r}")
                pattern_given = pattern_given or name == "-e"
                out += [f"{name}={value}"] if eq else [name, value]
            elif not arg.startswith("--") and all(c in command.short for c in arg[1:]):
                out.append(arg)
            else:
                raise _refuse(
                    f"{program} does not allow the option {arg!r} (allowed: {_options(command)})"
                )
        else:
            operand_at.append(len(out))
            out.append(arg)
        i += 1
    return _operands(program, command, out, operand_at, pattern_given, sandbox, cwd)


def _operands(
    program: str,
    command: ReadCommand,
    out: list[str],
    operand_at: list[int],
    pattern_given: bool,
    sandbox: Sandbox,
    cwd: str,
) -> list[str]:
    """Check the operands and put each path's resolved form in its place in ``out``."""
    operands = [out[at] for at in operand_at]
    if len(operands) > command.max_operands:
        if command.max_operands == 0:
            raise _refuse(f"{program} takes no operands here, got {operands[0]!r}")
        raise _refuse(f"{program} takes at most {command.max_operands} operands here")
    if command.operands == "format":
        if operands and not (operands[0].startswith("+") and _text(operands[0])):
            raise _refuse(f"date takes only +FORMAT, got {operands[0]!r}")
        return out
    paths = list(operand_at)
    if command.operands == "pattern+paths" and not pattern_given:
        if not paths:
            raise _refuse("grep needs a pattern")
        paths = paths[1:]  # the pattern stays as it is
    for at in paths:
        path = out[at]
        joined = path if cwd in ("", ".") else f"{cwd.rstrip('/')}/{path}"
        out[at] = sandbox.resolve(joined, field="command").real
    return out


def find_program(name: str, path: str, root: str) -> str:
    """The absolute path of the listed program ``name`` on ``path`` (a ``PATH`` value),
    skipping entries that are relative (``.``, empty: the working directory, which is the
    workspace) or inside the workspace ``root``, so that no file of the workspace can stand in
    for a listed command.

    Raises:
        CommandNotAllowed: no such program on those entries.
    """
    root = os.path.realpath(root)
    for entry in path.split(os.pathsep):
        if not os.path.isabs(entry):
            continue
        real = os.path.realpath(entry)
        if real == root or real.startswith(root + os.sep):
            continue
        candidate = os.path.join(real, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise _refuse(f"{name!r} is not installed on this node (looked on PATH)")
