"""The store's fault seam: crash, fail or delay the commit that holds the N-th write (tests).

The crash harness (``tests/crash``, ``docs/reliability.md``) runs a scenario against a real
``turnstile serve`` once per commit point and stops the process there. This module says where
that point is; each backend calls it where its commits happen:

* **SQLite**: the writer thread (:mod:`runtime.store.sqlite_writer`) runs a batch of write
  requests in one transaction (group commit). Each write request is counted as it runs, in
  order; the fault acts at the commit of the batch that holds write ``N``: before it (the batch
  is lost, nobody was told it was kept), after it (kept, nobody was told yet), as a failed
  commit, or after a pause.
* **PostgreSQL**: a write operation runs on a pooled connection on the store's asyncio thread
  and commits when it ends (one statement, or the transaction it opens). Write ``N`` is the
  ``N``-th write operation to start; the fault acts before it runs (nothing of it is kept),
  right after it returned (kept, the caller not told), instead of it (it fails as a driver
  error would), or after a pause before it
  (:mod:`runtime.store.postgres_faults`).

A write is an operation with ``writes=True`` (:mod:`runtime.store.ops`); reads and the
migrations at open are not counted.

Enabled only by the environment, read once when the store opens::

    TURNSTILE_STORE_FAULT=crash-after:17      # os._exit(CRASH_EXIT) right after that commit
    TURNSTILE_STORE_FAULT=crash-before:17     # os._exit(CRASH_EXIT) just before it
    TURNSTILE_STORE_FAULT=fail:17             # that commit fails (StoreError to its writers)
    TURNSTILE_STORE_FAULT=delay:17:0.5        # that commit waits 0.5 s first
    TURNSTILE_STORE_FAULT=count               # nothing happens; writes are only counted
    TURNSTILE_STORE_FAULT_LOG=/path/file      # with any of them: "<n> <operation>" per write

Unset (always, outside tests), the backends hold ``None`` and pay one ``is not None`` check per
write operation and, on SQLite, one per group commit: nothing else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

__all__ = ["CRASH_EXIT", "ENV", "LOG_ENV", "KINDS", "StoreFault", "from_environment", "parse"]

T = TypeVar("T")

ENV = "TURNSTILE_STORE_FAULT"
LOG_ENV = "TURNSTILE_STORE_FAULT_LOG"
#: the exit status of a process the fault stopped (the harness tells it from other deaths)
CRASH_EXIT = 86
KINDS = ("crash-before", "crash-after", "fail", "delay", "count")

Kind = Literal["crash-before", "crash-after", "fail", "delay", "count"]


class StoreFault:
    """One fault at one write, and the count of writes so far (one per store).

    Counting and acting happen on the thread where the backend's commits happen (SQLite's
    writer thread, PostgreSQL's asyncio thread), one at a time: no lock.

    Args:
        kind: one of :data:`KINDS`.
        at: the write (1, 2, …) whose commit the fault hits; 0 for ``count``.
        seconds: the pause of ``delay``.
        log: a file to append ``"<n> <operation>"`` to for each write (the harness counts a
            scenario's commit points so), or None.
    """

    def __init__(self, kind: Kind, at: int = 0, seconds: float = 0.0, log: str | None = None):
        if kind not in KINDS:
            raise ValueError(f"unknown store fault {kind!r} (one of {', '.join(KINDS)})")
        if kind != "count" and at < 1:
            raise ValueError("a store fault's write number must be >= 1")
        if seconds < 0:
            raise ValueError("a store fault's delay must be >= 0")
        self.kind = kind
        self.at = at
        self.seconds = seconds
        self.writes = 0
        #: the write being run holds write ``at`` (SQLite: the batch it is in does)
        self.armed = False
        self._log = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log else None

    def __repr__(self) -> str:
        return f"<StoreFault {self.kind}:{self.at} after {self.writes} writes>"

    def count(self, name: str) -> bool:
        """One more write, called ``name``, is about to run: count it (and log it).

        Returns:
            whether it is write ``at`` (then :attr:`armed` is set too).
        """
        self.writes += 1
        if self._log is not None:
            os.write(self._log, f"{self.writes} {name}\n".encode())
        if self.writes == self.at and self.kind != "count":
            self.armed = True
            return True
        return False

    def before_commit(self, error: Callable[[str], BaseException]) -> None:
        """A commit is about to happen (SQLite: a group commit, with the writes counted so
        far): when it holds write ``at``, :meth:`strike_before`."""
        if self.armed:
            self.strike_before(error)

    def after_commit(self) -> None:
        """A commit is done: when it held write ``at``, :meth:`strike_after`."""
        if self.armed:
            self.strike_after()

    def strike_before(self, error: Callable[[str], BaseException]) -> None:
        """The commit of write ``at`` is about to happen: stop the process (``crash-before``),
        raise ``error(message)`` (``fail``: what the driver would raise), or sleep (``delay``;
        PostgreSQL's side sleeps on its loop instead)."""
        if self.kind == "crash-before":
            self._exit()
        elif self.kind == "fail":
            self.armed = False
            raise error(f"injected fault: the commit of write {self.at} failed")
        elif self.kind == "delay":
            self.say_delayed()
            time.sleep(self.seconds)

    def say_delayed(self) -> None:
        """Write to stderr that the commit of write ``at`` waits (``delay``), so a harness
        can tell a run whose fault struck from one that never reached it."""
        os.write(2, f"turnstile: store fault delay:{self.at}: waits {self.seconds:g} s\n".encode())

    def strike_after(self) -> None:
        """The commit of write ``at`` is done: ``crash-after`` stops the process here."""
        self.armed = False
        if self.kind == "crash-after":
            self._exit()

    def _exit(self) -> None:
        message = f"turnstile: store fault {self.kind}:{self.at}: stopping the process\n"
        try:
            os.write(2, message.encode())
        finally:
            os._exit(CRASH_EXIT)


def parse(spec: str, log: str | None = None) -> StoreFault:
    """A fault from its text: ``kind:N`` (``delay:N:seconds``) or ``count``.

    Raises:
        ValueError: the text is not one of those.
    """
    kind, _, rest = spec.strip().partition(":")
    if kind == "count" and not rest:
        return StoreFault("count", log=log)
    parts = rest.split(":")
    wanted = 2 if kind == "delay" else 1
    if kind not in KINDS or kind == "count" or len(parts) != wanted:
        raise ValueError(
            f"bad {ENV} {spec!r}: expected crash-before:N, crash-after:N, fail:N,"
            " delay:N:SECONDS or count"
        )
    try:
        at = int(parts[0])
        seconds = float(parts[1]) if kind == "delay" else 0.0
    except ValueError:
        raise ValueError(f"bad {ENV} {spec!r}: N must be an integer, SECONDS a number") from None
    return StoreFault(kind, at, seconds, log)  # type: ignore[arg-type]


def from_environment(environ: Mapping[str, str] | None = None) -> StoreFault | None:
    """The fault :data:`ENV` asks for (with :data:`LOG_ENV`'s log), or None when it is unset
    or empty: read once, when a store opens.

    Raises:
        ValueError: :data:`ENV` is malformed.
    """
    env = os.environ if environ is None else environ
    spec = env.get(ENV, "")
    if not spec:
        return None
    return parse(spec, env.get(LOG_ENV) or None)


def counted(fault: StoreFault, name: str, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` (a write's SQLite side), counting itself in ``fault`` when the writer runs it."""

    def write(conn: Any, **args: Any) -> T:
        fault.count(name)
        return fn(conn, **args)

    return write
