"""A generated stand-in for LRGB's PascalVOC-sp: node classification of superpixel graphs.

**The real set** (Dwivedi et al., 2022, the Long Range Graph Benchmark): the images of Pascal VOC 2011
cut into SLIC superpixels; one graph per image (11,355 graphs, ~479 nodes and ~2,710 directed edges
on average; split 8,498 / 1,428 / 1,429), a node per superpixel with 14 float features (colour
statistics of its pixels and its position), 2 float features per edge, and as node label the VOC class
(20 objects + background, background the large majority) most of its pixels carry; the metric is
macro F1 over the 21 classes.

**The stand-in** (:func:`generate_superpixel_graphs`, splits cached by
:func:`load_generated_superpixels`), written here from that description:

* images (``image_size`` square, RGB floats in [0, 1]): a smooth, muted, noisy background with a few
  small "clutter" blobs in object colours (background class), and 1-3 objects;
* object classes: ``num_classes`` K (default 8, at most 20 like VOC), each a pair (shape, palette):
  shapes from :data:`SHAPES` (disc, bar, square, ring, triangle, cross; random size and rotation, a
  little occlusion allowed) and palettes (evenly spaced saturated hues, jittered per object and shaded
  across it) shared by two classes each: object classes ``2p`` and ``2p + 1`` (node labels ``2p + 1``,
  ``2p + 2``) have palette ``p`` and different shapes -- disc / bar, square / ring, triangle / cross,
  repeating -- and every shape recurs in other palettes (with an odd K the last palette has one
  class). A superpixel's colour thus tells the palette (or clutter), not the class, and its shape
  alone neither; the class needs the shape of the object's whole region -- tens of superpixels, several
  hops across -- the long-range aggregation PascalVOC-sp asks for;
* superpixels: a SLIC-like k-means in (colour, position) space from seeds on a staggered (hexagonal)
  grid (each pixel compared with the centres of the 3 x 3 grid cells around it), a few iterations,
  then every superpixel made 4-connected (stray pieces merged into the neighbour they share most
  boundary with); ``n_segments`` seeds: default 196 (~195 nodes, ~1,050 directed edges per graph),
  484 in the ``lrgb`` preset (~482 nodes, ~2,710 edges: the real set's sizes);
* node features (14, float32): mean, std, max and min of the superpixel's R, G, B (4 x 3) then its
  centroid's y and x divided by the image side - 1 (in [0, 1]); LRGB's release has 14 columns of the
  same kinds (colour statistics and position), but their exact order and normalisation are LRGB's own,
  not reproduced here;
* edges: the region adjacency graph -- superpixels with 4-neighbouring pixels -- both directions
  listed (PyG's convention); edge features (2, float32): the Euclidean distance of the two mean colours
  and of the two centroids (normalised as above);
* node label: the class most of the superpixel's pixels carry (0 = background, 1..K the objects).

What it keeps: graphs of a few hundred nodes from a planar region adjacency graph (degree ~5-6,
connected), the 14 / 2 continuous feature layout, node classes with a background majority and macro
F1's need to get the rare classes right, and a label that needs region-wide evidence. What it cannot:
natural images (their textures, clutter and variety) and VOC's 20 semantic classes; the default has 8
object classes + background (9) so that CPU training sees every class often; ``num_classes=20`` gives
VOC's 21.
"""
from __future__ import annotations

import colorsys
import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

import numpy as np

try:
    from scipy import ndimage
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
except ModuleNotFoundError as exc:  # optional dependency: the 'tasks' extra
    raise ModuleNotFoundError("pointformers.data.superpixels needs scipy: pip install 'pointformers[tasks]'",
                              name=exc.name) from exc

from .cache import cached_arrays, default_cache_dir
from .graphs import CONTINUOUS, GraphSet

