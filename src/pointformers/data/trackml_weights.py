"""The TrackML challenge's per-hit truth weights, as its scoring library computes them.

``weight = w_pT · w_order``, normalised to sum to 1 over the event (Amrouche et al. 2019; the
challenge's ``trackml`` library, ``weights.py``):

* ``w_pT``: the particle's transverse momentum through the points (0.05, 0.2), (0.5, 0.2),
  (3, 1), linear in between, 0 below 0.05 GeV and 1 above 3 GeV;
* ``w_order``: 0 for noise and for particles with fewer than 4 hits; otherwise the hits are
  ranked by ``order`` (the challenge: ``|tz − vz|``, the distance along z from the particle's
  vertex; ties share their average rank, truncated), the hit count is capped at 20, and the
  profile (10, 8, 6, 5, 3, 3, 3, 5, 6) is stretched linearly over the particle's hits and
  normalised per particle, so that the first and last hits weigh most; hits ranked 20th and
  beyond weigh 0.
"""
from __future__ import annotations

import numpy as np

__all__ = ["ORDER_PROFILE", "ORDER_MIN_HITS", "ORDER_MAX_HITS", "order_weights", "pt_weights", "trackml_weights"]

ORDER_PROFILE = (10.0, 8.0, 6.0, 5.0, 3.0, 3.0, 3.0, 5.0, 6.0)
ORDER_MIN_HITS = 4
ORDER_MAX_HITS = 20


def _order_matrix() -> np.ndarray:
    """(21, 20): row n holds the normalised order weights of a particle with n hits."""
    m = np.zeros((ORDER_MAX_HITS + 1, ORDER_MAX_HITS))
    knots = np.arange(len(ORDER_PROFILE), dtype=np.float64)
    for n in range(ORDER_MIN_HITS, ORDER_MAX_HITS + 1):
        w = np.interp(np.arange(n, dtype=np.float64), knots * (n - 1) / (len(ORDER_PROFILE) - 1), ORDER_PROFILE)
        m[n, :n] = w / w.sum()
    return m


_ORDER_MATRIX = _order_matrix()


def pt_weights(pt: np.ndarray) -> np.ndarray:
    """``w_pT`` of transverse momenta [GeV], ``(n,)``."""
    return np.interp(np.asarray(pt, np.float64), [0.05, 0.5, 3.0], [0.2, 0.2, 1.0], left=0.0, right=1.0)


def order_weights(particle_id: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``w_order`` per hit, ``(n,)``: see the module docstring. particle_id (n,) int, 0 = noise."""
    pid = np.asarray(particle_id, np.int64)
    key = np.asarray(order, np.float64)
    w = np.zeros(len(pid))
    real = np.flatnonzero(pid != 0)
    if real.size == 0:
        return w
    srt = real[np.lexsort((key[real], pid[real]))]
    p, k = pid[srt], key[srt]
    group = np.r_[True, p[1:] != p[:-1]]
    g_start = np.flatnonzero(group)
    g_id = np.cumsum(group) - 1
    pos = np.arange(len(srt)) - g_start[g_id]  # 0-based position within the particle
    # ties in the order key share their average rank (pandas' rank), truncated to an integer
    run = np.r_[True, (p[1:] != p[:-1]) | (k[1:] != k[:-1])]
    r_id = np.cumsum(run) - 1
    r_start = np.flatnonzero(run)
    r_end = np.r_[r_start[1:], len(srt)] - 1
    ihit = np.floor((pos[r_start] + pos[r_end])[r_id] / 2.0).astype(np.int64)
    nhits = np.diff(np.r_[g_start, len(srt)])[g_id]
    capped = np.minimum(nhits, ORDER_MAX_HITS)
    ok = (nhits >= ORDER_MIN_HITS) & (ihit < ORDER_MAX_HITS)
    w[srt[ok]] = _ORDER_MATRIX[capped[ok], ihit[ok]]
    return w


def trackml_weights(particle_id: np.ndarray, pt: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The challenge's truth weights, ``(n,)`` float64 summing to 1 (all zeros stay zeros).

    Args:
        particle_id: ``(n,)`` int, 0 = noise. pt: ``(n,)`` the hit's particle pT [GeV].
        order: ``(n,)`` the key hits are ranked by within a particle (``|tz − vz|``).
    """
    w = pt_weights(pt) * order_weights(particle_id, order)
    total = w.sum()
    return w / total if total > 0 else w
