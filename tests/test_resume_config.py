"""``--resume`` checks the config (issue 21, "resume trusts everything"): the run's stored train
and model config (``last.pt``) is compared with the one given now; more ``train.epochs`` is
taken and recorded, any other difference is refused naming the keys unless
``--accept-config-change`` (recorded in ``metrics.json`` and the log). Toy task: fast."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import engine_toy_task  # noqa: F401  (registers task "toy" and model "toy-mlp")
from engine_toy_task import TOY_SETS
from pointformers.cli import main
from pointformers.engine import TrainConfig, fit, load_checkpoint
from pointformers.engine.run_folder import LOCK_NAME

SETS = [*TOY_SETS, "--set", "train.epochs=2"]


def _metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    assert main(["train", *SETS, "--out", str(out)]) == 0
    return out


def test_more_epochs_is_taken_and_recorded(run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["train", *SETS, "--set", "train.epochs=4", "--out", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "resuming with train.epochs 2 -> 4" in out
    m = _metrics(run)
    assert [r["epoch"] for r in m["epochs"]] == [1, 2, 3, 4]
    assert m["config_changes"] == [{"epoch": 2, "changes": {"train.epochs": [2, 4]}, "accepted": []}]
    assert load_checkpoint(run / "last.pt")["config_changes"] == m["config_changes"]
    assert "epochs: 4" in (run / "config.yaml").read_text()


def test_same_config_resumes_without_changes(run: Path) -> None:
    assert main(["train", *SETS, "--out", str(run), "--resume"]) == 0
    assert _metrics(run)["config_changes"] == []


def test_display_options_are_not_compared(run: Path) -> None:
    assert main(["train", *SETS, "--set", "train.tensorboard=false", "--out", str(run), "--resume"]) == 0
    assert _metrics(run)["config_changes"] == []


def test_the_device_is_not_compared(run: Path) -> None:
    # a run started with device auto continues with an explicit device (another machine, a benchmark)
    assert main(["train", *SETS, "--set", "train.device=cpu", "--set", "train.epochs=3", "--out", str(run),
                 "--resume"]) == 0
    assert _metrics(run)["config_changes"] == [{"epoch": 2, "changes": {"train.epochs": [2, 3]}, "accepted": []}]


def test_other_changes_are_refused_naming_the_keys(run: Path, capsys) -> None:
    before = {p: (run / p).read_bytes() for p in ("config.yaml", "last.pt", "best.pt", "metrics.json")}
    capsys.readouterr()
    assert main(["train", *SETS, "--set", "train.lr=0.02", "--set", "model.options.hidden=8",
                 "--set", "train.epochs=4", "--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume: the config differs from the run's in train.lr (0.01 -> 0.02), model.options.hidden (" in err
    assert "-> 8)" in err and "--accept-config-change" in err
    assert "train.epochs" not in err  # takeable, not a reason to refuse
    assert {p: (run / p).read_bytes() for p in before} == before  # nothing changed
    assert not (run / LOCK_NAME).exists()


@pytest.mark.parametrize("setting,key", [("train.epochs=1", "train.epochs (2 -> 1)"),
                                         ("train.batch_size=2", "train.batch_size (1 -> 2)"),
                                         ("train.seed=3", "train.seed (42 -> 3)"),
                                         ("train.step_size=5", "train.step_size (2 -> 5)")])
def test_each_refused_change(run: Path, capsys, setting: str, key: str) -> None:
    capsys.readouterr()
    assert main(["train", *SETS, "--set", setting, "--out", str(run), "--resume"]) == 2
    assert key in capsys.readouterr().err


def test_accept_config_change_resumes_and_records(run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["train", *SETS, "--set", "train.lr=0.02", "--set", "train.epochs=3", "--out", str(run),
                 "--resume", "--accept-config-change"]) == 0
    out = capsys.readouterr().out
    assert "warning: resuming with a changed config (--accept-config-change)" in out and "train.lr 0.01 -> 0.02" in out
    m = _metrics(run)
    assert [r["epoch"] for r in m["epochs"]] == [1, 2, 3]
    assert m["config_changes"] == [{"epoch": 2, "changes": {"train.lr": [0.01, 0.02], "train.epochs": [2, 3]},
                                    "accepted": ["train.lr"]}]
    assert "lr: 0.02" in (run / "config.yaml").read_text()
    # the new values are now the run's: resuming with them again changes nothing more
    assert main(["train", *SETS, "--set", "train.lr=0.02", "--set", "train.epochs=3", "--out", str(run),
                 "--resume"]) == 0
    assert len(_metrics(run)["config_changes"]) == 1


def test_fit_refuses_a_changed_model_config(tmp_path: Path) -> None:
    cfg = TrainConfig(epochs=1, lr=1e-2, step_size=1, progress=False, metric="m", mode="min", tensorboard=False)

    class Task:
        def loss(self, model, sample, generator=None):
            return model(sample).pow(2).mean()

        def evaluate(self, model, samples):
            return {"m": 0.0}

    samples = [torch.ones(2, 3)]
    fit(torch.nn.Linear(3, 1), Task(), samples, samples, cfg, tmp_path, "linear", {"a": 1}, log=None)
    with pytest.raises(ValueError, match=r"model\.options\.a \(1 -> 2\), model\.options\.b \(None -> 3\)"):
        fit(torch.nn.Linear(3, 1), Task(), samples, samples, cfg, tmp_path, "linear", {"a": 2, "b": 3},
            resume=True, log=None)
    res = fit(torch.nn.Linear(3, 1), Task(), samples, samples, cfg, tmp_path, "linear", {"a": 2, "b": 3},
              resume=True, log=None, accept_config_change=True)
    assert res.history[-1]["epoch"] == 1


def test_accept_config_change_needs_resume(tmp_path: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["train", *SETS, "--out", str(tmp_path / "new"), "--accept-config-change"]) == 2
    assert "--accept-config-change: only used with --resume" in capsys.readouterr().err
