"""Glue between the tracking task and the training engine.

* :func:`prepare_tracking_clouds` turns :class:`~pointformers.data.event.TrackingEvent`
  clouds into :class:`TrackingCloud` samples once: model inputs (float32) and, for training
  clouds, the authors' labelled pairs (:func:`~.core.build_tracking_pairs`), so an
  epoch does no neighbour search.
* :class:`TrackingTask` implements the engine's task protocol: ``loss(model, cloud,
  generator)`` is the InfoNCE loss on the cloud's pairs plus fresh random pairs (as the
  authors do every step); ``evaluate(model, clouds)`` returns AP@k (the code's
  ``accuracy@0.9``) averaged over clouds, with precision@K and recall@K.
* :func:`evaluate_embeddings` scores any per-cloud embeddings, e.g. the kNN-in-(η, φ)
  baseline (:func:`knn_baseline_metrics`).
* :meth:`TrackingTask.evaluate_report` adds track building: DBSCAN on the embeddings with
  its radius chosen on the validation clouds (:mod:`.building`), scored on the test
  clouds with the TrackML score (:mod:`.trackml_score`) and the track-matching metrics
  (efficiency, fake and duplicate rates, overall and against pT and η; :mod:`.metrics`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import nn

from ...data.event import TrackingEvent
from .building import DEFAULT_REFINE, choose_dbscan_eps, dbscan_tracks
from .metrics import OVERALL_KEYS, TrackMetricsAccumulator, particle_eta
from .trackml_score import trackml_like_weights, trackml_score, trackml_score_split
from .core import (
    TrackingInputs,
    TrackingPairs,
    add_random_pairs,
    ap_at_k_split,
    build_tracking_pairs,
    infonce_loss,
    knn_eta_phi_embedding,
    tracking_inputs,
    tracking_metrics_at_k,
)

__all__ = [
    "TrackingCloud",
    "TrackingTask",
    "prepare_tracking_clouds",
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
    """

    inputs: TrackingInputs
    half_edges: torch.Tensor | None = None
    half_positive: torch.Tensor | None = None
    event: TrackingEvent | None = None
    pt_min: float = 0.9
    weight: torch.Tensor | None = None
    particle_eta: torch.Tensor | None = None
    sector_own: torch.Tensor | None = None

    @property
    def num_hits(self) -> int:
        return self.inputs.num_hits

    @property
    def has_pairs(self) -> bool:
        return self.half_edges is not None

    def pairs(self) -> TrackingPairs:
        """The full undirected :class:`TrackingPairs` (both directions, int64)."""
        if self.half_edges is None or self.half_positive is None:
            raise ValueError("cloud: has no pairs; prepare it with with_pairs=True to train on it")
        e = self.half_edges.long()
        eligible = ((self.inputs.particle_id != 0) & self.inputs.reconstructable
                    & (self.inputs.pt > self.pt_min))
        return TrackingPairs(torch.cat([e, e.flip(0)], dim=1), self.half_positive.repeat(2),
                             self.inputs.particle_id, eligible)


def prepare_tracking_clouds(
    events: Iterable[TrackingEvent],
    with_pairs: bool = True,
    radius: float = 1.0,
    max_num_neighbors: int = 256,
    pt_min: float = 0.9,
    keep_events: bool = False,
    progress: bool = False,
    desc: str = "pairs",
) -> list[TrackingCloud]:
    """Precompute inputs (and pairs) of every cloud once.

    Args:
        events: the clouds (e.g. one split of :func:`~pointformers.data.tracking.load_tracking_dataset`).
        with_pairs: build the training pairs (the authors' pair generation; ``radius`` and ``max_num_neighbors``
            are the authors' radius graph in (η, φ), ``pt_min`` the positive filter).
        keep_events: keep a reference to each source event (for event displays).
        progress: show a tqdm bar.
    """
    events = list(events)
    it: Iterable[TrackingEvent] = events
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(events, desc=desc, leave=False, dynamic_ncols=True)
    out = []
    for ev in it:
        inp = tracking_inputs(ev, dtype=torch.float32)
        half_e = half_p = None
        if with_pairs:
            p = build_tracking_pairs(inp, radius=radius, max_num_neighbors=max_num_neighbors, pt_min=pt_min)
            keep = p.edge_index[0] < p.edge_index[1]  # the list is symmetric: keep one direction
            half_e = p.edge_index[:, keep].to(torch.int32).contiguous()
            half_p = p.is_positive[keep].contiguous()
        weight = torch.as_tensor(np.asarray(ev.weight, dtype=np.float64))
        eta = torch.as_tensor(np.nan_to_num(ev.per_hit(particle_eta(ev.px, ev.py, ev.pz), 0.0), nan=0.0))
        own = None if ev.sector_own is None else torch.as_tensor(np.asarray(ev.sector_own, dtype=bool))
        out.append(TrackingCloud(inp, half_e, half_p, ev if keep_events else None, pt_min, weight, eta, own))
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
                          eta_max: float = 4.0, min_hits: int = 3) -> dict:
    """The track-matching metrics (:mod:`.metrics`) of per-cloud track labels, counts
    pooled over the clouds: :meth:`~.metrics.TrackMetricsAccumulator.result`. On φ-sector
    clouds only the particles a sector owns count in it, so each particle counts once."""
    if len(labels) != len(clouds):
        raise ValueError(f"labels: got {len(labels)} for {len(clouds)} clouds")
    acc = TrackMetricsAccumulator(pt_min=pt_min, eta_max=eta_max, min_hits=min_hits)
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


def _mirrored(pairs: TrackingPairs, n_listed: int) -> TrackingPairs:
    """The same directed pairs laid out as ``[half, half reversed]`` so :func:`infonce_loss`
    computes each distance once. ``pairs`` = a mirrored list of ``n_listed`` pairs followed by
    undirected random pairs (both directions of each, as :func:`add_random_pairs` appends)."""
    h = n_listed // 2
    extra = pairs.edge_index[:, n_listed:]
    one_way = extra[0] < extra[1]  # no self pairs among the random ones
    half = torch.cat([pairs.edge_index[:, :h], extra[:, one_way]], dim=1)
    pos = torch.cat([pairs.is_positive[:h], pairs.is_positive[n_listed:][one_way]])
    return TrackingPairs(torch.cat([half, half.flip(0)], dim=1), pos.repeat(2), pairs.particle_id, pairs.eligible)


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
        pairs = cloud.pairs()
        if self.random_pairs > 0:
            pairs = _mirrored(add_random_pairs(pairs, self.random_pairs, generator=generator), pairs.num_pairs)
        dev = next(model.parameters()).device
        emb = model(cloud.inputs.x.to(dev), cloud.inputs.coords.to(dev))
        return infonce_loss(emb, pairs.to(dev), similarity=self.similarity, tau=self.tau, sigma=self.sigma)

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
        return out


def load_tracking_splits(preset, splits: Sequence[str] = ("train", "val", "test"), cache_dir=None,
                         seed: int = 0) -> dict[str, list[TrackingEvent]]:
    """The requested splits of a tracking data set (generated once, cached on disk)."""
    from ...data.tracking import load_tracking_dataset

    return {s: load_tracking_dataset(preset, s, cache_dir=cache_dir, seed=seed) for s in splits}