__all__ = ["SHAPES", "NODE_FEATURES", "EDGE_FEATURES", "SuperpixelParams", "PRESETS", "SPLITS", "LRGB_SPLIT_SIZES",
           "class_names", "preset_params", "render_image", "slic_superpixels", "region_graph",
           "generate_superpixel_graphs", "load_generated_superpixels"]

GENERATOR_VERSION = 1
SPLITS = ("train", "val", "test")
#: LRGB PascalVOC-sp's train / val / test graph counts.
LRGB_SPLIT_SIZES = (8498, 1428, 1429)
SHAPES = ("disc", "bar", "square", "ring", "triangle", "cross")
NODE_FEATURES = ("mean_r", "mean_g", "mean_b", "std_r", "std_g", "std_b", "max_r", "max_g", "max_b",
                 "min_r", "min_g", "min_b", "centroid_y", "centroid_x")
EDGE_FEATURES = ("colour_distance", "centroid_distance")


def _int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _real(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and np.isfinite(v)


@dataclass(frozen=True)
class SuperpixelParams:
    """Options of :func:`generate_superpixel_graphs`.

    Attributes:
        image_size: image side in pixels (square images).
        num_classes: object classes K (the node classes are K + 1 with background); 2..20.
        n_segments: superpixel seeds (a staggered near-square grid); the graphs have about this many nodes.
        compactness: weight of position against colour in the clustering (larger: rounder, more
            grid-like superpixels; smaller: closer to colour edges).
        slic_iters: k-means iterations.
        min_objects, max_objects: objects per image (a uniform count; fewer when they do not fit with
            at most 15 % of one object hidden by another).
        min_radius, max_radius: range of the object size r (a disc's radius; the other shapes are
            scaled to areas of 0.75-1x that disc's) as a fraction of the image side.
        colour_jitter: std of the per-object shift of its palette colour (per channel).
        noise: std of the per-pixel colour noise.
        clutter: small background blobs in object palette colours per image.
    """

    image_size: int = 80
    num_classes: int = 8
    n_segments: int = 196
    compactness: float = 0.3
    slic_iters: int = 5
    min_objects: int = 1
    max_objects: int = 3
    min_radius: float = 0.14
    max_radius: float = 0.28
    colour_jitter: float = 0.04
    noise: float = 0.04
    clutter: int = 3

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name}: {why}, got {getattr(self, name)!r}")

        for name, lo in (("image_size", 24), ("num_classes", 2), ("n_segments", 4), ("slic_iters", 1),
                         ("min_objects", 1), ("max_objects", 1), ("clutter", 0)):
            if not _int(getattr(self, name)) or getattr(self, name) < lo:
                bad(name, f"expected an integer >= {lo}")
        if self.num_classes > 20:
            bad("num_classes", "expected at most 20 object classes (VOC's count)")
        if self.n_segments > self.image_size ** 2 // 9:
            bad("n_segments", f"expected at most image_size**2 / 9 = {self.image_size ** 2 // 9} (3 x 3 pixels each)")
        if self.max_objects < self.min_objects or self.max_objects > 6:
            bad("max_objects", f"expected min_objects ({self.min_objects}) <= max_objects <= 6")
        for name in ("compactness", "min_radius", "max_radius", "colour_jitter", "noise"):
            if not _real(getattr(self, name)) or getattr(self, name) < 0:
                bad(name, "expected a finite number >= 0")
        if not 0.05 <= self.min_radius <= 0.4:
            bad("min_radius", "expected a fraction of the image side in [0.05, 0.4]")
        if not self.min_radius <= self.max_radius <= 0.4:
            bad("max_radius", f"expected min_radius ({self.min_radius}) <= max_radius <= 0.4")
        if self.compactness == 0:
            bad("compactness", "expected a positive weight")

    def replace(self, **changes: Any) -> "SuperpixelParams":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Split sizes (train, val, test) and parameters: ``tiny`` for tests (48 px images, ~64 nodes),
