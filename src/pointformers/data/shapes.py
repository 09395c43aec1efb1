"""Procedural 3-D shapes with exact normals and part labels (ModelNet40 / ShapeNetPart stand-in).

Generator:

* Primitives sampled uniformly by area with exact outward normals, in their local frame:
  surfaces of revolution about the local z axis built from line, elliptic-arc and smooth
  graph ``r = f(z)`` profile segments (cylinders, cones, frusta, spheres, spheroids,
  capsules, tori, bowls, shades, vases; a φ range gives partial tori such as handles);
  ellipsoids (sphere points accepted with probability ∝ the area element, which is exact);
  convex polyhedra (boxes, prisms, pyramids, octahedra, wedges; faces by area, uniform
  barycentric points).
* :data:`CLASSES`: 40 classes — primitives with natural part splits (cylinder side/caps,
  box sides/lid, …) and composites (table = top + legs + stretchers, chair, lamp, mug,
  airplane, …) with per-part labels, 2–4 parts per class, and random proportions over wide
  ranges so that size and bounding-box ratios overlap between classes (shape decides).
  Like ShapeNetPart, part ids are global and each class owns a contiguous block of them
  (:func:`class_parts`); a shape may lack optional parts (chair arms, table stretchers).
* Composition: surface points of a part that fall inside another closed part are removed
  (hidden surfaces), which keeps the sample uniform over the visible surface.
* Deformation: a smooth random map ``F(x) = x + Σ_k a_k u_k sin(w_k·x + φ_k)`` (``deform`` =
  ``Σ_k |a_k||w_k|``, the bound on ``|J - I|``). Normals map exactly as ``n' ∝ J^{-T} n`` and
  points are accepted with probability ∝ the area stretch ``det J · |J^{-T} n|``, so the
  deformed surface is still sampled uniformly by area.
* Finally shapes are centred on the centroid and scaled to unit max radius (the
  PointNet++/ModelNet preprocessing), optional Gaussian position noise ``noise_std`` is
  added (normals stay the exact normals of the noise-free surface), and the up axis is
  ``y`` as in ModelNet40 ``normal_resampled`` and ShapeNetPart (``up_axis="z"`` keeps z).

Data sets (:func:`load_shapes_dataset`) are deterministic in (params, seed, split, index) —
shape ``i`` of class ``c`` in a split uses its own seeded stream — and cached on disk keyed
by all parameters and :data:`GENERATOR_VERSION`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

try:
    from scipy.spatial import ConvexHull
except ModuleNotFoundError as exc:  # optional dependency: the 'tasks' extra
    raise ModuleNotFoundError("pointformers.data.shapes needs scipy: pip install 'pointformers[tasks]'",
                              name=exc.name) from exc

from .cache import cache_path, cached_arrays, default_cache_dir, save_arrays
from .clouds import ShapeCloud, ShapeCloudSet, pack_clouds, unpack_clouds

#: Bump when the generator's output for given parameters changes (invalidates caches).
GENERATOR_VERSION = 1
SPLITS = ("train", "val", "test")
_TWO_PI = 2.0 * math.pi


# ============================================================================ rotations
def rotation(axis: Sequence[float], angle: float) -> np.ndarray:
    """(3, 3) rotation by ``angle`` (radians) about ``axis`` (Rodrigues)."""
    a = np.asarray(axis, float)
    a = a / np.linalg.norm(a)
    K = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + math.sin(angle) * K + (1 - math.cos(angle)) * (K @ K)


def align_z(direction: Sequence[float]) -> np.ndarray:
    """(3, 3) rotation taking the z axis to ``direction``."""
    d = np.asarray(direction, float)
    d = d / np.linalg.norm(d)
    z = np.array([0.0, 0.0, 1.0])
    c = float(z @ d)
    if c > 1 - 1e-12:
        return np.eye(3)
    if c < -1 + 1e-12:
        return rotation([1, 0, 0], math.pi)
    return rotation(np.cross(z, d), math.acos(c))


TO_X = align_z([1, 0, 0])  # a part built along local z, laid along world x
TO_Y = align_z([0, 1, 0])
UP_Y = rotation([1, 0, 0], -math.pi / 2)  # z-up authoring frame -> y-up output (z -> y)


# ============================================================================ primitives
class Primitive:
    """A surface in its local frame: area, area-uniform sampling with normals, solid inside test."""

    def area(self) -> float:
        raise NotImplementedError

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` points (n, 3), unit normals (n, 3) and a sub-surface index (n,) int."""
        raise NotImplementedError

    def inside(self, p: np.ndarray) -> np.ndarray:
        """(m,) bool: strictly inside the solid this surface bounds (False for open surfaces)."""
        return np.zeros(len(p), bool)


