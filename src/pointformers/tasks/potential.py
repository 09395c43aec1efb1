"""Pair-potential energy regression (FLT's 3-D relative-position setting), registered at import as
``task.name: pair-potential``.

Data (``data:`` section): random atom configurations whose energy is an exact sum of pair
potentials (:mod:`pointformers.data.sets`: Lennard-Jones, Gaussian or screened Coulomb over a
jittered lattice, randomly rotated), generated and cached. Presets (:data:`PRESETS`): ``small``
-- 16-64 atoms of 3 species, 2,000 / 200 / 200 configurations; ``tiny`` -- tests. ``potential``,
``sizes``, ``n_min``, ``n_max`` override the preset.

Each engine sample is a mini-batch of ``mini_batch`` configurations padded to ``(B, N, 3)`` with a
mask; in training its membership is re-drawn every step (``task.resample``).

Model: ``model(x (B, N, S), pos (B, N, 3), mask (B, N)) -> (B,)`` with ``x`` the one-hot species
(S = the number of species; the model needs ``in_dim: S``) and ``pos`` the atom positions.

Targets are standardised so one learning rate fits every potential: the energy is extensive, so
with μ the per-atom energy of the training set (least squares E ≈ μ·n) and σ the standard
deviation of the residuals E − μ·n over the training set, the model predicts
r = (E − μ·n) / σ; its energy prediction is E = μ·n + σ·r. μ and σ come from the training split
only (it is read for them even when only the test split is evaluated) and travel with every
sample (:attr:`ItemPool.meta`).

Loss: ``task.loss`` ``l1`` (default; the metric is an MAE, as FLT's OC20 energy MAE) or ``mse`` on
the standardised targets. Metrics: ``mae`` -- mean |E_pred − E| in energy units (the validation
metric, minimised), ``mae_per_atom`` -- mean |E_pred − E| / n, and ``loss``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.sets import Configuration
from .metrics import mean_absolute_error
from .minibatch import ItemPool, MiniBatch, check_mini_batch
from .registry import TaskSpec, register_task, config_section as _section, check_data_seed

__all__ = ["PRESETS", "energy_standardisation", "potential_pool", "potential_params", "load_configurations",
           "PairPotentialTask", "PAIR_POTENTIAL_TASK"]

#: Data presets (fields of :class:`pointformers.data.sets.PotentialParams`).
PRESETS: dict[str, dict[str, Any]] = {
    "small": {},
    "tiny": dict(n_min=6, n_max=12, sizes=(24, 8, 8)),
}
LOSSES = ("l1", "mse")


def energy_standardisation(configs: Sequence[Configuration]) -> tuple[float, float]:
    """(μ, σ): the least-squares per-atom energy μ = Σ n_i E_i / Σ n_i² and the standard deviation σ
    of E_i − μ n_i (1 when all residuals vanish) over ``configs``."""
    if len(configs) == 0:
        raise ValueError("configs: need at least one training configuration for the energy standardisation")
    n = np.array([len(c.pos) for c in configs], np.float64)
    e = np.array([c.energy for c in configs], np.float64)
    if not np.isfinite(e).all():
        raise ValueError("configs: an energy is NaN or inf")
    mu = float((n * e).sum() / (n * n).sum())
    sd = float(np.std(e - mu * n))
    return mu, (sd if sd > 0 else 1.0)


def potential_pool(configs: Sequence[Configuration], n_species: int, mu: float, sigma: float) -> ItemPool:
    """An :class:`ItemPool`: ragged ``pos`` (n_i, 3), ``species`` (n_i, S) one-hot; fixed ``energy`` (S,)
    float64 and ``atoms`` (S,); ``meta`` holds the standardisation ``mu``, ``sigma``."""
    if len(configs) == 0:
        raise ValueError("configs: the split has no configurations")
    eye = torch.eye(n_species)
    return ItemPool({"pos": [torch.from_numpy(np.ascontiguousarray(c.pos, np.float32)) for c in configs],
                     "species": [eye[torch.from_numpy(np.asarray(c.species, np.int64))] for c in configs]},
                    {"energy": torch.tensor([c.energy for c in configs], dtype=torch.float64),
                     "atoms": torch.tensor([len(c.pos) for c in configs], dtype=torch.float64)},
                    meta={"mu": float(mu), "sigma": float(sigma)})



def potential_params(d: Mapping[str, Any]):
    """The :class:`pointformers.data.sets.PotentialParams` of a ``data:`` section."""
    from ..data.sets import PotentialParams

    if d["preset"] not in PRESETS:
        raise ValueError(f"data.preset: unknown pair-potential preset {d['preset']!r} "
                         f"(valid: {', '.join(sorted(PRESETS))})")
    over = {k: (tuple(d[k]) if isinstance(d[k], list) else d[k]) for k in ("potential", "sizes", "n_min", "n_max")
            if d.get(k) is not None}
    try:
        return PotentialParams(**{**PRESETS[d["preset"]], **over})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data.{str(exc).splitlines()[0]}") from None


def load_configurations(cfg: Mapping[str, Any], splits: Sequence[str]) -> dict[str, list[Configuration]]:
    """The configurations of each split in ``splits`` (and always of ``train``, for the standardisation)."""
    from ..data.sets import load_potential_dataset

    d = _section(cfg, "data", _DATA_DEFAULTS)
    params = potential_params(d)
    out = {s: load_potential_dataset(params, s, cache_dir=d["cache_dir"], seed=d["seed"])
           for s in dict.fromkeys(["train", *splits])}
    for s, confs in out.items():
        if not confs:
            raise ValueError(f"data.sizes: the {s} split has no configurations")
    return out


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[MiniBatch]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    params = potential_params(d)
    confs = load_configurations(cfg, splits)
    mu, sigma = energy_standardisation(confs["train"])
    return {s: potential_pool(confs[s], params.n_species, mu, sigma).batches(
        d["mini_batch"], resample=(s == "train" and t["resample"])) for s in splits}


def _check(sample: Any) -> MiniBatch:
    if not isinstance(sample, MiniBatch) or "species" not in sample.pool.ragged or "mu" not in sample.pool.meta:
        raise ValueError(f"sample: expected a pair-potential MiniBatch (from this task's load), got "
                         f"{type(sample).__name__}")
    return sample


class PairPotentialTask:
    """Standardised-energy regression with an L1 (or MSE) loss; MAE in energy units.

    Args:
        loss: ``"l1"`` or ``"mse"`` on the standardised target (see the module doc).
    """

    def __init__(self, loss: str = "l1") -> None:
        if loss not in LOSSES:
            raise ValueError(f"loss: expected one of {', '.join(LOSSES)}, got {loss!r}")
        self.loss_kind = loss

    @staticmethod
    def _output(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        p = next(model.parameters(), None)
        dev = p.device if p is not None else torch.device("cpu")
        x, pos, mask = batch["species"].to(dev), batch["pos"].to(dev), batch["mask"].to(dev)
        out = model(x, pos, mask)
        if not isinstance(out, torch.Tensor) or out.shape != (pos.shape[0],):
            raise ValueError(f"model: expected one energy per configuration, shape ({pos.shape[0]},), got "
                             f"{tuple(getattr(out, 'shape', ()))}; use a regressor (e.g. flt-3d-reg) with "
                             f"in_dim = {x.shape[-1]} (one-hot species)")
        return out

    @staticmethod
    def _target(sample: MiniBatch, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        m = sample.pool.meta
        return (batch["energy"] - m["mu"] * batch["atoms"]) / m["sigma"]

    def loss(self, model: nn.Module, sample: MiniBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        """L1 (or MSE) between the model output and the standardised energies of the mini-batch."""
        sample = _check(sample)
        batch = sample.members(generator)
        out = self._output(model, batch)
        target = self._target(sample, batch).to(device=out.device, dtype=out.dtype)
        return F.l1_loss(out, target) if self.loss_kind == "l1" else F.mse_loss(out, target)

    @torch.no_grad()
    def predict(self, model: nn.Module, samples: Sequence[MiniBatch]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(predicted energies (S,), true energies (S,), atom counts (S,)), float64 on CPU, model in eval."""
        was = model.training
        model.eval()
        pred, true, atoms = [], [], []
        try:
            for s in samples:
                s = _check(s)
                batch = s.tensors()
                out = self._output(model, batch).double().cpu()
                m = s.pool.meta
                pred.append(m["mu"] * batch["atoms"] + m["sigma"] * out)
                true.append(batch["energy"])
                atoms.append(batch["atoms"])
        finally:
            model.train(was)
        if not pred:
            raise ValueError("samples: no configurations to evaluate")
        return torch.cat(pred), torch.cat(true), torch.cat(atoms)

    def evaluate(self, model: nn.Module, samples: Sequence[MiniBatch]) -> dict[str, float]:
        """``{"mae", "mae_per_atom", "loss"}`` (MAE in energy units; loss on the standardised scale)."""
        pred, true, atoms = self.predict(model, samples)
        sigma = _check(samples[0]).pool.meta["sigma"]
        r = (pred - true) / sigma
        loss = float(r.abs().mean()) if self.loss_kind == "l1" else float((r * r).mean())
        return {"mae": mean_absolute_error(pred, true), "mae_per_atom": mean_absolute_error(pred / atoms, true / atoms),
                "loss": loss}


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "potential": (str, None),
                "sizes": (list, None), "n_min": (int, None), "n_max": (int, None), "mini_batch": (int,)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "potential": None, "sizes": None, "n_min": None,
                  "n_max": None, "mini_batch": 16}
