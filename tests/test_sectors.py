"""φ-sector clouds built as the HEPT authors build Tracking-6k (``PointCloudBuilder.sector_hits``).

Hand-made events put hits at known azimuths around the wedge edges of sector 0 (centred on
φ = 0) and sector 9 (centred on φ = +36°) of a 10-sector split with slope = arctan(π/10), ds = 1.3, di = 0
(the authors' build-script values, passed explicitly; the defaults are their class's 1.1 / 1e-4), whose half-angles are

* plain wedge:    atan(arctan(π/10))       = 0.29575 rad
* extended wedge: atan(1.3·arctan(π/10))   = 0.37778 rad

(the gap 0.29575 … 0.33257 between the plain wedges of sectors 0 and 9 belongs to no plain
wedge; the band 0.25301 … 0.37778 lies in both extended wedges).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from pointformers.data.event import TrackingEvent, pack_events, unpack_events
from pointformers.data.tracking import (
    SECTOR_DI,
    SECTOR_DS,
    TrackingParams,
    generate_event,
    sector_slope,
    sector_wedges,
    split_sectors,
)

N = 10
PLAIN = math.atan(math.atan(math.pi / N))
EXT = math.atan(1.3 * math.atan(math.pi / N))
OPTS = dict(ds=1.3, di=0.0)  # the geometry above


def make_event(phi, pid, layer=None, r=100.0, weight=None, particles=None) -> TrackingEvent:
    """Hits at azimuths ``phi`` and radius ``r`` (barrel volume 8), particle ids ``pid``."""
    phi = np.asarray(phi, np.float64)
    n = len(phi)
    r = np.broadcast_to(np.asarray(r, np.float64), (n,))
    pid = np.asarray(pid, np.int64)
    layer = np.full(n, 2, np.int64) if layer is None else np.asarray(layer, np.int64)
    ids = np.unique(pid[pid > 0]) if particles is None else np.asarray(particles, np.int64)
    p = len(ids)
    f = np.zeros(n, np.float32)
    w = np.where(pid > 0, 1.0, 0.0) if weight is None else np.asarray(weight, np.float64)
    w = w / w.sum() if w.sum() > 0 else w
    return TrackingEvent(
        hit_id=np.arange(1, n + 1, dtype=np.int64), x=(r * np.cos(phi)).astype(np.float32),
        y=(r * np.sin(phi)).astype(np.float32), z=f, volume_id=np.full(n, 8, np.int64), layer_id=layer,
        module_id=np.ones(n, np.int64), cells=np.zeros((n, 8), np.float32), particle_id=pid,
        weight=w.astype(np.float32), particles_id=ids, vx=np.zeros(p, np.float32),
        vy=np.zeros(p, np.float32), vz=np.zeros(p, np.float32), px=np.arange(1, p + 1, dtype=np.float32),
        py=np.zeros(p, np.float32), pz=np.zeros(p, np.float32), q=np.ones(p, np.int64),
        nhits=np.bincount(pid, minlength=int(ids.max(initial=0)) + 1)[ids] if p else np.zeros(0, np.int64),
    )


def by_hit(cloud: TrackingEvent, values: np.ndarray) -> dict[int, object]:
    return {int(h): v for h, v in zip(cloud.hit_id, values)}


# ---------------------------------------------------------------- wedge geometry
def test_defaults_and_slopes() -> None:
    assert (SECTOR_DS, SECTOR_DI) == (1.1, 1e-4)  # the authors' PointCloudBuilder defaults
    # The authors' arctan (not tan) for Tracking-6k's 10 sectors, whichever option says so.
    assert sector_slope(10) == sector_slope(10, slope="arctan") == pytest.approx(math.atan(math.pi / 10))
    assert sector_slope(10, slope="tan") == pytest.approx(math.tan(math.pi / 10))
    # n = 2: arctan wedges span only ±45°, so "auto" takes the half planes.
    assert sector_slope(2) == math.inf
    # "auto" keeps arctan exactly when ds·arctan(π/n) >= tan(π/n).
    assert sector_slope(5, ds=1.3) == pytest.approx(math.atan(math.pi / 5))  # 1.3 · 0.5610 >= 0.7265
    assert sector_slope(4, ds=1.3) == pytest.approx(math.tan(math.pi / 4))  # 1.3 · 0.6658 < 1
    assert sector_slope(5) == pytest.approx(math.tan(math.pi / 5))  # default 1.1 · 0.5610 < 0.7265
    assert sector_slope(8, ds=1.1, di=1e-4) == pytest.approx(math.tan(math.pi / 8))
    assert sector_slope(9, ds=1.1, di=1e-4) == pytest.approx(math.atan(math.pi / 9))


@pytest.mark.parametrize("phi, plain0, ext0, plain9, ext9", [
    (0.0, True, True, False, False),
    (PLAIN - 0.005, True, True, False, True),   # inside plain 0, already in extended 9
    (PLAIN + 0.005, False, True, False, True),  # the gap between plain wedges 0 and 9
    (EXT - 0.005, False, True, True, True),
    (EXT + 0.005, False, False, True, True),
    (-(EXT - 0.005), False, True, False, False),  # symmetric about φ = 0
    (-(EXT + 0.005), False, False, False, False),
    (math.pi, False, False, False, False),
])
def test_plain_and_extended_wedges(phi: float, plain0: bool, ext0: bool, plain9: bool, ext9: bool) -> None:
    k = sector_slope(N)
    for r in (32.0, 172.0, 1000.0):  # with di = 0 only the azimuth matters
        x, y = np.array([r * math.cos(phi)]), np.array([r * math.sin(phi)])
        p0, e0 = sector_wedges(x, y, 0, N, k, **OPTS)
        p9, e9 = sector_wedges(x, y, 9, N, k, **OPTS)
        assert (p0[0], e0[0], p9[0], e9[0]) == (plain0, ext0, plain9, ext9)


def test_intercept_widens_far_hits_and_ur_must_be_positive() -> None:
    k = sector_slope(N)
    # φ = 0.45 > EXT: out of sector 0 with di = 0; at r = 1000 mm, di = 1e-4 mm⁻¹ takes it in.
    x, y = np.array([1000 * math.cos(0.45)]), np.array([1000 * math.sin(0.45)])
    assert not sector_wedges(x, y, 0, N, k, ds=1.3, di=0.0)[1][0]
    assert sector_wedges(x, y, 0, N, k, ds=1.3, di=1e-4)[1][0]
    assert not sector_wedges(x, y, 0, N, k, ds=1.3, di=1e-4)[0][0]  # the plain wedge has no intercept
    # Behind the origin (ur < 0) or on the v axis (ur = 0) the |vr| band of a large di would
    # hold the hit; ur > 0 keeps it out.
    x, y = np.array([-1000.0, 0.0]), np.array([0.0, 100.0])
    plain, ext = sector_wedges(x, y, 0, N, k, ds=1.3, di=0.05)
    assert not plain.any() and not ext.any()
    ev = make_event([math.pi, 0.0], [0, 0], r=np.array([1000.0, 100.0]))
    assert split_sectors(ev, N, di=0.05)[0].hit_id.tolist() == [2]


def test_half_planes_for_two_sectors() -> None:
    phi = np.array([0.1, 1.5, 1.6, -1.55, -1.6, 3.0, -3.0])
    ev = make_event(phi, [1, 1, 2, 2, 3, 3, 0])
    c0, c1 = split_sectors(ev, 2)
    assert c0.hit_id.tolist() == [1, 2, 4]  # x > 0: sector 0 is centred on φ = 0
    assert c1.hit_id.tolist() == [3, 5, 6, 7]


# ---------------------------------------------------------------- clouds and own particles
@pytest.fixture()
def split_event():
    # particle 1: 2 of 4 hits in plain 0 (exactly half) -> own in 0; 1 of 4 in plain 9.
    # particle 2: 2 in plain 0, 2 in plain 9 -> own in both.
    # particle 3: 1 in plain 0, 2 in plain 9 -> own in 9 only; 2 of its hits lie in cloud 0.
    # particle 4: 2 in plain 0 + 3 hits near φ = π: 2/5 < 1/2 -> own nowhere, counted over the event.
    # noise: in plain 0, in the gap (clouds 0 and 9), near φ = π (cloud 5).
    # particle 5 has no hit; particle 6 has one hit at the centre of sectors 2, 4 and 6 each.
    g = PLAIN + 0.01  # in the gap, inside both extended wedges
    rows = [
        (0.00, 1, 2), (0.10, 1, 4), (g, 1, 6), (0.45, 1, 8),
        (-0.05, 2, 2), (0.05, 2, 4), (0.50, 2, 6), (0.55, 2, 8),
        (0.10, 3, 2), (EXT - 0.01, 3, 4), (0.50, 3, 6),
        (-0.20, 4, 2), (0.20, 4, 4), (3.0, 4, 6), (3.1, 4, 8), (-3.1, 4, 8),
        (0.01, 0, 2), (g, 0, 4), (3.0, 0, 6),
        (-0.4 * math.pi, 6, 2), (-0.8 * math.pi, 6, 4), (0.8 * math.pi, 6, 6),
    ]
    phi, pid, layer = (np.array(c) for c in zip(*rows))
    w = np.where(pid > 0, np.arange(1, len(pid) + 1), 0).astype(float)
    ev = make_event(phi, pid, layer, weight=w, particles=[1, 2, 3, 4, 5, 6])
    return ev, split_sectors(ev, N, **OPTS)


def test_cloud_membership_and_own_rule(split_event) -> None:
    ev, clouds = split_event
    assert [c.sector for c in clouds] == list(range(N))
    c0, c9 = clouds[0], clouds[9]
    # Cloud 0: every hit of the extended wedge, own or not, noise included.
    assert c0.hit_id.tolist() == [1, 2, 3, 5, 6, 9, 10, 12, 13, 17, 18]
    assert by_hit(c0, c0.sector_own) == {1: True, 2: True, 3: True, 5: True, 6: True, 9: False, 10: False,
                                         12: False, 13: False, 17: False, 18: False}
    # Cloud 9 (centred on +36°): the gap hits again, particle 1's plain-9 hit, particle 2, 3.
    assert c9.hit_id.tolist() == [3, 4, 7, 8, 10, 11, 18]
    assert by_hit(c9, c9.sector_own) == {3: False, 4: False, 7: True, 8: True, 10: True, 11: True, 18: False}
    # Particle 2 is own in both sectors (exactly half in each plain wedge).
    assert {int(p) for p in c0.particle_id[c0.sector_own]} == {1, 2}
    assert {int(p) for p in c9.particle_id[c9.sector_own]} == {2, 3}
    # Sector 5 (centred on π) holds particle 4's far hits: 3 of 5 in its plain wedge -> own.
    c5 = clouds[5]
    assert by_hit(c5, c5.sector_own) == {14: True, 15: True, 16: True, 19: False}
    # Every hit lies in some cloud; the overlap is the gap/band hits.
    seen = np.concatenate([c.hit_id for c in clouds])
    assert set(seen.tolist()) == set(ev.hit_id.tolist())


def test_cloud_particle_tables_and_weights(split_event) -> None:
    ev, clouds = split_event
    c0 = clouds[0]
    # Every particle with a hit in the cloud is in its table (own or not); hitless particle 5 in none.
    assert c0.particles_id.tolist() == [1, 2, 3, 4]
    assert all(5 not in c.particles_id.tolist() for c in clouds)
    assert np.all(c0.hit_pt[c0.particle_id > 0] > 0)
    assert c0.nhits.tolist() == [4, 4, 3, 5]  # whole-event counts
    # Non-own and noise hits weigh 0; own hits keep their event weights' proportions, sum 1.
    ew = by_hit(ev, ev.weight.astype(np.float64))
    w = c0.weight.astype(np.float64)
    assert np.all(w[~c0.sector_own] == 0)
    assert w.sum() == pytest.approx(1.0, abs=1e-6)
    own_ids = c0.hit_id[c0.sector_own]
    expected = np.array([ew[int(h)] for h in own_ids])
    assert np.allclose(w[c0.sector_own], expected / expected.sum(), rtol=1e-5)
    # Clouds that own nothing (2, 4, 6: one hit of particle 6 each) have zero weights.
    empty_own = [c.sector for c in clouds if c.num_hits and not c.sector_own.any()]
    assert empty_own == [2, 4, 6]
    assert all(np.all(clouds[s].weight == 0) and clouds[s].particles_id.tolist() == [6] for s in empty_own)


def test_reconstructable_counts_layers_over_the_event(split_event) -> None:
    _, clouds = split_event
    c0 = clouds[0]
    # Particle 3 crosses layers 2, 4, 6; cloud 0 holds its layer-2 and layer-4 hits only.
    m3 = c0.particle_id == 3
    assert m3.sum() == 2 and c0.particle_layers[m3].tolist() == [3, 3]
    assert c0.reconstructable[m3].all()
    assert not dataclasses.replace(c0, particle_layers=None).reconstructable[m3].any()
    assert c0.particle_layers[c0.particle_id == 0].tolist() == [0, 0]
    assert not c0.reconstructable[c0.particle_id == 0].any()


def test_sector_fields_survive_pack_unpack(split_event) -> None:
    _, clouds = split_event
    back = unpack_events(pack_events(clouds))
    for a, b in zip(clouds, back):
        assert b.sector_own.dtype == bool and b.particle_layers.dtype == np.int64
        assert np.array_equal(a.sector_own, b.sector_own) and np.array_equal(a.particle_layers, b.particle_layers)
        assert np.array_equal(a.weight, b.weight)


# ---------------------------------------------------------------- generated events
def test_generated_tiny_event_is_covered() -> None:
    ev = generate_event("tiny", seed=0)
    for n, lo, hi in ((2, 0.0, 0.0), (10, 0.12, 0.30)):
        clouds = split_sectors(ev, n, **OPTS)
        cover = np.zeros(ev.num_hits, np.int64)
        for c in clouds:
            cover[c.hit_id - 1] += 1
            assert np.array_equal(c.x, ev.x[c.hit_id - 1])  # hits kept whole, in event order
        assert cover.min() >= 1  # every hit lies in at least one sector's cloud
        assert cover.max() <= 2
        assert lo <= cover.mean() - 1 <= hi  # 2·atan(1.3·arctan(π/10))/(π/5) − 1 = 0.2025 at n = 10


# ---------------------------------------------------------------- validation
def test_bad_options_raise() -> None:
    ev = make_event([0.0], [1])
    with pytest.raises(ValueError, match="^n_sectors"):
        split_sectors(ev, 0)
    with pytest.raises(ValueError, match="^ds"):
        split_sectors(ev, N, ds=0.9)
    with pytest.raises(ValueError, match="^ds"):
        split_sectors(ev, N, ds=float("nan"))
    with pytest.raises(ValueError, match="^di"):
        split_sectors(ev, N, di=-1e-4)
    with pytest.raises(ValueError, match="^slope"):
        split_sectors(ev, N, slope="sin")
    with pytest.raises(ValueError, match="^slope.*leave part of the azimuth"):
        split_sectors(ev, 2, slope="arctan")
    with pytest.raises(ValueError, match="^sector_ds"):
        TrackingParams(sector_ds=0.5)
    with pytest.raises(ValueError, match="^sector_di"):
        TrackingParams(sector_di=-1.0)
    with pytest.raises(ValueError, match="^sector_slope"):
        TrackingParams(n_sectors=2, sector_slope="arctan")
    assert TrackingParams(sector_ds=1.1, sector_di=1e-4).sector_ds == 1.1
