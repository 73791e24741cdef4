"""The filesystem module: ``filesystem.read``, ``filesystem.write`` and ``filesystem.list``,
confined to one directory (the workspace root).

Paths are relative to the root. Three checks keep every call inside it:

1. lexically — absolute paths and ``..`` that climbs above the root are refused outright;
2. after symlinks — ``os.path.realpath`` of the joined path must still be inside the root, so a
   symlink (anywhere in the path, final component included, dangling or not) that leads out
   is refused, while symlinks that stay inside work;
3. at open time — the resolved path is opened one component at a time from a descriptor on the
   root (``openat`` with ``O_NOFOLLOW``; ``O_DIRECTORY`` for the directories on the way), so a
   symlink swapped in between the check and the open makes the call fail instead of escaping.

Only regular files are read or written (a FIFO or device under the root is refused, and
``O_NONBLOCK`` keeps the open itself from hanging on one). Writes that replace a file go to a
temporary file in the same directory which is then renamed into place, so readers never see
half a file. Reads and writes have size limits; blocking I/O runs in worker threads
(``trio.to_thread.run_sync``) and a ``trio.CapacityLimiter`` bounds concurrent calls.

``Sandbox`` (``tools.modules.sandbox``) is the reusable part: ``http.download`` writes through
it and ``shell.run`` resolves its working directory with it.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import trio

from turnstile.runtime.errors import InvalidArgument, LimitExceeded
from turnstile.tools.modules.sandbox import (
    FileError,
    PathNotFound,
    PathOutsideRoot,
    PendingFile,
    Sandbox,
    Target,
)
from turnstile.tools.policy import Policy
from turnstile.tools.registry import ToolCall, ToolRegistry

__all__ = [
    "POLICIES",
    "FilesystemConfig",
    "FilesystemModule",
    "Sandbox",
    "Target",
    "PendingFile",
    "PathOutsideRoot",
    "PathNotFound",
    "FileError",
    "register_filesystem_module",
]

MiB = 1024 * 1024

Path = Annotated[
    str, msgspec.Meta(max_length=4096, description="path relative to the workspace root")
]

#: Default policy per action: reads run on their own, writes need a person's approval.
POLICIES: dict[str, str] = {
    "filesystem.read": "AUTO",
    "filesystem.list": "AUTO",
    "filesystem.write": "APPROVE",
}


@dataclass(frozen=True)
class FilesystemConfig:
    """Settings of the filesystem module.

    Attributes:
        root: the workspace directory (created if missing); every path is relative to it.
        max_read_bytes: most bytes one ``filesystem.read`` returns (more is ``truncated``).
        max_write_bytes: largest content one ``filesystem.write`` accepts.
        max_list_entries: most entries one ``filesystem.list`` returns.
        max_concurrency: calls of this module running at once.
    """

    root: str = "workspace"
    max_read_bytes: int = 1 * MiB
    max_write_bytes: int = 1 * MiB
    max_list_entries: int = 1000
    max_concurrency: int = 8

    def __post_init__(self) -> None:
        for name in ("max_read_bytes", "max_write_bytes", "max_list_entries", "max_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


class ReadParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``filesystem.read``."""

    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    max_bytes: Annotated[int, msgspec.Meta(ge=1, le=100 * MiB)] | None = None
    encoding: Literal["auto", "utf-8", "base64"] = "auto"


class WriteParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``filesystem.write``."""

    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    content: Annotated[str, msgspec.Meta(max_length=64 * MiB)]
    encoding: Literal["utf-8", "base64"] = "utf-8"
    mode: Literal["overwrite", "append", "create"] = "overwrite"
    create_parents: bool = False


class ListParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Arguments of ``filesystem.list``."""

    path: Path = "."
    max_entries: Annotated[int, msgspec.Meta(ge=1, le=100_000)] | None = None