#: ``small`` for CPU training (80 px, ~195 nodes, 9 classes; ~25 ms a graph on one core: ~30 s for the
#: three splits), ``lrgb`` the real set's split sizes, ~480 nodes and 21 classes (128 px; ~50 ms a
#: graph: ~10 minutes).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"sizes": (24, 8, 8), "params": dict(image_size=48, n_segments=64)},
    "small": {"sizes": (1000, 150, 150), "params": {}},
    "lrgb": {"sizes": LRGB_SPLIT_SIZES, "params": dict(image_size=128, n_segments=484, num_classes=20)},
}


def _palettes(num_classes: int) -> np.ndarray:
    """(ceil(K / 2), 3) RGB of the palettes: evenly spaced saturated hues."""
    n = (num_classes + 1) // 2
    return np.array([colorsys.hsv_to_rgb(p / n, 0.8, 0.9) for p in range(n)])


def _class_shape(k: int) -> str:
    """Shape of object class k (0-based): consecutive classes (one palette) differ in shape."""
    return SHAPES[k % len(SHAPES)]


def class_names(num_classes: int) -> list[str]:
    """``["background", "disc/p0", "bar/p0", "square/p1", ...]``: node class c's name (c = 0..K)."""
    return ["background"] + [f"{_class_shape(k)}/p{k // 2}" for k in range(num_classes)]


def _shape_mask(shape: str, yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, r: float, angle: float) -> np.ndarray:
    """(H, W) bool mask of one object of radius-like size r, centre (cy, cx), rotated by ``angle``."""
    c, s = np.cos(angle), np.sin(angle)
    u, v = c * (xx - cx) + s * (yy - cy), -s * (xx - cx) + c * (yy - cy)
    d = np.hypot(u, v)
    if shape == "disc":
        return d <= r
    if shape == "square":  # side ~1.75 r: about the disc's area
        return np.maximum(abs(u), abs(v)) <= 0.88 * r
    if shape == "triangle":  # equilateral, circumradius 1.4 r (area ~2.5 r^2, the disc's 3.1 r^2)
        R = 1.4 * r
        return np.all([(c2 * u + s2 * v) <= R / 2 for c2, s2 in
                       ((np.cos(a), np.sin(a)) for a in (np.pi, np.pi / 3, -np.pi / 3))], axis=0)
    if shape == "ring":  # hole of half the radius: at least one superpixel across
        return (d <= 1.1 * r) & (d >= 0.55 * r)
    if shape == "bar":  # arms and bars at least ~1.5 superpixels wide at the smallest sizes
        return (abs(u) <= 1.5 * r) & (abs(v) <= 0.4 * r)
    if shape == "cross":
        return ((abs(u) <= 1.2 * r) & (abs(v) <= 0.4 * r)) | ((abs(v) <= 1.2 * r) & (abs(u) <= 0.4 * r))
    raise ValueError(f"shape: unknown {shape!r}")


def _smooth_field(rng: np.random.Generator, n: int, cells: int, channels: int) -> np.ndarray:
    """(n, n, channels) smooth random field in [0, 1]: a coarse random grid, bilinearly upsampled."""
    coarse = rng.random((cells, cells, channels))
    return ndimage.zoom(coarse, (n / cells, n / cells, 1), order=1, mode="nearest")[:n, :n]


