"""Amortised clustering (Set Transformer; Sampled Transformer App. C, Table 8), registered at import
as ``task.name: clustering``.

Data (``data:`` section): sets of 2-D points from mixtures of k = 4 Gaussians
(:mod:`pointformers.data.sets`: n ~ U{n_min..n_max} points per set, weights ~ Dirichlet(1),
means ~ U[-4, 4]², σ = 0.3), generated and cached. Presets (:data:`PRESETS`): ``paper`` -- the
paper's n ∈ [100, 500] with 10,000 / 500 / 1,000 sets (Set Transformer trains on fresh sets every
step; a large fixed training set stands in for that); ``small`` -- the same sets, 2,000 / 100 / 200
of them (CPU); ``tiny`` -- tests. ``sizes``, ``n_min``, ``n_max`` override the preset.

Each engine sample is a mini-batch of ``mini_batch`` sets (Set Transformer: 10) padded to
``(B, N, 2)`` with a mask; in training its membership is re-drawn from the split every step
(``task.resample``).

Model: ``model(x (B, N, 2), mask (B, N)) -> (log_pi (B, k), mu (B, k, 2), sigma (B, k, 2))``
(:class:`~pointformers.models.set_models.Mixture`). Loss: the negative log-likelihood per point
(Eq. 6 divided by the point count, :func:`~pointformers.models.set_models.mixture_nll`).

Metrics (:func:`~pointformers.tasks.metrics.clustering_log_likelihoods`): ``ll0`` -- the
log-likelihood per data point of the predicted mixtures ("LL0/data", the validation metric) and
``ll1`` -- the same after one EM step started from them ("LL1/data"), each averaged over all real
points of all sets; ``oracle_ll`` -- the log-likelihood per point under the generating parameters
(the best a model can hope for on average); ``loss`` = −``ll0``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..data.sets import MixtureSet
from .metrics import MixtureParams, clustering_log_likelihoods, mixture_log_likelihood
from .minibatch import ItemPool, MiniBatch, check_mini_batch
from .registry import TaskSpec, register_task, config_section as _section, check_data_seed

__all__ = ["PRESETS", "mixture_pool", "mixture_params", "load_mixture_sets", "ClusteringTask", "CLUSTERING_TASK"]

#: Data presets (fields of :class:`pointformers.data.sets.MixtureParams`).
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    "small": dict(sizes=(2000, 100, 200)),
    "tiny": dict(n_min=20, n_max=40, sizes=(24, 8, 8)),
}


def mixture_pool(sets: Sequence[MixtureSet]) -> ItemPool:
    """An :class:`ItemPool` of sets: ragged ``x`` (n_i, d); fixed true ``pi`` (S, k), ``mu``/``sigma`` (S, k, d)."""
    if len(sets) == 0:
        raise ValueError("sets: the split has no sets")
    return ItemPool({"x": [torch.from_numpy(np.ascontiguousarray(s.x, np.float32)) for s in sets]},
                    {"pi": torch.from_numpy(np.stack([s.pi for s in sets]).astype(np.float64)),
                     "mu": torch.from_numpy(np.stack([s.mu for s in sets]).astype(np.float64)),
                     "sigma": torch.from_numpy(np.stack([s.sigma for s in sets]).astype(np.float64))})


def mixture_params(d: Mapping[str, Any]):
    """The :class:`pointformers.data.sets.MixtureParams` of a ``data:`` section."""
    from ..data.sets import MixtureParams as DataParams

    if d["preset"] not in PRESETS:
        raise ValueError(f"data.preset: unknown clustering preset {d['preset']!r} (valid: {', '.join(sorted(PRESETS))})")
    over = {k: (tuple(d[k]) if isinstance(d[k], list) else d[k]) for k in ("sizes", "n_min", "n_max", "k")
            if d.get(k) is not None}
    try:
        return DataParams(**{**PRESETS[d["preset"]], **over})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data.{str(exc).splitlines()[0]}") from None



def load_mixture_sets(cfg: Mapping[str, Any], splits: Sequence[str]) -> dict[str, list[MixtureSet]]:
    """The generated sets of each split named by ``cfg["data"]``."""
    from ..data.sets import load_mixture_dataset

    d = _section(cfg, "data", _DATA_DEFAULTS)
    params = mixture_params(d)
    out = {s: load_mixture_dataset(params, s, cache_dir=d["cache_dir"], seed=d["seed"]) for s in splits}
    for s in splits:
        if not out[s]:
            raise ValueError(f"data.sizes: the {s} split has no sets")
    return out


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[MiniBatch]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    sets = load_mixture_sets(cfg, splits)
    return {s: mixture_pool(sets[s]).batches(d["mini_batch"], resample=(s == "train" and t["resample"]))
            for s in splits}


def _check(sample: Any) -> MiniBatch:
    if not isinstance(sample, MiniBatch) or "x" not in sample.pool.ragged or "mu" not in sample.pool.fixed:
        raise ValueError(f"sample: expected a clustering MiniBatch (from this task's load), got {type(sample).__name__}")
    return sample


def _predict(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, MixtureParams]:
    p = next(model.parameters(), None)
    dev = p.device if p is not None else torch.device("cpu")
    x, mask = batch["x"].to(dev), batch["mask"].to(dev)
    out = model(x, mask)
    if not isinstance(out, tuple) or len(out) != 3:
        raise ValueError(f"model: expected a mixture (log_pi (B, k), mu (B, k, d), sigma (B, k, d)), got "
                         f"{type(out).__name__}; use a clustering model (e.g. set-isab-pma)")
    log_pi, mu, sigma = out
    B, _, d = x.shape
    if log_pi.dim() != 2 or log_pi.shape[0] != B or mu.shape != (B, log_pi.shape[1], d) or sigma.shape != mu.shape:
        raise ValueError(f"model: mixture shapes {tuple(log_pi.shape)}, {tuple(mu.shape)}, {tuple(sigma.shape)} do not "
                         f"match (B, k), (B, k, {d}), (B, k, {d}) with B = {B}")
    return x, mask, MixtureParams(log_pi, mu, sigma)


class ClusteringTask:
    """Negative log-likelihood training and LL0 / LL1 evaluation of an amortised clusterer."""

    def loss(self, model: nn.Module, sample: MiniBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean negative log-likelihood per real point of the mini-batch's sets under the predicted mixtures."""
        from ..models.set_models import Mixture, mixture_nll

        batch = _check(sample).members(generator)
        x, mask, params = _predict(model, batch)
        return mixture_nll(x, Mixture(*params), mask)

    def evaluate(self, model: nn.Module, samples: Sequence[MiniBatch]) -> dict[str, float]:
        """``{"ll0", "ll1", "oracle_ll", "loss"}``, each a mean over all real points of all sets."""
        was = model.training
        model.eval()
        tot0 = tot1 = tot_oracle = 0.0
        n_total = 0
        try:
            with torch.no_grad():
                for s in samples:
                    batch = _check(s).tensors()
                    x, mask, params = _predict(model, batch)
                    x, mask = x.cpu(), mask.cpu()
                    params = MixtureParams(*(t.double().cpu() for t in params))
                    n = int(mask.sum())
                    m = clustering_log_likelihoods(x, params, mask)
                    oracle = MixtureParams(torch.log(batch["pi"]), batch["mu"], batch["sigma"])
                    per_set = mixture_log_likelihood(x, oracle, mask)              # (B,) means per set
                    tot0 += m["ll0"] * n
                    tot1 += m["ll1"] * n
                    tot_oracle += float((per_set * mask.sum(1)).sum())
                    n_total += n
        finally:
            model.train(was)
        if n_total == 0:
            raise ValueError("samples: no sets to evaluate")
        ll0 = tot0 / n_total
        return {"ll0": ll0, "ll1": tot1 / n_total, "oracle_ll": tot_oracle / n_total, "loss": -ll0}


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "sizes": (list, None),
                "n_min": (int, None), "n_max": (int, None), "k": (int, None), "mini_batch": (int,)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "sizes": None, "n_min": None, "n_max": None,
                  "k": None, "mini_batch": 10}
