"""Clustering task: the oracle mixture scores the oracle log-likelihood, LL0/LL1 equal the metrics module."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pointformers.data.sets import MixtureParams as DataParams, generate_mixture_sets
from pointformers.models.set_models import Mixture, mixture_nll
from pointformers.tasks import metrics
from pointformers.tasks.clustering import ClusteringTask, mixture_pool
from pointformers.tasks.registry import get_task


def _sets(count=5, seed=0):
    return generate_mixture_sets(DataParams(n_min=10, n_max=30), count, np.random.default_rng(seed))


class Fixed(nn.Module):
    """Returns given mixture parameters per set, looked up by the set's first point (a test oracle)."""

    def __init__(self, sets, scale=1.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(scale)))
        self.table = {tuple(np.round(s.x[0], 5)): s for s in sets}

    def forward(self, x, mask=None):
        ss = [self.table[tuple(np.round(x[b, 0].detach().numpy(), 5))] for b in range(x.shape[0])]
        log_pi = torch.log(torch.tensor(np.stack([s.pi for s in ss]), dtype=torch.float64))
        mu = torch.tensor(np.stack([s.mu for s in ss])) * self.scale
        sigma = torch.tensor(np.stack([s.sigma for s in ss]))
        return Mixture(log_pi, mu, sigma)


def test_oracle_mixture_scores_the_oracle_log_likelihood():
    sets = _sets()
    out = ClusteringTask().evaluate(Fixed(sets), mixture_pool(sets).batches(2))
    n = sum(len(s.x) for s in sets)
    oracle = sum(s.true_log_likelihood() * len(s.x) for s in sets) / n
    assert out["oracle_ll"] == pytest.approx(oracle, rel=1e-9)
    assert out["ll0"] == pytest.approx(oracle, rel=1e-6)
    assert out["loss"] == pytest.approx(-out["ll0"])
    # one EM step from the truth fits these points at least as well (EM never lowers the likelihood)
    assert out["ll1"] >= out["ll0"] - 1e-9


def test_ll0_ll1_equal_the_metrics_module_for_a_wrong_mixture():
    sets = _sets(4, 1)
    model = Fixed(sets, scale=0.5)                                     # means shrunk: a poor prediction
    pool = mixture_pool(sets)
    out = ClusteringTask().evaluate(model, pool.batches(3))
    t = pool.collate(torch.arange(4))
    with torch.no_grad():
        ref = metrics.clustering_log_likelihoods(t["x"], metrics.MixtureParams(*model(t["x"], t["mask"])), t["mask"])
    assert out["ll0"] == pytest.approx(ref["ll0"], rel=1e-9)
    assert out["ll1"] == pytest.approx(ref["ll1"], rel=1e-9)
    assert out["ll0"] < out["oracle_ll"]


def test_loss_is_the_mixture_nll_and_reaches_the_model():
    sets = _sets(3, 2)
    model = Fixed(sets, scale=0.8)
    sample = mixture_pool(sets).batches(3)[0]
    loss = ClusteringTask().loss(model, sample)
    t = sample.tensors()
    with torch.no_grad():
        ref = float(mixture_nll(t["x"].double(), Fixed(sets, 0.8)(t["x"]), t["mask"]))
    assert float(loss.detach()) == pytest.approx(ref)
    loss.backward()
    assert model.scale.grad is not None and model.scale.grad != 0


def test_registry_load_and_validate(tmp_path):
    spec = get_task("clustering")
    cfg = {"data": {"preset": "tiny", "cache_dir": str(tmp_path), "mini_batch": 5},
           "model": {"name": "set-isab-pma", "options": {}}, "task": {"name": "clustering"}}
    spec.validate(cfg)
    out = spec.load(cfg, ("train", "test"), False)
    assert [len(b) for b in out["train"]] == [5] * 4 + [4] and out["train"][0].resample
    x = out["test"][0].tensors()
    assert x["x"].shape[-1] == 2 and 20 <= int(x["mask"].sum(1).min())
    for change, key in (({"preset": "huge"}, r"data\.preset"), ({"n_min": 50, "n_max": 10}, r"data\.n_max"),
                        ({"mini_batch": 0}, r"data\.mini_batch")):
        with pytest.raises(ValueError, match=key):
            spec.validate({**cfg, "data": {**cfg["data"], **change}})
    with pytest.raises(ValueError, match=r"model\.options\.num_components"):
        spec.validate({**cfg, "model": {"name": "set-isab-pma", "options": {"num_components": 3}}})
