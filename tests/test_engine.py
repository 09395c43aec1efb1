"""Engine tests: atomic checkpoints, best-checkpoint selection, resume, and that training
on a tiny tracking cloud really lowers the InfoNCE loss."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from pointformers import models
from pointformers.engine import (
    CheckpointError,
    TrainConfig,
    fit,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    write_json,
)
from pointformers.engine import checkpoint as ckmod

TINY_MODEL = dict(n_layers=1, mlp_hidden=32, block_size=32, num_regions=4)


# ------------------------------------------------------------------------------ checkpoints
def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(64, 64, generator=g)}, "epoch": seed, "metric": 0.1 * seed}


def _fail_midway(exc: BaseException):
    """A torch.save stand-in that writes some real bytes, then fails like a crash."""
    real_save = torch.save

    def fake(obj, f, *args, **kwargs):
        real_save({"partial": torch.zeros(1000)}, f)  # plenty of bytes already on disk
        f.write(b"\x00garbage")
        raise exc

    return fake


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_failed_save_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc) -> None:
    path = tmp_path / "best.pt"
    save_checkpoint(path, _state(1))
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", _fail_midway(exc))
    with pytest.raises(type(exc)):
        save_checkpoint(path, _state(2))
    monkeypatch.undo()
    assert path.read_bytes() == before  # not clobbered, not even touched
    loaded = load_checkpoint(path)
    assert loaded["epoch"] == 1 and torch.equal(loaded["model"]["w"], _state(1)["model"]["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]  # no temporary left behind


def test_failed_first_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "save", _fail_midway(OSError("no space left")))
    with pytest.raises(OSError):
        save_checkpoint(tmp_path / "last.pt", _state(3))
    assert list(tmp_path.iterdir()) == []


def test_save_replaces_atomically_and_roundtrips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "c.pt"
    save_checkpoint(path, _state(1))
    save_checkpoint(path, _state(2))
    got = load_checkpoint(path)
    assert got["epoch"] == 2 and got["format"] == ckmod.CHECKPOINT_FORMAT
    assert torch.equal(got["model"]["w"], _state(2)["model"]["w"])


def test_load_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "missing.pt")
    good = tmp_path / "good.pt"
    save_checkpoint(good, _state(1))
    trunc = tmp_path / "trunc.pt"
    trunc.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="trunc.pt"):
        load_checkpoint(trunc)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="not a pointformers checkpoint"):
        load_checkpoint(foreign)
    with pytest.raises(CheckpointError, match="missing entries"):
        load_checkpoint(good, required=("model", "optimizer"))
    assert issubclass(CheckpointError, ValueError)
    with pytest.raises(ValueError, match="'model'"):
        save_checkpoint(tmp_path / "x.pt", {"epoch": 1})


def test_write_json_nan_is_null(tmp_path: Path) -> None:
    write_json(tmp_path / "m.json", {"a": float("nan"), "b": [1.5, float("inf")], "c": torch.tensor(2.0)})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": None, "b": [1.5, None], "c": 2.0}


def test_model_from_checkpoint_rebuilds_same_function(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = dict(TINY_MODEL)
    model = models.build("hept-tracking", **cfg).eval()
    save_checkpoint(tmp_path / "m.pt", {"model": model.state_dict(), "model_name": "hept-tracking", "model_config": cfg})
    torch.manual_seed(123)  # a different init must be fully overwritten
    again = model_from_checkpoint(tmp_path / "m.pt")
    x, c = torch.randn(50, 15), torch.randn(50, 6)
    assert torch.equal(model(x, c), again(x, c))
    bad = tmp_path / "bad.pt"
    save_checkpoint(bad, {"model": model.state_dict(), "model_name": "hept-tracking",
                          "model_config": {**cfg, "n_layers": 2}})
    with pytest.raises(CheckpointError, match="do not fit"):
        model_from_checkpoint(bad)


# ------------------------------------------------------------------------------ trainer
class ScriptedTask:
    """Loss = mean squared output (a real gradient); evaluate() returns scripted metrics and
    records the weights it saw, so tests can check which epoch best.pt holds."""

    def __init__(self, metrics: list[float], fail_at_epoch: int | None = None, nan_at_epoch: int | None = None):
        self.metrics, self.fail_at, self.nan_at = metrics, fail_at_epoch, nan_at_epoch
        self.seen: list[dict] = []
        self.epoch = 1
        self.draws: list[float] = []

    def loss(self, model, sample, generator=None):
        if self.fail_at == self.epoch:
            raise RuntimeError("simulated crash")
        self.draws.append(float(torch.rand(1, generator=generator)))  # uses the engine's generator
        out = model(sample)
        if self.nan_at == self.epoch:
            return out.sum() * float("nan")
        return (out ** 2).mean()

    def evaluate(self, model, samples):
        self.seen.append({k: v.clone() for k, v in model.state_dict().items()})
        value = self.metrics[len(self.seen) - 1]
        self.epoch += 1
        return {"ap@k": value, "other": 1.0}


def _lin_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def _samples(n: int = 5) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(7, 4, generator=g) for _ in range(n)]


def test_best_checkpoint_holds_best_val_epoch(tmp_path: Path) -> None:
    task = ScriptedTask([0.2, 0.7, 0.5, 0.6])
    model = _lin_model()
    res = fit(model, task, _samples(), _samples(2), TrainConfig(epochs=4, lr=1e-2, step_size=2, progress=False),
              tmp_path, "linear", {}, log=None)
    assert res.best_epoch == 2 and res.best_metric == pytest.approx(0.7)
    best = load_checkpoint(tmp_path / "best.pt")
    assert best["epoch"] == 2 and best["metric"] == pytest.approx(0.7) and best["metric_name"] == "ap@k"
    for k, v in best["model"].items():
        assert torch.equal(v, task.seen[1][k])  # the weights evaluated at epoch 2
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 4
    # After fit the model holds the best weights.
    assert all(torch.equal(v, task.seen[1][k]) for k, v in model.state_dict().items())
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert [e["epoch"] for e in m["epochs"]] == [1, 2, 3, 4]
    assert [e["val"]["ap@k"] for e in m["epochs"]] == pytest.approx([0.2, 0.7, 0.5, 0.6])
    assert m["best"] == {"epoch": 2, "ap@k": pytest.approx(0.7)}
    # StepLR(step_size=2, gamma=0.5) per epoch: 1e-2, 1e-2, 5e-3, 5e-3.
    assert [e["lr"] for e in m["epochs"]] == pytest.approx([1e-2, 1e-2, 5e-3, 5e-3])


class ThresholdTask(ScriptedTask):
    """A ScriptedTask whose validation also chooses a model option (``threshold``, 0.1·epoch), as the
    track reconstruction's assignment threshold is chosen on validation clouds."""

    def __init__(self, metrics):
        super().__init__(metrics)
        self.fixed = None
        self.evaluated_with: list = []

    def evaluate(self, model, samples):
        out = super().evaluate(model, samples) if len(self.seen) < len(self.metrics) else {"ap@k": 0.0}
        out["threshold"] = self.fixed if self.fixed is not None else 0.1 * (self.epoch - 1)
        self.evaluated_with.append(out["threshold"])
        return out

    def validated_options(self, metrics):
        return {"threshold": metrics["threshold"]}

    def use_validated(self, model, options):
        model.threshold = self.fixed = options["threshold"]


