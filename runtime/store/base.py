"""What every part of the store's front shares: its engine, its clock, and running operations.

The store is the truth; memory is a cache. Every method of the store is a trio-flavoured
coroutine; every write is durable (committed) when the call returns. One class implements it,
:class:`runtime.store.front.Store`, assembled from one part per area, each of which holds that
area's operations (:mod:`runtime.store.ops`) next to the methods that check arguments, run
them and build records: :mod:`~runtime.store.sessions`, :mod:`~runtime.store.inbox`,
:mod:`~runtime.store.nodes`, :mod:`~runtime.store.events`, :mod:`~runtime.store.leases` and
:mod:`~runtime.store.kv`. Under it one of two backends runs the
operations: :mod:`runtime.store.sqlite` (embedded default) and :mod:`runtime.store.postgres`.

Errors (all from :mod:`runtime.errors`):

* :class:`~runtime.errors.NotFound` - no row with that id (``no session with id 'x'``).
* :class:`~runtime.errors.AlreadyExists` - a row with that id exists.
* :class:`~runtime.errors.ConflictError` - an illegal state transition.
* :class:`~runtime.errors.MigrationError` - the schema could not be brought up to date.
* :class:`~runtime.errors.StoreError` - anything else the database reported.

Malformed arguments (a payload that is not a dict, an unknown state name) raise ``TypeError``
or ``ValueError`` before anything is written.

Optional arguments of the ``update_*`` methods default to :data:`UNSET` ("leave as is"), so
that ``None`` can mean "set to NULL" where a column is nullable.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from msgspec import UNSET, UnsetType

from turnstile.runtime.clock import Clock
from turnstile.runtime.errors import InvalidArgument
from turnstile.runtime.store import _util as u
from turnstile.runtime.store import ops
from turnstile.runtime.store.backend import Backend
from turnstile.runtime.store.records import MigrationRecord, NodeRef

__all__ = ["UNSET", "StoreBase", "UnsetType", "ts", "optional_ts"]

R = TypeVar("R")


def ts(value: str | datetime) -> datetime:
    """A stored time as an aware datetime (ISO text on SQLite, a datetime on PostgreSQL)."""
    return u.parse_ts(value) if isinstance(value, str) else value


def optional_ts(value: str | datetime | None) -> datetime | None:
    return None if value is None else ts(value)


def _migration(row: Any) -> MigrationRecord:
    return MigrationRecord(
        version=row["version"],
        name=row["name"],
        applied_at=ts(row["applied_at"]),
        set_name=row["set_name"],
    )


PING = ops.value("ping", "SELECT 1")
MIGRATIONS = ops.rows(
    "migrations",
    "SELECT * FROM schema_migrations ORDER BY set_name <> 'kernel', set_name, version",
    decode=_migration,
)


class StoreBase:
    """The front's state and what every area of it uses.

    Args:
        engine: the backend (:class:`~runtime.store.backend.Backend`) that runs operations.
        clock: its wall time stamps every row.

    Attributes:
        backend: ``"sqlite"`` or ``"postgres"``.
        clock: the clock.
        engine: the backend object.
        claimer: the node incarnation that ``claim_next_input`` stamps on what it claims
            (set by ``runtime.membership`` once the node registered), or None.
    """

    def __init__(self, engine: Backend, clock: Clock) -> None:
        self.engine = engine
        self.backend = engine.kind
        self.clock = clock
        self.claimer: NodeRef | None = None

    def __repr__(self) -> str:
        return f"<Store {self.engine!r}>"

    async def aclose(self) -> None:
        """Finish what is in flight and close the backend; later calls raise StoreError."""
        await self.engine.aclose()

    @property
    def commit_stats(self) -> tuple[int, int]:
        """SQLite only: (transactions committed, requests they held) by its group commit.

        Raises:
            AttributeError: the backend has no group commit (PostgreSQL).
        """
        stats: tuple[int, int] = self.engine.commit_stats  # type: ignore[attr-defined]
        return stats

    def _now(self) -> Any:
        return self.engine.db_time(self.clock.now())

    def _time(self, value: object, what: str) -> Any:
        return self.engine.db_time(u.check_time(value, what))

    def _optional_time(self, value: object, what: str) -> Any:
        return None if value is None else self._time(value, what)

    def db_time(self, value: datetime) -> Any:
        """An aware datetime as this backend stores it (ISO text on SQLite, ``datetime`` on
        PostgreSQL), for arguments of a feature's own operations.

        Raises:
            TypeError: ``value`` is not a datetime (a naive one is taken to be UTC).
        """
        return self.engine.db_time(u.check_time(value, "time"))

    # ---- operations: the kernel's and every feature's ----

    async def run(self, op: ops.Operation[R], /, **args: Any) -> R:
        """Run an operation (:mod:`runtime.store.ops`) with the store's guarantees.

        A feature's operations on its own tables run this way, as the kernel's do: a write in
        one transaction, durable when this returns (on SQLite in the writer's group commit, in
        a savepoint of its own); a read in one snapshot. Arguments are passed as given
        (convert times with :meth:`db_time`); the answer is the operation's, decoded.

        Raises:
            TypeError: ``op`` is not an ``Operation``, or does not run on this backend.
            StoreError: the database reported an error.
        """
        if not isinstance(op, ops.Operation):
            raise TypeError(f"expected an Operation, got {type(op).__name__}")
        if self.backend not in op.backends:
            raise TypeError(f"operation {op.name!r} does not run on {self.backend}")
        return await self.engine.run(op, **args)

    # ---- schema ----

    async def ping(self) -> None:
        """Round-trip a trivial query; raises when the database does not answer.

        Used by ``/healthz``.
        """
        await self.engine.run(PING)

    async def migrations(self) -> list[MigrationRecord]:
        """The applied schema migrations: the kernel's first, then each other set's by name.

        Returns:
            One record per row of ``schema_migrations``, by set and version.
        """
        return await self.engine.run(MIGRATIONS)

    # ---- notifications ----

    async def notify(self, channel: str, payload: str) -> None:
        """Tell every listener of ``channel`` (other nodes on PostgreSQL: ``pg_notify``; nobody
        on SQLite). A hint, not a delivery: a listener that was not connected misses it, so
        whatever it signals must also be found by looking at the rows.

        Raises:
            InvalidArgument: a malformed channel name, or a payload of 8000 bytes or more.
        """
        u.check_channel(channel)
        u.check_text(payload, "payload")
        if len(payload.encode()) > u.MAX_NOTIFY_BYTES:
            raise InvalidArgument(
                f"payload is longer than {u.MAX_NOTIFY_BYTES} bytes", field="payload"
            )
        await self.engine.notify(channel, payload)

    async def listen(self, channel: str, on_message: Callable[[str | None], None]) -> None:
        """Call ``on_message(payload)`` for every notification on ``channel``, forever (cancel
        to stop), and ``on_message(None)`` after every (re)connection, when notifications may
        have been missed. PostgreSQL listens on a connection of its own, checked and replaced
        when it is lost; SQLite calls ``on_message(None)`` once and nothing more."""
        u.check_channel(channel)
        await self.engine.listen(channel, on_message)
