"""The shell module: ``shell.run`` runs one program and returns its exit code and output;
``shell.read`` runs only the read-only commands of an allowlist, every argument checked
(``shell_read``: the heartbeat profile's read commands).

Despite the name there is no shell: the command is an argv list, or a string split with
``shlex`` (POSIX rules: quotes group, backslashes escape) — never ``sh -c``. ``$HOME``, ``;``,
``|``, ``>``, ``*`` and backticks are ordinary characters handed to the program as they are.

* **Working directory** — ``cwd`` is a path inside the workspace root (resolved by the
  filesystem module's ``Sandbox``; default the root itself). The program is not confined to
  the root beyond that: it can do whatever the node's user can, which is why ``shell.run``
  is ``BLOCK`` by default.
* **Environment** — only variables named in ``inherit_env`` are passed on from the node's
  environment (by default ``PATH`` and the locale), ``HOME`` is the workspace root, and the
  caller may set only the names in ``allowed_env``.
* **Timeout** — default 30 s, at most 600 s. The program runs in its own session (process
  group); on timeout, cancellation, or as soon as it exits, the whole group gets ``SIGKILL``,
  so nothing it started is left running. (A child that calls ``setsid`` itself escapes the
  group; the output pipes are then given up one second after the program exits.) The group
  is killed while the program is still an unreaped zombie, so its process-group id cannot
  have been reused by then.
* **Output** — stdout and stderr are captured up to ``max_output_bytes`` each (default
  64 KiB); the rest is read and dropped so the program never blocks on a full pipe, and the
  result says ``stdout_truncated`` / ``stderr_truncated``. Output is decoded as UTF-8 with
  replacement characters.

A timed-out command is a result, not an error: it carries the output so far, ``timed_out:
true`` and the killing signal. ``run_command`` is the reusable core (``shell.background_run``
builds on it); ``ShellModule.run`` adds the validation and the concurrency limit.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import trio

from turnstile.runtime.errors import InvalidArgument
from turnstile.tools.modules.filesystem import Sandbox, Target
from turnstile.tools.modules.shell_read import ReadParams, check_read_command, find_program
from turnstile.tools.policy import Policy
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = [
    "POLICIES",
    "ShellConfig",
    "ShellModule",
    "RunParams",
    "run_command",
    "register_shell_module",
]

KiB = 1024

#: Default policy per action: a program can do anything the node's user can; ``shell.read``
#: runs only the read-only commands of its allowlist (``shell_read``), which change nothing.
POLICIES: dict[str, str] = {"shell.run": "BLOCK", "shell.read": "AUTO"}

#: Seconds the output pipes are still read after the program exits and its group is killed.
PIPE_GRACE_SECONDS = 1.0


@dataclass(frozen=True)
class ShellConfig:
    """Settings of the shell module.

    Attributes:
        default_timeout: seconds a command may run when the call does not say.
        max_timeout: the largest ``timeout`` a call may ask for.
        max_output_bytes: bytes kept of stdout and of stderr, each.
        inherit_env: variables passed on from the node's environment.
        allowed_env: variables a call may set in ``env``.
        max_concurrency: commands running at once.
    """

    default_timeout: float = 30.0
    max_timeout: float = 600.0
    max_output_bytes: int = 64 * KiB
    inherit_env: tuple[str, ...] = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
    allowed_env: tuple[str, ...] = (
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "TERM",
        "NO_COLOR",
        "PYTHONUNBUFFERED",
    )
    max_concurrency: int = 2

    def __post_init__(self) -> None:
        if not 0 < self.default_timeout <= self.max_timeout:
            raise ValueError("default_timeout must be positive and at most max_timeout")
        if self.max_output_bytes < 1 or self.max_concurrency < 1:
            raise ValueError("max_output_bytes and max_concurrency must be at least 1")


Arg = Annotated[str, msgspec.Meta(max_length=4096)]


class RunParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``shell.run``."""

    command: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
        | Annotated[list[Arg], msgspec.Meta(min_length=1, max_length=256)]
    )
    cwd: Annotated[str, msgspec.Meta(max_length=4096)] = "."
    timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] | None = None
    env: Annotated[
        dict[Annotated[str, msgspec.Meta(min_length=1, max_length=128)], Arg],
        msgspec.Meta(max_length=32),
    ] = msgspec.field(default_factory=dict)
    stdin: Annotated[str, msgspec.Meta(max_length=64 * KiB)] | None = None


