"""Optimisers and learning-rate schedules of the engine (issue 22, "the papers' own training
recipes"): each against its PyTorch reference or the formula it documents, the default recipe
unchanged (Adam + per-epoch StepLR, built by hand here), validation naming the key, and the
``--resume`` rules for the new keys."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from pointformers.engine import TrainConfig, fit, load_checkpoint
from pointformers.engine.config import ConfigError, load_config
from pointformers.engine.schedules import (
    build_optimizer,
    build_scheduler,
    lr_factor,
    param_groups,
    scheduler_interval,
    warmup_length,
)

LR = 0.1


# ------------------------------------------------------------------------------ helpers
class Net(nn.Module):
    """Every kind of parameter ``decay_exempt`` sorts: weights, biases, norm weights, a 1-D
    scale and a weight shared by two layers."""

    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(4, 6)
        self.norm = nn.LayerNorm(6)
        self.bn = nn.BatchNorm1d(6)
        self.lin2 = nn.Linear(6, 3, bias=False)
        self.scale = nn.Parameter(torch.ones(3))
        self.tied = nn.Linear(6, 3, bias=False)
        self.tied.weight = self.lin2.weight

    def forward(self, x):
        h = self.bn(self.norm(torch.relu(self.lin1(x))))
        return (self.lin2(h) + self.tied(h)) * self.scale


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _data(n: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)) for _ in range(n)]


def _loss(model: nn.Module, sample) -> torch.Tensor:
    x, y = sample
    return ((model(x) - y) ** 2).mean()


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    data = _data()
    for i in range(steps):
        opt.zero_grad()
        _loss(model, data[i % len(data)]).backward()
        opt.step()


def _assert_same_params(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def _config(**kw) -> TrainConfig:
    return TrainConfig(**{"lr": LR, "epochs": 5, "progress": False, **kw}).validate()


def _engine_lrs(cfg: TrainConfig, steps_per_epoch: int, metrics=()) -> list[float]:
    """The rate of each optimiser step when the engine's scheduler is stepped as the trainer
    steps it (per step, per epoch or on the metric)."""
    opt = build_optimizer([nn.Parameter(torch.zeros(2))], cfg.lr, name="sgd")
    sched, interval = build_scheduler(opt, cfg, steps_per_epoch), scheduler_interval(cfg)
    lrs = []
    for epoch in range(cfg.epochs):
        for _ in range(steps_per_epoch):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            if interval == "step":
                sched.step()
        if interval == "epoch":
            sched.step()
        elif interval == "metric":
            sched.step(metrics[epoch])
    return lrs


def _torch_lrs(make, epochs: int, steps_per_epoch: int, per_step: bool) -> list[float]:
    """The same for a torch scheduler ``make(optimizer)``."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=LR)
    sched = make(opt)
    lrs = []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            if per_step:
                sched.step()
        if not per_step:
            sched.step()
    return lrs


# ------------------------------------------------------------------------------ optimisers
def test_adam_is_torch_adam_with_l2_decay() -> None:
    a, b = _net(), _net()
    _train(a, build_optimizer(param_groups(a), LR, 0.01, "adam", [0.8, 0.99], 1e-6), 12)
    _train(b, torch.optim.Adam(b.parameters(), lr=LR, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01), 12)
    _assert_same_params(a, b)


