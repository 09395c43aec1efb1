"""Glue between the tracking task and the training engine.

* :func:`prepare_tracking_clouds` turns :class:`~pointformers.data.event.TrackingEvent`
  clouds into :class:`TrackingCloud` samples once: model inputs (float32) and, for training
  clouds, the authors' labelled pairs (:func:`~.core.build_tracking_pairs`), so an
  epoch does no neighbour search. The pairs are cached on disk next to the generated data,
  keyed by the pair parameters and the clouds' contents, so a later run does not rebuild them.
* :class:`TrackingTask` implements the engine's task protocol: ``loss(model, cloud,
  generator)`` is the InfoNCE loss on the cloud's pairs plus fresh random pairs (as the
  authors do every step: the one per-step part); ``evaluate(model, clouds)`` returns AP@k (the code's
  ``accuracy@0.9``) averaged over clouds, with precision@K and recall@K.
* :func:`evaluate_embeddings` scores any per-cloud embeddings, e.g. the kNN-in-(η, φ)
  baseline (:func:`knn_baseline_metrics`).
* :meth:`TrackingTask.evaluate_report` adds track building: DBSCAN on the embeddings with
  its radius chosen on the validation clouds (:mod:`.building`), scored on the test
  clouds with the TrackML score (:mod:`.trackml_score`) and the track-matching metrics
  (efficiency, fake and duplicate rates, overall and against pT and η; :mod:`.metrics`).
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Sequence

import numpy as np
import torch
from torch import nn

from ...data.event import TrackingEvent
from .building import DEFAULT_REFINE, choose_dbscan_eps, dbscan_tracks
from .metrics import OVERALL_KEYS, TrackMetricsAccumulator, match_tracks, particle_eta
from .track_fit import fit_resolutions, fit_tracks, fitted_parameters
from .trackml_score import trackml_like_weights, trackml_score, trackml_score_split
from .core import (
    TrackingInputs,
    TrackingPairs,
    ap_at_k_split,
    build_tracking_pairs,
    draw_random_pairs,
    infonce_loss,
    knn_eta_phi_embedding,
    tracking_inputs,
    tracking_metrics_at_k,
)

__all__ = [
    "TrackingCloud",
    "matched_track_truth",
    "TrackingTask",
    "prepare_tracking_clouds",
    "cached_half_pairs",
    "cloud_truth_weights",
    "cloud_particle_eta",
    "track_matching_report",
    "evaluate_embeddings",
    "knn_baseline_metrics",
    "load_tracking_splits",
]


@dataclass
class TrackingCloud:
    """One precomputed training/evaluation sample.

    Attributes:
        inputs: :class:`TrackingInputs` of the cloud's ``n`` hits (float32).
        half_edges: ``(2, E/2)`` int32 pairs (a < b) or None (evaluation-only clouds). The
            undirected pair list holds each pair in both directions; storing one direction
            in int32 needs a quarter of the memory (≈ 0.5M pairs per 1.5k-hit cloud).
        half_positive: ``(E/2,)`` bool labels of ``half_edges`` (symmetric, so one suffices).
        event: the source event (kept for displays; hit order matches ``inputs``).
        pt_min: the pt filter the positive labels were built with.
        weight: ``(n,)`` float64 TrackML truth weight of each hit (from the event), used by
            the TrackML score; None when unknown (see :func:`cloud_truth_weights`).
        particle_eta: ``(n,)`` float64 η of each hit's particle (from its momentum; 0 for
            noise), used by the track-matching metrics; None when unknown (see
            :func:`cloud_particle_eta`).
        sector_own: ``(n,)`` bool, the event's ``sector_own`` on φ-sector clouds (hits of the
            particles the sector owns), None for whole events.
        particle_q: ``(n,)`` int64 charge of each hit's particle (0 for noise), None when unknown.
        particle_phi: ``(n,)`` float64 azimuth of each hit's particle momentum at production
            (0 for noise), None when unknown. With ``pt`` and ``particle_eta`` the truth of the
            end-to-end model's track-parameter head.
    """

    inputs: TrackingInputs
    half_edges: torch.Tensor | None = None
    half_positive: torch.Tensor | None = None
    event: TrackingEvent | None = None
    pt_min: float = 0.9
    weight: torch.Tensor | None = None
    particle_eta: torch.Tensor | None = None
    sector_own: torch.Tensor | None = None
    particle_q: torch.Tensor | None = None
    particle_phi: torch.Tensor | None = None

    @property
    def num_hits(self) -> int:
        return self.inputs.num_hits

    @property
    def has_pairs(self) -> bool:
        return self.half_edges is not None

    def target_hits(self, pt_min: float) -> torch.Tensor:
        """``(n,)`` bool: hits of target particles (not noise, reconstructable, pT above ``pt_min``): the
        InfoNCE positives' filter and the end-to-end model's targets."""
        inp = self.inputs
        return (inp.particle_id != 0) & inp.reconstructable & (inp.pt > pt_min)

    def pairs(self) -> TrackingPairs:
        """The full undirected :class:`TrackingPairs` (both directions, int64)."""
        return self.training_pairs(0.0)

    def training_pairs(self, fraction: float, generator: torch.Generator | None = None) -> TrackingPairs:
        """The pairs of one training step: the listed pairs plus the random pairs
        :func:`~.core.add_random_pairs` would append (``fraction``; one draw from ``generator``,
        none when 0), laid out mirrored: ``[half, half reversed]`` with ``half`` = the listed
        pairs one way then the random ones one way (a < b), so :func:`~.core.infonce_loss`
        computes each distance once. ``edge_index`` (2, E) int64, ``is_positive`` (E,) bool.
        """
        if self.half_edges is None or self.half_positive is None:
            raise ValueError("cloud: has no pairs; prepare it with with_pairs=True to train on it")
        half, pos = self.half_edges.long(), self.half_positive
        eligible = self.target_hits(self.pt_min)
        if fraction > 0:
            extra = draw_random_pairs(2 * half.shape[1], self.inputs.particle_id, eligible, fraction, generator,
                                      one_way=True)  # random pairs hold no self pairs
            if extra is not None:
                half = torch.cat([half, extra.edge_index], dim=1)
                pos = torch.cat([pos, extra.is_positive])
        return TrackingPairs(torch.cat([half, half.flip(0)], dim=1), pos.repeat(2), self.inputs.particle_id,
                             eligible)


#: Version of the stored training pairs: bump it when :func:`~.core.build_tracking_pairs` changes
#: its output, so cached pairs of the old builder are not reused.
PAIRS_VERSION = 1


def _half_pairs(inputs: Sequence[TrackingInputs], radius: float, max_num_neighbors: int, pt_min: float,
                progress: bool, desc: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One direction (a < b) of each cloud's labelled pairs, built: ``(2, E/2)`` int32 and ``(E/2,)`` bool."""
    it: Iterable[TrackingInputs] = inputs
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(inputs, desc=desc, leave=False, dynamic_ncols=True)
    out = []
    for inp in it:
        p = build_tracking_pairs(inp, radius=radius, max_num_neighbors=max_num_neighbors, pt_min=pt_min,
                                 one_way=True)  # the list is symmetric: one direction is kept
        out.append((p.edge_index.to(torch.int32).contiguous(), p.is_positive.contiguous()))
    return out