class _Capture:
    """Keeps the first ``limit`` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.total = 0

    async def pump(self, stream: trio.abc.ReceiveStream) -> None:
        while True:
            chunk = await stream.receive_some(64 * KiB)
            if not chunk:
                return
            self.total += len(chunk)
            room = self.limit - len(self.data)
            if room > 0:
                self.data += chunk[:room]

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    @property
    def truncated(self) -> bool:
        return self.total > self.limit


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_exited(pid: int) -> None:
    """Block until ``pid`` has exited, leaving it unreaped (a zombie keeps its group id)."""
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            return
        except InterruptedError:
            continue
        except ChildProcessError:  # already reaped
            return


async def _feed(stream: trio.abc.SendStream, data: bytes) -> None:
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the program did not read all of its input
    finally:
        await stream.aclose()


async def run_command(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout: float,  # noqa: ASYNC109 (a documented parameter of the tool)
    max_output_bytes: int = 64 * KiB,
    stdin: bytes | None = None,
) -> dict[str, Any]:
    """Run ``argv`` (no shell) and return what happened.

    Args:
        argv: the program and its arguments; ``argv[0]`` is looked up on ``env["PATH"]``.
        cwd: the working directory (already vetted by the caller).
        env: the complete environment of the program.
        timeout: seconds before the process group is killed.
        max_output_bytes: bytes kept of stdout and of stderr, each.
        stdin: bytes fed to the program's standard input (default: none, at EOF).

    Returns:
        ``argv``, ``exit_code`` (negative: killed by a signal), ``signal`` (its name, or
        None), ``stdout`` / ``stderr`` (text), ``stdout_truncated`` / ``stderr_truncated``,
        ``stdout_bytes`` / ``stderr_bytes`` (totals produced), ``timed_out``, ``elapsed_ms``.

    Raises:
        InvalidArgument: the program cannot be started (not found, not executable).
    """
    argv = list(argv)
    started = trio.current_time()
    try:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    except FileNotFoundError:
        raise InvalidArgument(f"command not found: {argv[0]!r}", field="command") from None
    except PermissionError:
        raise InvalidArgument(f"not executable: {argv[0]!r}", field="command") from None
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"cannot run {argv[0]!r}: {exc}", field="command") from None
    out = _Capture(max_output_bytes)
    err = _Capture(max_output_bytes)
    try:
        with trio.move_on_after(timeout) as deadline:
            async with trio.open_nursery() as nursery:
                assert process.stdout is not None and process.stderr is not None
                nursery.start_soon(out.pump, process.stdout)
                nursery.start_soon(err.pump, process.stderr)
                if stdin is not None:
                    assert process.stdin is not None
                    nursery.start_soon(_feed, process.stdin, stdin)
                await trio.to_thread.run_sync(_wait_exited, process.pid, abandon_on_cancel=True)
                _kill_group(process.pid)  # whatever it left behind
                nursery.cancel_scope.deadline = min(
                    nursery.cancel_scope.deadline, trio.current_time() + PIPE_GRACE_SECONDS
                )
    finally:
        with trio.CancelScope(shield=True):
            _kill_group(process.pid)  # the program is unreaped until wait(): the id is ours
            await process.wait()
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    await pipe.aclose()
    code = process.returncode
    killed_by = None
    if code is not None and code < 0:
        try:
            killed_by = signal.Signals(-code).name
        except ValueError:
            killed_by = str(-code)
    return {
        "argv": argv,
        "exit_code": code,
        "signal": killed_by,
        "stdout": out.text,
        "stderr": err.text,
        "stdout_truncated": out.truncated,
        "stderr_truncated": err.truncated,
        "stdout_bytes": out.total,
        "stderr_bytes": err.total,
        "timed_out": deadline.cancelled_caught,
        "elapsed_ms": round((trio.current_time() - started) * 1000),
    }


class ShellModule:
    """The handlers of the shell module (see ``register_shell_module``)."""

    def __init__(self, config: ShellConfig, sandbox: Sandbox) -> None:
        self.config = config
        self.sandbox = sandbox
        self.limiter = trio.CapacityLimiter(config.max_concurrency)

    def argv(self, command: str | list[str]) -> list[str]:
        """The argv of ``command``: a list as it is, a string split like a POSIX shell would
        split words (and nothing else).

        Raises:
            InvalidArgument: unbalanced quotes, an empty command or a NUL byte.
        """
        if isinstance(command, str):
            try:
                argv = shlex.split(command, posix=True)
            except ValueError as exc:
                raise InvalidArgument(f"cannot split the command: {exc}", field="command") from None
        else:
            argv = list(command)
        if not argv or not argv[0]:
            raise InvalidArgument("the command is empty", field="command")
        if any("\x00" in arg for arg in argv):
            raise InvalidArgument("the command contains a NUL byte", field="command")
        return argv

    def environment(self, extra: Mapping[str, str]) -> dict[str, str]:
        """The program's environment: inherited names, ``HOME``, then the caller's ``extra``.

        Raises:
            InvalidArgument: ``extra`` names a variable outside ``allowed_env``.
        """
        for name, value in extra.items():
            if name not in self.config.allowed_env:
                raise InvalidArgument(
                    f"env variable {name!r} may not be set "
                    f"(allowed: {', '.join(self.config.allowed_env) or 'none'})",
                    field="env",
                )
            if "\x00" in value:
                raise InvalidArgument(f"env variable {name!r} contains a NUL byte", field="env")
        env = {name: os.environ[name] for name in self.config.inherit_env if name in os.environ}
        env["HOME"] = self.sandbox.root
        env.update(extra)
        return env

    async def run(self, params: RunParams) -> dict[str, Any]:
        """Validate ``params`` and run the command under the module's concurrency limit."""
        argv = self.argv(params.command)
        timeout = params.timeout or self.config.default_timeout
        if timeout > self.config.max_timeout:
            raise InvalidArgument(
                f"timeout may be at most {self.config.max_timeout:g} seconds", field="timeout"
            )
        env = self.environment(params.env)

        def workdir() -> Target:
            target = self.sandbox.resolve(params.cwd, field="cwd")
            os.close(self.sandbox.open_dir(target.parts, field="cwd"))  # exists, a directory
            return target

        workdir_target = await trio.to_thread.run_sync(workdir)
        stdin = None if params.stdin is None else params.stdin.encode("utf-8")
        async with self.limiter:
            result = await run_command(
                argv,
                cwd=workdir_target.real,
                env=env,
                timeout=timeout,
                max_output_bytes=self.config.max_output_bytes,
                stdin=stdin,
            )
        result["cwd"] = workdir_target.rel
        return result

    async def handle(self, call: ToolCall, params: RunParams) -> dict[str, Any]:
        return await self.run(params)

    async def read(self, params: ReadParams) -> dict[str, Any]:
        """Check ``params`` against the read-only allowlist (``shell_read``) and run it as
        ``run`` would, in the workspace root (or ``cwd``), with no caller environment."""
        argv = self.argv(params.command)
        timeout = params.timeout or self.config.default_timeout
        if timeout > self.config.max_timeout:
            raise InvalidArgument(
                f"timeout may be at most {self.config.max_timeout:g} seconds", field="timeout"
            )
        env = self.environment({})

        def checked() -> tuple[Target, list[str]]:
            target = self.sandbox.resolve(params.cwd, field="cwd")
            os.close(self.sandbox.open_dir(target.parts, field="cwd"))  # exists, a directory
            run = check_read_command(argv, self.sandbox, target.rel)
            run[0] = find_program(argv[0], env.get("PATH", ""), self.sandbox.root)
            return target, run

        target, run = await trio.to_thread.run_sync(checked)
        async with self.limiter:
            result = await run_command(
                run,
                cwd=target.real,
                env=env,
                timeout=timeout,
                max_output_bytes=self.config.max_output_bytes,
            )
        result["cwd"] = target.rel
        return result

    async def handle_read(self, call: ToolCall, params: ReadParams) -> dict[str, Any]:
        return await self.read(params)


def register_shell_module(
    registry: ToolRegistry, config: ShellConfig, sandbox: Sandbox
) -> ShellModule:
    """Register ``shell.run`` and ``shell.read``; ``sandbox`` is the filesystem module's (for
    ``cwd`` and ``shell.read``'s paths)."""
    module = ShellModule(config, sandbox)
    registry.register(
        "shell.run",
        RunParams,
        module.handle,
        "Run a program (argv list, or a string split into words — no shell features) in a "
        "directory under the workspace root; returns exit code, stdout and stderr.",
        policy=Policy(POLICIES["shell.run"]),
    )
    registry.register(
        "shell.read",
        ReadParams,
        module.handle_read,
        "Run one read-only command (no shell, no writes): ls, cat, head, tail, wc, grep, find, "
        "stat, du, df, date, uptime, uname, whoami, id, hostname, nproc, free, ps, pwd, with "
        "the options each allows; paths inside the workspace root. Anything else is refused "
        "with command_not_allowed, saying what is allowed.",
        policy=Policy(POLICIES["shell.read"]),
    )
    return module
