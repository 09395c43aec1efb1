"""Files written atomically: a temporary file in the same folder, flushed and fsynced, then
renamed onto the target, so a reader never sees a partial file and a failure (or Ctrl-C) leaves
the old file unchanged. The lowest layer: everything that writes results uses it.
"""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write"]


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


def atomic_write(path: str | os.PathLike, write: Callable[[io.BufferedWriter], None]) -> Path:
    """Write a file atomically: ``write(f)`` fills a temporary file next to ``path``, which is
    fsynced and then renamed onto ``path``. On any failure (including ``KeyboardInterrupt``)
    the temporary file is deleted, the exception propagates and ``path`` is unchanged.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as the target: os.replace is only atomic within one file system.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
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
