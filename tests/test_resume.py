"""Exact resume and crash safety of the engine, with real processes and SIGKILL.

* 4 epochs straight == 2 epochs, a process SIGKILLed during epoch 3, then ``--resume`` for
  the remaining 2 (same per-epoch losses, learning rates and metrics, same weights), on the toy
  task of ``engine_toy_task.py``, which draws from the engine's generator, dropout, numpy's and
  Python's global generators; with the default recipe (Adam, StepLR per epoch), AdamW with a
  per-step cosine schedule and warm-up, and SGD with a plateau schedule.
* A process that keeps rewriting a large checkpoint is SIGKILLed in the middle of a write:
  the previous checkpoint still loads and holds exactly what was written before.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import engine_toy_task  # noqa: F401  (registers task "toy" and model "toy-mlp")
from engine_toy_task import TOY_SETS
from pointformers.cli import main
from pointformers.engine import load_checkpoint, read_metrics_csv, remove_stale_temporaries

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "engine_toy_task.py"


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1", **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    return env


def _epochs(run: Path) -> list[dict]:
    return json.loads((run / "metrics.json").read_text())["epochs"]


RECIPES = {
    "default": [],
    # the warm-up ends inside epoch 1, the cosine decays per step over all 4 x 9 steps
    "adamw-cosine-warmup-per-step": ["train.optimizer=adamw", "train.weight_decay=0.05", "train.decay_exempt=true",
                                     "train.schedule=cosine", "train.schedule_unit=step", "train.warmup_steps=5",
                                     "train.min_lr=0.0001"],
    # mode max on the toy's mse, which falls every epoch: each epoch is a plateau, the rate halves
    "sgd-plateau": ["train.optimizer=sgd", "train.momentum=0.9", "train.schedule=plateau", "train.patience=0",
                    "train.mode=max"],
}


# the default recipe in `make test`; the other optimisers and schedules (one killed run each) in test-heavy
@pytest.mark.parametrize("recipe", [r if r == "default" else pytest.param(r, marks=pytest.mark.heavy) for r in RECIPES])
def test_sigkill_during_epoch_3_then_resume_equals_straight_run(tmp_path: Path, capsys, recipe: str) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    sets = [*TOY_SETS, *(x for s in RECIPES[recipe] for x in ("--set", s))]
    assert main(["train", *sets, "--out", str(straight)]) == 0

    proc = subprocess.run([sys.executable, str(SCRIPT), "cli", "train", *sets, "--out", str(killed)],
                          env=_env(TOY_KILL_AT_EPOCH="3"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert load_checkpoint(killed / "last.pt")["epoch"] == 2  # epochs 1-2 completed, epoch 3 died
    assert len(_epochs(killed)) == 2

    capsys.readouterr()
    assert main(["train", *sets, "--out", str(killed), "--resume"]) == 0
    assert "resuming from" in capsys.readouterr().out

    a, b = _epochs(straight), _epochs(killed)
    assert [r["epoch"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-6, abs=1e-9)
        assert rb["val"] == pytest.approx(ra["val"], rel=1e-6, abs=1e-9)
        assert rb["lr"] == ra["lr"] and rb["best"] == ra["best"]
    # The run really was random (noise, dropout, numpy/python draws): losses differ by epoch.
    assert len({round(r["train_loss"], 8) for r in a}) == 4
    if recipe != "default":  # the schedule really changed the rate, before and after the kill
        assert len({r["lr"] for r in a[:2]}) > 1 or len({r["lr"] for r in a[2:]}) > 1
        assert load_checkpoint(straight / "last.pt")["scheduler"] == load_checkpoint(killed / "last.pt")["scheduler"]
    for name in ("last.pt", "best.pt"):
        ca, cb = load_checkpoint(straight / name), load_checkpoint(killed / name)
        assert ca["epoch"] == cb["epoch"]
        for k, v in ca["model"].items():
            assert torch.allclose(v, cb["model"][k], rtol=1e-6, atol=1e-7), (name, k)
    ma = json.loads((straight / "metrics.json").read_text())
    mb = json.loads((killed / "metrics.json").read_text())
    assert mb["test"] == pytest.approx(ma["test"], rel=1e-6) and mb["best"] == pytest.approx(ma["best"], rel=1e-6)
    # metrics.csv was rewritten from the restored history: one row per epoch, no duplicates.
    rows = read_metrics_csv(killed / "metrics.csv")
    assert [r["epoch"] for r in rows] == [1.0, 2.0, 3.0, 4.0]
    assert [r["val/mse"] for r in rows] == pytest.approx([r["val"]["mse"] for r in a], rel=1e-6)


def test_sigkill_in_the_middle_of_a_checkpoint_write_keeps_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    for attempt in range(5):
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "rewrite", str(path), "24"], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "1", proc.stderr.read()[-2000:]  # one complete write
            deadline = time.monotonic() + 30
            tmp = []
            while time.monotonic() < deadline:  # wait until the next write has bytes on disk
                tmp = [p for p in tmp_path.glob(".last.pt.*.tmp") if p.exists() and p.stat().st_size > 1 << 20]
                if tmp:
                    break
                time.sleep(0.002)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        reported = [int(s) for s in proc.stdout.read().split()]
        last_reported = max([1] + reported)
        leftovers = list(tmp_path.glob(".last.pt.*.tmp"))
        if not leftovers:
            continue  # the kill landed between two writes; try again
        ck = load_checkpoint(path)
        i = ck["epoch"]
        # The file holds a complete earlier write: the last one reported, or one whose report was
        # still in the pipe when the process died -- never a mix.
        assert last_reported <= i <= last_reported + 1
        assert torch.equal(ck["model"]["w"], torch.full_like(ck["model"]["w"], float(i)))
        assert ck["model"]["w"].numel() == int(24 * 2**20 / 4)
        # The engine removes such leftovers when a run starts in this folder.
        assert remove_stale_temporaries(tmp_path, ("last.pt",)) and not list(tmp_path.glob(".*.tmp"))
        return
    pytest.fail("could not kill the writer in the middle of a write in 5 attempts")
