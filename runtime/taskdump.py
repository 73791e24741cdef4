"""What every task of a running node is waiting on, on demand (``SIGUSR1``).

An operator whose node answers nothing needs to see where it waits, not guess: ``kill -USR1
<pid>`` writes the whole trio task tree to stderr, each task with the await chain it is
suspended in (file, line, function, innermost last). The node keeps serving; nothing is
changed. The tests that drive real nodes ask for it when a request hangs, so a failure names
the await it hung on.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

import trio

__all__ = ["dump_on_signal", "task_tree"]

#: frames shown per task: the outermost ones are the task's own function, the innermost the
#: await it is parked in; a deep chain keeps both ends
_FRAMES = 12
_TRIO = os.path.dirname(trio.__file__)


def _where(task: trio.lowlevel.Task) -> list[str]:
    frames = [  # trio's own frames say only "parked": the caller's line says on what
        f"{frame.f_code.co_filename}:{lineno} {frame.f_code.co_name}"
        for frame, lineno in task.iter_await_frames()
        if _TRIO not in frame.f_code.co_filename
    ]
    if len(frames) > _FRAMES:
        frames = [*frames[:2], f"... {len(frames) - _FRAMES} more", *frames[2 - _FRAMES :]]
    return frames


def task_tree() -> str:
    """The current trio run's tasks, nursery by nursery, each with its await chain."""
    lines: list[str] = []

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        pad = "  " * depth
        lines.append(f"{pad}task {task.name}")
        lines.extend(f"{pad}  | {where}" for where in _where(task))
        for nursery in task.child_nurseries:
            for child in sorted(nursery.child_tasks, key=lambda t: t.name):
                walk(child, depth + 1)

    root = trio.lowlevel.current_root_task()
    if root is not None:  # (None only outside a trio run)
        walk(root, 0)
    return "\n".join(lines)


async def dump_on_signal(
    signum: int = signal.SIGUSR1, write: Callable[[str], object] | None = None
) -> None:
    """Write :func:`task_tree` each time ``signum`` arrives, until cancelled."""
    out = write if write is not None else (lambda text: print(text, file=sys.stderr, flush=True))
    with trio.open_signal_receiver(signum) as signals:
        async for _ in signals:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out(f"{stamp} turnstile tasks ({signal.Signals(signum).name}):\n{task_tree()}")
