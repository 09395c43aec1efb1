"""Physics and bookkeeping tests of the TrackML-like detector simulation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from pointformers.data import tracking as trk
from pointformers.data.event import CLUSTER_FEATURES, TrackingEvent, pack_events, unpack_events
from pointformers.data.tracking import (
    Particles,
    TrackingParams,
    generate_clouds,
    generate_event,
    load_tracking_dataset,
    preset_params,
    simulate_event,
    split_sectors,
)

BARREL_R = {2: 32.0, 4: 72.0, 6: 116.0, 8: 172.0}
DISK_Z = (600.0, 700.0, 820.0, 960.0, 1100.0, 1300.0, 1500.0)
IDEAL = TrackingParams(multiple_scattering=False, hit_efficiency=1.0, noise_fraction=0.0, secondary_fraction=0.0,
                       pt_min_hits=0.0)


def feature(ev: TrackingEvent, name: str) -> np.ndarray:
    return ev.cells[:, CLUSTER_FEATURES.index(name)].astype(np.float64)


def one_track(pt: float, eta: float, q: int, phi: float = 1.0, vz: float = 5.0, n: int = 1) -> Particles:
    """``n`` identical particles from (0.01, -0.01, vz)."""
    ones = np.ones(n)
    return Particles(vx=0.01 * ones, vy=-0.01 * ones, vz=vz * ones, px=pt * np.cos(phi) * ones,
                     py=pt * np.sin(phi) * ones, pz=pt * np.sinh(eta) * ones, q=np.full(n, q))


def fit_circle(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Algebraic circle fit: centre (xc, yc), radius."""
    A = np.c_[x, y, np.ones_like(x)]
    c = np.linalg.lstsq(A, x ** 2 + y ** 2, rcond=None)[0]
    xc, yc = c[0] / 2, c[1] / 2
    return xc, yc, float(np.sqrt(c[2] + xc ** 2 + yc ** 2))


@pytest.fixture(scope="module")
def event20() -> TrackingEvent:
    return generate_event(TrackingParams(mu=20), seed=11)


@pytest.fixture(scope="module")
def event200() -> TrackingEvent:
    return generate_event(preset_params("tracking-60k"), seed=3)


# ---------------------------------------------------------------- geometry of the hits
def module_rows(ev: TrackingEvent) -> np.ndarray:
    t = trk.module_table()
    key = lambda v, l, m: (np.asarray(v) * 100 + np.asarray(l)) * 10_000_000 + np.asarray(m)  # noqa: E731
    tk = key(t["volume_id"], t["layer_id"], t["module_id"])
    order = np.argsort(tk)
    row = order[np.searchsorted(tk[order], key(ev.volume_id, ev.layer_id, ev.module_id))]
    assert np.array_equal(tk[row], key(ev.volume_id, ev.layer_id, ev.module_id))
    return row


def local_coords(ev: TrackingEvent, x, y, z) -> np.ndarray:
    """(u, v, w) of points in their hit's module frame [mm], ``(n, 3)``."""
    t = trk.module_table()
    row = module_rows(ev)
    rel = np.stack([x, y, z], 1).astype(np.float64) - np.stack([t["cx"], t["cy"], t["cz"]], 1)[row]
    return np.einsum("nij,ni->nj", t["rot"][row], rel)


