"""Procedural shapes: exact normals, area-uniform sampling, parts, classes not separable by trivial statistics."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from sklearn.neighbors import NearestCentroid
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from pointformers.data import shapes as S
from pointformers.data.cache import cache_path


def test_forty_classes_with_contiguous_part_blocks() -> None:
    assert len(S.CLASS_NAMES) == 40 and len(set(S.CLASS_NAMES)) == 40
    names, blocks = S.class_parts()
    assert [b[0] for b in blocks] == [0] + list(np.cumsum([len(b) for b in blocks])[:-1])
    assert all(2 <= len(b) <= 4 for b in blocks) and len(names) == sum(len(b) for b in blocks)


def test_primitive_normals_are_exact() -> None:
    rng = np.random.default_rng(0)
    e = S.Ellipsoid(0.5, 1.0, 1.7)
    p, n, _ = e.sample(2000, rng)
    assert np.allclose(((p / e.ax) ** 2).sum(1), 1)
    g = p / e.ax ** 2  # gradient of the implicit function
    assert np.allclose(n, g / np.linalg.norm(g, axis=1, keepdims=True))
    t = S.torus(1.0, 0.3)
    p, n, _ = t.sample(2000, rng)
    rho = np.hypot(p[:, 0], p[:, 1])
    assert np.allclose((rho - 1) ** 2 + p[:, 2] ** 2, 0.09)
    centre = np.stack([p[:, 0] / rho, p[:, 1] / rho, 0 * rho], 1)
    assert np.allclose(n, (p - centre) / 0.3)
    # Every primitive: unit normals pointing out of its solid.
    for prim in (S.cylinder(0.4, 1.3), S.frustum(0.7, 0.2, 1.0), S.capsule(0.3, 1.0), S.box(1, 2, 0.5),
                 S.prism(S.regular_polygon(6, 0.5), 1.0), e, t, S.spheroid(0.6, 1.1)):
        p, n, _ = prim.sample(1000, rng)
        assert np.allclose(np.linalg.norm(n, axis=1), 1)
        assert not prim.inside(p + 1e-3 * n).any()
        assert prim.inside(p - 1e-3 * n).mean() > 0.97  # all but points within 1e-3 of an edge


def test_sampling_is_uniform_by_area() -> None:
    rng = np.random.default_rng(1)
    # Cylinder: caps hold r / (r + h) of the area.
    p, n, sub = S.cylinder(0.5, 2.0).sample(40000, rng)
    assert abs(np.mean(sub != 1) - 0.5 / 2.5) < 0.01
    # Torus: the inner half (rho < R) holds 1/2 - a / (pi R) of the area.
    p, _, _ = S.torus(1.0, 0.5).sample(40000, rng)
    assert abs(np.mean(np.hypot(p[:, 0], p[:, 1]) < 1.0) - (0.5 - 0.5 / math.pi)) < 0.01
    # Two independent implementations of a prolate spheroid agree (area and the z distribution).
    a, c = 0.6, 1.4
    ecc = math.sqrt(1 - a * a / (c * c))
    area = 2 * math.pi * a * a * (1 + c / (a * ecc) * math.asin(ecc))
    assert S.Ellipsoid(a, a, c).area() == pytest.approx(area, rel=1e-6)
    assert S.spheroid(a, c).area() == pytest.approx(area, rel=1e-6)
    z1 = S.Ellipsoid(a, a, c).sample(30000, rng)[0][:, 2]
    z2 = S.spheroid(a, c).sample(30000, rng)[0][:, 2]
    h1, _ = np.histogram(z1, 10, (-c, c))
    h2, _ = np.histogram(z2, 10, (-c, c))
    assert np.abs(h1 - h2).max() / 3000 < 0.1
    # Box faces by area.
    p, n, _ = S.box(1.0, 2.0, 3.0).sample(30000, rng)
    assert abs(np.mean(np.abs(n[:, 2]) > 0.5) - 2 * (1 * 2) / 22) < 0.01  # area 2(2 + 3 + 6)


def test_deformation_normals_and_area_stretch_match_finite_differences() -> None:
    rng = np.random.default_rng(2)
    F = S.Deformation.random(0.2, rng)
    assert F.strength == pytest.approx(0.2)
    x = rng.uniform(-1, 1, (20, 3))
    J = F.jacobian(x)
    h = 1e-6
    for k in range(3):
        d = np.zeros(3)
        d[k] = h
        assert np.allclose((F(x + d) - F(x - d)) / (2 * h), J[:, :, k], atol=1e-7)
    n = rng.normal(size=(20, 3))
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    t1 = np.cross(n, [0.3, 0.5, 0.8])
    t1 /= np.linalg.norm(t1, axis=1, keepdims=True)
    t2 = np.cross(n, t1)
    _, n2, _ = F.apply(x, n, rng)
    eps = 1e-5
    e1 = F(x + eps * t1) - F(x - eps * t1)
    e2 = F(x + eps * t2) - F(x - eps * t2)
    fd = np.cross(e1, e2)  # normal of the deformed surface by finite differences
    assert np.allclose(n2, fd / np.linalg.norm(fd, axis=1, keepdims=True), atol=1e-6)
    stretch = np.linalg.norm(fd, axis=1) / (4 * eps * eps)
    cof = np.linalg.solve(np.transpose(J, (0, 2, 1)), n[..., None])[..., 0]
    assert np.allclose(stretch, np.abs(np.linalg.det(J)) * np.linalg.norm(cof, axis=1), rtol=1e-5)
    assert stretch.max() <= 1.2 ** 2


def test_generated_shapes_normalised_unit_normals_hidden_points_removed() -> None:
    rng = np.random.default_rng(3)
    for name in S.CLASS_NAMES:
        p, n, lab = S.generate_shape(name, 300, np.random.default_rng(len(name)))
        assert p.shape == (300, 3) and n.shape == (300, 3) and lab.shape == (300,)
        assert np.allclose(p.mean(0), 0, atol=1e-5) and np.linalg.norm(p, axis=1).max() == pytest.approx(1, abs=1e-5)
        assert np.allclose(np.linalg.norm(n, axis=1), 1, atol=1e-5)
        nparts = len(S.CLASSES[S.CLASS_NAMES.index(name)][1])
        assert lab.min() >= 0 and lab.max() < nparts
    # Snowman: no point of one ball lies inside another ball.
    parts = S._snowman(rng)
    pts, _, lab = S.sample_parts(parts, 3000, rng)
    for i, part in enumerate(parts):
        assert not part.prim.inside((pts[lab != i] - part.t) @ part.R).any()
    # Up axis: a table's top lies above its legs (y up by default, z with up_axis="z").
    for up, k in (("y", 1), ("z", 2)):
        p, _, lab = S.generate_shape("table", 1000, np.random.default_rng(4), up_axis=up)
        assert p[lab == 0, k].mean() > p[lab == 1, k].mean() + 0.3


@pytest.mark.filterwarnings("ignore:self.within_class_std_dev_")
def test_classes_not_separable_by_trivial_statistics_but_distinguishable() -> None:
    params = S.ShapeParams(per_class=(8, 0, 4), num_points=192)
    train, test = S.generate_shapes(params, "train", 0), S.generate_shapes(params, "test", 0)

    def bbox(c):
        return np.ptp(c.points, 0)

    def radius_hist(c):
        r = np.linalg.norm(c.points - c.points.mean(0), axis=1)
        return np.histogram(r, 16, (0, 1))[0] / len(r)

    def shape_features(c):  # coarse occupancy grid + normal-direction histogram
        occ = np.histogramdd(c.points, bins=(4, 4, 4), range=[(-1, 1)] * 3)[0].ravel()
        nh = np.histogramdd(c.normals, bins=(3, 3, 3), range=[(-1, 1)] * 3)[0].ravel()
        return np.r_[occ, nh] / c.num_points

    def accuracy(f) -> float:
        xtr, xte = np.array([f(c) for c in train]), np.array([f(c) for c in test])
        clf = make_pipeline(StandardScaler(), NearestCentroid()).fit(xtr, train.labels())
        return float((clf.predict(xte) == test.labels()).mean())

    trivial = max(accuracy(bbox), accuracy(radius_hist), accuracy(lambda c: np.r_[bbox(c), radius_hist(c)]))
    shape = accuracy(shape_features)
    assert trivial < 0.6  # 40 classes: chance is 0.025
    assert shape > 0.65 and shape > trivial + 0.15


def test_dataset_deterministic_cached_and_keyed_by_params(tmp_path: Path) -> None:
    params = S.ShapeParams(classes=("mug", "table", "torus"), per_class=(2, 1, 1), num_points=64)
    a = S.load_shapes_dataset(params, "train", tmp_path, seed=5)
    assert len(a) == 6 and a.class_names == ("mug", "table", "torus")
    assert a.class_parts == ((0, 1), (2, 3, 4), (5, 6))
    for c in a:
        assert set(c.parts.tolist()) <= set(a.class_parts[c.label])
    files = list((tmp_path / "shapes").glob("*.npz"))
    assert len(files) == 1
    b = S.load_shapes_dataset(params, "train", tmp_path, seed=5)
    assert all(np.array_equal(x.points, y.points) and np.array_equal(x.parts, y.parts) for x, y in zip(a, b))
    # The same shape does not depend on the other classes in the list.
    solo = S.generate_shapes(params.replace(classes=("table",)), "train", seed=5)
    assert np.array_equal(solo[0].points, a[2].points)
    # A corrupted file is regenerated; changed parameters give a new file.
    files[0].write_bytes(b"garbage")
    c = S.load_shapes_dataset(params, "train", tmp_path, seed=5)
    assert np.array_equal(c[0].points, a[0].points)
    S.load_shapes_dataset(params.replace(deform=0.0), "train", tmp_path, seed=5)
    assert len(list((tmp_path / "shapes").glob("*.npz"))) == 2
    assert cache_path(tmp_path / "shapes", "custom-train", {"x": 1}).suffix == ".npz"


def test_bad_parameters_raise_value_error() -> None:
    with pytest.raises(ValueError, match="classes"):
        S.ShapeParams(classes=("spaceship",))
    with pytest.raises(ValueError, match="per_class"):
        S.ShapeParams(per_class=(1, 2))
    with pytest.raises(ValueError, match="deform"):
        S.ShapeParams(deform=0.9)
    with pytest.raises(ValueError, match="num_points"):
        S.generate_shape("mug", 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="preset"):
        S.load_shapes_dataset("huge", "train")
    with pytest.raises(ValueError, match="split"):
        S.generate_shapes("tiny", "dev")