def test_adamw_decay_exempt_is_torch_adamw_with_two_groups() -> None:
    model = _net()
    groups = param_groups(model, decay_exempt=True)
    decayed = [model.lin1.weight, model.lin2.weight]  # the tied weight once
    exempt = [model.scale, model.lin1.bias, model.norm.weight, model.norm.bias, model.bn.weight, model.bn.bias]
    assert [id(p) for p in groups[0]["params"]] == [id(p) for p in decayed]
    assert [id(p) for p in groups[1]["params"]] == [id(p) for p in exempt] and groups[1]["weight_decay"] == 0.0
    assert "weight_decay" not in groups[0]  # the optimiser's value

    a, b, c = _net(), _net(), _net()
    _train(a, build_optimizer(param_groups(a, True), LR, 0.5, "adamw", [0.9, 0.98], 1e-7), 12)
    ref = torch.optim.AdamW([{"params": [b.lin1.weight, b.lin2.weight], "weight_decay": 0.5},
                             {"params": [b.scale, b.lin1.bias, b.norm.weight, b.norm.bias, b.bn.weight, b.bn.bias],
                              "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.98), eps=1e-7)
    _train(b, ref, 12)
    _assert_same_params(a, b)
    # without the exemption every parameter decays: torch's AdamW over all of them
    _train(c, build_optimizer(param_groups(c), LR, 0.5, "adamw", [0.9, 0.98], 1e-7), 12)
    d = _net()
    _train(d, torch.optim.AdamW(d.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-7, weight_decay=0.5), 12)
    _assert_same_params(c, d)
    assert not torch.equal(a.lin1.bias, c.lin1.bias)  # the exemption changed something


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_is_torch_sgd(nesterov: bool) -> None:
    a, b = _net(), _net()
    _train(a, build_optimizer(param_groups(a), LR, 1e-3, "sgd", momentum=0.9, nesterov=nesterov), 12)
    _train(b, torch.optim.SGD(b.parameters(), lr=LR, momentum=0.9, weight_decay=1e-3, nesterov=nesterov), 12)
    _assert_same_params(a, b)


# ------------------------------------------------------------------------------ schedules
@pytest.mark.parametrize("unit,spe", [("epoch", 3), ("step", 3)])
def test_step_is_torch_step_lr(unit: str, spe: int) -> None:
    cfg = _config(step_size=2, gamma=0.1, schedule_unit=unit)
    ref = _torch_lrs(lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.1), 5, spe, per_step=unit == "step")
    assert _engine_lrs(cfg, spe) == ref


@pytest.mark.parametrize("min_lr", [0.0, 0.01])
def test_cosine_per_epoch_is_cosine_annealing(min_lr: float) -> None:
    cfg = _config(schedule="cosine", min_lr=min_lr, epochs=7)
    ref = _torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7, eta_min=min_lr), 7, 3, False)
    got = _engine_lrs(cfg, 3)
    assert got == pytest.approx(ref, rel=1e-12, abs=1e-15)
    closed = [min_lr + (LR - min_lr) * (1 + math.cos(math.pi * (n // 3) / 7)) / 2 for n in range(21)]
    assert got == pytest.approx(closed, rel=1e-12, abs=1e-15)


def test_cosine_per_step_is_cosine_annealing_over_all_steps() -> None:
    cfg = _config(schedule="cosine", schedule_unit="step", min_lr=0.001, epochs=4)
    ref = _torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20, eta_min=0.001), 4, 5, True)
    assert _engine_lrs(cfg, 5) == pytest.approx(ref, rel=1e-12, abs=1e-15)


def test_cosine_per_step_with_warmup_is_linear_then_cosine() -> None:
    cfg = _config(schedule="cosine", schedule_unit="step", warmup_steps=4, min_lr=0.002, epochs=3)

    def make(o):
        warm = torch.optim.lr_scheduler.LinearLR(o, start_factor=1 / 4, end_factor=1.0, total_iters=3)
        cos = torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=15 - 4, eta_min=0.002)
        return torch.optim.lr_scheduler.SequentialLR(o, [warm, cos], milestones=[4])

    got = _engine_lrs(cfg, 5)
    assert got == pytest.approx(_torch_lrs(make, 3, 5, True), rel=1e-12, abs=1e-15)
    assert got[:5] == pytest.approx([LR / 4, LR / 2, 3 * LR / 4, LR, LR])


@pytest.mark.parametrize("unit,min_lr", [("epoch", 0.0), ("step", 0.0), ("step", 0.004)])
def test_linear_is_torch_linear_lr(unit: str, min_lr: float) -> None:
    cfg = _config(schedule="linear", schedule_unit=unit, min_lr=min_lr, epochs=4)
    total = 4 if unit == "epoch" else 4 * 5
    ref = _torch_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=min_lr / LR,
                                                                  total_iters=total), 4, 5, per_step=unit == "step")
    got = _engine_lrs(cfg, 5)
    assert got == pytest.approx(ref, rel=1e-12, abs=1e-15)
    closed = [min_lr + (LR - min_lr) * (1 - (n // 5 if unit == "epoch" else n) / total) for n in range(20)]
    assert got == pytest.approx(closed, rel=1e-12, abs=1e-15)


def test_linear_with_warmup_is_linear_up_then_linear_down_to_zero() -> None:
    # FLT's OC20 recipe (from Graphormer-3D): linear warm-up, then linear decay to zero
    cfg = _config(schedule="linear", schedule_unit="step", warmup_steps=4, epochs=3)

    def make(o):
        warm = torch.optim.lr_scheduler.LinearLR(o, start_factor=1 / 4, end_factor=1.0, total_iters=3)
        down = torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=15 - 4)
        return torch.optim.lr_scheduler.SequentialLR(o, [warm, down], milestones=[4])

    got = _engine_lrs(cfg, 5)
    assert got == pytest.approx(_torch_lrs(make, 3, 5, True), rel=1e-12, abs=1e-15)
    assert got[:5] == pytest.approx([LR / 4, LR / 2, 3 * LR / 4, LR, LR])
    assert got[-1] == pytest.approx(LR / 11) and all(a > b for a, b in zip(got[4:], got[5:]))


def test_step_with_warmup_formula() -> None:
    cfg = _config(step_size=3, gamma=0.5, schedule_unit="step", warmup_steps=2, epochs=2)
    assert scheduler_interval(cfg) == "step"
    expected = [LR * min(1.0, (n + 1) / 2) * 0.5 ** (max(0, n - 2) // 3) for n in range(10)]
    assert _engine_lrs(cfg, 5) == pytest.approx(expected, rel=1e-15)
    # per epoch: the decay counts epochs, the warm-up scales the first steps
    cfg = _config(step_size=1, gamma=0.5, warmup_steps=2, epochs=2)
    expected = [LR * min(1.0, (n + 1) / 2) * 0.5 ** (n // 5) for n in range(10)]
    assert _engine_lrs(cfg, 5) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("warmup_steps", [0, 4])
def test_inverse_sqrt_formula(warmup_steps: int) -> None:
    cfg = _config(schedule="inverse_sqrt", schedule_unit="step", warmup_steps=warmup_steps, epochs=3)
    w = max(warmup_steps, 1)
    expected = [LR * min(t / w, math.sqrt(w / t)) for t in range(1, 16)]  # t = 1-based step
    got = _engine_lrs(cfg, 5)
    assert got == pytest.approx(expected, rel=1e-14)
    assert max(got) == pytest.approx(LR) and got[w - 1] == pytest.approx(LR)


def test_untuned_warmup_is_ma_yarats() -> None:
    cfg = _config(schedule="constant", warmup="untuned", betas=[0.9, 0.98], epochs=30)
    assert warmup_length(cfg) == pytest.approx(100.0)  # 2 / (1 - 0.98)
    expected = [LR * min(1.0, (1 - 0.98) / 2 * t) for t in range(1, 151)]
    assert _engine_lrs(cfg, 5) == pytest.approx(expected, rel=1e-12)
    assert warmup_length(_config(warmup="untuned", optimizer="adamw")) == pytest.approx(2000.0)


def test_constant_is_constant() -> None:
    assert _engine_lrs(_config(schedule="constant"), 3) == [LR] * 15


@pytest.mark.parametrize("mode", ["min", "max"])
def test_plateau_is_reduce_lr_on_plateau(mode: str) -> None:
    metrics = [1.0, 0.5, 0.5, 0.7, 0.2, 0.2, 0.2, 0.9]
    cfg = _config(schedule="plateau", mode=mode, gamma=0.3, patience=1, min_lr=0.005, epochs=8)
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=LR)
    ref = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode=mode, factor=0.3, patience=1, min_lr=0.005)
    expected = []
    for m in metrics:
        expected += [opt.param_groups[0]["lr"]] * 2
        ref.step(m)
    got = _engine_lrs(cfg, 2, metrics)
    assert got == expected and len(set(got)) > 1


def test_lr_factor_is_a_plain_function() -> None:
    # LambdaLR saves a callable object's attributes in its state_dict and restores them over the
    # config's on resume; a plain function keeps the schedule a function of the config alone.
    cfg = _config(schedule="cosine", schedule_unit="step", warmup_steps=3)
    sched = build_scheduler(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR), cfg, 4)
    assert isinstance(sched, torch.optim.lr_scheduler.LambdaLR)
    assert sched.state_dict()["lr_lambdas"] == [None]
    assert lr_factor(cfg, 4)(0) == pytest.approx(1 / 3)


# ------------------------------------------------------------------------------ the engine
class RegTask:
    """Deterministic regression (no task randomness): a hand-written loop can follow it."""

    def __init__(self, metrics=None):
        self.metrics, self.calls = metrics, 0

    def loss(self, model, sample, generator=None):
        return _loss(model, sample)

    @torch.no_grad()
    def evaluate(self, model, samples):
        self.calls += 1
        model.eval()  # batch norm: no running-stat updates, the hand-written loop has none
        mse = float(sum(_loss(model, s) for s in samples)) / len(samples)
        return {"mse": self.metrics[self.calls - 1] if self.metrics else mse}


def _tc(**kw) -> TrainConfig:
    """An engine config for the regression task on the CPU (the hand-written loops run there)."""
    return TrainConfig(**{"metric": "mse", "mode": "min", "progress": False, "tensorboard": False, "device": "cpu",
                          **kw})


def _reference_fit(cfg: TrainConfig, make_opt, lr_of_step=None, make_sched=None) -> tuple[nn.Module, list[float]]:
    """The engine's loop by hand (seeded order, one sample per step, batch 1): per-epoch mean
    losses and the final weights. ``lr_of_step(n)`` sets the rate of step n; ``make_sched``:
    a torch scheduler stepped per epoch."""
    model = _net()
    opt = make_opt(model)
    sched = make_sched(opt) if make_sched else None
    gen = torch.Generator().manual_seed(cfg.seed)
    data, losses, n = _data(), [], 0
    for _ in range(cfg.epochs):
        model.train()
        total = 0.0
        for i in torch.randperm(len(data), generator=gen).tolist():
            if lr_of_step is not None:
                for g in opt.param_groups:
                    g["lr"] = lr_of_step(n)
            opt.zero_grad(set_to_none=True)
            loss = _loss(model, data[i])
            loss.backward()
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            total += float(loss.detach())
            n += 1
        losses.append(total / len(data))
        if sched is not None:
            sched.step()
    return model, losses


def _fit(cfg: TrainConfig, run: Path, task=None):
    model = _net()
    res = fit(model, task or RegTask(), _data(), _data(2), cfg, run, "net", {}, log=None)
    return load_checkpoint(run / "last.pt")["model"], res


def _assert_state_equal(state: dict, model: nn.Module) -> None:
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v), k


def test_default_recipe_unchanged(tmp_path: Path) -> None:
    """Adam with L2 decay + StepLR per epoch, as the engine built them before the new options."""
    cfg = _tc(epochs=4, lr=0.01, step_size=2, gamma=0.5, weight_decay=1e-3)
    state, res = _fit(cfg, tmp_path)
    model, losses = _reference_fit(cfg, lambda m: torch.optim.Adam(m.parameters(), lr=0.01, weight_decay=1e-3),
                                   make_sched=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5))
    assert [r["train_loss"] for r in res.history] == losses
    assert [r["lr"] for r in res.history] == [0.01, 0.01, 0.005, 0.005]
    _assert_state_equal(state, model)


def test_adamw_cosine_warmup_per_step_in_the_engine(tmp_path: Path) -> None:
    cfg = _tc(epochs=3, lr=0.01, weight_decay=0.1, optimizer="adamw", decay_exempt=True, betas=[0.9, 0.95],
              schedule="cosine", schedule_unit="step", warmup_steps=4, min_lr=1e-4, grad_clip=0.5)
    state, res = _fit(cfg, tmp_path)
    total, w, m = 3 * 6, 4, 1e-4 / 0.01

    def lr_of_step(n):  # the documented formula, in LambdaLR's arithmetic: lr * factor
        progress = min(1.0, max(0.0, n - w) / (total - w))
        return 0.01 * (min(1.0, (n + 1) / w) * (m + (1 - m) * (1 + math.cos(math.pi * progress)) / 2))

    def make_opt(model):
        return torch.optim.AdamW(param_groups(model, True), lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)

    model, losses = _reference_fit(cfg, make_opt, lr_of_step)
    assert [r["train_loss"] for r in res.history] == losses
    assert [r["lr"] for r in res.history] == [lr_of_step(0), lr_of_step(6), lr_of_step(12)]
    _assert_state_equal(state, model)


def test_sgd_plateau_in_the_engine_respects_mode(tmp_path: Path) -> None:
    # patience 0: a reduction after every epoch that does not improve on the best
    metrics = [0.5, 0.6, 0.4, 0.3, 0.3]
    cfg = _tc(epochs=5, lr=0.05, optimizer="sgd", momentum=0.9, nesterov=True, schedule="plateau", gamma=0.5,
              patience=0, mode="max")
    _, res = _fit(cfg, tmp_path, RegTask(metrics))
    assert [r["lr"] for r in res.history] == [0.05, 0.05, 0.05, 0.025, 0.0125]
    _, res = _fit(replace(cfg, mode="min"), tmp_path / "min", RegTask(metrics))
    assert [r["lr"] for r in res.history] == [0.05, 0.05, 0.025, 0.025, 0.025]


def test_plateau_can_watch_another_metric_than_the_checkpoint(tmp_path: Path) -> None:
    # the HEPT authors' pile-up recipe: best.pt by the main metric (max), the rate halved when the
    # validation loss (min) stops falling
    class TwoMetrics(RegTask):
        @torch.no_grad()
        def evaluate(self, model, samples):
            self.calls += 1
            return {"ap": [0.1, 0.2, 0.3, 0.4, 0.5][self.calls - 1], "loss": [1.0, 0.9, 0.95, 0.97, 0.99][self.calls - 1]}

    cfg = _tc(epochs=5, lr=0.05, schedule="plateau", gamma=0.5, patience=1, metric="ap", mode="max",
              plateau_metric="loss", plateau_mode="min")
    _, res = _fit(cfg, tmp_path, TwoMetrics())
    assert [r["lr"] for r in res.history] == [0.05, 0.05, 0.05, 0.05, 0.025]  # 2 epochs above 0.9
    assert res.best_epoch == 5  # the checkpoint still follows "ap"
    # without them the plateau watches "ap", which always rises: no reduction
    _, res = _fit(replace(cfg, plateau_metric=None, plateau_mode=None), tmp_path / "ap", TwoMetrics())
    assert [r["lr"] for r in res.history] == [0.05] * 5
    with pytest.raises(ValueError, match=r"plateau_metric: the task's evaluate\(\) returned no 'val_loss'"):
        _fit(replace(cfg, plateau_metric="val_loss"), tmp_path / "bad", TwoMetrics())


# ------------------------------------------------------------------------------ resume rules
def _stopped_then_resumed(cfg: TrainConfig, run: Path, stop_after: int, metrics=None):
    """Train until the task fails in epoch ``stop_after + 1``, then resume with the same config."""

    class Stop(RegTask):
        def loss(self, model, sample, generator=None):
            if self.calls == stop_after:
                raise RuntimeError("stopped")
            return super().loss(model, sample, generator)

    with pytest.raises(RuntimeError, match="stopped"):
        fit(_net(), Stop(metrics), _data(), _data(2), cfg, run, "net", {}, log=None)
    assert load_checkpoint(run / "last.pt")["epoch"] == stop_after
    task = RegTask(metrics[stop_after:] if metrics else None)
    res = fit(_net(), task, _data(), _data(2), cfg, run, "net", {}, resume=True, log=None)
    return load_checkpoint(run / "last.pt")["model"], res


@pytest.mark.parametrize("recipe,metrics", [
    (dict(optimizer="adamw", decay_exempt=True, weight_decay=0.1, schedule="cosine", schedule_unit="step",
          warmup_steps=5, min_lr=1e-4), None),
    (dict(optimizer="adam", schedule="inverse_sqrt", schedule_unit="step", warmup="untuned", betas=[0.9, 0.9]), None),
    (dict(optimizer="sgd", momentum=0.9, schedule="plateau", gamma=0.5, patience=0),
     [0.5, 0.6, 0.4, 0.45, 0.3, 0.31]),
    (dict(optimizer="adamw", betas=[0.9, 0.98], eps=1e-6, weight_decay=0.001, schedule="linear",
          schedule_unit="step", warmup_steps=4, grad_clip=5.0), None),
])
def test_stop_and_resume_equals_uninterrupted(tmp_path: Path, recipe: dict, metrics) -> None:
    cfg = _tc(epochs=6, lr=0.01, **recipe)
    straight, res_a = _fit(cfg, tmp_path / "a", RegTask(metrics))
    resumed, res_b = _stopped_then_resumed(cfg, tmp_path / "b", 3, metrics)
    assert [r["lr"] for r in res_b.history] == [r["lr"] for r in res_a.history]
    assert [r["train_loss"] for r in res_b.history] == [r["train_loss"] for r in res_a.history]
    for k, v in straight.items():
        assert torch.equal(v, resumed[k]), k
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    assert a["scheduler"] == b["scheduler"]
    if metrics:
        assert len({r["lr"] for r in res_a.history[3:]}) > 1  # the plateau reduced after the resume too


def test_resume_refuses_more_epochs_for_cosine_and_a_changed_recipe(tmp_path: Path) -> None:
    cfg = _tc(epochs=2, lr=0.01, schedule="cosine")
    _fit(cfg, tmp_path)
    with pytest.raises(ValueError, match=r"train\.epochs \(2 -> 3: schedule 'cosine' decays over the run's total"):
        fit(_net(), RegTask(), _data(), _data(2), replace(cfg, epochs=3), tmp_path, "net", {}, resume=True, log=None)
    with pytest.raises(ValueError, match=r"train\.optimizer \('adam' -> 'adamw'\), train\.schedule \('cosine' -> "
                                         r"'step'\)"):
        fit(_net(), RegTask(), _data(), _data(2), replace(cfg, optimizer="adamw", schedule="step"), tmp_path, "net",
            {}, resume=True, log=None)
    cfg = _tc(epochs=2, lr=0.01, schedule="linear", schedule_unit="step")
    _fit(cfg, tmp_path / "linear")
    with pytest.raises(ValueError, match=r"train\.epochs \(2 -> 3: schedule 'linear' decays over the run's total"):
        fit(_net(), RegTask(), _data(), _data(2), replace(cfg, epochs=3), tmp_path / "linear", "net", {},
            resume=True, log=None)
    # a per-step schedule that does not depend on the total takes more epochs
    cfg = _tc(epochs=2, lr=0.01, schedule="inverse_sqrt", schedule_unit="step", warmup_steps=3)
    _fit(cfg, tmp_path / "isqrt")
    res = fit(_net(), RegTask(), _data(), _data(2), replace(cfg, epochs=3), tmp_path / "isqrt", "net", {},
              resume=True, log=None)
    assert [r["epoch"] for r in res.history] == [1, 2, 3]


def test_accepted_schedule_change_that_cannot_carry_the_state_is_refused(tmp_path: Path) -> None:
    cfg = _tc(epochs=2, lr=0.01)
    _fit(cfg, tmp_path)
    before = (tmp_path / "last.pt").read_bytes()
    for other in (replace(cfg, schedule="cosine"), replace(cfg, schedule="plateau"),
                  replace(cfg, warmup_steps=3)):
        with pytest.raises(ValueError, match="holds the state of another kind of schedule than"):
            fit(_net(), RegTask(), _data(), _data(2), other, tmp_path, "net", {}, resume=True, log=None,
                accept_config_change=True)
    assert (tmp_path / "last.pt").read_bytes() == before


def test_resume_of_a_run_without_the_new_keys_compares_them_with_the_defaults(tmp_path: Path) -> None:
    from pointformers.engine import save_checkpoint

    cfg = _tc(epochs=2, lr=0.01)
    _fit(cfg, tmp_path)
    ck = load_checkpoint(tmp_path / "last.pt")
    new_keys = ("optimizer", "betas", "eps", "momentum", "nesterov", "decay_exempt", "schedule", "schedule_unit",
                "min_lr", "warmup", "warmup_steps", "patience")
    ck["train_config"] = {k: v for k, v in ck["train_config"].items() if k not in new_keys}  # an older version's
    save_checkpoint(tmp_path / "last.pt", ck)
    with pytest.raises(ValueError, match=r"train\.optimizer \('adam' -> 'sgd'\)"):
        fit(_net(), RegTask(), _data(), _data(2), replace(cfg, optimizer="sgd"), tmp_path, "net", {}, resume=True,
            log=None)
    res = fit(_net(), RegTask(), _data(), _data(2), replace(cfg, epochs=3), tmp_path, "net", {}, resume=True,
              log=None)
    assert [r["epoch"] for r in res.history] == [1, 2, 3]


# ------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("sets,message", [
    (["train.optimizer=adm"], "train.optimizer: must be one of adam, adamw, sgd, got 'adm'"),
    (["train.schedule=exponential"], "train.schedule: must be one of step, cosine, linear, inverse_sqrt, plateau, "
                                     "constant"),
    (["train.schedule_unit=batch"], "train.schedule_unit: must be one of epoch, step, got 'batch'"),
    (["train.warmup=cosine"], "train.warmup: must be one of null, linear, untuned, got 'cosine'"),
    (["train.betas=[0.9]"], "train.betas: must be two numbers in [0, 1)"),
    (["train.betas=[0.9, 1.0]"], "train.betas: must be two numbers in [0, 1)"),
    (["train.betas=[0.9, fast]"], "train.betas[1]: expected a number, got 'fast'"),
    (["train.eps=0"], "train.eps: must be a finite number > 0"),
    (["train.optimizer=sgd", "train.momentum=1.5"], "train.momentum: must be a number in [0, 1)"),
    (["train.momentum=0.9"], "train.momentum: only used by optimizer sgd"),
    (["train.optimizer=sgd", "train.nesterov=true"], "train.nesterov: needs momentum > 0"),
    (["train.min_lr=-1"], "train.min_lr: must be a finite number >= 0"),
    (["train.schedule=cosine", "train.min_lr=1"], "train.min_lr: must be <= lr"),
    (["train.schedule=linear", "train.min_lr=1"], "train.min_lr: must be <= lr"),
    (["train.plateau_metric=loss"], "train.plateau_metric: only used by schedule 'plateau'"),
    (["train.schedule=plateau", "train.plateau_mode=down"], "train.plateau_mode: must be one of null, max, min"),
    (["train.schedule=plateau", 'train.plateau_metric=""'], "train.plateau_metric: must be a non-empty string"),
    (["train.warmup_steps=-2"], "train.warmup_steps: must be an integer >= 0"),
    (["train.warmup=linear"], "train.warmup: 'linear' needs warmup_steps >= 1"),
    (["train.warmup=untuned", "train.warmup_steps=5"], "train.warmup_steps: must be 0 with warmup 'untuned'"),
    (["train.warmup=untuned", "train.optimizer=sgd"], "train.warmup: 'untuned' needs optimizer adam or adamw"),
    (["train.schedule=plateau", "train.warmup_steps=5"], "train.warmup: not supported with schedule 'plateau'"),
    (["train.schedule=plateau", "train.schedule_unit=step"], "train.schedule_unit: must be 'epoch' with schedule"),
    (["train.schedule=plateau", "train.gamma=1"], "train.gamma: must be < 1 with schedule 'plateau'"),
    (["train.schedule=inverse_sqrt"], "train.schedule_unit: must be 'step' with schedule 'inverse_sqrt'"),
    (["train.patience=-1"], "train.patience: must be an integer >= 0"),
    (["train.decay_exempt=maybe"], "train.decay_exempt: expected true or false"),
])
def test_bad_recipe_keys_are_named(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, sets)
    assert str(info.value).startswith(message), str(info.value)


def test_recipe_keys_resolve() -> None:
    cfg = load_config(None, ["train.optimizer=adamw", "train.betas=[0.9, 0.95]", "train.schedule=cosine",
                             "train.schedule_unit=step", "train.warmup=untuned", "train.decay_exempt=true"])
    tr = cfg["train"]
    assert tr["betas"] == [0.9, 0.95] and all(isinstance(b, float) for b in tr["betas"])
    assert (tr["optimizer"], tr["schedule"], tr["warmup"], tr["decay_exempt"]) == ("adamw", "cosine", "untuned", True)
    defaults = load_config(None, [])["train"]
    assert (defaults["optimizer"], defaults["schedule"], defaults["schedule_unit"], defaults["warmup"]) == \
        ("adam", "step", "epoch", None)
