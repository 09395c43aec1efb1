"""Event display for tracking: predicted track clusters next to the truth, as a PNG.

Predicted tracks are DBSCAN clusters of the hit embeddings (:func:`~.tracking.cluster_tracks`).
DBSCAN's radius ``eps`` depends on the embedding's scale, so it is chosen on validation
clouds (:func:`choose_eps`) by maximising the **track-match score**, a per-hit
purity × efficiency measure on the same hits AP@k scores (particle id ≠ 0, reconstructable,
pt > 0.9 GeV, at least one other hit of the particle)::

    score(u) = |C(u) ∩ P(u)|² / (|C(u)| · |P(u)|)

with C(u) the predicted cluster of u (hits of the cloud with its label) and P(u) its
particle's hits. It is 1 only when the cluster *is* the particle, drops when clusters
merge tracks (|C| grows) or split them (|C ∩ P| shrinks), and is 0 for a hit left as noise.
The score is averaged over hits, then over clouds. Candidate radii are multiples of the
median nearest-neighbour distance of the embeddings, so the grid follows the scale.

Drawing uses matplotlib's Agg canvas directly (no pyplot, no global backend switch), so it
works headless and inside other programs.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from scipy.spatial import cKDTree

from .tracking import cluster_tracks

__all__ = ["EPS_FACTORS", "track_match_score", "choose_eps", "draw_event_display"]

#: Candidate eps values, as multiples of the median nearest-neighbour distance.
EPS_FACTORS: tuple[float, ...] = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def _np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def track_match_score(labels, particle_id, pt, reconstructable, pt_min: float = 0.9) -> float:
    """Mean over qualifying hits of ``|C∩P|² / (|C|·|P|)`` (module docstring); NaN if none.

    Args:
        labels: ``(n,)`` predicted cluster per hit, −1 = noise.
        particle_id, pt, reconstructable: ``(n,)`` truth per hit.
    """
    lab = _np(labels).astype(np.int64)
    pid = _np(particle_id).astype(np.int64)
    ptv = _np(pt).astype(np.float64)
    rec = _np(reconstructable).astype(bool)
    n = lab.shape[0]
    if not (pid.shape == ptv.shape == rec.shape == (n,)):
        raise ValueError(f"labels/particle_id/pt/reconstructable: expected equal shapes (n,), got "
                         f"{lab.shape}, {pid.shape}, {ptv.shape}, {rec.shape}")
    if n == 0:
        return float("nan")
    _, p_inv, p_cnt = np.unique(pid, return_inverse=True, return_counts=True)
    query = (pid != 0) & rec & (ptv > pt_min) & (p_cnt[p_inv] > 1)
    if not query.any():
        return float("nan")
    clustered = lab >= 0
    _, c_inv, c_cnt = np.unique(lab[clustered], return_inverse=True, return_counts=True)
    # Joint counts |C ∩ P| of every (cluster, particle) combination present.
    joint_keys, joint_inv, joint_cnt = np.unique(c_inv * (p_cnt.size + 1) + p_inv[clustered], return_inverse=True,
                                                 return_counts=True)
    score = np.zeros(n)
    idx = np.flatnonzero(clustered)
    inter = joint_cnt[joint_inv].astype(np.float64)
    score[idx] = inter * inter / (c_cnt[c_inv] * p_cnt[p_inv[idx]])
    return float(score[query].mean())


def _median_nn_distance(embs: Sequence[np.ndarray]) -> float:
    d = []
    for e in embs:
        if e.shape[0] >= 2:
            dist, _ = cKDTree(e).query(e, k=2)
            d.append(dist[:, 1])
    if not d:
        return 1.0
    med = float(np.median(np.concatenate(d)))
    return med if med > 0 else 1e-6


def choose_eps(embeddings: Sequence[torch.Tensor], particle_ids: Sequence, pts: Sequence, reconstructables: Sequence,
               factors: Sequence[float] = EPS_FACTORS, min_samples: int = 2) -> tuple[float, dict[float, float]]:
    """The DBSCAN radius with the best mean :func:`track_match_score` over the given clouds.

    Candidates are ``factor × median 1-NN distance`` of the embeddings. Returns
    ``(eps, {eps: score})``; ties go to the smaller radius.
    """
    if not len(embeddings):
        raise ValueError("embeddings: need at least one cloud to choose eps on")
    embs = [_np(e).astype(np.float64) for e in embeddings]
    base = _median_nn_distance(embs)
    scores: dict[float, float] = {}
    for f in factors:
        eps = float(f * base)
        vals = [track_match_score(cluster_tracks(torch.from_numpy(e), eps, min_samples), pid, pt, rec)
                for e, pid, pt, rec in zip(embs, particle_ids, pts, reconstructables)]
        vals = [v for v in vals if np.isfinite(v)]
        scores[eps] = float(np.mean(vals)) if vals else float("nan")
    finite = {k: v for k, v in scores.items() if np.isfinite(v)}
    best = max(finite, key=lambda k: (finite[k], -k)) if finite else float(factors[0] * base)
    return best, scores


def _label_colors(labels: np.ndarray, seed: int = 0) -> np.ndarray:
    """RGBA per hit: a shuffled qualitative palette per label (neighbouring ids get distinct
    colours), light grey for label < 0 (noise / unclustered)."""
    from matplotlib import colormaps

    palette = np.concatenate([colormaps["tab20"](np.arange(20)), colormaps["tab20b"](np.arange(20)),
                              colormaps["Dark2"](np.arange(8))])
    out = np.tile(np.array([0.75, 0.75, 0.75, 0.6]), (labels.shape[0], 1))
    good = labels >= 0
    if good.any():
        uniq, inv = np.unique(labels[good], return_inverse=True)
        perm = np.random.default_rng(seed).permutation(uniq.size)
        out[good] = palette[perm[inv] % len(palette)]
    return out


def draw_event_display(path: str | os.PathLike, x, y, pred_labels, particle_id, title: str = "",
                       pred_note: str = "", dpi: int = 130) -> Path:
    """Write a two-panel PNG: hits in the transverse plane (x, y) coloured by predicted track
    cluster (left) and by truth particle (right); noise/unclustered hits in grey.

    Args:
        path: output ``.png`` (parent folders are created).
        x, y: ``(n,)`` hit positions [mm].
        pred_labels: ``(n,)`` predicted clusters (−1 = noise); particle_id: ``(n,)`` (0 = noise).
        title: figure title; pred_note: extra text under the left panel's title (e.g. eps).
    Returns:
        ``path`` as a Path.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs, ys = _np(x).astype(float), _np(y).astype(float)
    lab, pid = _np(pred_labels).astype(np.int64), _np(particle_id).astype(np.int64)
    n = xs.shape[0]
    if not (ys.shape == lab.shape == pid.shape == (n,)):
        raise ValueError("x, y, pred_labels, particle_id: expected equal shapes (n,)")
    truth = np.where(pid > 0, pid, -1)
    fig = Figure(figsize=(12, 6), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    n_pred = int(np.unique(lab[lab >= 0]).size)
    n_true = int(np.unique(truth[truth >= 0]).size)
    panels = ((axes[0], lab, f"predicted tracks: {n_pred} clusters" + (f"\n{pred_note}" if pred_note else "")),
              (axes[1], truth, f"truth: {n_true} particles"))
    for ax, labels, label_title in panels:
        colors = _label_colors(labels)
        bg = labels < 0  # grey hits first, so tracks are drawn on top
        ax.scatter(xs[bg], ys[bg], s=3, c=colors[bg], linewidths=0)
        ax.scatter(xs[~bg], ys[~bg], s=5, c=colors[~bg], linewidths=0)
        ax.set_title(label_title, fontsize=10)
        ax.set_xlabel("x [mm]")
        ax.set_aspect("equal", adjustable="box")
        ax.grid(alpha=0.2)
    axes[0].set_ylabel("y [mm]")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)  # readers never see a half-written PNG
    return path
