"""Pile-up mitigation task (HEPT's Pileup-10k), as in the paper and the authors' code.

* :func:`pileup_inputs` -- per-particle model inputs ``x`` (n, 8) in the authors' column order
  ``(η, φ, px, py, pT, E, rapidity, PID category)`` (raw values, as the authors feed them),
  kernel coordinates ``coords`` = ``[η, φ, η, φ]`` (n, 4), the label (from the LC) and the
  charge (the authors' preprocessing).
* :func:`focal_loss` -- Lin et al.'s focal loss as the authors implement it (α = 0.25 on every
  term, γ = 2, mean), from logits; :func:`scored_mask` -- the particles it and the metrics
  cover: neutral with pT > 0.9 GeV (the authors' ``is_neu``).
* :func:`pileup_event_metrics` / :func:`pileup_metrics` -- the paper's "AUC" = average
  precision (sklearn ``average_precision_score``) of each event's scored particles, averaged
  over events, plus ROC-AUC and F1 at probability 0.5 averaged the same way (the authors' code).
* :class:`PileupTask` -- the engine's task protocol; the task spec ``"pileup"`` is registered
  with :mod:`pointformers.tasks.registry` on import.
* :func:`draw_pileup_curves` -- the precision-recall curve (AP) beside the ROC curve (ROC-AUC)
  of a model and the pT-ranking baseline, drawn by ``pointformers plot`` (``pileup_curves.png``).

Events without any particle are dropped when samples are prepared (with a warning). Events
without scored particles (no neutral particle above the pT cut) contribute nothing to
the loss (a zero that keeps the graph, so a training step still runs) and are skipped by the
metrics, which also skip each event where a metric is undefined: AP and F1 need a positive
(an LC particle) among the scored particles, ROC-AUC needs both classes. The counts of events
used are returned; if no event of a set can be scored, the metric raises ValueError.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.pileup import PileupEvent, pid_category
from .registry import TaskSpec, register_task, config_section as _section, check_data_seed

__all__ = [
    "PILEUP_FEATURES",
    "PILEUP_COORDS",
    "PileupInputs",
    "pileup_inputs",
    "prepare_pileup_samples",
    "scored_mask",
    "focal_loss",
    "pileup_event_metrics",
    "pileup_metrics",
    "PileupTask",
    "pileup_baselines",
    "draw_pileup_curves",
    "PILEUP_TASK",
]

#: Names of the 8 model-input columns of :attr:`PileupInputs.x`, in the authors' order.
PILEUP_FEATURES: tuple[str, ...] = ("eta", "phi", "px", "py", "pt", "energy", "rapidity", "pid")

#: Names of the 4 kernel-coordinate columns: the authors' ``cat(pos, x[:, :2])``.
PILEUP_COORDS: tuple[str, ...] = ("eta", "phi", "eta", "phi")


@dataclass
class PileupInputs:
    """Model inputs and truth of one event of ``n`` particles.

    Attributes:
        x: ``(n, 8)`` features in :data:`PILEUP_FEATURES` order (PID category as a float).
        coords: ``(n, 4)`` kernel coordinates ``[η, φ, η, φ]``; columns 0-1 are HEPT's (η, φ).
        label: ``(n,)`` bool, True = from the leading collision.
        charge: ``(n,)`` int64.
        pt: ``(n,)`` float transverse momentum [GeV].
        event_id: the source event's id.
    """

    x: torch.Tensor
    coords: torch.Tensor
    label: torch.Tensor
    charge: torch.Tensor
    pt: torch.Tensor
    event_id: int = 0

    @property
    def num_particles(self) -> int:
        return int(self.x.shape[0])

    def to(self, device: Union[str, torch.device]) -> "PileupInputs":
        """A copy with every tensor moved to ``device``."""
        return PileupInputs(**{f.name: (getattr(self, f.name).to(device) if f.name != "event_id" else self.event_id)
                               for f in fields(self)})


def pileup_inputs(event: PileupEvent, dtype: torch.dtype = torch.float32) -> PileupInputs:
    """Turn a :class:`~pointformers.data.pileup.PileupEvent` into HEPT's model inputs.

    Raises:
        ValueError: not a PileupEvent, an empty event, a NaN/inf feature (naming the column
            and event), or a neutral PDG code outside HEPT's categories.
    """
    if not isinstance(event, PileupEvent):
        raise ValueError(f"event: expected a PileupEvent, got {type(event).__name__}")
    if event.num_particles == 0:
        raise ValueError(f"event {event.event_id}: has no particles")
    cols = [np.asarray(getattr(event, k), np.float64) for k in PILEUP_FEATURES[:-1]]
    for name, c in zip(PILEUP_FEATURES, cols):
        if not np.isfinite(c).all():
            raise ValueError(f"event {event.event_id}: feature {name!r} has NaN or inf "
                             f"(particle {int(np.flatnonzero(~np.isfinite(c))[0])})")
    x = np.stack(cols + [pid_category(event.pdg, event.charge).astype(np.float64)], axis=1)
    coords = np.concatenate([x[:, :2], x[:, :2]], axis=1)
    return PileupInputs(
        x=torch.as_tensor(x, dtype=dtype), coords=torch.as_tensor(coords, dtype=dtype),
        label=torch.as_tensor(np.asarray(event.is_lc, bool)), charge=torch.as_tensor(event.charge, dtype=torch.long),
        pt=torch.as_tensor(np.asarray(event.pt, np.float64), dtype=dtype), event_id=int(event.event_id))


def prepare_pileup_samples(events: Iterable[PileupEvent], progress: bool = False, desc: str = "inputs",
                           dtype: torch.dtype = torch.float32, skip_empty: bool = True) -> list[PileupInputs]:
    """:func:`pileup_inputs` of every event (once, before training).

    ``skip_empty``: drop events without any particle (no model can process an empty cloud),
    with a warning giving their count; False raises ValueError on the first one instead.
    """
    events = list(events)
    if skip_empty:
        empty = [ev for ev in events if isinstance(ev, PileupEvent) and ev.num_particles == 0]
        if empty:
            import warnings

            warnings.warn(f"{len(empty)} of {len(events)} events have no particles and are skipped "
                          f"(event ids {[ev.event_id for ev in empty[:5]]}{' ...' if len(empty) > 5 else ''})",
                          stacklevel=2)
            events = [ev for ev in events if not (isinstance(ev, PileupEvent) and ev.num_particles == 0)]
    it: Iterable[PileupEvent] = events
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(events, desc=desc, leave=False, dynamic_ncols=True)
    return [pileup_inputs(ev, dtype) for ev in it]


def scored_mask(charge: torch.Tensor, pt: torch.Tensor, pt_min: float = 0.9) -> torch.Tensor:
    """``(n,)`` bool: neutral (charge 0) with pT > ``pt_min`` -- the particles HEPT trains and scores on."""
    if charge.shape != pt.shape or charge.dim() != 1:
        raise ValueError(f"charge/pt: expected equal (n,) shapes, got {tuple(charge.shape)} and {tuple(pt.shape)}")
    return (charge == 0) & (pt.to(torch.float64) > pt_min)


# ----------------------------------------------------------------------------------------
# Loss
# ----------------------------------------------------------------------------------------


def focal_loss(logits: torch.Tensor, target: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0,
               alpha_mode: str = "uniform") -> torch.Tensor:
    """Mean focal loss (Lin et al. 2017) of ``m`` binary predictions given as logits.

    With p = σ(z), BCE = −[y log p + (1 − y) log(1 − p)] and p_t = exp(−BCE) (= p if y = 1,
    1 − p otherwise), each term is ``w · (1 − p_t)^γ · BCE``. ``alpha_mode="uniform"`` (the
    authors' code, default): w = α for every term. ``"balanced"`` (the paper of Lin et al.):
    w = α for positives and 1 − α for negatives. BCE is computed from logits, so it is exact
    where the authors' ``binary_cross_entropy`` on probabilities clamps log(0) at −100.

    Args:
        logits: ``(m,)`` floating. target: ``(m,)`` bool or 0/1 numbers.
    Returns:
        A scalar; for ``m = 0`` a zero that keeps ``logits`` in the graph (zero gradients).
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() != 1:
        raise ValueError(f"logits: expected a floating (m,) tensor, got "
                         f"{getattr(logits, 'dtype', type(logits).__name__)} {tuple(getattr(logits, 'shape', ()))}")
    if not isinstance(target, torch.Tensor) or target.shape != logits.shape:
        raise ValueError(f"target: expected a tensor of shape {tuple(logits.shape)}, got "
                         f"{tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha: expected a number in [0, 1], got {alpha!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma: expected a finite number >= 0, got {gamma!r}")
    if alpha_mode not in ("uniform", "balanced"):
        raise ValueError(f"alpha_mode: expected 'uniform' or 'balanced', got {alpha_mode!r}")
    if logits.numel() == 0:
        return logits.sum() * 0.0
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("logits: contains NaN or inf")
    y = target.to(logits.dtype)
    if bool(((y != 0) & (y != 1)).any()):
        raise ValueError("target: expected 0/1 labels")
    bce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    p_t = torch.exp(-bce)
    w = alpha if alpha_mode == "uniform" else alpha * y + (1 - alpha) * (1 - y)
    return (w * (1 - p_t) ** gamma * bce).mean()


# ----------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------


def _as_1d(a: Any, name: str) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    out = np.asarray(a)
    if out.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {out.shape}")
    return out


def pileup_event_metrics(scores: Any, labels: Any, threshold: float = 0.5) -> dict[str, float]:
    """AP, ROC-AUC and F1 of one event's scored particles (NaN where undefined).

    Args:
        scores: ``(m,)`` probabilities of being from the LC (any monotone score works for AP
            and ROC-AUC; F1 thresholds it at ``threshold``).
        labels: ``(m,)`` bool or 0/1, True = from the LC.
    Returns:
        ``{"ap", "roc_auc", "f1", "n"}``: ``ap`` = sklearn ``average_precision_score``
        (Σ_k (R_k − R_{k−1}) P_k over score thresholds), NaN without a positive; ``roc_auc``
        NaN unless both classes occur; ``f1`` NaN without a positive.
    """
    from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

    s = _as_1d(scores, "scores").astype(np.float64)
    y = _as_1d(labels, "labels")
    if s.shape != y.shape:
        raise ValueError(f"scores/labels: expected equal shapes, got {s.shape} and {y.shape}")
    if not np.isfinite(s).all():
        raise ValueError("scores: contains NaN or inf")
    if y.dtype != bool:
        if not np.isin(y, (0, 1)).all():
            raise ValueError("labels: expected bool or 0/1 values")
        y = y.astype(bool)
    nan = float("nan")
    n_pos = int(y.sum())
    out = {"ap": nan, "roc_auc": nan, "f1": nan, "n": float(len(y))}
    if n_pos == 0:
        return out
    out["ap"] = float(average_precision_score(y, s))
    out["f1"] = float(f1_score(y, s > threshold))
    if n_pos < len(y):
        out["roc_auc"] = float(roc_auc_score(y, s))
    return out


def pileup_metrics(scores: Sequence[Any], labels: Sequence[Any], threshold: float = 0.5) -> dict[str, float]:
    """The paper's pile-up metric over a set of events: per-event AP averaged over events.

    Args:
        scores, labels: one ``(m_i,)`` array per event, restricted to its scored particles
            (see :func:`scored_mask`).
    Returns:
        ``"ap"`` (the paper's "AUC"), ``"roc_auc"``, ``"f1"`` -- each the mean over the events
        where it is defined (see :func:`pileup_event_metrics`) -- and the counts
        ``"events"`` (all), ``"events_ap"``, ``"events_roc_auc"``, ``"events_skipped"``
        (no scored particle or no positive: not in AP's mean).
    Raises:
        ValueError: no event has a positive scored particle (AP is undefined for the set), or
            the inputs do not pair up.
    """
    if len(scores) != len(labels):
        raise ValueError(f"scores: got {len(scores)} events but labels has {len(labels)}")
    if len(scores) == 0:
        raise ValueError("scores: no events to evaluate")
    per = [pileup_event_metrics(s, y, threshold) for s, y in zip(scores, labels)]
    ap = np.array([m["ap"] for m in per])
    roc = np.array([m["roc_auc"] for m in per])
    f1 = np.array([m["f1"] for m in per])
    ok = ~np.isnan(ap)
    if not ok.any():
        no_neutral = sum(m["n"] == 0 for m in per)
        raise ValueError(f"events: none of the {len(per)} events has a scored particle from the leading collision "
                         f"({no_neutral} have no neutral particle above the pT cut), so the average precision is "
                         "undefined")
    r = ~np.isnan(roc)
    return {"ap": float(ap[ok].mean()), "roc_auc": float(roc[r].mean()) if r.any() else float("nan"),
            "f1": float(f1[ok].mean()), "events": float(len(per)), "events_ap": float(ok.sum()),
            "events_roc_auc": float(r.sum()), "events_skipped": float(len(per) - ok.sum())}


# ----------------------------------------------------------------------------------------
# Task
# ----------------------------------------------------------------------------------------


def _logits(model: nn.Module, sample: PileupInputs) -> torch.Tensor:
    dev = next(model.parameters()).device
    out = model(sample.x.to(dev), sample.coords.to(dev))
    if out.dim() == 2 and out.shape[-1] == 1:
        out = out.squeeze(-1)
    if out.shape != (sample.num_particles,):
        raise ValueError(f"model: expected one logit per particle, shape ({sample.num_particles},), got "
                         f"{tuple(out.shape)}; use a pile-up model (hept-pileup, pileup-encoder)")
    return out


class PileupTask:
    """Focal-loss training and per-event AP evaluation on neutral particles (the authors' loss and metrics).

    Args:
        alpha, gamma, alpha_mode: :func:`focal_loss` options (authors: 0.25, 2, "uniform").
        pt_min: neutral particles with pT > pt_min are trained and scored (authors: 0.9 GeV).
    """

    def __init__(self, alpha: float = 0.25, gamma: float = 2.0, pt_min: float = 0.9, alpha_mode: str = "uniform"):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ValueError(f"alpha: must be a number in [0, 1], got {alpha!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not (math.isfinite(gamma) and gamma >= 0):
            raise ValueError(f"gamma: must be a finite number >= 0, got {gamma!r}")
        if isinstance(pt_min, bool) or not isinstance(pt_min, (int, float)) or not math.isfinite(pt_min):
            raise ValueError(f"pt_min: must be a finite number, got {pt_min!r}")
        if alpha_mode not in ("uniform", "balanced"):
            raise ValueError(f"alpha_mode: must be 'uniform' or 'balanced', got {alpha_mode!r}")
        self.alpha, self.gamma, self.pt_min, self.alpha_mode = float(alpha), float(gamma), float(pt_min), alpha_mode

    def _check(self, sample: Any) -> PileupInputs:
        if not isinstance(sample, PileupInputs):
            raise ValueError(f"sample: expected PileupInputs (see prepare_pileup_samples), got {type(sample).__name__}")
        return sample

    def loss(self, model: nn.Module, sample: PileupInputs, generator: torch.Generator | None = None) -> torch.Tensor:
        """Focal loss over the event's scored particles (all particles are model inputs)."""
        sample = self._check(sample)
        logits = _logits(model, sample)
        sel = scored_mask(sample.charge, sample.pt, self.pt_min).to(logits.device)
        return focal_loss(logits[sel], sample.label.to(logits.device)[sel], self.alpha, self.gamma, self.alpha_mode)

    @torch.no_grad()
    def logits(self, model: nn.Module, samples: Sequence[PileupInputs]) -> list[torch.Tensor]:
        """Logits ``(n_i,)`` (CPU, float32) of every particle of each event, model in eval mode."""
        was_training = model.training
        model.eval()
        try:
            return [_logits(model, self._check(s)).float().cpu() for s in samples]
        finally:
            model.train(was_training)

    def predict(self, model: nn.Module, samples: Sequence[PileupInputs]) -> list[torch.Tensor]:
        """LC probabilities σ(logit) ``(n_i,)`` of every particle of each event."""
        return [torch.sigmoid(z) for z in self.logits(model, samples)]

    def evaluate(self, model: nn.Module, samples: Sequence[PileupInputs]) -> dict[str, float]:
        """:func:`pileup_metrics` of the model (``"ap"`` is the main metric) plus the mean focal loss
        ``"loss"`` over events with scored particles (the authors' plateau-scheduler signal).

        Particles are ranked by logit, which orders them as σ(logit) does without the ties that
        float32 probabilities get when they saturate at 1; F1 thresholds the logit at 0, i.e.
        the probability at 0.5 as the authors do."""
        scores, labels, losses = [], [], []
        for z, s in zip(self.logits(model, samples), samples):
            sel = scored_mask(s.charge, s.pt, self.pt_min)
            scores.append(z[sel].double().numpy())
            labels.append(s.label[sel].numpy())
            if bool(sel.any()):
                losses.append(float(focal_loss(z[sel], s.label[sel], self.alpha, self.gamma, self.alpha_mode)))
        out = pileup_metrics(scores, labels, threshold=0.0)
        out["loss"] = float(np.mean(losses)) if losses else float("nan")
        return out


# ----------------------------------------------------------------------------------------
# Registration (configs, CLI, engine)
# ----------------------------------------------------------------------------------------

_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "root": (str, None),
                "n_events": (int, None), "mu": (float, None)}
_DATA_DEFAULTS = {"preset": "pileup-small", "seed": 0, "cache_dir": None, "root": None, "n_events": None, "mu": None}
_TASK_SCHEMA = {"alpha": (float,), "gamma": (float,), "pt_min": (float,), "alpha_mode": (str,)}
_TASK_DEFAULTS = {"alpha": 0.25, "gamma": 2.0, "pt_min": 0.9, "alpha_mode": "uniform"}



def _params(data: Mapping[str, Any]) -> tuple[Any, bool]:
    """(PileupParams of the preset with the config's overrides, whether anything was overridden)."""
    from ..data.pileup import preset_params

    over = {k: data[k] for k in ("n_events", "mu") if data.get(k) is not None}
    return preset_params(data["preset"], **over), bool(over)


def _validate(cfg: Mapping[str, Any]) -> None:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    check_data_seed(d)
    if d["root"] is not None:
        if not Path(d["root"]).expanduser().exists():
            raise ValueError(f"data.root: {d['root']!r} does not exist (a Delphes .root file or a folder of them)")
    else:
        try:
            _params(d)
        except ValueError as exc:
            raise ValueError(f"data.{exc}") from None
    try:
        PileupTask(t["alpha"], t["gamma"], t["pt_min"], t["alpha_mode"])
    except ValueError as exc:
        raise ValueError(f"task.{exc}") from None


def _load_events(cfg: Mapping[str, Any], splits: Sequence[str]) -> dict[str, list[PileupEvent]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    if d["root"] is not None:
        from ..data.delphes import load_delphes_splits

        return load_delphes_splits(Path(d["root"]).expanduser(), splits, seed=d["seed"])
    from ..data.pileup import load_pileup_dataset

    params, overridden = _params(d)
    preset = params if overridden else d["preset"]
    return {s: load_pileup_dataset(preset, s, cache_dir=d["cache_dir"], seed=d["seed"]) for s in splits}


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[PileupInputs]]:
    events = _load_events(cfg, splits)
    return {s: prepare_pileup_samples(events[s], progress=progress, desc=f"{s} inputs") for s in splits}


def pileup_baselines(samples: Sequence[PileupInputs], pt_min: float = 0.9, seed: int = 0) -> dict[str, dict[str, float]]:
    """Reference rows without training, scored like a model (:func:`pileup_metrics`).

    * ``"random probabilities"``: the paper's random baseline -- a uniform random probability
      per particle (seeded).
    * ``"pT ranking"``: score = pT (the hard process is harder than pile-up); F1 thresholds
      it at pT > 5 GeV.
    """
    rng = np.random.default_rng(int(seed))
    rand_s, pt_s, labels = [], [], []
    for s in samples:
        sel = scored_mask(s.charge, s.pt, pt_min)
        labels.append(s.label[sel].numpy())
        rand_s.append(rng.random(int(sel.sum())))
        pt_s.append(s.pt[sel].double().numpy())
    return {"random probabilities": pileup_metrics(rand_s, labels, threshold=0.5),
            "pT ranking": pileup_metrics(pt_s, labels, threshold=5.0)}


def _baselines(cfg: Mapping[str, Any], samples: Sequence[PileupInputs]) -> dict[str, dict[str, float]]:
    t = _section(cfg, "task", _TASK_DEFAULTS)
    d = _section(cfg, "data", _DATA_DEFAULTS)
    return pileup_baselines(samples, t["pt_min"], d["seed"])


def _build(cfg: Mapping[str, Any]) -> PileupTask:
    t = _section(cfg, "task", _TASK_DEFAULTS)
    return PileupTask(t["alpha"], t["gamma"], t["pt_min"], t["alpha_mode"])


def draw_pileup_curves(path: Union[str, Path], curves: Mapping[str, tuple[Sequence[Any], Sequence[Any]]],
                       title: str = "", dpi: int = 110) -> Path:
    """Write a PNG with the precision-recall curve (left) and the ROC curve (right) of each
    named scoring, atomically.

    Args:
        path: output ``.png``.
        curves: ``{name: (scores, labels)}``, each one ``(m_i,)`` array per event restricted to
            its scored particles (as :func:`pileup_metrics` takes them). The curves are drawn
            over all events' particles pooled; the legend gives the task's numbers, AP and
            ROC-AUC averaged over events (:func:`pileup_metrics`).
    Raises:
        ValueError: naming ``curves`` when empty, or as :func:`pileup_metrics`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from sklearn.metrics import precision_recall_curve, roc_curve

    from ..files import atomic_write

    if not curves:
        raise ValueError("curves: need at least one (scores, labels) pair to draw")
    fig = Figure(figsize=(12, 5.2), dpi=dpi)
    FigureCanvasAgg(fig)
    ax_pr, ax_roc = fig.subplots(1, 2)
    base_rate = None
    for name, (scores, labels) in curves.items():
        m = pileup_metrics(scores, labels)
        s = np.concatenate([_as_1d(a, "scores").astype(np.float64) for a in scores])
        y = np.concatenate([_as_1d(a, "labels").astype(bool) for a in labels])
        prec, rec, _ = precision_recall_curve(y, s)
        ax_pr.plot(rec, prec, lw=1.5, label=f"{name}: AP {m['ap']:.4f}")
        if y.any() and not y.all():
            fpr, tpr, _ = roc_curve(y, s)
            ax_roc.plot(fpr, tpr, lw=1.5, label=f"{name}: ROC-AUC {m['roc_auc']:.4f}")
        base_rate = float(y.mean())
    if base_rate is not None:
        ax_pr.axhline(base_rate, color="grey", ls=":", lw=1, label=f"chance (LC fraction {base_rate:.3f})")
    ax_roc.plot([0, 1], [0, 1], color="grey", ls=":", lw=1, label="chance")
    ax_pr.set_xlabel("recall (LC particles found)")
    ax_pr.set_ylabel("precision")
    ax_pr.set_title("precision-recall (AP = mean over events)", fontsize=10)
    ax_roc.set_xlabel("false positive rate (pile-up kept)")
    ax_roc.set_ylabel("true positive rate (LC kept)")
    ax_roc.set_title("ROC (ROC-AUC = mean over events)", fontsize=10)
    for ax in (ax_pr, ax_roc):
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.2)
        ax.legend(fontsize=8, loc="lower left" if ax is ax_pr else "lower right")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return atomic_write(path, lambda f: fig.savefig(f, format="png"))


def _plot(cfg: Mapping[str, Any], model: nn.Module, samples: Sequence[PileupInputs], out_dir) -> list[Path]:
    """``pileup_curves.png``: precision-recall and ROC curves of the model on the validation
    events, with the pT-ranking baseline (curves pooled over the events' scored particles)."""
    task = _build(cfg)
    if not samples:
        raise ValueError("samples: need at least one validation event to draw the curves")
    scores, pts, labels = [], [], []
    for z, smp in zip(task.logits(model, samples), samples):
        sel = scored_mask(smp.charge, smp.pt, task.pt_min)
        scores.append(z[sel].double().numpy())
        pts.append(smp.pt[sel].double().numpy())
        labels.append(smp.label[sel].numpy())
    name = cfg.get("model", {}).get("name", "model")
    return [draw_pileup_curves(Path(out_dir) / "pileup_curves.png", {name: (scores, labels), "pT ranking": (pts, labels)},
                               title=f"{name}: {len(samples)} validation events, neutral particles with "
                                     f"pT > {task.pt_min:g} GeV")]


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    from ..data.pileup import dataset_cache_path, load_pileup_dataset

    d = _section(cfg, "data", _DATA_DEFAULTS)
    if d["root"] is not None:
        return []  # real data: nothing to generate
    params, overridden = _params(d)
    preset = params if overridden else d["preset"]
    paths = []
    for s in splits:
        load_pileup_dataset(preset, s, cache_dir=d["cache_dir"], seed=d["seed"])
        paths.append(str(dataset_cache_path(preset, s, cache_dir=d["cache_dir"], seed=d["seed"])))
    return paths


#: The registered task spec (``task.name: pileup`` in a config). ``load``/``build``/``validate``/
#: ``generate`` take the whole resolved config (``data`` and ``task`` sections).
PILEUP_TASK = register_task(TaskSpec(
    name="pileup",
    description="pile-up mitigation: is each neutral particle from the leading collision? (HEPT Pileup-10k)",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS,
    task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=_build, metric="ap", mode="max", validate=_validate, generate=_generate,
    default_model="hept-pileup", baselines=_baselines, plot=_plot,
))