def _pair_inputs_digest(inputs: Sequence[TrackingInputs]) -> str:
    """SHA-256 of everything :func:`~.core.build_tracking_pairs` reads from the clouds (positions,
    particle ids, reconstructable flags, pT; dtypes and shapes included), in order."""
    h = hashlib.sha256()
    for inp in inputs:
        for t in (inp.pos, inp.particle_id, inp.reconstructable, inp.pt):
            a = np.ascontiguousarray(t.detach().cpu().numpy())
            h.update(f"{a.dtype.str}{a.shape};".encode())
            h.update(a.view(np.uint8).reshape(-1))
    return h.hexdigest()


def cached_half_pairs(inputs: Sequence[TrackingInputs], radius: float = 1.0, max_num_neighbors: int = 256,
                      pt_min: float = 0.9, cache_dir: str | os.PathLike | None = None, progress: bool = False,
                      desc: str = "pairs") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One direction of every cloud's labelled pairs (:attr:`TrackingCloud.half_edges` ``(2, E/2)`` int32,
    :attr:`TrackingCloud.half_positive` ``(E/2,)`` bool; ``cache_dir`` as in :func:`prepare_tracking_clouds`),
    from one cache entry of ``<cache_dir>/tracking`` keyed by
    the pair parameters, :data:`PAIRS_VERSION` and the clouds' contents (so any change rebuilds);
    built and stored (atomically, :func:`~pointformers.data.cache.cached_arrays`) on a miss."""
    from ...data.cache import cached_arrays, default_cache_dir

    key = {"builder": "pointformers.tracking.pairs", "version": PAIRS_VERSION, "radius": float(radius),
           "max_num_neighbors": int(max_num_neighbors), "pt_min": float(pt_min), "backend": "auto",
           "num_clouds": len(inputs), "inputs_sha256": _pair_inputs_digest(inputs)}

    def build() -> dict[str, np.ndarray]:
        halves = _half_pairs(inputs, radius, max_num_neighbors, pt_min, progress, desc)
        sizes = [e.shape[1] for e, _ in halves]
        return {"offsets": np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64),
                "edges": np.concatenate([e.numpy() for e, _ in halves], axis=1) if halves
                else np.zeros((2, 0), np.int32),
                "positive": np.concatenate([p.numpy() for _, p in halves]) if halves else np.zeros(0, bool)}

    def check(arrays) -> None:
        if not {"offsets", "edges", "positive"} <= set(arrays):
            raise ValueError("inconsistent pair cache entry")
        off, edges, pos = arrays["offsets"], arrays["edges"], arrays["positive"]
        n = [inp.num_hits for inp in inputs]
        if (off.shape != (len(inputs) + 1,) or off[0] != 0 or (np.diff(off) < 0).any() or edges.dtype != np.int32
                or edges.shape != (2, off[-1]) or pos.dtype != bool or pos.shape != (off[-1],)
                or any(b > a and (edges[:, a:b].min() < 0 or edges[:, a:b].max() >= k)
                       for a, b, k in zip(off[:-1], off[1:], n))):
            raise ValueError("inconsistent pair cache entry")

    root = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "tracking"
    arrays = cached_arrays(root, f"pairs-{len(inputs)}clouds", key, build, validate=check)
    off, edges, pos = arrays["offsets"], arrays["edges"], arrays["positive"]
    # own copies: a view would keep (and pickle, e.g. to distributed workers) the whole split's arrays
    return [(torch.from_numpy(edges[:, a:b].copy()), torch.from_numpy(pos[a:b].copy()))
            for a, b in zip(off[:-1], off[1:])]


def prepare_tracking_clouds(
    events: Iterable[TrackingEvent],
    with_pairs: bool = True,
    radius: float = 1.0,
    max_num_neighbors: int = 256,
    pt_min: float = 0.9,
    keep_events: bool = False,
    progress: bool = False,
    desc: str = "pairs",
    cache_dir: str | os.PathLike | None | Literal[False] = None,
) -> list[TrackingCloud]:
    """Precompute inputs (and pairs) of every cloud once.

    Args:
        events: the clouds (e.g. one split of :func:`~pointformers.data.tracking.load_tracking_dataset`).
        with_pairs: build the training pairs (the authors' pair generation; ``radius`` and ``max_num_neighbors``
            are the authors' radius graph in (η, φ), ``pt_min`` the positive filter).
        keep_events: keep a reference to each source event (for event displays).
        progress: show a tqdm bar while pairs are built.
        cache_dir: folder of the on-disk cache the pairs are kept in (the generated data's,
            :func:`~pointformers.data.tracking.load_tracking_dataset`; None: its default,
            ``$POINTFORMERS_CACHE`` or ``~/.cache/pointformers``), one entry per list of events
            keyed by the pair parameters and the clouds' contents; False: build them without a cache.
    """
    if not (cache_dir is None or cache_dir is False or isinstance(cache_dir, (str, os.PathLike))):
        raise ValueError(f"cache_dir: expected a folder, None (the default folder) or False (no cache), "
                         f"got {cache_dir!r}")
    events = list(events)
    inputs = [tracking_inputs(ev, dtype=torch.float32) for ev in events]
    halves: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [(None, None)] * len(events)
    if with_pairs and cache_dir is False:
        halves = _half_pairs(inputs, radius, max_num_neighbors, pt_min, progress, desc)
    elif with_pairs:
        halves = cached_half_pairs(inputs, radius, max_num_neighbors, pt_min, cache_dir, progress, desc)
    out = []
    for ev, inp, (half_e, half_p) in zip(events, inputs, halves):
        weight = torch.as_tensor(np.asarray(ev.weight, dtype=np.float64))
        eta = torch.as_tensor(np.nan_to_num(ev.per_hit(particle_eta(ev.px, ev.py, ev.pz), 0.0), nan=0.0))
        own = None if ev.sector_own is None else torch.as_tensor(np.asarray(ev.sector_own, dtype=bool))
        q = torch.as_tensor(ev.per_hit(np.asarray(ev.q, dtype=np.int64), 0))
        phi = torch.as_tensor(ev.per_hit(np.arctan2(np.asarray(ev.py, np.float64), np.asarray(ev.px, np.float64)), 0.0))
        out.append(TrackingCloud(inp, half_e, half_p, ev if keep_events else None, pt_min, weight, eta, own, q, phi))
    return out


def cloud_truth_weights(cloud: TrackingCloud) -> np.ndarray:
    """The per-hit TrackML truth weights of a cloud, ``(n,)`` float64.

    ``cloud.weight`` when set (the event's weights: official ones for TrackML files, the
    generator's TrackML-like ones otherwise), else ``cloud.event.weight``; a cloud that has
    neither (e.g. built by hand) gets :func:`~.trackml_score.trackml_like_weights` from its
    particle ids, pT and hit order by distance from the origin, ``hypot(r, z)`` (coordinate
    columns 2 and 4; exact for tracks that do not curl back).
    """
    n = cloud.num_hits
    w = cloud.weight if cloud.weight is not None else (cloud.event.weight if cloud.event is not None else None)
    if w is not None:
        w = np.asarray(w.cpu().numpy() if isinstance(w, torch.Tensor) else w, dtype=np.float64)
        if w.shape != (n,):
            raise ValueError(f"cloud.weight: expected shape ({n},), got {w.shape}")
        return w
    c = cloud.inputs.coords.detach().cpu().double().numpy()
    return trackml_like_weights(cloud.inputs.particle_id.cpu().numpy(), cloud.inputs.pt.cpu().numpy(),
                                np.hypot(c[:, 2], c[:, 4]))


def cloud_particle_eta(cloud: TrackingCloud) -> np.ndarray:
    """η of each hit's particle in a cloud, ``(n,)`` float64 (noise: 0).

    ``cloud.particle_eta`` when set, else from ``cloud.event``'s particle momenta; a cloud with
    neither (built by hand) gets, per particle, the mean η of its hit positions (coordinate
    column 0), close to the momentum's η for particles from the beam line.
    """
    n = cloud.num_hits
    if cloud.particle_eta is not None:
        eta = np.asarray(cloud.particle_eta.detach().cpu().numpy(), dtype=np.float64)
    elif cloud.event is not None:
        ev = cloud.event
        eta = np.nan_to_num(ev.per_hit(particle_eta(ev.px, ev.py, ev.pz), 0.0).astype(np.float64), nan=0.0)
    else:
        pid = cloud.inputs.particle_id.detach().cpu().numpy()
        hit_eta = cloud.inputs.coords[:, 0].detach().cpu().double().numpy()
        _, inv = np.unique(pid, return_inverse=True)
        mean = np.bincount(inv, hit_eta) / np.bincount(inv)
        eta = np.where(pid > 0, mean[inv], 0.0)
    if eta.shape != (n,):
        raise ValueError(f"cloud.particle_eta: expected shape ({n},), got {eta.shape}")
    return eta


def track_matching_report(labels: Sequence[np.ndarray], clouds: Sequence[TrackingCloud], pt_min: float = 0.9,
                          eta_max: float = 4.0, min_hits: int = 3, tracks: str = "DBSCAN clusters") -> dict:
    """The track-matching metrics (:mod:`.metrics`) of per-cloud track labels, counts
    pooled over the clouds: :meth:`~.metrics.TrackMetricsAccumulator.result`. On φ-sector
    clouds only the particles a sector owns count in it, so each particle counts once.
    ``tracks`` says what the labels are (the report's heading)."""
    if len(labels) != len(clouds):
        raise ValueError(f"labels: got {len(labels)} for {len(clouds)} clouds")
    acc = TrackMetricsAccumulator(pt_min=pt_min, eta_max=eta_max, min_hits=min_hits, tracks=tracks)
    for lab, c in zip(labels, clouds):
        acc.add(lab, c.inputs.particle_id, c.inputs.pt, cloud_particle_eta(c), c.inputs.reconstructable,
                owned=c.sector_own)
    return acc.result()


def evaluate_embeddings(embeddings: Sequence[torch.Tensor], clouds: Sequence[TrackingCloud],
                        pt_min: float = 0.9, K: int = 19) -> dict[str, float]:
    """AP@k (``"ap@k"``), ``"precision@K"`` and ``"recall@K"`` averaged over clouds (clouds with
    no qualifying hit are skipped, as :func:`~.core.ap_at_k_split`), plus ``"num_queries"``.

    Args:
        embeddings: one ``(n_i, d)`` tensor per cloud, rows in the cloud's hit order.
    """
    if len(embeddings) != len(clouds):
        raise ValueError(f"embeddings: got {len(embeddings)} for {len(clouds)} clouds")
    acc, prec, rec, nq = [], [], [], 0
    for emb, c in zip(embeddings, clouds):
        m = tracking_metrics_at_k(emb, c.inputs.particle_id, c.inputs.pt, c.inputs.reconstructable, pt_min, K)
        acc.append(m["accuracy"])
        prec.append(m["precision"])
        rec.append(m["recall"])
        nq += m["num_queries"]
    return {"ap@k": ap_at_k_split(acc), "precision@K": ap_at_k_split(prec), "recall@K": ap_at_k_split(rec),
            "num_queries": float(nq)}


def knn_baseline_metrics(clouds: Sequence[TrackingCloud], pt_min: float = 0.9, K: int = 19) -> dict[str, float]:
    """Metrics of the kNN-in-(η, φ) baseline: neighbours by hit position, no learning."""
    return evaluate_embeddings([knn_eta_phi_embedding(c.inputs) for c in clouds], clouds, pt_min, K)


class TrackingTask:
    """InfoNCE training and AP@k evaluation of per-hit embeddings (the authors' loss and metric).

    Args:
        similarity, tau, sigma: :func:`~.core.infonce_loss` options (authors: "l2_rbf",
            0.05, 0.75).
        random_pairs: fraction for :func:`~.core.add_random_pairs` each step (authors:
            0.2; 0 disables).
        pt_min, K: AP@k filter and neighbour count (authors: 0.9, 19).
        dbscan_min_samples: DBSCAN's ``min_samples`` for track building.
        match_pt_min, match_eta_max: the particle cuts of the track-matching metrics
            (pT ≥ 0.9 GeV, |η| < 4; :mod:`.metrics`).
    """

    def __init__(self, similarity: str = "l2_rbf", tau: float = 0.05, sigma: float = 0.75,
                 random_pairs: float = 0.2, pt_min: float = 0.9, K: int = 19, dbscan_min_samples: int = 2,
                 match_pt_min: float = 0.9, match_eta_max: float = 4.0):
        if similarity not in ("l2_rbf", "paper"):
            raise ValueError(f"similarity: expected 'l2_rbf' or 'paper', got {similarity!r}")
        for name, v in (("tau", tau), ("sigma", sigma)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be a finite number > 0, got {v!r}")
        if isinstance(random_pairs, bool) or not isinstance(random_pairs, (int, float)) or not (0 <= random_pairs < 1e3):
            raise ValueError(f"random_pairs: must be a number >= 0, got {random_pairs!r}")
        if isinstance(pt_min, bool) or not isinstance(pt_min, (int, float)) or not math.isfinite(pt_min):
            raise ValueError(f"pt_min: must be a finite number, got {pt_min!r}")
        if isinstance(K, bool) or not isinstance(K, int) or K < 1:
            raise ValueError(f"K: must be an integer >= 1, got {K!r}")
        if isinstance(dbscan_min_samples, bool) or not isinstance(dbscan_min_samples, int) or dbscan_min_samples < 1:
            raise ValueError(f"dbscan_min_samples: must be an integer >= 1, got {dbscan_min_samples!r}")
        self.similarity, self.tau, self.sigma = similarity, float(tau), float(sigma)
        self.random_pairs, self.pt_min, self.K = float(random_pairs), float(pt_min), K
        self.dbscan_min_samples = dbscan_min_samples
        try:
            TrackMetricsAccumulator(pt_min=match_pt_min, eta_max=match_eta_max)  # checks the cuts
        except ValueError as exc:
            raise ValueError(f"match_{exc}") from None
        self.match_pt_min, self.match_eta_max = float(match_pt_min), float(match_eta_max)
        #: The last :meth:`evaluate_report`'s track-matching tables
        #: (:meth:`~.metrics.TrackMetricsAccumulator.result`), None before one.
        self.track_report: dict | None = None

    def loss(self, model: nn.Module, cloud: TrackingCloud, generator: torch.Generator | None = None) -> torch.Tensor:
        """InfoNCE of one cloud; random extra pairs are drawn from ``generator``."""
        pairs = cloud.training_pairs(self.random_pairs, generator)
        dev = next(model.parameters()).device
        emb = model(cloud.inputs.x.to(dev), cloud.inputs.coords.to(dev))
        return self.pair_loss(emb, pairs.to(dev))

    def pair_loss(self, emb: torch.Tensor, pairs: TrackingPairs) -> torch.Tensor:
        """The task's InfoNCE (:func:`~.core.infonce_loss` with its options) of embeddings ``(n, d)``
        on ``pairs`` (e.g. :meth:`TrackingCloud.training_pairs`); a scalar."""
        return infonce_loss(emb, pairs, similarity=self.similarity, tau=self.tau, sigma=self.sigma)

    @torch.no_grad()
    def embed(self, model: nn.Module, clouds: Sequence[TrackingCloud]) -> list[torch.Tensor]:
        """Embeddings ``(n_i, d)`` (CPU, float32) of each cloud, model in eval mode."""
        was_training = model.training
        model.eval()
        try:
            dev = next(model.parameters()).device
            return [model(c.inputs.x.to(dev), c.inputs.coords.to(dev)).float().cpu() for c in clouds]
        finally:
            model.train(was_training)

    def evaluate(self, model: nn.Module, clouds: Sequence[TrackingCloud]) -> dict[str, float]:
        """:func:`evaluate_embeddings` of the model's embeddings (``"ap@k"`` is the main metric)."""
        return evaluate_embeddings(self.embed(model, clouds), clouds, self.pt_min, self.K)

    def evaluate_report(self, model: nn.Module, val_clouds: Sequence[TrackingCloud],
                        test_clouds: Sequence[TrackingCloud], eps_grid: Sequence[float] | None = None,
                        refine: int = DEFAULT_REFINE) -> dict[str, float]:
        """Test metrics with track building (what ``pointformers evaluate`` reports).

        The DBSCAN radius is chosen on ``val_clouds`` by maximising the mean TrackML score
        (:func:`~.building.choose_dbscan_eps`, ``eps_grid``/``refine`` as there); the test
        embeddings are then clustered with it. Returns :meth:`evaluate` on ``test_clouds``
        (``"ap@k"``, ``"precision@K"``, ``"recall@K"``, ``"num_queries"``) plus
        ``"trackml_score"`` (mean over test clouds), ``"dbscan_eps"``,
        ``"val_trackml_score"`` (the chosen radius's validation score) and the overall
        track-matching rates :data:`~.metrics.OVERALL_KEYS` (``"eff_dm"``,
        ``"eff_perfect"``, ``"eff_lhc"``, ``"fake_dm"``, ``"dup_lhc"``; counts pooled over the test
        clouds, see :func:`track_matching_report`). Every value is a float; the full
        track-matching result (all rates and counts, the tables against pT and η) is kept in
        :attr:`track_report`.
        """
        val_clouds, test_clouds = list(val_clouds), list(test_clouds)
        if not val_clouds:
            raise ValueError("val_clouds: need at least one validation cloud to choose the DBSCAN radius")
        if not test_clouds:
            raise ValueError("test_clouds: need at least one test cloud to report on")
        val_emb = self.embed(model, val_clouds)
        sel = choose_dbscan_eps(val_emb, [c.inputs.particle_id for c in val_clouds],
                                [cloud_truth_weights(c) for c in val_clouds], eps_grid=eps_grid,
                                min_samples=self.dbscan_min_samples, refine=refine)
        test_emb = self.embed(model, test_clouds)
        out = evaluate_embeddings(test_emb, test_clouds, self.pt_min, self.K)
        labels = [dbscan_tracks(e, sel.eps, self.dbscan_min_samples) for e in test_emb]
        out["trackml_score"] = trackml_score_split([trackml_score(lab, c.inputs.particle_id, cloud_truth_weights(c))
                                                    for lab, c in zip(labels, test_clouds)])
        out["dbscan_eps"] = sel.eps
        out["val_trackml_score"] = sel.score
        report = track_matching_report(labels, test_clouds, self.match_pt_min, self.match_eta_max)
        out.update({k: float(report["overall"][k]) for k in OVERALL_KEYS})
        self.track_report = report
        matched = [matched_track_truth(lab, c, self.match_pt_min, self.match_eta_max) for lab, c in zip(labels, test_clouds)]
        fitted = fitted_parameters([fit_tracks(lab, c.inputs.x.numpy()) for lab, c in zip(labels, test_clouds)],
                                   [t for t, _ in matched])
        out.update(fit_resolutions(fitted, {k: np.concatenate([w[k] for _, w in matched]) for k in fitted}))
        return out


def matched_track_truth(labels: np.ndarray, cloud: TrackingCloud, pt_min: float = 0.9,
                        eta_max: float = 4.0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The double-majority matched tracks of selected particles (pT ≥ ``pt_min``, |η| < ``eta_max``,
    reconstructable and, on φ-sector clouds, owned by the cloud: the particles :func:`track_matching_report`
    counts) of one cloud's track ``labels`` ``(n,)``, and their particles' truth: ``(tracks (t,) int64, {"pt",
    "eta", "phi", "charge": (t,) float64})`` (momentum at production; NaN where the cloud does not carry φ or
    charge)."""
    pid = cloud.inputs.particle_id.numpy()
    m = match_tracks(labels, pid)
    eta = cloud_particle_eta(cloud)
    ids, first = np.unique(pid, return_index=True)                     # a hit of every particle
    dm = np.flatnonzero(m.dm)
    hits = first[np.searchsorted(ids, m.particle_ids[m.majority[dm]])] if dm.size else np.zeros(0, np.int64)
    pt = cloud.inputs.pt.numpy().astype(np.float64)[hits]
    sel = (pt >= pt_min) & (np.abs(eta[hits]) < eta_max) & cloud.inputs.reconstructable.numpy().astype(bool)[hits]
    if cloud.sector_own is not None:
        sel &= cloud.sector_own.numpy().astype(bool)[hits]
    hits = hits[sel]

    def per_hit(values) -> np.ndarray:
        return (np.asarray(values.numpy(), dtype=np.float64)[hits] if values is not None
                else np.full(len(hits), np.nan))
    truth = {"pt": pt[sel], "eta": eta[hits], "phi": per_hit(cloud.particle_phi), "charge": per_hit(cloud.particle_q)}
    return np.asarray(m.track_ids)[dm][sel].astype(np.int64), truth


def load_tracking_splits(preset, splits: Sequence[str] = ("train", "val", "test"), cache_dir=None,
                         seed: int = 0) -> dict[str, list[TrackingEvent]]:
    """The requested splits of a tracking data set (generated once, cached on disk)."""
    from ...data.tracking import load_tracking_dataset

    return {s: load_tracking_dataset(preset, s, cache_dir=cache_dir, seed=seed) for s in splits}
