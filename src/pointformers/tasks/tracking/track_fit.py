"""Track parameters from a track's hits: a helix through the beam line, fitted in closed form.

Each track's hits are fitted by :mod:`pointformers.data.helix` (a least-squares line in the conformal
coordinates u = x / r², v = y / r², columns 4 and 5 of the tracking inputs, :func:`~.core.tracking_inputs`,
gives the circle through the origin; pT from its radius in the TrackML field, the charge from its turning
sense, φ from its tangent at the origin, η from z against the arc length), refitted once without the hits far
from the first circle. These are the parameters at the point of closest approach to the beam line, what the
truth's momentum at production is for a track from the primary vertex. No learning: this is the physicist's
baseline against which the end-to-end model's learned parameter head is read.
"""
from __future__ import annotations

import numpy as np

from ...data.helix import B_FIELD_T, conformal_circle, helix_parameters

__all__ = ["fit_tracks", "B_FIELD_T", "parameter_resolutions", "PARAM_KEYS", "FIT_KEYS", "fit_resolutions",
           "fitted_parameters", "robust_width"]

#: The keys of :func:`parameter_resolutions`.
PARAM_KEYS = ("pt_rel_res", "pt_rel_bias", "eta_res", "phi_res", "charge_acc", "param_tracks")
#: The same for the helix fit (:func:`fit_resolutions`), without the count.
FIT_KEYS = tuple("fit_" + k for k in PARAM_KEYS[:-1])

# Columns of the tracking inputs (:data:`~.core.TRACKING_FEATURES`): r [m], φ / π, z [m], u, v [1 / m].
_R, _PHI, _Z, _U, _V = 0, 1, 2, 4, 5


