"""The 8 TrackML cluster features (and the 15 model inputs) of a hand-made TrackML folder.

Every expected value is computed here, per hit, from its cells and its module's row of
``detectors.csv`` with the formulas of the HEPT authors' preprocessing (Exa.TrkX's
cell-feature code and their ``PointCloudBuilder``), written out literally with :mod:`math`:

* n_u = max ch0 − min ch0 + 1, n_v = max ch1 − min ch1 + 1;
* charge_frac = Σ value / number of cells (the mean cell value, not a fraction);
* l = (lx, ly, lz) = (n_u·pitch_u, n_v·pitch_v, 2·module_t), g = R·l;
* eta = −ln tan(θ/2), θ = arccos(z / |vector|); phi = atan2(y, x) for leta/lphi (l) and geta/gphi (g).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pointformers.data.event import CLUSTER_FEATURES, TrackingEvent
from pointformers.data.tracking import (GEOMETRY, TrackingParams, cluster_features, cluster_features_from_cells,
                                       generate_event, module_table)
from pointformers.data.trackml import read_trackml_event
from pointformers.tasks.tracking import tracking_inputs

ROT = ("rot_xu", "rot_xv", "rot_xw", "rot_yu", "rot_yv", "rot_yw", "rot_zu", "rot_zv", "rot_zw")
DET_HEADER = "volume_id,layer_id,module_id,cx,cy,cz," + ",".join(ROT) + \
    ",module_t,module_minhu,module_maxhu,module_hv,pitch_u,pitch_v"
# The pixel layers, sorted: the authors' layer index is the position in this list.
PIXEL_LAYERS = [(7, l) for l in range(2, 15, 2)] + [(8, l) for l in range(2, 9, 2)] + [(9, l) for l in range(2, 15, 2)]


def frame(kind: str, phi: float, tilt: float = 0.0) -> list[list[float]]:
    """A module rotation matrix R (rows x, y, z; columns u, v, w), TrackML conventions."""
    c, s = math.cos(phi + tilt), math.sin(phi + tilt)
    if kind == "barrel":  # u azimuthal, v along z, w (tilted) radial
        return [[-s, 0.0, c], [c, 0.0, s], [0.0, 1.0, 0.0]]
    zsign = -1.0 if kind == "minus" else 1.0  # end caps: v radial, w = ±z, u = v × w
    u = (math.sin(phi) * zsign, -math.cos(phi) * zsign, 0.0)
    return [[u[0], math.cos(phi), 0.0], [u[1], math.sin(phi), 0.0], [0.0, 0.0, zsign]]


def module_rows() -> dict[tuple[int, int, int], dict]:
    """One module per pixel layer (module_id 1) plus a second barrel module with other pitches."""
    rows = {}
    for i, (vol, lay) in enumerate(PIXEL_LAYERS):
        phi = -2.9 + 0.31 * i
        kind = "barrel" if vol == 8 else ("minus" if vol == 7 else "plus")
        rows[(vol, lay, 1)] = dict(R=frame(kind, phi, tilt=0.14 if vol == 8 else 0.0), module_t=0.15,
                                   pitch_u=0.05, pitch_v=0.05625, phi=phi)
    rows[(8, 4, 2)] = dict(R=frame("barrel", 0.7, tilt=-0.2), module_t=0.2, pitch_u=0.04, pitch_v=0.0625, phi=0.7)
    return rows


def write_folder(d: Path, hits: list[tuple], cells: list[tuple], rows: dict) -> Path:
    """hits: (hit_id, x, y, z, vol, lay, mod); cells: (hit_id, ch0, ch1, value)."""
    det = [DET_HEADER]
    for (vol, lay, mod), r in rows.items():
        rot = [r["R"][i][j] for i in range(3) for j in range(3)]
        det.append(",".join(map(repr, [vol, lay, mod, 1.0, 2.0, 3.0, *rot, r["module_t"], 8.4, 8.4, 36.0,
                                       r["pitch_u"], r["pitch_v"]])))
    (d / "detectors.csv").write_text("\n".join(det) + "\n")
    (d / "event000000077-hits.csv").write_text(
        "hit_id,x,y,z,volume_id,layer_id,module_id\n" + "".join(",".join(map(repr, h)) + "\n" for h in hits))
    (d / "event000000077-cells.csv").write_text(
        "hit_id,ch0,ch1,value\n" + "".join(",".join(map(repr, c)) + "\n" for c in cells))
    return d / "event000000077"


def expected_features(cells: list[tuple], row: dict) -> dict[str, float]:
    ch0 = [c[1] for c in cells]
    ch1 = [c[2] for c in cells]
    values = [float(np.float32(c[3])) for c in cells]  # TrackML's value column is float32
    lx = (max(ch0) - min(ch0) + 1) * row["pitch_u"]
    ly = (max(ch1) - min(ch1) + 1) * row["pitch_v"]
    lz = 2 * row["module_t"]
    R = row["R"]
    g = [R[i][0] * lx + R[i][1] * ly + R[i][2] * lz for i in range(3)]

    def eta_phi(x: float, y: float, z: float) -> tuple[float, float]:
        theta = math.acos(z / math.sqrt(x * x + y * y + z * z))
        return -math.log(math.tan(theta / 2)), math.atan2(y, x)

    leta, lphi = eta_phi(lx, ly, lz)
    geta, gphi = eta_phi(*g)
    return dict(charge_frac=sum(values) / len(values), leta=leta, lphi=lphi, lx=lx, ly=ly, lz=lz, geta=geta, gphi=gphi)


def make_event(rng: np.random.Generator) -> tuple[list[tuple], list[tuple], dict]:
    rows = module_rows()
    hits, cells = [], []
    hid = 0
    for (vol, lay, mod), r in rows.items():
        for _ in range(3):
            hid += 1
            # Position: on the layer (barrel r ≈ 32..172, end caps |z| ≈ 600..1500), at the module's azimuth.
            rho = 32.0 + 20 * lay if vol == 8 else rng.uniform(40, 170)
            z = rng.uniform(-400, 400) if vol == 8 else (-1 if vol == 7 else 1) * (500 + 70 * lay)
            ph = r["phi"] + rng.uniform(-0.05, 0.05)
            hits.append((hid, rho * math.cos(ph), rho * math.sin(ph), z, vol, lay, mod))
            # A random cluster: 1..12 distinct pixels in a box, values like TrackML path lengths.
            nu, nv = int(rng.integers(1, 4)), int(rng.integers(1, 9))
            u0, v0 = int(rng.integers(0, 300)), int(rng.integers(0, 1200))
            box = [(u0 + a, v0 + b) for a in range(nu) for b in range(nv)]
            pick = rng.choice(len(box), size=int(rng.integers(1, len(box) + 1)), replace=False)
            for k in pick:
                cells.append((hid, box[k][0], box[k][1], float(np.float32(rng.uniform(1e-4, 0.35)))))
    # A strip hit (volume 12) that the reader drops, with cells.
    hits.append((hid + 1, 400.0, 0.0, 10.0, 12, 2, 7))
    cells.append((hid + 1, 5, 5, 1.0))
    order = rng.permutation(len(cells))  # the cells file need not be grouped by hit
    return hits, [cells[i] for i in order], rows


def test_cluster_features_of_hand_made_hits(tmp_path: Path) -> None:
    rows = module_rows()
    hits = [(1, 31.0, 8.0, 100.0, 8, 2, 1), (2, 60.0, -20.0, -1100.0, 7, 10, 1), (3, -80.0, 30.0, 820.0, 9, 6, 1),
            (4, 50.0, 50.0, -5.0, 8, 4, 2)]
    cells = [(1, 10, 20, 0.05), (3, 5, 5, 0.1), (1, 10, 21, 0.06), (2, 100, 200, 0.297), (1, 11, 22, 0.04),
             (3, 7, 6, 0.2), (1, 11, 23, 0.07), (3, 6, 9, 0.15), (4, 0, 0, 0.125)]
    ev = read_trackml_event(write_folder(tmp_path, hits, cells, rows), truth=False)
    assert ev.hit_id.tolist() == [1, 2, 3, 4]
    f = {name: ev.cells[:, j] for j, name in enumerate(CLUSTER_FEATURES)}
    # Literal numbers for a few of them.
    assert f["charge_frac"].tolist() == [np.float32((0.05 + 0.06 + 0.04 + 0.07) / 4), np.float32(0.297),
                                         np.float32((0.1 + 0.2 + 0.15) / 3), np.float32(0.125)]
    assert f["lx"].tolist() == [np.float32(2 * 0.05), np.float32(0.05), np.float32(3 * 0.05), np.float32(0.04)]
    assert f["ly"].tolist() == [np.float32(4 * 0.05625), np.float32(0.05625), np.float32(5 * 0.05625),
                                np.float32(0.0625)]
    assert f["lz"].tolist() == [np.float32(0.3)] * 3 + [np.float32(0.4)]
    # The end cap at -z has w = -z: its rotated vector points backwards (geta < 0), the +z one forwards.
    assert f["geta"][1] < 0 < f["geta"][2]
    by_hit = {}
    for c in cells:
        by_hit.setdefault(c[0], []).append(c)
    for i, h in enumerate(hits):
        exp = expected_features(by_hit[h[0]], rows[h[4:7]])
        for name in ("charge_frac", "lx", "ly", "lz"):
            assert f[name][i] == np.float32(exp[name]), (h[0], name)
        for name in ("leta", "lphi", "geta", "gphi"):
            np.testing.assert_array_max_ulp(f[name][i], np.float32(exp[name]), maxulp=1)


def test_cluster_features_of_random_clusters_on_every_layer(tmp_path: Path) -> None:
    hits, cells, rows = make_event(np.random.default_rng(5))
    ev = read_trackml_event(write_folder(tmp_path, hits, cells, rows), truth=False)
    pixel = [h for h in hits if h[4] != 12]
    assert ev.hit_id.tolist() == [h[0] for h in pixel]
    by_hit: dict[int, list] = {}
    for c in cells:
        by_hit.setdefault(c[0], []).append(c)
    exp = {name: np.array([expected_features(by_hit[h[0]], rows[h[4:7]])[name] for h in pixel], np.float32)
           for name in CLUSTER_FEATURES}
    for j, name in enumerate(CLUSTER_FEATURES):
        if name in ("charge_frac", "lx", "ly", "lz"):
            assert np.array_equal(ev.cells[:, j], exp[name]), name
        else:
            np.testing.assert_array_max_ulp(ev.cells[:, j], exp[name], maxulp=1)
    # Not the largest cell's share of the cluster: that reading differs on multi-cell hits.
    share = np.array([max(c[3] for c in by_hit[h[0]]) / sum(c[3] for c in by_hit[h[0]]) for h in pixel])
    multi = np.array([len(by_hit[h[0]]) > 1 for h in pixel])
    assert multi.sum() > 10 and np.all(np.abs(ev.cells[multi, 0] - share[multi]) > 1e-6)


def test_model_inputs_follow_the_authors_formulas(tmp_path: Path) -> None:
    hits, cells, rows = make_event(np.random.default_rng(9))
    ev = read_trackml_event(write_folder(tmp_path, hits, cells, rows), truth=False)
    x = tracking_inputs(ev, dtype=torch.float64).x.numpy()
    assert x.shape == (ev.num_hits, 15)
    pixel = [h for h in hits if h[4] != 12]
    available = sorted({(h[4], h[5]) for h in pixel})
    assert len(available) == 18  # every pixel layer: the authors' index then equals the fixed table
    f32 = np.float32
    for i, h in enumerate(pixel):
        # the authors' arithmetic: float32 positions (TrackML files) and float32 pandas/numpy
        # operations, float64 divisions by the scales, float32 in the end
        hx, hy, hz = (f32(v) for v in h[1:4])
        r = np.sqrt(hx * hx + hy * hy)
        eta = -np.log(np.tan(np.arctan2(r, hz) / f32(2.0)))
        raw = [r, np.arctan2(hy, hx), hz, eta, hx / (hx * hx + hy * hy), hy / (hx * hx + hy * hy)]
        scale = [1000.0, math.pi, 1000.0, 1.0, 1 / 1000.0, 1 / 1000.0]
        exp = [float(f32(float(a) / b)) for a, b in zip(raw, scale)]
        exp += [float(v) for v in ev.cells[i]]  # the 8 cluster features, unscaled
        exp += [float(f32(available.index((h[4], h[5]))) / f32(10.0))]
        np.testing.assert_array_equal(x[i], exp)


def test_generated_cells_are_the_path_through_the_sensor() -> None:
    """Generated cells: Σ value = depth / |cos α| (0.15 mm barrel, 0.30 mm end caps) and the
    features come from the cells by the reader's code."""
    ev = generate_event(TrackingParams(mu=5, multiple_scattering=False), seed=3)
    g = GEOMETRY
    t = module_table(g)
    key = lambda v, l, m: (np.asarray(v) * 100 + np.asarray(l)) * 10_000_000 + np.asarray(m)  # noqa: E731
    tk = key(t["volume_id"], t["layer_id"], t["module_id"])
    order = np.argsort(tk)
    row = order[np.searchsorted(tk[order], key(ev.volume_id, ev.layer_id, ev.module_id))]
    feats, count = cluster_features_from_cells(ev.cell_hit, ev.cell_ch0, ev.cell_ch1, ev.cell_value, ev.num_hits,
                                               t["pitch_u"][row], t["pitch_v"][row], t["module_t"][row], t["rot"][row])
    assert np.array_equal(feats, ev.cells) and np.all(count >= 1)
    real = ev.particle_id > 0
    d = np.stack([ev.tpx, ev.tpy, ev.tpz], 1).astype(np.float64)[real]
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    local = np.einsum("nij,ni->nj", t["rot"][row[real]], d)  # R^T d: direction in (u, v, w)
    cos_w = np.abs(local[:, 2])
    depth = np.where(ev.volume_id[real] == 8, g.depth_barrel, g.depth_endcap)
    total = np.bincount(ev.cell_hit, ev.cell_value.astype(np.float64), minlength=ev.num_hits)[real]
    # Clusters cut by a module edge carry less; all others carry the whole path.
    whole = np.isclose(total, depth / cos_w, rtol=1e-5)
    assert whole.mean() > 0.97 and np.all(total <= depth / cos_w * (1 + 1e-5))
    assert np.all(ev.cells[:, CLUSTER_FEATURES.index("lz")] == np.float32(2 * g.module_t))
    # A cell per pixel: no pixel twice within a hit.
    assert len(np.unique(np.stack([ev.cell_hit, ev.cell_ch0, ev.cell_ch1], 1), axis=0)) == len(ev.cell_hit)


@pytest.mark.parametrize("bad", [dict(lx=np.ones(2)), dict(axes=np.zeros((2, 3, 3))), dict(axes=np.zeros((3, 3)))])
def test_cluster_features_rejects_mismatched_shapes(bad: dict) -> None:
    args = dict(lx=np.ones(3), ly=np.ones(3), lz=np.ones(3), charge_frac=np.ones(3), axes=np.zeros((3, 3, 3)))
    with pytest.raises(ValueError, match="cluster_features"):
        cluster_features(**{**args, **bad})


def test_hits_without_cells_have_zero_features(tmp_path: Path) -> None:
    rows = module_rows()
    prefix = write_folder(tmp_path, [(1, 31.0, 8.0, 100.0, 8, 2, 1), (2, 32.0, 1.0, 50.0, 8, 2, 1)],
                          [(1, 3, 4, 0.1)], rows)
    with pytest.warns(UserWarning, match="1 pixel hits have no cells"):
        ev = read_trackml_event(prefix, truth=False)
    assert np.all(ev.cells[1] == 0) and np.all(ev.cells[0, [0, 3, 4, 5]] > 0)
    assert isinstance(ev, TrackingEvent)
