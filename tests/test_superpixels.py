"""The generated PascalVOC-sp stand-in: superpixel graphs of synthetic images (data.superpixels)."""
import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from pointformers.data import superpixels as sp
from pointformers.data.graphs import GraphSet

TINY = sp.preset_params("tiny")


@pytest.fixture(scope="module")
def tiny() -> GraphSet:
    return sp.generate_superpixel_graphs(12, TINY, seed=3)


def _components(n: int, ei: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    keep = np.ones(ei.shape[1], bool) if keep is None else keep
    return connected_components(coo_matrix((np.ones(keep.sum()), (ei[0][keep], ei[1][keep])), shape=(n, n)),
                                directed=False)[1]


def test_generation_is_deterministic_and_prefix_stable(tiny):
    again = sp.generate_superpixel_graphs(12, TINY, seed=3)
    for a, b in ((tiny.nodes, again.nodes), (tiny.edge_index, again.edge_index), (tiny.edges, again.edges),
                 (tiny.targets, again.targets)):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # graph i has its own stream: fewer graphs are a prefix, another seed differs
    few = sp.generate_superpixel_graphs(3, TINY, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(few.nodes, tiny.nodes[:3]))
    assert not np.array_equal(sp.generate_superpixel_graphs(1, TINY, seed=4).nodes[0], tiny.nodes[0])


def test_layout_features_and_region_adjacency_graph(tiny):
    assert (tiny.level, tiny.name, tiny.feature_kind) == ("node", "pascalvoc-sp", "continuous")
    assert tiny.meta["class_names"][0] == "background" and len(tiny.meta["class_names"]) == TINY.num_classes + 1
    assert tiny.num_node_features == len(sp.NODE_FEATURES) == 14 and tiny.num_edge_features == 2
    for x, ei, e, y in zip(tiny.nodes, tiny.edge_index, tiny.edges, tiny.targets):
        n = len(x)
        assert x.dtype == np.float32 and e.dtype == np.float32 and ei.dtype == np.int64 and y.dtype == np.int64
        assert 0.7 * TINY.n_segments <= n <= TINY.n_segments
        assert np.isfinite(x).all() and np.isfinite(e).all()
        mean, std, mx, mn, cent = x[:, 0:3], x[:, 3:6], x[:, 6:9], x[:, 9:12], x[:, 12:14]
        assert (mn >= 0).all() and (mx <= 1).all() and (mn <= mean + 1e-6).all() and (mean <= mx + 1e-6).all()
        assert (std >= 0).all() and (cent >= 0).all() and (cent <= 1).all()
        # symmetric, no self loops or duplicates, connected; planar-like degree (LRGB: ~5.7)
        assert (ei[0] != ei[1]).all()
        pairs = set(zip(ei[0].tolist(), ei[1].tolist()))
        assert len(pairs) == ei.shape[1] and pairs == set(zip(ei[1].tolist(), ei[0].tolist()))
        assert len(np.unique(_components(n, ei))) == 1
        assert 3.5 < ei.shape[1] / n < 7
        # edge features: distances of the end points' mean colours and centroids
        np.testing.assert_allclose(e[:, 0], np.linalg.norm(mean[ei[0]] - mean[ei[1]], axis=1), atol=1e-5)
        np.testing.assert_allclose(e[:, 1], np.linalg.norm(cent[ei[0]] - cent[ei[1]], axis=1), atol=1e-5)
        assert y.min() >= 0 and y.max() <= TINY.num_classes
    y = np.concatenate(tiny.targets)
    freq = np.bincount(y, minlength=TINY.num_classes + 1)
    assert freq.argmax() == 0 and freq[0] > 0.5 * len(y)  # background is the majority, as in VOC
    assert (freq[1:] > 0).sum() >= TINY.num_classes - 2


def test_superpixels_are_connected_and_follow_object_boundaries():
    img, classes, _ = sp.render_image(np.random.default_rng(7), TINY)
    assert img.shape == (48, 48, 3) and img.dtype == np.float32 and img.min() >= 0 and img.max() <= 1
    seg = sp.slic_superpixels(img, TINY.n_segments, TINY.compactness, TINY.slic_iters)
    assert seg.min() == 0 and len(np.unique(seg)) == seg.max() + 1
    for s in range(seg.max() + 1):  # each superpixel is one 4-connected piece
        m = seg == s
        a = np.flatnonzero(m)
        ids = -np.ones(m.size, np.int64)
        ids[a] = np.arange(len(a))
        r, c = np.nonzero(m)
        ei = [[], []]
        for dr, dc in ((0, 1), (1, 0)):
            ok = (r + dr < m.shape[0]) & (c + dc < m.shape[1])
            nb = ids[(r[ok] + dr) * m.shape[1] + c[ok] + dc]
            ei[0] += ids[r[ok] * m.shape[1] + c[ok]][nb >= 0].tolist()
            ei[1] += nb[nb >= 0].tolist()
        assert len(np.unique(_components(len(a), np.array(ei, dtype=np.int64)))) == 1
    # node labels are majority classes: few pixels disagree with their superpixel's label
    _, _, _, y = sp.region_graph(img, seg, classes)
    assert (y[seg] == classes).mean() > 0.95


def _region_moments(x: np.ndarray) -> list[float]:
    """Rotation-invariant shape descriptors of a region from its superpixel centroids: |mu_k| / rms^k of
    the complex moments k = 2 (elongation), 3 (triangle-like), 4 (square/cross-like), and the gap in
    the middle (a ring's hole)."""
    z = x[:, 13] + 1j * x[:, 12]
    z = z - z.mean()
    rms = np.sqrt((abs(z) ** 2).mean()) + 1e-9
    return [abs((z ** k).mean()) / rms ** k for k in (2, 3, 4)] + [abs(z).min() / rms]


def _nearest_mean_accuracy(f: np.ndarray, y: np.ndarray, fit: np.ndarray) -> float:
    """Accuracy on ~fit of the nearest class mean (standardised features) fitted on fit."""
    f = (f - f[fit].mean(0)) / (f[fit].std(0) + 1e-9)
    classes = np.unique(y[fit])
    means = np.stack([f[fit & (y == c)].mean(0) for c in classes])
    pred = classes[((f[:, None] - means[None]) ** 2).sum(-1).argmin(1)]
    return float((pred[~fit] == y[~fit]).mean())


def test_a_nodes_colour_tells_the_palette_but_only_its_objects_region_tells_the_class():
    """Classes 2p+1 and 2p+2 share palette p: a node's mean colour finds the pair but within it is at chance;
    the shape of the object's whole region (its nodes' centroids: many hops) tells the class."""
    gs = sp.generate_superpixel_graphs(128, TINY, seed=11)
    colour, node_y, node_g, shape, obj_y, obj_g = [], [], [], [], [], []
    for g, (x, ei, y) in enumerate(zip(gs.nodes, gs.edge_index, gs.targets)):
        colour.append(x[y > 0, :3])
        node_y.append(y[y > 0])
        node_g.append(np.full((y > 0).sum(), g))
        # the objects: connected groups of same-labelled object nodes
        comp = _components(len(x), ei, (y[ei[0]] == y[ei[1]]) & (y[ei[0]] > 0))
        for c in np.unique(comp[y > 0]):
            m = comp == c
            if m.sum() >= 3:
                shape.append(_region_moments(x[m]))
                obj_y.append(y[m][0])
                obj_g.append(g)
    colour, node_y, node_g = np.concatenate(colour), np.concatenate(node_y), np.concatenate(node_g)
    shape, obj_y, obj_g = np.array(shape), np.array(obj_y), np.array(obj_g)
    fit_nodes, fit_objs = node_g < 64, obj_g < 64  # fit on the first half of the images, score on the rest
    assert _nearest_mean_accuracy(colour, (node_y + 1) // 2, fit_nodes) > 0.95  # colour -> palette
    by_colour, by_shape = [], []
    for p in range((TINY.num_classes + 1) // 2):
        n, o = np.isin(node_y, (2 * p + 1, 2 * p + 2)), np.isin(obj_y, (2 * p + 1, 2 * p + 2))
        by_colour.append(_nearest_mean_accuracy(colour[n], node_y[n], fit_nodes[n]))
        by_shape.append(_nearest_mean_accuracy(shape[o], obj_y[o], fit_objs[o]))
    assert np.mean(by_colour) < 0.62, by_colour  # chance is 0.5
    assert np.mean(by_shape) > 0.85 and min(by_shape) > 0.75, by_shape


def test_cached_splits_round_trip(tmp_path, monkeypatch):
    train = sp.load_generated_superpixels("train", preset="tiny", cache_dir=tmp_path)
    assert len(train) == sp.PRESETS["tiny"]["sizes"][0] and len(list(tmp_path.iterdir())) == 1
    direct = sp.generate_superpixel_graphs(len(train), TINY, seed=0)
    # a second load reads the file (generation disabled) and gives the same arrays
    monkeypatch.setattr(sp, "generate_superpixel_graphs", lambda *a, **k: pytest.fail("regenerated"))
    again = sp.load_generated_superpixels("train", preset="tiny", cache_dir=tmp_path)
    for a, b, c in zip(train.nodes + train.edges + train.targets, again.nodes + again.edges + again.targets,
                       direct.nodes + direct.edges + direct.targets):
        assert np.array_equal(a, b) and np.array_equal(a, c) and a.dtype == b.dtype
    assert all(np.array_equal(a, b) and b.dtype == np.int64 for a, b in zip(train.edge_index, again.edge_index))
    assert again.level == "node" and again.meta["class_names"] == train.meta["class_names"]
    monkeypatch.undo()
    val = sp.load_generated_superpixels("val", preset="tiny", cache_dir=tmp_path)
    assert len(val) == 8 and not np.array_equal(val.nodes[0], train.nodes[0])  # splits: own seeds


@pytest.mark.parametrize("field, value", [("image_size", 10), ("num_classes", 21), ("num_classes", 1),
                                          ("n_segments", 5000), ("slic_iters", 0), ("compactness", 0.0),
                                          ("max_objects", 0), ("min_radius", 0.01), ("max_radius", 0.5),
                                          ("noise", float("nan")), ("clutter", -1), ("image_size", True)])
def test_bad_params_name_the_parameter(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        sp.SuperpixelParams(**{field: value})


def test_bad_arguments_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="^count:"):
        sp.generate_superpixel_graphs(-1)
    with pytest.raises(ValueError, match="^split:"):
        sp.load_generated_superpixels("dev", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="^preset:"):
        sp.load_generated_superpixels("train", preset="huge", cache_dir=tmp_path)