def test_options_chosen_on_validation_go_into_best_checkpoint_and_the_test_pass(tmp_path: Path) -> None:
    """A task's validated options (validated_options) of the best epoch are stored in best.pt's model
    config (a model rebuilt from it uses them; last.pt keeps the run's config for resume checks) and
    fixed on the model before the test pass (use_validated), which then uses them instead of choosing
    on the test samples; a resumed run keeps the best epoch's options."""
    task = ThresholdTask([0.2, 0.7, 0.5])
    model = _lin_model()
    res = fit(model, task, _samples(), _samples(2), TrainConfig(epochs=3, lr=1e-2, progress=False),
              tmp_path, "linear", {"width": 4}, test=_samples(2), log=None)
    assert res.best_epoch == 2
    assert load_checkpoint(tmp_path / "best.pt")["model_config"] == {"width": 4, "threshold": pytest.approx(0.2)}
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["model_config"] == {"width": 4} and last["best_options"] == {"threshold": pytest.approx(0.2)}
    assert model.threshold == pytest.approx(0.2) and task.evaluated_with[-1] == pytest.approx(0.2)
    assert res.test["threshold"] == pytest.approx(0.2)  # not the 0.3 a 4th choice would give
    # resumed after the last epoch (nothing left to train): the best epoch's options still reach the test pass
    task2 = ThresholdTask([0.1])
    res2 = fit(_lin_model(), task2, _samples(), _samples(2), TrainConfig(epochs=3, lr=1e-2, progress=False),
               tmp_path, "linear", {"width": 4}, test=_samples(2), resume=True, log=None)
    assert res2.test["threshold"] == pytest.approx(0.2)