def test_the_real_pixel_modules_are_simulated(event20: TrackingEvent) -> None:
    t = trk.module_table()
    assert len(t["module_id"]) == 4004 and np.all(t["module_maxhu"] == 8.4) and np.all(t["module_hv"] == 36.0)
    ev = event20
    # Hits (cluster centroids) and true crossings lie on their module's mid-plane, in its active area.
    for pts, tol in (((ev.x, ev.y, ev.z), 2e-3), ((ev.tx, ev.ty, ev.tz), 2e-3)):
        loc = local_coords(ev, *pts)
        real = ev.particle_id > 0
        assert np.abs(loc[real, 2]).max() < tol
        assert np.all(np.abs(loc[:, 0]) <= 8.4 + 1e-3) and np.all(np.abs(loc[:, 1]) <= 36.0 + 1e-3)
    assert set(np.unique(ev.volume_id).tolist()) == {7, 8, 9}
    # Barrel radii and disk positions of the real detector.
    r = np.hypot(ev.tx, ev.ty)
    for layer, radius in BARREL_R.items():
        m = (ev.volume_id == 8) & (ev.layer_id == layer)
        assert np.all(np.abs(r[m] - radius) < 3.0)
    disk = ev.volume_id != 8
    zz = np.where(ev.volume_id == 9, np.array(DISK_Z)[(ev.layer_id // 2 - 1).clip(0, 6)],
                  -np.array(DISK_Z)[::-1][(ev.layer_id // 2 - 1).clip(0, 6)])
    assert np.all(np.abs(ev.tz[disk] - zz[disk]) < 3.0)
    # Hit − truth as measured on real hits: end caps σu = 13.4 µm, σv = 9.0 µm, centred; barrel
    # σu = 6.2 µm around +9.2 µm (half the Lorentz shift 0.15·tan 0.12), σv = 12.1 µm.
    d = local_coords(ev, ev.x, ev.y, ev.z) - local_coords(ev, ev.tx, ev.ty, ev.tz)
    real = ev.particle_id > 0
    barrel = real & (ev.volume_id == 8)
    endcap = real & (ev.volume_id != 8)
    assert np.mean(d[barrel, 0]) == pytest.approx(0.0092, abs=0.002)
    assert abs(np.mean(d[endcap, 0])) < 0.002
    # (spreads: pixel quantisation, 0.05 / √12 = 14 µm at most for one-pixel-wide clusters)
    for m in (barrel, endcap):
        assert 0.003 < np.std(d[m, 0]) < 0.018 and 0.003 < np.std(d[m, 1]) < 0.018
    # The hit is its cells' value-weighted centroid, + 0.15·tan 0.12 = 0.0181 mm along u in the barrel.
    t = trk.module_table()
    row = module_rows(ev)
    w = ev.cell_value.astype(np.float64)
    cu = (np.bincount(ev.cell_hit, w * ((ev.cell_ch0 + 0.5) * 0.05 - 8.4)[...], minlength=ev.num_hits)
          / np.bincount(ev.cell_hit, w, minlength=ev.num_hits))
    hu = local_coords(ev, ev.x, ev.y, ev.z)[:, 0]
    shift = np.where(ev.volume_id == 8, 0.15 * np.tan(0.12), 0.0)
    np.testing.assert_allclose(hu - cu, shift, atol=2e-4)  # float32 positions
    assert len(t["module_id"]) == 4004 and row.shape == (ev.num_hits,)


def test_field_falls_along_z() -> None:
    assert trk.field_ratio(0.0) == pytest.approx(1.002)
    assert trk.field_ratio(1500.0) == pytest.approx(0.885, abs=0.001)
    assert trk.field_ratio(-1500.0) == pytest.approx(0.918, abs=0.001)


def test_ten_gev_track_is_a_helix_of_the_right_radius() -> None:
    pt = 10.0
    expected = pt / (0.3 * 2.0) * 1000.0  # mm
    for q in (+1, -1):
        ev = simulate_event(one_track(pt, 0.3, q), IDEAL, np.random.default_rng(0))
        assert set(ev.layer_id.tolist()) == {2, 4, 6, 8} and np.all(ev.volume_id == 8)
        xc, yc, R = fit_circle(ev.tx.astype(np.float64), ev.ty.astype(np.float64))
        assert abs(R / expected * trk.field_ratio(np.mean(ev.tz)) - 1) < 0.02
        # Positive tracks bend clockwise in +B: the centre lies to the right of the direction.
        side = np.cos(1.0) * yc - np.sin(1.0) * xc
        assert np.sign(side) == -q


def test_forward_track_disk_crossings_follow_straight_line_in_s_z() -> None:
    eta, pt = 2.8, 10.0
    ev = simulate_event(one_track(pt, eta, +1), IDEAL, np.random.default_rng(0))
    disk = ev.volume_id == 9
    assert disk.sum() >= 4
    R = pt / 0.6 * 1000.0
    # Transverse arc length from the vertex (≈ origin) to each hit.
    s = 2 * R * np.arcsin(np.hypot(ev.tx, ev.ty).astype(np.float64) / (2 * R))
    slope = np.polyfit(s, ev.tz.astype(np.float64), 1)[0]
    assert slope == pytest.approx(np.sinh(eta), rel=1e-3)


def test_low_pt_particles_curl_before_outer_layers() -> None:
    # 2R = 66.7 mm < 72 mm: reaches r = 32 only.
    ev = simulate_event(one_track(0.02, 0.0, -1, vz=0.0), IDEAL, np.random.default_rng(0))
    assert set(ev.layer_id.tolist()) == {2} and np.all(ev.volume_id == 8)
    # 2R = 100 mm: reaches 32 and 72, not 116.
    ev = simulate_event(one_track(0.03, 0.0, +1, vz=0.0), IDEAL, np.random.default_rng(0))
    assert set(ev.layer_id.tolist()) == {2, 4}


def test_no_hit_beyond_twice_the_radius_without_scattering() -> None:
    ev = generate_event(TrackingParams(mu=20, multiple_scattering=False, pt_min=0.0, pt_min_hits=0.0), seed=5)  # curlers
    real = ev.particle_id > 0
    idx = ev.hit_particle_index[real]
    b_min = 2.0 * trk.field_ratio(1550.0)  # the weakest field in the pixel volume
    reach = 2 * ev.pt / (0.3 * b_min) * 1000 + np.hypot(ev.vx, ev.vy)  # max transverse radius of each helix
    true_r = np.hypot(ev.tx, ev.ty)[real]
    assert np.all(true_r <= reach[idx] * (1 + 1e-5) + 1e-3)
    curlers = reach < 72.0
    assert curlers.sum() > 0
    of_curlers = np.isin(ev.particle_id, ev.particles_id[curlers])
    assert not np.any(of_curlers & (ev.volume_id == 8) & (ev.layer_id >= 4))  # never on r >= 72
    assert np.all(np.hypot(ev.tx, ev.ty)[of_curlers] < 72.0)


def test_module_overlaps_give_same_layer_duplicates(event200: TrackingEvent) -> None:
    ev = event200
    real = ev.particle_id > 0
    # A particle never hits one module twice ...
    mods = np.stack([ev.particle_id[real], ev.layer_index[real], ev.module_id[real]], 1)
    assert len(np.unique(mods, axis=0)) == len(mods)
    # ... but overlapping modules give it a 2nd hit on a layer: 29 % of real non-noise pixel hits
    # (barrel 19 %, end caps 37–39 %).
    def dup_share(m):
        pairs = np.stack([ev.particle_id[m], ev.layer_index[m]], 1)
        return 1 - len(np.unique(pairs, axis=0)) / len(pairs)
    assert 0.22 < dup_share(real) < 0.38
    assert 0.14 < dup_share(real & (ev.volume_id == 8)) < 0.26
    assert 0.30 < dup_share(real & (ev.volume_id != 8)) < 0.46
    assert np.array_equal(np.bincount(ev.hit_particle_index[real], minlength=ev.num_particles), ev.nhits)


def test_multiple_scattering_kick_has_the_highland_rms() -> None:
    params = TrackingParams(multiple_scattering=True, hit_efficiency=1.0, noise_fraction=0.0)
    p = 1.0  # GeV, at η = 0 so pT = p
    ev = simulate_event(one_track(p, 0.0, +1, vz=0.0, n=3000), params, np.random.default_rng(1))
    # A helix keeps the polar angle: its change between layers 1 and 2 is the scattering kick.
    theta = np.arctan2(np.hypot(ev.tpx, ev.tpy), ev.tpz).astype(np.float64)
    order = np.lexsort((ev.layer_id, ev.particle_id))
    pid, lay, th = ev.particle_id[order], ev.layer_id[order], theta[order]
    first = (lay[:-1] == 2) & (lay[1:] == 4) & (pid[:-1] == pid[1:])  # last layer-2 hit, first layer-4 hit
    dtheta = th[1:][first] - th[:-1][first]
    expected = 0.0136 / p * np.sqrt(0.012)  # x/X0 of one layer at normal incidence
    assert np.std(dtheta) == pytest.approx(expected, rel=0.1)
    # Scattering changes directions, never the momentum magnitude.
    assert np.allclose(np.sqrt(ev.tpx ** 2 + ev.tpy ** 2 + ev.tpz ** 2), p, rtol=1e-5)


# ---------------------------------------------------------------- rates and sizes
def test_noise_fraction_and_weights(event200: TrackingEvent) -> None:
    ev = event200
    noise = ev.particle_id == 0
    assert 0.045 < noise.mean() < 0.065  # 5.5 % of real pixel hits
    assert np.all(ev.weight[noise] == 0)
    assert ev.weight.astype(np.float64).sum() == pytest.approx(1.0, abs=1e-4)
    assert np.all(ev.cells[noise, CLUSTER_FEATURES.index("lx")] > 0)
    # Particles with fewer than 4 hits get no weight (TrackML convention).
    few = ev.per_hit(ev.nhits, 0) < 4
    assert np.all(ev.weight[few & ~noise] == 0) and np.all(ev.weight[~few & ~noise] > 0)


def test_hit_counts_scale_with_mu(event200: TrackingEvent) -> None:
    # TrackML pixel: ~57k at mu = 200; this simulation gives ~80k (more hits per forward particle).
    assert 55_000 < event200.num_hits < 110_000
    n20 = [generate_event(TrackingParams(mu=20), seed=s).num_hits for s in range(4)]
    assert 5_500 < np.mean(n20) < 11_000
    # mu counts pile-up on top of the triggered collision: mu = 0 still has one vertex.
    n0 = [generate_event(TrackingParams(mu=0), seed=s).num_hits for s in range(10)]
    assert 100 < np.mean(n0) < 600 and min(n0) > 0


def test_pt_spectrum_is_soft(event200: TrackingEvent) -> None:
    pt = event200.pt
    assert np.median(pt) < 1.0
    assert 0.10 < np.mean(pt > 0.9) < 0.20
    assert pt.max() > 5.0  # power-law tail
    assert 9_000 < event200.num_particles < 16_000  # ~46 primaries per vertex at mu = 200, + 22.6 % secondaries
    assert pt.min() >= 0.1  # TrackML's particle tables stop at 0.1 GeV
    # Below 0.15 GeV a particle leaves no hit (as 92 % of real ones between 0.10 and 0.15 GeV).
    assert np.all(event200.nhits[pt < 0.15] == 0) and np.mean(event200.nhits[pt >= 0.15] > 0) > 0.8
    assert set(np.unique(event200.q)) == {-1, 1}


def test_seeded_reproducibility() -> None:
    p = preset_params("tiny")
    a, b, c = generate_event(p, seed=7), generate_event(p, seed=7), generate_event(p, seed=8)
    for name in ("x", "y", "z", "cells", "particle_id", "weight", "module_id", "px", "vz", "nhits", "tpx"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.num_hits != c.num_hits or not np.array_equal(a.x, c.x)
    d = generate_event(p, seed=7, event_id=1)
    assert d.num_hits != a.num_hits or not np.array_equal(a.x, d.x)


@pytest.mark.parametrize("name, lo, hi", [("tiny", 100, 1000), ("small", 1000, 3000), ("tracking-6k", 6000, 11000)])
def test_preset_cloud_sizes(name: str, lo: int, hi: int) -> None:
    p = preset_params(name)
    clouds = split_sectors(generate_event(p, seed=0), p.n_sectors)
    sizes = np.array([c.num_hits for c in clouds])
    assert lo < sizes.mean() < hi
    if name != "tiny":
        n_good = [len(np.unique(c.particle_id[c.reconstructable & (c.hit_pt > 0.9)])) for c in clouds]
        assert min(n_good) >= 15


# ---------------------------------------------------------------- cluster features
def test_cluster_features_follow_the_crossing_angle(event200: TrackingEvent) -> None:
    ev = event200
    real = ev.particle_id > 0
    barrel = real & (ev.volume_id == 8)
    # Barrel: the path projected on z (ly) grows with |sinh η|, leta falls with it.
    assert spearmanr(feature(ev, "ly")[barrel], np.abs(np.sinh(ev.eta[barrel]))).correlation > 0.7
    assert spearmanr(feature(ev, "leta")[barrel], np.abs(ev.eta[barrel])).correlation < -0.7
    # Outer barrel: the cluster width in u (lx) follows the signed curvature q/pT, not 1/pT: the
    # modules' 0.14 rad tilt and the Lorentz drift add to one charge's crossing angle and
    # cancel the other's (real TrackML event: Spearman 0.67 with q/pT, −0.01 with 1/pT).
    outer = barrel & (ev.layer_id == 8)
    q = ev.per_hit(ev.q, 0)[outer]
    assert spearmanr(feature(ev, "lx")[outer], q / ev.hit_pt[outer]).correlation > 0.5
    # lz = 2·module_t = 0.30 mm for every TrackML pixel module.
    assert np.all(ev.cells[:, CLUSTER_FEATURES.index("lz")] == np.float32(0.30))
    # charge_frac is a mean cell value (path length per pixel, mm), not a fraction.
    cf = feature(ev, "charge_frac")
    assert np.all((cf > 0) & (cf < 0.45))
    assert 0.03 < np.median(cf[barrel]) < 0.08  # TrackML barrel: median cell value 0.055 mm
    # End caps: half the clusters are one cell (value ≈ 0.30), most others two; real median 0.23.
    assert 0.14 < np.median(cf[real & ~barrel]) <= 0.31
    assert np.all(np.isfinite(ev.cells))


def test_cells_per_hit_and_values_match_real_clusters(event200: TrackingEvent) -> None:
    """Cells per hit and value per cell against real TrackML clusters (measured on test event 1, see the generator)."""
    ev = event200
    real = ev.particle_id > 0
    n_cells = np.bincount(ev.cell_hit, minlength=ev.num_hits)
    total = np.bincount(ev.cell_hit, ev.cell_value.astype(np.float64), minlength=ev.num_hits)
    barrel = ev.volume_id == 8
    assert np.all(n_cells >= 1)
    # End caps: mean 1.7–1.8 cells, P(1) ≈ 0.5, Σ value ≈ depth 0.30 mm.
    nc = n_cells[real & ~barrel]
    assert 1.4 < nc.mean() < 2.1 and 0.4 < np.mean(nc == 1) < 0.6
    assert 0.28 < np.median(total[real & ~barrel]) < 0.33
    # Barrel: mean 7.0 cells (median 5), Σ value median 0.25, cell value median 0.055.
    nc = n_cells[real & barrel]
    assert 5.0 < nc.mean() < 10.0 and 4 <= np.median(nc) <= 7
    assert 0.2 < np.median(total[real & barrel]) < 0.32
    cb = barrel[ev.cell_hit] & real[ev.cell_hit]
    assert 0.04 < np.median(ev.cell_value[cb]) < 0.07
    # Noise: random-direction tracks, larger and fainter than real end-cap clusters.
    ne = ~real & ~barrel
    assert n_cells[ne].mean() > 3.0 and 0.30 < np.median(total[ne]) < 0.37


# ---------------------------------------------------------------- event bookkeeping
def hand_event() -> TrackingEvent:
    # particle 1: 3 distinct layers; 2: 4 hits on 2 layers; 3: 2 layers; noise.
    pid = np.array([1, 1, 1, 2, 2, 2, 2, 3, 3, 0])
    vol = np.array([8, 8, 9, 8, 8, 8, 8, 8, 8, 8])
    lay = np.array([2, 4, 2, 2, 2, 4, 4, 2, 4, 6])
    n, p = len(pid), 3
    f = np.zeros(n, np.float32)
    return TrackingEvent(
        hit_id=np.arange(1, n + 1), x=np.arange(n, dtype=np.float32), y=f, z=f, volume_id=vol, layer_id=lay,
        module_id=np.ones(n, np.int64), cells=np.zeros((n, 8), np.float32), particle_id=pid, weight=f,
        particles_id=np.array([3, 1, 2]), vx=np.zeros(p, np.float32), vy=np.zeros(p, np.float32),
        vz=np.zeros(p, np.float32), px=np.array([0.5, 1.0, 2.0], np.float32), py=np.zeros(p, np.float32),
        pz=np.zeros(p, np.float32), q=np.ones(p, np.int64), nhits=np.array([2, 3, 4]),
    )


def test_reconstructable_matches_hand_made_event() -> None:
    ev = hand_event()
    assert ev.reconstructable.tolist() == [True] * 3 + [False] * 7
    assert ev.hit_pt.tolist() == [1.0] * 3 + [2.0] * 4 + [0.5] * 2 + [0.0]


def test_subset_when_hits_equal_particles() -> None:
    ev = hand_event().subset(np.arange(3))  # 3 hits, 3 particles
    assert ev.num_hits == ev.num_particles == 3
    sub = ev.subset(np.array([True, False, True]))
    assert sub.num_hits == 2 and sub.num_particles == 3
    assert sub.particles_id.tolist() == [3, 1, 2]
    sub = ev.subset(np.array([True, False, True]), np.array([False, True, False]), sector=4)
    assert sub.particles_id.tolist() == [1] and sub.sector == 4
    with pytest.raises(ValueError, match="cells"):
        TrackingEvent(**{**{k: getattr(ev, k) for k in ev.__dataclass_fields__}, "cells": np.zeros((3, 7))})


def test_pack_unpack_round_trip() -> None:
    clouds = generate_clouds("tiny", n_events=2, seed=1)
    back = unpack_events(pack_events(clouds))
    assert len(back) == len(clouds)
    for a, b in zip(clouds, back):
        assert (a.event_id, a.sector) == (b.event_id, b.sector)
        for name in ("hit_id", "x", "cells", "particle_id", "particles_id", "nhits", "tz", "cell_hit", "cell_ch0",
                     "cell_ch1", "cell_value"):
            assert np.array_equal(getattr(a, name), getattr(b, name)) and getattr(b, name).dtype == getattr(a, name).dtype


def test_sector_clouds_keep_their_hits_cells(event20: TrackingEvent) -> None:
    ev = event20
    for cloud in split_sectors(ev, 4):
        rows = np.flatnonzero(np.isin(ev.hit_id, cloud.hit_id))
        for j, r in enumerate(rows[:200]):
            mine = cloud.cell_hit == j
            theirs = ev.cell_hit == r
            assert np.array_equal(cloud.cell_ch0[mine], ev.cell_ch0[theirs])
            assert np.array_equal(cloud.cell_value[mine], ev.cell_value[theirs])
    # Integer, reordered and repeated hit indices.
    sub = ev.subset(np.array([5, 2, 5]))
    for j, r in enumerate([5, 2, 5]):
        assert np.array_equal(sub.cell_ch1[sub.cell_hit == j], ev.cell_ch1[ev.cell_hit == r])


# ---------------------------------------------------------------- sectors
def test_sector_split_follows_hepts_rule(event200: TrackingEvent) -> None:
    """The authors' extended sectors (ds = 1.3, di = 0 as their build script, slope arctan(π/10)) on a μ = 200
    event, checked through azimuths: the conformal wedges are angular wedges of half-angle
    atan(arctan(π/n)) (plain) and atan(1.3·arctan(π/n)) (extended) about φ = −2πs/n."""
    ev, n = event200, 10
    clouds = split_sectors(ev, n, ds=1.3, di=0.0)
    assert [c.sector for c in clouds] == list(range(n))
    half_plain, half_ext = np.arctan(np.arctan(np.pi / n)), np.arctan(1.3 * np.arctan(np.pi / n))
    phi = np.arctan2(ev.y.astype(np.float64), ev.x.astype(np.float64))
    ids, inv = np.unique(ev.particle_id, return_inverse=True)
    total = np.bincount(inv)
    cover = np.zeros(ev.num_hits, np.int64)
    n_own = np.zeros(len(ids), np.int64)
    for c in clouds:
        d = (phi + 2 * np.pi * c.sector / n + np.pi) % (2 * np.pi) - np.pi
        ext, plain = np.abs(d) < half_ext, np.abs(d) < half_plain
        assert np.array_equal(c.hit_id, ev.hit_id[ext])  # every hit of the extended wedge, noise too
        own = (2 * np.bincount(inv[plain], minlength=len(ids)) >= total) & (ids > 0)  # over the event
        assert np.array_equal(c.sector_own, own[inv][ext])
        n_own += own
        cover[ext] += 1
        assert c.weight.astype(np.float64).sum() == pytest.approx(1.0, abs=1e-4)
        assert np.all(c.weight[~c.sector_own] == 0)
        # The table holds exactly the particles with a hit here, so per-hit truth is the event's.
        assert set(c.particles_id.tolist()) == set(c.particle_id[c.particle_id > 0].tolist())
        assert np.array_equal(c.hit_pt, ev.hit_pt[ext])
        assert np.array_equal(c.reconstructable, ev.reconstructable[ext])  # layers over the event
    assert cover.min() == 1 and cover.max() == 2
    # Overlap: 2·atan(1.3·arctan(π/10)) / (π/5) − 1 = 0.2025 of the hits lie in two clouds.
    assert abs(cover.mean() - 1 - (half_ext / (np.pi / n) - 1)) < 0.02
    real = ids > 0
    # Most particles belong to one sector; a few to two (exactly half in each) or none (hits in
    # the gaps between plain wedges or over three sectors): 94% / 1.3% / 4.3% here.
    assert np.mean(n_own[real] == 1) > 0.9 and np.mean(n_own[real] == 2) < 0.03 and np.mean(n_own[real] == 0) < 0.08
    assert split_sectors(ev, 1)[0] is ev


def test_generate_clouds_are_sorted_and_sized() -> None:
    clouds = generate_clouds("tiny", n_events=3, seed=0)
    assert [(c.event_id, c.sector) for c in clouds] == [(e, s) for e in range(3) for s in range(2)]


# ---------------------------------------------------------------- validation
def test_parameter_validation() -> None:
    with pytest.raises(ValueError, match=r"preset.*'nope'.*tiny"):
        preset_params("nope")
    with pytest.raises(ValueError, match="^mu"):
        TrackingParams(mu=-1)
    with pytest.raises(ValueError, match="^n_sectors"):
        TrackingParams(n_sectors=0)
    with pytest.raises(ValueError, match="^n_sectors"):
        split_sectors(generate_event("tiny", 0), 0)
    with pytest.raises(ValueError, match="^split"):
        TrackingParams(split=(0.5, 0.1, 0.1))
    with pytest.raises(ValueError, match="^hit_efficiency"):
        TrackingParams(hit_efficiency=1.5)
    with pytest.raises(ValueError, match="^bogus"):
        preset_params("tiny", bogus=1)
    with pytest.raises(ValueError, match="^split"):
        load_tracking_dataset("tiny", "training", cache_dir="/nonexistent")
    with pytest.raises(ValueError, match="^seed"):
        generate_event("tiny", seed=-1)


# ---------------------------------------------------------------- cache
def test_dataset_cache_keyed_regenerated_and_robust(tmp_path: Path) -> None:
    p = preset_params("tiny", n_events=5)
    train = load_tracking_dataset(p, "train", cache_dir=tmp_path)
    val = load_tracking_dataset(p, "val", cache_dir=tmp_path)
    test = load_tracking_dataset(p, "test", cache_dir=tmp_path)
    assert (len(train), len(val), len(test)) == (8, 1, 1)
    full = generate_clouds(p, seed=0)
    for a, b in zip(full, train + val + test):
        assert (a.event_id, a.sector) == (b.event_id, b.sector) and np.array_equal(a.cells, b.cells)
    files = sorted((tmp_path / "tracking").glob("*.npz"))
    assert len(files) == 3
    f_train = next(f for f in files if "-train-" in f.name)
    mtime = f_train.stat().st_mtime_ns
    again = load_tracking_dataset(p, "train", cache_dir=tmp_path)
    assert f_train.stat().st_mtime_ns == mtime  # served from the cache
    assert all(np.array_equal(a.x, b.x) for a, b in zip(train, again))
    # Changing a parameter or the seed gives a new entry.
    load_tracking_dataset(p.replace(noise_fraction=0.2), "train", cache_dir=tmp_path)
    load_tracking_dataset(p, "train", cache_dir=tmp_path, seed=1)
    assert len(list((tmp_path / "tracking").glob("*.npz"))) == 5
    # A truncated file and a garbage file are regenerated, not fatal.
    for damage in (lambda b: b[: len(b) // 2], lambda b: b"not a zip file"):
        f_train.write_bytes(damage(f_train.read_bytes()))
        healed = load_tracking_dataset(p, "train", cache_dir=tmp_path)
        assert all(np.array_equal(a.cells, b.cells) for a, b in zip(train, healed))
    assert not list((tmp_path / "tracking").glob("*.tmp"))


def test_default_cache_dir_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POINTFORMERS_CACHE", str(tmp_path))
    clouds = load_tracking_dataset(preset_params("tiny", n_events=2), "test")
    assert len(clouds) == 1 and list((tmp_path / "tracking").glob("custom-test-*.npz"))
    assert trk.GENERATOR_VERSION >= 1


# ---------------------------------------------------------------- generator v3: detector, cells, secondaries
def test_shipped_module_table_and_its_notice() -> None:
    assert trk.DETECTORS_FILE.is_file() and trk.DETECTORS_FILE.with_name("trackml_pixel_detectors.README.md").is_file()
    t = trk.module_table()
    assert sorted(set(zip(t["volume_id"].tolist(), t["layer_id"].tolist()))) == (
        [(7, l) for l in range(2, 15, 2)] + [(8, l) for l in (2, 4, 6, 8)] + [(9, l) for l in range(2, 15, 2)])
    # Rotations are orthonormal; barrel v ∥ z; end-cap w = ±z (−z in volume 7).
    rot = t["rot"]
    assert np.allclose(np.einsum("nji,njk->nik", rot, rot), np.eye(3), atol=1e-5)
    barrel = t["volume_id"] == 8
    assert np.allclose(np.abs(rot[barrel, 2, 1]), 1.0)
    assert np.allclose(rot[t["volume_id"] == 7, 2, 2], -1.0) and np.allclose(rot[t["volume_id"] == 9, 2, 2], 1.0)


def test_digitise_cells_are_path_lengths_per_pixel() -> None:
    one = np.ones(1)
    # Normal incidence in the middle of a pixel: one cell holding the whole depth.
    hit, ch0, ch1, value, centroid = trk.digitise(np.array([[0.025, 0.028125]]), np.array([[0.0, 0.0, 1.0]]),
                                                  0.3 * one, 0 * one, 8.4 * one, 36.0 * one, 0.05 * one, 0.05625 * one)
    assert hit.tolist() == [0] and (ch0[0], ch1[0]) == (168, 640) and value[0] == np.float32(0.3)
    np.testing.assert_allclose(centroid, [[0.025, 0.028125]], atol=1e-12)
    # Oblique: the cells' values add up to the 3D path, consecutive cells are neighbours.
    d = np.array([[0.3, 0.8, 0.2]])
    d /= np.linalg.norm(d)
    hit, ch0, ch1, value, centroid = trk.digitise(np.zeros((1, 2)), d, 0.15 * one, 0 * one, 8.4 * one, 36.0 * one,
                                                  0.05 * one, 0.05625 * one)
    assert value.astype(np.float64).sum() == pytest.approx(0.15 / d[0, 2], rel=1e-6)
    assert np.all(np.abs(np.diff(ch0)) + np.abs(np.diff(ch1)) >= 1) and len(np.unique(np.c_[ch0, ch1], axis=0)) == len(ch0)
    # A path leaving the active area is clipped: no cell outside the module.
    hit, ch0, ch1, value, _ = trk.digitise(np.array([[8.39, 0.0]]), np.array([[0.6, 0.0, 0.8]]), 0.3 * one, 0 * one,
                                           8.4 * one, 36.0 * one, 0.05 * one, 0.05625 * one)
    assert ch0.max() == 335 and value.astype(np.float64).sum() < 0.3 / 0.8
    with pytest.raises(ValueError, match="^direction"):
        trk.digitise(np.zeros((1, 2)), np.zeros((1, 2)), one, one, one, one, one, one)
    with pytest.raises(ValueError, match="^cell_hit"):
        trk.cell_summary(np.array([0, 3]), np.zeros(2), np.zeros(2), np.zeros(2), 2)


def test_secondaries_and_their_vertices() -> None:
    p = preset_params("tracking-60k")
    parts = trk.sample_particles(p, np.random.default_rng(5))
    sec = parts.is_secondary
    assert 0.20 < sec.mean() < 0.25  # 22.6 % of the particles of a real event
    rho = np.hypot(parts.vx, parts.vy)[sec]
    assert 150 < np.median(rho) < 260  # real median 200 mm
    assert np.all(np.hypot(parts.px, parts.py) >= 0.1)
    # Each secondary starts on its parent's helix at its vertex radius.
    par = parts.parent[sec]
    assert np.all(par >= 0) and not sec[par].any()
    ev = trk.simulate_event(parts, p, np.random.default_rng(6))
    idx = ev.hit_particle_index
    share = sec[idx[idx >= 0]].mean()
    assert 0.02 < share < 0.06  # real: 2.9 % of the pixel hits


def test_new_parameters_are_validated() -> None:
    for name, bad in (("noise_max_angle", 2.0), ("secondary_fraction", 1.0), ("secondary_inner_fraction", -0.1),
                      ("pt_min", -1.0), ("x_over_x0", float("nan")), ("pt_min_hits", -0.1), ("displaced_fraction", 2.0),
                      ("displaced_length", -1.0)):
        with pytest.raises(ValueError, match=f"^{name}"):
            TrackingParams(**{name: bad})


def test_a_60k_event_has_its_size() -> None:
    # its generation time is a benchmark's business (docs/benchmarks.md), not a test's
    ev = generate_event(preset_params("tracking-60k"), seed=1)
    assert ev.num_hits > 50_000
