"""Track building: DBSCAN on learned hit embeddings, its radius chosen on validation clouds.

The tracking models map hits to a 12-d space where hits of one particle lie close together
(InfoNCE, :func:`~.core.infonce_loss`). Track candidates are the clusters of
:class:`sklearn.cluster.DBSCAN` in that space; DBSCAN's noise (label −1) is left unassigned.
The radius ``eps`` is the value of a grid that maximises the mean TrackML score
(:func:`~.trackml_score.trackml_score`) over the validation clouds; the test score is then
computed with that radius, never tuned on test data.

Speed: per cloud, the radius-neighbour graph is built once at the largest candidate radius
(:meth:`sklearn.neighbors.NearestNeighbors.radius_neighbors_graph`, a KD-tree search) and
every candidate runs DBSCAN on it with ``metric="precomputed"`` (DBSCAN keeps the stored
entries ``<= eps``), so the grid costs one neighbour search per cloud. Memory is
O(pairs within the largest radius); the default grid's largest radius is a high percentile
of the 10th-neighbour distance, so that is O(10·n).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

try:
    from sklearn.cluster import DBSCAN
    from sklearn.neighbors import NearestNeighbors
except ModuleNotFoundError as exc:  # optional dependency: the 'tasks' extra
    raise ModuleNotFoundError("pointformers.tasks.tracking.building needs scikit-learn: "
                              "pip install 'pointformers[tasks]'", name=exc.name) from exc

from .trackml_score import trackml_score, trackml_score_split

__all__ = ["EpsSelection", "dbscan_tracks", "default_eps_grid", "choose_dbscan_eps", "track_building_score"]

#: Coarse candidates of the default grid, and refinement points between the best one's neighbours.
DEFAULT_GRID_SIZE = 16
DEFAULT_REFINE = 7
# Points per cloud used to estimate neighbour-distance percentiles for the default grid.
_GRID_SAMPLE = 4096


def _embedding(emb, name: str = "emb") -> np.ndarray:
    if isinstance(emb, torch.Tensor):
        emb = emb.detach().cpu().double().numpy()
    x = np.asarray(emb)
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{name}: expected a floating array of shape (n, d), got {x.dtype} {x.shape}")
    x = x.astype(np.float64, copy=False)
    if not np.isfinite(x).all():
        raise ValueError(f"{name}: contains non-finite values")
    return x


def _check_eps(eps: float, name: str = "eps") -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {eps!r}")
    return float(eps)


def _check_min_samples(min_samples: int) -> int:
    if isinstance(min_samples, bool) or not isinstance(min_samples, (int, np.integer)) or min_samples < 1:
        raise ValueError(f"min_samples: must be an integer >= 1, got {min_samples!r}")
    return int(min_samples)


def dbscan_tracks(emb, eps: float, min_samples: int = 2) -> np.ndarray:
    """Track candidates of one cloud: sklearn DBSCAN labels ``(n,)`` int64, −1 = unassigned.

    Args:
        emb: ``(n, d)`` embeddings (tensor or array), finite.
        eps: neighbourhood radius (closed ball, L2); min_samples: points in a core point's
            neighbourhood, itself included.
    """
    x = _embedding(emb)
    eps = _check_eps(eps)
    min_samples = _check_min_samples(min_samples)
    if x.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return DBSCAN(eps=eps, min_samples=min_samples).fit(x).labels_.astype(np.int64)


def default_eps_grid(embeddings: Sequence, num: int = DEFAULT_GRID_SIZE, k: int = 10) -> np.ndarray:
    """Geometric grid of ``num`` radii from the 5th percentile of the nearest-neighbour distance
    to the 95th percentile of the ``k``-th-neighbour distance over the given clouds (a sample of
    up to 4096 hits per cloud, seeded), i.e. from "almost every hit alone" to "most hits joined to
    ~k others". Clouds with fewer than 2 hits are ignored.

    Raises:
        ValueError: no cloud has 2 hits, or all neighbour distances are 0.
    """
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"num: must be an integer >= 1, got {num!r}")
    rng = np.random.default_rng(0)
    d1, dk = [], []
    for i, e in enumerate(embeddings):
        x = _embedding(e, f"embeddings[{i}]")
        n = x.shape[0]
        if n < 2:
            continue
        q = x if n <= _GRID_SAMPLE else x[rng.choice(n, _GRID_SAMPLE, replace=False)]
        kk = min(k, n - 1)
        dist, _ = NearestNeighbors(n_neighbors=kk + 1).fit(x).kneighbors(q)  # column 0 is the hit itself
        d1.append(dist[:, 1])
        dk.append(dist[:, kk])
    if not d1:
        raise ValueError("embeddings: need at least one cloud with 2 or more hits to choose a DBSCAN radius")
    d1a, dka = np.concatenate(d1), np.concatenate(dk)
    hi = float(np.percentile(dka, 95))
    pos = d1a[d1a > 0]
    if hi <= 0 or pos.size == 0:
        raise ValueError("embeddings: every neighbour distance is 0 (collapsed embeddings); no radius separates hits")
    lo = min(float(np.percentile(pos, 5)), hi)
    return np.geomspace(lo, hi, num) if num > 1 else np.array([hi])


@dataclass
class EpsSelection:
    """Result of :func:`choose_dbscan_eps`.

    Attributes:
        eps: the chosen radius; score: its mean TrackML score over the clouds.
        scores: every evaluated radius -> mean score (NaN when no cloud could be scored).
        min_samples: the DBSCAN ``min_samples`` used.
    """

    eps: float
    score: float
    scores: dict[float, float] = field(default_factory=dict)
    min_samples: int = 2


def _scores_on_graphs(graphs, pids, weights, eps_values, min_samples) -> dict[float, float]:
    out = {}
    for eps in eps_values:
        vals = []
        for g, pid, w in zip(graphs, pids, weights):
            if g is None:  # empty cloud
                continue
            labels = DBSCAN(eps=float(eps), min_samples=min_samples, metric="precomputed").fit(g).labels_
            vals.append(trackml_score(labels, pid, w))
        out[float(eps)] = trackml_score_split(vals)
    return out


def choose_dbscan_eps(embeddings: Sequence, particle_ids: Sequence, weights: Sequence,
                      eps_grid: Sequence[float] | None = None, min_samples: int = 2,
                      refine: int = DEFAULT_REFINE) -> EpsSelection:
    """The DBSCAN radius that maximises the mean TrackML score over the given (validation) clouds.

    Args:
        embeddings: one ``(n_i, d)`` embedding per cloud.
        particle_ids, weights: per cloud ``(n_i,)`` truth particle ids (0 = noise) and truth weights.
        eps_grid: candidate radii; None = :func:`default_eps_grid` of the embeddings.
        min_samples: DBSCAN's ``min_samples``.
        refine: after the grid, this many extra radii (geometric) between the best candidate's
            two neighbours in the grid are tried too (0 = off).
    When several radii tie for the best score, the middle one of them (the lower middle for an
    even count) is taken, away from both edges of the plateau. Clouds whose score is NaN (no
    weight) are ignored.

    Raises:
        ValueError: no clouds, mismatched lists, bad radii, or no cloud that can be scored.
    """
    embs = list(embeddings)
    pids, ws = list(particle_ids), list(weights)
    if not embs:
        raise ValueError("embeddings: need at least one validation cloud to choose the DBSCAN radius")
    if not (len(pids) == len(ws) == len(embs)):
        raise ValueError(f"particle_ids/weights: expected {len(embs)} clouds each, got {len(pids)} and {len(ws)}")
    min_samples = _check_min_samples(min_samples)
    if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
        raise ValueError(f"refine: must be an integer >= 0, got {refine!r}")
    xs = [_embedding(e, f"embeddings[{i}]") for i, e in enumerate(embs)]
    if eps_grid is None:
        grid = default_eps_grid(xs)
    else:
        grid = np.asarray([_check_eps(float(e), "eps_grid") for e in eps_grid], dtype=np.float64)
        if grid.size == 0:
            raise ValueError("eps_grid: must hold at least one radius")
    grid = np.unique(grid)
    eps_max = float(grid.max())
    graphs = []
    for i, x in enumerate(xs):
        if x.shape[0] != len(pids[i]) or x.shape[0] != len(ws[i]):
            raise ValueError(f"particle_ids[{i}]/weights[{i}]: expected {x.shape[0]} values (one per hit), "
                             f"got {len(pids[i])} and {len(ws[i])}")
        graphs.append(None if x.shape[0] == 0 else
                      NearestNeighbors(radius=eps_max).fit(x).radius_neighbors_graph(x, mode="distance"))
    scores = _scores_on_graphs(graphs, pids, ws, grid, min_samples)

    def best_of(sc: dict[float, float]) -> float | None:
        finite = {k: v for k, v in sc.items() if np.isfinite(v)}
        if not finite:
            return None
        top = max(finite.values())
        tied = sorted(k for k, v in finite.items() if v == top)
        return tied[(len(tied) - 1) // 2]  # middle of a plateau: farthest from both failure modes

    best = best_of(scores)
    if best is None:
        raise ValueError("weights: no validation cloud has a positive total truth weight; the TrackML score "
                         "is undefined on all of them")
    if refine and grid.size > 1:
        i = int(np.searchsorted(grid, best))
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
        extra = [e for e in np.geomspace(lo, hi, refine + 2)[1:-1] if float(e) not in scores]
        scores.update(_scores_on_graphs(graphs, pids, ws, extra, min_samples))
        best = best_of(scores)
    return EpsSelection(eps=float(best), score=float(scores[best]), scores=dict(sorted(scores.items())),
                        min_samples=min_samples)


def track_building_score(embeddings: Sequence, particle_ids: Sequence, weights: Sequence, eps: float,
                         min_samples: int = 2) -> float:
    """Mean TrackML score over clouds of DBSCAN(``eps``, ``min_samples``) track candidates
    (clouds with no truth weight are skipped; NaN if none is left)."""
    embs, pids, ws = list(embeddings), list(particle_ids), list(weights)
    if not (len(pids) == len(ws) == len(embs)):
        raise ValueError(f"particle_ids/weights: expected {len(embs)} clouds each, got {len(pids)} and {len(ws)}")
    vals = [trackml_score(dbscan_tracks(e, eps, min_samples), p, w) for e, p, w in zip(embs, pids, ws)]
    return trackml_score_split(vals)
