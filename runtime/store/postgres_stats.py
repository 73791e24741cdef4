"""Counting what the PostgreSQL backend sends: round trips per operation (tests, benchmarks).

A round trip is one exchange with the server that the connection waits for: a statement run
with parameters (asyncpg's bind and execute, one ``Sync``), a statement without parameters
(``BEGIN``, ``COMMIT``: the simple query protocol), a statement prepared because the
connection's cache did not hold it (parse and describe), a batch of ``executemany``, and the
type introspection asyncpg runs the first time a connection meets a type. A write operation is
one commit (one statement, or the transaction it opened), so the writes counted are the commits.

Enabled by the environment when the store opens (``TURNSTILE_STORE_STATS=1``) or by
``PostgresBackend(count=True)``; then the pool's connections are :class:`CountingConnection`
and each operation's side is wrapped by :func:`counted`. Off (always, outside tests and
benchmarks) the backend uses asyncpg's own connection class and pays nothing.
``PostgresBackend.statistics()`` answers a :class:`PostgresStatistics` snapshot; two snapshots
subtract (``after - before``), so a benchmark reads what a phase sent.

The counting overrides private methods of ``asyncpg.Connection`` (0.29 to 0.32): were one
renamed, its override would go uncalled and the count be low, never the behaviour changed
(every override only counts and calls the original).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import asyncpg

__all__ = [
    "ENV",
    "CountingConnection",
    "OperationStatistics",
    "PostgresStatistics",
    "StatsCounter",
    "counted",
    "enabled_by_environment",
]

T = TypeVar("T")

ENV = "TURNSTILE_STORE_STATS"


def enabled_by_environment() -> bool:
    """Whether ``TURNSTILE_STORE_STATS`` asks for counting (``1``, ``true``, ``yes``)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class OperationStatistics:
    """What one kind of operation sent.

    Attributes:
        calls: how many times it ran.
        round_trips: the round trips they sent, in all.
        prepares: of which statement preparations (a statement its connection had not cached).
    """

    calls: int = 0
    round_trips: int = 0
    prepares: int = 0

    def __sub__(self, other: OperationStatistics) -> OperationStatistics:
        return OperationStatistics(
            self.calls - other.calls,
            self.round_trips - other.round_trips,
            self.prepares - other.prepares,
        )


_NONE = OperationStatistics()


@dataclass(frozen=True)
class PostgresStatistics:
    """A snapshot of what the backend sent since it opened (see the module docstring).

    Attributes:
        counting: whether anything was counted (False: every figure is 0).
        round_trips: every round trip of the pool's connections (migrations and opening
            included; ``listen``'s connection is not the pool's and is not counted).
        prepares: of which statement preparations.
        operations: operations run.
        writes: write operations run, each one commit.
        by_operation: per operation name.
    """

    counting: bool = False
    round_trips: int = 0
    prepares: int = 0
    operations: int = 0
    writes: int = 0
    by_operation: Mapping[str, OperationStatistics] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def __sub__(self, other: PostgresStatistics) -> PostgresStatistics:
        names = set(self.by_operation) | set(other.by_operation)
        diff = {
            name: self.by_operation.get(name, _NONE) - other.by_operation.get(name, _NONE)
            for name in names
        }
        return PostgresStatistics(
            counting=self.counting,
            round_trips=self.round_trips - other.round_trips,
            prepares=self.prepares - other.prepares,
            operations=self.operations - other.operations,
            writes=self.writes - other.writes,
            by_operation=MappingProxyType({k: v for k, v in diff.items() if v.calls}),
        )


class StatsCounter:
    """The live counts, changed only on the store's asyncio thread (no lock: one thread)."""

    __slots__ = ("round_trips", "prepares", "operations", "writes", "_by_operation")

    def __init__(self) -> None:
        self.round_trips = 0
        self.prepares = 0
        self.operations = 0
        self.writes = 0
        # name -> [calls, round trips, prepares]
        self._by_operation: dict[str, list[int]] = {}

    def add(self, name: str, writes: bool, round_trips: int, prepares: int) -> None:
        self.operations += 1
        self.writes += writes
        entry = self._by_operation.get(name)
        if entry is None:
            entry = self._by_operation[name] = [0, 0, 0]
        entry[0] += 1
        entry[1] += round_trips
        entry[2] += prepares

    def snapshot(self) -> PostgresStatistics:
        """The counts now (read from the trio thread: a torn read is off by an operation at
        most, which a snapshot taken while nothing runs does not see)."""
        by_operation = {
            name: OperationStatistics(*entry) for name, entry in list(self._by_operation.items())
        }
        return PostgresStatistics(
            counting=True,
            round_trips=self.round_trips,
            prepares=self.prepares,
            operations=self.operations,
            writes=self.writes,
            by_operation=MappingProxyType(by_operation),
        )


#: asyncpg's connection class, as the overrides reach its private methods (untyped)
_Connection: Any = asyncpg.Connection


class CountingConnection(asyncpg.Connection):
    """An asyncpg connection that counts its round trips: its own (:attr:`trips`,
    :attr:`prepared`) and, once the pool has set :attr:`counter` right after connecting, the
    store's."""

    counter: StatsCounter | None = None
    #: round trips this connection sent, and of which preparations
    trips = 0
    prepared = 0

    def _count(self, prepares: int = 0) -> None:
        self.trips += 1
        self.prepared += prepares
        counter = self.counter
        if counter is not None:
            counter.round_trips += 1
            counter.prepares += prepares

    # (asyncpg's signatures, timeouts and all: these only count and pass everything on)
    async def execute(self, query: str, *args: Any, **kwargs: Any) -> str:
        if not args:  # the simple query protocol (BEGIN, COMMIT, ...): one round trip
            self._count()
        return await super().execute(query, *args, **kwargs)

    async def _Connection__execute(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        # every fetch, fetchrow, fetchval and execute with parameters, and the type
        # introspection, comes through here: one bind and execute
        self._count()
        return await _Connection._Connection__execute(self, *args, **kwargs)

    async def _executemany(self, *args: Any, **kwargs: Any) -> Any:
        self._count()  # asyncpg pipelines the batch: one wait for the server
        return await _Connection._executemany(self, *args, **kwargs)

    async def _get_statement(self, query: str, *args: Any, **kwargs: Any) -> Any:
        this: Any = self
        if kwargs.get("use_cache", True):
            record_class = kwargs.get("record_class") or this._protocol.get_record_class()
            key = (query, record_class, kwargs.get("ignore_custom_codec", False))
            if this._stmt_cache.get(key) is None:
                self._count(prepares=1)
        else:
            self._count(prepares=1)
        return await _Connection._get_statement(self, query, *args, **kwargs)


def counted(
    counter: StatsCounter, name: str, writes: bool, fn: Callable[..., Awaitable[T]]
) -> Callable[..., Awaitable[T]]:
    """``fn`` (an operation's PostgreSQL side, called ``name``) with its round trips counted
    under its name: the connection is the operation's alone while it runs."""

    async def run(conn: CountingConnection, **args: Any) -> T:
        # other operations run on the loop meanwhile, on other connections: this connection's
        # own count is this operation's
        before, prepared = conn.trips, conn.prepared
        try:
            return await fn(conn, **args)
        finally:
            counter.add(name, writes, conn.trips - before, conn.prepared - prepared)

    return run
