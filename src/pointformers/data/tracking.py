"""A TrackML-like pixel-detector simulation for HEPT's Tracking-6k / Tracking-60k tasks.

What is simulated (see ``specs/synthetic-data.md`` §1):

* Pile-up: one triggered collision plus ``Poisson(mu)`` pile-up vertices (same physics), z ~ N(0, 55 mm), transverse ~ N(0, 0.015 mm);
  each gives ``Poisson(particles_per_vertex)`` charged primaries, flat in |η| < 4 and φ,
  charge ±1, with a soft pT spectrum (a Beta-prime / Tsallis-like law
  f(pT) ∝ pT·(1 + pT/p0)^-n: mean ≈ 0.55 GeV, ≈ 16% above 0.9 GeV, power-law tail).
* Transport: exact helices in a 2 T solenoid (R = pT / (0.3 B)), traced from surface to
  surface. At each step the next crossing among all detector surfaces is found in closed
  form (cylinder: a quadratic in tan(ψ/2), numerically stable for straight tracks; disk: z
  is linear in the turning angle ψ); only outgoing cylinder crossings count and each
  surface is crossed at most once. A particle stops when it leaves the pixel envelope
  (r > 200 mm or |z| > 1550 mm) or has turned by ``max_turns`` full turns (a stand-in for
  the energy loss that ends real loopers). Multiple scattering, when on, kicks the
  direction at every crossed surface by two Gaussian angles of RMS 13.6 MeV / p · sqrt(x/X0)
  (x/X0 = 2 %), so a track is a chain of helices. The loop runs over transport steps (at
  most one per surface), each vectorised over all particles and surfaces.
* Detector: pixel barrel (volume 8, layers 2/4/6/8) at r = 32, 72, 116, 172 mm, |z| < 491;
  7 disks per side at |z| = 600 … 1500 mm, 30 < r < 175 mm (volume 7 for z < 0 and 9 for
  z > 0, layers 2 … 14 in order of increasing z, as TrackML numbers them). Surfaces are
  ideal cylinders/planes segmented into flat-module frames (``module_id``) for the
  cluster-shape features and for ``detectors.csv``.
* Measurement: 98 % hit efficiency, 0.05 mm Gaussian resolution along both surface
  directions (hits stay exactly on their cylinder / disk plane), noise hits (particle id 0)
  making ``noise_fraction`` of all hits, uniform over the sensitive area.
* Cluster shape (TrackML "cell features"): a straight segment through a 150 µm sensor along
  the true local direction is digitised on a 50 × 56.25 µm pixel grid with a random offset
  and diffusion jitter, giving the cluster extents ``n_u, n_v`` (pixels). As TrackML's
  preprocessing does, ``lx = n_u·pitch_u``, ``ly = n_v·pitch_v``, ``lz = 2·module_t``
  (= 0.30 mm, TrackML's ``module_t`` being 0.15 mm for every pixel module);
  ``leta``/``lphi`` are the pseudorapidity/azimuth of (lx, ly, lz) in the module frame and
  ``geta``/``gphi`` of the same vector rotated to global coordinates (:func:`cluster_features`).
  ``charge_frac`` is, as in the HEPT/Exa.TrkX preprocessing, the *mean cell value* of the
  cluster, Σ value / number of cells, where a TrackML cell's ``value`` is the geometric path
  length [mm] of the track in that pixel: here the path length through the sensor
  (``thickness / |cos α|``, α the angle to the module normal, capped with the extents)
  divided by ``n_u + n_v − 1``, the number of pixels a straight segment spanning
  ``n_u × n_v`` pixels crosses. It is deterministic given the extents and the direction
  (TrackML's digitisation has no charge fluctuations). Noise hits get the same digitisation
  of a random direction. The writer in :mod:`pointformers.data.trackml` turns these into
  ``n_u + n_v − 1`` cells of value ``charge_frac`` each, which the reader maps back exactly.
* Truth weights (TrackML-like, simplified; the official table is not reproduced): hits of
  particles with fewer than 4 hits and noise hits weigh 0; otherwise
  w = w_pT · w_order with w_pT = 0.2 below 0.5 GeV rising linearly to 1 at 1 GeV, and
  w_order = 2 for the first and last hit of the track, 1 in between; normalised to sum to 1
  over the event; in a φ-sector cloud, hits of particles the sector does not own weigh 0 and
  the rest are renormalised to sum to 1 over the cloud (:func:`split_sectors`).

Public API: :class:`TrackingParams`, :data:`PRESETS`, :func:`preset_params`,
:func:`generate_event`, :func:`simulate_event` (hand-made particles), :func:`split_sectors`
(with :func:`sector_slope`, :func:`sector_wedges`), :func:`generate_clouds`, :func:`load_tracking_dataset`; geometry helpers
:data:`GEOMETRY`, :func:`module_table`, :func:`module_axes`, :func:`cluster_features`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .cache import (cache_path, cached_arrays, default_cache_dir, finite_param, param_error, params_from_preset,
                    resolve_generator_params, save_arrays)
from .event import CLUSTER_FEATURES, TrackingEvent, empty_event, pack_events, unpack_events

#: Bump when the generator's output for given parameters changes (invalidates caches).
GENERATOR_VERSION = 2

SPLITS = ("train", "val", "test")

#: Default extended-wedge options of :func:`split_sectors` / :class:`TrackingParams`: the HEPT
#: authors' ``PointCloudBuilder`` class defaults (``sector_ds=1.1, sector_di=1e-4``), with which
#: their 10-sector Tracking-6k clouds were cut; their checked-in ``build_point_clouds.py`` passes
#: ``sector_ds=1.3, sector_di=0`` for whole events (one sector, where they have no effect).
SECTOR_DS = 1.1
SECTOR_DI = 1e-4
#: Choices of the plain wedge's slope (see :func:`split_sectors`).
SECTOR_SLOPES = ("auto", "arctan", "tan")


# ============================================================================ geometry
@dataclass(frozen=True)
class PixelGeometry:
    """The TrackML pixel detector as simulated here (lengths in mm)."""

    barrel_radii: tuple[float, ...] = (32.0, 72.0, 116.0, 172.0)
    barrel_half_length: float = 491.0
    barrel_layer_ids: tuple[int, ...] = (2, 4, 6, 8)
    disk_z: tuple[float, ...] = (600.0, 700.0, 820.0, 960.0, 1100.0, 1300.0, 1500.0)
    disk_rmin: float = 30.0
    disk_rmax: float = 175.0
    thickness: float = 0.15  # silicon depth the simulated clusters cross
    module_t: float = 0.15  # TrackML detectors.csv ``module_t`` (every pixel module); lz = 2·module_t
    pitch_u: float = 0.05
    pitch_v: float = 0.05625
    envelope_r: float = 200.0  # leaving this transverse radius ends the track
    envelope_z: float = 1550.0
    barrel_module_width: float = 16.0  # target rφ width; the count per ring is rounded
    barrel_n_z: int = 14
    disk_ring_edges: tuple[float, ...] = (30.0, 66.25, 102.5, 138.75, 175.0)
    disk_module_width: float = 16.0
    max_cluster_pixels: int = 64  # cap on the cluster extent along u and v


GEOMETRY = PixelGeometry()


@dataclass(frozen=True)
class Surfaces:
    """Flat table of the ``S`` sensitive surfaces (4 cylinders, then 14 disks by z)."""

    is_disk: np.ndarray  # (S,) bool
    value: np.ndarray  # (S,) cylinder radius or signed disk z [mm]
    volume_id: np.ndarray  # (S,) int64
    layer_id: np.ndarray  # (S,) int64


def detector_surfaces(geo: PixelGeometry = GEOMETRY) -> Surfaces:
    """The sensitive surfaces of ``geo`` with their TrackML volume/layer ids."""
    nb = len(geo.barrel_radii)
    disk_z = np.asarray(geo.disk_z, float)
    # Layers 2, 4, ... in order of increasing z, separately for each end cap.
    neg, pos = -disk_z[::-1], disk_z
    layer_ids = 2 * np.arange(1, len(disk_z) + 1)
    return Surfaces(
        is_disk=np.r_[np.zeros(nb, bool), np.ones(2 * len(disk_z), bool)],
        value=np.r_[np.asarray(geo.barrel_radii, float), neg, pos],
        volume_id=np.r_[np.full(nb, 8), np.full(len(disk_z), 7), np.full(len(disk_z), 9)].astype(np.int64),
        layer_id=np.r_[np.asarray(geo.barrel_layer_ids), layer_ids, layer_ids].astype(np.int64),
    )


def _barrel_nphi(radius: float, geo: PixelGeometry) -> int:
    return max(8, int(round(2 * math.pi * radius / geo.barrel_module_width)))


def _disk_ring_nphi(geo: PixelGeometry) -> np.ndarray:
    edges = np.asarray(geo.disk_ring_edges, float)
    mid = 0.5 * (edges[1:] + edges[:-1])
    return np.maximum(8, np.round(2 * np.pi * mid / geo.disk_module_width)).astype(np.int64)


def module_axes(is_disk: np.ndarray, phi_c: np.ndarray) -> np.ndarray:
    """Module frames ``(n, 3, 3)``: columns are the local u, v, w axes in global coordinates.

    Barrel: u along φ, v along z, w radial (outward). Disk: u radial, v along φ, w = +z.
    (TrackML's ``rot_xu … rot_zw`` are the entries of this matrix, row = global axis.)
    """
    c, s = np.cos(phi_c), np.sin(phi_c)
    zero, one = np.zeros_like(c), np.ones_like(c)
    barrel = np.stack([np.stack([-s, zero, c], -1), np.stack([c, zero, s], -1), np.stack([zero, one, zero], -1)], -2)
    disk = np.stack([np.stack([c, -s, zero], -1), np.stack([s, c, zero], -1), np.stack([zero, zero, one], -1)], -2)
    return np.where(np.asarray(is_disk)[..., None, None], disk, barrel)


def locate_modules(
    surface: np.ndarray, x: np.ndarray, y: np.ndarray, z: np.ndarray, geo: PixelGeometry = GEOMETRY
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Module of each hit on surface index ``surface`` ``(n,)``.

    Returns ``module_id (n,) int64``, module centre azimuth ``phi_c (n,)`` and module
    centre ``(n, 3)`` [mm].
    """
    surf = detector_surfaces(geo)
    n = len(x)
    module_id = np.zeros(n, np.int64)
    phi_c = np.zeros(n)
    centre = np.zeros((n, 3))
    phi = np.arctan2(y, x)
    r = np.hypot(x, y)
    ring_nphi = _disk_ring_nphi(geo)
    ring_offset = np.r_[0, np.cumsum(ring_nphi)[:-1]]
    edges = np.asarray(geo.disk_ring_edges, float)
    for k in range(len(surf.value)):  # ~18 surfaces
        m = surface == k
        if not m.any():
            continue
        if not surf.is_disk[k]:
            rho = surf.value[k]
            nphi = _barrel_nphi(rho, geo)
            dz = 2 * geo.barrel_half_length / geo.barrel_n_z
            iphi = np.clip(np.floor((phi[m] + np.pi) / (2 * np.pi) * nphi), 0, nphi - 1).astype(np.int64)
            iz = np.clip(np.floor((z[m] + geo.barrel_half_length) / dz), 0, geo.barrel_n_z - 1).astype(np.int64)
            module_id[m] = iz * nphi + iphi + 1
            pc = -np.pi + (iphi + 0.5) * 2 * np.pi / nphi
            phi_c[m] = pc
            centre[m] = np.stack([rho * np.cos(pc), rho * np.sin(pc), -geo.barrel_half_length + (iz + 0.5) * dz], 1)
        else:
            ring = np.clip(np.searchsorted(edges, r[m], side="right") - 1, 0, len(ring_nphi) - 1)
            nphi = ring_nphi[ring]
            iphi = np.clip(np.floor((phi[m] + np.pi) / (2 * np.pi) * nphi), 0, nphi - 1).astype(np.int64)
            module_id[m] = ring_offset[ring] + iphi + 1
            pc = -np.pi + (iphi + 0.5) * 2 * np.pi / nphi
            rmid = 0.5 * (edges[ring] + edges[ring + 1])
            phi_c[m] = pc
            centre[m] = np.stack([rmid * np.cos(pc), rmid * np.sin(pc), np.full(m.sum(), surf.value[k])], 1)
    return module_id, phi_c, centre


def module_table(geo: PixelGeometry = GEOMETRY) -> dict[str, np.ndarray]:
    """Every module of the detector, TrackML ``detectors.csv`` style.

    Returns arrays of shape ``(m,)`` — ``volume_id, layer_id, module_id, cx, cy, cz,
    module_t, module_minhu, module_maxhu, module_hv, pitch_u, pitch_v`` — and ``rot``
    ``(m, 3, 3)`` (columns u, v, w in global coordinates).
    """
    surf = detector_surfaces(geo)
    rows: dict[str, list] = {k: [] for k in ("volume_id", "layer_id", "module_id", "cx", "cy", "cz", "phi_c", "is_disk", "hu", "hv")}
    edges = np.asarray(geo.disk_ring_edges, float)
    ring_nphi = _disk_ring_nphi(geo)
    for k in range(len(surf.value)):
        if not surf.is_disk[k]:
            rho = surf.value[k]
            nphi = _barrel_nphi(rho, geo)
            dz = 2 * geo.barrel_half_length / geo.barrel_n_z
            iz, iphi = np.meshgrid(np.arange(geo.barrel_n_z), np.arange(nphi), indexing="ij")
            iz, iphi = iz.ravel(), iphi.ravel()
            pc = -np.pi + (iphi + 0.5) * 2 * np.pi / nphi
            rows["module_id"].append(iz * nphi + iphi + 1)
            rows["cx"].append(rho * np.cos(pc)); rows["cy"].append(rho * np.sin(pc))
            rows["cz"].append(-geo.barrel_half_length + (iz + 0.5) * dz)
            rows["hu"].append(np.full(len(pc), np.pi * rho / nphi)); rows["hv"].append(np.full(len(pc), dz / 2))
        else:
            offset = 0
            ids, cxs, cys, czs, pcs, hus, hvs = [], [], [], [], [], [], []
            for ring, nphi in enumerate(ring_nphi):
                iphi = np.arange(nphi)
                pc = -np.pi + (iphi + 0.5) * 2 * np.pi / nphi
                rmid = 0.5 * (edges[ring] + edges[ring + 1])
                ids.append(offset + iphi + 1); offset += int(nphi)
                cxs.append(rmid * np.cos(pc)); cys.append(rmid * np.sin(pc)); czs.append(np.full(nphi, surf.value[k]))
                pcs.append(pc)
                hus.append(np.full(nphi, 0.5 * (edges[ring + 1] - edges[ring])))
                hvs.append(np.full(nphi, np.pi * rmid / nphi))
            pc = np.concatenate(pcs)
            rows["module_id"].append(np.concatenate(ids))
            rows["cx"].append(np.concatenate(cxs)); rows["cy"].append(np.concatenate(cys)); rows["cz"].append(np.concatenate(czs))
            rows["hu"].append(np.concatenate(hus)); rows["hv"].append(np.concatenate(hvs))
        rows["phi_c"].append(pc)
        rows["is_disk"].append(np.full(len(pc), bool(surf.is_disk[k])))
        rows["volume_id"].append(np.full(len(pc), surf.volume_id[k]))
        rows["layer_id"].append(np.full(len(pc), surf.layer_id[k]))
    t = {k: np.concatenate(v) for k, v in rows.items()}
    m = len(t["module_id"])
    return {
        "volume_id": t["volume_id"].astype(np.int64), "layer_id": t["layer_id"].astype(np.int64),
        "module_id": t["module_id"].astype(np.int64),
        "cx": t["cx"], "cy": t["cy"], "cz": t["cz"],
        "rot": module_axes(t["is_disk"], t["phi_c"]),
        "module_t": np.full(m, geo.module_t), "module_minhu": t["hu"], "module_maxhu": t["hu"],
        "module_hv": t["hv"], "pitch_u": np.full(m, geo.pitch_u), "pitch_v": np.full(m, geo.pitch_v),
    }


def cluster_features(lx: np.ndarray, ly: np.ndarray, lz: np.ndarray, charge_frac: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """TrackML cluster-shape features ``(n, 8)`` in :data:`CLUSTER_FEATURES` order.

    The formulas of the HEPT / Exa.TrkX preprocessing of real TrackML files, evaluated the
    same way in float64 and rounded to float32 once at the end:

    * ``charge_frac`` — passed through: the mean cell value Σ value / number of cells [mm of
      path length per pixel] (not a fraction, despite its name);
    * ``lx = n_u·pitch_u``, ``ly = n_v·pitch_v`` [mm], with ``n_u = max ch0 − min ch0 + 1``
      and ``n_v = max ch1 − min ch1 + 1`` the cluster's extents in pixels;
      ``lz = 2·module_t`` [mm] (0.30 for every TrackML pixel module);
    * ``leta = −ln tan(θ/2)``, θ = arccos(lz / |l|), and ``lphi = atan2(ly, lx)`` [rad]:
      pseudorapidity and azimuth of the unsigned local vector l = (lx, ly, lz);
    * ``geta``, ``gphi``: the same for ``g = R·l``, l rotated to global coordinates by the
      module's rotation matrix R (``rot_xu … rot_zw``).

    Rows whose vector l is zero (hits without cells) get ``leta = lphi = geta = gphi = 0``.
    All 8 enter the model unscaled, as columns 6–13 of the 15 model inputs of
    :func:`pointformers.tasks.tracking.tracking_inputs`; the others are r/1000 (r = √(x²+y²)
    in mm), φ/π (φ = atan2(y, x)), z/1000 (mm), eta_rz = −ln tan(θ/2) with θ = atan2(r, z),
    u·1000 and v·1000 (u = x/(x²+y²), v = y/(x²+y²) in mm⁻¹), and layer/10 (the index 0–17 of
    (volume_id, layer_id) among the sorted pixel layers). The table is in
    :mod:`pointformers.data.trackml`.

    Args:
        lx, ly, lz: cluster extent along the module's u, v, w axes [mm], ``(n,)``.
        charge_frac: mean cell value ``(n,)``.
        axes: module frames ``(n, 3, 3)`` (columns u, v, w in global coordinates: TrackML's
            rotation matrix, row = global axis).
    """
    lx, ly, lz = (np.asarray(a, np.float64).reshape(-1) for a in (lx, ly, lz))
    charge_frac = np.asarray(charge_frac, np.float64).reshape(-1)
    axes = np.asarray(axes, np.float64)
    n = len(lx)
    if not (len(ly) == len(lz) == len(charge_frac) == n) or axes.shape != (n, 3, 3):
        raise ValueError(f"cluster_features: expected lx, ly, lz, charge_frac of shape ({n},) and axes ({n}, 3, 3), "
                         f"got {len(ly)}, {len(lz)}, {len(charge_frac)} and {axes.shape}")
    local = np.stack([lx, ly, lz], 1)
    glob = np.matmul(axes, local[:, :, None])[:, :, 0]  # R · (lx, ly, lz)
    leta, lphi = _eta_phi(local)
    geta, gphi = _eta_phi(glob)
    return np.stack([charge_frac, leta, lphi, lx, ly, lz, geta, gphi], 1).astype(np.float32)


def _eta_phi(vec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pseudorapidity −ln tan(θ/2), θ = arccos(z/|v|), and azimuth atan2(y, x) of rows ``(n, 3)``.

    Evaluated literally as the TrackML cell-feature code does (so that float64 results match
    it bit for bit); zero vectors give (0, 0).
    """
    x, y, z = vec[:, 0], vec[:, 1], vec[:, 2]
    r3 = np.sqrt(x ** 2 + y ** 2 + z ** 2)
    nonzero = r3 > 0
    with np.errstate(divide="ignore"):
        theta = np.arccos(z / np.where(nonzero, r3, 1.0))
        eta = -np.log(np.tan(0.5 * theta))
    phi = np.arctan2(y, x)
    return np.where(nonzero, eta, 0.0), np.where(nonzero, phi, 0.0)


def _digitise(d_local: np.ndarray, rng: np.random.Generator, geo: PixelGeometry) -> tuple[np.ndarray, ...]:
    """Cluster extents ``n_u, n_v`` (pixels) and mean cell value of straight segments.

    ``d_local`` ``(n, 3)``: unit directions in the module frame. The mean cell value
    (``charge_frac``, TrackML units: mm of path per pixel) is the segment's path length through
    the sensor, ``thickness / |cos α|`` (its projections capped like the extents), shared
    evenly by the ``n_u + n_v − 1`` pixels a straight segment spanning ``n_u × n_v`` pixels
    crosses (what :func:`pointformers.data.trackml.write_trackml_event` writes as cells).
    """
    n = len(d_local)
    dw = np.maximum(np.abs(d_local[:, 2]), 1e-6)
    # Projection of the path through the sensor onto u and v, in pixels.
    lu = np.abs(d_local[:, 0]) / dw * geo.thickness / geo.pitch_u
    lv = np.abs(d_local[:, 1]) / dw * geo.thickness / geo.pitch_v
    cap = geo.max_cluster_pixels
    lu, lv = np.minimum(lu, cap), np.minimum(lv, cap)
    # A segment of length l pixels starting at a uniform offset covers floor(U + l) + 1
    # pixels; the Gaussian term models charge diffusion / threshold effects.
    n_u = np.floor(rng.random(n) + lu + rng.normal(0, 0.15, n)).astype(np.int64) + 1
    n_v = np.floor(rng.random(n) + lv + rng.normal(0, 0.15, n)).astype(np.int64) + 1
    n_u, n_v = np.clip(n_u, 1, cap), np.clip(n_v, 1, cap)
    # Path length [mm] = thickness / |cos α| when uncapped; TrackML's cell value is the path in the pixel.
    path = np.sqrt((lu * geo.pitch_u) ** 2 + (lv * geo.pitch_v) ** 2 + geo.thickness ** 2)
    charge_frac = path / (n_u + n_v - 1)
    return n_u, n_v, charge_frac


# ============================================================================ parameters
@dataclass(frozen=True)
class TrackingParams:
    """All knobs of the simulation and of the data set built from it.

    Attributes:
        mu: mean number of pile-up interactions per event (≈ 57k hits at 200).
        n_sectors: φ-sectors per event; each sector is one point cloud (1 = whole events).
        n_events: events in a data set (clouds = n_events · n_sectors).
        split: train/val/test fractions of the clouds (sorted by event id, then sector).
        particles_per_vertex: mean charged primaries per vertex in |η| < eta_max.
        eta_max: particles are flat in |η| < eta_max.
        pt_scale, pt_power: pT density ∝ pT (1 + pT/pt_scale)^-pt_power [GeV].
        b_field: solenoid field [T].
        vertex_sigma_z, vertex_sigma_xy: Gaussian vertex spread [mm].
        hit_resolution: Gaussian resolution along both surface directions [mm].
        hit_efficiency: probability that a crossing leaves a hit.
        noise_fraction: expected fraction of noise hits among all hits.
        multiple_scattering: kick the direction at each crossed surface.
        x_over_x0: material per surface, in radiation lengths.
        max_turns: a particle is stopped after this many full transverse turns.
        sector_ds, sector_di, sector_slope: the extended φ-sectors' slope factor, intercept
            [mm⁻¹] and plain-wedge slope rule (``ds``, ``di``, ``slope`` of
            :func:`split_sectors`). Defaults 1.1 / 1e-4 / "auto": the HEPT authors'
            ``PointCloudBuilder`` defaults (their build script passes 1.3 / 0 for whole events).
    """

    mu: float = 200.0
    n_sectors: int = 10
    n_events: int = 50
    split: tuple[float, float, float] = (0.8, 0.1, 0.1)
    particles_per_vertex: float = 50.0
    eta_max: float = 4.0
    pt_scale: float = 1.1
    pt_power: float = 7.0
    b_field: float = 2.0
    vertex_sigma_z: float = 55.0
    vertex_sigma_xy: float = 0.015
    hit_resolution: float = 0.05
    hit_efficiency: float = 0.98
    noise_fraction: float = 0.10
    multiple_scattering: bool = True
    x_over_x0: float = 0.02
    max_turns: float = 1.0
    sector_ds: float = SECTOR_DS
    sector_di: float = SECTOR_DI
    sector_slope: str = "auto"

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            param_error(self, name, why)

        def finite(name: str) -> float:
            return finite_param(self, name)

        for name in ("n_sectors", "n_events"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                bad(name, "expected an integer >= 1")
            object.__setattr__(self, name, int(v))
        for name in ("mu", "particles_per_vertex", "vertex_sigma_z", "vertex_sigma_xy", "hit_resolution", "x_over_x0"):
            if finite(name) < 0:
                bad(name, "expected >= 0")
        for name in ("eta_max", "pt_scale", "b_field", "max_turns"):
            if finite(name) <= 0:
                bad(name, "expected > 0")
        if finite("pt_power") <= 3:
            bad("pt_power", "expected > 3 (finite mean pT)")
        if not 0 <= finite("hit_efficiency") <= 1:
            bad("hit_efficiency", "expected a probability in [0, 1]")
        if not 0 <= finite("noise_fraction") < 1:
            bad("noise_fraction", "expected a fraction in [0, 1)")
        if not isinstance(self.multiple_scattering, (bool, np.bool_)):
            bad("multiple_scattering", "expected a bool")
        try:
            split = tuple(float(s) for s in self.split)
        except (TypeError, ValueError):
            bad("split", "expected three fractions (train, val, test)")
        if len(split) != 3 or min(split) < 0 or abs(sum(split) - 1) > 1e-6:
            bad("split", "expected three non-negative fractions summing to 1")
        object.__setattr__(self, "split", split)
        object.__setattr__(self, "multiple_scattering", bool(self.multiple_scattering))
        sector_slope(self.n_sectors, self.sector_ds, self.sector_di, self.sector_slope,
                     names=("n_sectors", "sector_ds", "sector_di", "sector_slope"))
        object.__setattr__(self, "sector_ds", float(self.sector_ds))
        object.__setattr__(self, "sector_di", float(self.sector_di))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON view (used for the cache key)."""
        d = dataclasses.asdict(self)
        d["split"] = list(self.split)
        return d

    def replace(self, **changes: Any) -> "TrackingParams":
        """A copy with some fields changed (validated); unknown names raise ValueError."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown TrackingParams field; valid: {sorted(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes)


#: Named parameter sets. ``tiny``: unit tests (~400 hits per cloud, a few ms per event).
#: ``small``: CPU demo, 150 clouds of ~1.6k hits (μ = 10, two φ-halves per event): the hit
#: density in (η, φ) of μ = 10, a twentieth of Tracking-6k's, so a few minutes of CPU training
#: learn it (kNN in (η, φ) scores AP@k ≈ 0.65 on it). ``tracking-6k`` / ``tracking-60k``:
#: HEPT's data sets (500 / 50 clouds).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(mu=2.0, n_sectors=2, n_events=10),
    "small": dict(mu=10.0, n_sectors=2, n_events=75),
    "tracking-6k": dict(mu=200.0, n_sectors=10, n_events=50),
    "tracking-60k": dict(mu=200.0, n_sectors=1, n_events=50),
}


def preset_params(name: str, **overrides: Any) -> TrackingParams:
    """The :class:`TrackingParams` of preset ``name`` (with optional field overrides)."""
    return params_from_preset(TrackingParams, PRESETS, "tracking", name, **overrides)


def resolve_params(preset_or_params: str | TrackingParams | Mapping[str, Any]) -> TrackingParams:
    """Accept a preset name, a :class:`TrackingParams`, or a mapping of field values."""
    return resolve_generator_params(TrackingParams, PRESETS, "tracking", preset_or_params)


# ============================================================================ particles
@dataclass
class Particles:
    """Generated primaries, ``(p,)`` arrays (float64 kinematics, mm and GeV)."""

    vx: np.ndarray
    vy: np.ndarray
    vz: np.ndarray
    px: np.ndarray
    py: np.ndarray
    pz: np.ndarray
    q: np.ndarray
    vertex: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # vertex index


def sample_particles(params: TrackingParams, rng: np.random.Generator) -> Particles:
    """The triggered collision plus ``Poisson(mu)`` pile-up vertices and their charged primaries."""
    # Every recorded event has its triggered collision, so no event is empty.
    n_vtx = 1 + int(rng.poisson(params.mu))
    vtx = np.stack([rng.normal(0, params.vertex_sigma_xy, n_vtx), rng.normal(0, params.vertex_sigma_xy, n_vtx),
                    rng.normal(0, params.vertex_sigma_z, n_vtx)], 1)
    mult = rng.poisson(params.particles_per_vertex, n_vtx)
    vid = np.repeat(np.arange(n_vtx), mult)
    p = len(vid)
    eta = rng.uniform(-params.eta_max, params.eta_max, p)
    phi = rng.uniform(-np.pi, np.pi, p)
    # Beta-prime(2, n-2) scaled by p0 has density ∝ pT (1 + pT/p0)^-n.
    pt = params.pt_scale * rng.gamma(2.0, size=p) / rng.gamma(params.pt_power - 2.0, size=p)
    pt = np.maximum(pt, 1e-4)
    q = np.where(rng.random(p) < 0.5, -1, 1).astype(np.int64)
    return Particles(vx=vtx[vid, 0], vy=vtx[vid, 1], vz=vtx[vid, 2], px=pt * np.cos(phi), py=pt * np.sin(phi),
                     pz=pt * np.sinh(eta), q=q, vertex=vid)


# ============================================================================ transport
def _cylinder_psi(p2: np.ndarray, R: np.ndarray, a: np.ndarray, b: np.ndarray, radii: np.ndarray) -> np.ndarray:
    """Turning angle ψ ∈ (0, 2π) of the outgoing crossing of each radius, ``(m, k)`` (inf: none).

    With start point P0 (``|P0|² = p2``), unit direction t, a = P0·t, b = h P0·perp(t), the
    helix projection is P(ψ) = P0 + R sinψ t + R (1 - cosψ) h perp(t), so
    |P|² - |P0|² = 4R(R+b) sin²(ψ/2) + 4Ra sin(ψ/2)cos(ψ/2). Setting it to ρ² - p2 and
    dividing by cos² gives (A-E)T² + BT - E = 0 in T = tan(ψ/2), A = 1+b/R, B = a/R,
    E = (ρ² - p2)/(4R²): no cancellation for large R (straight tracks).
    """
    A = (1.0 + b / R)[:, None]
    B = (a / R)[:, None]
    E = (radii[None, :] ** 2 - p2[:, None]) / (4.0 * R[:, None] ** 2)
    AE = A - E
    disc = B * B + 4.0 * E * AE
    sq = np.sqrt(np.maximum(disc, 0.0))
    qq = -0.5 * (B + np.where(B >= 0, sq, -sq))
    best = np.full(E.shape, np.inf)
    for T in (qq / AE, -E / qq):
        w = np.arctan(T)
        w = np.where(w <= 0, w + np.pi, w)
        psi = 2.0 * w
        outgoing = A * np.sin(psi) + B * np.cos(psi) > 0
        ok = (disc >= 0) & np.isfinite(psi) & outgoing
        best = np.where(ok & (psi < best), psi, best)
    return best


def _advance(P: np.ndarray, t: np.ndarray, perp: np.ndarray, R: np.ndarray, psi: np.ndarray) -> np.ndarray:
    """Transverse position after turning by ψ, ``(m, 2)`` (perp already multiplied by h)."""
    s, hv = np.sin(psi), 2.0 * np.sin(0.5 * psi) ** 2
    return P + (R * s)[:, None] * t + (R * hv)[:, None] * perp


@dataclass
class _Crossings:
    particle: np.ndarray  # (m,) particle row
    surface: np.ndarray  # (m,) surface index
    step: np.ndarray  # (m,) order along the trajectory
    pos: np.ndarray  # (m, 3) true crossing point
    mom: np.ndarray  # (m, 3) momentum at the crossing (before the scattering kick)


def transport(
    particles: Particles, params: TrackingParams, rng: np.random.Generator, geo: PixelGeometry = GEOMETRY
) -> _Crossings:
    """Trace every particle through the detector.

    Returns all ``m`` crossings of sensitive areas (before efficiency and smearing) with the
    particle row, surface index, step number, true position ``(m, 3)`` and momentum
    ``(m, 3)``. Each step moves every live particle to its nearest next crossing, so the
    Python loop runs at most once per surface.
    """
    surf = detector_surfaces(geo)
    S = len(surf.value)
    bar = np.flatnonzero(~surf.is_disk)
    dsk = np.flatnonzero(surf.is_disk)
    radii = np.r_[surf.value[bar], geo.envelope_r]  # last one: leaving the envelope
    disk_z = surf.value[dsk]
    pos = np.stack([particles.vx, particles.vy, particles.vz], 1).astype(np.float64)
    mom = np.stack([particles.px, particles.py, particles.pz], 1).astype(np.float64)
    n = len(pos)
    charge = np.asarray(particles.q, np.float64)
    alive = (np.hypot(mom[:, 0], mom[:, 1]) > 0) & (charge != 0)
    done = np.zeros((n, S), bool)
    turn_left = np.full(n, 2.0 * np.pi * params.max_turns)
    out: list[tuple[np.ndarray, ...]] = []
    eps_len = 1e-6  # mm: a crossing must lie ahead of the current point
    with np.errstate(all="ignore"):
        for step in range(S):
            idx = np.flatnonzero(alive)
            if len(idx) == 0:
                break
            P, M = pos[idx], mom[idx]
            pt = np.hypot(M[:, 0], M[:, 1])
            R = pt / (0.3 * params.b_field) * 1000.0  # mm
            h = -np.sign(params.b_field) * charge[idx]  # +1: counter-clockwise
            t = M[:, :2] / pt[:, None]
            perp = h[:, None] * np.stack([-t[:, 1], t[:, 0]], 1)  # towards the circle centre
            cot = M[:, 2] / pt
            xy = P[:, :2]
            a = (xy * t).sum(1)
            b = (xy * perp).sum(1)
            psi_cyl = _cylinder_psi((xy ** 2).sum(1), R, a, b, radii)
            # Disks: z = z0 + R ψ cotθ.
            psi_dsk = (disk_z[None, :] - P[:, 2:3]) / (R * cot)[:, None]
            psi_dsk = np.where(np.isfinite(psi_dsk) & (psi_dsk * R[:, None] > eps_len), psi_dsk, np.inf)
            zlim = np.where(cot > 0, geo.envelope_z, -geo.envelope_z)
            psi_zexit = np.where(cot != 0, (zlim - P[:, 2]) / (R * cot), np.inf)
            psi_lim = np.minimum(np.minimum(psi_cyl[:, -1], psi_zexit), turn_left[idx])
            # Acceptance of each candidate crossing.
            psi_bar = psi_cyl[:, :-1]
            fin = np.isfinite(psi_bar)
            zb = P[:, 2:3] + R[:, None] * np.where(fin, psi_bar, 0.0) * cot[:, None]
            psi_bar = np.where(fin & (np.abs(zb) < geo.barrel_half_length) & (psi_bar * R[:, None] > eps_len), psi_bar, np.inf)
            fin = np.isfinite(psi_dsk)
            pd = np.where(fin, psi_dsk, 0.0)
            s_, hv_ = np.sin(pd), 2.0 * np.sin(0.5 * pd) ** 2
            xd = xy[:, 0:1] + R[:, None] * (s_ * t[:, 0:1] + hv_ * perp[:, 0:1])
            yd = xy[:, 1:2] + R[:, None] * (s_ * t[:, 1:2] + hv_ * perp[:, 1:2])
            rd = np.hypot(xd, yd)
            psi_dsk = np.where(fin & (rd > geo.disk_rmin) & (rd < geo.disk_rmax), psi_dsk, np.inf)
            cand = np.empty((len(idx), S))
            cand[:, bar] = psi_bar
            cand[:, dsk] = psi_dsk
            cand[done[idx] | (cand >= psi_lim[:, None])] = np.inf
            k = np.argmin(cand, 1)
            psi = cand[np.arange(len(idx)), k]
            ok = np.isfinite(psi)
            alive[idx[~ok]] = False
            if not ok.any():
                break
            idx, k, psi = idx[ok], k[ok], psi[ok]
            t, perp, R, cot, M, P = t[ok], perp[ok], R[ok], cot[ok], M[ok], P[ok]
            new_xy = _advance(P[:, :2], t, perp, R, psi)
            new_z = P[:, 2] + R * psi * cot
            new_t = np.cos(psi)[:, None] * t + np.sin(psi)[:, None] * perp
            pt = np.hypot(M[:, 0], M[:, 1])
            new_mom = np.column_stack([pt[:, None] * new_t, M[:, 2]])
            new_pos = np.column_stack([new_xy, new_z])
            out.append((idx, k, np.full(len(idx), step), new_pos, new_mom.copy()))
            done[idx, k] = True
            turn_left[idx] -= psi
            if params.multiple_scattering and params.x_over_x0 > 0:
                new_mom = _scatter(new_mom, params.x_over_x0, rng)
            pos[idx] = new_pos
            mom[idx] = new_mom
    if not out:
        z0 = np.zeros(0, np.int64)
        return _Crossings(z0, z0, z0, np.zeros((0, 3)), np.zeros((0, 3)))
    cols = list(zip(*out))
    return _Crossings(*(np.concatenate(c) for c in cols))


def _scatter(mom: np.ndarray, x_over_x0: float, rng: np.random.Generator) -> np.ndarray:
    """Kick momentum directions ``(m, 3)`` by two Gaussian angles of RMS 13.6 MeV/p·sqrt(x/X0)."""
    p = np.linalg.norm(mom, axis=1)
    d = mom / p[:, None]
    theta0 = 0.0136 / p * math.sqrt(x_over_x0)
    e1 = np.stack([-d[:, 1], d[:, 0], np.zeros(len(d))], 1)
    e1 /= np.linalg.norm(e1, axis=1, keepdims=True)
    e2 = np.cross(d, e1)
    k1, k2 = rng.normal(size=(2, len(d))) * theta0
    d = d + k1[:, None] * e1 + k2[:, None] * e2
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return d * p[:, None]


# ============================================================================ events
def _truth_weights(particle: np.ndarray, step: np.ndarray, pt: np.ndarray) -> np.ndarray:
    """TrackML-like truth weights for particle hits (see module docstring), ``(m,)``."""
    w = np.zeros(len(particle))
    if len(particle) == 0:
        return w
    order = np.lexsort((step, particle))
    ps = particle[order]
    start = np.r_[True, ps[1:] != ps[:-1]]
    end = np.r_[ps[1:] != ps[:-1], True]
    counts = np.bincount(ps)[ps]
    w_pt = np.clip(0.2 + 0.8 * (pt[order] - 0.5) / 0.5, 0.2, 1.0)
    w_order = np.where(start | end, 2.0, 1.0)
    w[order] = np.where(counts >= 4, w_pt * w_order, 0.0)
    total = w.sum()
    return w / total if total > 0 else w


def simulate_event(
    particles: Particles,
    params: TrackingParams,
    rng: np.random.Generator,
    event_id: int = 0,
    geo: PixelGeometry = GEOMETRY,
) -> TrackingEvent:
    """Detector response (hits, noise, cluster features, truth) to given particles.

    Use this with hand-made :class:`Particles` (e.g. one 10 GeV track); :func:`generate_event`
    samples the particles first.
    """
    surf = detector_surfaces(geo)
    cr = transport(particles, params, rng, geo)
    keep = rng.random(len(cr.particle)) < params.hit_efficiency
    cr = _Crossings(cr.particle[keep], cr.surface[keep], cr.step[keep], cr.pos[keep], cr.mom[keep])
    m = len(cr.particle)

    # Measurement: Gaussian smearing within the surface (hits stay on it).
    sig = params.hit_resolution
    meas = cr.pos.copy()
    on_disk = surf.is_disk[cr.surface]
    rho = np.hypot(cr.pos[:, 0], cr.pos[:, 1])
    phi = np.arctan2(cr.pos[:, 1], cr.pos[:, 0]) + np.where(on_disk, 0.0, rng.normal(0, sig, m) / np.maximum(rho, 1e-9))
    rho_b = surf.value[cr.surface]  # exact cylinder radius for barrel hits
    du, dv = rng.normal(0, sig, (2, m))
    meas[:, 0] = np.where(on_disk, cr.pos[:, 0] + du, rho_b * np.cos(phi))
    meas[:, 1] = np.where(on_disk, cr.pos[:, 1] + dv, rho_b * np.sin(phi))
    meas[:, 2] = np.where(on_disk, cr.pos[:, 2], cr.pos[:, 2] + dv)

    # Noise hits, uniform over the sensitive area.
    n_noise = int(rng.poisson(params.noise_fraction / (1 - params.noise_fraction) * m)) if m else 0
    area = np.where(surf.is_disk, np.pi * (geo.disk_rmax ** 2 - geo.disk_rmin ** 2),
                    2 * np.pi * surf.value * 2 * geo.barrel_half_length)
    ns = rng.choice(len(area), n_noise, p=area / area.sum())
    nphi = rng.uniform(-np.pi, np.pi, n_noise)
    nr = np.where(surf.is_disk[ns], np.sqrt(rng.uniform(geo.disk_rmin ** 2, geo.disk_rmax ** 2, n_noise)), surf.value[ns])
    nz = np.where(surf.is_disk[ns], surf.value[ns], rng.uniform(-geo.barrel_half_length, geo.barrel_half_length, n_noise))
    noise_pos = np.stack([nr * np.cos(nphi), nr * np.sin(nphi), nz], 1)

    surface = np.r_[cr.surface, ns].astype(np.int64)
    xyz = np.r_[meas, noise_pos]
    true_pos = np.r_[cr.pos, noise_pos]
    true_mom = np.r_[cr.mom, np.zeros((n_noise, 3))]
    pidx = np.r_[cr.particle, np.full(n_noise, -1)].astype(np.int64)
    module_id, phi_c, _ = locate_modules(surface, xyz[:, 0], xyz[:, 1], xyz[:, 2], geo)
    axes = module_axes(surf.is_disk[surface], phi_c)

    # Cluster shape from the true local direction (noise: a random direction, cosθ_w ∈ [0.2, 1]).
    d = np.zeros((m + n_noise, 3))
    if m:
        d[:m] = cr.mom / np.linalg.norm(cr.mom, axis=1, keepdims=True)
    d_local = np.einsum("nij,ni->nj", axes, d)
    cw = rng.uniform(0.2, 1.0, n_noise)
    az = rng.uniform(-np.pi, np.pi, n_noise)
    sw = np.sqrt(1 - cw ** 2)
    d_local[m:] = np.stack([sw * np.cos(az), sw * np.sin(az), cw], 1)
    n_u, n_v, cfrac = _digitise(d_local, rng, geo)
    cells = cluster_features(n_u * geo.pitch_u, n_v * geo.pitch_v, np.full(len(n_u), 2 * geo.module_t), cfrac, axes)

    # Particle table and truth weights.
    p_pt = np.hypot(particles.px, particles.py)
    weight = np.r_[_truth_weights(cr.particle, cr.step, p_pt[cr.particle]), np.zeros(n_noise)]
    n_particles = len(particles.q)
    nhits = np.bincount(cr.particle, minlength=n_particles).astype(np.int64)

    # TrackML-like hit order: by volume, layer, module (random within a module).
    order = np.lexsort((rng.random(len(surface)), module_id, surf.layer_id[surface], surf.volume_id[surface]))
    f32 = np.float32
    pid = np.where(pidx >= 0, pidx + 1, 0)
    return TrackingEvent(
        hit_id=np.arange(1, len(order) + 1, dtype=np.int64),
        x=xyz[order, 0].astype(f32), y=xyz[order, 1].astype(f32), z=xyz[order, 2].astype(f32),
        volume_id=surf.volume_id[surface][order], layer_id=surf.layer_id[surface][order],
        module_id=module_id[order], cells=cells[order], particle_id=pid[order].astype(np.int64),
        weight=weight[order].astype(f32),
        particles_id=np.arange(1, n_particles + 1, dtype=np.int64),
        vx=particles.vx.astype(f32), vy=particles.vy.astype(f32), vz=particles.vz.astype(f32),
        px=particles.px.astype(f32), py=particles.py.astype(f32), pz=particles.pz.astype(f32),
        q=np.asarray(particles.q, np.int64), nhits=nhits, event_id=int(event_id), sector=-1,
        tx=true_pos[order, 0].astype(f32), ty=true_pos[order, 1].astype(f32), tz=true_pos[order, 2].astype(f32),
        tpx=true_mom[order, 0].astype(f32), tpy=true_mom[order, 1].astype(f32), tpz=true_mom[order, 2].astype(f32),
    )


def _rng(seed: int, event_id: int) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if isinstance(event_id, bool) or not isinstance(event_id, (int, np.integer)) or event_id < 0:
        raise ValueError(f"event_id: expected a non-negative integer, got {event_id!r}")
    return np.random.default_rng([int(seed), int(event_id)])


def generate_event(params: TrackingParams | str | Mapping[str, Any], seed: int, event_id: int = 0) -> TrackingEvent:
    """One whole simulated event (``sector = -1``); deterministic in (params, seed, event_id)."""
    params = resolve_params(params)
    rng = _rng(seed, event_id)
    return simulate_event(sample_particles(params, rng), params, rng, event_id=event_id)


# ============================================================================ sectors
def sector_slope(n_sectors: int, ds: float = SECTOR_DS, di: float = SECTOR_DI, slope: str = "auto",
                 names: tuple[str, str, str, str] = ("n_sectors", "ds", "di", "slope")) -> float:
    """Validate the sector options of :func:`split_sectors` and return the plain wedge's slope.

    ``"arctan"``: ``arctan(π/n)`` (the authors' code); ``"tan"``: ``tan(π/n)`` (wedges that
    tile the circle; ``inf``, a half plane, for ``n = 2``); ``"auto"``: ``"arctan"`` when its
    extended wedges cover every azimuth, i.e. ``ds·arctan(π/n) >= tan(π/n)`` (n >= 5 at
    ds = 1.3, n >= 9 at ds = 1.1; ``di`` ignored, it only widens the wedge away from the
    beam), else ``"tan"``. ``names`` are the argument names used in error messages.

    Raises:
        ValueError: ``n_sectors`` not an integer >= 1, ``ds`` not a finite number >= 1 (the
            extended wedge must contain the plain one), ``di`` not a finite number >= 0,
            ``slope`` not in :data:`SECTOR_SLOPES`, or ``"arctan"`` leaving azimuth uncovered.
    """
    n_name, ds_name, di_name, slope_name = names
    if isinstance(n_sectors, bool) or not isinstance(n_sectors, (int, np.integer)) or n_sectors < 1:
        raise ValueError(f"{n_name}: expected an integer >= 1, got {n_sectors!r}")
    for name, val, lo in ((ds_name, ds, 1.0), (di_name, di, 0.0)):
        if (isinstance(val, bool) or not isinstance(val, (int, float, np.integer, np.floating))
                or not math.isfinite(val) or val < lo):
            raise ValueError(f"{name}: expected a finite number >= {lo:g}, got {val!r}")
    if not isinstance(slope, str) or slope not in SECTOR_SLOPES:
        raise ValueError(f"{slope_name}: expected one of {list(SECTOR_SLOPES)}, got {slope!r}")
    theta = math.pi / int(n_sectors)
    tan_slope = math.inf if n_sectors <= 2 else math.tan(theta)
    arctan_slope = math.atan(theta)
    covers = n_sectors == 1 or float(ds) * arctan_slope >= tan_slope
    if slope == "arctan" and not covers:
        raise ValueError(
            f"{slope_name}: 'arctan' wedges with {n_name}={n_sectors} and {ds_name}={ds} leave part of the azimuth "
            f"in no sector (they need {ds_name} >= tan(π/n)/arctan(π/n) = {tan_slope / arctan_slope:.4g}); "
            "use 'tan' or 'auto'")
    return arctan_slope if slope == "arctan" or (slope == "auto" and covers) else tan_slope


def sector_wedges(x: np.ndarray, y: np.ndarray, sector: int, n_sectors: int, slope: float,
                  ds: float = SECTOR_DS, di: float = SECTOR_DI) -> tuple[np.ndarray, np.ndarray]:
    """Membership of hits at ``(x, y)`` [mm] in sector ``sector``'s plain and extended wedges.

    The authors' ``PointCloudBuilder.sector_hits``: conformal ``(u, v) = (x, y)/(x² + y²)``
    rotated by ``2·sector·θ``, θ = π/n: ``ur = u cos 2sθ − v sin 2sθ``,
    ``vr = u sin 2sθ + v cos 2sθ`` (so sector s is centred on azimuth −2πs/n). Plain:
    ``−slope·ur < vr < slope·ur`` and ``ur > 0``; extended: ``−(ds·slope·ur + di) < vr <
    ds·slope·ur + di`` and ``ur > 0`` (strict inequalities; ``slope`` from
    :func:`sector_slope`, ``inf`` = the half plane ``ur > 0``). Hits on the beam axis are in
    no wedge. Returns two bool arrays ``(n,)``.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    r2 = x * x + y * y
    with np.errstate(divide="ignore", invalid="ignore"):
        u, v = x / r2, y / r2
        a = 2 * sector * math.pi / n_sectors
        ur = u * math.cos(a) - v * math.sin(a)
        vr = u * math.sin(a) + v * math.cos(a)
        front = ur > 0
        plain = (vr > -slope * ur) & (vr < slope * ur) & front
        bound = ds * slope * ur + di
        extended = (vr > -bound) & (vr < bound) & front
    return plain, extended


def split_sectors(event: TrackingEvent, n_sectors: int, *, ds: float = SECTOR_DS, di: float = SECTOR_DI,
                  slope: str = "auto") -> list[TrackingEvent]:
    """Cut an event into ``n_sectors`` overlapping φ-sector clouds as the HEPT authors build Tracking-6k.

    Their ``PointCloudBuilder.sector_hits`` (see :func:`sector_wedges` for the geometry):

    * the cloud of sector s holds **every** hit inside its extended wedge (half-width
      ``ds·slope·ur + di`` in the rotated conformal plane) whatever it belongs to: hits of
      any particle and noise. Neighbouring clouds overlap, so a hit may lie in two clouds;
    * a particle is one of the sector's **own** particles when at least half of its hits,
      counted over the whole event, lie in the plain wedge (half-width ``slope·ur``). A
      particle may be own in two sectors (exactly half in each) or in none (its hits spread
      over the gaps between plain wedges or over three sectors);
    * ``slope = arctan(π/n)`` in the authors' code (the arctangent, not the tangent: its
      plain wedges are narrower than 2π/n and leave gaps, e.g. 0.296 rad of each 0.314 rad
      half-sector at n = 10, which the extended wedges close). For small n those gaps stay
      open (at n = 2 the arctan wedges span ±45° of each half), so ``slope="auto"`` (default)
      uses arctan whenever its extended wedges cover the circle — always for Tracking-6k's
      n = 10 — and ``tan(π/n)`` (exact tiling; half planes at n = 2) otherwise;
      ``"arctan"``/``"tan"`` force one (``"arctan"`` refuses a cover with gaps).
    * ``ds`` / ``di``: the extended wedge's slope factor and intercept [mm⁻¹]. Defaults
      :data:`SECTOR_DS` = 1.1 and :data:`SECTOR_DI` = 1e-4, the authors' ``PointCloudBuilder``
      defaults (Tracking-6k); their ``build_point_clouds.py`` passes ``sector_ds=1.3, sector_di=0``.

    Per cloud (``sector`` = s): the hits in event order; the particle table of every particle
    with a hit in the cloud (own or not; particles without hits are in no cloud), ``nhits``
    still the whole-event count; ``sector_own`` per hit (True for hits of own particles,
    False for other particles' hits and noise: the authors set their per-hit ``sector`` to
    -1 there) and ``particle_layers`` (distinct layers of the hit's particle in the whole
    event, so :attr:`~.event.TrackingEvent.reconstructable` is the authors' whole-event
    flag). The authors' trainer and AP@k ignore ``sector``: every hit of a cloud is labelled by
    its particle id, hits of non-own particles included, and so does our tracking task.
    Truth weights: hits of non-own particles weigh 0 (like noise), so each particle is
    scored by the TrackML score in the sector owning it; the rest are renormalised to sum to
    1 over the cloud (left at 0 when the cloud owns no weight). ``n_sectors = 1`` returns the
    whole event unchanged.

    Raises:
        ValueError: bad ``n_sectors``, ``ds``, ``di`` or ``slope`` (see :func:`sector_slope`).
    """
    k = sector_slope(n_sectors, ds, di, slope)
    if n_sectors == 1:
        return [event]
    pid = np.asarray(event.particle_id, np.int64)
    ids, inv = np.unique(pid, return_inverse=True)
    inv = inv.reshape(-1)
    n_of = np.bincount(inv, minlength=len(ids))  # hits per particle id over the whole event
    real = ids > 0
    if event.particle_layers is not None:
        layers = np.asarray(event.particle_layers, np.int64)
    elif len(pid):
        pairs = np.unique(np.stack([inv, event.layer_index], 1), axis=0)
        layers = np.bincount(pairs[:, 0], minlength=len(ids))[inv]
    else:
        layers = np.zeros(0, np.int64)
    layers = np.where(pid > 0, layers, 0).astype(np.int64)
    pidx = event.hit_particle_index
    weight = np.asarray(event.weight, np.float64)
    clouds = []
    for s in range(n_sectors):
        plain, extended = sector_wedges(event.x, event.y, s, n_sectors, k, float(ds), float(di))
        in_plain = np.bincount(inv[plain], minlength=len(ids))
        own = (real & (2 * in_plain >= n_of))[inv]
        pm = np.zeros(event.num_particles, bool)
        pm[pidx[extended & (pidx >= 0)]] = True
        cloud = event.subset(extended, pm, sector=s)
        cloud.sector_own = own[extended]
        cloud.particle_layers = layers[extended]
        w = np.where(cloud.sector_own, weight[extended], 0.0)
        total = float(w.sum())
        cloud.weight = (w / total if total > 0 else w).astype(np.float32)
        clouds.append(cloud)
    return clouds


# ============================================================================ data sets
def generate_clouds(
    preset_or_params: str | TrackingParams | Mapping[str, Any], n_events: int | None = None, seed: int = 0
) -> list[TrackingEvent]:
    """``n_events`` (default: the preset's) events cut into sector clouds, sorted by (event, sector)."""
    params = resolve_params(preset_or_params)
    n_events = params.n_events if n_events is None else n_events
    if isinstance(n_events, bool) or not isinstance(n_events, (int, np.integer)) or n_events < 0:
        raise ValueError(f"n_events: expected a non-negative integer, got {n_events!r}")
    return _clouds_of_events(params, range(int(n_events)), seed)


def _clouds_of_events(params: TrackingParams, events: Sequence[int], seed: int) -> list[TrackingEvent]:
    clouds: list[TrackingEvent] = []
    for e in events:
        clouds.extend(split_sectors(generate_event(params, seed, event_id=e), params.n_sectors,
                                    ds=params.sector_ds, di=params.sector_di, slope=params.sector_slope))
    return clouds


def split_ranges(n_clouds: int, fractions: Sequence[float]) -> dict[str, tuple[int, int]]:
    """Cloud index ranges ``[start, stop)`` of train/val/test (floor for train and val)."""
    n_train = int(math.floor(fractions[0] * n_clouds + 1e-9))
    n_val = int(math.floor(fractions[1] * n_clouds + 1e-9))
    return {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, n_clouds)}


def load_tracking_dataset(
    preset: str | TrackingParams | Mapping[str, Any],
    split: str,
    cache_dir: str | Path | None = None,
    seed: int = 0,
) -> list[TrackingEvent]:
    """The ``split`` ("train" | "val" | "test") clouds of a data set, cached on disk.

    Clouds are ordered by event id then sector and cut 80/10/10 (``params.split``) by cloud,
    as HEPT does; only the events a split needs are generated. The cache file is keyed by
    all parameters, the seed, the split and :data:`GENERATOR_VERSION`; a missing, stale or
    corrupted file is regenerated. ``cache_dir`` defaults to ``$POINTFORMERS_CACHE`` or
    ``~/.cache/pointformers``.
    """
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    params = resolve_params(preset)
    _rng(seed, 0)  # validates the seed
    start, stop = split_ranges(params.n_events * params.n_sectors, params.split)[split]
    ns = params.n_sectors
    events = range(start // ns, (stop + ns - 1) // ns) if stop > start else range(0)
    key = {"generator": "pointformers.tracking", "version": GENERATOR_VERSION, "params": params.to_dict(),
           "seed": int(seed), "split": split}

    def build() -> dict[str, np.ndarray]:
        clouds = _clouds_of_events(params, events, seed)
        first = events.start * ns if len(events) else 0
        return pack_events(clouds[start - first: stop - first])

    name = preset if isinstance(preset, str) else "custom"
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    arrays = cached_arrays(root / "tracking", f"{name}-{split}", key, build)
    try:
        return unpack_events(arrays)
    except (KeyError, ValueError, IndexError):
        # A well-formed file with inconsistent content: rebuild and overwrite.
        arrays = build()
        save_arrays(cache_path(root / "tracking", f"{name}-{split}", key), key, arrays)
        return unpack_events(arrays)


__all__ = [
    "CLUSTER_FEATURES", "GENERATOR_VERSION", "GEOMETRY", "PRESETS", "SPLITS", "Particles", "PixelGeometry",
    "TrackingParams", "cluster_features", "detector_surfaces", "empty_event", "generate_clouds", "generate_event",
    "load_tracking_dataset", "locate_modules", "module_axes", "module_table", "preset_params", "resolve_params",
    "sample_particles", "simulate_event", "split_ranges", "split_sectors", "transport",
    "SECTOR_DI", "SECTOR_DS", "SECTOR_SLOPES", "sector_slope", "sector_wedges",
]
