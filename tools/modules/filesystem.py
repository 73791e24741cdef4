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

``Sandbox`` is the reusable part: ``http.download`` writes through it and ``shell.run``
resolves its working directory with it.
"""

from __future__ import annotations

import base64
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import trio

from turnstile.runtime.errors import InvalidArgument, LimitExceeded, TurnstileError
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

#: Default policy per action: reads run on their own, writes need a person's approval.
POLICIES: dict[str, str] = {
    "filesystem.read": "AUTO",
    "filesystem.list": "AUTO",
    "filesystem.write": "APPROVE",
}


class PathOutsideRoot(InvalidArgument):
    """A path that is absolute or leads outside the workspace root."""

    code = "path_outside_root"


class PathNotFound(TurnstileError, LookupError):
    """No file or directory at that path."""

    code = "not_found"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class FileError(TurnstileError):
    """A file operation the OS refused (a directory where a file was expected, exists, …)."""

    code = "file_error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


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


@dataclass(frozen=True)
class Target:
    """A path inside the root, after symlinks.

    Attributes:
        rel: the path relative to the root, ``/``-separated (``"."`` for the root).
        parts: its components (empty for the root).
        real: the absolute path on disk.
    """

    rel: str
    parts: tuple[str, ...]
    real: str


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Sandbox:
    """Resolves and opens paths under ``root``; every method blocks (run it in a thread).

    Args:
        root: the directory; created if missing, symlinks in it resolved once.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        os.makedirs(root, exist_ok=True)
        self.root = os.path.realpath(root)

    def _inside(self, path: str) -> bool:
        return os.path.commonpath([self.root, path]) == self.root

    def resolve(self, path: str, field: str = "path") -> Target:
        """Where ``path`` leads, if that is inside the root.

        Raises:
            PathOutsideRoot: absolute, climbing above the root, or through a symlink that
                leads out.
            InvalidArgument: the path contains a NUL byte.
        """
        if "\x00" in path:
            raise InvalidArgument("the path contains a NUL byte", field=field)
        if os.path.isabs(path) or path.startswith("~"):
            raise PathOutsideRoot(
                f"absolute path {path!r} is not allowed; paths are relative to the workspace root",
                field=field,
            )
        joined = os.path.join(self.root, path or ".")
        if not self._inside(os.path.normpath(joined)):
            raise PathOutsideRoot(f"path {path!r} leads outside the workspace root", field=field)
        real = os.path.realpath(joined)
        if not self._inside(real):
            raise PathOutsideRoot(
                f"path {path!r} leads outside the workspace root through a symlink", field=field
            )
        rel = os.path.relpath(real, self.root)
        parts = () if rel == "." else tuple(rel.split(os.sep))
        return Target(rel="/".join(parts) or ".", parts=parts, real=real)

    def open_dir(self, parts: tuple[str, ...], *, create: bool = False, field: str = "path") -> int:
        """A descriptor on the directory ``parts`` below the root, walked without following
        symlinks; ``create`` makes missing directories.

        Raises:
            PathNotFound, FileError, PathOutsideRoot: see ``os_error``.
        """
        fd = os.open(self.root, _DIR_FLAGS)
        walked: list[str] = []
        try:
            for part in parts:
                walked.append(part)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOTDIR, errno.ELOOP) and _is_symlink(part, fd):
                        raise OSError(errno.ELOOP, "a symlink appeared") from None
                    raise
                os.close(fd)
                fd = child
        except OSError as exc:
            os.close(fd)
            raise os_error(exc, "/".join(walked), field) from None
        return fd

    def open_file(
        self,
        target: Target,
        flags: int,
        *,
        mode: int = 0o644,
        create_parents: bool = False,
        field: str = "path",
    ) -> int:
        """A descriptor on the regular file ``target`` (``O_NOFOLLOW``, ``O_NONBLOCK``).

        Raises:
            FileError: the target is the root, a directory or not a regular file.
            PathNotFound, PathOutsideRoot: see ``os_error``.
        """
        if not target.parts:
            raise FileError("the workspace root is a directory, not a file", field=field)
        dir_fd = self.open_dir(target.parts[:-1], create=create_parents, field=field)
        try:
            fd = os.open(
                target.parts[-1],
                flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                mode,
                dir_fd=dir_fd,
            )
        except OSError as exc:
            raise os_error(exc, target.rel, field) from None
        finally:
            os.close(dir_fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            if stat.S_ISDIR(info.st_mode):
                raise FileError(f"'{target.rel}' is a directory", field=field)
            raise FileError(f"'{target.rel}' is not a regular file", field=field)
        os.set_blocking(fd, True)
        return fd

    def begin_write(
        self,
        target: Target,
        *,
        overwrite: bool = True,
        create_parents: bool = False,
        field: str = "path",
    ) -> PendingFile:
        """A temporary file next to ``target`` that ``commit`` renames into place.

        Raises:
            FileError: ``target`` exists and ``overwrite`` is false, or is a directory.
            PathNotFound: the parent directory is missing and ``create_parents`` is false.
        """
        if not target.parts:
            raise FileError("the workspace root is a directory, not a file", field=field)
        dir_fd = self.open_dir(target.parts[:-1], create=create_parents, field=field)
        name = target.parts[-1]
        try:
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                info = None
            if info is not None:
                if stat.S_ISDIR(info.st_mode):
                    raise FileError(f"'{target.rel}' is a directory", field=field)
                if not overwrite:
                    raise FileError(f"'{target.rel}' already exists", field=field)
            temp = f".{name[:100]}.{secrets.token_hex(6)}.part"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(temp, flags, 0o644, dir_fd=dir_fd)
            except OSError as exc:
                raise os_error(exc, target.rel, field) from None
        except BaseException:
            os.close(dir_fd)
            raise
        return PendingFile(target, dir_fd, fd, temp, overwrite, field)


class PendingFile:
    """A file being written: ``write`` chunks, then ``commit`` or ``discard`` (both close it).

    Every method blocks; run it in a thread.
    """

    def __init__(
        self, target: Target, dir_fd: int, fd: int, temp: str, overwrite: bool, field: str
    ) -> None:
        self.target = target
        self.size = 0
        self._dir_fd = dir_fd
        self._fd: int | None = fd
        self._temp = temp
        self._overwrite = overwrite
        self._field = field

    def write(self, data: bytes) -> None:
        """Append ``data``."""
        assert self._fd is not None, "the file is closed"
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self.size += len(data)

    def commit(self) -> None:
        """Move the file into place (atomically; without ``overwrite``, never clobbering)."""
        assert self._fd is not None, "the file is closed"
        os.close(self._fd)
        self._fd = None
        name = self.target.parts[-1]
        try:
            if self._overwrite:
                os.replace(self._temp, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            else:
                os.link(
                    self._temp,
                    name,
                    src_dir_fd=self._dir_fd,
                    dst_dir_fd=self._dir_fd,
                    follow_symlinks=False,
                )
        except OSError as exc:
            self.discard()
            raise os_error(exc, self.target.rel, self._field) from None
        self.discard()

    def discard(self) -> None:
        """Remove the temporary file and close everything (safe to call twice)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._dir_fd >= 0:
            try:
                os.unlink(self._temp, dir_fd=self._dir_fd)
            except FileNotFoundError:
                pass
            os.close(self._dir_fd)
            self._dir_fd = -1


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def os_error(exc: OSError, rel: str, field: str = "path") -> TurnstileError:
    """The Turnstile error for an ``OSError`` on ``rel`` (a path relative to the root)."""
    if exc.errno == errno.ELOOP:
        return PathOutsideRoot(
            f"'{rel}' became a symlink while it was being opened; refusing it", field=field
        )
    if isinstance(exc, FileNotFoundError):
        return PathNotFound(f"no such file or directory: '{rel}'", field=field)
    if isinstance(exc, FileExistsError):
        return FileError(f"'{rel}' already exists", field=field)
    if isinstance(exc, IsADirectoryError):
        return FileError(f"'{rel}' is a directory", field=field)
    if isinstance(exc, NotADirectoryError):
        return FileError(f"a component of '{rel}' is not a directory", field=field)
    if isinstance(exc, PermissionError):
        return FileError(f"permission denied: '{rel}'", field=field)
    return FileError(f"'{rel}': {exc.strerror or type(exc).__name__}", field=field)


Path = Annotated[
    str, msgspec.Meta(max_length=4096, description="path relative to the workspace root")
]


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
