"""A helix through the beam line from weighted sums over hits: the closed-form fit shared by the helix fit
of tracks (:mod:`pointformers.tasks.tracking.track_fit`, numpy, hard labels) and the end-to-end model's
fit-seeded parameter head (:class:`~pointformers.models.track_reconstruction.TrackReconstructor`, torch,
each slot's score-weighted hits).

The transverse projection of a track from the origin is a circle through the origin, x² + y² + D·x + E·y
= 0; in the conformal coordinates u = x / r², v = y / r² it is the straight line D·u + E·v = −1, fitted by
weighted least squares (:func:`conformal_circle`). From the circle's centre (−D/2, −E/2) and radius R
(:func:`helix_parameters`):

* pT [GeV] = 0.2998 · B [T] · R [m], with B = 2 T · :func:`field_ratio` at the
  track's mean z (the TrackML solenoid);
* the charge: the field points along +z, so a positive particle turns clockwise seen from +z and the centre
  lies on the right of its direction of flight;
* φ: the direction of the tangent at the origin (perpendicular to the centre, pointing to the hits);
* cot θ = pz / pT: the slope of z against the transverse arc length s = 2R·asin(r / 2R) from the origin
  (a weighted least-squares line), η = asinh(cot θ).

Every function works on numpy arrays and on torch tensors alike; the caller chooses the grouping and the
weights through two callables: ``total(a)``, the weighted sum of a per-hit array over each group's hits
``(G,)`` (or ``(S, M)``), and ``per_hit(g)``, a per-group array read back at each hit.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

__all__ = ["B_FIELD_T", "GEV_PER_TM", "field_ratio", "conformal_circle", "helix_parameters"]

#: The central field of the TrackML solenoid [T].
B_FIELD_T = 2.0

#: pT [GeV] of a unit charge on a 1 m radius in a 1 T field.
GEV_PER_TM = 0.299792458


def field_ratio(z: np.ndarray) -> np.ndarray:
    """Bz(z) / B0 of the TrackML solenoid: 1.002 − 0.03·z′ − z′²·(0.55 − 0.3·(1 − z′²)), z′ = z / 2750 mm
    (z [mm]: array-like, or a tensor, which gives a tensor).

    The field model of the challenge's 1st-place solution (top-quarks, ``src/density.hpp``),
    which improved its score: 1.00 at z = 0, 0.99 at |z| = 455 mm (barrel end), 0.885 / 0.918 at
    z = +1500 / −1500 mm. The field is taken along z only (Bx = By = 0).
    """
    zp = (z if isinstance(z, torch.Tensor) else np.asarray(z, np.float64)) / 2750.0
    return 1.002 - 0.03 * zp - zp * zp * (0.55 - 0.3 * (1.0 - zp * zp))


def _ns(a):
    return torch if isinstance(a, torch.Tensor) else np


def conformal_circle(u, v, total: Callable):
    """The least-squares line D·u + E·v = −1 of each group: ``(D, E, det)`` per group.

    Args:
        u, v: per-hit conformal coordinates [1/m].
        total: the weighted sum over each group's hits (see the module docstring).

    Returns:
        D, E (the circle x² + y² + D·x + E·y = 0, in metres) and the determinant of the normal equations
        (0 or tiny: the hits lie on a line through the origin, D and E are inf / NaN).
    """
    suu, suv, svv, su, sv = total(u * u), total(u * v), total(v * v), total(u), total(v)
    det = suu * svv - suv * suv
    return -(svv * su - suv * sv) / det, -(suu * sv - suv * su) / det, det


def helix_parameters(d, e, r, phi, z, total: Callable, per_hit: Callable) -> dict:
    """pT, charge, φ and cot θ of each group's helix from its circle (:func:`conformal_circle`).

    Args:
        d, e: the circle of each group.
        r, phi, z: per-hit transverse radius [m], azimuth [rad] and z [m].
        total, per_hit: the grouping and weights (see the module docstring).

    Returns:
        ``{"radius" [m], "pt" [GeV], "charge" (±1, NaN when the hits sit on the centre's line), "phi" [rad],
        "cot" (cot θ), "weight" (Σ w)}`` per group; NaN or inf where a group is degenerate (no weight, hits on
        a line through the origin).
    """
    xp = _ns(d)
    used = total(r * 0 + 1)
    cx, cy = -d / 2, -e / 2                                                  # the centre [m]
    radius = xp.hypot(cx, cy)
    mean_x, mean_y = total(r * xp.cos(phi)) / used, total(r * xp.sin(phi)) / used
    mean_z = total(z) / used
    pt = GEV_PER_TM * B_FIELD_T * field_ratio(mean_z * 1000.0) * radius
    # the direction of flight near the origin points to the hits; the centre on its right: positive
    turn = mean_x * cy - mean_y * cx
    charge = xp.where(turn < 0, 1.0, xp.where(turn > 0, -1.0, float("nan")))
    tx, ty = -cy, cx                                                         # perpendicular to the centre
    flip = tx * mean_x + ty * mean_y < 0
    tx, ty = xp.where(flip, -tx, tx), xp.where(flip, -ty, ty)
    # z = z0 + cot θ · s, s the arc length from the origin (r itself for a straight track)
    rr = per_hit(radius)
    s = xp.where(xp.isfinite(rr), 2 * rr * xp.arcsin(xp.clip(r / (2 * rr), -1.0, 1.0)), r)
    ss, sz, s1 = total(s * s), total(s * z), total(s)
    cot = (used * sz - s1 * mean_z * used) / (used * ss - s1 * s1)
    return {"radius": radius, "pt": pt, "charge": charge, "phi": xp.arctan2(ty, tx), "cot": cot, "weight": used}
