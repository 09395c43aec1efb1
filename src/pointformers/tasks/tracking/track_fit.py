"""Track parameters from a track's hits: a helix through the beam line, fitted in closed form.

The transverse projection of a track from the origin is a circle through the origin, x² + y² + D·x +
E·y = 0; in the conformal coordinates u = x / r², v = y / r² (columns 4 and 5 of the tracking inputs,
:func:`~.core.tracking_inputs`) it is the straight line D·u + E·v = −1. A linear least-squares fit of that
line per track gives the circle's centre (−D/2, −E/2) and radius R, and from them

* pT [GeV] = 0.2998 · B [T] · R [m], with B = 2 T · :func:`~pointformers.data.tracking.field_ratio` at
  the track's mean z (the TrackML solenoid);
* the charge: the field points along +z, so a positive particle turns clockwise seen from +z and the
  centre lies on the right of its direction of flight;
* φ: the direction of the tangent at the origin (perpendicular to the centre, pointing to the hits);
* η: z against the transverse arc length s = 2R·asin(r / 2R) from the origin is a straight line of slope
  cot θ = pz / pT; a least-squares line gives it, η = asinh(cot θ).

These are the parameters at the point of closest approach to the beam line, what the truth's momentum at
production is for a track from the primary vertex. No learning: this is the physicist's baseline against
which the end-to-end model's learned parameter head is read.
"""
from __future__ import annotations

import numpy as np

from ...data.tracking import field_ratio

__all__ = ["fit_tracks", "B_FIELD_T", "parameter_resolutions", "PARAM_KEYS", "FIT_KEYS", "fit_resolutions",
           "fitted_parameters", "robust_width"]

#: The keys of :func:`parameter_resolutions`.
PARAM_KEYS = ("pt_rel_res", "pt_rel_bias", "eta_res", "phi_res", "charge_acc", "param_tracks")
#: The same for the helix fit (:func:`fit_resolutions`), without the count.
FIT_KEYS = tuple("fit_" + k for k in PARAM_KEYS[:-1])

#: The central field of the TrackML solenoid [T].
B_FIELD_T = 2.0

#: pT [GeV] of a unit charge on a 1 m radius in a 1 T field.
_GEV_PER_TM = 0.299792458

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

    def total(a: np.ndarray, w: np.ndarray) -> np.ndarray:
        return np.bincount(inv, weights=a * w, minlength=len(ids))

    def circle(w: np.ndarray):
        # the line D·u + E·v = −1: normal equations [[Σuu, Σuv], [Σuv, Σvv]] (D, E) = −(Σu, Σv)
        suu, suv, svv, su, sv = total(u * u, w), total(u * v, w), total(v * v, w), total(u, w), total(v, w)
        det = suu * svv - suv * suv
        with np.errstate(divide="ignore", invalid="ignore"):
            return -(svv * su - suv * sv) / det, -(suu * sv - suv * su) / det, det

    w = np.ones_like(r)
    d, e, det = circle(w)
    if trim > 0 and len(ids):
        with np.errstate(divide="ignore", invalid="ignore"):
            dist = np.abs(d[inv] * u + e[inv] * v + 1) / np.hypot(d, e)[inv] * r * r   # ≈ metres from the circle
        dist = np.where(np.isfinite(dist), dist, 0.0)
        order = np.lexsort((dist, inv))                                  # by track, then distance
        start = np.concatenate([[0], np.cumsum(size)[:-1]])
        median = dist[order[start + (size - 1) // 2]]
        w = (dist <= trim * median[inv] + 1e-3).astype(np.float64)
        w = np.where((np.bincount(inv, weights=w, minlength=len(ids)) < 3)[inv], 1.0, w)
        d, e, det = circle(w)
    used = np.bincount(inv, weights=w, minlength=len(ids))
    keep = size >= 3
    cx, cy = -d / 2, -e / 2                                                     # the centre [m]
    radius = np.hypot(cx, cy)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_x, mean_y = total(r * np.cos(phi), w) / used, total(r * np.sin(phi), w) / used
        mean_z = total(z, w) / used
    pt = _GEV_PER_TM * B_FIELD_T * field_ratio(mean_z * 1000.0) * radius
    # the direction of flight near the origin points to the hits; the centre on its right: positive
    turn = mean_x * cy - mean_y * cx
    charge = np.where(turn < 0, 1.0, np.where(turn > 0, -1.0, np.nan))
    tx, ty = -cy, cx                                                            # perpendicular to the centre
    flip = tx * mean_x + ty * mean_y < 0
    tx, ty = np.where(flip, -tx, tx), np.where(flip, -ty, ty)
    track_phi = np.arctan2(ty, tx)
    # z = z0 + cot θ · s, s the arc length from the origin
    rr = radius[inv]
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(np.isfinite(rr), 2 * rr * np.arcsin(np.clip(r / (2 * rr), -1.0, 1.0)), r)
        ss, sz, s1 = total(s * s, w), total(s * z, w), total(s, w)
        cot = (used * sz - s1 * mean_z * used) / (used * ss - s1 * s1)
    bad = ~np.isfinite(det) | (det == 0)
    return {"track": ids[keep].astype(np.int64), "pt": np.where(bad, np.nan, pt)[keep],
            "charge": np.where(bad, np.nan, charge)[keep], "eta": np.arcsinh(cot)[keep],
            "phi": np.where(bad, np.nan, track_phi)[keep]}


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
