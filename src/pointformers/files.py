"""Files written atomically: a temporary file in the same folder, flushed and fsynced, then
renamed onto the target, so a reader never sees a partial file and a failure (or Ctrl-C) leaves
the old file unchanged. The lowest layer: everything that writes results uses it.

Permissions: :func:`tempfile.mkstemp` creates its file with mode 0600, which the rename would
carry over to the target, so every checkpoint, metrics file and cache entry would be private
whatever the user's umask. :func:`atomic_write` therefore gives the temporary file the mode an
ordinary ``open(path, "w")`` creates, ``0o666 & ~umask`` (0644 under the usual umask 022, 0600
under 077) before renaming it, also when it replaces an existing file (the old file's mode is
not kept). The umask is read at every call (:func:`current_umask`), so a program that changes
it later is followed.
"""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["FileWriteError", "atomic_write", "current_umask", "default_file_mode"]


class FileWriteError(OSError, ValueError):
    """A file could not be written: ``"cannot write FILE: reason"`` (e.g. "No space left on
    device", "Permission denied"). An :class:`OSError` (``errno`` and ``strerror`` are those of
    the failure, ``filename`` the target) and a :class:`ValueError`, so the command line reports
    it in one line."""

    def __init__(self, path: str | os.PathLike, cause: OSError):
        reason = cause.strerror or str(cause) or type(cause).__name__
        super().__init__(cause.errno, reason)
        self.filename = os.fspath(path)

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"

    def __reduce__(self):  # picklable (multiprocessing), despite the two-argument constructor
        return _rebuild_write_error, (self.filename, self.errno, self.strerror)


def _rebuild_write_error(filename: str, errno: int | None, strerror: str) -> "FileWriteError":
    return FileWriteError(filename, OSError(errno, strerror))


def _os_error_in(exc: BaseException) -> OSError | None:
    """``exc`` itself or the first OSError it was raised from or during (``__cause__`` /
    ``__context__``): :func:`torch.save` turns a failed ``write`` into a RuntimeError whose
    context is the OSError."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def current_umask() -> int:
    """The process's file-creation mask.

    POSIX has no call that only reads the umask: ``os.umask`` sets it and returns the old value.
    On Linux (4.7 and later) the value is read from ``/proc/self/status`` without changing it.
    Elsewhere it is set and immediately restored; for that instant it is set to 0o077, so a
    file another thread creates meanwhile can only come out more private, never more open.
    """
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)
    os.umask(old)
    return old


def default_file_mode() -> int:
    """The permission bits ``open(path, "w")`` gives a new file now: ``0o666 & ~umask``."""
    return 0o666 & ~current_umask()


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _set_mode(fd: int, path: str, mode: int) -> None:
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)
    else:  # pragma: no cover - Windows before Python 3.13 (only the read-only flag exists there)
        os.chmod(path, mode)


def atomic_write(path: str | os.PathLike, write: Callable[[io.BufferedWriter], None]) -> Path:
    """Write a file atomically: ``write(f)`` fills a temporary file next to ``path``, which is
    fsynced and then renamed onto ``path``. On any failure (including ``KeyboardInterrupt``)
    the temporary file is deleted and ``path`` is unchanged. A failure of the file system
    (full disk, read-only or missing folder, quota, I/O error: an :class:`OSError`, also when
    ``write`` reports it wrapped in another exception) raises :class:`FileWriteError` naming
    ``path``; any other exception propagates as it is.
    The file gets the mode of a newly created file, :func:`default_file_mode` (module docstring).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Same directory as the target: os.replace is only atomic within one file system.
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise FileWriteError(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            _set_mode(fd, tmp, default_file_mode())  # mkstemp's 0600 would otherwise end up on ``path``
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # also Ctrl-C: never leave the partial temporary file behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
        cause = _os_error_in(exc) if isinstance(exc, Exception) else None
        if cause is None or isinstance(exc, FileWriteError):
            raise
        raise FileWriteError(path, cause) from exc
    _fsync_dir(path.parent)
    return path