class _Segment:
    """A profile segment t ∈ [0, 1] -> (r, z) with derivatives."""

    def eval(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError


class Line(_Segment):
    def __init__(self, r0: float, z0: float, r1: float, z1: float) -> None:
        self.r0, self.z0, self.dr, self.dz = float(r0), float(z0), float(r1 - r0), float(z1 - z0)

    def eval(self, t):
        one = np.ones_like(t)
        return self.r0 + self.dr * t, self.z0 + self.dz * t, self.dr * one, self.dz * one


class Arc(_Segment):
    """Elliptic arc r = rc + ar cos θ, z = zc + az sin θ, θ from th0 to th1."""

    def __init__(self, rc: float, zc: float, ar: float, az: float, th0: float, th1: float) -> None:
        self.rc, self.zc, self.ar, self.az, self.th0, self.dth = rc, zc, ar, az, th0, th1 - th0

    def eval(self, t):
        th = self.th0 + self.dth * t
        return (self.rc + self.ar * np.cos(th), self.zc + self.az * np.sin(th),
                -self.ar * np.sin(th) * self.dth, self.az * np.cos(th) * self.dth)


class Graph(_Segment):
    """r = r0 · (1 + Σ_k a_k sin(k π s + φ_k)), s = (z - z0) / (z1 - z0), z from z0 to z1."""

    def __init__(self, z0: float, z1: float, r0: float, amps: Sequence[float], phases: Sequence[float]) -> None:
        self.z0, self.h, self.r0 = z0, z1 - z0, r0
        self.k = np.arange(1, len(amps) + 1, dtype=float)
        self.a, self.ph = np.asarray(amps, float), np.asarray(phases, float)

    def eval(self, t):
        arg = self.k * math.pi * t[:, None] + self.ph
        r = self.r0 * (1 + (self.a * np.sin(arg)).sum(1))
        dr = self.r0 * (self.a * self.k * math.pi * np.cos(arg)).sum(1)
        return r, self.z0 + self.h * t, dr, np.full_like(t, self.h)


_GRID = np.linspace(0.0, 1.0, 1025)


class Revolution(Primitive):
    """Surface swept by profile segments about the local z axis, for φ in [phi0, phi1].

    Segments are traversed so that the outward normal in the meridian plane is
    ``(dz, -dr) / |c'|`` (counter-clockwise around the solid). ``closed``: the profile with
    the axis bounds a solid (used to hide other parts' points inside it).
    """

    def __init__(self, segments: Sequence[_Segment], closed: bool = True, phi0: float = 0.0,
                 phi1: float = _TWO_PI) -> None:
        self.segments = list(segments)
        self.closed = closed
        self.phi0, self.dphi = phi0, phi1 - phi0
        self._seg_area = []
        self._seg_max = []
        for s in self.segments:
            r, _, dr, dz = s.eval(_GRID)
            w = np.abs(r) * np.hypot(dr, dz)
            # Simpson's rule on 1025 points: exact enough for smooth profiles.
            simpson = (w[0] + w[-1] + 4 * w[1:-1:2].sum() + 2 * w[2:-1:2].sum()) / (3 * (len(w) - 1))
            self._seg_area.append(self.dphi * simpson)
            self._seg_max.append(1.05 * w.max() + 1e-12)
        self._seg_area = np.asarray(self._seg_area)
        if closed:
            poly = [np.stack(s.eval(_GRID[::8])[:2], 1) for s in self.segments]
            self._poly = np.concatenate(poly)

    def area(self) -> float:
        return float(self._seg_area.sum())

    def sample(self, n, rng):
        counts = rng.multinomial(n, self._seg_area / self._seg_area.sum())
        pts, nrm, sub = [], [], []
        for k, (seg, m) in enumerate(zip(self.segments, counts)):
            if m == 0:
                continue
            t = _rejection(lambda tt: (lambda r, z, dr, dz: np.abs(r) * np.hypot(dr, dz))(*seg.eval(tt)),
                           m, self._seg_max[k], rng)
            r, z, dr, dz = seg.eval(t)
            phi = self.phi0 + self.dphi * rng.random(m)
            c, s = np.cos(phi), np.sin(phi)
            ln = np.hypot(dr, dz)
            nr, nz = dz / ln, -dr / ln
            pts.append(np.stack([r * c, r * s, z], 1))
            nrm.append(np.stack([nr * c, nr * s, nz], 1))
            sub.append(np.full(m, k))
        return np.concatenate(pts), np.concatenate(nrm), np.concatenate(sub)

    def inside(self, p):
        if not self.closed:
            return np.zeros(len(p), bool)
        rho = np.hypot(p[:, 0], p[:, 1])
        inside = _point_in_polygon(np.stack([rho, p[:, 2]], 1), self._poly)
        if self.dphi < _TWO_PI - 1e-9:
            phi = np.mod(np.arctan2(p[:, 1], p[:, 0]) - self.phi0, _TWO_PI)
            inside &= phi < self.dphi
        return inside


def _rejection(weight: Callable[[np.ndarray], np.ndarray], n: int, bound: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of t ∈ [0, 1] with density ∝ ``weight(t)`` (``weight <= bound``)."""
    out: list[np.ndarray] = []
    have = 0
    while have < n:
        m = max(64, 2 * (n - have))
        t = rng.random(m)
        keep = rng.random(m) * bound < weight(t)
        out.append(t[keep])
        have += int(keep.sum())
    return np.concatenate(out)[:n]


def _point_in_polygon(q: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """(m,) bool: even-odd ray casting of 2-D points ``q`` (m, 2) in the closed polygon (k, 2)."""
    a, b = poly, np.roll(poly, -1, axis=0)
    x, y = q[:, :1], q[:, 1:]
    cond = (a[None, :, 1] > y) != (b[None, :, 1] > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        xc = a[None, :, 0] + (y - a[None, :, 1]) * (b[None, :, 0] - a[None, :, 0]) / (b[None, :, 1] - a[None, :, 1])
    return (cond & (x < xc)).sum(1) % 2 == 1


class Ellipsoid(Primitive):
    """x²/a² + y²/b² + z²/c² = 1. Exact area-uniform sampling by rejection from the sphere."""

    def __init__(self, a: float, b: float, c: float) -> None:
        self.ax = np.array([a, b, c], float)
        # Area = abc ∫ |u / ax| dΩ: Gauss-Legendre in cos θ times a uniform φ grid.
        x, w = np.polynomial.legendre.leggauss(64)
        phi = (np.arange(128) + 0.5) * _TWO_PI / 128
        st = np.sqrt(1 - x ** 2)
        u = np.stack([st[:, None] * np.cos(phi), st[:, None] * np.sin(phi), np.broadcast_to(x[:, None], (64, 128))], -1)
        f = np.linalg.norm(u / self.ax, axis=-1)
        self._area = float(np.prod(self.ax) * (w[:, None] * f).sum() * _TWO_PI / 128)

    def area(self) -> float:
        return self._area

    def sample(self, n, rng):
        out: list[np.ndarray] = []
        have = 0
        while have < n:
            u = rng.standard_normal((max(64, 2 * (n - have)), 3))
            u /= np.linalg.norm(u, axis=1, keepdims=True)
            # Area element ratio ∝ |u / ax|, maximal (1/min ax) at the shortest axis.
            keep = rng.random(len(u)) < np.linalg.norm(u / self.ax, axis=1) * self.ax.min()
            out.append(u[keep])
            have += int(keep.sum())
        u = np.concatenate(out)[:n]
        g = u / self.ax
        return u * self.ax, g / np.linalg.norm(g, axis=1, keepdims=True), np.zeros(n, np.int64)

    def inside(self, p):
        return ((p / self.ax) ** 2).sum(1) < 1 - 1e-9


class ConvexPolyhedron(Primitive):
    """The convex hull of ``vertices`` (k, 3); sub-index = hull facet (triangle) index."""

    def __init__(self, vertices: np.ndarray) -> None:
        v = np.asarray(vertices, float)
        hull = ConvexHull(v)
        self.tri = v[hull.simplices]  # (T, 3, 3)
        self.eq = hull.equations  # outward normal · x + offset <= 0 inside
        # Order each triangle's normal from the hull's (outward) plane equation.
        self.normals = self.eq[:, :3] / np.linalg.norm(self.eq[:, :3], axis=1, keepdims=True)
        e1, e2 = self.tri[:, 1] - self.tri[:, 0], self.tri[:, 2] - self.tri[:, 0]
        self.tri_area = 0.5 * np.linalg.norm(np.cross(e1, e2), axis=1)
        self.scale = float(np.ptp(v, axis=0).max())

    def area(self) -> float:
        return float(self.tri_area.sum())

    def sample(self, n, rng):
        f = rng.choice(len(self.tri), size=n, p=self.tri_area / self.tri_area.sum())
        r1, r2 = np.sqrt(rng.random(n)), rng.random(n)
        t = self.tri[f]
        p = (1 - r1)[:, None] * t[:, 0] + (r1 * (1 - r2))[:, None] * t[:, 1] + (r1 * r2)[:, None] * t[:, 2]
        return p, self.normals[f].copy(), f

    def inside(self, p):
        return (p @ self.eq[:, :3].T + self.eq[:, 3]).max(1) < -1e-9 * self.scale


# ---------------------------------------------------------------- primitive helpers
def cylinder(r: float, h: float) -> Revolution:
    """Closed cylinder on the z axis, z ∈ [-h/2, h/2]; subs: 0 bottom, 1 side, 2 top."""
    return frustum(r, r, h)


def frustum(r0: float, r1: float, h: float, bottom: bool = True, top: bool = True) -> Revolution:
    """Truncated cone, radius r0 at z = -h/2 and r1 at z = h/2; subs 0 bottom, 1 side, 2 top
    (a missing cap leaves an open surface; r1 = 0 is a cone)."""
    segs = [Line(0, -h / 2, r0, -h / 2) if bottom else Line(r0, -h / 2, r0, -h / 2),
            Line(r0, -h / 2, r1, h / 2),
            Line(r1, h / 2, 0, h / 2) if top else Line(r1, h / 2, r1, h / 2)]
    return Revolution(segs, closed=bottom and top)


def spheroid(a: float, c: float, th0: float = -math.pi / 2, th1: float = math.pi / 2, closed: bool = True) -> Revolution:
    """Spheroid with equatorial radius ``a`` and polar semi-axis ``c`` (latitudes th0..th1)."""
    return Revolution([Arc(0, 0, a, c, th0, th1)], closed=closed)


def capsule(r: float, h: float) -> Revolution:
    """Cylinder of length h with hemispherical ends; subs: 0 bottom cap, 1 side, 2 top cap."""
    return Revolution([Arc(0, -h / 2, r, r, -math.pi / 2, 0), Line(r, -h / 2, r, h / 2),
                       Arc(0, h / 2, r, r, 0, math.pi / 2)])


def torus(R: float, a: float, phi0: float = 0.0, phi1: float = _TWO_PI) -> Revolution:
    """Torus about z (major radius R, tube radius a); a φ range gives a partial torus."""
    return Revolution([Arc(R, 0, a, a, -math.pi, math.pi)], closed=True, phi0=phi0, phi1=phi1)


def box(sx: float, sy: float, sz: float) -> ConvexPolyhedron:
    """Axis-aligned box centred at the origin."""
    c = np.array([[i, j, k] for i in (-.5, .5) for j in (-.5, .5) for k in (-.5, .5)])
    return ConvexPolyhedron(c * [sx, sy, sz])


def prism(polygon: np.ndarray, h: float) -> ConvexPolyhedron:
    """Right prism of a convex 2-D polygon (k, 2) extruded over z ∈ [-h/2, h/2]."""
    p = np.asarray(polygon, float)
    return ConvexPolyhedron(np.r_[np.c_[p, np.full(len(p), -h / 2)], np.c_[p, np.full(len(p), h / 2)]])


def regular_polygon(k: int, r: float, start: float = 0.0) -> np.ndarray:
    a = start + np.arange(k) * _TWO_PI / k
    return r * np.stack([np.cos(a), np.sin(a)], 1)


# ============================================================================ composites
@dataclass
class Part:
    """A primitive placed by ``x_world = R x_local + t``; ``label`` is a local part index,
    a per-sub-index list, or ``f(p_local, n_local, sub) -> (n,) int``."""

    prim: Primitive
    label: int | Sequence[int] | Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    R: np.ndarray = dataclasses.field(default_factory=lambda: np.eye(3))
    t: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(3))

    def labels(self, p: np.ndarray, n: np.ndarray, sub: np.ndarray) -> np.ndarray:
        if callable(self.label):
            return np.asarray(self.label(p, n, sub), np.int64)
        if isinstance(self.label, (int, np.integer)):
            return np.full(len(p), int(self.label), np.int64)
        return np.asarray(self.label, np.int64)[sub]


def P(prim: Primitive, label: Any, R: np.ndarray | None = None, t: Sequence[float] = (0, 0, 0)) -> Part:
    return Part(prim, label, np.eye(3) if R is None else np.asarray(R, float), np.asarray(t, float))


def _by_normal_z(pos: int, neg: int, other: int, thr: float = 0.99) -> Callable:
    """Label faces by their local normal: +z -> ``pos``, -z -> ``neg``, else ``other``."""
    return lambda p, n, s: np.where(n[:, 2] > thr, pos, np.where(n[:, 2] < -thr, neg, other))


def _by_z(upper: int, lower: int) -> Callable:
    return lambda p, n, s: np.where(p[:, 2] >= 0, upper, lower)


def sample_parts(parts: Sequence[Part], n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` area-uniform points of the visible surface of ``parts`` with normals and labels.

    Points of one part that lie inside another closed part are hidden; the visible pool is
    oversampled and ``n`` points are drawn from it uniformly without replacement.
    """
    areas = np.array([p.prim.area() for p in parts])
    m = int(n * 1.3) + 32
    for _ in range(30):
        counts = rng.multinomial(m, areas / areas.sum())
        P_, N_, L_ = [], [], []
        for i, (part, k) in enumerate(zip(parts, counts)):
            if k == 0:
                continue
            p, nl, sub = part.prim.sample(int(k), rng)
            lab = part.labels(p, nl, sub)
            pw = p @ part.R.T + part.t
            keep = np.ones(len(pw), bool)
            for j, other in enumerate(parts):
                if j != i:
                    keep &= ~other.prim.inside((pw - other.t) @ other.R)
            P_.append(pw[keep]); N_.append((nl @ part.R.T)[keep]); L_.append(lab[keep])
        pts, nrm, lab = np.concatenate(P_), np.concatenate(N_), np.concatenate(L_)
        if len(pts) >= n:
            idx = rng.choice(len(pts), size=n, replace=False)
            return pts[idx], nrm[idx], lab[idx]
        m *= 2
    raise RuntimeError("sample_parts: the parts are (almost) entirely hidden inside each other")


# ---------------------------------------------------------------- smooth deformation
@dataclass
class Deformation:
    """F(x) = x + Σ_k a_k u_k sin(w_k·x + φ_k) with ``Σ_k |a_k| |w_k| = strength`` (< 1)."""

    a: np.ndarray  # (K,)
    u: np.ndarray  # (K, 3) unit
    w: np.ndarray  # (K, 3)
    phase: np.ndarray  # (K,)

    @staticmethod
    def random(strength: float, rng: np.random.Generator, modes: int = 3, freq: tuple[float, float] = (1.0, 3.0)) -> "Deformation":
        u = rng.standard_normal((modes, 3))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        wd = rng.standard_normal((modes, 3))
        wd /= np.linalg.norm(wd, axis=1, keepdims=True)
        wn = rng.uniform(*freq, modes)
        share = rng.dirichlet(np.ones(modes))
        return Deformation(strength * share / wn, u, wd * wn[:, None], rng.uniform(0, _TWO_PI, modes))

    @property
    def strength(self) -> float:
        return float((np.abs(self.a) * np.linalg.norm(self.w, axis=1)).sum())

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x + (self.a * np.sin(x @ self.w.T + self.phase)) @ self.u

    def jacobian(self, x: np.ndarray) -> np.ndarray:
        """(m, 3, 3) dF/dx."""
        c = self.a * np.cos(x @ self.w.T + self.phase)  # (m, K)
        return np.eye(3) + np.einsum("mk,ki,kj->mij", c, self.u, self.w)

    def apply(self, p: np.ndarray, n: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Deformed points and exact normals, and a keep mask that makes the result area-uniform."""
        J = self.jacobian(p)
        cof_n = np.linalg.solve(np.transpose(J, (0, 2, 1)), n[..., None])[..., 0]  # J^{-T} n
        stretch = np.abs(np.linalg.det(J)) * np.linalg.norm(cof_n, axis=1)
        # Singular values of J lie in [1 - s, 1 + s]; a surface patch stretches by <= (1 + s)².
        keep = rng.random(len(p)) * (1 + self.strength) ** 2 < stretch
        return self(p), cof_n / np.linalg.norm(cof_n, axis=1, keepdims=True), keep


# ============================================================================ the classes
def _legs(rng, xs: float, ys: float, h: float, th: float, label: int, round_: bool) -> list[Part]:
    out = []
    for sx in (-1, 1):
        for sy in (-1, 1):
            prim = cylinder(th / 2, h) if round_ else box(th, th, h)
            out.append(P(prim, label, None, (sx * xs, sy * ys, h / 2)))
    return out


def _airplane(rng):
    L, r = rng.uniform(3, 5), rng.uniform(0.2, 0.4)
    span, chord, wt = rng.uniform(2.5, 5), rng.uniform(0.5, 1.0), rng.uniform(0.04, 0.1)
    sweep = rng.uniform(0, 0.5)
    wing = prism(np.array([[chord / 2, 0], [-chord / 2, 0], [-chord / 2 - sweep, span / 2], [chord / 2 - sweep - 0.6 * chord, span / 2]]), wt)
    xw = rng.uniform(-0.3, 0.5)
    parts = [P(capsule(r, L), 0, TO_X),
             P(wing, 1, None, (xw, 0, 0)),
             P(wing, 1, rotation([1, 0, 0], math.pi), (xw, 0, 0)),  # mirrored to -y
             P(box(0.5, 0.04, rng.uniform(0.4, 0.9)), 2, None, (-L / 2, 0, r + 0.2)),
             P(box(0.4, rng.uniform(0.8, 1.6), 0.04), 2, None, (-L / 2, 0, 0))]
    er, el = rng.uniform(0.1, 0.2), rng.uniform(0.4, 0.8)
    for s in (-1, 1):
        parts.append(P(cylinder(er, el), 3, TO_X, (xw + 0.1, s * span * rng.uniform(0.18, 0.3), -wt / 2 - er + 0.02)))
    return parts


def _bed(rng):
    W, L, th, lh = rng.uniform(1.2, 2.0), rng.uniform(1.8, 2.4), rng.uniform(0.2, 0.45), rng.uniform(0.1, 0.35)
    hb = rng.uniform(0.4, 1.0)
    return [P(box(W, L, th), 0, None, (0, 0, lh + th / 2)),
            P(box(W, 0.08, lh + th + hb), 1, None, (0, -L / 2 - 0.04, (lh + th + hb) / 2)),
            *_legs(rng, W / 2 - 0.06, L / 2 - 0.06, lh + 0.02, 0.08, 2, False)]


def _bench(rng):
    L, D, h = rng.uniform(1.5, 3.0), rng.uniform(0.35, 0.6), rng.uniform(0.35, 0.5)
    bh = rng.uniform(0.25, 0.6)
    tilt = rng.uniform(0, 0.3)
    return [P(box(L, D, 0.06), 0, None, (0, 0, h)),
            P(box(L, 0.05, bh), 1, rotation([1, 0, 0], -tilt), (0, -D / 2, h + 0.05 + bh / 2)),
            *_legs(rng, L / 2 - 0.1, D / 2 - 0.05, h, 0.06, 2, bool(rng.random() < 0.5))]


def _bookshelf(rng):
    H, W, D = rng.uniform(1.0, 2.5), rng.uniform(0.6, 1.4), rng.uniform(0.25, 0.45)
    t = rng.uniform(0.03, 0.06)
    parts = [P(box(t, D, H), 0, None, (s * (W / 2 - t / 2), 0, H / 2)) for s in (-1, 1)]
    k = int(rng.integers(3, 7))
    for z in np.linspace(t / 2, H - t / 2, k):
        parts.append(P(box(W - 2 * t + 0.01, D, t), 1, None, (0, 0, z)))
    parts.append(P(box(W, 0.02, H), 2, None, (0, -D / 2 - 0.01, H / 2)))
    return parts


def _bottle(rng):
    r, h = rng.uniform(0.3, 0.6), rng.uniform(1.0, 2.2)
    rn, hs, hn = r * rng.uniform(0.25, 0.45), rng.uniform(0.15, 0.5), rng.uniform(0.2, 0.6)
    body = Revolution([Line(0, 0, r, 0), Line(r, 0, r, h), Line(r, h, rn, h + hs), Line(rn, h + hs, rn, h + hs + hn),
                       Line(rn, h + hs + hn, 0, h + hs + hn)])
    hc = rng.uniform(0.08, 0.2)
    return [P(body, [0, 0, 0, 1, 1]), P(cylinder(rn * 1.15, hc), 2, None, (0, 0, h + hs + hn + hc / 2 - 0.02))]


def _bowl(rng):
    R, d = rng.uniform(0.6, 1.2), rng.uniform(0.4, 1.0)
    rim = rng.uniform(0.0, 0.35)
    shell = Revolution([Arc(0, 0, R, R * d, -math.pi / 2, rim)], closed=False)
    rf, hf = R * rng.uniform(0.3, 0.55), rng.uniform(0.05, 0.15)
    z0 = -R * d * math.sqrt(max(0.0, 1 - (rf / R) ** 2))
    foot = Revolution([Line(0, z0 - hf, rf, z0 - hf), Line(rf, z0 - hf, rf * 0.95, z0 + 0.02)], closed=False)
    return [P(shell, 0), P(foot, 1)]


def _car(rng):
    L, W, H, r = rng.uniform(3.4, 4.6), rng.uniform(1.5, 1.9), rng.uniform(0.45, 0.8), rng.uniform(0.28, 0.4)
    cl, ch, cx = L * rng.uniform(0.35, 0.6), rng.uniform(0.35, 0.6), rng.uniform(-0.4, 0.2)
    top = cl * rng.uniform(0.5, 0.8)
    v = [[x, y, z] for y in (-W / 2 + 0.1, W / 2 - 0.1) for x, z in
         ((-cl / 2, 0), (cl / 2, 0), (-top / 2, ch), (top / 2, ch))]
    parts = [P(box(L, W, H), 0, None, (0, 0, r + H / 2)),
             P(ConvexPolyhedron(np.array(v)), 1, None, (cx, 0, r + H - 0.01))]
    for sx in (-1, 1):
        for sy in (-1, 1):
            parts.append(P(cylinder(r, 0.25), 2, TO_Y, (sx * (L / 2 - rng.uniform(0.5, 0.8)), sy * (W / 2 - 0.05), r)))
    return parts


def _chair(rng):
    W, D, h = rng.uniform(0.4, 0.65), rng.uniform(0.4, 0.65), rng.uniform(0.38, 0.55)
    bh, tilt, lt = rng.uniform(0.35, 0.9), rng.uniform(0, 0.3), rng.uniform(0.03, 0.06)
    parts = [P(box(W, D, 0.05), 0, None, (0, 0, h)),
             P(box(W, 0.05, bh), 1, rotation([1, 0, 0], -tilt), (0, -D / 2 + 0.02 - math.sin(tilt) * bh / 2, h + bh / 2)),
             *_legs(rng, W / 2 - lt, D / 2 - lt, h, lt, 2, bool(rng.random() < 0.4))]
    if rng.random() < 0.5:
        ah = rng.uniform(0.15, 0.3)
        for s in (-1, 1):
            parts.append(P(box(0.05, D * 0.9, 0.04), 3, None, (s * (W / 2 + 0.02), 0, h + ah)))
            parts.append(P(box(0.04, 0.04, ah), 3, None, (s * (W / 2 + 0.02), D * 0.3, h + ah / 2)))
    return parts


def _cone(rng):
    return [P(frustum(rng.uniform(0.4, 1.5), 0.0, rng.uniform(0.5, 2.5)), [1, 0, 0])]


def _goblet(rng):
    R, d, hs = rng.uniform(0.3, 0.6), rng.uniform(0.5, 1.4), rng.uniform(0.3, 0.9)
    hw = rng.uniform(0.0, 0.6) * R
    bowl = Revolution([Arc(0, hs + R * d, R, R * d, -math.pi / 2, 0), Line(R, hs + R * d, R, hs + R * d + hw)], closed=False)
    rf = rng.uniform(0.6, 1.0) * R
    return [P(bowl, 0), P(cylinder(0.04, hs + 0.05), 1, None, (0, 0, (hs + 0.05) / 2)),
            P(frustum(rf, 0.05, 0.06), 2, None, (0, 0, 0.03))]


def _cylinder(rng):
    return [P(cylinder(rng.uniform(0.3, 1.2), rng.uniform(0.3, 2.5)), [1, 0, 1])]


def _cuboid(rng):
    return [P(box(*rng.uniform(0.3, 2.0, 3)), _by_normal_z(1, 0, 0))]


def _dumbbell(rng):
    L, rb = rng.uniform(0.8, 2.0), rng.uniform(0.04, 0.1)
    kind = int(rng.integers(3))
    rw = rng.uniform(0.2, 0.5)
    parts = [P(cylinder(rb, L), 0, TO_X)]
    for s in (-1, 1):
        w = (spheroid(rw, rw) if kind == 0 else cylinder(rw, rng.uniform(0.15, 0.4)) if kind == 1
             else prism(regular_polygon(6, rw), rng.uniform(0.15, 0.4)))
        parts.append(P(w, 1, TO_X, (s * L / 2, 0, 0)))
    return parts


def _ellipsoid(rng):
    return [P(Ellipsoid(*rng.uniform(0.4, 1.5, 3)), _by_z(0, 1))]


def _guitar(rng):
    t, r1, r2 = rng.uniform(0.15, 0.35), rng.uniform(0.55, 0.8), rng.uniform(0.4, 0.65)
    gap = rng.uniform(0.6, 0.9) * (r1 + r2) * 0.7
    ln = rng.uniform(1.2, 2.0)
    return [P(cylinder(r1, t), 0, None, (0, 0, 0)), P(cylinder(r2, t), 0, None, (gap, 0, 0)),
            P(box(ln, 0.12, 0.06), 1, None, (gap + r2 + ln / 2 - 0.1, 0, 0)),
            P(box(0.35, 0.2, 0.06), 2, rotation([0, 1, 0], rng.uniform(0, 0.3)), (gap + r2 + ln + 0.1, 0, 0))]


def _hammer(rng):
    L, hl = rng.uniform(0.8, 1.6), rng.uniform(0.35, 0.8)
    hr = rng.uniform(0.06, 0.14)
    head = cylinder(hr, hl) if rng.random() < 0.5 else box(hl, 2 * hr, 2 * hr)
    return [P(cylinder(0.04, L), 0, None, (0, 0, L / 2)), P(head, 1, TO_X if isinstance(head, Revolution) else None, (0, 0, L))]


def _headphones(rng):
    R, rc = rng.uniform(0.55, 0.85), rng.uniform(0.15, 0.3)
    band = torus(R, rng.uniform(0.03, 0.07), 0.0, math.pi)
    return [P(band, 0, rotation([1, 0, 0], math.pi / 2)),
            *[P(cylinder(rc, rng.uniform(0.1, 0.2)), 1, TO_X, (s * R, 0, 0)) for s in (-1, 1)]]


# Local (x, y, z) of a prism -> world (y, z, x): triangle across y, apex up, ridge along x.
_ROOF = np.array([[0, 0, 1], [1, 0, 0], [0, 1, 0]], float)


def _house(rng):
    L, W, H, rh = rng.uniform(1, 2.5), rng.uniform(0.8, 1.8), rng.uniform(0.6, 1.5), rng.uniform(0.3, 1.0)
    roof = prism(np.array([[-W / 2 - 0.1, 0], [W / 2 + 0.1, 0], [0, rh]]), L + 0.2)
    cw = rng.uniform(0.12, 0.25)
    return [P(box(L, W, H), 0, None, (0, 0, H / 2)), P(roof, 1, _ROOF, (0, 0, H - 0.01)),
            P(box(cw, cw, rh + 0.3), 2, None, (L * rng.uniform(-0.35, 0.35), W * 0.25, H + rh / 2 + 0.1))]


def _knife(rng):
    Lb, w, t = rng.uniform(0.8, 1.8), rng.uniform(0.12, 0.3), rng.uniform(0.015, 0.04)
    tip = rng.uniform(0.0, 0.8) * w
    blade = ConvexPolyhedron(np.array([[0, -t, 0], [0, t, 0], [0, -t, w], [0, t, w], [Lb, 0, tip], [Lb * 0.8, 0, w]]))
    lh = rng.uniform(0.4, 0.8)
    handle = box(lh, 2.5 * t + 0.03, w * 0.7) if rng.random() < 0.5 else capsule(w * 0.35, lh)
    R = None if isinstance(handle, ConvexPolyhedron) else TO_X
    return [P(blade, 0), P(handle, 1, R, (-lh / 2 + 0.02, 0, w * 0.45))]


def _lamp(rng):
    rb, hb, hp = rng.uniform(0.2, 0.5), rng.uniform(0.04, 0.12), rng.uniform(0.8, 2.0)
    r0, r1, hs = rng.uniform(0.25, 0.6), rng.uniform(0.1, 0.35), rng.uniform(0.2, 0.6)
    base = cylinder(rb, hb) if rng.random() < 0.5 else frustum(rb, rb * 0.5, hb * 2)
    return [P(base, 0, None, (0, 0, hb / 2)), P(cylinder(0.03, hp), 1, None, (0, 0, hp / 2)),
            P(frustum(r0, r1, hs, bottom=False, top=False), 2, None, (0, 0, hp + hs / 2 - 0.1))]


def _laptop(rng):
    W, D, ang = rng.uniform(1.1, 1.6), rng.uniform(0.7, 1.1), rng.uniform(1.4, 2.3)
    Ds = D * rng.uniform(0.8, 1.0)
    # The base spans y ∈ [0, D] from the hinge; the screen opens by ``ang`` from the base.
    Rs = rotation([1, 0, 0], ang)
    c = Rs @ np.array([0, Ds / 2, 0])
    return [P(box(W, D, 0.05), 0, None, (0, D / 2, 0.025)), P(box(W, Ds, 0.03), 1, Rs, (0, c[1], 0.05 + c[2]))]


def _monitor(rng):
    W, H, hn = rng.uniform(1.0, 1.8), rng.uniform(0.55, 1.0), rng.uniform(0.2, 0.5)
    base = box(rng.uniform(0.3, 0.6), rng.uniform(0.2, 0.4), 0.04) if rng.random() < 0.5 else cylinder(rng.uniform(0.15, 0.3), 0.04)
    return [P(box(W, 0.06, H), 0, None, (0, 0, hn + H / 2)), P(box(0.08, 0.05, hn + 0.1), 1, None, (0, -0.05, (hn + 0.1) / 2)),
            P(base, 2, None, (0, -0.05, 0.02))]


def _mug(rng):
    r, h = rng.uniform(0.35, 0.65), rng.uniform(0.6, 1.5)
    Rh = rng.uniform(0.22, 0.4) * min(h, 1.0)
    handle = torus(Rh, rng.uniform(0.04, 0.08), -math.pi / 2 - 0.3, math.pi / 2 + 0.3)
    return [P(cylinder(r, h), 0), P(handle, 1, rotation([1, 0, 0], math.pi / 2), (r, 0, rng.uniform(-0.1, 0.1) * h))]


def _mushroom(rng):
    a, c, hs = rng.uniform(0.5, 1.2), rng.uniform(0.25, 0.9), rng.uniform(0.4, 1.2)
    rs = a * rng.uniform(0.15, 0.35)
    cap = Revolution([Line(0, 0, a, 0), Arc(0, 0, a, c, 0, math.pi / 2)])
    return [P(cap, 0, None, (0, 0, hs)), P(frustum(rs * 1.2, rs, hs + 0.05), 1, None, (0, 0, hs / 2))]


def _octahedron(rng):
    a, b, c = rng.uniform(0.4, 1.4, 3)
    v = np.array([[a, 0, 0], [-a, 0, 0], [0, b, 0], [0, -b, 0], [0, 0, c], [0, 0, -c]])
    return [P(ConvexPolyhedron(v), lambda p, n, s: np.where(n[:, 2] > 0, 0, 1))]


def _pencil(rng):
    L, r, lt = rng.uniform(1.5, 3.0), rng.uniform(0.08, 0.18), rng.uniform(0.2, 0.5)
    le = rng.uniform(0.1, 0.3)
    return [P(prism(regular_polygon(6, r), L), 0, TO_X),
            P(frustum(r * 0.87, 0.0, lt, top=False), 1, TO_X, (L / 2 + lt / 2 - 0.01, 0, 0)),
            P(cylinder(r * 0.8, le), 2, TO_X, (-L / 2 - le / 2 + 0.01, 0, 0))]


def _pyramid(rng):
    sx, sy, h = rng.uniform(0.5, 2.0), rng.uniform(0.5, 2.0), rng.uniform(0.4, 2.0)
    v = np.array([[-sx / 2, -sy / 2, 0], [sx / 2, -sy / 2, 0], [-sx / 2, sy / 2, 0], [sx / 2, sy / 2, 0], [0, 0, h]])
    return [P(ConvexPolyhedron(v), _by_normal_z(1, 0, 1))]


# Local (x, y, z) of a fin prism -> world (x, z, -y): radial, up, tangential thickness.
_FIN = np.array([[1, 0, 0], [0, 0, -1], [0, 1, 0]], float)


def _rocket(rng):
    r, L, hn = rng.uniform(0.15, 0.35), rng.uniform(1.5, 3.5), rng.uniform(0.3, 1.0)
    nose = spheroid(r, hn, 0.0, math.pi / 2, closed=False) if rng.random() < 0.5 else frustum(r, 0.0, hn, False, False)
    zn = L if isinstance(nose.segments[0], Arc) else L + hn / 2
    fh, fw = rng.uniform(0.3, 0.8), rng.uniform(0.3, 0.7)
    fin = prism(np.array([[0, 0], [fw, 0], [0, fh]]), 0.04)
    k = int(rng.integers(3, 5))
    parts = [P(cylinder(r, L), 0, None, (0, 0, L / 2)), P(nose, 1, None, (0, 0, zn))]
    for i in range(k):
        Rz = rotation([0, 0, 1], i * _TWO_PI / k)
        parts.append(P(fin, 2, Rz @ _FIN, Rz @ np.array([r - 0.02, 0, 0])))
    return parts


def _skateboard(rng):
    L, W = rng.uniform(1.6, 2.4), rng.uniform(0.4, 0.6)
    arc = np.linspace(-math.pi / 2, math.pi / 2, 9)
    ends = [np.stack([(L - W) / 2 + W / 2 * np.cos(arc), W / 2 * np.sin(arc)], 1)]
    ends.append(-ends[0])
    deck = prism(np.concatenate(ends), 0.04)
    h, wr = rng.uniform(0.12, 0.22), rng.uniform(0.06, 0.1)
    parts = [P(deck, 0, None, (0, 0, h + wr))]
    for sx in (-1, 1):
        x = sx * (L / 2 - W * rng.uniform(0.5, 0.9))
        parts.append(P(box(0.1, W * 0.8, h), 1, None, (x, 0, wr + h / 2)))
        for sy in (-1, 1):
            parts.append(P(cylinder(wr, 0.07), 2, TO_Y, (x, sy * (W * 0.4 + 0.03), wr)))
    return parts


def _snowman(rng):
    r = np.sort(rng.uniform(0.25, 0.8, 3))[::-1]
    z0 = r[0]
    z1 = z0 + (r[0] + r[1]) * rng.uniform(0.75, 0.95)
    z2 = z1 + (r[1] + r[2]) * rng.uniform(0.75, 0.95)
    return [P(spheroid(r[0], r[0] * rng.uniform(0.85, 1.1)), 0, None, (0, 0, z0)),
            P(spheroid(r[1], r[1]), 1, None, (0, 0, z1)), P(spheroid(r[2], r[2]), 2, None, (0, 0, z2))]


def _sofa(rng):
    L, D, h = rng.uniform(1.5, 3.0), rng.uniform(0.7, 1.0), rng.uniform(0.3, 0.5)
    bh, ah, aw = rng.uniform(0.3, 0.7), rng.uniform(0.1, 0.35), rng.uniform(0.1, 0.25)
    return [P(box(L, D, h), 0, None, (0, 0, h / 2)),
            P(box(L + 2 * aw, 0.2, h + bh), 1, None, (0, -D / 2 - 0.1, (h + bh) / 2)),
            *[P(box(aw, D, h + ah), 2, None, (s * (L / 2 + aw / 2), 0, (h + ah) / 2)) for s in (-1, 1)]]


def _stool(rng):
    R, h, k = rng.uniform(0.2, 0.4), rng.uniform(0.45, 0.9), int(rng.integers(3, 5))
    splay = rng.uniform(0.0, 0.25)
    parts = [P(cylinder(R, 0.05), 0, None, (0, 0, h))]
    lr = 0.025
    for i in range(k):
        a = i * _TWO_PI / k
        top = np.array([0.7 * R * math.cos(a), 0.7 * R * math.sin(a), h])
        bot = np.array([(0.7 * R + splay * h) * math.cos(a), (0.7 * R + splay * h) * math.sin(a), 0])
        d = top - bot
        parts.append(P(cylinder(lr, np.linalg.norm(d)), 1, align_z(d), (top + bot) / 2))
    zr = h * rng.uniform(0.3, 0.5)
    parts.append(P(torus(0.7 * R + splay * (h - zr), 0.015), 2, None, (0, 0, zr)))
    return parts


def _table(rng):
    W, D, h = rng.uniform(0.8, 2.2), rng.uniform(0.6, 1.4), rng.uniform(0.5, 1.0)
    th, lt = rng.uniform(0.03, 0.1), rng.uniform(0.04, 0.1)
    if rng.random() < 0.3:
        top = cylinder(W / 2, th)
        xs = ys = W / 2 * 0.6
    else:
        top = box(W, D, th)
        xs, ys = W / 2 - lt, D / 2 - lt
    parts = [P(top, 0, None, (0, 0, h)), *_legs(rng, xs, ys, h, lt, 1, bool(rng.random() < 0.4))]
    if rng.random() < 0.6:
        zs = h * rng.uniform(0.15, 0.5)
        parts += [P(box(2 * xs, 0.03, 0.03), 2, None, (0, s * ys, zs)) for s in (-1, 1)]
        parts += [P(box(0.03, 2 * ys, 0.03), 2, None, (s * xs, 0, zs)) for s in (-1, 1)]
    return parts


def _torus(rng):
    R = rng.uniform(0.6, 1.0)
    a = R * rng.uniform(0.15, 0.6)
    return [P(torus(R, a), lambda p, n, s, R=R: np.where(np.hypot(p[:, 0], p[:, 1]) < R, 0, 1))]


def _tree(rng):
    ht, rt = rng.uniform(0.3, 0.9), rng.uniform(0.06, 0.15)
    hc, rc = rng.uniform(0.8, 2.0), rng.uniform(0.4, 0.9)
    crown = frustum(rc, 0.0, hc) if rng.random() < 0.5 else spheroid(rc, hc / 2)
    zc = ht + hc / 2 - 0.05
    return [P(crown, 0, None, (0, 0, zc)), P(cylinder(rt, ht + 0.1), 1, None, (0, 0, (ht + 0.1) / 2))]


def _umbrella(rng):
    R, c, L = rng.uniform(0.7, 1.2), rng.uniform(0.25, 0.7), rng.uniform(1.0, 1.8)
    canopy = Revolution([Arc(0, 0, R, c, rng.uniform(0.0, 0.3), math.pi / 2)], closed=False)
    hr = rng.uniform(0.08, 0.16)
    hook = torus(hr, 0.025, math.pi, _TWO_PI)
    return [P(canopy, 0, None, (0, 0, L)), P(cylinder(0.02, L + c), 1, None, (0, 0, (L + c) / 2)),
            P(hook, 2, rotation([1, 0, 0], math.pi / 2), (hr, 0, 0))]


def _vase(rng):
    h, r0 = rng.uniform(0.8, 2.0), rng.uniform(0.25, 0.5)
    amps = rng.uniform(-0.35, 0.35, 3) * np.array([1, 0.5, 0.25])
    g = Graph(0, h, r0, amps, rng.uniform(0, math.pi, 3))
    rtop = float(g.eval(np.array([1.0]))[0][0])
    rbot = float(g.eval(np.array([0.0]))[0][0])
    body = Revolution([Line(0, 0, rbot, 0), g], closed=False)
    return [P(body, 0), P(torus(rtop, rng.uniform(0.02, 0.06) * (1 + r0)), 1, None, (0, 0, h))]


def _capsule(rng):
    return [P(capsule(rng.uniform(0.2, 0.8), rng.uniform(0.1, 2.5)), [1, 0, 1])]


def _tri_prism(rng):
    a = rng.uniform(0.5, 1.6)
    tri = np.array([[-a / 2, 0], [a / 2, 0], [rng.uniform(-0.4, 0.4) * a, rng.uniform(0.4, 1.5)]])
    return [P(prism(tri, rng.uniform(0.4, 2.5)), _by_normal_z(0, 0, 1))]


def _bucket(rng):
    r0, h = rng.uniform(0.3, 0.7), rng.uniform(0.5, 1.3)
    r1 = r0 * rng.uniform(1.05, 1.6)
    return [P(frustum(r0, r1, h, top=False), [1, 0, 0]), P(torus(r1, rng.uniform(0.02, 0.05)), 2, None, (0, 0, h / 2))]


#: (name, part names, builder) of the 40 classes, in label order.
CLASSES: tuple[tuple[str, tuple[str, ...], Callable[[np.random.Generator], list[Part]]], ...] = (
    ("airplane", ("body", "wing", "tail", "engine"), _airplane),
    ("bed", ("mattress", "headboard", "leg"), _bed),
    ("bench", ("seat", "back", "leg"), _bench),
    ("bookshelf", ("side", "shelf", "back"), _bookshelf),
    ("bottle", ("body", "neck", "cap"), _bottle),
    ("bowl", ("bowl", "foot"), _bowl),
    ("bucket", ("wall", "bottom", "rim"), _bucket),
    ("capsule", ("body", "end"), _capsule),
    ("car", ("body", "cabin", "wheel"), _car),
    ("chair", ("seat", "back", "leg", "arm"), _chair),
    ("cone", ("side", "base"), _cone),
    ("cuboid", ("side", "lid"), _cuboid),
    ("cylinder", ("side", "cap"), _cylinder),
    ("dumbbell", ("bar", "weight"), _dumbbell),
    ("ellipsoid", ("upper", "lower"), _ellipsoid),
    ("goblet", ("bowl", "stem", "foot"), _goblet),
    ("guitar", ("body", "neck", "head"), _guitar),
    ("hammer", ("handle", "head"), _hammer),
    ("headphones", ("band", "cup"), _headphones),
    ("house", ("wall", "roof", "chimney"), _house),
    ("knife", ("blade", "handle"), _knife),
    ("lamp", ("base", "pole", "shade"), _lamp),
    ("laptop", ("base", "screen"), _laptop),
    ("monitor", ("screen", "neck", "base"), _monitor),
    ("mug", ("body", "handle"), _mug),
    ("mushroom", ("cap", "stem"), _mushroom),
    ("octahedron", ("upper", "lower"), _octahedron),
    ("pencil", ("body", "tip", "eraser"), _pencil),
    ("prism", ("end", "side"), _tri_prism),
    ("pyramid", ("base", "face"), _pyramid),
    ("rocket", ("body", "nose", "fin"), _rocket),
    ("skateboard", ("deck", "truck", "wheel"), _skateboard),
    ("snowman", ("base", "middle", "head"), _snowman),
    ("sofa", ("seat", "back", "arm"), _sofa),
    ("stool", ("seat", "leg", "ring"), _stool),
    ("table", ("top", "leg", "stretcher"), _table),
    ("torus", ("inner", "outer"), _torus),
    ("tree", ("crown", "trunk"), _tree),
    ("umbrella", ("canopy", "pole", "handle"), _umbrella),
    ("vase", ("body", "lip"), _vase),
)
CLASS_NAMES: tuple[str, ...] = tuple(c[0] for c in CLASSES)


def class_parts(classes: Sequence[str] | None = None) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """Global part names (``"<class>/<part>"``) and each class's contiguous block of part ids."""
    names, blocks = [], []
    for c in _resolve_classes(classes):
        parts = CLASSES[CLASS_NAMES.index(c)][1]
        blocks.append(tuple(range(len(names), len(names) + len(parts))))
        names.extend(f"{c}/{p}" for p in parts)
    return tuple(names), tuple(blocks)


def _resolve_classes(classes: Sequence[str] | None) -> tuple[str, ...]:
    if classes is None:
        return CLASS_NAMES
    if isinstance(classes, str):
        raise ValueError(f"classes: expected a list of class names, got the string {classes!r}")
    out = tuple(classes)
    unknown = [c for c in out if c not in CLASS_NAMES]
    if unknown or not out or len(set(out)) != len(out):
        raise ValueError(f"classes: expected distinct names from {list(CLASS_NAMES)}, got {list(out)}")
    return out


def generate_shape(name: str, num_points: int, rng: np.random.Generator, deform: float = 0.05,
                   noise_std: float = 0.0, up_axis: str = "y") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One shape of class ``name``: points (n, 3), unit normals (n, 3), local part index (n,).

    Centred on the centroid and scaled to unit max radius; see the module docstring.
    """
    if name not in CLASS_NAMES:
        raise ValueError(f"name: expected a class from {list(CLASS_NAMES)}, got {name!r}")
    if isinstance(num_points, bool) or not isinstance(num_points, (int, np.integer)) or num_points < 1:
        raise ValueError(f"num_points: expected an integer >= 1, got {num_points!r}")
    if not (isinstance(deform, (int, float)) and 0 <= deform < 0.5):
        raise ValueError(f"deform: expected a number in [0, 0.5), got {deform!r}")
    if not (isinstance(noise_std, (int, float)) and 0 <= noise_std < math.inf):
        raise ValueError(f"noise_std: expected a finite number >= 0, got {noise_std!r}")
    if up_axis not in ("y", "z"):
        raise ValueError(f"up_axis: expected 'y' or 'z', got {up_axis!r}")
    parts = CLASSES[CLASS_NAMES.index(name)][2](rng)
    n = int(num_points)
    m = n
    for _ in range(20):
        # Oversample so that the deformation's rejection step still leaves n points.
        pool = m + (int(m * 2 * deform * (2 + deform)) + 16 if deform > 0 else 0)
        p, nrm, lab = sample_parts(parts, pool, rng)
        # Normalise before deforming so the deformation strength is relative to the shape size.
        c = p.mean(0)
        s = np.linalg.norm(p - c, axis=1).max()
        p = (p - c) / s
        if deform > 0:
            p, nrm, keep = Deformation.random(deform, rng).apply(p, nrm, rng)
            p, nrm, lab = p[keep], nrm[keep], lab[keep]
        if len(p) >= n:
            break
        m *= 2
    else:  # pragma: no cover - the acceptance rate is >= 1 / (1 + deform)^2
        raise RuntimeError("generate_shape: deformation rejected too many points")
    idx = rng.choice(len(p), size=n, replace=False)
    p, nrm, lab = p[idx], nrm[idx], lab[idx]
    if noise_std > 0:
        p = p + noise_std * rng.standard_normal(p.shape)
    p = p - p.mean(0)
    p = p / np.linalg.norm(p, axis=1).max()
    if up_axis == "y":
        p, nrm = p @ UP_Y.T, nrm @ UP_Y.T
    return p.astype(np.float32), nrm.astype(np.float32), lab.astype(np.int64)


# ============================================================================ data sets
@dataclass(frozen=True)
class ShapeParams:
    """Parameters of a procedural shape data set (all enter the cache key).

    ``classes``: class names (None = all 40, in :data:`CLASS_NAMES` order; labels index this
    list). ``per_class``: shapes per class in (train, val, test). ``num_points``: points per
    shape (ModelNet40 runs use 1024, ShapeNetPart 2500). ``deform``: bound on ``|J - I|`` of
    the smooth deformation. ``noise_std``: Gaussian position noise after normalisation.
    """

    classes: tuple[str, ...] | None = None
    per_class: tuple[int, int, int] = (40, 5, 10)
    num_points: int = 1024
    deform: float = 0.05
    noise_std: float = 0.0
    up_axis: str = "y"

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", None if self.classes is None else _resolve_classes(self.classes))
        try:
            pc = tuple(int(v) for v in self.per_class)
            ok = len(pc) == 3 and all(v >= 0 and float(v) == float(o) for v, o in zip(pc, self.per_class))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"per_class: expected three non-negative integers (train, val, test), got {self.per_class!r}")
        object.__setattr__(self, "per_class", pc)
        if isinstance(self.num_points, bool) or not isinstance(self.num_points, (int, np.integer)) or self.num_points < 1:
            raise ValueError(f"num_points: expected an integer >= 1, got {self.num_points!r}")
        if isinstance(self.deform, bool) or not isinstance(self.deform, (int, float)) or not 0 <= self.deform < 0.5:
            raise ValueError(f"deform: expected a number in [0, 0.5), got {self.deform!r}")
        if (isinstance(self.noise_std, bool) or not isinstance(self.noise_std, (int, float))
                or not 0 <= self.noise_std < math.inf):
            raise ValueError(f"noise_std: expected a finite number >= 0, got {self.noise_std!r}")
        if self.up_axis not in ("y", "z"):
            raise ValueError(f"up_axis: expected 'y' or 'z', got {self.up_axis!r}")

    @property
    def class_names(self) -> tuple[str, ...]:
        return _resolve_classes(self.classes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["classes"] = list(self.class_names)
        d["per_class"] = list(self.per_class)
        return d

    def replace(self, **changes: Any) -> "ShapeParams":
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown ShapeParams field; valid: {[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)


#: ``tiny``: unit tests. ``small``: CPU demo. ``modelnet40``: 40 classes, 1024 points, about
#: ModelNet40's size per class (9,843 / 2,468 shapes → ~246 train / ~62 test per class, val
#: carved out of train). ``shapenetpart``: the 16 composite classes closest to ShapeNetPart's
#: categories, 2,500 points, its 12,137 / 1,870 / 2,874 split spread over the classes.
SHAPENETPART_LIKE = ("airplane", "bottle", "bowl", "car", "chair", "guitar", "headphones", "knife", "lamp", "laptop",
                     "mug", "rocket", "skateboard", "table", "umbrella", "vase")
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(classes=None, per_class=(2, 1, 1), num_points=256),
    "small": dict(classes=None, per_class=(20, 4, 6), num_points=512),
    "modelnet40": dict(classes=None, per_class=(221, 25, 62), num_points=1024),
    "shapenetpart": dict(classes=SHAPENETPART_LIKE, per_class=(759, 117, 180), num_points=2500),
}


def resolve_params(preset_or_params: str | ShapeParams | Mapping[str, Any]) -> ShapeParams:
    """Accept a preset name, a :class:`ShapeParams`, or a mapping of field values."""
    if isinstance(preset_or_params, ShapeParams):
        return preset_or_params
    if isinstance(preset_or_params, str):
        if preset_or_params not in PRESETS:
            raise ValueError(f"preset: unknown shape preset {preset_or_params!r}; valid presets: {sorted(PRESETS)}")
        return ShapeParams(**PRESETS[preset_or_params])
    if isinstance(preset_or_params, Mapping):
        return ShapeParams().replace(**dict(preset_or_params))
    raise ValueError(f"preset_or_params: expected a preset name, ShapeParams or mapping, got {type(preset_or_params).__name__}")


def _seed_check(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    return int(seed)


def generate_shapes(params: str | ShapeParams | Mapping[str, Any], split: str, seed: int = 0) -> ShapeCloudSet:
    """The ``split`` shapes (class-major order), uncached. Shape ``i`` of class ``c`` is drawn
    from its own stream ``(seed, split, class name, i)``, so it does not depend on other classes."""
    params = resolve_params(params)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    seed = _seed_check(seed)
    names = params.class_names
    part_names, blocks = class_parts(names)
    count = params.per_class[SPLITS.index(split)]
    clouds = []
    for c, name in enumerate(names):
        # A stable integer per class name (independent of the class list and of hash seeds).
        cid = int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little")
        for i in range(count):
            rng = np.random.default_rng([seed, SPLITS.index(split), cid, i])
            p, n, lab = generate_shape(name, params.num_points, rng, params.deform, params.noise_std, params.up_axis)
            clouds.append(ShapeCloud(p, n, c, np.asarray(blocks[c], np.int64)[lab], f"{name}_{split}_{i:04d}"))
    return ShapeCloudSet(clouds, names, part_names, blocks, {"source": "procedural", "split": split})


def load_shapes_dataset(
    preset: str | ShapeParams | Mapping[str, Any],
    split: str,
    cache_dir: str | Path | None = None,
    seed: int = 0,
) -> ShapeCloudSet:
    """:func:`generate_shapes`, cached under ``<cache_dir>/shapes`` keyed by every parameter,
    the seed, the split and :data:`GENERATOR_VERSION` (stale or corrupted files are rebuilt)."""
    params = resolve_params(preset)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    seed = _seed_check(seed)
    key = {"generator": "pointformers.shapes", "version": GENERATOR_VERSION, "params": params.to_dict(),
           "seed": seed, "split": split}
    name = preset if isinstance(preset, str) else "custom"
    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "shapes"

    def build() -> dict[str, np.ndarray]:
        return pack_clouds(generate_shapes(params, split, seed))

    arrays = cached_arrays(root, f"{name}-{split}", key, build)
    try:
        return unpack_clouds(arrays)
    except (KeyError, ValueError, IndexError):
        arrays = build()
        save_arrays(cache_path(root, f"{name}-{split}", key), key, arrays)
        return unpack_clouds(arrays)


__all__ = [
    "CLASSES", "CLASS_NAMES", "GENERATOR_VERSION", "PRESETS", "SHAPENETPART_LIKE", "SPLITS", "ConvexPolyhedron",
    "Deformation", "Ellipsoid", "Part", "Primitive", "Revolution", "ShapeParams", "class_parts", "generate_shape",
    "generate_shapes", "load_shapes_dataset", "resolve_params", "sample_parts",
]
