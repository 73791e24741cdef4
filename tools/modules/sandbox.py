"""The filesystem sandbox: paths resolved and opened under one root, never outside it.

The three checks the filesystem module's docstring describes (lexical, after symlinks, at open
time with ``openat`` and ``O_NOFOLLOW``) live here, apart from the module's tools, because
``http.download`` writes through the sandbox and ``shell.run`` resolves its working directory
with it. Every method blocks: run it in a worker thread.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass

from turnstile.runtime.errors import InvalidArgument, TurnstileError

__all__ = [
    "FileError",
    "PathNotFound",
    "PathOutsideRoot",
    "PendingFile",
    "Sandbox",
    "Target",
    "os_error",
]


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
