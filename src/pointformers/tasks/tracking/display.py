"""Event display for tracking: predicted track clusters next to the truth, as a PNG.

Predicted tracks are DBSCAN clusters of the hit embeddings (:func:`~.core.cluster_tracks`).
DBSCAN's radius ``eps`` depends on the embedding's scale, so it is chosen on validation
clouds (:func:`choose_eps`) by maximising the **track-match score**, a per-hit
purity × efficiency measure on the same hits AP@k scores (particle id ≠ 0, reconstructable,
pt > 0.9 GeV, at least one other hit of the particle)::

    score(u) = |C(u) ∩ P(u)|² / (|C(u)| · |P(u)|)

with C(u) the predicted cluster of u (hits of the cloud with its label) and P(u) its
particle's hits. It is 1 only when the cluster *is* the particle, drops when clusters
merge tracks (|C| grows) or split them (|C ∩ P| shrinks), and is 0 for a hit left as noise.
The score is averaged over hits, then over clouds. Candidate radii are multiples of the
median nearest-neighbour distance of the embeddings, so the grid follows the scale.

Drawing uses matplotlib's Agg canvas directly (no pyplot, no global backend switch), so it
works headless and inside other programs; PNGs are written atomically (temporary file, rename).

Figures:

* :func:`draw_event_display`: predicted clusters next to the truth in x–y (the first display).
* :func:`draw_track_display`: x–y and r–z views, hits coloured by true particle (top) and by
  reconstructed track (bottom) with **consistent colours** (:func:`track_colors`): a track
  matched to a particle (double majority, :mod:`.metrics`) has that particle's colour;
  tracks matched to no particle are black, unassigned hits and noise light grey.
* :func:`draw_hept_buckets`: the HEPT query blocks of one table and head of the first HEPT
  layer, from the sort order the model computes (:func:`hept_query_blocks`), drawn in η–φ
  beside the true particles.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

try:
    from scipy.spatial import cKDTree
except ModuleNotFoundError as exc:  # optional dependency: the 'tasks' extra
    raise ModuleNotFoundError("pointformers.tasks.tracking.display needs scipy: pip install 'pointformers[tasks]'",
                              name=exc.name) from exc

from .core import cluster_tracks

__all__ = ["EPS_FACTORS", "track_match_score", "choose_eps", "draw_event_display", "track_colors",
           "draw_track_display", "hept_query_blocks", "draw_hept_buckets"]

#: Candidate eps values, as multiples of the median nearest-neighbour distance.
EPS_FACTORS: tuple[float, ...] = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def _np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def track_match_score(labels, particle_id, pt, reconstructable, pt_min: float = 0.9) -> float:
    """Mean over qualifying hits of ``|C∩P|² / (|C|·|P|)`` (module docstring); NaN if none.

    Args:
        labels: ``(n,)`` predicted cluster per hit, −1 = noise.
        particle_id, pt, reconstructable: ``(n,)`` truth per hit.
    """
    lab = _np(labels).astype(np.int64)
    pid = _np(particle_id).astype(np.int64)
    ptv = _np(pt).astype(np.float64)
    rec = _np(reconstructable).astype(bool)
    n = lab.shape[0]
    if not (pid.shape == ptv.shape == rec.shape == (n,)):
        raise ValueError(f"labels/particle_id/pt/reconstructable: expected equal shapes (n,), got "
                         f"{lab.shape}, {pid.shape}, {ptv.shape}, {rec.shape}")
    if n == 0:
        return float("nan")
    _, p_inv, p_cnt = np.unique(pid, return_inverse=True, return_counts=True)
    query = (pid != 0) & rec & (ptv > pt_min) & (p_cnt[p_inv] > 1)
    if not query.any():
        return float("nan")
    clustered = lab >= 0
    _, c_inv, c_cnt = np.unique(lab[clustered], return_inverse=True, return_counts=True)
    # Joint counts |C ∩ P| of every (cluster, particle) combination present.
    joint_keys, joint_inv, joint_cnt = np.unique(c_inv * (p_cnt.size + 1) + p_inv[clustered], return_inverse=True,
                                                 return_counts=True)
    score = np.zeros(n)
    idx = np.flatnonzero(clustered)
    inter = joint_cnt[joint_inv].astype(np.float64)
    score[idx] = inter * inter / (c_cnt[c_inv] * p_cnt[p_inv[idx]])
    return float(score[query].mean())


def _median_nn_distance(embs: Sequence[np.ndarray]) -> float:
    d = []
    for e in embs:
        if e.shape[0] >= 2:
            dist, _ = cKDTree(e).query(e, k=2)
            d.append(dist[:, 1])
    if not d:
        return 1.0
    med = float(np.median(np.concatenate(d)))
    return med if med > 0 else 1e-6


def choose_eps(embeddings: Sequence[torch.Tensor], particle_ids: Sequence, pts: Sequence, reconstructables: Sequence,
               factors: Sequence[float] = EPS_FACTORS, min_samples: int = 2) -> tuple[float, dict[float, float]]:
    """The DBSCAN radius with the best mean :func:`track_match_score` over the given clouds.

    Candidates are ``factor × median 1-NN distance`` of the embeddings. Returns
    ``(eps, {eps: score})``; ties go to the smaller radius.
    """
    if not len(embeddings):
        raise ValueError("embeddings: need at least one cloud to choose eps on")
    embs = [_np(e).astype(np.float64) for e in embeddings]
    base = _median_nn_distance(embs)
    scores: dict[float, float] = {}
    for f in factors:
        eps = float(f * base)
        vals = [track_match_score(cluster_tracks(torch.from_numpy(e), eps, min_samples), pid, pt, rec)
                for e, pid, pt, rec in zip(embs, particle_ids, pts, reconstructables)]
        vals = [v for v in vals if np.isfinite(v)]
        scores[eps] = float(np.mean(vals)) if vals else float("nan")
    finite = {k: v for k, v in scores.items() if np.isfinite(v)}
    best = max(finite, key=lambda k: (finite[k], -k)) if finite else float(factors[0] * base)
    return best, scores


_GREY = np.array([0.75, 0.75, 0.75, 0.6])
_BLACK = np.array([0.0, 0.0, 0.0, 1.0])


def _palette() -> np.ndarray:
    from matplotlib import colormaps

    return np.concatenate([colormaps["tab20"](np.arange(20)), colormaps["tab20b"](np.arange(20)),
                           colormaps["Dark2"](np.arange(8))])


def _label_colors(labels: np.ndarray, seed: int = 0) -> np.ndarray:
    """RGBA per hit: a shuffled qualitative palette per label (neighbouring ids get distinct
    colours), light grey for label < 0 (noise / unclustered)."""
    palette = _palette()
    out = np.tile(_GREY, (labels.shape[0], 1))
    good = labels >= 0
    if good.any():
        uniq, inv = np.unique(labels[good], return_inverse=True)
        perm = np.random.default_rng(seed).permutation(uniq.size)
        out[good] = palette[perm[inv] % len(palette)]
    return out


def draw_event_display(path: str | os.PathLike, x, y, pred_labels, particle_id, title: str = "",
                       pred_note: str = "", dpi: int = 130) -> Path:
    """Write a two-panel PNG: hits in the transverse plane (x, y) coloured by predicted track
    cluster (left) and by truth particle (right); noise/unclustered hits in grey.

    Args:
        path: output ``.png`` (parent folders are created).
        x, y: ``(n,)`` hit positions [mm].
        pred_labels: ``(n,)`` predicted clusters (−1 = noise); particle_id: ``(n,)`` (0 = noise).
        title: figure title; pred_note: extra text under the left panel's title (e.g. eps).
    Returns:
        ``path`` as a Path.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs, ys = _np(x).astype(float), _np(y).astype(float)
    lab, pid = _np(pred_labels).astype(np.int64), _np(particle_id).astype(np.int64)
    n = xs.shape[0]
    if not (ys.shape == lab.shape == pid.shape == (n,)):
        raise ValueError("x, y, pred_labels, particle_id: expected equal shapes (n,)")
    truth = np.where(pid > 0, pid, -1)
    fig = Figure(figsize=(12, 6), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    n_pred = int(np.unique(lab[lab >= 0]).size)
    n_true = int(np.unique(truth[truth >= 0]).size)
    panels = ((axes[0], lab, f"predicted tracks: {n_pred} clusters" + (f"\n{pred_note}" if pred_note else "")),
              (axes[1], truth, f"truth: {n_true} particles"))
    for ax, labels, label_title in panels:
        colors = _label_colors(labels)
        bg = labels < 0  # grey hits first, so tracks are drawn on top
        ax.scatter(xs[bg], ys[bg], s=3, c=colors[bg], linewidths=0)
        ax.scatter(xs[~bg], ys[~bg], s=5, c=colors[~bg], linewidths=0)
        ax.set_title(label_title, fontsize=10)
        ax.set_xlabel("x [mm]")
        ax.set_aspect("equal", adjustable="box")
        ax.grid(alpha=0.2)
    axes[0].set_ylabel("y [mm]")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)  # readers never see a half-written PNG
    return path