def test_min_mode_and_nan_metrics(tmp_path: Path) -> None:
    res = fit(_lin_model(), ScriptedTask([float("nan"), 3.0, 1.0, 2.0]), _samples(), _samples(1),
              TrainConfig(epochs=4, mode="min", progress=False), tmp_path, "linear", {}, log=None)
    assert res.best_epoch == 3 and load_checkpoint(tmp_path / "best.pt")["epoch"] == 3


def test_crash_mid_training_keeps_best_checkpoint(tmp_path: Path) -> None:
    fit(_lin_model(), ScriptedTask([0.5, 0.9]), _samples(), _samples(1), TrainConfig(epochs=2, progress=False),
        tmp_path, "linear", {}, log=None)
    before = (tmp_path / "best.pt").read_bytes()
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(_lin_model(), ScriptedTask([0.1, 0.2, 0.3], fail_at_epoch=2), _samples(), _samples(1),
            TrainConfig(epochs=3, progress=False), tmp_path / "run2", "linear", {}, log=None)
    assert load_checkpoint(tmp_path / "run2" / "best.pt")["epoch"] == 1  # the completed epoch survives
    assert (tmp_path / "best.pt").read_bytes() == before
    with pytest.raises(FloatingPointError, match="loss is nan"):
        fit(_lin_model(), ScriptedTask([0.1, 0.2], nan_at_epoch=2), _samples(), _samples(1),
            TrainConfig(epochs=2, progress=False), tmp_path / "run3", "linear", {}, log=None)
    assert load_checkpoint(tmp_path / "run3" / "last.pt")["epoch"] == 1


def test_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    cfg = TrainConfig(epochs=4, lr=1e-2, step_size=1, gamma=0.5, seed=7, progress=False)
    full_task = ScriptedTask([0.1, 0.2, 0.3, 0.4])
    full = _lin_model()
    fit(full, full_task, _samples(), _samples(1), cfg, tmp_path / "full", "linear", {}, log=None)
    part = _lin_model()
    fit(part, ScriptedTask([0.1, 0.2]), _samples(), _samples(1), TrainConfig(**{**cfg.__dict__, "epochs": 2}),
        tmp_path / "part", "linear", {}, log=None)
    resumed_task = ScriptedTask([0.3, 0.4])
    part = _lin_model()
    res = fit(part, resumed_task, _samples(), _samples(1), cfg, tmp_path / "part", "linear", {}, resume=True, log=None)
    assert [e["epoch"] for e in res.history] == [1, 2, 3, 4]
    assert resumed_task.draws == full_task.draws[-len(resumed_task.draws):]  # generator state restored
    for k, v in full.state_dict().items():
        assert torch.allclose(v, part.state_dict()[k], atol=0, rtol=0)


@pytest.mark.parametrize("field,value,match", [
    ("epochs", 0, "epochs"), ("lr", -1.0, "lr"), ("lr", float("nan"), "lr"), ("step_size", 0, "step_size"),
    ("gamma", 1.5, "gamma"), ("mode", "best", "mode"), ("seed", -3, "seed"), ("epochs", 2.5, "epochs"),
    ("optimizer", "lamb", "optimizer: must be one of adam, adamw, sgd"), ("betas", [0.9], "betas"),
    ("schedule", "onecycle", "schedule: must be one of"), ("schedule_unit", "batch", "schedule_unit"),
    ("warmup", "exp", "warmup"), ("warmup_steps", 1.5, "warmup_steps"), ("min_lr", -1e-3, "min_lr"),
])
def test_train_config_validation(field, value, match) -> None:
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{field: value}).validate()


