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

__all__ = ["atomic_write", "current_umask", "default_file_mode"]


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
    the temporary file is deleted, the exception propagates and ``path`` is unchanged.
    The file gets the mode of a newly created file, :func:`default_file_mode` (module docstring).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as the target: os.replace is only atomic within one file system.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            _set_mode(fd, tmp, default_file_mode())  # mkstemp's 0600 would otherwise end up on ``path``
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # also Ctrl-C: never leave the partial temporary file behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return path