def render_image(rng: np.random.Generator, params: SuperpixelParams = SuperpixelParams()
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image: RGB (H, W, 3) float32 in [0, 1], pixel classes (H, W) int64 (0 background, 1..K) and
    object instances (H, W) int64 (0 background, 1.. the objects in drawing order)."""
    p, n = params, params.image_size
    yy, xx = np.mgrid[:n, :n].astype(np.float64)
    palettes = _palettes(p.num_classes)
    # background: a muted (low saturation) smooth colour field plus a texture of finer blobs
    grey = 0.3 + 0.4 * _smooth_field(rng, n, 4, 1)
    tint = 0.15 * (_smooth_field(rng, n, 3, 3) - 0.5)
    texture = 0.12 * (_smooth_field(rng, n, max(4, n // 6), 1) - 0.5)
    img = grey + tint + texture
    for _ in range(p.clutter):  # small palette-coloured blobs: colour alone does not say "object"
        r = rng.uniform(0.03, 0.06) * n
        blob = np.hypot(yy - rng.uniform(0, n), xx - rng.uniform(0, n)) <= r
        img[blob] = palettes[rng.integers(len(palettes))] + rng.normal(0, p.colour_jitter, 3)
    classes = np.zeros((n, n), np.int64)
    instances = np.zeros((n, n), np.int64)
    want = int(rng.integers(p.min_objects, p.max_objects + 1))
    placed, tries = 0, 0
    while placed < want and tries < 30 * want:
        tries += 1
        k = int(rng.integers(p.num_classes))
        r = rng.uniform(p.min_radius, p.max_radius) * n
        margin = min(r, n / 2 - 1)
        mask = _shape_mask(_class_shape(k), yy, xx, rng.uniform(margin, n - margin), rng.uniform(margin, n - margin),
                           r, rng.uniform(0, 2 * np.pi))
        area = mask.sum()
        # occlusion is allowed but limited, so that each object keeps most of its shape
        overlap = mask & (instances > 0)
        if area < 9 or overlap.sum() > 0.15 * area or any(
                (overlap & (instances == j)).sum() > 0.15 * (instances == j).sum() for j in range(1, placed + 1)):
            continue
        placed += 1
        colour = palettes[k // 2] + rng.normal(0, p.colour_jitter, 3)
        # shading across the object: its colour varies, so one superpixel's colour is a noisy sample
        g = rng.normal(0, 1, 2)
        shade = 1 + 0.12 * ((yy - yy[mask].mean()) * g[0] + (xx - xx[mask].mean()) * g[1]) / (r * np.hypot(*g) + 1e-9)
        img[mask] = colour * shade[mask, None]
        classes[mask], instances[mask] = k + 1, placed
    img = img + rng.normal(0, p.noise, img.shape)
    return np.clip(img, 0, 1).astype(np.float32), classes, instances


def slic_superpixels(image: np.ndarray, n_segments: int, compactness: float = 0.3, iters: int = 5) -> np.ndarray:
    """SLIC-like over-segmentation of ``image`` (H, W, 3) into 4-connected regions: labels (H, W) int64,
    0..N-1 numbered in raster order of their first pixel.

    k-means on (r, g, b, y, x) with the distance ``|colour|^2 + (compactness * |position| / S)^2``
    (S the seed spacing), seeds on a staggered near-square grid; each pixel is compared only with the centres of
    the 3 x 3 grid cells around its own (SLIC's local search), which keeps a step O(9 H W).
    """
    H, W, _ = image.shape
    gh = max(1, int(round(np.sqrt(n_segments * H / W))))
    gw = max(1, int(round(n_segments / gh)))
    sy, sx = H / gh, W / gw
    yy, xx = np.mgrid[:H, :W]
    feats = np.concatenate([image.reshape(-1, 3), yy.reshape(-1, 1), xx.reshape(-1, 1)], axis=1).astype(np.float64)
    cy = np.minimum((yy / sy).astype(int), gh - 1).reshape(-1)
    cx = np.minimum((xx / sx).astype(int), gw - 1).reshape(-1)
    # candidate centres (P, 9) of each pixel: the seeds of its own and the 8 neighbouring grid cells
    dy, dx = np.meshgrid([-1, 0, 1], [-1, 0, 1], indexing="ij")
    ny, nx = cy[:, None] + dy.reshape(1, -1), cx[:, None] + dx.reshape(1, -1)
    valid = (ny >= 0) & (ny < gh) & (nx >= 0) & (nx < gw)
    cand = np.where(valid, ny * gw + nx, 0)
    K = gh * gw
    # initial centres: each grid cell's mean colour, at the cell's centre shifted by a quarter cell left
    # in even rows and right in odd rows -- a hexagonal packing, whose regions have ~6 neighbours like
    # SLIC's on natural images (a square grid gives ~4)
    own = cy * gw + cx
    counts = np.bincount(own, minlength=K).astype(np.float64)
    centres = np.stack([np.bincount(own, feats[:, j], minlength=K) for j in range(5)], 1) / counts[:, None]
    row, col = np.divmod(np.arange(K), gw)
    centres[:, 3] = (row + 0.5) * sy
    centres[:, 4] = np.clip((col + 0.5 + np.where(row % 2, 0.25, -0.25)) * sx, 0, W - 1)
    weight = np.array([1.0, 1.0, 1.0, (compactness / sy) ** 2, (compactness / sx) ** 2])
    for _ in range(iters):
        d = (((feats[:, None, :] - centres[cand]) ** 2) * weight).sum(-1)
        d[~valid] = np.inf
        lab = cand[np.arange(len(cand)), d.argmin(1)]
        counts = np.bincount(lab, minlength=K).astype(np.float64)
        sums = np.stack([np.bincount(lab, feats[:, j], minlength=K) for j in range(5)], 1)
        alive = counts > 0  # an emptied cluster keeps its old centre (and may win pixels back)
        centres[alive] = sums[alive] / counts[alive, None]
    return _make_connected(lab.reshape(H, W), sy * sx / 4)


def _neighbour_pairs(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat pixel ids (a, b) of all horizontally and vertically adjacent pixel pairs, each pair once."""
    H, W = labels.shape
    ids = np.arange(H * W).reshape(H, W)
    a = np.concatenate([ids[:, :-1].ravel(), ids[:-1, :].ravel()])
    b = np.concatenate([ids[:, 1:].ravel(), ids[1:, :].ravel()])
    return a, b


def _make_connected(labels: np.ndarray, min_size: float) -> np.ndarray:
    """``labels`` (H, W) with every region 4-connected: each label's largest piece keeps it, other pieces
    and pieces under ``min_size`` pixels join the neighbouring kept region they share most boundary
    with (rounds until none is left). Returns labels 0..N-1 in raster order of first pixel."""
    flat = labels.ravel()
    P = flat.size
    a, b = _neighbour_pairs(labels)
    same = flat[a] == flat[b]
    graph = coo_matrix((np.ones(same.sum()), (a[same], b[same])), shape=(P, P))
    _, comp = connected_components(graph, directed=False)
    size = np.bincount(comp)
    # the kept piece of each label: its largest (ties: the lowest component id)
    label_of = flat[np.unique(comp, return_index=True)[1]]  # (pieces,) the label each piece carries
    order = np.lexsort((np.arange(len(size)), -size, label_of))
    kept = np.zeros(len(size), bool)
    first = np.ones(len(order), bool)
    first[1:] = label_of[order][1:] != label_of[order][:-1]
    kept[order[first]] = True
    kept &= size >= min_size
    if not kept.any():
        kept[size.argmax()] = True
    cross = ~same
    while not kept.all():
        ca, cb = comp[a[cross]], comp[b[cross]]
        src = np.concatenate([ca, cb])
        dst = np.concatenate([cb, ca])
        use = ~kept[src] & kept[dst]
        pair, count = np.unique(src[use] * len(size) + dst[use], return_counts=True)
        s, t = pair // len(size), pair % len(size)
        # for each stray piece, the kept neighbour with the longest shared boundary
        best = np.lexsort((-count, s))
        head = np.ones(len(best), bool)
        head[1:] = s[best][1:] != s[best][:-1]
        target = np.arange(len(size))
        target[s[best][head]] = t[best][head]
        kept[s[best][head]] = True
        comp = target[comp]
        cross = comp[a] != comp[b]
    _, first_pixel, inv = np.unique(comp, return_index=True, return_inverse=True)
    rank = np.empty(len(first_pixel), np.int64)
    rank[np.argsort(first_pixel)] = np.arange(len(first_pixel))
    return rank[inv].reshape(labels.shape)


def region_graph(image: np.ndarray, segments: np.ndarray, classes: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The region adjacency graph of ``segments`` (H, W) int 0..N-1 over ``image`` (H, W, 3) with pixel
    ``classes`` (H, W): node features (N, 14) float32 (:data:`NODE_FEATURES`), edge_index (2, E) int64
    (both directions, sorted), edge features (E, 2) float32 (:data:`EDGE_FEATURES`) and node labels (N,)
    int64 (each superpixel's majority pixel class; ties: the lower class)."""
    H, W, _ = image.shape
    seg = segments.ravel()
    N = int(seg.max()) + 1
    pix = image.reshape(-1, 3).astype(np.float64)
    count = np.bincount(seg, minlength=N).astype(np.float64)
    mean = np.stack([np.bincount(seg, pix[:, j], N) for j in range(3)], 1) / count[:, None]
    sq = np.stack([np.bincount(seg, pix[:, j] ** 2, N) for j in range(3)], 1) / count[:, None]
    std = np.sqrt(np.maximum(sq - mean ** 2, 0))
    order = np.argsort(seg, kind="stable")
    starts = np.searchsorted(seg[order], np.arange(N))
    mx, mn = np.maximum.reduceat(pix[order], starts), np.minimum.reduceat(pix[order], starts)
    yy, xx = np.mgrid[:H, :W]
    cent = np.stack([np.bincount(seg, yy.ravel(), N) / count / max(H - 1, 1),
                     np.bincount(seg, xx.ravel(), N) / count / max(W - 1, 1)], 1)
    x = np.concatenate([mean, std, mx, mn, cent], 1).astype(np.float32)
    a, b = _neighbour_pairs(segments)
    sa, sb = seg[a], seg[b]
    diff = sa != sb
    pairs = np.unique(np.concatenate([sa[diff] * N + sb[diff], sb[diff] * N + sa[diff]]))
    ei = np.stack([pairs // N, pairs % N]).astype(np.int64)
    e = np.stack([np.linalg.norm(mean[ei[0]] - mean[ei[1]], axis=1),
                  np.linalg.norm(cent[ei[0]] - cent[ei[1]], axis=1)], 1).astype(np.float32)
    C = int(classes.max()) + 1
    votes = np.bincount(seg * C + classes.ravel(), minlength=N * C).reshape(N, C)
    return x, ei, e, votes.argmax(1).astype(np.int64)


def _check_count(count: Any) -> None:
    if not _int(count) or count < 0:
        raise ValueError(f"count: expected a number of graphs >= 0, got {count!r}")


def generate_superpixel_graphs(count: int, params: SuperpixelParams = SuperpixelParams(), seed: int = 0) -> GraphSet:
    """``count`` superpixel graphs (module doc) as a node-level :class:`GraphSet` named ``"pascalvoc-sp"``.

    Graph i comes from its own stream ``(seed, i)``: the same seed and params give the same graphs, and
    the first graphs do not depend on ``count``."""
    _check_count(count)
    if not _int(seed) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    p = params
    nodes, edge_index, edges, targets = [], [], [], []
    for i in range(count):
        rng = np.random.default_rng([int(seed), 8401, i])
        img, classes, _ = render_image(rng, p)
        seg = slic_superpixels(img, p.n_segments, p.compactness, p.slic_iters)
        x, ei, e, y = region_graph(img, seg, classes)
        nodes.append(x)
        edge_index.append(ei)
        edges.append(e)
        targets.append(y)
    meta = {"class_names": class_names(p.num_classes), "num_classes": p.num_classes + 1,
            "node_features": list(NODE_FEATURES), "edge_features": list(EDGE_FEATURES),
            "params": p.to_dict(), "seed": int(seed), "generator_version": GENERATOR_VERSION}
    return GraphSet(nodes, edge_index, edges, targets, level="node", name="pascalvoc-sp", feature_kind=CONTINUOUS,
                    meta=meta)


def _flatten(gs: GraphSet) -> dict[str, np.ndarray]:
    """Ragged per-graph arrays as concatenations plus (S + 1,) node and edge offsets; edge_index (2, sum E)
    keeps per-graph node ids, as int32 (half the file: node ids stay far below 2**31)."""
    def offsets(arrs: list[np.ndarray], axis: int) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([a.shape[axis] for a in arrs])]).astype(np.int64)

    return {"nodes": np.concatenate(gs.nodes).astype(np.float32), "node_offsets": offsets(gs.nodes, 0),
            "edge_index": np.concatenate(gs.edge_index, 1).astype(np.int32),
            "edges": np.concatenate(gs.edges).astype(np.float32), "edge_offsets": offsets(gs.edges, 0),
            "targets": np.concatenate(gs.targets).astype(np.int64)}


def _validate(arr: Mapping[str, np.ndarray]) -> None:
    no, eo = arr["node_offsets"], arr["edge_offsets"]
    if (len(no) != len(eo) or no[0] != 0 or eo[0] != 0 or no[-1] != len(arr["nodes"]) or no[-1] != len(arr["targets"])
            or eo[-1] != len(arr["edges"]) or eo[-1] != arr["edge_index"].shape[1] or np.any(np.diff(no) < 1)):
        raise ValueError("superpixel cache entry: offsets do not match the arrays")


def preset_params(preset: str) -> SuperpixelParams:
    """The :class:`SuperpixelParams` of a :data:`PRESETS` name."""
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown superpixel preset {preset!r}; valid presets: {sorted(PRESETS)}")
    return SuperpixelParams(**PRESETS[preset]["params"])


def load_generated_superpixels(split: str, preset: str = "small", seed: int = 0,
                               cache_dir: str | os.PathLike | None = None,
                               params: SuperpixelParams | None = None) -> GraphSet:
    """One split (``"train"``, ``"val"``, ``"test"``) of a :data:`PRESETS` stand-in: the preset's count of
    graphs generated from seed ``3 * seed + split index`` (splits are disjoint streams), cached under
    ``cache_dir`` (default :func:`~pointformers.data.cache.default_cache_dir`) keyed by the parameters,
    count, seed and :data:`GENERATOR_VERSION`. ``params`` replaces the preset's parameters (not its sizes)."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    p = params if params is not None else preset_params(preset)
    if not _int(seed) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    k = SPLITS.index(split)
    count, split_seed = int(PRESETS[preset]["sizes"][k]), 3 * int(seed) + k
    key = {"generator": "pointformers.superpixels", "version": GENERATOR_VERSION, "params": p.to_dict(),
           "count": count, "seed": split_seed}
    arr = cached_arrays(cache_dir if cache_dir is not None else default_cache_dir(), f"pascalvoc-sp-{preset}-{split}",
                        key, lambda: _flatten(generate_superpixel_graphs(count, p, split_seed)), _validate)
    no, eo = arr["node_offsets"], arr["edge_offsets"]
    S, ei = len(no) - 1, arr["edge_index"].astype(np.int64)
    meta = {"class_names": class_names(p.num_classes), "num_classes": p.num_classes + 1,
            "node_features": list(NODE_FEATURES), "edge_features": list(EDGE_FEATURES), "params": p.to_dict(),
            "seed": split_seed, "generator_version": GENERATOR_VERSION, "preset": preset, "split": split}
    return GraphSet([arr["nodes"][no[i]:no[i + 1]] for i in range(S)],
                    [ei[:, eo[i]:eo[i + 1]] for i in range(S)],
                    [arr["edges"][eo[i]:eo[i + 1]] for i in range(S)],
                    [arr["targets"][no[i]:no[i + 1]] for i in range(S)],
                    level="node", name="pascalvoc-sp", feature_kind=CONTINUOUS, meta=meta)
