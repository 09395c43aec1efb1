"""A simulation of the TrackML pixel detector for HEPT's Tracking-6k / Tracking-60k tasks.

It simulates what the TrackML challenge's ACTS/Fatras simulation made (Amrouche et al., "The
Tracking Machine Learning challenge: Accuracy phase", 2019, arXiv:1904.06778), restricted to
the pixel volumes 7, 8, 9. Each value below is a measured or documented property of the real
simulation. Sources: measurements on public real TrackML files — "test event 1" =
gnn-tracking/gnn_tracking ``src/gnn_tracking/test_data/trackml/test_event000000001-*.csv.gz``
(548 particles with all their hits, plus noise; 2,783 pixel hits) and "event 21139" =
Sharad24/trackml ``acts-framework/Algorithms/Reconstruction/ACTFW/MikadoTracker/data/event000021139-particles.csv``
(a complete particle table); the ACTS code that made the data (acts-project/acts
``Examples/src/GenericDetectorML.ipp``; Sharad24/trackml ``acts-framework/Algorithms/Digitization/src/DigitizationAlgorithm.cpp``
and ``Detectors/GenericDetector/src/GenericLayerBuilder.cpp``); the 1st-place solution
top-quarks/top-quarks (``src/density.hpp``); HEPT (Miao et al. 2024, Table 4) for the
average of 56.7k pixel hits per event.

* **Detector**: the real module table (:data:`DETECTORS_FILE`, TrackML's ``detectors.csv``
  volumes 7, 8, 9: 4,004 planar modules of 16.8 × 72 mm, pitch 0.05 × 0.05625 mm; barrel
  layers at r ≈ 32, 72, 116, 172 mm, 7 disks per side at |z| ≈ 600 … 1500 mm), each module
  with its own centre and rotation. Module frames are TrackML's: barrel v ∥ z, u azimuthal;
  end caps v radial, w = ±z (−z in volume 7), u = v × w.
* **Field**: Bz(z) = 2 T · (1.002 − 0.03·z′ − z′²·(0.55 − 0.3·(1 − z′²))), z′ = z / 2750 mm, the
  1st-place solution's model of the real field (top-quarks ``src/density.hpp``): 0.885 of the
  central value at z = +1.5 m (:func:`field_ratio`). Each transport step is a helix in the
  field at its mid-point z.
* **Particles**: one triggered collision plus ``Poisson(mu)`` pile-up vertices (μ = 200),
  z ~ N(0, 61 mm), transverse ~ N(0, 0.014 mm) (measured over the 174 vertices of a real
  event); ``Poisson(50)`` charged primaries per vertex, flat in |η| < 4 and φ, charge ±1,
  pT ∝ pT (1 + pT/1.1)^-7, none below 0.1 GeV (TrackML's particle tables stop there): median
  0.43 GeV, 18 % above 0.9 GeV (real primaries: 0.437 GeV and 17 %); those below 0.15 GeV
  leave no hit (as 92 % of real ones between 0.10 and 0.15 GeV); 10 % of them start
  displaced by Exp(50 mm) along their direction (decays of neutral particles; measured). **Secondaries**
  (hadronic interactions, Fatras' p and π±) are 22.6 % of all particles, as measured; half of
  their vertices lie on the material inside the pixel volume (beam pipe, layer supports,
  support tube, chosen ∝ nuclear interaction lengths), half at 200–1000 mm (median ρ = 200 mm
  as measured), on a random primary's helix; isotropic, soft (median p 0.27 GeV; real 0.24)
  (:func:`sample_particles`).
* **Transport**: helices traced from layer to layer (each layer's mean surface, closed-form
  crossings; a barrel layer at most once outwards and once inwards — loopers, e.g. soft
  secondaries born inside the barrel that curl in and out —, a disk at most once), then
  intersected exactly (Newton's method) with the planes of the nearby real modules: a hit
  wherever the crossing lies in a module's active area (|u| ≤ module_maxhu, |v| ≤ module_hv).
  Overlapping neighbours thus give the same-layer double hits of real events (29 % of real
  non-noise pixel hits are a particle's 2nd+ hit on a layer); a particle never hits a module
  twice. Multiple scattering kicks the direction at each crossed layer by two Gaussian angles
  of RMS 13.6 MeV / p · sqrt(x/X0), x/X0 = 0.012 / |cos α| (1 mm Si-equivalent support +
  0.15 mm Si per layer, GenericDetectorML). A particle stops on leaving r = 200 mm or
  |z| = 1550 mm, or after ``max_turns`` turns (a stand-in for energy loss).
* **Digitisation** (ACTS Fatras ``DigitizationAlgorithm``; :func:`digitise`): the track's
  straight path through the sensor, depth 0.15 mm in the barrel and 0.30 mm in the end caps
  (measured on real clusters), along its local direction, drifted in the barrel to the
  readout side at the Lorentz angle 0.12 rad (GenericDetectorML), is cut at the
  0.05 × 0.05625 mm pixel boundaries; each crossed pixel is a cell ``(ch0, ch1, value)`` whose
  value is the path length in it [mm] (no charge fluctuation, no threshold, no smearing).
  The hit position is the value-weighted centroid of the cell centres, in the barrel
  corrected by the full Lorentz shift +0.15 mm · tan 0.12 = +0.0181 mm along u (both as
  measured on real hits); the truth (``tx, ty, tz``) is the crossing of the module mid-plane.
  Every crossing makes a cluster (no inefficiency).
* **Noise** (particle id 0): 5.5 % of the pixel hits, as measured, uniform over all modules
  and over each module's surface, digitised as straight tracks of random direction within
  37.7° of the module normal (see :class:`TrackingParams`).
* **Cluster features**: the event keeps its cells (``TrackingEvent.cell_*``) and its 8
  cluster features are computed from them by :func:`cluster_features_from_cells`, the code
  that reads real TrackML files (:mod:`pointformers.data.trackml`), so
  ``write_trackml_event`` writes the event's own cells and reading them back gives the same
  features.
* **Truth weights**: the challenge's (:mod:`.trackml_weights`): ``w_pT · w_order`` with the hits of
  each particle ranked by ``|tz − vz|``, noise and particles with < 4 pixel hits weighing 0,
  normalised to sum to 1 over the event (the challenge counts hits over the whole detector; here
  only pixel hits exist); in a φ-sector cloud, hits of particles the sector does not own weigh 0
  and the rest are renormalised to sum to 1 over the cloud (:func:`split_sectors`).

Known differences from real events (μ = 200, compared with test event 1 and HEPT's average):
about 71k pixel hits per event (mean of 8; 61k–80k) instead of the
real 57k average. Primaries at |η| < 3 leave as many hits as real ones (per primary, by |η|
bin 0–1/1–2/2–3: 4.6/4.3/7.0 hits, real 4.5/4.3/6.5), but at |η| > 3 real ones cross ≈ 4.9
of the 7 disks (here 6.1; 11.6 hits, real 9.1), and real events have fewer hits at |η| > 3
on the innermost barrel layer, whose clusters are therefore shorter (mean 9.3 cells; here
12.9). Secondaries carry ≈ 4 % of the hits instead of 2.9 % (those born inside the pixel
volume make 2.3 pixel hits each, real ones 1.2); barrel noise clusters are smaller than
real ones (2.8 cells instead of 7.3); the real end caps' Σ value per cluster spreads more
(5–95 %: 0.26–0.35 mm; here 0.300–0.306). Loopers: with pT ≥ 0.15 GeV every particle from
the beam line leaves r = 200 mm before it could turn back; secondaries and displaced
primaries born inside the barrel may cross layers inwards.

Public API: :class:`TrackingParams`, :data:`PRESETS`, :func:`preset_params`,
:func:`generate_event`, :func:`simulate_event` (hand-made particles), :func:`split_sectors`
(with :func:`sector_slope`, :func:`sector_wedges`), :func:`generate_clouds`, :func:`load_tracking_dataset`; geometry helpers
:data:`GEOMETRY`, :data:`DETECTORS_FILE`, :func:`module_table`, :func:`field_ratio`, :func:`detector_surfaces`;
simulation stages :func:`sample_particles`, :func:`transport`, :func:`module_hits`, :func:`digitise`; cells to
features :func:`cell_summary`, :func:`cluster_features_from_cells`, :func:`cluster_features`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

try:
    from scipy.spatial import cKDTree
except ModuleNotFoundError as exc:  # optional dependency: the 'tasks' extra
    raise ModuleNotFoundError("pointformers.data.tracking needs scipy: pip install 'pointformers[tasks]'",
                              name=exc.name) from exc

from .cache import (cache_path, cached_arrays, default_cache_dir, finite_param, param_error, params_from_preset,
                    resolve_generator_params, save_arrays)
from .event import CLUSTER_FEATURES, TrackingEvent, empty_event, pack_events, unpack_events
from .helix import field_ratio
from .trackml_weights import trackml_weights

#: Bump when the generator's output for given parameters changes (invalidates caches).
GENERATOR_VERSION = 4

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
#: The TrackML pixel module table shipped with the package (see ``trackml_pixel_detectors.README.md``).
DETECTORS_FILE = Path(__file__).with_name("trackml_pixel_detectors.csv")
_TABLE_COLUMNS = ("volume_id", "layer_id", "module_id", "cx", "cy", "cz", "rot_xu", "rot_xv", "rot_xw", "rot_yu",
                  "rot_yv", "rot_yw", "rot_zu", "rot_zv", "rot_zw", "module_t", "module_minhu", "module_maxhu",
                  "module_hv", "pitch_u", "pitch_v")


@dataclass(frozen=True)
class PixelGeometry:
    """Constants of the simulated TrackML pixel detector (lengths in mm, field in T).

    The modules themselves (centres, frames, active areas, pitches) come from the real module
    table :data:`DETECTORS_FILE` (:func:`module_table`). The values below are those of the
    TrackML simulation (ACTS "GenericDetectorML" and Fatras digitisation) as measured on real
    events and read in its code (see the module docstring):

    * ``module_t``, ``pitch_u``, ``pitch_v``: the table's values for every pixel module,
      used as nominal values where no table is at hand (the reader's fallback);
    * ``depth_barrel`` / ``depth_endcap``: silicon depth the clusters cross, 0.15 / 0.30 mm
      (cluster length along v ≈ depth·|tan α_v| + 1 pitch and Σ value ≈ depth/|cos α| fitted on
      a real event);
    * ``lorentz_angle_barrel``: 0.12 rad (GenericDetectorML, readout side −1): the drift
      moves barrel charge by −(w + depth/2)·tan 0.12 along u (−9 µm on average), and the hit
      position is the cells' centroid + ``depth_barrel·tan(0.12) = +0.0181 mm`` along u, the
      offset measured between real hit positions and their cells' centroids (so real barrel
      hits lie +9.2 µm from the true crossing on average; end caps: Lorentz angle 0);
    * ``envelope_r``, ``envelope_z``: leaving r > 200 mm (the pixel support tube) or
      |z| > 1550 mm (beyond the last disk at 1502.5 mm) ends the simulation of a particle.

    The field's shape is :func:`field_ratio`; the layers' material is
    :attr:`TrackingParams.x_over_x0`.
    """

    module_t: float = 0.15
    pitch_u: float = 0.05
    pitch_v: float = 0.05625
    depth_barrel: float = 0.15
    depth_endcap: float = 0.30
    lorentz_angle_barrel: float = 0.12
    envelope_r: float = 200.0
    envelope_z: float = 1550.0


GEOMETRY = PixelGeometry()


@functools.lru_cache(maxsize=1)
def _read_table() -> dict[str, np.ndarray]:
    data = np.loadtxt(DETECTORS_FILE, delimiter=",", skiprows=1, ndmin=2)
    with open(DETECTORS_FILE) as f:
        header = f.readline().strip().split(",")
    cols = {name: data[:, header.index(name)] for name in _TABLE_COLUMNS}
    t: dict[str, np.ndarray] = {k: cols[k].astype(np.int64) for k in ("volume_id", "layer_id", "module_id")}
    for k in ("cx", "cy", "cz", "module_t", "module_minhu", "module_maxhu", "module_hv", "pitch_u", "pitch_v"):
        t[k] = cols[k]
    t["rot"] = np.stack([cols[k] for k in _TABLE_COLUMNS[6:15]], 1).reshape(-1, 3, 3)
    for v in t.values():
        v.setflags(write=False)
    return t


def module_table(geo: PixelGeometry = GEOMETRY) -> dict[str, np.ndarray]:
    """Every pixel module of the TrackML detector, ``detectors.csv`` style (the shipped real table).

    Returns arrays of shape ``(m,)``, m = 4,004 — ``volume_id, layer_id, module_id`` (int64),
    ``cx, cy, cz, module_t, module_minhu, module_maxhu, module_hv, pitch_u, pitch_v`` (float64)
    — and ``rot`` ``(m, 3, 3)`` (row = global x, y, z; column = local u, v, w), read from
    :data:`DETECTORS_FILE` (TrackML's ``detectors.csv``, volumes 7, 8, 9; Amrouche et al. 2019).
    Frames are TrackML's: barrel v ∥ z, u azimuthal, w the (tilted) outward normal; end caps v
    radial, w = ±z (−z in volume 7), u = v × w. The arrays are read-only and shared; ``geo``
    is accepted for symmetry with the simulation and does not change the table.
    """
    return dict(_read_table())


@dataclass(frozen=True)
class Surfaces:
    """The ``S`` = 18 pixel layers as ideal reference surfaces (4 cylinders, then 14 disks by z).

    The transport steps from layer to layer on these surfaces and then finds the real modules
    of the layer around each crossing (:func:`module_hits`).
    """

    is_disk: np.ndarray  # (S,) bool
    value: np.ndarray  # (S,) cylinder radius or signed disk z [mm] (mean over the layer's module centres)
    volume_id: np.ndarray  # (S,) int64
    layer_id: np.ndarray  # (S,) int64
    lo: np.ndarray  # (S,) acceptance of a reference crossing: |z| range (cylinders) or r range (disks)
    hi: np.ndarray
    rows: tuple  # per surface: the module rows of the layer in module_table()


@functools.lru_cache(maxsize=4)
def detector_surfaces(geo: PixelGeometry = GEOMETRY) -> Surfaces:
    """The 18 pixel layers of :func:`module_table` as reference cylinders / disks, with TrackML ids."""
    t = module_table(geo)
    keys = sorted({(int(v), int(l)) for v, l in zip(t["volume_id"], t["layer_id"])})
    # Barrel layers (volume 8) first, then the disks in order of increasing z.
    mean_z = {k: float(np.mean(t["cz"][(t["volume_id"] == k[0]) & (t["layer_id"] == k[1])])) for k in keys}
    keys = [k for k in keys if k[0] == 8] + sorted([k for k in keys if k[0] != 8], key=mean_z.__getitem__)
    is_disk, value, lo, hi, rows = [], [], [], [], []
    r_c = np.hypot(t["cx"], t["cy"])
    reach = np.hypot(t["module_maxhu"], t["module_hv"])  # centre to corner
    for vol, lay in keys:
        m = np.flatnonzero((t["volume_id"] == vol) & (t["layer_id"] == lay))
        rows.append(m)
        disk = vol != 8
        is_disk.append(disk)
        if disk:
            value.append(float(np.mean(t["cz"][m])))
            lo.append(max(0.0, float(np.min(r_c[m] - reach[m])) - 2.0))
            hi.append(float(np.max(r_c[m] + reach[m])) + 2.0)
        else:
            value.append(float(np.mean(r_c[m])))
            lo.append(0.0)
            hi.append(float(np.max(np.abs(t["cz"][m]) + t["module_hv"][m])) + 5.0)
    return Surfaces(is_disk=np.asarray(is_disk), value=np.asarray(value), volume_id=np.asarray([k[0] for k in keys], np.int64),
                    layer_id=np.asarray([k[1] for k in keys], np.int64), lo=np.asarray(lo), hi=np.asarray(hi),
                    rows=tuple(rows))


@functools.lru_cache(maxsize=4)
def _layer_trees(geo: PixelGeometry = GEOMETRY) -> tuple:
    t = module_table(geo)
    centres = np.stack([t["cx"], t["cy"], t["cz"]], 1)
    return tuple(cKDTree(centres[rows]) for rows in detector_surfaces(geo).rows)


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


def cell_summary(cell_hit: np.ndarray, ch0: np.ndarray, ch1: np.ndarray, value: np.ndarray,
                 n_hits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per hit: cluster extents ``n_u, n_v``, number of cells and mean cell value.

    ``cell_hit`` ``(c,)``: the hit row (0 … n_hits − 1) of each cell, in any order.
    ``n_u = max ch0 − min ch0 + 1``, ``n_v = max ch1 − min ch1 + 1`` (0 for a hit without
    cells); the mean is Σ value / number of cells over the values rounded to float32 (as the
    TrackML library reads them), summed in float64 (float64 array; 0 without cells). The
    authors' pandas code sums float32 cells in float32 (a grouped sum whose rounding depends on
    the pandas version): on a real event 9 % of hits with ≥ 3 cells then differ by 1–2 float32
    ulps (≤ 1.5e-8); one- and two-cell clusters agree exactly. Used both for real files
    (:mod:`pointformers.data.trackml`) and for generated events.
    """
    if isinstance(n_hits, bool) or not isinstance(n_hits, (int, np.integer)) or n_hits < 0:
        raise ValueError(f"n_hits: expected a non-negative integer, got {n_hits!r}")
    row = np.asarray(cell_hit)
    if row.ndim != 1 or (row.size and row.dtype.kind not in "iu"):
        raise ValueError(f"cell_hit: expected a 1-D integer array, got shape {row.shape} dtype {row.dtype}")
    row = row.astype(np.int64)
    for name, a in (("ch0", ch0), ("ch1", ch1), ("value", value)):
        if np.shape(a) != row.shape:
            raise ValueError(f"{name}: expected shape {row.shape} (one per cell, like cell_hit), got {np.shape(a)}")
    if row.size and (row.min() < 0 or row.max() >= n_hits):
        raise ValueError(f"cell_hit: expected hit rows in [0, {n_hits}), got range [{row.min()}, {row.max()}]")
    n_u = np.zeros(n_hits, np.int64)
    n_v = np.zeros(n_hits, np.int64)
    count = np.zeros(n_hits, np.int64)
    mean = np.zeros(n_hits)
    if len(row) == 0:
        return n_u, n_v, count, mean
    order = np.argsort(row, kind="stable")
    r = row[order]
    c0, c1 = np.asarray(ch0, np.int64)[order], np.asarray(ch1, np.int64)[order]
    val = np.asarray(value)[order].astype(np.float32).astype(np.float64)
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    h = r[starts]
    n_u[h] = np.maximum.reduceat(c0, starts) - np.minimum.reduceat(c0, starts) + 1
    n_v[h] = np.maximum.reduceat(c1, starts) - np.minimum.reduceat(c1, starts) + 1
    count[h] = np.diff(np.r_[starts, len(r)])
    mean[h] = np.add.reduceat(val, starts) / count[h]
    return n_u, n_v, count, mean


def cluster_features_from_cells(
    cell_hit: np.ndarray, ch0: np.ndarray, ch1: np.ndarray, value: np.ndarray, n_hits: int,
    pitch_u: np.ndarray, pitch_v: np.ndarray, module_t: np.ndarray, rot: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The 8 cluster features ``(n_hits, 8)`` float32 of hits from their cells, and the cell count per hit.

    The one path from cells to features, for real TrackML files and generated events alike:
    :func:`cell_summary` per hit, then :func:`cluster_features` with ``lx = n_u·pitch_u``,
    ``ly = n_v·pitch_v``, ``lz = 2·module_t``. ``pitch_u, pitch_v, module_t`` ``(n_hits,)``
    and ``rot`` ``(n_hits, 3, 3)`` are the hits' modules' values. Hits without cells get all
    8 features 0.
    """
    n_u, n_v, count, mean = cell_summary(cell_hit, ch0, ch1, value, n_hits)
    with_cells = count > 0
    feats = cluster_features(n_u * np.asarray(pitch_u, np.float64), n_v * np.asarray(pitch_v, np.float64),
                             np.where(with_cells, 2 * np.asarray(module_t, np.float64), 0.0), mean, rot)
    feats[~with_cells] = 0.0
    return feats, count


def digitise(pos: np.ndarray, direction: np.ndarray, depth: np.ndarray, tan_lorentz: np.ndarray, hu: np.ndarray,
             hv: np.ndarray, pitch_u: np.ndarray, pitch_v: np.ndarray) -> tuple[np.ndarray, ...]:
    """Pixel cells of straight tracks through planar sensors (ACTS Fatras digitisation).

    Per hit ``(n,)``: the crossing point ``pos`` ``(n, 2)`` = (u, v) on the module mid-plane
    [mm], the unit ``direction`` ``(n, 3)`` in the module frame (u, v, w), the sensor
    ``depth`` [mm], the tangent of the Lorentz angle ``tan_lorentz`` (0 in the end caps), the
    active half sizes ``hu, hv`` and the pitches. The straight path from w = −depth/2 to
    +depth/2 is projected onto the readout plane at w = −depth/2 (readout side −1) along the
    Lorentz-tilted drift direction, i.e. a point at depth w moves by
    −(w + depth/2)·tan θ_L along u (by −depth/2·tan θ_L on average). The projected path is
    clipped to the active area and cut at the pixel boundaries; every pixel it crosses
    becomes a cell (ch0 along u from −hu, ch1 along v from −hv) whose value is the track's
    path length in that pixel [mm] (no charge fluctuation, no threshold), as
    ``DigitizationAlgorithm`` records ``(ch0, ch1, stepLength)``.

    Returns ``cell_hit (c,) int64`` (grouped by hit, cells in path order), ``ch0, ch1 (c,)
    int64``, ``value (c,) float32`` and the value-weighted centroid of the cell centres
    ``(n, 2)`` [mm] (NaN for a hit without cells).
    """
    pos = np.asarray(pos, np.float64)
    n = len(pos)
    d = np.asarray(direction, np.float64)
    if pos.shape != (n, 2):
        raise ValueError(f"pos: expected shape (n, 2), got {pos.shape}")
    if d.shape != (n, 3):
        raise ValueError(f"direction: expected shape ({n}, 3), got {d.shape}")
    depth, tan_lorentz, hu, hv, pitch_u, pitch_v = (np.broadcast_to(np.asarray(a, np.float64), (n,)).copy()
                                                     for a in (depth, tan_lorentz, hu, hv, pitch_u, pitch_v))
    for name, a in (("depth", depth), ("hu", hu), ("hv", hv), ("pitch_u", pitch_u), ("pitch_v", pitch_v)):
        if not np.all(np.isfinite(a) & (a > 0)):
            raise ValueError(f"{name}: expected finite values > 0")
    if not np.all(np.isfinite(d)) or not np.all(np.isfinite(pos)):
        raise ValueError("direction, pos: expected finite values")
    dw = np.abs(d[:, 2])
    dw = np.maximum(dw, 1e-9)
    half = 0.5 * depth / dw  # path parameter from the mid-plane to either face
    length = depth / dw  # 3D path length through the sensor
    a_u = pos[:, 0] - d[:, 0] * half
    a_v = pos[:, 1] - d[:, 1] * half
    du, dv = 2 * d[:, 0] * half, 2 * d[:, 1] * half
    # Lorentz drift: the path starts at w = -s·depth/2 and ends at +s·depth/2 (s = sign of d_w).
    s = np.where(d[:, 2] >= 0, 1.0, -1.0)
    a_u = a_u - (1 - s) * 0.5 * depth * tan_lorentz
    du = du - s * depth * tan_lorentz
    # Clip the segment a + t·(du, dv), t ∈ [0, 1], to the active rectangle (Liang–Barsky).
    t0, t1 = np.zeros(n), np.ones(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        for a, dd, h in ((a_u, du, hu), (a_v, dv, hv)):
            ta, tb = (-h - a) / dd, (h - a) / dd
            moving = dd != 0
            t0 = np.where(moving, np.maximum(t0, np.minimum(ta, tb)), np.where(np.abs(a) <= h, t0, 2.0))
            t1 = np.where(moving, np.minimum(t1, np.maximum(ta, tb)), t1)
    ok = t0 < t1
    nu = np.rint(2 * hu / pitch_u).astype(np.int64)
    nv = np.rint(2 * hv / pitch_v).astype(np.int64)

    def grid(a, dd, h, p, t):
        return (a + t * dd + h) / p

    ts, hs = [t0[ok], t1[ok]], [np.flatnonzero(ok), np.flatnonzero(ok)]
    for a, dd, h, p in ((a_u, du, hu, pitch_u), (a_v, dv, hv, pitch_v)):
        g0 = np.floor(grid(a, dd, h, p, t0)).astype(np.int64)
        g1 = np.floor(grid(a, dd, h, p, t1)).astype(np.int64)
        lo = np.minimum(g0, g1)
        k = np.where(ok, np.abs(g1 - g0), 0)
        hit = np.repeat(np.arange(n), k)
        j = lo[hit] + 1 + (np.arange(len(hit)) - np.repeat(np.cumsum(k) - k, k))  # the grid lines crossed
        with np.errstate(divide="ignore", invalid="ignore"):
            ts.append((j * p[hit] - h[hit] - a[hit]) / dd[hit])
        hs.append(hit)
    t_all, h_all = np.concatenate(ts), np.concatenate(hs)
    order = np.lexsort((t_all, h_all))
    t_all, h_all = t_all[order], h_all[order]
    same = h_all[1:] == h_all[:-1]
    ta, tb, hit = t_all[:-1][same], t_all[1:][same], h_all[:-1][same]
    seg = (tb - ta) * length[hit]
    keep = seg > 1e-9  # drop the empty pieces between coincident boundaries
    ta, tb, hit, seg = ta[keep], tb[keep], hit[keep], seg[keep]
    mid = 0.5 * (ta + tb)
    ch0 = np.clip(np.floor(grid(a_u[hit], du[hit], hu[hit], pitch_u[hit], mid)).astype(np.int64), 0, nu[hit] - 1)
    ch1 = np.clip(np.floor(grid(a_v[hit], dv[hit], hv[hit], pitch_v[hit], mid)).astype(np.int64), 0, nv[hit] - 1)
    value = seg.astype(np.float32)
    w = value.astype(np.float64)
    wsum = np.bincount(hit, w, minlength=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        cu = np.bincount(hit, w * ((ch0 + 0.5) * pitch_u[hit] - hu[hit]), minlength=n) / wsum
        cv = np.bincount(hit, w * ((ch1 + 0.5) * pitch_v[hit] - hv[hit]), minlength=n) / wsum
    centroid = np.where((wsum > 0)[:, None], np.stack([cu, cv], 1), np.nan)
    return hit.astype(np.int64), ch0, ch1, value, centroid


# ============================================================================ parameters
@dataclass(frozen=True)
class TrackingParams:
    """All knobs of the simulation and of the data set built from it.

    Every physics value is that of the TrackML simulation, with its source in
    parentheses (see the module docstring for the references):

    Attributes:
        mu: mean number of pile-up interactions per event (TrackML: 200).
        n_sectors: φ-sectors per event; each sector is one point cloud (1 = whole events).
        n_events: events in a data set (clouds = n_events · n_sectors).
        split: train/val/test fractions of the clouds (sorted by event id, then sector).
        particles_per_vertex: mean charged primaries per vertex in |η| < eta_max, before the
            ``pt_min`` cut (50; with μ = 200 this gives ≈ 10k primaries, TrackML's "about 10k
            tracks" per event, ≈ 9.2k after the cut; a complete real event has 10.8k).
        eta_max: primaries are flat in |η| < eta_max (4.0: TrackML's particle tables stop at
            |η| = 4, flat within ±10 %).
        pt_scale, pt_power: pT density ∝ pT (1 + pT/pt_scale)^-pt_power [GeV] (1.1, 7: with the
            ``pt_min`` cut, median 0.43 GeV, 18 % above 0.9 GeV; real primaries 0.437 GeV and 17 %).
        b_field: solenoid field at the centre [T] (2 T, ACTS ``--bf-value=0 0 2``), shaped
            along z by :func:`field_ratio`.
        vertex_sigma_z, vertex_sigma_xy: Gaussian vertex spread [mm] (61 and 0.014 mm,
            measured over the 174 vertices of a real event).
        hit_efficiency: probability that a module crossing leaves a cluster (1.0: Fatras
            digitisation makes one cluster per crossing, no inefficiency is simulated).
        noise_fraction: expected fraction of noise hits among all pixel hits (0.055 measured).
        noise_max_angle: noise clusters are digitised like straight tracks whose direction is
            uniform in solid angle within this angle [rad] of the module normal: 0.659
            (37.7°), the cone whose median path factor 2 / (1 + cos θmax) equals the measured
            median Σ value of end-cap noise clusters over the sensor depth, 0.335 / 0.30.
        multiple_scattering: kick the direction at each crossed layer.
        x_over_x0: material of one pixel layer at normal incidence, in radiation lengths
            (0.012: 1 mm Si-equivalent support + 0.15 mm Si module, X0(Si) = 93.7 mm;
            GenericDetectorML gives X0 = 95.7 mm for the support); a crossing
            at angle α to the layer normal sees x_over_x0 / |cos α|.
        max_turns: a particle is stopped after this many full transverse turns (a stand-in
            for the energy loss that ends real loopers).
        secondary_fraction: fraction of all particles that are secondaries (0.226 measured:
            generation ≥ 1 in a complete real particle table).
        secondary_inner_fraction: fraction of secondary vertices inside the pixel volume,
            ρ < 200 mm (0.5: their measured median ρ is 200 mm).
        pt_min: particles below this pT [GeV] are not simulated (0.1: TrackML's particle
            tables hold no particle below 0.100 GeV). ``particles_per_vertex`` counts the
            primaries before this cut.
        pt_min_hits: particles with a smaller pT [GeV] stay in the particle table but leave no
            hit (0.15: in a real event 92 % of the primaries with 0.10 < pT < 0.15 GeV have no
            hit in any detector, against 12 % at 0.15–0.2 GeV and ≤ 7 % above; gnn-tracking's
            test event 1. TrackML's simulation evidently skipped them.)
        displaced_fraction, displaced_length: fraction of the primaries that come from
            generator-level decays of neutral particles (K0s, Λ, …) and start at a transverse
            distance ~ Exp(``displaced_length`` [mm]) from their collision, along their own
            direction. 0.10 and 50 mm: in a real event 9.8 % of generation-0 particles start
            more than 0.1 mm from the beam line, 54 % of those beyond 30 mm and 16 % beyond
            100 mm (gnn-tracking's test event 1); a complete real particle table has ≈ 1 % of
            all generation-0 particles beyond 100 mm.
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
    vertex_sigma_z: float = 61.0
    vertex_sigma_xy: float = 0.014
    hit_efficiency: float = 1.0
    noise_fraction: float = 0.055
    noise_max_angle: float = 0.659
    multiple_scattering: bool = True
    x_over_x0: float = 0.012
    max_turns: float = 1.0
    secondary_fraction: float = 0.226
    secondary_inner_fraction: float = 0.5
    pt_min: float = 0.1
    pt_min_hits: float = 0.15
    displaced_fraction: float = 0.10
    displaced_length: float = 50.0
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
        for name in ("mu", "particles_per_vertex", "vertex_sigma_z", "vertex_sigma_xy", "x_over_x0", "pt_min",
                     "pt_min_hits", "displaced_length"):
            if finite(name) < 0:
                bad(name, "expected >= 0")
        for name in ("eta_max", "pt_scale", "b_field", "max_turns"):
            if finite(name) <= 0:
                bad(name, "expected > 0")
        if finite("pt_power") <= 3:
            bad("pt_power", "expected > 3 (finite mean pT)")
        for name in ("hit_efficiency", "secondary_inner_fraction", "displaced_fraction"):
            if not 0 <= finite(name) <= 1:
                bad(name, "expected a probability in [0, 1]")
        for name in ("noise_fraction", "secondary_fraction"):
            if not 0 <= finite(name) < 1:
                bad(name, "expected a fraction in [0, 1)")
        if not 0 <= finite("noise_max_angle") < math.pi / 2:
            bad("noise_max_angle", "expected an angle in [0, π/2) rad")
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


        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown TrackingParams field; valid: {sorted(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes)


#: Named parameter sets (sizes measured with generator version 3). ``tiny``: unit tests (~380
#: hits per cloud, cheap enough to generate inside every test). ``small``: CPU demo, 150 clouds
#: of ~1.5k hits (μ = 10, two φ-halves per event): the hit density in (η, φ) of μ = 10, a
#: twentieth of Tracking-6k's, so a few minutes of CPU training learn it (kNN in (η, φ) scores
#: AP@k ≈ 0.77 on it).
#: ``tracking-6k`` / ``tracking-60k``: HEPT's data sets (500 / 50 clouds; μ = 200 gives ~71k
#: hits per event, ~7.5k per Tracking-6k cloud, where real TrackML events average 57k and
#: 6.8k: see the module docstring; kNN in (η, φ) scores AP@k ≈ 0.48 on Tracking-6k clouds).
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
    """Generated particles, ``(p,)`` arrays (float64 kinematics, mm and GeV).

    ``vertex``: index of the collision the particle comes from; ``parent``: row of the
    particle a secondary comes from (-1 for primaries and hand-made particles).
    """

    vx: np.ndarray
    vy: np.ndarray
    vz: np.ndarray
    px: np.ndarray
    py: np.ndarray
    pz: np.ndarray
    q: np.ndarray
    vertex: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # vertex index
    parent: np.ndarray | None = None

    @property
    def is_secondary(self) -> np.ndarray:
        return np.zeros(len(self.q), bool) if self.parent is None else np.asarray(self.parent) >= 0


def _pt_law(params: TrackingParams, rng: np.random.Generator, n: int) -> np.ndarray:
    # Beta-prime(2, n-2) scaled by p0 has density ∝ pT (1 + pT/p0)^-n.
    return np.maximum(params.pt_scale * rng.gamma(2.0, size=n) / rng.gamma(params.pt_power - 2.0, size=n), 1e-4)


#: Material inside the pixel volume where secondaries are made: ρ [mm] and thickness in
#: nuclear interaction lengths x/λ_I at normal incidence (GenericDetectorML's material; λ_I from
#: the PDG tables: Be 421 mm, Si 465 mm): the beryllium beam pipe (r = 19 mm, 0.8 mm Be), each
#: barrel layer's 1 mm Si-equivalent support + 0.15 mm Si (vertex 1 mm outside the modules),
#: and the pixel support tube (r = 200 mm, 1.8 mm Be; vertex just inside it).
_SECONDARY_MATERIAL = ((19.0, 0.8 / 421), (33.0, 1.15 / 465), (73.0, 1.15 / 465), (117.0, 1.15 / 465),
                       (173.0, 1.15 / 465), (199.0, 1.8 / 421))


def sample_particles(params: TrackingParams, rng: np.random.Generator) -> Particles:
    """The triggered collision plus ``Poisson(mu)`` pile-up vertices, their charged primaries and secondaries.

    Primaries: ``Poisson(particles_per_vertex)`` per vertex, flat in |η| < ``eta_max`` and φ,
    charge ±1, pT from the Beta-prime law of :class:`TrackingParams` (above ``pt_min``); a
    fraction ``displaced_fraction`` starts displaced by Exp(``displaced_length``)
    transversely along its direction (decays of neutral particles).

    Secondaries (hadronic interactions in material; Fatras' are p and π±, no e±):
    ``Poisson(N_prim · f / (1 − f))`` of them, f = ``secondary_fraction``, all above
    ``pt_min``. Each vertex lies on
    a random primary's helix (field at the primary's vertex, no scattering) where it reaches
    the transverse radius ρ: with probability ``secondary_inner_fraction`` ρ is a material
    surface inside the pixel volume (:data:`_SECONDARY_MATERIAL`, chosen ∝ its x/λ_I),
    otherwise ρ is uniform in 200–1000 mm (the strip volumes: no pixel hits). Only primaries
    that reach ρ can be parents. Momentum magnitude p ~ Gamma(4, 66 MeV) (10/50/90 %
    quantiles 0.16/0.27/0.46 GeV after the pT cut; the secondaries of a real event: 0.15/0.24/
    0.45 GeV, measured on gnn-tracking's test event 1), direction isotropic (low-energy
    interaction products; real secondaries pile up at |η| < 1), charge +1 with probability
    0.73 (46 % protons, the rest π± of either sign; measured: 71 %).
    """
    # Every recorded event has its triggered collision, so no event is empty.
    n_vtx = 1 + int(rng.poisson(params.mu))
    vtx = np.stack([rng.normal(0, params.vertex_sigma_xy, n_vtx), rng.normal(0, params.vertex_sigma_xy, n_vtx),
                    rng.normal(0, params.vertex_sigma_z, n_vtx)], 1)
    mult = rng.poisson(params.particles_per_vertex, n_vtx)
    vid = np.repeat(np.arange(n_vtx), mult)
    p = len(vid)
    eta = rng.uniform(-params.eta_max, params.eta_max, p)
    phi = rng.uniform(-np.pi, np.pi, p)
    pt = _pt_law(params, rng, p)
    q = np.where(rng.random(p) < 0.5, -1, 1).astype(np.int64)
    keep = pt >= params.pt_min
    vid, eta, phi, pt, q = vid[keep], eta[keep], phi[keep], pt[keep], q[keep]
    p = len(vid)
    # Decay products of neutral particles start displaced along their direction.
    dist = np.where(rng.random(p) < params.displaced_fraction, rng.exponential(params.displaced_length, p), 0.0)
    prim = Particles(vx=vtx[vid, 0] + dist * np.cos(phi), vy=vtx[vid, 1] + dist * np.sin(phi),
                     vz=vtx[vid, 2] + dist * np.sinh(eta), px=pt * np.cos(phi), py=pt * np.sin(phi),
                     pz=pt * np.sinh(eta), q=q, vertex=vid, parent=np.full(p, -1, np.int64))
    f = params.secondary_fraction
    n_sec = int(rng.poisson(p * f / (1 - f))) if p and f > 0 else 0
    if n_sec == 0:
        return prim
    # Candidates (twice as many as needed); the first n_sec valid ones are kept.
    n_cand = 2 * n_sec + 16
    inner = rng.random(n_cand) < params.secondary_inner_fraction
    mat_r = np.array([m[0] for m in _SECONDARY_MATERIAL])
    mat_w = np.array([m[1] for m in _SECONDARY_MATERIAL])
    rho = np.where(inner, mat_r[rng.choice(len(mat_r), n_cand, p=mat_w / mat_w.sum())], rng.uniform(200.0, 1000.0, n_cand))
    # Parents: primaries whose helix reaches rho (transverse reach 2R - |vertex|).
    R = pt / (0.3 * params.b_field * field_ratio(prim.vz)) * 1000.0
    reach = 2 * R - np.hypot(prim.vx, prim.vy)
    order = np.argsort(reach)
    first = np.searchsorted(reach[order], rho, side="right")  # candidates: order[first:]
    valid = first < p
    par = order[np.minimum(first + np.floor(rng.random(n_cand) * (p - first)).astype(np.int64), p - 1)]
    # Position on the parent's helix at radius rho (first, outgoing crossing).
    h = -np.sign(params.b_field) * q[par]
    t = np.stack([prim.px[par], prim.py[par]], 1) / pt[par, None]
    perp = h[:, None] * np.stack([-t[:, 1], t[:, 0]], 1)
    xy = np.stack([prim.vx[par], prim.vy[par]], 1)
    with np.errstate(all="ignore"):
        psi = _cylinder_psi((xy ** 2).sum(1), R[par], (xy * t).sum(1), (xy * perp).sum(1), rho[:, None])[:, 0]
    valid &= np.isfinite(psi)
    psi = np.where(valid, psi, 0.0)
    pos_xy = _advance(xy, t, perp, R[par], psi)
    pos_z = prim.vz[par] + R[par] * psi * prim.pz[par] / pt[par]
    cth = rng.uniform(-1, 1, n_cand)
    sth = np.sqrt(1 - cth ** 2)
    pmag = rng.gamma(4.0, 0.066, n_cand)  # momentum magnitude [GeV]: Gamma(4, 66 MeV), median 0.24 GeV
    valid &= pmag * sth >= params.pt_min
    take = np.flatnonzero(valid)[:n_sec]
    par, cth, sth, pmag, pos_xy, pos_z = par[take], cth[take], sth[take], pmag[take], pos_xy[take], pos_z[take]
    n_sec = len(par)
    sph = rng.uniform(-np.pi, np.pi, n_sec)
    qs = np.where(rng.random(n_sec) < 0.73, 1, -1).astype(np.int64)
    cat = np.concatenate
    return Particles(vx=cat([prim.vx, pos_xy[:, 0]]), vy=cat([prim.vy, pos_xy[:, 1]]), vz=cat([prim.vz, pos_z]),
                     px=cat([prim.px, pmag * sth * np.cos(sph)]), py=cat([prim.py, pmag * sth * np.sin(sph)]),
                     pz=cat([prim.pz, pmag * cth]), q=cat([q, qs]), vertex=cat([vid, vid[par]]),
                     parent=cat([prim.parent, par]))


# ============================================================================ transport
def _cylinder_psi(p2: np.ndarray, R: np.ndarray, a: np.ndarray, b: np.ndarray, radii: np.ndarray,
                  incoming: bool = False) -> np.ndarray:
    """Turning angle ψ ∈ (0, 2π) of the first outgoing (``incoming``: inward) crossing of each radius, ``(m, k)`` (inf: none).

    With start point P0 (``|P0|² = p2``), unit direction t, a = P0·t, b = h P0·perp(t), the
    helix projection is P(ψ) = P0 + R sinψ t + R (1 - cosψ) h perp(t), so
    |P|² - |P0|² = 4R(R+b) sin²(ψ/2) + 4Ra sin(ψ/2)cos(ψ/2). Setting it to ρ² - p2 and
    dividing by cos² gives (A-E)T² + BT - E = 0 in T = tan(ψ/2), A = 1+b/R, B = a/R,
    E = (ρ² - p2)/(4R²): no cancellation for large R (straight tracks). ``radii``: ``(k,)``
    shared by all rows, or ``(m, k)``.
    """
    radii = np.asarray(radii, np.float64)
    r2 = radii[None, :] ** 2 if radii.ndim == 1 else radii ** 2
    A = (1.0 + b / R)[:, None]
    B = (a / R)[:, None]
    E = (r2 - p2[:, None]) / (4.0 * R[:, None] ** 2)
    AE = A - E
    disc = B * B + 4.0 * E * AE
    sq = np.sqrt(np.maximum(disc, 0.0))
    qq = -0.5 * (B + np.where(B >= 0, sq, -sq))
    best = np.full(E.shape, np.inf)
    for T in (qq / AE, -E / qq):
        w = np.arctan(T)
        w = np.where(w <= 0, w + np.pi, w)
        psi = 2.0 * w
        slope = A * np.sin(psi) + B * np.cos(psi)  # ∝ d|P|²/dψ
        ok = (disc >= 0) & np.isfinite(psi) & ((slope < 0) if incoming else (slope > 0))
        best = np.where(ok & (psi < best), psi, best)
    return best


def _advance(P: np.ndarray, t: np.ndarray, perp: np.ndarray, R: np.ndarray, psi: np.ndarray) -> np.ndarray:
    """Transverse position after turning by ψ, ``(m, 2)`` (perp already multiplied by h)."""
    s, hv = np.sin(psi), 2.0 * np.sin(0.5 * psi) ** 2
    return P + (R * s)[:, None] * t + (R * hv)[:, None] * perp


@dataclass
class _Crossings:
    """Crossings of the layers' reference surfaces, with the local helix there."""

    particle: np.ndarray  # (m,) particle row
    surface: np.ndarray  # (m,) surface index
    step: np.ndarray  # (m,) order along the trajectory
    pos: np.ndarray  # (m, 3) crossing point of the reference surface
    mom: np.ndarray  # (m, 3) momentum there (before the scattering kick)
    radius: np.ndarray  # (m,) helix radius R [mm] of the step that ended here
    h: np.ndarray  # (m,) turning sense (+1 counter-clockwise)


def _next_crossing(P: np.ndarray, M: np.ndarray, hq: np.ndarray, bz: np.ndarray, surf: Surfaces,
                   done: np.ndarray, turn_left: np.ndarray, geo: PixelGeometry) -> tuple[np.ndarray, ...]:
    """Nearest next reference-surface crossing of helices in a uniform field ``bz`` [T] ``(n,)``.

    Candidates are every layer's crossing (outgoing for the barrel cylinders) and the barrel
    cylinders' inward crossings (index S + j for barrel layer j; loopers). Returns the
    candidate index k, turning angle ψ (inf: none), R, t, perp, cot, h.
    """
    eps_len = 1e-6  # mm: a crossing must lie ahead of the current point
    bar = np.flatnonzero(~surf.is_disk)
    dsk = np.flatnonzero(surf.is_disk)
    radii = np.r_[surf.value[bar], geo.envelope_r]  # last one: leaving the envelope
    pt = np.hypot(M[:, 0], M[:, 1])
    R = pt / (0.3 * np.abs(bz)) * 1000.0  # mm
    h = -np.sign(bz) * hq  # +1: counter-clockwise
    t = M[:, :2] / pt[:, None]
    perp = h[:, None] * np.stack([-t[:, 1], t[:, 0]], 1)  # towards the circle centre
    cot = M[:, 2] / pt
    xy = P[:, :2]
    p2, a_, b_ = (xy ** 2).sum(1), (xy * t).sum(1), (xy * perp).sum(1)
    psi_cyl = _cylinder_psi(p2, R, a_, b_, radii)
    psi_in = _cylinder_psi(p2, R, a_, b_, radii[:-1], incoming=True)
    # Disks: z = z0 + R ψ cotθ.
    psi_dsk = (surf.value[dsk][None, :] - P[:, 2:3]) / (R * cot)[:, None]
    psi_dsk = np.where(np.isfinite(psi_dsk) & (psi_dsk * R[:, None] > eps_len), psi_dsk, np.inf)
    zlim = np.where(cot > 0, geo.envelope_z, -geo.envelope_z)
    psi_zexit = np.where(cot != 0, (zlim - P[:, 2]) / (R * cot), np.inf)
    psi_lim = np.minimum(np.minimum(psi_cyl[:, -1], psi_zexit), turn_left)
    # Acceptance of each candidate crossing (a margin around the layer's modules).
    def barrel_ok(psi_bar: np.ndarray) -> np.ndarray:
        fin = np.isfinite(psi_bar)
        zb = P[:, 2:3] + R[:, None] * np.where(fin, psi_bar, 0.0) * cot[:, None]
        return np.where(fin & (np.abs(zb) < surf.hi[bar][None, :]) & (psi_bar * R[:, None] > eps_len), psi_bar, np.inf)

    psi_bar = barrel_ok(psi_cyl[:, :-1])
    psi_in = barrel_ok(psi_in)
    fin = np.isfinite(psi_dsk)
    pd = np.where(fin, psi_dsk, 0.0)
    s_, hv_ = np.sin(pd), 2.0 * np.sin(0.5 * pd) ** 2
    xd = xy[:, 0:1] + R[:, None] * (s_ * t[:, 0:1] + hv_ * perp[:, 0:1])
    yd = xy[:, 1:2] + R[:, None] * (s_ * t[:, 1:2] + hv_ * perp[:, 1:2])
    rd = np.hypot(xd, yd)
    psi_dsk = np.where(fin & (rd > surf.lo[dsk][None, :]) & (rd < surf.hi[dsk][None, :]), psi_dsk, np.inf)
    S = len(surf.value)
    cand = np.empty((len(P), S + len(bar)))  # every layer, then the barrel layers crossed inwards
    cand[:, bar] = psi_bar
    cand[:, dsk] = psi_dsk
    cand[:, S:] = psi_in
    cand[done | (cand >= psi_lim[:, None])] = np.inf
    k = np.argmin(cand, 1)
    psi = cand[np.arange(len(P)), k]
    return k, psi, R, t, perp, cot, h


def transport(
    particles: Particles, params: TrackingParams, rng: np.random.Generator, geo: PixelGeometry = GEOMETRY
) -> _Crossings:
    """Trace every particle from layer to layer through the pixel volume.

    Each step moves every live particle along its helix to the nearest next crossing of a
    layer's reference surface (cylinder or disk; a barrel cylinder at most once outwards and
    once inwards, a disk at most once), so the Python loop runs at most 22 times. The field is Bz(z) of
    :func:`field_ratio`: each step is a helix in the field at the step's mid-point z (found
    by a first helix in the field at the start). Multiple scattering kicks the direction at
    each crossed layer. Returns the crossings with the local helix (:class:`_Crossings`);
    :func:`module_hits` turns them into module hits.
    """
    surf = detector_surfaces(geo)
    S = len(surf.value)
    bar = np.flatnonzero(~surf.is_disk)
    layer_of = np.r_[np.arange(S), bar]  # candidate index -> layer (surface) index
    C = len(layer_of)
    pos = np.stack([particles.vx, particles.vy, particles.vz], 1).astype(np.float64)
    mom = np.stack([particles.px, particles.py, particles.pz], 1).astype(np.float64)
    n = len(pos)
    charge = np.asarray(particles.q, np.float64)
    pt0 = np.hypot(mom[:, 0], mom[:, 1])
    alive = (pt0 > 0) & (pt0 >= params.pt_min_hits) & (charge != 0)
    done = np.zeros((n, C), bool)
    turn_left = np.full(n, 2.0 * np.pi * params.max_turns)
    out: list[tuple[np.ndarray, ...]] = []
    with np.errstate(all="ignore"):
        for step in range(C):
            idx = np.flatnonzero(alive)
            if len(idx) == 0:
                break
            P, M = pos[idx], mom[idx]
            b0 = params.b_field * field_ratio(P[:, 2])
            k, psi, R, t, perp, cot, h = _next_crossing(P, M, charge[idx], b0, surf, done[idx], turn_left[idx], geo)
            z_mid = np.where(np.isfinite(psi), P[:, 2] + 0.5 * R * psi * cot, P[:, 2])
            bm = params.b_field * field_ratio(z_mid)
            k, psi, R, t, perp, cot, h = _next_crossing(P, M, charge[idx], bm, surf, done[idx], turn_left[idx], geo)
            ok = np.isfinite(psi)
            alive[idx[~ok]] = False
            if not ok.any():
                break
            idx, k, psi = idx[ok], k[ok], psi[ok]
            t, perp, R, cot, M, P, h = t[ok], perp[ok], R[ok], cot[ok], M[ok], P[ok], h[ok]
            new_xy = _advance(P[:, :2], t, perp, R, psi)
            new_z = P[:, 2] + R * psi * cot
            new_t = np.cos(psi)[:, None] * t + np.sin(psi)[:, None] * perp
            pt = np.hypot(M[:, 0], M[:, 1])
            new_mom = np.column_stack([pt[:, None] * new_t, M[:, 2]])
            new_pos = np.column_stack([new_xy, new_z])
            out.append((idx, layer_of[k], np.full(len(idx), step), new_pos, new_mom.copy(), R, h))
            done[idx, k] = True
            turn_left[idx] -= psi
            if params.multiple_scattering and params.x_over_x0 > 0:
                # Path factor 1/|cos α| through the layer (normal: radial for cylinders, z for disks).
                p = np.linalg.norm(new_mom, axis=1)
                radial = (new_pos[:, 0] * new_mom[:, 0] + new_pos[:, 1] * new_mom[:, 1]) / np.hypot(new_pos[:, 0], new_pos[:, 1])
                cos_a = np.abs(np.where(surf.is_disk[layer_of[k]], new_mom[:, 2], radial)) / p
                new_mom = _scatter(new_mom, params.x_over_x0 / np.maximum(cos_a, 1e-3), rng)
            pos[idx] = new_pos
            mom[idx] = new_mom
    if not out:
        z0, f0 = np.zeros(0, np.int64), np.zeros(0)
        return _Crossings(z0, z0, z0, np.zeros((0, 3)), np.zeros((0, 3)), f0, f0)
    cols = list(zip(*out))
    return _Crossings(*(np.concatenate(c) for c in cols))


def _scatter(mom: np.ndarray, x_over_x0: np.ndarray | float, rng: np.random.Generator) -> np.ndarray:
    """Kick momentum directions ``(m, 3)`` by two Gaussian angles of RMS 13.6 MeV/p·sqrt(x/X0)."""
    p = np.linalg.norm(mom, axis=1)
    d = mom / p[:, None]
    theta0 = 0.0136 / p * np.sqrt(x_over_x0)
    e1 = np.stack([-d[:, 1], d[:, 0], np.zeros(len(d))], 1)
    e1 /= np.linalg.norm(e1, axis=1, keepdims=True)
    e2 = np.cross(d, e1)
    k1, k2 = rng.normal(size=(2, len(d))) * theta0
    d = d + k1[:, None] * e1 + k2[:, None] * e2
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return d * p[:, None]


#: Candidate modules per layer crossing (the nearest module centres to the reference-surface
#: crossing). Overlaps join at most 4 modules; 12 also catch all but ≈ 1 in 20,000 of the
#: grazing crossings far from the reference point (24 candidates find 0.01 % more hits).
_N_CANDIDATES = 12


@dataclass
class ModuleHits:
    """Crossings of real modules' active areas (one row per particle and module)."""

    particle: np.ndarray  # (m,) particle row
    module: np.ndarray  # (m,) row in module_table()
    step: np.ndarray  # (m,) order along the trajectory
    pos: np.ndarray  # (m, 3) crossing point of the module mid-plane [mm]
    mom: np.ndarray  # (m, 3) momentum there [GeV]
    local: np.ndarray  # (m, 2) crossing point (u, v) in the module frame [mm]
    direction: np.ndarray  # (m, 3) unit direction in the module frame (u, v, w)


def module_hits(cr: _Crossings, geo: PixelGeometry = GEOMETRY) -> ModuleHits:
    """Intersect the helix at each layer crossing with the planes of the layer's nearby modules.

    The crossing point of each candidate plane (module centre c, normal w) is found by
    Newton's method in the turning angle about the reference-surface crossing (the local
    helix of that step); it is a hit when it lies in the module's active area (|v| ≤ hv,
    |u| ≤ the half width at v; rectangles for the pixel modules). Overlapping modules thus
    give a particle two hits on one layer; a particle never hits a module twice.
    """
    t = module_table(geo)
    surf = detector_surfaces(geo)
    trees = _layer_trees(geo)
    cols: dict[str, list] = {k: [] for k in ("cross", "module", "psi")}
    for s in range(len(surf.value)):
        sel = np.flatnonzero(cr.surface == s)
        if not len(sel):
            continue
        rows = surf.rows[s]
        kq = min(_N_CANDIDATES, len(rows))
        _, near = trees[s].query(cr.pos[sel], k=kq)
        near = np.asarray(near).reshape(len(sel), kq)
        cols["cross"].append(np.repeat(sel, kq))
        cols["module"].append(rows[near.reshape(-1)])
    if not cols["cross"]:
        z0 = np.zeros(0, np.int64)
        return ModuleHits(z0, z0, z0, np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 2)), np.zeros((0, 3)))
    c = np.concatenate(cols["cross"])
    mod = np.concatenate(cols["module"])
    centres = np.stack([t["cx"], t["cy"], t["cz"]], 1)
    # Straight-line pre-selection (the tangent at the reference crossing): drop candidates
    # whose plane crossing lies far outside the active area (the helix departs from its
    # tangent by s²/2R, far below the 5 mm margin within the 50 mm window).
    M = cr.mom[c]
    unit = M / np.linalg.norm(M, axis=1, keepdims=True)
    rot_all = t["rot"]
    with np.errstate(all="ignore"):
        nrm = rot_all[mod, :, 2]
        rel = cr.pos[c] - centres[mod]
        lam = -np.einsum("ij,ij->i", rel, nrm) / np.einsum("ij,ij->i", unit, nrm)
        rel = rel + lam[:, None] * unit
        u0 = np.einsum("ij,ij->i", rel, rot_all[mod, :, 0])
        v0 = np.einsum("ij,ij->i", rel, rot_all[mod, :, 1])
        near = ((np.abs(lam) < 60.0) & (np.abs(u0) < t["module_maxhu"][mod] + 5.0)
                & (np.abs(v0) < t["module_hv"][mod] + 5.0))
    c, mod = c[near], mod[near]
    P, M, R = cr.pos[c], cr.mom[c], cr.radius[c]
    pt = np.hypot(M[:, 0], M[:, 1])
    tt = M[:, :2] / pt[:, None]
    perp = cr.h[c][:, None] * np.stack([-tt[:, 1], tt[:, 0]], 1)
    cot = M[:, 2] / pt
    rot = rot_all[mod]
    nrm = rot[:, :, 2]
    centre = centres[mod]
    d0 = np.einsum("ij,ij->i", P - centre, nrm)
    nt = np.einsum("ij,ij->i", tt, nrm[:, :2])  # n·t, n·perp: the plane equation in ψ
    npp = np.einsum("ij,ij->i", perp, nrm[:, :2])
    nz = nrm[:, 2] * cot
    psi = np.zeros(len(c))
    with np.errstate(all="ignore"):
        for _ in range(5):
            s_, hv_ = np.sin(psi), 2.0 * np.sin(0.5 * psi) ** 2
            f = d0 + R * (s_ * nt + hv_ * npp + psi * nz)
            psi = psi - f / (R * (np.cos(psi) * nt + s_ * npp + nz))
        s_, hv_ = np.sin(psi), 2.0 * np.sin(0.5 * psi) ** 2
        X = P + np.column_stack([R[:, None] * (s_[:, None] * tt + hv_[:, None] * perp), R * psi * cot])
        rel = X - centre
        u = np.einsum("ij,ij->i", rel, rot[:, :, 0])
        v = np.einsum("ij,ij->i", rel, rot[:, :, 1])
        w = np.einsum("ij,ij->i", rel, nrm)
        hv = t["module_hv"][mod]
        hu = t["module_minhu"][mod] + (t["module_maxhu"][mod] - t["module_minhu"][mod]) * (v + hv) / (2 * hv)
        # The plane lies within a few mm of the reference surface: reject far roots.
        ok = np.isfinite(psi) & (np.abs(w) < 1e-6) & (np.abs(R * psi) < 50.0) & (np.abs(u) <= hu) & (np.abs(v) <= hv)
    # A particle crossing a layer inwards and outwards may meet one module twice: keep the first.
    okc = np.flatnonzero(ok)
    order = okc[np.lexsort((cr.step[c[okc]], mod[okc], cr.particle[c[okc]]))]
    pm = np.stack([cr.particle[c[order]], mod[order]], 1)
    first = np.r_[True, (pm[1:] != pm[:-1]).any(1)]
    ok = np.zeros(len(ok), bool)
    ok[order[first]] = True
    c, mod, psi, X, u, v, rot = c[ok], mod[ok], psi[ok], X[ok], u[ok], v[ok], rot[ok]
    tt, perp, pt = tt[ok], perp[ok], pt[ok]
    d2 = np.cos(psi)[:, None] * tt + np.sin(psi)[:, None] * perp
    mom = np.column_stack([pt[:, None] * d2, cr.mom[c, 2]])
    unit = mom / np.linalg.norm(mom, axis=1, keepdims=True)
    direction = np.einsum("nij,ni->nj", rot, unit)
    return ModuleHits(particle=cr.particle[c], module=mod, step=cr.step[c], pos=X, mom=mom,
                      local=np.stack([u, v], 1), direction=direction)


# ============================================================================ events
def _noise_hits(n_noise: int, params: TrackingParams, rng: np.random.Generator,
                geo: PixelGeometry) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Module rows, local positions ``(n, 2)`` and local directions ``(n, 3)`` of noise hits.

    Uniform over all modules (so the count per layer scales with its module count, as
    measured) and uniform over each module's active area; the direction is uniform in solid
    angle within ``noise_max_angle`` of the module normal.
    """
    t = module_table(geo)
    mod = rng.integers(0, len(t["module_id"]), n_noise)
    hv = t["module_hv"][mod]
    v = rng.uniform(-1, 1, n_noise) * hv
    hu = t["module_minhu"][mod] + (t["module_maxhu"][mod] - t["module_minhu"][mod]) * (v + hv) / (2 * hv)
    u = rng.uniform(-1, 1, n_noise) * hu
    cw = rng.uniform(math.cos(params.noise_max_angle), 1.0, n_noise)
    az = rng.uniform(-np.pi, np.pi, n_noise)
    sw = np.sqrt(1 - cw ** 2)
    return mod, np.stack([u, v], 1), np.stack([sw * np.cos(az), sw * np.sin(az), cw], 1)


def simulate_event(
    particles: Particles,
    params: TrackingParams,
    rng: np.random.Generator,
    event_id: int = 0,
    geo: PixelGeometry = GEOMETRY,
) -> TrackingEvent:
    """Detector response (module hits, pixel cells, noise, cluster features, truth) to given particles.

    Use this with hand-made :class:`Particles` (e.g. one 10 GeV track); :func:`generate_event`
    samples the particles first. The event carries its pixel cells (``cell_*``) and its
    cluster features are computed from them by :func:`cluster_features_from_cells`, the code
    that reads real TrackML files.
    """
    t = module_table(geo)
    mh = module_hits(transport(particles, params, rng, geo), geo)
    if params.hit_efficiency < 1:
        keep = rng.random(len(mh.particle)) < params.hit_efficiency
        mh = ModuleHits(*(getattr(mh, f.name)[keep] for f in dataclasses.fields(ModuleHits)))
    m = len(mh.particle)
    n_noise = int(rng.poisson(params.noise_fraction / (1 - params.noise_fraction) * m)) if m else 0
    nmod, nloc, ndir = _noise_hits(n_noise, params, rng, geo)

    mod = np.r_[mh.module, nmod].astype(np.int64)
    local = np.r_[mh.local, nloc]
    direction = np.r_[mh.direction, ndir]
    barrel = t["volume_id"][mod] == 8
    depth = np.where(barrel, geo.depth_barrel, geo.depth_endcap)
    tan_lorentz = np.where(barrel, math.tan(geo.lorentz_angle_barrel), 0.0)
    cell_hit, ch0, ch1, value, centroid = digitise(
        local, direction, depth, tan_lorentz, t["module_maxhu"][mod], t["module_hv"][mod], t["pitch_u"][mod],
        t["pitch_v"][mod])
    # The reconstructed position corrects the centroid by the full-depth Lorentz shift
    # depth·tan θ_L = +0.0181 mm along u in the barrel (hit − centroid measured on real hits).
    centroid[:, 0] += depth * tan_lorentz
    # A crossing whose drifted path leaves the active area gives no cluster, hence no hit.
    has = np.isfinite(centroid[:, 0])
    rot = t["rot"][mod]
    centre = np.stack([t["cx"][mod], t["cy"][mod], t["cz"][mod]], 1)
    xyz = centre + rot[:, :, 0] * centroid[:, :1] + rot[:, :, 1] * centroid[:, 1:2]
    noise_true = centre + rot[:, :, 0] * local[:, :1] + rot[:, :, 1] * local[:, 1:2]
    true_pos = np.r_[mh.pos, noise_true[m:]]
    true_mom = np.r_[mh.mom, np.zeros((n_noise, 3))]
    pidx = np.r_[mh.particle, np.full(n_noise, -1)].astype(np.int64)
    step = np.r_[mh.step, np.zeros(n_noise, np.int64)]
    real = np.arange(len(mod)) < m

    # TrackML-like hit order: by volume, layer, module (random within a module); hits without cells dropped.
    order = np.lexsort((rng.random(len(mod)), t["module_id"][mod], t["layer_id"][mod], t["volume_id"][mod]))
    order = order[has[order]]
    new_row = np.full(len(mod), -1, np.int64)
    new_row[order] = np.arange(len(order))
    c_new = new_row[cell_hit]
    c_order = np.argsort(c_new, kind="stable")  # grouped by new hit row, path order kept within a hit
    c_order = c_order[c_new[c_order] >= 0]
    cell_hit, ch0, ch1, value = c_new[c_order], ch0[c_order], ch1[c_order], value[c_order]
    mod, pidx, xyz, true_pos, true_mom, step, real = (a[order] for a in (mod, pidx, xyz, true_pos, true_mom, step, real))
    n = len(order)
    cells, _ = cluster_features_from_cells(cell_hit, ch0, ch1, value, n, t["pitch_u"][mod], t["pitch_v"][mod],
                                           t["module_t"][mod], t["rot"][mod])

    # Particle table and truth weights.
    p_pt = np.hypot(particles.px, particles.py)
    weight = np.zeros(n)
    # the challenge's weights: hits ranked by |tz − vz| (the truth position along z from the vertex)
    weight[real] = trackml_weights(pidx[real] + 1, p_pt[pidx[real]],
                                   np.abs(true_pos[real, 2] - particles.vz[pidx[real]]))
    n_particles = len(particles.q)
    nhits = np.bincount(pidx[real], minlength=n_particles).astype(np.int64)
    f32 = np.float32
    pid = np.where(pidx >= 0, pidx + 1, 0)
    return TrackingEvent(
        hit_id=np.arange(1, n + 1, dtype=np.int64),
        x=xyz[:, 0].astype(f32), y=xyz[:, 1].astype(f32), z=xyz[:, 2].astype(f32),
        volume_id=t["volume_id"][mod], layer_id=t["layer_id"][mod], module_id=t["module_id"][mod],
        cells=cells, particle_id=pid.astype(np.int64), weight=weight.astype(f32),
        particles_id=np.arange(1, n_particles + 1, dtype=np.int64),
        vx=particles.vx.astype(f32), vy=particles.vy.astype(f32), vz=particles.vz.astype(f32),
        px=particles.px.astype(f32), py=particles.py.astype(f32), pz=particles.pz.astype(f32),
        q=np.asarray(particles.q, np.int64), nhits=nhits, event_id=int(event_id), sector=-1,
        tx=true_pos[:, 0].astype(f32), ty=true_pos[:, 1].astype(f32), tz=true_pos[:, 2].astype(f32),
        tpx=true_mom[:, 0].astype(f32), tpy=true_mom[:, 1].astype(f32), tpz=true_mom[:, 2].astype(f32),
        cell_hit=cell_hit.astype(np.int32), cell_ch0=ch0.astype(np.int32), cell_ch1=ch1.astype(np.int32),
        cell_value=value,
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


def event_with_hits(n: int, seed: int = 0, preset: str = "tracking-60k") -> tuple[TrackingEvent, float]:
    """A generated ``preset`` event with at least ``n`` hits (benchmark inputs of a chosen size)
    and the pile-up μ it was generated with.

    The pile-up starts at μ = max(5, 200·n/50000) (μ = 200 gives about 50k hits) and grows by
    30 % until the event is large enough; deterministic in (n, seed, preset).
    """
    mu = max(5.0, 200.0 * n / 50000)
    ev = generate_event(preset_params(preset, mu=mu), seed=seed)
    while ev.num_hits < n:
        mu *= 1.3
        ev = generate_event(preset_params(preset, mu=mu), seed=seed)
    return ev, mu


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
    "CLUSTER_FEATURES", "DETECTORS_FILE", "GENERATOR_VERSION", "GEOMETRY", "PRESETS", "SPLITS", "ModuleHits", "Particles",
    "PixelGeometry", "TrackingParams", "cell_summary", "cluster_features", "cluster_features_from_cells",
    "detector_surfaces", "digitise", "empty_event", "event_with_hits", "field_ratio", "generate_clouds", "generate_event",
    "load_tracking_dataset", "module_hits", "module_table", "preset_params", "resolve_params", "sample_particles",
    "simulate_event", "split_ranges", "split_sectors", "transport",
    "SECTOR_DI", "SECTOR_DS", "SECTOR_SLOPES", "sector_slope", "sector_wedges",
]