def _decode_text(data: bytes, truncated: bool) -> str | None:
    """``data`` as UTF-8, allowing a character cut in half at a truncation; None if binary."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if truncated and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8", errors="strict")
        return None


class FilesystemModule:
    """The handlers of the filesystem module (see ``register_filesystem_module``)."""

    def __init__(self, config: FilesystemConfig) -> None:
        self.config = config
        self.sandbox = Sandbox(config.root)
        self.limiter = trio.CapacityLimiter(config.max_concurrency)

    async def read(self, call: ToolCall, params: ReadParams) -> dict[str, Any]:
        limit = params.max_bytes or self.config.max_read_bytes
        if limit > self.config.max_read_bytes:
            raise InvalidArgument(
                f"max_bytes may be at most {self.config.max_read_bytes}", field="max_bytes"
            )

        def read() -> tuple[Target, bytes, int]:
            target = self.sandbox.resolve(params.path)
            fd = self.sandbox.open_file(target, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                chunks: list[bytes] = []
                wanted = limit + 1  # one byte more says whether there is more
                while wanted > 0:
                    chunk = os.read(fd, min(wanted, MiB))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    wanted -= len(chunk)
            finally:
                os.close(fd)
            return target, b"".join(chunks), size

        async with self.limiter:
            target, data, size = await trio.to_thread.run_sync(read)
        truncated = len(data) > limit
        data = data[:limit]
        text = None if params.encoding == "base64" else _decode_text(data, truncated)
        if text is None and params.encoding == "utf-8":
            text = data.decode("utf-8", errors="replace")
        if text is not None:
            content, encoding = text, "utf-8"
        else:
            content, encoding = base64.b64encode(data).decode("ascii"), "base64"
        return {
            "path": target.rel,
            "size": size,
            "content": content,
            "encoding": encoding,
            "truncated": truncated,
        }

    async def check_write(self, call: ToolCall, params: WriteParams) -> None:
        """``filesystem.write``'s precheck: the path and the content, before approval is asked.

        Raises:
            PathOutsideRoot, InvalidArgument, LimitExceeded: as ``write`` would.
        """
        self._content(params)
        await trio.to_thread.run_sync(self.sandbox.resolve, params.path)

    def _content(self, params: WriteParams) -> bytes:
        """The bytes ``params`` ask to write.

        Raises:
            InvalidArgument: base64 content that is not valid base64.
            LimitExceeded: more than ``max_write_bytes``.
        """
        if params.encoding == "base64":
            try:
                data = base64.b64decode(params.content, validate=True)
            except ValueError:
                raise InvalidArgument("content is not valid base64", field="content") from None
        else:
            data = params.content.encode("utf-8")
        if len(data) > self.config.max_write_bytes:
            raise LimitExceeded(
                f"content is {len(data)} bytes; the limit is {self.config.max_write_bytes}",
                field="content",
            )
        return data

    async def write(self, call: ToolCall, params: WriteParams) -> dict[str, Any]:
        data = self._content(params)

        def write() -> Target:
            target = self.sandbox.resolve(params.path)
            if params.mode == "append":
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
                fd = self.sandbox.open_file(target, flags, create_parents=params.create_parents)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
                return target
            pending = self.sandbox.begin_write(
                target, overwrite=params.mode == "overwrite", create_parents=params.create_parents
            )
            try:
                pending.write(data)
            except BaseException:
                pending.discard()
                raise
            pending.commit()
            return target

        async with self.limiter:
            target = await trio.to_thread.run_sync(write)
        return {"path": target.rel, "bytes_written": len(data), "mode": params.mode}

    async def list_dir(self, call: ToolCall, params: ListParams) -> dict[str, Any]:
        limit = min(
            params.max_entries or self.config.max_list_entries, self.config.max_list_entries
        )

        def listing() -> tuple[Target, list[dict[str, Any]], int]:
            target = self.sandbox.resolve(params.path)
            fd = self.sandbox.open_dir(target.parts)
            entries: list[dict[str, Any]] = []
            total = 0
            try:
                with os.scandir(fd) as found:
                    for entry in found:
                        total += 1
                        if total > 100_000:  # a pathological directory: stop scanning
                            break
                        entries.append(_describe(entry))
            finally:
                os.close(fd)
            entries.sort(key=lambda e: e["name"])
            return target, entries, total

        async with self.limiter:
            target, entries, total = await trio.to_thread.run_sync(listing)
        return {
            "path": target.rel,
            "entries": entries[:limit],
            "total": total,
            "truncated": total > limit,
        }


def _describe(entry: os.DirEntry[str]) -> dict[str, Any]:
    try:
        if entry.is_symlink():
            kind = "symlink"
        elif entry.is_dir(follow_symlinks=False):
            kind = "dir"
        elif entry.is_file(follow_symlinks=False):
            kind = "file"
        else:
            kind = "other"
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return {"name": entry.name, "type": "other", "size": None}
    return {"name": entry.name, "type": kind, "size": info.st_size if kind == "file" else None}


def register_filesystem_module(
    registry: ToolRegistry, config: FilesystemConfig
) -> FilesystemModule:
    """Register ``filesystem.read``, ``filesystem.write`` and ``filesystem.list``.

    Returns:
        the module; its ``sandbox`` is what ``http.download`` and ``shell.run`` use.
    """
    module = FilesystemModule(config)
    registry.register(
        "filesystem.read",
        ReadParams,
        module.read,
        "Read a file under the workspace root (text as UTF-8, binary as base64; large files "
        "are truncated to max_bytes).",
        policy=Policy(POLICIES["filesystem.read"]),
    )
    registry.register(
        "filesystem.write",
        WriteParams,
        module.write,
        "Write a file under the workspace root (mode overwrite, append or create; "
        "content UTF-8 or base64).",
        policy=Policy(POLICIES["filesystem.write"]),
        precheck=module.check_write,
    )
    registry.register(
        "filesystem.list",
        ListParams,
        module.list_dir,
        "List a directory under the workspace root: name, type (file, dir, symlink, other) "
        "and size of each entry.",
        policy=Policy(POLICIES["filesystem.list"]),
    )
    return module
