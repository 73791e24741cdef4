"""The webhook spool: signed deliveries that met an unavailable store, kept on local disk until
the store takes them (issue 23, ``docs/github.md``, ``docs/operations.md``).

A receiver that checked a delivery's signature and then meets ``StoreUnavailable`` writes one
file here (:meth:`Spool.write`: a temporary name in the folder, the bytes, ``fsync``, a rename
to its final name, ``fsync`` of the folder) and only then answers ``202 {"spooled": true}``:
what was acknowledged survives a crash of the node. A file holds the hook's name, the headers
the delivery needs again (its id, GitHub's event) and the raw body, as JSON.

:class:`Replayer` ingests them: once when the node opens (before anything else the feature
does), then every few seconds while files remain. It does not check the signature again (it
was checked before the file was written; a Standard Webhooks timestamp would be stale by now).
A file is removed once the store has recorded the delivery, or says it has it already (the
delivery id is the idempotency key, so a file ingested just before a crash, and not yet
removed, makes no second turn); kept while the store is still unavailable; moved to
``failed/`` with a log line when it can never be ingested (a body or hook that no longer
parses), so no file is tried forever.

One node per folder: the spool takes an exclusive ``flock`` on ``<dir>/.lock`` for the node's
life. A second process pointed at the same folder does not get it, logs a warning and spools
nothing (its deliveries are answered 503 during an outage, as without a spool), so no two
nodes replay one file.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import trio

from turnstile.runtime.errors import StoreUnavailable

__all__ = ["REPLAY_SECONDS", "Replayer", "Spool", "SpoolFull", "Spooled"]

log = logging.getLogger("turnstile.webhooks")

#: How often the replayer looks again while files remain.
REPLAY_SECONDS = 3.0
_SUFFIX = ".delivery"


class Spooled(msgspec.Struct, frozen=True):
    """One spooled delivery: ``hook`` (``github`` or a declared hook's name), ``delivery`` (the
    sender's id: ``X-GitHub-Delivery`` or ``webhook-id``), ``event`` (GitHub's
    ``X-GitHub-Event``; empty for a Standard Webhooks hook) and the raw ``body``."""

    hook: str
    delivery: str
    event: str
    body: bytes


class SpoolFull(Exception):
    """The spool holds ``spool_max_files`` already (or cannot be written): the delivery is
    answered 503 as without a spool."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Spooled).decode