_TASK_SCHEMA = {"resample": (bool,)}
_TASK_DEFAULTS = {"resample": True}


def _validate(cfg: Mapping[str, Any]) -> None:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    check_data_seed(d)
    params = mixture_params(d)
    check_mini_batch(d["mini_batch"])
    opts = (cfg.get("model") or {}).get("options") or {}
    if "in_dim" in opts and opts["in_dim"] != params.dim:
        raise ValueError(f"model.options.in_dim: the sets are {params.dim}-D points, got {opts['in_dim']}")
    if "num_components" in opts and opts["num_components"] != params.k:
        raise ValueError(f"model.options.num_components: the data are mixtures of k = {params.k} components, got "
                         f"{opts['num_components']}")


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    sets = load_mixture_sets(cfg, splits)
    return [f"{s}: {len(sets[s])} sets" for s in splits]


#: ``task.name: clustering`` (Set Transformer / Sampled Transformer amortised clustering).
CLUSTERING_TASK = register_task(TaskSpec(
    name="clustering",
    description="amortised clustering of 2-D Gaussian mixtures: log-likelihood per point before/after one EM step",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS, task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=lambda cfg: ClusteringTask(), metric="ll0", mode="max", validate=_validate,
    generate=_generate, default_model="set-isab-pma",
))
