"""The store suite's fixtures for the memory feature's query tests (``test_memory_queries``):
``backend`` (SQLite and PostgreSQL, a schema of its own per test), ``backend_kind`` and the
``clock``, as ``tests/runtime/store/conftest.py`` defines them for the kernel's tables."""

from tests.runtime.store.conftest import backend, backend_kind, clock  # noqa: F401
