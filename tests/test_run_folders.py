"""Run folders (issue 21, "nothing lost"): a finished run is never overwritten by accident, one
run at a time per folder (``RUN/.lock``, stale locks of crashed runs taken over), and a failed
``--resume`` leaves ``config.yaml`` alone. Uses the toy task of ``engine_toy_task``: fast."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import engine_toy_task  # noqa: F401  (registers task "toy" and model "toy-mlp")
from engine_toy_task import TOY_SETS
from pointformers.cli import main
from pointformers.engine.run_folder import LOCK_NAME, RunFolderError, RunLock, check_run_folder

SETS = [*TOY_SETS, "--set", "train.epochs=1"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _error(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    return capsys.readouterr().err


@pytest.fixture()
def finished(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    assert main(["train", *SETS, "--out", str(run)]) == 0
    assert {"config.yaml", "last.pt", "best.pt", "metrics.json", "metrics.csv"} <= set(os.listdir(run))
    assert not (run / LOCK_NAME).exists()  # released after a normal exit
    return run


def test_finished_run_is_refused_without_flags(finished: Path, capsys) -> None:
    (finished / "notes.txt").write_text("mine")
    before = _snapshot(finished)
    err = _error(capsys, ["train", *SETS, "--set", "train.lr=0.02", "--out", str(finished)])
    assert str(finished) in err and "--resume" in err and "--overwrite" in err
    assert _snapshot(finished) == before
    assert not (finished / LOCK_NAME).exists()


@pytest.mark.parametrize("name", ["config.yaml", "last.pt", "best.pt", "metrics.json", "metrics.csv"])
def test_any_run_file_makes_a_run_folder(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("x")
    with pytest.raises(RunFolderError, match="already holds a run"):
        check_run_folder(tmp_path)
    check_run_folder(tmp_path, resume=True)
    check_run_folder(tmp_path, overwrite=True)
    with pytest.raises(RunFolderError, match="exclude"):
        check_run_folder(tmp_path, resume=True, overwrite=True)


def test_unrelated_files_do_not_make_a_run_folder(tmp_path: Path, capsys) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert main(["train", *SETS, "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_overwrite_starts_a_new_run_and_keeps_other_files(finished: Path, capsys) -> None:
    (finished / "notes.txt").write_text("mine")
    old_config = (finished / "config.yaml").read_text()
    assert main(["train", *SETS, "--set", "train.lr=0.02", "--out", str(finished), "--overwrite"]) == 0
    assert (finished / "notes.txt").read_text() == "mine"
    assert (finished / "config.yaml").read_text() != old_config and "0.02" in (finished / "config.yaml").read_text()
    assert (finished / "last.pt").exists() and (finished / "best.pt").exists()
    assert not (finished / LOCK_NAME).exists()


def test_resume_of_a_finished_run_still_works(finished: Path, capsys) -> None:
    assert main(["train", *SETS, "--out", str(finished), "--resume"]) == 0
    assert "resuming from" in capsys.readouterr().out


def test_held_lock_refuses_a_second_run(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    with RunLock(run):  # this process holds it, as a running training would
        assert (run / LOCK_NAME).read_text().split() == [str(os.getpid()), socket.gethostname()]
        err = _error(capsys, ["train", *SETS, "--out", str(run)])
        assert f"pid {os.getpid()}" in err and "in use" in err
        assert not (run / "config.yaml").exists()
    assert not (run / LOCK_NAME).exists()
    assert main(["train", *SETS, "--out", str(run)]) == 0  # free again


def test_lock_held_by_another_process(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code = ("import sys, time; sys.path.insert(0, sys.argv[2]); "
            "from pointformers.engine.run_folder import RunLock; "
            "l = RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)")
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run), src], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderError, match=f"pid {proc.pid}"):
            RunLock(run).acquire()
    finally:
        proc.kill()
        proc.wait()
    with pytest.warns(UserWarning, match="taking over"):  # killed holder: its lock file is stale
        with RunLock(run):
            pass
    assert not (run / LOCK_NAME).exists()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / LOCK_NAME).write_text(f"{dead.pid} {socket.gethostname()}\n")
    with pytest.warns(UserWarning, match=f"pid {dead.pid}"):
        assert main(["train", *SETS, "--out", str(run)]) == 0
    assert (run / "best.pt").exists() and not (run / LOCK_NAME).exists()


def test_lock_released_on_exception(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        with RunLock(run):
            raise KeyboardInterrupt
    assert not (run / LOCK_NAME).exists()
    RunLock(run).acquire().release()


def test_failed_resume_leaves_config_unchanged(finished: Path, capsys) -> None:
    before = (finished / "config.yaml").read_bytes()
    (finished / "last.pt").write_bytes(b"not a checkpoint")  # e.g. a damaged disk
    assert main(["train", *SETS, "--set", "train.lr=0.02", "--out", str(finished), "--resume"]) != 0
    assert (finished / "config.yaml").read_bytes() == before
    assert not (finished / LOCK_NAME).exists()
    # a resume refused for a changed model (tests/test_resume_config.py): same
    (finished / "last.pt").unlink()
    assert main(["train", *SETS, "--out", str(finished), "--overwrite"]) == 0
    before = (finished / "config.yaml").read_bytes()
    assert main(["train", *SETS, "--set", "model.options.hidden=8", "--out", str(finished), "--resume"]) == 2
    assert (finished / "config.yaml").read_bytes() == before
    assert not (finished / LOCK_NAME).exists()
