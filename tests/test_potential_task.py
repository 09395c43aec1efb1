"""Pair-potential task: energy standardisation, L1 loss, MAE in energy units, config checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pointformers.data.sets import Configuration
from pointformers.tasks import metrics
from pointformers.tasks.potential import PairPotentialTask, energy_standardisation, potential_pool
from pointformers.tasks.registry import get_task


def _confs():
    g = np.random.default_rng(0)
    out = []
    for n, e in ((2, 1.0), (3, 5.0), (4, 3.0)):
        out.append(Configuration(g.standard_normal((n, 3)).astype(np.float32), np.arange(n) % 2, e, np.full(n, e / n),
                                 np.zeros((n, 3))))
    return out


class Const(nn.Module):
    def __init__(self, value=0.0):
        super().__init__()
        self.c = nn.Parameter(torch.tensor(float(value)))

    def forward(self, x, pos, mask=None):
        return self.c * torch.ones(pos.shape[0])


def test_standardisation_is_the_least_squares_per_atom_energy():
    mu, sigma = energy_standardisation(_confs())
    # mu = (2*1 + 3*5 + 4*3) / (4 + 9 + 16) = 29 / 29 = 1; residuals -1, 2, -1 -> std sqrt(2)
    assert mu == pytest.approx(1.0) and sigma == pytest.approx(np.sqrt(2.0))


def test_mae_is_in_energy_units_and_equals_the_metrics_module():
    confs = _confs()
    mu, sigma = energy_standardisation(confs)
    samples = potential_pool(confs, 2, mu, sigma).batches(2)
    out = PairPotentialTask().evaluate(Const(0.0), samples)
    # prediction mu*n = 2, 3, 4 against 1, 5, 3 -> |errors| 1, 2, 1
    assert out["mae"] == pytest.approx(4 / 3)
    assert out["mae_per_atom"] == pytest.approx((1 / 2 + 2 / 3 + 1 / 4) / 3)
    assert out["mae"] == metrics.mean_absolute_error(torch.tensor([2.0, 3, 4]), torch.tensor([1.0, 5, 3]))
    assert out["loss"] == pytest.approx(4 / 3 / sigma)
    out = PairPotentialTask().evaluate(Const(1.0), samples)        # E = mu*n + sigma
    assert out["mae"] == pytest.approx(np.mean(np.abs(np.array([2, 3, 4]) + np.sqrt(2) - [1, 5, 3])))


def test_loss_is_l1_or_mse_on_standardised_targets_and_reaches_the_model():
    confs = _confs()
    mu, sigma = energy_standardisation(confs)
    sample = potential_pool(confs, 2, mu, sigma).batches(3)[0]
    t = sample.tensors()
    assert t["species"].shape == (3, 4, 2) and torch.equal(t["species"][1, :3].argmax(-1), torch.tensor([0, 1, 0]))
    r = torch.tensor([-1.0, 2.0, -1.0]) / np.sqrt(2.0)
    model = Const(0.5)
    loss = PairPotentialTask("l1").loss(model, sample)
    assert float(loss.detach()) == pytest.approx(float((0.5 - r).abs().mean()))
    loss.backward()
    assert model.c.grad is not None and model.c.grad != 0
    assert float(PairPotentialTask("mse").loss(Const(0.5), sample).detach()) == pytest.approx(float(((0.5 - r) ** 2).mean()))
    with pytest.raises(ValueError, match="loss"):
        PairPotentialTask("huber")


def test_registry_load_uses_training_statistics_and_validates(tmp_path):
    spec = get_task("pair-potential")
    cfg = {"data": {"preset": "tiny", "cache_dir": str(tmp_path), "mini_batch": 4},
           "model": {"name": "mlp-3d-reg", "options": {"in_dim": 3}}, "task": {"name": "pair-potential"}}
    spec.validate(cfg)
    only_test = spec.load(cfg, ("test",), False)["test"]
    full = spec.load(cfg, ("train", "test"), False)
    assert only_test[0].pool.meta == full["test"][0].pool.meta == full["train"][0].pool.meta
    with pytest.raises(ValueError, match=r"model\.options\.in_dim"):
        spec.validate({**cfg, "model": {"name": "mlp-3d-reg", "options": {}}})
    with pytest.raises(ValueError, match=r"data\.potential"):
        spec.validate({**cfg, "data": {**cfg["data"], "potential": "morse"}})
    with pytest.raises(ValueError, match=r"task\.loss"):
        spec.validate({**cfg, "task": {"name": "pair-potential", "loss": "huber"}})
