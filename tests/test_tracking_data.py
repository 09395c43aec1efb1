"""Physics and bookkeeping tests of the TrackML-like detector simulation."""
from __future__ import annotations

import time
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
IDEAL = TrackingParams(multiple_scattering=False, hit_resolution=0.0, hit_efficiency=1.0, noise_fraction=0.0)


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
def test_hits_lie_on_their_surfaces(event20: TrackingEvent) -> None:
    ev = event20
    barrel = ev.volume_id == 8
    rho = np.array([BARREL_R.get(int(l), np.nan) for l in ev.layer_id])
    assert np.allclose(ev.r[barrel], rho[barrel], atol=1e-3)
    assert np.all(np.abs(ev.z[barrel]) < 491.0 + 0.5)
    disk = ~barrel
    assert set(np.unique(ev.volume_id[disk])) == {7, 9}
    # End caps: layer 2..14 in order of increasing z; z < 0 is volume 7.
    zz = np.where(ev.volume_id == 9, np.array(DISK_Z)[(ev.layer_id // 2 - 1).clip(0, 6)],
                  -np.array(DISK_Z)[::-1][(ev.layer_id // 2 - 1).clip(0, 6)])
    assert np.array_equal(ev.z[disk], zz[disk].astype(np.float32))
    assert set(np.unique(ev.layer_id[disk])) <= {2, 4, 6, 8, 10, 12, 14}
    real = disk & (ev.particle_id > 0)
    true_r = np.hypot(ev.tx, ev.ty)[real]
    assert true_r.min() >= 30.0 and true_r.max() <= 175.0
    # Measured positions scatter around the true ones by the 0.05 mm resolution.
    dxy = np.hypot(ev.x - ev.tx, ev.y - ev.ty)[real]
    assert 0.03 < np.sqrt(np.mean(dxy ** 2) / 2) < 0.07


def test_ten_gev_track_is_a_helix_of_the_right_radius() -> None:
    pt = 10.0
    expected = pt / (0.3 * 2.0) * 1000.0  # mm
    for q in (+1, -1):
        ev = simulate_event(one_track(pt, 0.3, q), IDEAL, np.random.default_rng(0))
        assert sorted(ev.layer_id.tolist()) == [2, 4, 6, 8] and np.all(ev.volume_id == 8)
        xc, yc, R = fit_circle(ev.x.astype(np.float64), ev.y.astype(np.float64))
        assert abs(R / expected - 1) < 0.02
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
    s = 2 * R * np.arcsin(ev.r.astype(np.float64) / (2 * R))
    slope = np.polyfit(s, ev.z.astype(np.float64), 1)[0]
    assert slope == pytest.approx(np.sinh(eta), rel=1e-3)


def test_low_pt_particles_curl_before_outer_layers() -> None:
    # 2R = 66.7 mm < 72 mm: reaches r = 32 only.
    ev = simulate_event(one_track(0.02, 0.0, -1, vz=0.0), IDEAL, np.random.default_rng(0))
    assert ev.layer_id.tolist() == [2] and np.all(ev.volume_id == 8)
    # 2R = 100 mm: reaches 32 and 72, not 116.
    ev = simulate_event(one_track(0.03, 0.0, +1, vz=0.0), IDEAL, np.random.default_rng(0))
    assert sorted(ev.layer_id.tolist()) == [2, 4]


def test_no_hit_beyond_twice_the_radius_without_scattering() -> None:
    ev = generate_event(TrackingParams(mu=20, multiple_scattering=False), seed=5)
    real = ev.particle_id > 0
    idx = ev.hit_particle_index[real]
    reach = 2 * ev.pt / 0.6 * 1000 + np.hypot(ev.vx, ev.vy)  # max transverse radius of each helix
    true_r = np.hypot(ev.tx, ev.ty)[real]
    assert np.all(true_r <= reach[idx] * (1 + 1e-5) + 1e-3)
    curlers = reach < 72.0
    assert curlers.sum() > 0
    of_curlers = np.isin(ev.particle_id, ev.particles_id[curlers])
    assert not np.any(of_curlers & (ev.volume_id == 8) & (ev.layer_id >= 4))  # never on r >= 72
    assert np.all(np.hypot(ev.tx, ev.ty)[of_curlers] < 72.0)


def test_each_surface_at_most_once_per_particle(event200: TrackingEvent) -> None:
    ev = event200
    real = ev.particle_id > 0
    pairs = np.stack([ev.particle_id[real], ev.layer_index[real]], 1)
    assert len(np.unique(pairs, axis=0)) == len(pairs)
    assert np.array_equal(np.bincount(ev.hit_particle_index[real], minlength=ev.num_particles), ev.nhits)


def test_multiple_scattering_kick_has_the_highland_rms() -> None:
    params = TrackingParams(multiple_scattering=True, hit_resolution=0.0, hit_efficiency=1.0, noise_fraction=0.0)
    p = 1.0  # GeV, at η = 0 so pT = p
    ev = simulate_event(one_track(p, 0.0, +1, vz=0.0, n=3000), params, np.random.default_rng(1))
    # A helix keeps the polar angle: its change between layers 1 and 2 is the scattering kick.
    theta = np.arctan2(np.hypot(ev.tpx, ev.tpy), ev.tpz).astype(np.float64)
    order = np.lexsort((ev.layer_id, ev.particle_id))
    pid, lay, th = ev.particle_id[order], ev.layer_id[order], theta[order]
    first = (lay[:-1] == 2) & (lay[1:] == 4) & (pid[:-1] == pid[1:])
    dtheta = th[1:][first] - th[:-1][first]
    expected = 0.0136 / p * np.sqrt(0.02)
    assert np.std(dtheta) == pytest.approx(expected, rel=0.1)
    # Scattering changes directions, never the momentum magnitude.
    assert np.allclose(np.sqrt(ev.tpx ** 2 + ev.tpy ** 2 + ev.tpz ** 2), p, rtol=1e-5)


# ---------------------------------------------------------------- rates and sizes
def test_noise_fraction_and_weights(event200: TrackingEvent) -> None:
    ev = event200
    noise = ev.particle_id == 0
    assert 0.09 < noise.mean() < 0.11
    assert np.all(ev.weight[noise] == 0)
    assert ev.weight.astype(np.float64).sum() == pytest.approx(1.0, abs=1e-4)
    assert np.all(ev.cells[noise, CLUSTER_FEATURES.index("lx")] > 0)
    # Particles with fewer than 4 hits get no weight (TrackML convention).
    few = ev.per_hit(ev.nhits, 0) < 4
    assert np.all(ev.weight[few & ~noise] == 0) and np.all(ev.weight[~few & ~noise] > 0)


def test_hit_counts_scale_with_mu(event200: TrackingEvent) -> None:
    assert 45_000 < event200.num_hits < 70_000  # TrackML pixel: ~57k at mu = 200 (Poisson spread ~4k)
    n20 = [generate_event(TrackingParams(mu=20), seed=s).num_hits for s in range(4)]
    assert 4_500 < np.mean(n20) < 7_500
    # mu counts pile-up on top of the triggered collision: mu = 0 still has one vertex.
    n0 = [generate_event(TrackingParams(mu=0), seed=s).num_hits for s in range(10)]
    assert 100 < np.mean(n0) < 600 and min(n0) > 0


def test_pt_spectrum_is_soft(event200: TrackingEvent) -> None:
    pt = event200.pt
    assert np.median(pt) < 1.0
    assert 0.10 < np.mean(pt > 0.9) < 0.20
    assert pt.max() > 5.0  # power-law tail
    assert 8_000 < event200.num_particles < 12_000  # ~50 per vertex at mu = 200
    assert set(np.unique(event200.q)) == {-1, 1}


def test_seeded_reproducibility() -> None:
    p = preset_params("tiny")
    a, b, c = generate_event(p, seed=7), generate_event(p, seed=7), generate_event(p, seed=8)
    for name in ("x", "y", "z", "cells", "particle_id", "weight", "module_id", "px", "vz", "nhits", "tpx"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.num_hits != c.num_hits or not np.array_equal(a.x, c.x)
    d = generate_event(p, seed=7, event_id=1)
    assert d.num_hits != a.num_hits or not np.array_equal(a.x, d.x)


@pytest.mark.parametrize("name, lo, hi", [("tiny", 100, 1000), ("small", 1000, 2000), ("tracking-6k", 5000, 7500)])
def test_preset_cloud_sizes(name: str, lo: int, hi: int) -> None:
    p = preset_params(name)
    t0 = time.perf_counter()
    clouds = split_sectors(generate_event(p, seed=0), p.n_sectors)
    assert time.perf_counter() - t0 < 2.0
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
    # Outer barrel: the bending in φ (lx) grows as pT falls.
    outer = barrel & (ev.layer_id == 8)
    assert spearmanr(feature(ev, "lx")[outer], 1 / ev.hit_pt[outer]).correlation > 0.4
    # lz = 2·module_t = 0.30 mm for every TrackML pixel module.
    assert np.all(ev.cells[:, CLUSTER_FEATURES.index("lz")] == np.float32(0.30))
    # charge_frac is a mean cell value (path length per pixel, mm), not a fraction: in a 0.15 mm
    # deep sensor with 0.05 × 0.05625 mm pixels the mean path per crossed pixel stays below 0.2 mm.
    cf = feature(ev, "charge_frac")
    assert np.all((cf > 0) & (cf < 0.2))
    assert 0.03 < np.median(cf[barrel]) < 0.08  # TrackML barrel: median cell value 0.055 mm
    assert np.all(np.isfinite(ev.cells))


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
        for name in ("hit_id", "x", "cells", "particle_id", "particles_id", "nhits", "tz"):
            assert np.array_equal(getattr(a, name), getattr(b, name)) and getattr(b, name).dtype == getattr(a, name).dtype


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
