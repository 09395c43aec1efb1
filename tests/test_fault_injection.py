"""Fault injection (issue 21, "nothing lost, nothing silent"): every fault point is named, seeded
and has the one outcome it must have.

* Kills (``os._exit``, no cleanup of any kind) at chosen steps of the atomic writes of a training
  run, then ``--resume``: the final state equals an uninterrupted run bit for bit, and every file
  on disk was always complete (the previous version or the new one, never torn).
* Kills inside checkpoint and cache writes: the file holds the old or the new content exactly.
* A second run into a folder in use: refused naming the holder's pid; the first run's files are
  untouched and it finishes exactly as if alone.
* A full disk (``ENOSPC`` from a write) and a read-only folder (``chmod``; as root, which ignores
  permissions, a ``PermissionError`` from the file system calls instead): one-line error naming
  the file, nothing written before lost, ``--resume`` afterwards ends exactly as an uninterrupted run.
* Truncated, byte-flipped and wrongly encoded files of every format the package reads: a
  ValueError naming the file (and the line for text), or, where the damage missed every byte
  that matters, exactly the original content -- never other values.
* Adversarial tensors for every registered mechanism (what ``test_adversarial_inputs.py`` does
  not already check: NaN/inf in real rows, float64 range, dtypes, empty and one-point clouds).

Faults are injected by wrapping the calls :func:`pointformers.files.atomic_write` makes
(``tempfile.mkstemp``, ``os.fdopen``, ``os.replace``), see :class:`Fault`; in a fork of the test
process for kills (:class:`_Child`; the file is also a script doing the same in a process of its
own: ``python tests/test_fault_injection.py TARGET NTH STAGE ACTION PROGRAM ARGS...``). Marker ``faults``: run by ``make test-faults`` (a step of ``.ci/run``),
not by ``make test``.
"""
from __future__ import annotations

import errno
import fnmatch
import gzip
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # script mode
    sys.path.insert(0, str(HERE))

import engine_toy_task  # noqa: E402,F401  (registers task "toy" and model "toy-mlp")
from engine_toy_task import TOY_SETS  # noqa: E402
from pointformers.cli import main  # noqa: E402
from pointformers.engine import load_checkpoint, read_metrics_csv, remove_stale_temporaries, save_checkpoint  # noqa: E402
from pointformers.engine.checkpoint import CheckpointError, content_hash  # noqa: E402
from pointformers.engine.run_folder import LOCK_NAME  # noqa: E402

pytestmark = pytest.mark.faults

KILLED = 86  #: exit status of a process the fault killed
PAUSED = "FAULT-PAUSED"
SETS = [*TOY_SETS, "--set", "train.tensorboard=false"]  # 4 epochs; best.pt improves every epoch
EPOCHS = 4
TIMING = {"seconds", "train_seconds"}  # wall-clock fields: the only ones allowed to differ


# ====================================================================== the fault
class _CutWriter(io.BufferedWriter):
    """A temporary file whose writes stop after ``limit`` bytes: the fault's action then runs with
    those bytes flushed to disk (a kill leaves a partial file; ENOSPC raises from ``write``)."""

    def __init__(self, raw: io.FileIO, limit: int, act: Callable[[], None]):
        super().__init__(raw)
        self._left, self._act = limit, act

    def write(self, b) -> int:
        b = memoryview(b).cast("B")
        if len(b) <= self._left:
            self._left -= len(b)
            return super().write(b)
        super().write(b[: self._left])
        self._left = 0
        self.flush()
        self._act()
        raise AssertionError("the fault's action returned")  # pragma: no cover - pause is not used here


class Fault:
    """The ``nth`` atomic write of a file whose name matches ``target`` (fnmatch) meets ``action``
    at ``stage``.

    Stages: ``create`` (the temporary file cannot be created), ``write`` (after 32 bytes of
    data), ``before-replace`` (the complete temporary file is about to be renamed onto the
    target), ``after-replace`` (renamed, the write not yet returned). Actions: ``exit``
    (``os._exit(KILLED)``), ``enospc`` / ``eacces`` (the OSError a full disk / read-only folder
    gives), ``pause`` (print :data:`PAUSED`, wait for a line on stdin, go on).
    """

    STAGES = ("create", "write", "before-replace", "after-replace")

    def __init__(self, target: str, nth: int, stage: str, action: str):
        assert stage in self.STAGES and action in ("exit", "enospc", "eacces", "pause"), (stage, action)
        self.target, self.nth, self.stage, self.action = target, nth, stage, action
        self.count = 0  # writes of the target started so far
        self.fds: set[int] = set()

    def act(self, path: str) -> None:
        if self.action == "exit":
            os._exit(KILLED)
        if self.action == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.action == "eacces":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        print(PAUSED, flush=True)
        sys.stdin.readline()

    def _now(self, stage: str) -> bool:
        return self.count == self.nth and self.stage == stage

    def install(self, setattr_: Callable[[Any, str, Any], None] = setattr) -> "Fault":
        real_mkstemp, real_fdopen, real_replace = tempfile.mkstemp, os.fdopen, os.replace

        def mkstemp(*args, **kwargs):
            prefix = kwargs.get("prefix") or ""
            hit = prefix.startswith(".") and prefix.endswith(".") and fnmatch.fnmatch(prefix[1:-1], self.target)
            if hit:
                self.count += 1
                if self._now("create"):
                    self.act(os.path.join(str(kwargs.get("dir", ".")), prefix + "XXXX.tmp"))
            fd, tmp = real_mkstemp(*args, **kwargs)
            if hit and self._now("write"):
                self.fds.add(fd)
            return fd, tmp

        def fdopen(fd, *args, **kwargs):
            if fd in self.fds:
                self.fds.discard(fd)
                return _CutWriter(io.FileIO(fd, "wb"), 32, lambda: self.act(""))
            return real_fdopen(fd, *args, **kwargs)

        def replace(src, dst, *args, **kwargs):
            hit = fnmatch.fnmatch(Path(dst).name, self.target)
            if hit and self._now("before-replace"):
                self.act(str(dst))
            real_replace(src, dst, *args, **kwargs)
            if hit and self._now("after-replace"):
                self.act(str(dst))

        setattr_(tempfile, "mkstemp", mkstemp)
        setattr_(os, "fdopen", fdopen)
        setattr_(os, "replace", replace)
        return self