_TASK_SCHEMA = {"loss": (str,), "resample": (bool,)}
_TASK_DEFAULTS = {"loss": "l1", "resample": True}


def _validate(cfg: Mapping[str, Any]) -> None:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    check_data_seed(d)
    params = potential_params(d)
    check_mini_batch(d["mini_batch"])
    if t["loss"] not in LOSSES:
        raise ValueError(f"task.loss: expected one of {', '.join(LOSSES)}, got {t['loss']!r}")
    opts = (cfg.get("model") or {}).get("options") or {}
    in_dim = opts.get("in_dim")
    if in_dim != params.n_species:
        raise ValueError(f"model.options.in_dim: the model reads one-hot species, so in_dim must be "
                         f"{params.n_species}, got {in_dim!r}")


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    confs = load_configurations(cfg, splits)
    return [f"{s}: {len(confs[s])} configurations" for s in splits]


#: ``task.name: pair-potential`` (FLT's 3-D relative-position regression setting).
PAIR_POTENTIAL_TASK = register_task(TaskSpec(
    name="pair-potential",
    description="energy of 3-D atom configurations under a pair potential (FLT 3-D RPE setting); MAE",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS, task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=lambda cfg: PairPotentialTask(_section(cfg, "task", _TASK_DEFAULTS)["loss"]), metric="mae",
    mode="min", validate=_validate, generate=_generate, default_model="flt-3d-reg",
))
