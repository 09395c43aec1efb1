"""Run outputs and options on the toy task: metrics.csv == metrics.json, TensorBoard scalars,
``pointformers plot``, ``generate``, ``benchmark --config``, bf16 autocast and torch.compile."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import engine_toy_task  # noqa: F401  (registers task "toy" and model "toy-mlp")
from engine_toy_task import TOY_SETS, ToyMLP, ToyTask, make_samples
from pointformers.cli import main
from pointformers.engine import TrainConfig, fit, load_checkpoint, read_metrics_csv, write_metrics_csv
from pointformers.engine.logs import CSV_FIXED_COLUMNS, tensorboard_available

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("toy") / "run"
    assert main(["train", *TOY_SETS, "--set", "train.epochs=3", "--set", "train.tensorboard=null",
                 "--out", str(run)]) == 0
    return run


def test_csv_matches_json(toy_run: Path) -> None:
    epochs = json.loads((toy_run / "metrics.json").read_text())["epochs"]
    rows = read_metrics_csv(toy_run / "metrics.csv")
    header = (toy_run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header == [*CSV_FIXED_COLUMNS, "val/mse", "val/rmse", "val/count"]
    assert len(rows) == len(epochs) == 3
    for r, e in zip(rows, epochs):
        assert r["epoch"] == e["epoch"] and r["lr"] == e["lr"] and r["train_loss"] == e["train_loss"]  # full precision
        assert r["val/mse"] == e["val"]["mse"] and bool(r["best"]) == e["best"]


def test_csv_columns_are_stable_and_malformed_files_are_named(tmp_path: Path) -> None:
    hist = [{"epoch": 1, "lr": 0.1, "train_loss": 2.0, "val": {"a": 1.0}, "best": True},
            {"epoch": 2, "lr": 0.1, "train_loss": float("nan"), "val": {"a": 0.5, "b": 3.0}, "best": False}]
    write_metrics_csv(tmp_path / "m.csv", hist)
    rows = read_metrics_csv(tmp_path / "m.csv")
    assert rows[0]["val/b"] != rows[0]["val/b"]  # missing -> NaN, column still there
    assert rows[1]["val/b"] == 3.0 and rows[1]["train_loss"] != rows[1]["train_loss"]
    (tmp_path / "bad.csv").write_text("epoch,lr\n1,0.1\n2\n")
    with pytest.raises(ValueError, match=r"bad.csv: line 3: expected 2 columns"):
        read_metrics_csv(tmp_path / "bad.csv")


@pytest.mark.skipif(not tensorboard_available(), reason="tensorboard is not installed")
def test_tensorboard_scalars(toy_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(toy_run / "tensorboard"))
    acc.Reload()
    epochs = json.loads((toy_run / "metrics.json").read_text())["epochs"]
    assert [e.step for e in acc.Scalars("val/mse")] == [1, 2, 3]
    assert [e.value for e in acc.Scalars("val/mse")] == pytest.approx([e["val"]["mse"] for e in epochs], rel=1e-6)
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([e["train_loss"] for e in epochs], rel=1e-6)


def test_plot_draws_learning_curves(toy_run: Path, tmp_path: Path, capsys) -> None:
    assert main(["plot", str(toy_run), "--out", str(tmp_path)]) == 0
    png = tmp_path / "learning_curves.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5_000
    assert str(png) in capsys.readouterr().out
    err_code = main(["plot", str(tmp_path / "nope")])
    assert err_code == 2 and "no such folder" in capsys.readouterr().err


def test_generate_and_benchmark_config(tmp_path: Path, capsys) -> None:
    assert main(["generate", *TOY_SETS, "--splits", "train,val"]) == 0
    out = capsys.readouterr().out
    assert "train: 9 samples" in out and "val: 4 samples" in out
    assert main(["generate", *TOY_SETS, "--splits", "train,dev"]) == 2
    assert "--splits" in capsys.readouterr().err
    js = tmp_path / "b.json"
    assert main(["benchmark", "--config", str(_toy_yaml(tmp_path)), "--samples", "2", "--repeats", "1",
                 "--warmup", "0", "--json", str(js)]) == 0
    r = json.loads(js.read_text())
    assert r["num_samples"] == 2 and r["train_step_ms"] > 0 and r["evaluate_ms"] > 0
    assert r["parameters"] == sum(p.numel() for p in ToyMLP().parameters())
    assert "train step" in capsys.readouterr().out


def _toy_yaml(tmp_path: Path) -> Path:
    p = tmp_path / "toy.yaml"
    p.write_text("task: {name: toy}\ntrain: {epochs: 1}\n")
    return p


def _fit(tmp_path: Path, **kw) -> tuple[list[dict], dict]:
    torch.manual_seed(0)
    model = ToyMLP(dropout=0.0)
    cfg = TrainConfig(**{"epochs": 2, "lr": 0.01, "metric": "mse", "mode": "min", "progress": False,
                         "tensorboard": False, "device": "cpu", "batch_size": 2, **kw})
    res = fit(model, ToyTask(host_rng=False), make_samples(6, 0), make_samples(2, 1), cfg, tmp_path, "toy-mlp",
              {"dropout": 0.0}, log=None)
    return res.history, load_checkpoint(tmp_path / "last.pt")["model"]


def test_compile_and_bf16_options(tmp_path: Path) -> None:
    ref_hist, ref_w = _fit(tmp_path / "ref")
    # torch.compile with the "eager" backend runs the captured graph without codegen: the same numbers,
    # so this checks the wiring (train and eval through the compiled module, state_dict keys unchanged).
    hist, w = _fit(tmp_path / "compiled", compile="eager")
    assert [h["train_loss"] for h in hist] == pytest.approx([h["train_loss"] for h in ref_hist], rel=1e-6)
    assert set(w) == set(ref_w) and all(torch.allclose(w[k], ref_w[k], atol=1e-6) for k in w)
    # bf16 autocast: close to fp32 (bf16 keeps ~3 significant digits) but not identical.
    hist, _ = _fit(tmp_path / "bf16", precision="bf16")
    for a, b in zip(hist, ref_hist):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=0.05)
    assert [a["train_loss"] for a in hist] != [b["train_loss"] for b in ref_hist]


def test_tensorboard_true_without_package_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    from pointformers.engine import logs

    monkeypatch.setattr(logs, "tensorboard_available", lambda: False)
    with pytest.raises(ValueError, match="train.tensorboard: true, but the tensorboard package is not installed"):
        _fit(tmp_path, tensorboard=True)


def test_evaluate_prints_every_metric_and_uses_evaluate_report(toy_run: Path, capsys, monkeypatch) -> None:
    assert main(["evaluate", "--checkpoint", str(toy_run / "best.pt"), "--split", "val"]) == 0
    out = capsys.readouterr().out
    assert all(k in out for k in ("mse", "rmse", "count")) and "toy / val: 4 samples" in out
    seen = {}

    def report(self, model, val, test):  # settings chosen on val, scored on test
        seen["sizes"] = (len(val), len(test))
        return {**self.evaluate(model, test), "chosen_on_val": 0.25}

    monkeypatch.setattr(ToyTask, "evaluate_report", report, raising=False)
    assert main(["evaluate", "--checkpoint", str(toy_run / "best.pt")]) == 0
    out = capsys.readouterr().out
    assert seen["sizes"] == (4, 4) and "chosen_on_val" in out and "0.2500" in out
    test_mse = json.loads((toy_run / "metrics.json").read_text())["test"]["mse"]
    assert f"{test_mse:.4f}" in out
