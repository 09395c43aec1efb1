"""Run folders: nothing lost, nothing mixed.

* :func:`check_run_folder` refuses to start a new run in a folder that already holds one
  (``config.yaml``, ``last.pt``, ``best.pt`` or ``metrics.*``) unless it is resumed or
  overwriting was asked for explicitly.
* :class:`RunLock` keeps one run per folder: ``RUN/.lock`` is created with ``O_CREAT|O_EXCL``,
  holds ``pid host`` and is ``flock``-ed for the run's life. A lock file whose ``flock`` is free
  and whose pid is not alive on this host was left by a crashed run (SIGKILL, power loss) and
  is taken over with a warning; a held one makes the second run stop with the holder's pid.
* :func:`remove_run_files` removes an earlier run's own files (only those) for ``--overwrite``.

Errors are :class:`RunFolderError`, a ``ValueError`` (the CLI exits with status 2).
"""
from __future__ import annotations

import os
import socket
import warnings
from pathlib import Path

try:  # POSIX; elsewhere only the pid in the lock file is checked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "RUN_FILES", "RunFolderError", "RunLock", "check_run_folder", "existing_run_files",
           "remove_run_files"]

#: The files that make a folder a run folder (written by the CLI and :func:`~.trainer.fit`).
RUN_FILES = ("config.yaml", "last.pt", "best.pt", "metrics.json", "metrics.csv")
LOCK_NAME = ".lock"


class RunFolderError(ValueError):
    """A run folder that may not be written: it holds another run, or another run is using it."""


def existing_run_files(folder: str | os.PathLike) -> list[str]:
    """The names of :data:`RUN_FILES` present in ``folder`` (empty if it does not exist)."""
    folder = Path(folder)
    return [name for name in RUN_FILES if (folder / name).exists()]


def check_run_folder(folder: str | os.PathLike, resume: bool = False, overwrite: bool = False) -> None:
    """Raise :class:`RunFolderError` if ``folder`` holds a run and neither ``resume`` nor
    ``overwrite`` is set (or both are)."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other (continue the run, or start it again)")
    found = existing_run_files(folder)
    if found and not (resume or overwrite):
        raise RunFolderError(f"--out: {folder} already holds a run ({', '.join(found)}); pass --resume to "
                             f"continue it, or --overwrite to start a new run there (its files are replaced)")


def remove_run_files(folder: str | os.PathLike) -> list[str]:
    """Delete an earlier run's ``last.pt``, ``best.pt``, ``metrics.json`` and ``metrics.csv``
    (``config.yaml`` is rewritten by the new run); nothing else in ``folder`` is touched.
    Returns the names removed."""
    removed = []
    for name in RUN_FILES[1:]:
        try:
            (Path(folder) / name).unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except OSError:
        return False
    return True


def _read_holder(fd: int) -> tuple[int, str]:
    """``(pid, host)`` from an open lock file; ``(0, "")`` if unreadable."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        parts = os.read(fd, 4096).decode("utf-8", "replace").split()
        return int(parts[0]), (parts[1] if len(parts) > 1 else "")
    except (OSError, ValueError, IndexError):
        return 0, ""


def _try_flock(fd: int) -> bool:
    if fcntl is None:  # pragma: no cover
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    except OSError:  # a file system without flock: the pid check below decides
        return True
    return True


class RunLock:
    """An exclusive lock on a run folder for the life of a run (module docstring).

    Use as a context manager, or :meth:`acquire` / :meth:`release`. Released on normal exit,
    on exceptions and on ``KeyboardInterrupt``; a crashed holder's lock is taken over.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None

    def _refuse(self, pid: int, host: str) -> RunFolderError:
        who = f"pid {pid}" + (f" on {host}" if host else "")
        return RunFolderError(f"--out: {self.folder} is in use by another run ({who}; lock file {self.path}); "
                              f"wait for it to finish or choose another --out")

    def acquire(self) -> "RunLock":
        """Take the lock; :class:`RunFolderError` naming the holder's pid when another run holds
        it, or naming the folder / lock file when they cannot be created (read-only folder, a
        file in the way, full disk)."""
        try:
            return self._acquire()
        except OSError as exc:
            where = exc.filename if exc.filename is not None else self.path
            raise RunFolderError(f"--out: cannot write {where}: {exc.strerror or exc} (the run folder "
                                 f"{self.folder} must be writable)") from exc

    def _acquire(self) -> "RunLock":
        self.folder.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()} {socket.gethostname()}\n".encode()
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
                stale = None
            except FileExistsError:
                try:
                    fd = os.open(self.path, os.O_RDWR)
                except FileNotFoundError:  # released meanwhile: try again
                    continue
                stale = _read_holder(fd)
            if not _try_flock(fd):
                pid, host = _read_holder(fd)
                os.close(fd)
                raise self._refuse(pid, host)
            try:  # the file we locked must still be the one at self.path (not unlinked by a releaser)
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            if stale is not None:
                pid, host = _read_holder(fd)
                if host == socket.gethostname() and pid != os.getpid() and _pid_alive(pid):
                    os.close(fd)  # no flock (unsupported here?) but the holder is alive
                    raise self._refuse(pid, host)
                warnings.warn(f"{self.path}: taking over the lock of a run that is gone "
                              f"(pid {pid or '?'}{' on ' + host if host else ''})", stacklevel=2)
            try:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, me)
                os.fsync(fd)
            except OSError:
                os.close(fd)
                if stale is None:  # our own new, empty lock file: leave no trace
                    try:
                        os.unlink(self.path)
                    except OSError:
                        pass
                raise
            self.fd = fd
            return self
        raise RunFolderError(f"--out: could not lock {self.folder} (its lock file {self.path} keeps changing)")

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)  # unlinked while still flock-ed: a waiting opener re-checks the inode
        except OSError:
            pass
        os.close(fd)

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