class _Child:
    """``_script(argv)`` in a fork of this test process: the imports are done already (a fresh
    interpreter spends half a minute importing torch on a slow shared machine, and the suite starts
    16 of them). stdout goes to a pipe (``stdout``: read it line by line) when ``interactive``, with
    ``stdin`` a pipe too; otherwise to a file; stderr always to a file. Offers the parts of
    ``subprocess.Popen`` the tests use. A kill (``os._exit``) ends the fork exactly as it ends a
    process of its own: nothing flushed, no cleanup, the file system as the kill left it."""

    def __init__(self, argv: list[str], interactive: bool = False):
        self._err = tempfile.TemporaryFile()
        self._out = None if interactive else tempfile.TemporaryFile()
        out_r, out_w = os.pipe() if interactive else (None, self._out.fileno())
        in_r, in_w = os.pipe() if interactive else (None, None)
        sys.stdout.flush(), sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            code = 1
            try:
                os.dup2(out_w, 1)
                os.dup2(self._err.fileno(), 2)
                if in_r is not None:
                    os.dup2(in_r, 0)
                    os.close(in_w)
                    os.close(out_r)
                sys.stdin = open(0, closefd=False)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                os.environ.update(CI="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
                torch.set_num_threads(1)
                warnings.simplefilter("ignore")
                code = _script(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os._exit(code)
        self.returncode: int | None = None
        self.stdin = self.stdout = None
        if interactive:
            os.close(in_r), os.close(out_w)
            self.stdin, self.stdout = open(in_w, "w", buffering=1), open(out_r)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def communicate(self, input: str | None = None, timeout: float | None = None) -> tuple[str, str]:
        """Send ``input`` (interactive), wait for the exit; (stdout, stderr)."""
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        if self.stdout is not None:
            out = self.stdout.read()  # to the end: the child closes its end when it exits
            self.stdout.close()
        self.wait(timeout)
        if self._out is not None:
            self._out.seek(0)
            out = self._out.read().decode(errors="replace")
        self._err.seek(0)
        return out, self._err.read().decode(errors="replace")


def _faulty(fault: tuple, program: str, *args: str, interactive: bool = False) -> _Child:
    """``Fault(*fault)`` installed in a fork of this process, which then runs ``program``."""
    target, nth, stage, action = fault
    return _Child([target, str(nth), stage, action, program, *args], interactive)


def _run_faulty(fault: tuple, program: str, *args: str) -> subprocess.CompletedProcess:
    proc = _faulty(fault, program, *args)
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:  # hung: do not leave it behind
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess([program, *args], proc.returncode, out, err)


# ====================================================================== run state
def _normalised(o: Any, run: Path) -> Any:
    """``o`` without timings and content hashes (which cover them), with the run folder's path as "RUN"."""
    if isinstance(o, dict):
        return {k: _normalised(v, run) for k, v in o.items() if k not in TIMING and k != "sha256"}
    if isinstance(o, (list, tuple)):
        return type(o)(_normalised(v, run) for v in o)
    if isinstance(o, str):
        return o.replace(str(run), "RUN")
    return o


def _run_state(run: Path) -> dict[str, Any]:
    """Everything a run leaves, as comparable values."""
    state = {name: _normalised(load_checkpoint(run / name), run) for name in ("best.pt", "last.pt")}
    metrics = json.loads((run / "metrics.json").read_text())
    if metrics.get("config_changes") == []:  # a resumed run says "no change"; a straight one says nothing
        del metrics["config_changes"]
    state["metrics.json"] = _normalised(metrics, run)
    state["metrics.csv"] = [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics_csv(run / "metrics.csv")]
    state["config.yaml"] = (run / "config.yaml").read_text().replace(str(run), "RUN")
    state["files"] = sorted(p.name for p in run.iterdir())
    return state


def _assert_identical(a: Any, b: Any, where: str = "") -> None:
    """Bit-identical: tensors by dtype, shape and every element (NaN equal to NaN), floats exactly."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b) or torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for k in a:
            _assert_identical(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _completed_writes(run: Path, name: str) -> int:
    """How many writes of run file ``name`` the file on disk shows (0: absent); parses it fully,
    so a torn file fails here."""
    p = run / name
    if not p.exists():
        return 0
    if name.endswith(".pt"):
        return int(load_checkpoint(p)["epoch"])  # one write per epoch (best.pt: it improves every epoch)
    if name == "metrics.json":
        m = json.loads(p.read_text())
        return len(m["epochs"]) + (m["test"] is not None)  # one write per epoch, then the final one
    if name == "metrics.csv":
        return len(read_metrics_csv(p))
    assert name == "config.yaml"
    import yaml

    assert yaml.safe_load(p.read_text())["task"]["name"] == "toy"
    return 1


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _train(capsys, run: Path, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["train", *SETS, "--out", str(run), *extra])
    return rc, capsys.readouterr().err.strip()


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[str, Any]:
    """The uninterrupted run every faulty one must end up equal to."""
    run = tmp_path_factory.mktemp("straight") / "run"
    assert main(["train", *SETS, "--out", str(run)]) == 0
    state = _run_state(run)
    assert all(r["best"] for r in state["metrics.json"]["epochs"])  # best.pt is written every epoch
    assert len({r["train_loss"] for r in state["metrics.json"]["epochs"]}) == EPOCHS
    return {"state": state, "run": run}


def _assert_same_run(straight: dict, run: Path) -> None:
    assert not list(run.glob(".*.tmp")) and not (run / LOCK_NAME).exists()
    _assert_identical(straight["state"], _run_state(run))


# ====================================================================== kills during training
#: id: (target, nth write, stage, epoch of last.pt after the kill; None: no last.pt yet).
#: The nth write of a checkpoint or of metrics.csv is the one of epoch n; metrics.json's 5th is the final one.
TRAIN_KILLS = {
    "config.yaml-partial": ("config.yaml", 1, "write", None),
    "best.pt-partial-epoch3": ("best.pt", 3, "write", 2),
    "last.pt-partial-epoch3": ("last.pt", 3, "write", 2),
    "last.pt-before-rename-epoch3": ("last.pt", 3, "before-replace", 2),
    "last.pt-after-rename-epoch3": ("last.pt", 3, "after-replace", 3),
    "metrics.json-after-rename-epoch2": ("metrics.json", 2, "after-replace", 2),
    "metrics.csv-partial-epoch4": ("metrics.csv", 4, "write", 4),
    "metrics.json-before-final-rename": ("metrics.json", 5, "before-replace", 4),
}


@pytest.mark.parametrize("point", sorted(TRAIN_KILLS))
def test_kill_during_training_then_resume(point: str, straight, tmp_path: Path, capsys) -> None:
    target, nth, stage, last_epoch = TRAIN_KILLS[point]
    run = tmp_path / "run"
    proc = _run_faulty((target, nth, stage, "exit"), "train", *SETS, "--out", str(run))
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    # Every file on disk is complete; the target holds its previous write, or the new one once renamed.
    writes = {name: _completed_writes(run, name) for name in ("config.yaml", "best.pt", "last.pt", "metrics.json",
                                                              "metrics.csv")}
    assert writes[target] == (nth if stage == "after-replace" else nth - 1), writes
    assert writes["last.pt"] == (last_epoch or 0), writes
    # the kill really hit the write: its temporary file is still there (no cleanup could run)
    assert bool(list(run.glob(f".{target}.*.tmp"))) == (stage != "after-replace")
    assert (run / LOCK_NAME).exists()

    with pytest.warns(UserWarning, match="taking over the lock"):  # the dead run's lock
        rc, err = _train(capsys, run, "--resume")
    assert rc == 0, err
    _assert_same_run(straight, run)


# ====================================================================== kills inside single writes
def _checkpoint_version(i: int) -> dict:
    return {"model": {"w": torch.full((4096,), float(i)), "b": torch.arange(float(i))}, "epoch": i}


def _cache_build() -> dict[str, np.ndarray]:
    return {"a": np.arange(5000, dtype=np.float64) * 1.5, "b": np.array(["x", "yz"])}


CACHE_PARAMS = {"generator": "fault-test", "version": 1, "seed": 3}


@pytest.mark.parametrize("stage", ["write", "before-replace", "after-replace"])
def test_kill_inside_a_checkpoint_rewrite_keeps_old_or_new(stage: str, tmp_path: Path) -> None:
    path = tmp_path / "ck.pt"
    proc = _run_faulty(("ck.pt", 2, stage, "exit"), "checkpoint", str(path))
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    expected = 2 if stage == "after-replace" else 1
    ck = load_checkpoint(path)  # verifies the content hash: not torn
    assert ck["epoch"] == expected and torch.equal(ck["model"]["w"], _checkpoint_version(expected)["model"]["w"])
    left = remove_stale_temporaries(tmp_path, ("ck.pt",))
    assert bool(left) == (stage != "after-replace") and sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]


@pytest.mark.parametrize("stage", ["write", "before-replace", "after-replace"])
def test_kill_inside_a_cache_write_then_rebuild(stage: str, tmp_path: Path) -> None:
    from pointformers.data.cache import cache_path, cached_arrays, load_arrays

    proc = _run_faulty(("entry-*.npz", 1, stage, "exit"), "cache", str(tmp_path))
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    path = cache_path(tmp_path, "entry", CACHE_PARAMS)
    assert path.exists() == (stage == "after-replace")
    want = _cache_build()
    if path.exists():  # complete: a hit
        _assert_identical({k: v.tolist() for k, v in load_arrays(path, CACHE_PARAMS).items()},
                          {k: v.tolist() for k, v in want.items()})
    got = cached_arrays(tmp_path, "entry", CACHE_PARAMS, _cache_build)
    _assert_identical({k: v.tolist() for k, v in got.items()}, {k: v.tolist() for k, v in want.items()})
    assert load_arrays(path, CACHE_PARAMS) is not None  # stored now


# ====================================================================== concurrent runs
#: id: (target, nth, stage) where the first run pauses while a second one tries the folder.
PAUSES = {"before-config.yaml": ("config.yaml", 1, "before-replace"),
          "after-last.pt-epoch2": ("last.pt", 2, "after-replace")}


@pytest.mark.parametrize("point", sorted(PAUSES))
def test_second_run_into_a_folder_in_use_is_refused(point: str, straight, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    first = _faulty((*PAUSES[point], "pause"), "train", *SETS, "--out", str(run), interactive=True)
    watchdog = threading.Timer(900, first.kill)  # a hung first run must not hang the suite
    watchdog.start()
    try:
        lines = []
        while (line := first.stdout.readline()) and line.strip() != PAUSED:
            lines.append(line)
        assert line.strip() == PAUSED, "".join(lines) + first.communicate(timeout=900)[1][-3000:]
        before = _snapshot(run)
        assert before[LOCK_NAME].split()[0] == str(first.pid).encode()
        for flags in ([], ["--resume"], ["--overwrite"]):
            rc, err = _train(capsys, run, *flags)
            assert rc == 2 and err.count("\n") == 0, err
            if flags or "config.yaml" not in before:
                assert f"in use by another run (pid {first.pid}" in err and str(run) in err, err
            else:  # a folder that already holds run files is refused before the lock is even tried
                assert "already holds a run" in err, err
            assert _snapshot(run) == before, flags
        out, err = first.communicate("\n", timeout=900)
    finally:
        watchdog.cancel()
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err[-3000:]
    _assert_same_run(straight, run)


# ====================================================================== full disk, read-only folder
#: id: (target, nth write) whose data write fails with ENOSPC.
DISK_FULL = {"config.yaml": ("config.yaml", 1), "best.pt-epoch2": ("best.pt", 2), "last.pt-epoch3": ("last.pt", 3),
             "metrics.csv-epoch3": ("metrics.csv", 3), "metrics.json-final": ("metrics.json", 5)}


@pytest.mark.parametrize("point", sorted(DISK_FULL))
def test_disk_full_names_the_file_and_loses_nothing(point: str, straight, tmp_path: Path, capsys,
                                                     monkeypatch) -> None:
    target, nth = DISK_FULL[point]
    run = tmp_path / "run"
    with monkeypatch.context() as m:
        Fault(target, nth, "write", "enospc").install(m.setattr)
        rc, err = _train(capsys, run)
    assert rc == 2 and err.count("\n") == 0, err
    assert err.endswith(f"error: cannot write {run / target}: {os.strerror(errno.ENOSPC)}"), err
    assert _completed_writes(run, target) == nth - 1  # the previous write is intact
    assert not list(run.glob(".*.tmp")) and not (run / LOCK_NAME).exists()
    rc, err = _train(capsys, run, "--resume")
    assert rc == 0, err
    _assert_same_run(straight, run)


def _read_only(run: Path, monkeypatch) -> Callable[[], None]:
    """Make ``run`` read-only: ``chmod 0o500``, or as root (permissions do not stop root) a
    PermissionError from every file creation in it. Returns the undo."""
    if os.geteuid() != 0:
        run.chmod(0o500)
        return lambda: run.chmod(0o700)
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and Path(os.fspath(path)).parent == run:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    return lambda: monkeypatch.setattr(os, "open", real_open)


def test_read_only_folder_names_the_file_and_loses_nothing(straight, tmp_path: Path, capsys, monkeypatch) -> None:
    run = tmp_path / "run"
    # the folder turns read-only during epoch 3 (when last.pt is written)
    with monkeypatch.context() as m:
        Fault("last.pt", 3, "create", "eacces").install(m.setattr)
        rc, err = _train(capsys, run)
    assert rc == 2 and err.count("\n") == 0, err
    assert err.endswith(f"error: cannot write {run / 'last.pt'}: {os.strerror(errno.EACCES)}"), err
    assert _completed_writes(run, "last.pt") == 2 and not list(run.glob(".*.tmp")) and not (run / LOCK_NAME).exists()
    # resuming into it while it is read-only: refused before anything happens
    before = _snapshot(run)
    undo = _read_only(run, monkeypatch)
    try:
        rc, err = _train(capsys, run, "--resume")
    finally:
        undo()
    assert rc == 2 and err.count("\n") == 0, err
    assert f"cannot write {run / LOCK_NAME}: {os.strerror(errno.EACCES)}" in err, err
    assert _snapshot(run) == before
    rc, err = _train(capsys, run, "--resume")
    assert rc == 0, err
    _assert_same_run(straight, run)


# ====================================================================== damaged files
def _flip(data: bytes, i: int, value: int | None = None) -> bytes:
    b = bytearray(data)
    b[i] = value if value is not None else b[i] ^ 0xFF
    return bytes(b)


def _cut_mid_line(text: bytes, fraction: float, sep: bytes = b",") -> bytes:
    """``text`` cut right after the first ``sep`` of the line at ``fraction`` of the file: its last
    line then has too few fields."""
    start = text.index(b"\n", int(len(text) * fraction)) + 1
    return text[: text.index(sep, start) + 1]


def _raises_naming(fn: Callable[[], Any], name: str, pattern: str = "") -> str:
    """``fn()`` raises a ValueError (not a UnicodeDecodeError or numpy's own) whose message names ``name``."""
    with pytest.raises(ValueError) as info:
        fn()
    msg = str(info.value)
    assert not isinstance(info.value, UnicodeDecodeError), msg
    assert name in msg, msg
    if pattern:
        import re

        assert re.search(pattern, msg), msg
    return msg


# ------------------------------------------------------------------ TrackML CSV
TRACKML_KINDS = ("hits", "cells", "truth", "particles", "detectors")


@pytest.fixture(scope="module")
def trackml_event(tmp_path_factory) -> Path:
    from pointformers.data.tracking import TrackingParams, generate_event
    from pointformers.data.trackml import write_trackml_event

    folder = tmp_path_factory.mktemp("trackml")
    write_trackml_event(generate_event(TrackingParams(mu=5), seed=2, event_id=1000), folder, "event000001000")
    return folder


def _trackml_copy(src: Path, dst: Path, gz: bool) -> dict[str, Path]:
    """A copy of the event in ``dst``; every file gzip-compressed when ``gz``. Returns kind -> file."""
    dst.mkdir()
    files = {}
    for kind in TRACKML_KINDS:
        name = "detectors.csv" if kind == "detectors" else f"event000001000-{kind}.csv"
        data = (src / name).read_bytes()
        if gz:
            name += ".gz"
            data = gzip.compress(data, mtime=0)
        (dst / name).write_bytes(data)
        files[kind] = dst / name
    return files


def _read_trackml(folder: Path):
    from pointformers.data.trackml import read_trackml_event

    return read_trackml_event(folder / "event000001000")


@pytest.mark.parametrize("gz", [False, True], ids=["csv", "csv.gz"])
@pytest.mark.parametrize("kind", TRACKML_KINDS)
def test_trackml_truncated_files(trackml_event: Path, tmp_path: Path, kind: str, gz: bool) -> None:
    for k, fraction in enumerate((0.2, 0.5, 0.9)):
        files = _trackml_copy(trackml_event, tmp_path / f"e{k}", gz)
        p = files[kind]
        if gz:  # the compressed stream ends early
            data = p.read_bytes()
            p.write_bytes(data[: int(len(data) * fraction)])
            _raises_naming(lambda: _read_trackml(p.parent), p.name, "truncated or corrupted gzip")
        else:  # a cut inside a line: too few fields on the file's last line
            cut = _cut_mid_line(p.read_bytes(), fraction)
            p.write_bytes(cut)
            line = cut.count(b"\n") + 1
            _raises_naming(lambda: _read_trackml(p.parent), p.name, rf", line {line}: expected \d+ comma-separated")


#: What a file cut at a line boundary (its first half of lines kept: a valid, shorter CSV) gives.
#: Nothing is silent: a cross-file check fails, or a warning names the file.
TRACKML_LINE_CUTS = {
    "hits": ("error", "cells", r"line \d+: hit_id \d+ is not in .*hits\.csv"),
    "truth": ("error", "truth", r"no row for hit_id"),
    "detectors": ("error", "detectors", r"no module \(volume_id, layer_id, module_id\)"),
    "cells": ("warning", "cells", r"pixel hits have no cells"),
    "particles": ("warning", "particles", r"particles absent from this file"),
}


@pytest.mark.parametrize("kind", TRACKML_KINDS)
def test_trackml_file_cut_at_a_line_boundary(trackml_event: Path, tmp_path: Path, kind: str) -> None:
    files = _trackml_copy(trackml_event, tmp_path / "e", False)
    lines = files[kind].read_bytes().splitlines(keepends=True)
    files[kind].write_bytes(b"".join(lines[: len(lines) // 2]))
    outcome, named, pattern = TRACKML_LINE_CUTS[kind]
    if outcome == "error":
        _raises_naming(lambda: _read_trackml(files[kind].parent), files[named].name, pattern)
    else:
        with pytest.warns(UserWarning, match=pattern) as record:
            _read_trackml(files[kind].parent)
        assert any(files[named].name in str(w.message) for w in record)


@pytest.mark.parametrize("gz", [False, True], ids=["csv", "csv.gz"])
@pytest.mark.parametrize("kind", TRACKML_KINDS)
def test_trackml_flipped_byte_and_wrong_encoding(trackml_event: Path, tmp_path: Path, kind: str, gz: bool) -> None:
    # a byte in the middle turned into one that is not UTF-8 (plain) / a flipped byte of the compressed stream
    files = _trackml_copy(trackml_event, tmp_path / "flip", gz)
    p = files[kind]
    data = p.read_bytes()
    mid = len(data) // 2
    if gz:  # the gzip CRC fails, or the damaged text fails to parse first
        p.write_bytes(_flip(data, mid))
        _raises_naming(lambda: _read_trackml(p.parent), p.name, r"truncated or corrupted gzip|, line \d+")
    else:
        p.write_bytes(_flip(data, mid, 0xFF))
        line = data[:mid].count(b"\n") + 1
        _raises_naming(lambda: _read_trackml(p.parent), p.name, rf"not UTF-8 text \(line {line}\)")
    # the whole file in UTF-16
    files = _trackml_copy(trackml_event, tmp_path / "utf16", False)
    p = files[kind]
    data = p.read_text().encode("utf-16")
    if gz:
        p.unlink()
        p = p.with_name(p.name + ".gz")
        data = gzip.compress(data, mtime=0)
    p.write_bytes(data)
    _raises_naming(lambda: _read_trackml(p.parent), p.name, r"not UTF-8 text \(line 1\)")


# ------------------------------------------------------------------ Delphes / pile-up ROOT files
@pytest.fixture(scope="module")
def delphes_file(tmp_path_factory) -> Path:
    pytest.importorskip("uproot")
    from pointformers.data.delphes import write_delphes
    from pointformers.data.pileup import generate_events

    path = tmp_path_factory.mktemp("delphes") / "events.root"
    write_delphes(path, generate_events("pileup-tiny", 3, seed=7))
    return path


def _delphes_arrays(path: Path) -> list[list]:
    from pointformers.data.delphes import read_delphes

    fields = ("pt", "eta", "phi", "px", "py", "energy", "rapidity", "charge", "pdg", "is_pu")
    return [[getattr(ev, f).tolist() for f in fields] for ev in read_delphes(path)]


def test_delphes_truncated_and_flipped(delphes_file: Path, tmp_path: Path) -> None:
    data = delphes_file.read_bytes()
    original = _delphes_arrays(delphes_file)
    p = tmp_path / "damaged.root"
    for fraction in (0.0, 0.05, 0.3, 0.6, 0.95, 0.999):
        p.write_bytes(data[: int(len(data) * fraction)])
        _raises_naming(lambda: _delphes_arrays(p), str(p))
    # seeded flips: an error naming the file, or (a byte nothing reads) exactly the original events
    errors = 0
    for i in np.random.default_rng(0).choice(len(data), 24, replace=False):
        p.write_bytes(_flip(data, int(i)))
        try:
            got = _delphes_arrays(p)
        except ValueError as exc:
            assert str(p) in str(exc) and not isinstance(exc, UnicodeDecodeError), exc
            errors += 1
        else:
            assert got == original, f"flipped byte {i}: different events without an error"
    assert errors > 0


# ------------------------------------------------------------------ ModelNet / ShapeNetPart
from test_modelnet_io import root as modelnet_root  # noqa: E402,F401  (fixture)
from test_shapenetpart_io import root as shapenet_root  # noqa: E402,F401  (fixture)


def _text_damages(data: bytes) -> dict[str, tuple[bytes, str]]:
    """Damaged versions of a text file and the 1-based line its error must name."""
    mid = len(data) // 2
    out = {}
    for fraction in (0.3, 0.6):
        cut = _cut_mid_line(data, fraction, b"," if b"," in data else b" ")
        out[f"cut{fraction}"] = (cut, str(cut.count(b"\n") + 1))
    out["not-utf8"] = (_flip(data, mid, 0xFF), str(data[:mid].count(b"\n") + 1))
    out["utf16"] = (data.decode().encode("utf-16"), "1")
    return out


def _damaged_shape_file_is_named(shape: Path, load) -> None:
    """Every text damage of one point-cloud file makes ``load()`` fail naming the file and its line;
    the intact file is put back."""
    data = shape.read_bytes()
    for bad, line in _text_damages(data).values():
        shape.write_bytes(bad)
        _raises_naming(load, shape.name, rf"{shape.name}:{line}: |line {line}\b")
    shape.write_bytes(data)


def test_modelnet_damaged_files(modelnet_root) -> None:
    from pointformers.data.modelnet import load_modelnet_normal_resampled

    r, _ = modelnet_root
    _damaged_shape_file_is_named(r / "airplane" / "airplane_0001.txt",
                                 lambda: load_modelnet_normal_resampled(r, "train", num_points=16))
    names = r / "modelnet40_train.txt"
    names.write_bytes(names.read_text().encode("utf-16"))
    _raises_naming(lambda: load_modelnet_normal_resampled(r, "train", num_points=16), names.name, "not UTF-8")


def test_modelnet_h5_truncated(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    from pointformers.data.modelnet import load_modelnet_h5

    rng = np.random.default_rng(0)
    with h5py.File(tmp_path / "ply_data_train0.h5", "w") as f:
        f["data"] = rng.standard_normal((3, 64, 3)).astype(np.float32)
        f["label"] = np.array([[0], [1], [0]], np.uint8)
    (tmp_path / "train_files.txt").write_text("ply_data_train0.h5\n")
    (tmp_path / "shape_names.txt").write_text("airplane\nbathtub\n")
    assert len(load_modelnet_h5(tmp_path, "train", num_points=16)) == 3
    p = tmp_path / "ply_data_train0.h5"
    data = p.read_bytes()
    for fraction in (0.1, 0.5, 0.9):
        p.write_bytes(data[: int(len(data) * fraction)])
        _raises_naming(lambda: load_modelnet_h5(tmp_path, "train", num_points=16), p.name, "not a readable HDF5 file")


def test_shapenetpart_damaged_files(shapenet_root) -> None:
    from pointformers.data.shapenetpart import load_shapenetpart

    r, _ = shapenet_root
    _damaged_shape_file_is_named(r / "02691156" / "a1.txt", lambda: load_shapenetpart(r, "train", num_points=16))
    split = r / "train_test_split" / "shuffled_train_file_list.json"
    text = split.read_bytes()
    for bad in (text[: len(text) // 2], text.decode().encode("utf-16"), _flip(text, len(text) // 2, 0xFF)):
        split.write_bytes(bad)
        _raises_naming(lambda: load_shapenetpart(r, "train", num_points=16), split.name)
    split.write_bytes(text)
    cats = r / "synsetoffset2category.txt"
    cats.write_bytes(cats.read_text().encode("utf-16"))
    _raises_naming(lambda: load_shapenetpart(r, "train", num_points=16), cats.name, r"not UTF-8 text \(line 1\)")


# ------------------------------------------------------------------ checkpoints
def test_checkpoint_truncated_and_flipped(tmp_path: Path) -> None:
    path = tmp_path / "ck.pt"
    save_checkpoint(path, _checkpoint_version(7))
    data = path.read_bytes()
    original = load_checkpoint(path)
    for fraction in (0.0, 0.1, 0.5, 0.9, 0.999):
        path.write_bytes(data[: int(len(data) * fraction)])
        with pytest.raises(CheckpointError, match=rf"{path.name}.*(cannot be read|not a pointformers checkpoint)"):
            load_checkpoint(path)
    hashed = 0
    for i in np.random.default_rng(1).choice(len(data), 48, replace=False):
        path.write_bytes(_flip(data, int(i)))
        try:
            ck = load_checkpoint(path)
        except CheckpointError as exc:
            assert path.name in str(exc)
            hashed += "content hash mismatch" in str(exc)
        else:  # a byte torch does not read (zip padding, a header field it ignores): same content
            assert content_hash(ck) == content_hash(original), f"flipped byte {i}: different content"
    assert hashed > 0  # some flips landed in the weights: only the hash caught them


# ------------------------------------------------------------------ cache entries
@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty"])
def test_damaged_cache_entry_is_rebuilt(damage: str, tmp_path: Path) -> None:
    """A damaged entry is a miss (documented in data/cache.py): rebuilt and stored again, the
    result identical to a clean build -- never the damaged values."""
    from pointformers.data.cache import cache_path, cached_arrays, load_arrays

    cached_arrays(tmp_path, "entry", CACHE_PARAMS, _cache_build)
    path = cache_path(tmp_path, "entry", CACHE_PARAMS)
    data = path.read_bytes()
    # the array data sits before the zip's central directory: damage it there
    bad = {"truncated": data[: len(data) // 2], "flipped": _flip(data, len(data) // 3), "empty": b""}[damage]
    path.write_bytes(bad)
    assert load_arrays(path, CACHE_PARAMS) is None
    calls = []
    got = cached_arrays(tmp_path, "entry", CACHE_PARAMS, lambda: calls.append(1) or _cache_build())
    assert calls == [1]
    _assert_identical({k: v.tolist() for k, v in got.items()}, {k: v.tolist() for k, v in _cache_build().items()})
    assert path.read_bytes() != bad and load_arrays(path, CACHE_PARAMS) is not None


# ------------------------------------------------------------------ metrics.csv, config YAML
def test_metrics_csv_truncated_names_file_and_line(straight, tmp_path: Path) -> None:
    p = tmp_path / "metrics.csv"
    data = (straight["run"] / "metrics.csv").read_bytes()
    cut = _cut_mid_line(data, 0.5)
    p.write_bytes(cut)
    line = cut.count(b"\n") + 1
    _raises_naming(lambda: read_metrics_csv(p), p.name, rf"line {line}\b")


def _toy_config_text() -> str:
    from pointformers.engine.config import dump_config, load_config

    return dump_config(load_config(None, ["task.name=toy"]))


@pytest.mark.parametrize("damage", ["cut-in-key", "utf16", "not-utf8"])
def test_config_yaml_damaged(damage: str, tmp_path: Path) -> None:
    from pointformers.engine.config import load_config

    text = _toy_config_text().encode()
    i = text.index(b"lr:") + 1  # inside a key: "train:\n  ... l" is not valid YAML
    bad = {"cut-in-key": text[:i], "utf16": text.decode().encode("utf-16"), "not-utf8": _flip(text, i, 0xFF)}[damage]
    p = tmp_path / "config.yaml"
    p.write_bytes(bad)
    _raises_naming(lambda: load_config(p), str(p))


@pytest.mark.parametrize("damage", ["empty", "cut-after-key"])
def test_config_yaml_cut_to_a_valid_prefix_names_the_file(damage: str, tmp_path: Path) -> None:
    from pointformers.engine.config import load_config

    text = _toy_config_text().encode()
    bad = {"empty": b"", "cut-after-key": text[: text.index(b"grad_clip: ") + len(b"grad_clip: nu")]}[damage]
    p = tmp_path / "config.yaml"
    p.write_bytes(bad)
    _raises_naming(lambda: load_config(p), str(p))


# ====================================================================== adversarial tensors
from test_adversarial_inputs import OPTIONS  # noqa: E402  (its tests: NaN/inf padding, float64 input, 1e15 range)

from pointformers.attention import build  # noqa: E402
from pointformers.nn.model_inputs import MAX_MAGNITUDE  # noqa: E402

MECHANISMS = sorted(OPTIONS)


def _inputs(n: int = 40, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, n, 32, generator=g).to(dtype), torch.rand(2, n, 3, generator=g).to(dtype)


def _layer(name: str, dtype=torch.float32):
    torch.manual_seed(0)
    return build(name, dim=32, heads=4, **OPTIONS[name]).to(dtype).eval()


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("arg,value", [("x", float("nan")), ("x", float("-inf")), ("pos", float("inf")),
                                       ("pos", float("nan"))])
def test_non_finite_real_points_are_refused(name: str, arg: str, value: float) -> None:
    x, pos = _inputs()
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False
    (x if arg == "x" else pos)[1, 7, 1] = value
    with pytest.raises(ValueError, match=rf"^{name}: {arg} contains NaN or inf at real points"):
        _layer(name)(x, pos, mask)


@pytest.mark.parametrize("name", MECHANISMS)
def test_float64_range(name: str) -> None:
    """float64: finite output up to |x|, |pos| = 1e100; beyond, the input check refuses it
    (SFT, as in float32, stays finite further and is not refused)."""
    limit = MAX_MAGNITUDE[torch.float64]
    layer = _layer(name, torch.float64)
    x, pos = _inputs(dtype=torch.float64)
    assert bool(torch.isfinite(layer(x.clamp(-1, 1) * limit, pos * limit)).all())
    big = x.clone()
    big[0, 3, 5] = 1e101
    if name == "sft":
        assert bool(torch.isfinite(layer(big, pos)).all())
    else:
        with pytest.raises(ValueError, match=r"x has values up to 1e\+101 at real points"):
            layer(big, pos)


@pytest.mark.parametrize("name", MECHANISMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_modules(name: str, dtype: torch.dtype) -> None:
    """A module converted to bfloat16 / float16 takes inputs of its dtype (finite output; bfloat16
    up to 1e15 like float32), refuses float32 inputs naming x, and refuses integer tensors."""
    layer = _layer(name, dtype)
    x, pos = _inputs(dtype=dtype)
    assert bool(torch.isfinite(layer(x, pos)).all())
    if dtype == torch.bfloat16:
        scale = MAX_MAGNITUDE[torch.bfloat16] * 0.99  # bfloat16 rounding stays below the limit
        assert bool(torch.isfinite(layer((x.float().clamp(-1, 1) * scale).to(dtype), (pos.float() * scale).to(dtype))).all())
    with pytest.raises(ValueError, match=rf"x: dtype torch.float32 does not match the module's parameters \({dtype}\)"):
        layer(x.float(), pos.float())
    with pytest.raises(ValueError, match=rf"{name}: x must be a floating tensor, got dtype torch.int64"):
        layer(x.long(), pos)
    with pytest.raises(ValueError, match=rf"{name}: pos must be a floating tensor, got dtype torch.int32"):
        layer(x, (pos * 10).int())


@pytest.mark.parametrize("name", MECHANISMS)
def test_float16_extremes_are_refused_or_finite(name: str) -> None:
    """float16: finite up to the documented limit (1e4); near the top of its range, a clear refusal."""
    layer = _layer(name, torch.float16)
    x, pos = _inputs()
    limit = MAX_MAGNITUDE[torch.float16]
    assert bool(torch.isfinite(layer((x.clamp(-1, 1) * limit).half(), (pos * limit).half())).all())
    with pytest.raises(ValueError, match=r"has values up to .* at real points"):
        layer((x.clamp(-1, 1) * 6e4).half(), (pos * 6e4).half())


@pytest.mark.parametrize("name", MECHANISMS)
def test_float64_pos_beyond_the_float32_range_is_refused_or_finite(name: str) -> None:
    x, pos = _inputs()
    try:
        y = _layer(name)(x, pos.double() * 1e50)
    except ValueError as exc:
        assert "pos" in str(exc)
    else:
        assert bool(torch.isfinite(y).all())


@pytest.mark.parametrize("name", MECHANISMS)
def test_empty_and_one_point_clouds(name: str) -> None:
    layer = _layer(name)
    x, pos = _inputs()
    with pytest.raises(ValueError, match=rf"^{name}: x is empty \(shape \(2, 0, 32\)\)"):
        layer(x[:, :0], pos[:, :0])
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1] = False
    with pytest.raises(ValueError, match=rf"^{name}: mask marks cloud\(s\) \[1\] as empty"):
        layer(x, pos, mask)
    y = layer(x[:, :1], pos[:, :1])  # clouds of one point
    assert y.shape == (2, 1, 32) and bool(torch.isfinite(y).all())
    mask = torch.zeros(2, 40, dtype=torch.bool)  # one real point among padding; padding holds NaN
    mask[:, 0] = True
    x[:, 1:], pos[:, 1:] = float("nan"), float("nan")
    torch.manual_seed(1)
    y = layer(x, pos, mask)
    assert bool(torch.isfinite(y[mask]).all())
    torch.manual_seed(1)
    torch.testing.assert_close(y[:, :1], layer(x[:, :1], pos[:, :1]))  # the padding changes nothing


# ====================================================================== script mode
def _script(argv: list[str]) -> int:
    target, nth, stage, action, program, *args = argv
    Fault(target, int(nth), stage, action).install()
    if program == "train":
        return main(["train", *args])
    if program == "checkpoint":  # two versions of one checkpoint
        for i in (1, 2):
            save_checkpoint(args[0], _checkpoint_version(i))
        return 0
    if program == "cache":
        from pointformers.data.cache import cached_arrays

        cached_arrays(args[0], "entry", CACHE_PARAMS, _cache_build)
        return 0
    raise SystemExit(f"unknown program {program!r}")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    sys.exit(_script(sys.argv[1:]))
