"""The front and its backends agree on the operations between them."""

from __future__ import annotations

import inspect
import re

import pytest

from turnstile.runtime.store import front, postgres_queries, sqlite_queries
from turnstile.runtime.store.backend import READS, WRITES


def test_the_front_asks_only_for_listed_operations():
    asked = re.findall(r'engine\.(read|write)\(\s*"(\w+)"', inspect.getsource(front))
    assert {op for kind, op in asked if kind == "read"} == set(READS)
    assert {op for kind, op in asked if kind == "write"} == set(WRITES)


@pytest.mark.parametrize("queries", [sqlite_queries, postgres_queries])
def test_every_backend_runs_every_operation(queries):
    for op in (*READS, *WRITES):
        assert callable(getattr(queries, op, None)), f"{queries.__name__} lacks {op}"
