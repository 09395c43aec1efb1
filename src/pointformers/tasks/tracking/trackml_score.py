"""The TrackML score: the end-to-end metric of track building (TrackML challenge, Accuracy phase).

Definition (Amrouche et al., "The Tracking Machine Learning challenge: Accuracy phase", 2019,
and the challenge's reference scorer):

* Every hit carries a truth weight ``w_i`` (noise hits and hits of particles that left fewer
  than 4 hits weigh 0; the rest depend on the particle's pT and the hit's order along the
  track). The score is normalised by the total weight, so it lies in [0, 1].
* A reconstructed track (a set of hits with one track id) is matched to its *majority
  particle*: the particle with the most hits in the track (noise, particle id 0, counts as a
  particle here as in the reference scorer; ties go to the lowest particle id).
* The track counts ("double majority") when **more than half** of its hits belong to the
  majority particle **and** it holds **more than half** of that particle's hits. Both are
  strict inequalities, so at most one track can count per particle.
* score = Σ over counting tracks of the weights of their majority particle's hits in the
  track, divided by Σ of all weights.

Unassigned hits (track id < 0, e.g. DBSCAN noise) are each treated as a track of their own,
which is what submitting them under unique ids would give; such a one-hit track only scores
if its particle left a single hit (weight 0 under TrackML's rules).

Per-hit weights: the TrackML files carry the official ones (``truth.weight``); the generated
events carry TrackML-like weights (:mod:`pointformers.data.tracking`, same zero-weight rules,
a simplified pT/order profile). :func:`trackml_like_weights` recomputes that profile from
per-hit truth for samples that have lost their weights.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["trackml_score", "trackml_score_split", "trackml_like_weights", "hit_array", "hit_ids"]


def hit_array(a, name: str, n: int | None = None) -> np.ndarray:
    """``a`` (array or tensor) as a 1-D numpy array of one value per hit; ValueError naming ``name``."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    try:
        arr = np.asarray(a)
    except Exception as exc:  # pragma: no cover - defensive
        raise ValueError(f"{name}: cannot convert to an array ({exc})") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array (one value per hit), got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name}: expected {n} values (one per hit), got {arr.shape[0]}")
    return arr


def hit_ids(a, name: str, n: int | None = None) -> np.ndarray:
    """:func:`hit_array` of integer ids (integral floats accepted) as int64; ValueError naming ``name``."""
    arr = hit_array(a, name, n)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name}: expected integer ids, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all() or (arr != np.round(arr)).any():
            raise ValueError(f"{name}: expected integer ids, got non-integer or non-finite values")
    return arr.astype(np.int64)


def trackml_score(track_id, particle_id, weight) -> float:
    """TrackML score of one event (or cloud), see the module docstring.

    Args:
        track_id: ``(n,)`` integer track label of each hit; ``< 0`` = unassigned.
        particle_id: ``(n,)`` integer truth particle of each hit; 0 = noise.
        weight: ``(n,)`` non-negative truth weight of each hit.

    Returns:
        The score in [0, 1]; NaN when the total weight is 0 (nothing to score, e.g. a
        noise-only cloud) or ``n == 0``.
    Raises:
        ValueError: on mismatched lengths, non-integer ids, or non-finite / negative weights.
    """
    tid = hit_ids(track_id, "track_id")
    n = tid.shape[0]
    pid = hit_ids(particle_id, "particle_id", n)
    w = hit_array(weight, "weight", n)
    if w.dtype == bool or not np.issubdtype(w.dtype, np.number):
        raise ValueError(f"weight: expected numbers, got dtype {w.dtype}")
    w = w.astype(np.float64)
    if not np.isfinite(w).all():
        raise ValueError("weight: contains non-finite values")
    if (w < 0).any():
        raise ValueError("weight: truth weights must be >= 0")
    total = w.sum()
    if n == 0 or total <= 0:
        return float("nan")

    # Unassigned hits become singleton tracks with ids above every real one.
    tid = tid.copy()
    free = tid < 0
    if free.any():
        base = int(tid.max()) + 1 if (~free).any() else 0
        tid[free] = base + np.arange(int(free.sum()))
    _, t = np.unique(tid, return_inverse=True)
    _, p = np.unique(pid, return_inverse=True)  # sorted: p order = particle id order (tie rule)
    n_p = int(p.max()) + 1
    track_size = np.bincount(t)
    particle_size = np.bincount(p)

    # (track, particle) cells: hit counts and weight sums.
    key = t.astype(np.int64) * n_p + p
    cells, cell_of_hit, cell_count = np.unique(key, return_inverse=True, return_counts=True)
    cell_weight = np.bincount(cell_of_hit, weights=w, minlength=cells.size)
    cell_t, cell_p = cells // n_p, cells % n_p
    # Majority particle per track: most hits, then lowest particle id.
    order = np.lexsort((cell_p, -cell_count, cell_t))
    first = np.r_[True, cell_t[order][1:] != cell_t[order][:-1]]
    maj = order[first]  # one cell per track
    c = cell_count[maj]
    good = (2 * c > track_size[cell_t[maj]]) & (2 * c > particle_size[cell_p[maj]])
    return float(cell_weight[maj][good].sum() / total)


def trackml_score_split(values: Sequence[float]) -> float:
    """Mean of per-cloud scores over a split (as the challenge averages events), ignoring NaN
    clouds (nothing to score); NaN if none is left."""
    a = np.asarray(list(values), dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(a.mean()) if a.size else float("nan")


def trackml_like_weights(particle_id, pt, order) -> np.ndarray:
    """The TrackML challenge's truth weights recomputed from per-hit truth, ``(n,)``
    (:func:`pointformers.data.trackml_weights.trackml_weights`, the formula of the challenge's
    scoring library): ``w_pT · w_order``, noise and particles with < 4 hits weigh 0, normalised
    to sum to 1 (all zeros stay zeros).

    Args:
        particle_id: ``(n,)`` int, 0 = noise.
        pt: ``(n,)`` the particle's transverse momentum at each hit [GeV].
        order: ``(n,)`` the key hits are ranked by along the particle (the challenge: ``|tz − vz|``;
            any key that increases along the track, e.g. the distance from the origin).
    """
    from ...data.trackml_weights import trackml_weights

    pid = hit_ids(particle_id, "particle_id")
    n = pid.shape[0]
    ptv = hit_array(pt, "pt", n).astype(np.float64)
    key = hit_array(order, "order", n).astype(np.float64)
    if not (np.isfinite(ptv).all() and np.isfinite(key).all()):
        raise ValueError("pt/order: contain non-finite values")
    return trackml_weights(pid, ptv, key)