class Spool:
    """A folder of spooled deliveries, owned by this node while it holds the folder's lock.

    Args:
        path: the folder (made if missing, with ``failed/``).
        max_files: the most files it holds; a delivery beyond is not spooled.
    """

    def __init__(self, path: Path, max_files: int) -> None:
        self.path = path
        self.failed = path / "failed"
        self.max_files = max_files
        self._lock: int | None = None
        self._refused = False
        self._count = 0

    @property
    def usable(self) -> bool:
        """This node holds the folder's lock: it spools and replays."""
        return self._lock is not None

    def open(self) -> bool:
        """Take the folder if it exists (what an earlier run left); True when this node holds
        it. A folder that does not exist yet is made at the first write."""
        if not self.path.is_dir():
            return False
        return self._take()

    def _take(self) -> bool:
        """Make the folder and take its lock; False (logged once) when another process holds
        it or it cannot be made."""
        if self._lock is not None:
            return True
        try:
            self.failed.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            self._refuse(f"cannot be used ({exc})")
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            self._refuse("is held by another process (give each node its own spool_dir)")
            return False
        self._lock = fd
        # temporary files of a write cut by a crash were never acknowledged
        for stale in self.path.glob(".tmp-*"):
            stale.unlink(missing_ok=True)
        self._count = len(self.files())
        return True

    def _refuse(self, why: str) -> None:
        if not self._refused:
            self._refused = True
            log.warning("webhooks: spool %s %s: this node spools nothing", self.path, why)

    def close(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None

    def count(self) -> int:
        """Files waiting (as this node last counted them)."""
        return self._count

    def files(self) -> list[Path]:
        """The spooled files, oldest first (their names start with the time they were
        written)."""
        if self._lock is None:
            return []
        return sorted(self.path.glob(f"*{_SUFFIX}"))

    def write(self, entry: Spooled) -> Path:
        """Write ``entry`` durably: it is on disk, under its final name, when this returns.

        Raises:
            SpoolFull: not this node's folder, ``max_files`` reached, or the write failed.
        """
        if not self._take():
            raise SpoolFull("no spool")
        if self._count >= self.max_files:
            raise SpoolFull(f"the spool holds {self._count} files")
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex}{_SUFFIX}"
        final = self.path / name
        temporary = self.path / f".tmp-{name}"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, _encode(entry))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temporary, final)
            _fsync_dir(self.path)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            log.error("webhooks: spool write failed: %s", exc)
            raise SpoolFull(f"the spool cannot be written: {exc}") from None
        self._count += 1
        return final

    def read(self, path: Path) -> Spooled:
        """A file's delivery.

        Raises:
            msgspec.DecodeError, msgspec.ValidationError, OSError: it cannot be read.
        """
        return _decode(path.read_bytes())

    def remove(self, path: Path) -> None:
        """The store has the delivery: the file goes."""
        path.unlink(missing_ok=True)
        _fsync_dir(self.path)
        self._count = max(0, self._count - 1)

    def fail(self, path: Path) -> None:
        """The file can never be ingested: it goes to ``failed/``, kept for a person."""
        os.rename(path, self.failed / path.name)
        _fsync_dir(self.path)
        self._count = max(0, self._count - 1)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Replayer:
    """Ingests a spool's files through ``deliver`` (the receivers' store half, no signature).

    Args:
        spool: this node's spool (opened).
        deliver: ingests one spooled delivery; returns the answer it would have given
            (``{"duplicate": true}`` for one the store has already).
        interval: seconds between passes while files remain.
    """

    def __init__(
        self,
        spool: Spool,
        deliver: Callable[[Spooled], Awaitable[dict[str, Any]]],
        *,
        interval: float = REPLAY_SECONDS,
    ) -> None:
        self.spool = spool
        self.deliver = deliver
        self.interval = interval
        self.passes = 0
        self._wake = trio.Event()

    def nudge(self) -> None:
        """A file was written: the loop is awake (it sleeps while the spool is empty)."""
        self._wake.set()

    async def replay(self) -> int:
        """One pass over the files, oldest first; stops at the first ``StoreUnavailable``.

        Returns:
            the files still waiting.
        """
        try:
            for path in await trio.to_thread.run_sync(self.spool.files):
                try:
                    entry = await trio.to_thread.run_sync(self.spool.read, path)
                except FileNotFoundError:
                    continue
                except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.error("webhooks: spooled %s unreadable (%s): moved to failed/", path, exc)
                    await trio.to_thread.run_sync(self.spool.fail, path)
                    continue
                try:
                    answer = await self.deliver(entry)
                except StoreUnavailable:
                    return self.spool.count()  # still out: the file stays
                except Exception as exc:  # bad data: never tried again
                    log.error(
                        "webhooks: spooled %s delivery %s cannot be ingested (%s): %s moved to"
                        " failed/",
                        entry.hook,
                        entry.delivery,
                        type(exc).__name__,
                        path.name,
                        exc_info=not isinstance(exc, ValueError | LookupError),
                    )
                    await trio.to_thread.run_sync(self.spool.fail, path)
                    continue
                log.info(
                    "webhooks: spooled %s delivery %s ingested%s",
                    entry.hook,
                    entry.delivery,
                    " (a duplicate)" if answer.get("duplicate") else "",
                )
                await trio.to_thread.run_sync(self.spool.remove, path)
            return self.spool.count()
        finally:
            self.passes += 1

    async def run(self) -> None:
        """Replay every ``interval`` while files remain; sleep until one is written."""
        while True:
            left = await self.replay()
            if left:
                await trio.sleep(self.interval)
            else:
                await self._wake.wait()
                self._wake = trio.Event()
