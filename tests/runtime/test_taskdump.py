"""``SIGUSR1`` names what each task waits on (``runtime.taskdump``)."""

from __future__ import annotations

import os
import signal

import trio
import trio.testing

from turnstile.runtime.taskdump import dump_on_signal, task_tree


async def _parked_on_an_event(event: trio.Event) -> None:
    await event.wait()


async def test_the_tree_names_each_task_and_the_line_it_waits_on():
    event = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_parked_on_an_event, event, name="stuck worker")
        await trio.testing.wait_all_tasks_blocked()
        tree = task_tree()
        event.set()
    lines = tree.splitlines()
    at = lines.index(next(line for line in lines if line.strip() == "task stuck worker"))
    # its await chain follows it: this file's function, not trio's own frames
    assert "test_taskdump.py" in lines[at + 1] and "_parked_on_an_event" in lines[at + 1]
    assert not any("/trio/_core/" in line for line in lines)


async def test_a_signal_writes_the_tree_and_the_process_goes_on():
    written: list[str] = []
    arrived = trio.Event()

    def write(text: str) -> None:
        written.append(text)
        arrived.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dump_on_signal, signal.SIGUSR1, write)
        await trio.testing.wait_all_tasks_blocked()
        os.kill(os.getpid(), signal.SIGUSR1)
        with trio.fail_after(5):  # a hang guard: the signal arrives at once
            await arrived.wait()
        nursery.cancel_scope.cancel()
    assert "turnstile tasks (SIGUSR1)" in written[0]
    assert "dump_on_signal" in written[0]  # the dumping task itself is in the tree