def _save_png(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` as a PNG atomically (readers never see a half-written file)."""
    from ...files import atomic_write

    return atomic_write(path, lambda f: fig.savefig(f, format="png"))


def track_colors(labels, particle_id, min_hits: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Consistent RGBA colours ``(n, 4)`` per hit: ``(by_particle, by_track)``.

    ``by_particle``: one palette colour per true particle (noise grey). ``by_track``: a track
    matched to a particle by double majority (:func:`~.metrics.match_tracks`, tracks of
    ``min_hits`` or more) takes that particle's colour; other tracks of ``min_hits`` or more are
    black; hits of smaller clusters and unassigned hits (label < 0) are grey. Raises ValueError
    naming the argument on bad input.
    """
    from .metrics import match_tracks

    lab = _np(labels)
    pid = _np(particle_id)
    m = match_tracks(lab, pid, min_hits)  # validates both
    lab, pid = lab.astype(np.int64), pid.astype(np.int64)
    by_particle = _label_colors(np.where(pid > 0, pid, -1), seed)
    # the colour of each particle (all its hits share one)
    palette = _palette()
    perm = np.random.default_rng(seed).permutation(m.particle_ids.size)
    particle_rgba = palette[perm % len(palette)] if m.particle_ids.size else np.zeros((0, 4))
    by_track = np.tile(_GREY, (lab.shape[0], 1))
    in_track = lab >= 0
    in_track[in_track] = m.counts[np.searchsorted(m.track_ids, lab[in_track])]
    t_index = np.searchsorted(m.track_ids, lab[in_track])
    matched = m.dm[t_index]
    rgba = np.tile(_BLACK, (t_index.size, 1))
    rgba[matched] = particle_rgba[m.majority[t_index[matched]]]
    by_track[in_track] = rgba
    return by_particle, by_track


def draw_track_display(path: str | os.PathLike, x, y, z, labels, particle_id, title: str = "", note: str = "",
                       min_hits: int = 3, dpi: int = 110) -> Path:
    """Write a 2×2 PNG: x–y (left) and r–z (right) views of the hits, coloured by true particle
    (top) and by reconstructed track (bottom), colours from :func:`track_colors`.

    Args:
        path: output ``.png`` (parent folders are created; written atomically).
        x, y, z: ``(n,)`` hit positions [mm].
        labels: ``(n,)`` reconstructed track per hit (−1 = unassigned); particle_id: ``(n,)`` (0 = noise).
        title: figure title; note: a line under the track panels' titles (e.g. DBSCAN's eps).
        min_hits: hits a track needs to be matched.
    Returns:
        ``path`` as a Path.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs, ys, zs = (_np(a).astype(float) for a in (x, y, z))
    n = xs.shape[0]
    if xs.ndim != 1 or ys.shape != (n,) or zs.shape != (n,):
        raise ValueError(f"x, y, z: expected equal shapes (n,), got {xs.shape}, {ys.shape}, {zs.shape}")
    if _np(labels).shape != (n,) or _np(particle_id).shape != (n,):
        raise ValueError(f"labels/particle_id: expected shape ({n},), got {_np(labels).shape} and {_np(particle_id).shape}")
    by_particle, by_track = track_colors(labels, particle_id, min_hits)
    from .metrics import match_tracks

    m = match_tracks(labels, particle_id, min_hits)
    rs = np.hypot(xs, ys)
    fig = Figure(figsize=(13, 11), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    pid = _np(particle_id).astype(np.int64)
    lab = _np(labels).astype(np.int64)
    n_tracks = int(m.counts.sum())
    small = np.ones(n, dtype=bool)
    small[lab >= 0] = ~m.counts[np.searchsorted(m.track_ids, lab[lab >= 0])]
    rows = ((by_particle, pid <= 0, f"true particles: {m.particle_ids.size} (noise grey)"),
            (by_track, small, f"reconstructed tracks of >= {min_hits} hits: {n_tracks}, {int(m.dm.sum())} matched "
                              f"(double majority: the particle's colour), others black; smaller clusters and "
                              f"unassigned hits grey"
                                + (f"\n{note}" if note else "")))
    for (colors, bg, text), (ax_xy, ax_rz) in zip(rows, axes):
        for ax, u, v in ((ax_xy, xs, ys), (ax_rz, zs, rs)):
            ax.scatter(u[bg], v[bg], s=2, c=colors[bg], linewidths=0)
            ax.scatter(u[~bg], v[~bg], s=4, c=colors[~bg], linewidths=0)
            ax.grid(alpha=0.2)
        ax_xy.set_aspect("equal", adjustable="datalim")
        ax_xy.set_xlabel("x [mm]")
        ax_xy.set_ylabel("y [mm]")
        ax_rz.set_xlabel("z [mm]")
        ax_rz.set_ylabel("r [mm]")
        ax_xy.set_title(text, fontsize=9, loc="left")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _save_png(fig, path)


def hept_query_blocks(model, x, coords, layer: int = 0, head: int = 0, table: int = 0) -> np.ndarray:
    """The query block of every point in one HEPT layer's sort, ``(n,)`` int64.

    Runs ``model(x, coords)`` (no gradients) once, recording the sort order of head ``head``,
    OR table ``table`` that the ``layer``-th :class:`~pointformers.attention.hept.HEPTAttention`
    module (in ``model.modules()`` order; 0 = the first layer) computes for its queries
    (:meth:`~pointformers.attention.hept.HEPTAttention.sort_orders`); block ``j`` holds the
    points at sorted positions ``j·block_size … (j+1)·block_size − 1``, i.e. the queries that
    attend together to one key block. With the authors' padding (copies of some points fill the
    last block) a point's block is that of its own row, not of its copy.

    Args:
        model: a model with HEPT attention layers taking ``(x, coords)`` for one cloud.
        x, coords: the cloud's inputs ``(n, F)``, ``(n, c)``.
    Raises:
        ValueError: naming ``model`` (no HEPT layer), ``layer``, ``head`` or ``table`` when out of range.
    """
    from ...attention.hept import HEPTAttention

    layers = [mod for mod in model.modules() if isinstance(mod, HEPTAttention)]
    if not layers:
        raise ValueError("model: has no HEPT attention layer")
    for name, v, hi in (("layer", layer, len(layers)), ("head", head, layers[0].heads),
                        ("table", table, layers[0].n_hashes)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
            raise ValueError(f"{name}: expected an integer in [0, {hi}), got {v!r}")
    att = layers[layer]
    seen: list[torch.Tensor] = []
    # Every path of the layer (one head at a time, or all heads at once) gets its orders from
    # sort_orders(qa, ka, ctx, heads) -> iq (B, nh, T, Np); record head `head`'s queries.
    original = att.sort_orders  # the bound method

    def recording(qa, ka, ctx, heads):
        iq, ik = original(qa, ka, ctx, heads)
        hs = list(heads)
        if head in hs:
            seen.append(iq[0, hs.index(head), table].detach().cpu().clone())
        return iq, ik

    att.sort_orders = recording  # an instance attribute shadows the method for this call only
    try:
        with torch.no_grad():
            model(x, coords)
    finally:
        del att.sort_orders
    if not seen:
        raise ValueError("model: its HEPT layer computed no sort order (was the model run on one cloud?)")
    n = int(x.shape[0])
    order = seen[0].long()
    Np = order.numel()
    rows = order % Np  # row numbers b·Np + i with b = 0
    blocks = torch.empty(Np, dtype=torch.long)
    blocks[rows] = torch.arange(Np) // att.block_size
    return blocks[:n].numpy()


def draw_hept_buckets(path: str | os.PathLike, eta, phi, blocks, particle_id, title: str = "",
                      dpi: int = 110) -> Path:
    """Write a PNG of one HEPT layer's query blocks over an event in η–φ: hits coloured by block
    index (left; a shuffled palette, so neighbouring blocks differ) and by true particle (right).

    Args:
        eta, phi: ``(n,)`` hit positions; blocks: ``(n,)`` block index (:func:`hept_query_blocks`);
        particle_id: ``(n,)`` (0 = noise).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    e, p = _np(eta).astype(float), _np(phi).astype(float)
    b, pid = _np(blocks).astype(np.int64), _np(particle_id).astype(np.int64)
    n = e.shape[0]
    if not (e.shape == p.shape == b.shape == pid.shape == (n,)):
        raise ValueError(f"eta, phi, blocks, particle_id: expected equal shapes (n,), got {e.shape}, {p.shape}, "
                         f"{b.shape}, {pid.shape}")
    if (b < 0).any():
        raise ValueError("blocks: expected block indices >= 0")
    fig = Figure(figsize=(13, 5.5), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharex=True, sharey=True)
    truth = np.where(pid > 0, pid, -1)
    panels = ((axes[0], _label_colors(b, seed=1), f"query blocks: {np.unique(b).size}"),
              (axes[1], _label_colors(truth), f"true particles: {np.unique(truth[truth > 0]).size} (noise grey)"))
    for ax, colors, text in panels:
        ax.scatter(e, p, s=4, c=colors, linewidths=0)
        ax.set_xlabel("eta")
        ax.set_title(text, fontsize=10)
        ax.grid(alpha=0.2)
    axes[0].set_ylabel("phi [rad]")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _save_png(fig, path)
