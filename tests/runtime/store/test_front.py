"""Every kernel operation runs on both backends, and the front runs nothing else."""

from __future__ import annotations

import inspect

import pytest

from turnstile.runtime.store import base, front, ops

#: The parts of the front, each with the operations of its area.
#: (Sorted: a set's order differs between processes, and pytest-xdist's workers must collect
#: the same tests in the same order.)
AREAS = sorted(
    (
        module
        for module in {inspect.getmodule(cls) for cls in front.Store.__mro__}
        if module is not None and module.__name__.startswith("turnstile.runtime.store.")
    ),
    key=lambda module: module.__name__,
)


def _operations(module) -> list[ops.Operation]:
    return [value for value in vars(module).values() if isinstance(value, ops.Operation)]


def test_the_front_is_assembled_from_its_areas():
    names = {module.__name__.rpartition(".")[2] for module in AREAS}
    assert names == {
        "base", "sessions", "inbox", "announce", "claims", "closing", "events", "nodes",
        "leases", "kv", "front",
    }  # fmt: skip
    assert base in AREAS


@pytest.mark.parametrize("module", AREAS, ids=lambda m: m.__name__.rpartition(".")[2])
def test_every_kernel_operation_runs_on_both_backends(module):
    for op in _operations(module):
        assert op.backends == {"sqlite", "postgres"}, f"{op.name} runs on {set(op.backends)}"


def test_the_methods_run_operations_not_names():
    # one mechanism: every method hands the engine an Operation object
    for module in AREAS:
        source = inspect.getsource(module)
        assert "engine.read(" not in source and "engine.write(" not in source