def test_empty_splits_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train"):
        fit(_lin_model(), ScriptedTask([0.1]), [], _samples(1), TrainConfig(epochs=1), tmp_path, "linear", {}, log=None)
    with pytest.raises(ValueError, match="val"):
        fit(_lin_model(), ScriptedTask([0.1]), _samples(), [], TrainConfig(epochs=1), tmp_path, "linear", {}, log=None)


# ------------------------------------------------------------------------------ tracking
@pytest.fixture(scope="module")
def tiny_clouds(tmp_path_factory):
    from pointformers.data.tracking import load_tracking_dataset
    from pointformers.tasks.tracking.training import prepare_tracking_clouds

    cache = tmp_path_factory.mktemp("cache")
    train = load_tracking_dataset("tiny", "train", cache_dir=cache)
    val = load_tracking_dataset("tiny", "val", cache_dir=cache)
    return prepare_tracking_clouds(train[:3]), prepare_tracking_clouds(val, with_pairs=False)


def test_cloud_pairs_match_build_tracking_pairs(tiny_clouds) -> None:
    from pointformers.tasks.tracking import build_tracking_pairs

    cloud = tiny_clouds[0][0]
    ref = build_tracking_pairs(cloud.inputs)
    got = cloud.pairs()
    key = lambda e: set(map(tuple, e.t().tolist()))  # noqa: E731
    assert key(got.edge_index) == key(ref.edge_index) and got.num_pairs == ref.num_pairs
    lab = dict(zip(map(tuple, ref.edge_index.t().tolist()), ref.is_positive.tolist()))
    assert all(lab[e] == p for e, p in zip(map(tuple, got.edge_index.t().tolist()), got.is_positive.tolist()))
    assert torch.equal(got.eligible, ref.eligible)
    assert not tiny_clouds[1][0].has_pairs
    with pytest.raises(ValueError, match="no pairs"):
        tiny_clouds[1][0].pairs()


def test_training_steps_reduce_infonce(tiny_clouds) -> None:
    from pointformers.tasks.tracking.training import TrackingTask

    train, _ = tiny_clouds
    torch.manual_seed(0)
    model = models.build("hept-tracking", dropout=0.0, **TINY_MODEL)
    fixed = TrackingTask(random_pairs=0.0)  # the same pairs before and after: comparable losses
    with torch.no_grad():
        before = sum(float(fixed.loss(model, c)) for c in train)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    task, gen = TrackingTask(), torch.Generator().manual_seed(0)
    for _ in range(8):
        for c in train:
            loss = task.loss(model, c, gen)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        after = sum(float(fixed.loss(model, c)) for c in train)
    assert after < 0.9 * before, (before, after)


def test_fit_on_tiny_tracking_writes_consistent_files(tiny_clouds, tmp_path: Path) -> None:
    from pointformers.tasks.tracking.training import TrackingTask

    train, val = tiny_clouds
    torch.manual_seed(0)
    model = models.build("hept-tracking", **TINY_MODEL)
    task = TrackingTask()
    res = fit(model, task, train, val, TrainConfig(epochs=2, lr=1e-3, progress=False), tmp_path, "hept-tracking",
              TINY_MODEL, test=val, log=None)
    best = load_checkpoint(tmp_path / "best.pt")
    vals = [e["val"]["ap@k"] for e in res.history]
    assert best["epoch"] == 1 + max(range(len(vals)), key=lambda i: vals[i])
    again = model_from_checkpoint(tmp_path / "best.pt")
    assert task.evaluate(again, val)["ap@k"] == pytest.approx(best["metric"])
    assert res.test["ap@k"] == pytest.approx(best["metric"])  # test = val here, best weights restored
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["test"]["ap@k"] == pytest.approx(res.test["ap@k"]) and len(m["epochs"]) == 2
