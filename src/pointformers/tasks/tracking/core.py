"""The tracking task's core (HEPT's Tracking-6k / Tracking-60k), as in the authors' code.

Inputs, training pairs, loss and AP@k of the per-hit embedding:

* :func:`tracking_inputs` -- per-hit model inputs ``x`` (n, 15), kernel coordinates ``coords``
  (n, 6) and ``pos`` = (η, φ) (n, 2), exactly as HEPT's preprocessing builds them
  (the authors' code); :func:`generated_inputs` -- the same for ``n`` hits of a generated event.
* :func:`build_tracking_pairs` / :func:`add_random_pairs` -- the labelled hit pairs the
  contrastive loss is computed on (the authors' pair generation); :func:`draw_random_pairs` --
  the per-step random part on its own (the listed pairs are built once and cached).
* :func:`infonce_loss` -- the authors' InfoNCE loss (``l2_rbf``) or the paper's variant (App. A.3).
* :func:`ap_at_k` / :func:`tracking_metrics_at_k` / :func:`ap_at_k_split` -- the
  ``accuracy@0.9`` metric of the authors' code (``acc_and_pr_at_k``).
* :func:`knn_eta_phi_embedding` -- the kNN-in-(η, φ) baseline embedding.
* :func:`cluster_tracks` -- DBSCAN on embeddings, for event displays.

Nothing here builds an ``n × n`` matrix: neighbour searches are chunked (``cdist`` + ``topk``
over row blocks) or use :class:`scipy.spatial.cKDTree`; the loss only touches listed pairs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal, Sequence, Union

import numpy as np
import torch

try:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree
except ModuleNotFoundError as exc:  # optional dependency: the 'tasks' extra
    raise ModuleNotFoundError("pointformers.tasks.tracking needs scipy: pip install 'pointformers[tasks]'",
                              name=exc.name) from exc

from ...data.event import CLUSTER_FEATURES, TrackingEvent

__all__ = [
    "TRACKING_FEATURES",
    "TRACKING_COORDS",
    "PIXEL_LAYERS",
    "TrackingInputs",
    "TrackingPairs",
    "pixel_layer_index",
    "tracking_inputs",
    "generated_inputs",
    "radius_graph_capped",
    "build_tracking_pairs",
    "add_random_pairs",
    "draw_random_pairs",
    "infonce_loss",
    "pair_logits",
    "tracking_metrics_at_k",
    "ap_at_k",
    "ap_at_k_split",
    "knn_eta_phi_embedding",
    "cluster_tracks",
]

#: Names of the 15 model-input columns of :attr:`TrackingInputs.x`, in order.
TRACKING_FEATURES: tuple[str, ...] = ("r", "phi", "z", "eta_rz", "u", "v") + tuple(CLUSTER_FEATURES) + ("layer",)

#: Names of the 6 kernel-coordinate columns of :attr:`TrackingInputs.coords`, in order.
TRACKING_COORDS: tuple[str, ...] = ("eta", "phi_rad", "r", "phi", "z", "eta_rz")

#: The 18 pixel layers as (volume_id, layer_id), in the order of their dense index 0..17.
#: This is the authors' preprocessing order (``restrict_to_subdetectors``: the allowed
#: (volume, layer) pairs sorted lexicographically, then enumerated):
#: 0..6 = end cap (7, 2), (7, 4), ..., (7, 14); 7..10 = barrel (8, 2), (8, 4), (8, 6), (8, 8);
#: 11..17 = end cap (9, 2), ..., (9, 14). The authors enumerate only the layers *present* in
#: an event; a full TrackML event has all 18, so this fixed table gives the same numbers.
PIXEL_LAYERS: tuple[tuple[int, int], ...] = tuple(
    [(7, l) for l in range(2, 15, 2)] + [(8, l) for l in range(2, 9, 2)] + [(9, l) for l in range(2, 15, 2)]
)

# Divisors applied to the 14 geometric/cluster columns (HEPT's ``feature_scale``):
# r/1000, φ/π, z/1000, eta_rz, u/(1/1000), v/(1/1000), cluster features unscaled.
_FEATURE_SCALE = np.array([1000.0, math.pi, 1000.0, 1.0, 1e-3, 1e-3] + [1.0] * len(CLUSTER_FEATURES))

# Rows per chunk are chosen so that one chunk's distance block has about this many entries.
_CHUNK_ELEMS = 1 << 24


# ----------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------


@dataclass
class TrackingInputs:
    """Model inputs and per-hit truth for one cloud of ``n`` hits.

    Attributes:
        x: ``(n, 15)`` features in :data:`TRACKING_FEATURES` order.
        coords: ``(n, 6)`` kernel coordinates in :data:`TRACKING_COORDS` order
            (η in column 0, φ [rad] in column 1).
        pos: ``(n, 2)`` (η, φ [rad]): the coordinates of the pair radius graph and regions.
        particle_id: ``(n,)`` int64, 0 for noise.
        pt: ``(n,)`` transverse momentum [GeV] of the hit's particle (0 for noise).
        reconstructable: ``(n,)`` bool (particle id > 0 and hits on ≥ 3 distinct layers).
        layer: ``(n,)`` int64 dense pixel-layer index 0..17 (see :data:`PIXEL_LAYERS`).
    """

    x: torch.Tensor
    coords: torch.Tensor
    pos: torch.Tensor
    particle_id: torch.Tensor
    pt: torch.Tensor
    reconstructable: torch.Tensor
    layer: torch.Tensor

    @property
    def num_hits(self) -> int:
        return int(self.x.shape[0])

    def to(self, device: Union[str, torch.device]) -> "TrackingInputs":
        """A copy with every tensor moved to ``device``."""
        return TrackingInputs(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def pixel_layer_index(volume_id: np.ndarray, layer_id: np.ndarray) -> np.ndarray:
    """Dense index 0..17 of each hit's pixel layer (see :data:`PIXEL_LAYERS`), ``(n,)`` int64.

    Raises:
        ValueError: if a hit is not on one of the 18 pixel layers.
    """
    vol = np.asarray(volume_id, dtype=np.int64)
    lay = np.asarray(layer_id, dtype=np.int64)
    table = np.full((10, 16), -1, dtype=np.int64)  # (volume, layer) -> dense index
    for i, (v, l) in enumerate(PIXEL_LAYERS):
        table[v, l] = i
    inside = (vol >= 0) & (vol < 10) & (lay >= 0) & (lay < 16)
    out = np.full(vol.shape, -1, dtype=np.int64)
    out[inside] = table[vol[inside], lay[inside]]
    if (out < 0).any():
        bad = int(np.flatnonzero(out < 0)[0])
        raise ValueError(
            f"event.volume_id/layer_id: hit {bad} is on (volume {vol[bad]}, layer {lay[bad]}), "
            "not one of the 18 pixel layers (volume 8 layers 2-8, volumes 7/9 layers 2-14, even)"
        )
    return out


def tracking_inputs(event: TrackingEvent, dtype: torch.dtype = torch.float32) -> TrackingInputs:
    """Turn a :class:`TrackingEvent` into HEPT's model inputs (the authors' preprocessing).

    ``x`` columns (:data:`TRACKING_FEATURES`): ``r/1000, φ/π, z/1000, eta_rz, u·1000, v·1000,
    charge_frac, leta, lphi, lx, ly, lz, geta, gphi, layer/10`` with r, z in mm, φ = atan2(y, x),
    eta_rz = −log tan(θ/2), θ = atan2(r, z), conformal u = x/(x²+y²), v = y/(x²+y²) in mm⁻¹ (so
    u·1000 is in m⁻¹) and ``layer`` from :func:`pixel_layer_index`.
    ``coords`` = ``[η, φ, r/1000, φ/π, z/1000, eta_rz]`` with η = eta_rz; ``pos`` = ``(η, φ)``.

    The arithmetic is the HEPT authors' preprocessing, operation by operation, so that a model
    trained on their data gets the same float32 numbers: r, φ, eta_rz, u, v are computed in
    float32 from the float32 positions (as their pandas code on TrackML's float32 columns), the
    scales are float64 divisions (r / 1000, φ / π, u / (1/1000), …) rounded to float32, and
    layer / 10 is a float32 division. ``dtype`` = float64 keeps these float32 values exactly.
    """
    if not isinstance(event, TrackingEvent):
        raise ValueError(f"event: expected a TrackingEvent, got {type(event).__name__}")
    n = event.num_hits
    f32 = np.float32
    x = np.asarray(event.x, dtype=f32)
    y = np.asarray(event.y, dtype=f32)
    z = np.asarray(event.z, dtype=f32)
    cells = np.asarray(event.cells, dtype=np.float64).reshape(n, -1)
    if cells.shape[1] != len(CLUSTER_FEATURES):
        raise ValueError(f"event.cells: expected shape (n, {len(CLUSTER_FEATURES)}), got {cells.shape}")
    r2 = x * x + y * y
    r = np.sqrt(r2)
    if n and (r <= 0).any():
        raise ValueError("event.x/y: a hit lies on the beam axis (r = 0); η and u, v are undefined")
    phi = np.arctan2(y, x)
    with np.errstate(divide="ignore"):
        eta = -np.log(np.tan(np.arctan2(r, z) / f32(2.0))) if n else np.zeros(0, f32)
    u = x / r2 if n else np.zeros(0, f32)
    v = y / r2 if n else np.zeros(0, f32)
    layer = pixel_layer_index(event.volume_id, event.layer_id)

    raw = np.concatenate([np.stack([r, phi, z, eta, u, v], axis=1).astype(np.float64), cells], axis=1)
    scaled = (raw / _FEATURE_SCALE).astype(f32)
    feats = np.concatenate([scaled, (layer.astype(f32) / f32(10.0))[:, None]], axis=1)
    pos = np.stack([eta, phi], axis=1)
    coords = np.concatenate([pos, feats[:, :4]], axis=1)  # the authors: cat(pos, x[:, :4])

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)

    return TrackingInputs(
        x=t(feats),
        coords=t(coords),
        pos=t(pos),
        particle_id=torch.as_tensor(np.asarray(event.particle_id, dtype=np.int64)),
        pt=t(np.asarray(event.hit_pt, dtype=np.float64)),
        reconstructable=torch.as_tensor(np.asarray(event.reconstructable, dtype=bool)),
        layer=torch.as_tensor(layer),
    )


def generated_inputs(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Model inputs ``x`` (n, 15) and ``coords`` (n, 6) of the first ``n`` hits of a generated
    Tracking-60k-like event (:func:`pointformers.data.tracking.event_with_hits`): inputs of a
    chosen size for benchmarks and export checks."""
    from ...data.tracking import event_with_hits

    event, _ = event_with_hits(n, seed)
    inp = tracking_inputs(event, dtype=dtype)
    return inp.x[:n], inp.coords[:n]


def _as_inputs(data: Union[TrackingEvent, TrackingInputs], name: str = "data") -> TrackingInputs:
    if isinstance(data, TrackingInputs):
        return data
    if isinstance(data, TrackingEvent):
        return tracking_inputs(data, dtype=torch.float64)
    raise ValueError(f"{name}: expected a TrackingEvent or TrackingInputs, got {type(data).__name__}")


# ----------------------------------------------------------------------------------------
# Neighbour search
# ----------------------------------------------------------------------------------------


def _chunk_rows(n_cols: int) -> int:
    return max(1, _CHUNK_ELEMS // max(n_cols, 1))


def radius_graph_capped(
    pos: torch.Tensor,
    r: float = 1.0,
    max_num_neighbors: int = 256,
    backend: Literal["auto", "kdtree", "torch"] = "auto",
) -> torch.Tensor:
    """Directed radius graph: for every point, its ``max_num_neighbors`` nearest other points
    strictly closer than ``r`` (Euclidean in ``pos``), no self loops.

    This stands in for ``torch_cluster.radius_graph(pos, r, loop=False, max_num_neighbors)``.
    When more than ``max_num_neighbors`` points are in range, torch_cluster keeps an
    implementation-defined subset (index order on GPU); we keep the *nearest* ones, which is
    deterministic up to exact distance ties.

    Args:
        pos: ``(n, D)`` float.
        backend: ``"kdtree"`` (scipy cKDTree, fast in low dimension, CPU), ``"torch"``
            (chunked ``cdist`` + ``topk``, memory O(chunk·n + n·cap), any device) or
            ``"auto"`` (kdtree for CPU tensors with D ≤ 8, torch otherwise).

    Returns:
        ``(2, E)`` int64 on ``pos.device``: row 0 = centre point, row 1 = its neighbour.
    """
    if pos.dim() != 2:
        raise ValueError(f"pos: expected shape (n, D), got {tuple(pos.shape)}")
    if not (r > 0):
        raise ValueError(f"r: must be > 0, got {r}")
    if max_num_neighbors < 1:
        raise ValueError(f"max_num_neighbors: must be >= 1, got {max_num_neighbors}")
    if backend not in ("auto", "kdtree", "torch"):
        raise ValueError(f"backend: expected 'auto', 'kdtree' or 'torch', got {backend!r}")
    n = pos.shape[0]
    device = pos.device
    if n < 2:
        return torch.zeros(2, 0, dtype=torch.long, device=device)
    if not torch.isfinite(pos).all():
        raise ValueError("pos: contains non-finite values")
    cap = min(max_num_neighbors, n - 1)
    if backend == "auto":
        backend = "kdtree" if (device.type == "cpu" and pos.shape[1] <= 8) else "torch"

    if backend == "kdtree":
        p = pos.detach().cpu().double().numpy()
        tree = cKDTree(p)
        # cap+1 so that the query point itself (distance 0) can be dropped.
        dist, idx = tree.query(p, k=cap + 1, distance_upper_bound=r, workers=-1)
        dist = dist.reshape(n, -1)
        idx = idx.reshape(n, -1)
        centre = np.arange(n)[:, None]
        valid = (dist < r) & (idx != centre) & (idx < n)
        valid &= np.cumsum(valid, axis=1) <= cap  # if self was not returned (duplicates), drop the extra one
        rows = np.broadcast_to(centre, idx.shape)[valid]
        cols = idx[valid]
        return torch.as_tensor(np.stack([rows, cols]), dtype=torch.long, device=device)

    out_r, out_c = [], []
    step = _chunk_rows(n)
    pos_f = pos.detach()
    for s in range(0, n, step):
        e = min(n, s + step)
        d = torch.cdist(pos_f[s:e], pos_f)  # (chunk, n)
        rows = torch.arange(s, e, device=device)
        d[rows - s, rows] = float("inf")  # no self loops, even with duplicate points
        dk, ik = torch.topk(d, cap, dim=1, largest=False, sorted=True)
        keep = dk < r
        out_r.append(rows[:, None].expand_as(ik)[keep])
        out_c.append(ik[keep])
    return torch.stack([torch.cat(out_r), torch.cat(out_c)])


def _knn_indices(query: torch.Tensor, ref: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(q, k)`` of the ``k`` nearest rows of ``ref`` (L2, ``torch.cdist``) for each
    query row, nearest first; chunked over queries so memory is O(chunk·n)."""
    n = ref.shape[0]
    step = _chunk_rows(n)
    out = []
    for s in range(0, query.shape[0], step):
        d = torch.cdist(query[s : s + step], ref)
        out.append(torch.topk(d, k, dim=1, largest=False, sorted=True).indices)
    if not out:
        return torch.zeros(0, k, dtype=torch.long, device=ref.device)
    return torch.cat(out)


# ----------------------------------------------------------------------------------------
# Pairs
# ----------------------------------------------------------------------------------------


@dataclass
class TrackingPairs:
    """Labelled hit pairs of one cloud of ``n`` hits.

    Attributes:
        edge_index: ``(2, E)`` int64; row 0 is the anchor. Undirected (both directions listed).
        is_positive: ``(E,)`` bool: same particle and both hits ``eligible``.
        particle_id: ``(n,)`` int64 per-hit particle id (used to average the loss per particle).
        eligible: ``(n,)`` bool per hit: particle id ≠ 0, reconstructable and pt > ``pt_min``.
    """

    edge_index: torch.Tensor
    is_positive: torch.Tensor
    particle_id: torch.Tensor
    eligible: torch.Tensor

    @property
    def num_hits(self) -> int:
        return int(self.particle_id.shape[0])

    @property
    def num_pairs(self) -> int:
        return int(self.edge_index.shape[1])

    def to(self, device: Union[str, torch.device]) -> "TrackingPairs":
        return TrackingPairs(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def _label_pairs(edge_index: torch.Tensor, particle_id: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Positive iff both hits belong to the same particle and both pass the filter."""
    a, b = edge_index
    return (particle_id[a] == particle_id[b]) & eligible[a] & eligible[b]


def _one_way_sorted(a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    """Unique undirected edges without self loops, one way (lo < hi), sorted by (lo, hi): the
    rows with row < col of :func:`_undirected_sorted`, in its order. ``(2, E)`` int64."""
    keep = a != b
    a, b = a[keep], b[keep]
    key = torch.unique(torch.minimum(a, b) * n + torch.maximum(a, b))  # canonical (lo < hi), deduplicated
    return torch.stack([key // n, key % n])


def _undirected_sorted(a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    """Unique undirected edges without self loops, both directions, sorted by (row, col)
    like PyG's ``to_undirected`` (coalesced). ``(2, E)`` int64."""
    lo, hi = _one_way_sorted(a, b, n)
    key = torch.sort(torch.cat([lo * n + hi, hi * n + lo])).values
    return torch.stack([key // n, key % n])


def build_tracking_pairs(
    data: Union[TrackingEvent, TrackingInputs],
    radius: float = 1.0,
    max_num_neighbors: int = 256,
    pt_min: float = 0.9,
    backend: Literal["auto", "kdtree", "torch"] = "auto",
    one_way: bool = False,
) -> TrackingPairs:
    """The authors' labelled pairs for one cloud (their pair generation; the paper gives no details).

    1. Neighbours: :func:`radius_graph_capped` on ``pos`` = (η, φ) with ``radius`` and
       ``max_num_neighbors``, made undirected.
    2. For every particle P (id ≠ 0) with ≥ 2 hits: pairs P × N(P), where N(P) is the union of
       the neighbours of P's hits (other particles, noise, or P's own hits), and all
       combinations of P's hits.
    3. Undirected, deduplicated, self loops removed; sorted by (anchor, other).
    4. Label: positive iff same particle and both hits have id ≠ 0, are reconstructable and
       have pt > ``pt_min``; every other pair (noise, other particle, or a same-particle pair
       failing the filter) is a negative.

    Vectorised over particles with sort/``repeat_interleave`` tricks (no Python loop per hit
    or particle). The output size is intrinsic (≈ 75M pairs for a 60k-hit event).
    ``one_way``: only the pairs with anchor < other, in the same order (the rows of the full list
    with row < col; half the pairs, without building and sorting the other direction).

    Returns:
        :class:`TrackingPairs` on the CPU.
    """
    inp = _as_inputs(data)
    pos = inp.pos.detach().cpu()
    pid = inp.particle_id.detach().cpu().long()
    n = pid.shape[0]
    if pos.shape != (n, 2):
        raise ValueError(f"data.pos: expected shape ({n}, 2), got {tuple(pos.shape)}")
    eligible = (pid != 0) & inp.reconstructable.detach().cpu().bool() & (inp.pt.detach().cpu() > pt_min)
    empty = torch.zeros(2, 0, dtype=torch.long)
    if n < 2:
        return TrackingPairs(empty, torch.zeros(0, dtype=torch.bool), pid, eligible)

    # Group the hits of particles with >= 2 hits: members sorted by group, contiguous.
    real = pid > 0
    uniq, inv, counts = torch.unique(pid[real], return_inverse=True, return_counts=True)
    big = counts >= 2
    dense = torch.full((uniq.shape[0],), -1, dtype=torch.long)
    dense[big] = torch.arange(int(big.sum()))
    group = torch.full((n,), -1, dtype=torch.long)  # dense group of each hit, -1 = none
    group[real] = dense[inv]
    sizes = counts[big]
    starts = torch.cumsum(sizes, 0) - sizes
    in_group = group >= 0
    members = torch.nonzero(in_group).flatten()
    members = members[torch.argsort(group[members], stable=True)]
    if members.numel() == 0:
        return TrackingPairs(empty, torch.zeros(0, dtype=torch.bool), pid, eligible)

    def expand(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For entries of group g: repeat index (which entry) and the group's member hits."""
        rep = sizes[g]
        which = torch.repeat_interleave(torch.arange(g.shape[0]), rep)
        offs = torch.arange(int(rep.sum())) - torch.repeat_interleave(torch.cumsum(rep, 0) - rep, rep)
        return which, members[starts[g][which] + offs]

    # Positives: every member × every member of its group.
    which, partner = expand(group[members])
    pos_a, pos_b = members[which], partner

    # Negatives: (group, neighbour) pairs, deduplicated, then expanded to every member hit.
    nb = radius_graph_capped(pos, radius, max_num_neighbors, backend=backend)
    nb = torch.cat([nb, nb.flip(0)], dim=1)  # the authors make the radius graph undirected
    src_g = group[nb[0]]
    keep = src_g >= 0
    gb = torch.unique(src_g[keep] * n + nb[1][keep])
    g_of, b_of = gb // n, gb % n
    which, neg_a = expand(g_of)
    neg_b = b_of[which]

    edges = _one_way_sorted if one_way else _undirected_sorted
    edge_index = edges(torch.cat([pos_a, neg_a]), torch.cat([pos_b, neg_b]), n)
    return TrackingPairs(edge_index, _label_pairs(edge_index, pid, eligible), pid, eligible)


def add_random_pairs(
    pairs: TrackingPairs, fraction: float = 0.2, generator: torch.Generator | None = None
) -> TrackingPairs:
    """Training-time augmentation (the authors' code): append ``int(fraction·E/2)`` uniformly random
    hit pairs made undirected (both directions; duplicates among them removed, like PyG's
    ``to_undirected``). They are labelled by the same rule as every other pair, so they are
    negatives unless both hits are eligible hits of one particle (such a pair is already a
    listed positive; labelling it negative would contradict it). Unlike the authors' code,
    random self pairs (i, i) are dropped: they carry no signal and the un-squared L2 distance
    has no gradient at 0. Call once per training step with a fresh ``generator`` state.
    """
    extra = draw_random_pairs(pairs.num_pairs, pairs.particle_id, pairs.eligible, fraction, generator,
                              pairs.edge_index.device)
    if extra is None:
        return pairs
    edge_index = torch.cat([pairs.edge_index, extra.edge_index], dim=1)
    return TrackingPairs(edge_index, torch.cat([pairs.is_positive, extra.is_positive]), pairs.particle_id,
                         pairs.eligible)


def draw_random_pairs(num_pairs: int, particle_id: torch.Tensor, eligible: torch.Tensor, fraction: float = 0.2,
                      generator: torch.Generator | None = None,
                      device: Union[str, torch.device, None] = None, one_way: bool = False) -> TrackingPairs | None:
    """The random pairs :func:`add_random_pairs` appends to a list of ``num_pairs`` pairs, on their own
    (one draw from ``generator``, so both give the same pairs from the same generator state).

    Args:
        particle_id, eligible: ``(n,)`` per-hit ids and filter flags (as in :class:`TrackingPairs`).
        device: where the returned pairs live (default: ``particle_id``'s device).
        one_way: only the direction anchor < other of each pair (the same draw; the rows of the
            two-way list with anchor < other, in its order).
    Returns:
        :class:`TrackingPairs` whose ``edge_index`` ``(2, M)`` holds both directions of each random
        pair, sorted by (anchor, other), or None when there are none to draw
        (``int(fraction·num_pairs/2) == 0`` or n < 2; nothing is drawn then).
    """
    if not (fraction >= 0):
        raise ValueError(f"fraction: must be >= 0, got {fraction}")
    n = int(particle_id.shape[0])
    m = int(num_pairs * fraction / 2)
    if m == 0 or n < 2:
        return None
    dev = particle_id.device if device is None else torch.device(device)
    rnd = torch.randint(0, n, (2, m), generator=generator)
    extra = (_one_way_sorted if one_way else _undirected_sorted)(rnd[0], rnd[1], n).to(dev)
    pid, elig = particle_id.to(dev), eligible.to(dev)
    return TrackingPairs(extra, _label_pairs(extra, pid, elig), pid, elig)


# ----------------------------------------------------------------------------------------
# Loss
# ----------------------------------------------------------------------------------------


def infonce_loss(
    emb: torch.Tensor,
    pairs: TrackingPairs,
    similarity: Literal["l2_rbf", "paper"] = "l2_rbf",
    tau: float = 0.05,
    sigma: float = 0.75,
) -> torch.Tensor:
    """InfoNCE over labelled pairs (the paper's App. A.3, the authors' ``InfoNCELoss``), a scalar.

    Logits ``s`` per listed pair (u, v):

    * ``"l2_rbf"`` (the authors' code, default): ``s = exp(−‖h_u − h_v‖₂ / (2σ²)) / τ`` with
      the distance **not** squared.
    * ``"paper"``: ``s = exp(−‖h_u − h_v‖² / τ)``: the paper's sim plugged into its InfoNCE
      formula ``exp(sim)`` as it is written, so τ enters once, inside sim (``sigma`` unused).

    Per positive pair (u, v⁺): ``ℓ = −log(e^{s⁺} / (e^{s⁺} + Σ_{(u, v⁻) negative} e^{s⁻}))``,
    negatives summed per anchor u (row 0 of ``edge_index``). ``ℓ`` is averaged over the
    positive pairs of each particle (the anchor's particle), then over particles.

    Numerics: the code subtracts the global max logit; we evaluate the same expression as
    ``logaddexp(s⁺, LSE_u(s⁻)) − s⁺`` with a per-anchor (detached) max shift, which is
    mathematically identical and stable for any τ. An anchor without negatives gives ℓ = 0.
    (The authors' scatter indexes the per-anchor sums by rank among anchors rather than by
    hit index, which is only equivalent when every hit has a negative; we implement the
    intended per-hit sum.) Memory is O(E) beyond ``emb`` (:func:`pair_logits`); nothing n × n is formed.

    If there is no positive pair, returns ``0 · Σ emb`` -- a zero that keeps ``emb`` in the
    graph (``grad_fn`` set, zero gradients) so a training step can run unconditionally.

    Args:
        emb: ``(n, d)`` floating embeddings, finite.
        pairs: :class:`TrackingPairs` for the same ``n`` hits.
    """
    if not isinstance(emb, torch.Tensor) or emb.dim() != 2 or not emb.is_floating_point():
        raise ValueError(f"emb: expected a floating tensor of shape (n, d), got {getattr(emb, 'shape', type(emb))}")
    if not isinstance(pairs, TrackingPairs):
        raise ValueError(f"pairs: expected TrackingPairs, got {type(pairs).__name__}")
    if emb.shape[0] != pairs.num_hits:
        raise ValueError(f"emb: has {emb.shape[0]} rows but pairs describe {pairs.num_hits} hits")
    ei, is_pos = pairs.edge_index, pairs.is_positive
    if ei.dim() != 2 or ei.shape[0] != 2 or ei.dtype != torch.long:
        raise ValueError(f"pairs.edge_index: expected int64 of shape (2, E), got {ei.dtype} {tuple(ei.shape)}")
    if is_pos.shape != (ei.shape[1],) or is_pos.dtype != torch.bool:
        raise ValueError(f"pairs.is_positive: expected bool of shape ({ei.shape[1]},), got {is_pos.dtype} {tuple(is_pos.shape)}")
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= emb.shape[0]):
        raise ValueError(f"pairs.edge_index: indices must lie in [0, {emb.shape[0]})")
    if similarity not in ("l2_rbf", "paper"):
        raise ValueError(f"similarity: expected 'l2_rbf' or 'paper', got {similarity!r}")
    if not (tau > 0 and math.isfinite(tau)):
        raise ValueError(f"tau: must be finite and > 0, got {tau}")
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma: must be finite and > 0, got {sigma}")
    if not torch.isfinite(emb).all():
        raise ValueError("emb: contains non-finite values")

    dev = emb.device
    ei, is_pos = ei.to(dev), is_pos.to(dev)
    if not bool(is_pos.any()):
        return emb.sum() * 0.0

    # A mirrored list (second half = first half reversed, same labels: the layout of
    # TrackingCloud.pairs() and TrackingTask.loss) has each distance twice: compute it once and let
    # each pair of the half count for both of its hits as anchors.
    h = ei.shape[1] // 2
    mirrored = (ei.shape[1] == 2 * h and h > 0 and torch.equal(ei[0, h:], ei[1, :h])
                and torch.equal(ei[1, h:], ei[0, :h]) and torch.equal(is_pos[h:], is_pos[:h]))
    a, b = (ei[0, :h], ei[1, :h]) if mirrored else (ei[0], ei[1])
    pos = is_pos[:h] if mirrored else is_pos
    logits = pair_logits(emb, a, b, similarity, tau, sigma)
    anchors = (a, b) if mirrored else (a,)  # the rows of the full list: (a -> b) and, mirrored, (b -> a)

    n = emb.shape[0]
    neg = torch.nonzero(~pos).squeeze(1)
    s_neg = logits.index_select(0, neg)
    u_negs = [an.index_select(0, neg) for an in anchors]   # each negative row's anchor
    # Per-anchor log-sum-exp of negative logits, shifted by the (constant) per-anchor max.
    shift = torch.full((n,), float("-inf"), dtype=logits.dtype, device=dev)
    for u_neg in u_negs:
        shift = shift.scatter_reduce(0, u_neg, s_neg.detach(), reduce="amax", include_self=True)
    has_neg = torch.isfinite(shift)
    shift = torch.where(has_neg, shift, torch.zeros_like(shift))
    denom = torch.zeros(n, dtype=logits.dtype, device=dev)
    for u_neg in u_negs:
        denom = denom.index_add(0, u_neg, torch.exp(s_neg - shift.index_select(0, u_neg)))
    lse_neg = torch.where(has_neg, torch.log(torch.where(has_neg, denom, torch.ones_like(denom))) + shift,
                          torch.full_like(denom, float("-inf")))

    posi = torch.nonzero(pos).squeeze(1)
    s_pos = logits.index_select(0, posi)
    # −log(e⁺ / (e⁺ + Σ e⁻)) of each positive row; both hits of a positive pair are of one particle
    loss_pp = torch.cat([torch.logaddexp(s_pos, lse_neg.index_select(0, an.index_select(0, posi))) - s_pos
                         for an in anchors])

    # Mean per particle (of the anchor), then mean over particles.
    pid_pos = pairs.particle_id.to(dev).index_select(0, a.index_select(0, posi))
    _, grp = torch.unique(pid_pos, return_inverse=True)
    grp = grp.repeat(len(anchors))
    n_grp = int(grp.max()) + 1
    sums = torch.zeros(n_grp, dtype=loss_pp.dtype, device=dev).index_add(0, grp, loss_pp)
    cnt = torch.bincount(grp, minlength=n_grp).to(loss_pp.dtype)
    return (sums / cnt).mean()


#: Pairs per chunk of :func:`pair_logits` on a CPU, whose temporaries (pairs × d) then stay in its cache;
#: on other devices chunks are 64 times larger (fewer kernel launches).
_PAIR_CHUNK = 1 << 14


def _pair_chunk(device: torch.device) -> int:
    return _PAIR_CHUNK if device.type == "cpu" else 64 * _PAIR_CHUNK


class _PairLogits(torch.autograd.Function):
    """InfoNCE logits of hit pairs, chunked: neither the (E, d) differences nor their gradient is ever
    materialised (the backward recomputes each chunk's differences and adds its gradient rows in place)."""

    @staticmethod
    def forward(ctx, emb, a, b, paper: bool, tau: float, sigma: float):
        out = torch.empty(a.shape[0], dtype=emb.dtype, device=emb.device)
        dist = torch.empty_like(out)
        c = _pair_chunk(emb.device)
        for i in range(0, a.shape[0], c):
            diff = emb.index_select(0, a[i:i + c]) - emb.index_select(0, b[i:i + c])
            if paper:
                dist[i:i + c] = (diff * diff).sum(dim=1)  # squared distance
            else:
                torch.linalg.vector_norm(diff, dim=1, out=dist[i:i + c])
        if paper:
            torch.exp(-dist / tau, out=out)
        else:
            torch.exp(-dist / (2.0 * sigma**2), out=out).div_(tau)
        ctx.save_for_backward(emb, a, b, out, dist)
        ctx.paper, ctx.tau, ctx.sigma = paper, tau, sigma
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        emb, a, b, s, dist = ctx.saved_tensors
        if ctx.paper:  # s = exp(−q/τ), q = ‖δ‖²: ∂s/∂δ = −(2s/τ)·δ
            w = grad * s * (-2.0 / ctx.tau)
        else:  # s = exp(−‖δ‖/(2σ²))/τ: ∂s/∂δ = −s/(2σ²)·δ/‖δ‖ (0 at δ = 0, as the norm's subgradient)
            w = torch.where(dist > 0, grad * s * (-1.0 / (2.0 * ctx.sigma**2)) / dist.clamp_min(1e-30),
                            torch.zeros_like(s))
        g = torch.zeros_like(emb)
        c = _pair_chunk(emb.device)
        for i in range(0, a.shape[0], c):
            ai, bi = a[i:i + c], b[i:i + c]
            rows = (emb.index_select(0, ai) - emb.index_select(0, bi)).mul_(w[i:i + c, None])
            # scatter_add_ with a broadcast index: several times faster on CPU than index_add_ (with alpha)
            g.scatter_add_(0, ai[:, None].expand_as(rows), rows)
            g.scatter_add_(0, bi[:, None].expand_as(rows), rows.neg_())
        return g, None, None, None, None, None


def pair_logits(emb: torch.Tensor, a: torch.Tensor, b: torch.Tensor, similarity: str = "l2_rbf", tau: float = 0.05,
                sigma: float = 0.75) -> torch.Tensor:
    """The InfoNCE logit ``s`` of each pair ``(a[i], b[i])`` of rows of ``emb`` (``(n, d)``), as
    :func:`infonce_loss` defines it (``similarity`` "l2_rbf" or "paper"); ``(E,)`` in ``emb``'s dtype,
    differentiable in ``emb``. Memory O(E) beyond ``emb``: the pairs are processed in chunks."""
    return _PairLogits.apply(emb, a, b, similarity == "paper", float(tau), float(sigma))


# ----------------------------------------------------------------------------------------
# Metric
# ----------------------------------------------------------------------------------------


def _to_tensor(a, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        t = a.detach()
    else:
        try:
            t = torch.as_tensor(np.asarray(a))
        except Exception as exc:  # pragma: no cover - defensive
            raise ValueError(f"{name}: cannot convert to a tensor ({exc})") from exc
    return t.to(dtype) if dtype is not None else t


@torch.no_grad()
def tracking_metrics_at_k(
    emb: torch.Tensor,
    particle_id: torch.Tensor,
    pt: torch.Tensor,
    reconstructable: torch.Tensor,
    pt_min: float = 0.9,
    K: int = 19,
    large_k: Literal["clip", "raise", "extend"] = "clip",
) -> dict[str, float]:
    """The authors' ``acc_and_pr_at_k`` for one cloud: AP@k ("accuracy"),
    precision@K and recall@K.

    Query hits: particle id ≠ 0, reconstructable and pt > ``pt_min``. For a query u,
    ``k_u`` = (hits in the cloud with u's particle id) − 1; queries with ``k_u = 0`` are
    skipped. Neighbours are ranked by L2 distance (``torch.cdist``) among **all** hits of the
    cloud (noise, low-pt and non-reconstructable hits included, matching by particle id).
    The ``K + 1`` nearest are taken and u itself is removed from them -- by index, not by
    dropping position 0 as the code does, so an exact duplicate of u ranked first is not
    mistaken for u (if u is not among them, i.e. ≥ K+1 exact duplicates, the farthest is
    dropped). With ``matches`` the same-particle flags of the K remaining neighbours:

    * accuracy = ``matches[:k_u].sum() / k_u``  (this is AP@k, ``accuracy@pt_min``)
    * precision@K = ``matches.sum() / K``, recall@K = ``matches.sum() / k_u``

    each averaged over queries. ``k_u > K``: the code asserts ``k_u ≤ 19``. ``large_k``:
    ``"clip"`` (default) scores ``matches[:K].sum() / K`` for such hits (``k_u`` clipped to K;
    recall still divides by the true ``k_u``), ``"raise"`` raises ValueError like the
    assertion, ``"extend"`` ranks ``max k_u + 1`` neighbours so accuracy uses the full ``k_u``
    (the paper's unbounded definition); precision/recall always use the first K.

    Returns:
        ``{"accuracy", "precision", "recall"}`` (NaN when no hit qualifies) and
        ``"num_queries"`` (number of scored hits).
    """
    emb = _to_tensor(emb, "emb")
    if emb.dim() != 2 or not emb.is_floating_point():
        raise ValueError(f"emb: expected a floating tensor of shape (n, d), got {tuple(emb.shape)} {emb.dtype}")
    n = emb.shape[0]
    pid = _to_tensor(particle_id, "particle_id", torch.long).to(emb.device)
    ptt = _to_tensor(pt, "pt").to(emb.device)
    rec = _to_tensor(reconstructable, "reconstructable").to(emb.device)
    for name, t in (("particle_id", pid), ("pt", ptt), ("reconstructable", rec)):
        if t.shape != (n,):
            raise ValueError(f"{name}: expected shape ({n},), got {tuple(t.shape)}")
    if K < 1:
        raise ValueError(f"K: must be >= 1, got {K}")
    if large_k not in ("clip", "raise", "extend"):
        raise ValueError(f"large_k: expected 'clip', 'raise' or 'extend', got {large_k!r}")
    if not torch.isfinite(emb).all():
        raise ValueError("emb: contains non-finite values")
    nan = {"accuracy": float("nan"), "precision": float("nan"), "recall": float("nan"), "num_queries": 0}
    if n == 0:
        return nan

    _, inv, counts = torch.unique(pid, return_inverse=True, return_counts=True)
    k_all = counts[inv] - 1  # (n,) same-particle hits other than itself
    query = (pid != 0) & (rec != 0) & (ptt.to(torch.float64) > pt_min) & (k_all > 0)
    q_idx = torch.nonzero(query).flatten()
    if q_idx.numel() == 0:
        return nan
    k_u = k_all[q_idx]
    k_max = int(k_u.max())
    if large_k == "raise" and k_max > K:
        raise ValueError(f"K: is too small, a query hit has k_u = {k_max} > K = {K} same-particle hits")
    K_rank = max(K, k_max) if large_k == "extend" else K
    if K_rank + 1 > n:
        # Fewer hits than K + 1: pad the ranking with "no neighbour" (never a match).
        k_take = n
    else:
        k_take = K_rank + 1

    idx = _knn_indices(emb[q_idx], emb, k_take)  # (q, k_take)
    is_self = idx == q_idx[:, None]
    no_self = ~is_self.any(dim=1)
    is_self[no_self, -1] = True  # u not in the list: drop the farthest instead
    nbr = idx[~is_self].view(q_idx.shape[0], k_take - 1)
    matches = pid[nbr] == pid[q_idx][:, None]
    if k_take - 1 < K_rank:  # pad to K_rank columns with non-matches
        pad = torch.zeros(matches.shape[0], K_rank - (k_take - 1), dtype=torch.bool, device=matches.device)
        matches = torch.cat([matches, pad], dim=1)

    csum = torch.cumsum(matches.to(torch.float64), dim=1)  # (q, K_rank)
    k_eff = torch.clamp(k_u, max=K_rank)
    acc = csum.gather(1, (k_eff - 1)[:, None]).squeeze(1) / k_eff.to(torch.float64)
    hits_K = csum[:, K - 1]
    prec = hits_K / K
    rec_ = hits_K / k_u.to(torch.float64)
    return {
        "accuracy": float(acc.mean()),
        "precision": float(prec.mean()),
        "recall": float(rec_.mean()),
        "num_queries": int(q_idx.numel()),
    }


def ap_at_k(
    emb: torch.Tensor,
    particle_id: torch.Tensor,
    pt: torch.Tensor,
    reconstructable: torch.Tensor,
    pt_min: float = 0.9,
    K: int = 19,
    large_k: Literal["clip", "raise", "extend"] = "clip",
) -> float:
    """AP@k of one cloud (the code's ``accuracy@pt_min``); NaN if no hit qualifies.
    See :func:`tracking_metrics_at_k` for the exact definition and ``large_k``."""
    return tracking_metrics_at_k(emb, particle_id, pt, reconstructable, pt_min, K, large_k)["accuracy"]


def ap_at_k_split(values: Sequence[float]) -> float:
    """Mean of per-cloud AP@k values over a split, ignoring NaN clouds (no qualifying hit);
    NaN if every cloud is NaN or the list is empty."""
    a = np.asarray(list(values), dtype=np.float64)
    a = a[~np.isnan(a)]
    return float(a.mean()) if a.size else float("nan")


# ----------------------------------------------------------------------------------------
# Baseline embedding and clustering
# ----------------------------------------------------------------------------------------


def knn_eta_phi_embedding(
    data: Union[TrackingEvent, TrackingInputs], wrap_phi: bool = False, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The kNN-in-(η, φ) baseline: the embedding *is* the hit position, so AP@k of it is the
    metric computed on (η, φ) neighbourhoods.

    ``wrap_phi=False`` (default): ``(n, 2)`` = (η, φ) with φ in (−π, π] **not** wrapped, i.e.
    the same (η, φ) plane HEPT's coordinates, regions and the pair radius graph use (the authors'
    code does not wrap φ either), so the baseline sees exactly the model's notion of locality; hits within
    ~0.1 rad of the φ = ±π seam lose their neighbours across it (a tiny fraction).
    ``wrap_phi=True``: ``(n, 3)`` = (η, cos φ, sin φ): the chord distance 2 sin(Δφ/2) ≈ Δφ
    for small Δφ, so rankings match (η, φ) locally and the seam disappears.
    """
    inp = _as_inputs(data)
    eta, phi = inp.pos[:, 0].to(torch.float64), inp.pos[:, 1].to(torch.float64)
    if wrap_phi:
        return torch.stack([eta, torch.cos(phi), torch.sin(phi)], dim=1).to(dtype)
    return torch.stack([eta, phi], dim=1).to(dtype)


def cluster_tracks(emb: torch.Tensor, eps: float, min_samples: int = 2, chunk: int = 8192) -> np.ndarray:
    """Plain DBSCAN on embeddings: a track label per hit, ``(n,)`` int64, −1 = noise.

    Neighbourhoods are closed L2 balls of radius ``eps`` and include the point itself
    (sklearn's convention). Core points (≥ ``min_samples`` neighbours) within ``eps`` of each
    other are connected; clusters are the connected components of cores. A non-core point
    within ``eps`` of a core joins the cluster of its *nearest* core (sklearn assigns it to
    whichever cluster reaches it first; ours is order-independent); others are noise.
    Clusters are numbered 0, 1, ... in order of their lowest hit index. Radius queries use
    :class:`scipy.spatial.cKDTree` in chunks of ``chunk`` points; memory is
    O(n + number of core-core pairs within eps).
    """
    e = _to_tensor(emb, "emb")
    if e.dim() != 2 or not e.is_floating_point():
        raise ValueError(f"emb: expected a floating tensor of shape (n, d), got {tuple(e.shape)}")
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps: must be finite and > 0, got {eps}")
    if min_samples < 1:
        raise ValueError(f"min_samples: must be >= 1, got {min_samples}")
    x = e.cpu().double().numpy()
    if not np.isfinite(x).all():
        raise ValueError("emb: contains non-finite values")
    n = x.shape[0]
    labels = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return labels
    tree = cKDTree(x)
    counts = np.concatenate(
        [tree.query_ball_point(x[s : s + chunk], eps, return_length=True) for s in range(0, n, chunk)]
    )
    core = np.flatnonzero(counts >= min_samples)
    if core.size == 0:
        return labels
    ctree = cKDTree(x[core])
    rows, cols = [], []
    for s in range(0, core.size, chunk):
        lists = ctree.query_ball_point(x[core[s : s + chunk]], eps)
        lens = np.fromiter((len(l) for l in lists), dtype=np.int64, count=len(lists))
        if lens.sum():
            rows.append(np.repeat(np.arange(s, s + len(lists)), lens))
            cols.append(np.concatenate([np.asarray(l, dtype=np.int64) for l in lists if len(l)]))
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    graph = coo_matrix((np.ones(r.size, dtype=np.int8), (r, c)), shape=(core.size, core.size)).tocsr()
    _, comp = connected_components(graph, directed=False)
    # Renumber components by their lowest hit index (core is sorted ascending).
    first = np.full(comp.max() + 1, core.size, dtype=np.int64)
    np.minimum.at(first, comp, np.arange(core.size))
    rank = np.empty_like(first)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    labels[core] = rank[comp]
    # Border points: nearest core within eps (closed ball, so nudge the strict bound up).
    other = np.setdiff1d(np.arange(n), core, assume_unique=True)
    if other.size:
        d, j = ctree.query(x[other], k=1, distance_upper_bound=np.nextafter(eps, np.inf))
        ok = np.isfinite(d) & (d <= eps)
        labels[other[ok]] = labels[core[j[ok]]]
    return labels
