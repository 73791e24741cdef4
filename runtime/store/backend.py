"""The small protocol between the validating front and a database backend.

The front (:class:`~runtime.store.front.Store`) checks every argument, encodes JSON and times,
and hands the backend an :class:`~runtime.store.ops.Operation` with keyword arguments that are
already checked and encoded: JSON as text, times as ``backend.db_time(dt)`` made them (ISO text
for SQLite, ``datetime`` for PostgreSQL). The backend runs the operation's side for its database
where the database is, then its ``decode`` on the caller's thread, and answers with that. There
is no list of operations here: an operation is the object passed in.

Errors a backend raises itself: ``StoreError`` for whatever the database reported, and, where
the answer is only known inside its transaction (so that nothing is written), the shared
``NotFound``/``ConflictError`` of :mod:`runtime.store._util` that an operation's side raised
(a parent row that does not exist, a unique rule other than the id).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol, TypeVar

from turnstile.runtime.store.ops import Operation

__all__ = ["Backend"]

R = TypeVar("R")


class Backend(Protocol):
    """A database that runs :class:`~runtime.store.ops.Operation` objects.

    Attributes:
        kind: ``"sqlite"`` or ``"postgres"`` (the store's ``backend``).
    """

    kind: str

    def db_time(self, value: datetime) -> Any:
        """An aware datetime as this database stores it."""
        ...

    async def run(self, op: Operation[R], /, **args: Any) -> R:
        """Run ``op`` with ``args``: a write in one transaction, durable when this returns.

        Raises:
            TypeError: ``op`` does not run on this database.
            StoreError: the database reported an error, or the store is closed.
        """
        ...

    async def notify(self, channel: str, payload: str) -> None:
        """Send a notification to the channel's listeners (none on SQLite)."""
        ...

    async def listen(self, channel: str, on_message: Callable[[str | None], None]) -> None:
        """Listen forever (see ``Store.listen``)."""
        ...

    async def aclose(self) -> None:
        """Finish what is in flight and close every connection; later calls are refused."""
        ...