def fit_tracks(labels: np.ndarray, x: np.ndarray, trim: float = 3.0) -> dict[str, np.ndarray]:
    """Fitted pT, charge, η and φ of every track of one event.

    Args:
        labels: ``(n,)`` int track labels (−1: no track).
        x: ``(n, ≥ 6)`` the tracking inputs of the same hits (r/1000, φ/π, z/1000, η, u·1000, v·1000, …).
        trim: ``> 0``: after a first fit of all its hits, a track is fitted again without the hits farther
            from its circle than ``trim`` × the track's median distance (+ 1 mm), so that the few hits of
            other particles in an impure track do not pull the fit (at least three hits are kept; 0: one fit).

    Returns:
        ``{"track": (T,) int64 labels, "pt", "charge", "eta", "phi": (T,) float64}`` for the tracks of at
        least three hits (fewer fix no circle and line): NaN where the fit is degenerate (hits on one line
        through the origin give pT = inf, charge NaN).
    """
    labels = np.asarray(labels)
    x = np.asarray(x, dtype=np.float64)
    if labels.ndim != 1 or x.ndim != 2 or x.shape[0] != labels.shape[0] or x.shape[1] < 6:
        raise ValueError(f"fit_tracks: expected labels (n,) and tracking inputs x (n, >= 6), got "
                         f"{labels.shape} and {x.shape}")
    if isinstance(trim, bool) or not isinstance(trim, (int, float)) or not (0 <= trim < float("inf")):
        raise ValueError(f"trim: expected a finite number >= 0 (0: no refit), got {trim!r}")
    real = labels >= 0
    ids, inv, size = np.unique(labels[real], return_inverse=True, return_counts=True)
    r, phi, z = x[real, _R], x[real, _PHI] * np.pi, x[real, _Z]
    u, v = x[real, _U], x[real, _V]
    w = np.ones_like(r)

    def total(a: np.ndarray) -> np.ndarray:           # Σ w·a over each track's hits, w as it stands
        return np.bincount(inv, weights=a * w, minlength=len(ids))

    with np.errstate(divide="ignore", invalid="ignore"):
        d, e, det = conformal_circle(u, v, total)
        if trim > 0 and len(ids):
            dist = np.abs(d[inv] * u + e[inv] * v + 1) / np.hypot(d, e)[inv] * r * r   # ≈ metres from the circle
            dist = np.where(np.isfinite(dist), dist, 0.0)
            order = np.lexsort((dist, inv))                                  # by track, then distance
            start = np.concatenate([[0], np.cumsum(size)[:-1]])
            median = dist[order[start + (size - 1) // 2]]
            w = (dist <= trim * median[inv] + 1e-3).astype(np.float64)
            w = np.where((np.bincount(inv, weights=w, minlength=len(ids)) < 3)[inv], 1.0, w)
            d, e, det = conformal_circle(u, v, total)
        fit = helix_parameters(d, e, r, phi, z, total, lambda g: g[inv])
    keep = size >= 3
    bad = ~np.isfinite(det) | (det == 0)
    return {"track": ids[keep].astype(np.int64), "pt": np.where(bad, np.nan, fit["pt"])[keep],
            "charge": np.where(bad, np.nan, fit["charge"])[keep], "eta": np.arcsinh(fit["cot"])[keep],
            "phi": np.where(bad, np.nan, fit["phi"])[keep]}


def _wrap(a: np.ndarray) -> np.ndarray:
    """Angles to (−π, π]."""
    return np.arctan2(np.sin(a), np.cos(a))


def robust_width(r: np.ndarray) -> float:
    """The spread of residuals, 1.4826 × the median absolute deviation (the standard deviation of a
    Gaussian core, not pulled by a few mismatched tracks) of the finite entries (a degenerate fit is NaN);
    NaN for none."""
    r = np.asarray(r, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return float("nan")
    return float(1.4826 * np.median(np.abs(r - np.median(r))))


def parameter_resolutions(predicted: dict[str, np.ndarray], truth: dict[str, np.ndarray]) -> dict[str, float]:
    """Resolutions of track parameters against the truth of the tracks' particles.

    Args:
        predicted, truth: ``pt``, ``eta``, ``phi``, ``charge`` arrays ``(T,)`` of the same tracks.

    Returns:
        ``pt_rel_res`` (width of pT_pred / pT_true − 1) and ``pt_rel_bias`` (its median: a width is taken
        around the median, so a biased estimate can have a small one), ``eta_res`` and ``phi_res`` (widths of the
        differences, φ wrapped), widths as 1.4826 × MAD of the finite entries; ``charge_acc`` (fraction with
        the right sign; NaN counts as wrong) and ``param_tracks`` (T).
    """
    t = len(truth["pt"])
    rel = np.asarray(predicted["pt"], dtype=np.float64) / np.asarray(truth["pt"], dtype=np.float64) - 1
    finite = rel[np.isfinite(rel)]
    return {"pt_rel_res": robust_width(rel), "pt_rel_bias": float(np.median(finite)) if finite.size else float("nan"),
            "eta_res": robust_width(predicted["eta"] - truth["eta"]),
            "phi_res": robust_width(_wrap(predicted["phi"] - truth["phi"])),
            "charge_acc": float(np.mean(np.sign(predicted["charge"]) == np.sign(truth["charge"]))) if t else float("nan"),
            "param_tracks": float(t)}


def fitted_parameters(fits: list[dict[str, np.ndarray]], matched: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The helix-fit parameters of given tracks: ``pt``, ``eta``, ``phi``, ``charge`` ``(T,)``, the clouds'
    tracks concatenated (NaN for a track without a fit).

    Args:
        fits: per cloud, :func:`fit_tracks` of its labels.
        matched: per cloud, the tracks' labels ``(t,)``.
    """
    got: dict[str, list] = {k: [np.zeros(0)] for k in ("pt", "eta", "phi", "charge")}
    for fit, tracks in zip(fits, matched):
        tracks = np.asarray(tracks)
        if not len(fit["track"]):
            for k in got:
                got[k].append(np.full(len(tracks), np.nan))
            continue
        i = np.clip(np.searchsorted(fit["track"], tracks), 0, len(fit["track"]) - 1)
        ok = fit["track"][i] == tracks
        for k in got:
            got[k].append(np.where(ok, fit[k][i], np.nan))
    return {k: np.concatenate(v) for k, v in got.items()}


def fit_resolutions(fitted: dict[str, np.ndarray], truth: dict[str, np.ndarray]) -> dict[str, float]:
    """:data:`FIT_KEYS`: :func:`parameter_resolutions` of :func:`fitted_parameters` against ``truth``."""
    res = parameter_resolutions(fitted, truth)
    return {"fit_" + k: res[k] for k in PARAM_KEYS[:-1]}
