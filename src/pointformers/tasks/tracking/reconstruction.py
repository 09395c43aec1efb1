"""The engine's task for end-to-end track reconstruction (model ``track-reconstruction``): the set loss
with the encoder's auxiliary losses, and evaluation on tracks, not embeddings.

Loss of one cloud (:meth:`TrackReconstructionTask.losses`), the terms of the HEPT authors' set-decoder
design plus a track-parameter term:

* ``set``: for every decoder layer (deep supervision) and every φ-sector, Hungarian matching of slots to
  the sector's target particles (pT > ``pt_min``, hits on at least three pixel layers, at least
  ``min_hits`` hits in the sector) and the class, focal and dice losses with the matching's own weights
  (:mod:`.set_criterion`), summed over layers;
* ``hit``: ``hit_weight`` × the binary cross-entropy of the hit classifier against "hit of a target
  particle" (of pT above ``hit_pt_min``, by default ``pt_min``);
* ``embed``: ``embed_weight`` × HEPT's InfoNCE of the hit embedding on the cloud's labelled pairs plus
  fresh random pairs (:class:`~.training.TrackingTask`'s loss, same options);
* ``params``: ``param_weight`` × the track-parameter loss of the last layer's matched slots: smooth-L1 on
  log pT, η, cos φ and sin φ of the matched particle (momentum at production), and the binary
  cross-entropy of the charge logit.

Evaluation (:meth:`~TrackReconstructionTask.evaluate`): the model's track labels (tracks merged by
embedding, :func:`~pointformers.models.track_reconstruction.merge_tracks`) scored by the TrackML score and
the track-matching metrics (:mod:`.metrics`), at the assignment threshold, merging radius and hit gate
chosen on validation clouds (as HEPT's DBSCAN radius); :meth:`evaluate_report` adds the track-parameter
resolutions of the double-majority matched tracks.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...models.track_reconstruction import TrackOutput, track_parameters
from .metrics import OVERALL_KEYS
from .set_criterion import SetCriterionWeights, match_slots, pair_costs, sector_targets, set_loss
from .track_fit import PARAM_KEYS, fit_resolutions, fit_tracks, fitted_parameters, parameter_resolutions
from .trackml_score import trackml_score, trackml_score_split
from .training import (TrackingCloud, TrackingTask, cloud_particle_eta, cloud_truth_weights, matched_track_truth,
                       track_matching_report)

__all__ = ["TrackReconstructionTask", "PARAM_KEYS", "THRESHOLD_GRID", "MERGE_RADIUS_GRID", "HIT_GATE_GRID",
           "AssignmentChoice", "parameter_resolutions"]



def _number(v, name: str, lo: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
        raise ValueError(f"{name}: must be a finite number >= {lo:g}, got {v!r}")
    return float(v)


#: The assignment thresholds :meth:`TrackReconstructionTask.choose_assignment` tries on validation clouds.
THRESHOLD_GRID = (0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

#: The merging radii (in the hit embedding; 0: fragments only) it tries at the chosen threshold.
MERGE_RADIUS_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)

#: The hit-classifier gates (the model's ``hit_threshold``) it tries with each radius, when the classifier's
#: targets are a subset of the slots' (the task's ``hit_pt_min`` above ``pt_min``; otherwise the model's own).
HIT_GATE_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


class AssignmentChoice(NamedTuple):
    """What :meth:`TrackReconstructionTask.choose_assignment` chose on validation clouds, and its score."""

    threshold: float
    merge_radius: float
    hit_threshold: float
    score: float


def _best_setting(labels: Sequence[np.ndarray], clouds: Sequence[TrackingCloud], prefer_last: bool = True) -> tuple[int, float]:
    """The index of the setting (rows of each cloud's labels ``(T, n)``) of highest mean TrackML score, and
    that score; ties keep the later row (``prefer_last``) or the earlier one."""
    best = (0, float("-inf"))
    for i in range(len(labels[0]) if labels else 0):
        score = trackml_score_split([trackml_score(lab[i], c.inputs.particle_id, cloud_truth_weights(c))
                                     for lab, c in zip(labels, clouds)])
        if score > best[1] or (prefer_last and score == best[1]):
            best = (i, score)
    return best


#: The model options validation chooses (:meth:`TrackReconstructionTask.validated_options`).
_VALIDATED = ("threshold", "merge_radius", "hit_threshold")


class TrackReconstructionTask:
    """Set loss plus auxiliary losses; track-level evaluation (the engine's task protocol).

    Args:
        weights: the matching-cost and loss weights (:class:`~.set_criterion.SetCriterionWeights`).
        min_hits: hits a target particle needs in a sector to be one of its targets.
        pt_min: the target particles' pT cut [GeV] (also the InfoNCE positives').
        hit_weight, embed_weight, param_weight: weights of the auxiliary hit-classifier, InfoNCE and
            track-parameter losses (0 turns one off).
        similarity, tau, sigma, random_pairs: the InfoNCE options (:class:`~.training.TrackingTask`).
        match_pt_min, match_eta_max: the particle cuts of the track-matching metrics.
        hit_pt_min: the hit classifier's pT cut [GeV] (its targets: hits of reconstructable particles above
            it; None: ``pt_min``). With every particle a slot target (``pt_min`` 0), a cut at the metrics' 0.9
            GeV lets the model's ``hit_threshold`` keep hits of low-pT particles out of the tracks.
    """

    def __init__(self, weights: SetCriterionWeights = SetCriterionWeights(), min_hits: int = 3, pt_min: float = 0.9,
                 hit_weight: float = 1.0, embed_weight: float = 1.0, param_weight: float = 1.0,
                 similarity: str = "l2_rbf", tau: float = 0.05, sigma: float = 0.75, random_pairs: float = 0.2,
                 match_pt_min: float = 0.9, match_eta_max: float = 4.0, hit_pt_min: float | None = None):
        if not isinstance(weights, SetCriterionWeights):
            raise ValueError(f"weights: expected a SetCriterionWeights, got {type(weights).__name__}")
        if isinstance(min_hits, bool) or not isinstance(min_hits, int) or min_hits < 1:
            raise ValueError(f"min_hits: must be an integer >= 1, got {min_hits!r}")
        self.weights, self.min_hits = weights, min_hits
        self.hit_weight = _number(hit_weight, "hit_weight")
        self.embed_weight = _number(embed_weight, "embed_weight")
        self.param_weight = _number(param_weight, "param_weight")
        # the InfoNCE term and the matching cuts are the embedding task's (its checks name the option)
        self.embedding_task = TrackingTask(similarity, tau, sigma, random_pairs, pt_min,
                                           match_pt_min=match_pt_min, match_eta_max=match_eta_max)
        self.pt_min = self.embedding_task.pt_min
        if hit_pt_min is not None and (isinstance(hit_pt_min, bool) or not isinstance(hit_pt_min, (int, float))
                                       or not (0 <= hit_pt_min < float("inf"))):
            raise ValueError(f"hit_pt_min: expected a finite number >= 0 [GeV] (or None: pt_min), got {hit_pt_min!r}")
        #: the hit classifier's targets: hits of reconstructable particles of pT above this [GeV]
        self.hit_pt_min = self.pt_min if hit_pt_min is None else float(hit_pt_min)
        self.match_pt_min, self.match_eta_max = self.embedding_task.match_pt_min, self.embedding_task.match_eta_max
        #: The last :meth:`evaluate_report`'s track-matching tables, None before one.
        self.track_report: dict | None = None
        #: (predicted, true) parameters of the matched tracks of the last evaluate_report (resolution plots)
        self.param_pairs: tuple[dict, dict] | None = None
        #: the helix fit's parameters of the same tracks (:func:`.track_fit.fitted_parameters`), None before
        self.fit_values: dict | None = None
        #: The (threshold, merging radius, hit threshold) fixed by :meth:`use_validated` after training; None:
        #: :meth:`evaluate` chooses.
        self.fixed: tuple[float, float, float] | None = None

    # ------------------------------------------------------------------ training
    def losses(self, out: TrackOutput, cloud: TrackingCloud,
               generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Every term of one cloud's loss from the model's outputs (``forward(..., outputs=True)`` on the
        cloud as a batch of one): ``{"loss", "set", "hit", "embed", "params"}``, scalars (unweighted
        parts; ``loss`` is the weighted sum)."""
        dev = out.hit_logits.device
        pid = cloud.inputs.particle_id.to(dev)
        target = cloud.target_hits(self.pt_min).to(dev)
        sec = out.sectors
        if out.hit_logits.shape[0] != 1:
            raise ValueError(f"out: expected the outputs of one cloud (batch 1), got a batch of {out.hit_logits.shape[0]}")
        targets, ids = [], []
        for s in range(sec.index.shape[0]):
            m, i = sector_targets(pid[sec.index[s]], sec.mask[s], target[sec.index[s]], self.min_hits)
            targets.append(m)
            ids.append(i)
        set_total = out.hit_logits.new_zeros(())
        last_matches = None
        for stage in out.stages:
            matches = [match_slots(pair_costs(stage.object_logits[s], stage.assign_logits[s], sec.mask[s], targets[s],
                                              self.weights)) for s in range(len(targets))]
            set_total = set_total + set_loss(stage.object_logits, stage.assign_logits, sec.mask, targets, self.weights,
                                             matches)["loss"]
            last_matches = matches
        hit_target = target if self.hit_pt_min == self.pt_min else cloud.target_hits(self.hit_pt_min).to(dev)
        hit = F.binary_cross_entropy_with_logits(out.hit_logits[0], hit_target.to(out.hit_logits.dtype))
        zero = out.hit_logits.new_zeros(())
        embed = zero
        if self.embed_weight > 0:
            pairs = cloud.training_pairs(self.embedding_task.random_pairs, generator)
            embed = self.embedding_task.pair_loss(out.embedding[0], pairs.to(dev))
        params = self._param_loss(out, cloud, targets, last_matches) if self.param_weight > 0 else zero
        total = set_total + self.hit_weight * hit + self.embed_weight * embed + self.param_weight * params
        return {"loss": total, "set": set_total, "hit": hit, "embed": embed, "params": params}

    def _param_loss(self, out: TrackOutput, cloud: TrackingCloud, targets: list, matches: list) -> torch.Tensor:
        """Track-parameter loss of the matched slots of the last layer (mean over matched slots)."""
        if cloud.particle_q is None or cloud.particle_phi is None:
            raise ValueError("cloud: has no particle charge and azimuth (particle_q, particle_phi); prepare it with "
                             "prepare_tracking_clouds, or set param_weight to 0")
        dev = out.params.device
        inp = cloud.inputs
        eta = torch.as_tensor(cloud_particle_eta(cloud))
        truth = torch.stack([inp.pt.double().clamp_min(1e-3).log(), (cloud.particle_q > 0).double(), eta.double(),
                             cloud.particle_phi.double().cos(), cloud.particle_phi.double().sin()], -1).to(dev)
        pred, want = [], []
        for s, (rows, cols) in enumerate(matches):
            if len(rows) == 0:
                continue
            first = targets[s][torch.as_tensor(cols, device=dev)].int().argmax(1)   # a hit of each matched target
            hits = out.sectors.index[s][first]
            pred.append(out.params[s, torch.as_tensor(rows, device=dev)])
            want.append(truth[hits].to(out.params.dtype))
        if not pred:
            return out.params.new_zeros(())
        p, t = torch.cat(pred), torch.cat(want)
        reg = F.smooth_l1_loss(p[:, [0, 2, 3, 4]], t[:, [0, 2, 3, 4]])
        return reg + F.binary_cross_entropy_with_logits(p[:, 1], t[:, 1])

    def loss(self, model: nn.Module, cloud: TrackingCloud, generator: torch.Generator | None = None) -> torch.Tensor:
        """The weighted loss of one cloud (the engine's entry point)."""
        dev = next(model.parameters()).device
        out = model(cloud.inputs.x.to(dev)[None], cloud.inputs.coords.to(dev)[None], outputs=True)
        return self.losses(out, cloud, generator)["loss"]

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def predict(self, model: nn.Module, clouds: Sequence[TrackingCloud],
                settings: Sequence[tuple] | None = None) -> list[tuple[np.ndarray, TrackOutput]]:
        """Per cloud: track labels ``(n,)`` int64 (−1: no track; tracks merged) and the model's outputs
        (CPU), model in eval mode. ``settings``: labels at each of these (threshold, merging radius) pairs or
        (threshold, merging radius, hit threshold) triples instead of the model's own (None in one: the
        model's), ``(len(settings), n)`` per cloud (one forward pass per cloud)."""
        return [(labels, out) for labels, out, _ in self._predict(model, clouds, settings)]

    def _predict(self, model: nn.Module, clouds: Sequence[TrackingCloud],
                 settings: Sequence[tuple] | None = None, keep_raw: bool = False):
        """:meth:`predict`'s ``(labels, outputs)`` per cloud and a third item: with ``keep_raw``, the
        unmerged, ungated labels ``(len(settings), n)`` at each setting's threshold (to choose the radius and
        the gate after)."""
        was_training = model.training
        model.eval()
        try:
            dev = next(model.parameters()).device
            res = []
            for c in clouds:
                x, coords = c.inputs.x.to(dev)[None], c.inputs.coords.to(dev)[None]
                out = model(x, coords, outputs=True)
                raw: dict[float | None, torch.Tensor] = {}
                per, unmerged = [], []
                for setting in (settings if settings is not None else [(None, None, None)]):
                    t, r, g = (tuple(setting) + (None,))[:3]
                    if t not in raw:
                        raw[t] = model.assign(out, c.num_hits, t, hit_threshold=0.0)
                    per.append(model.merge(model.gate(raw[t], out.hit_logits, g), out.embedding, r,
                                           sectors=out.sectors.k)[0].cpu().numpy())
                    if keep_raw:
                        unmerged.append(raw[t][0].cpu().numpy())
                res.append((np.stack(per) if settings is not None else per[0], out,
                            np.stack(unmerged) if keep_raw else None))
            return res
        finally:
            model.train(was_training)

    def choose_assignment(self, model: nn.Module, val_clouds: Sequence[TrackingCloud],
                          thresholds: Sequence[float] = THRESHOLD_GRID,
                          radii: Sequence[float] = MERGE_RADIUS_GRID,
                          hit_thresholds: Sequence[float] | None = None) -> AssignmentChoice:
        """The assignment threshold, the merging radius and the hit-classifier gate of highest mean TrackML
        score on ``val_clouds`` (the end-to-end counterpart of HEPT's DBSCAN radius, chosen the same way):
        first the threshold of ``thresholds`` with the model's own radius and gate (ties: the larger
        threshold), then at that threshold every (radius, gate) pair of ``radii`` × ``hit_thresholds`` (ties:
        the smaller gate, then the smaller radius). ``hit_thresholds`` default: :data:`HIT_GATE_GRID` when the
        hit classifier learns a subset of the slots' targets (``hit_pt_min`` > ``pt_min``), else the model's
        own gate alone. One forward pass per cloud."""
        return self._choose(model, list(val_clouds), thresholds, radii, hit_thresholds)[0]

    def _gates(self, model: nn.Module, hit_thresholds: Sequence[float] | None) -> tuple[float, ...]:
        if hit_thresholds is not None:
            return tuple(float(g) for g in hit_thresholds)
        return HIT_GATE_GRID if self.hit_pt_min > self.pt_min else (model.hit_threshold,)

    def _choose(self, model: nn.Module, clouds: list, thresholds: Sequence[float], radii: Sequence[float],
                hit_thresholds: Sequence[float] | None = None) -> tuple[AssignmentChoice, list]:
        """:meth:`choose_assignment`'s choice and each cloud's labels ``(n,)`` there."""
        pred = self._predict(model, clouds, [(t, None, None) for t in thresholds], keep_raw=True)
        i, _ = _best_setting([lab for lab, _, _ in pred], clouds)
        pairs = [(r, g) for g in self._gates(model, hit_thresholds) for r in radii]
        merged = []
        for _, out, raw in pred:
            labels = torch.as_tensor(raw[i], device=out.embedding.device)[None]
            merged.append(np.stack([model.merge(model.gate(labels, out.hit_logits, g), out.embedding, r,
                                                sectors=out.sectors.k)[0].cpu().numpy() for r, g in pairs]))
        j, score = _best_setting(merged, clouds, prefer_last=False)
        choice = AssignmentChoice(float(thresholds[i]), float(pairs[j][0]), float(pairs[j][1]), score)
        return choice, [lab[j] for lab in merged]

    def _scores(self, labels: Sequence[np.ndarray], clouds: Sequence[TrackingCloud]) -> tuple[dict[str, float], dict]:
        out = {"trackml_score": trackml_score_split([trackml_score(lab, c.inputs.particle_id, cloud_truth_weights(c))
                                                     for lab, c in zip(labels, clouds)])}
        report = track_matching_report(labels, clouds, self.match_pt_min, self.match_eta_max,
                                       tracks="the model's tracks")
        out.update({k: float(report["overall"][k]) for k in OVERALL_KEYS})
        out["num_tracks"] = float(sum(len(np.unique(lab[lab >= 0])) for lab in labels))
        return out, report

    def evaluate(self, model: nn.Module, clouds: Sequence[TrackingCloud]) -> dict[str, float]:
        """``trackml_score`` (the validation metric), the overall track-matching rates
        (:data:`~.metrics.OVERALL_KEYS`) and ``num_tracks``, counts pooled over the clouds, at the assignment
        threshold and merging radius that score best on these clouds (:meth:`choose_assignment`;
        ``threshold``, ``merge_radius``, ``hit_threshold``), or at those :meth:`use_validated` fixed: they
        belong to the model selection, as HEPT's DBSCAN radius. (At the model's own threshold a model whose
        object scores are still low would score 0 for many epochs, and ``best.pt`` would stay at the first.)"""
        clouds = list(clouds)
        if self.fixed is not None:
            t, r, g = self.fixed
            labels = [lab[0] for lab, _ in self.predict(model, clouds, [(t, r, g)])]
        else:
            (t, r, g, _), labels = self._choose(model, clouds, THRESHOLD_GRID, MERGE_RADIUS_GRID)
        out = self._scores(labels, clouds)[0]
        out["threshold"], out["merge_radius"], out["hit_threshold"] = float(t), float(r), float(g)
        return out

    def validated_options(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """The model options validation chose (the engine's hook, see
        :func:`~pointformers.engine.trainer.validated_options`): ``{"threshold": …, "merge_radius": …,
        "hit_threshold": …}`` from a validation pass's metrics; ``best.pt`` stores them in its model config, so
        the model rebuilt from it (evaluate, predict, export) assigns, gates and merges as validation chose."""
        return {k: float(metrics[k]) for k in _VALIDATED if k in metrics}

    def use_validated(self, model: nn.Module, options: Mapping[str, float]) -> None:
        """After training, before the test pass: the model's threshold, merging radius and hit threshold
        become the validated ones and :meth:`evaluate` uses them instead of choosing on the clouds it scores
        (the test set)."""
        for k in _VALIDATED:
            if k in options:
                setattr(model, k, float(options[k]))
        if options.keys() & set(_VALIDATED):
            self.fixed = (model.threshold, model.merge_radius, model.hit_threshold)

    def evaluate_report(self, model: nn.Module, val_clouds: Sequence[TrackingCloud],
                        test_clouds: Sequence[TrackingCloud]) -> dict[str, float]:
        """What ``pointformers evaluate --split test`` reports: :meth:`evaluate` on ``test_clouds`` plus the
        track-parameter resolutions (:func:`parameter_resolutions`, :data:`PARAM_KEYS`, and :data:`~.track_fit.FIT_KEYS` of
        the helix fit of the same tracks' hits, :func:`.track_fit.fit_tracks`) of the
        double-majority matched tracks of selected particles. The assignment threshold and the merging radius
        and the hit gate are chosen on ``val_clouds`` (:meth:`choose_assignment`, as HEPT's DBSCAN radius is;
        ``threshold``, ``merge_radius``, ``hit_threshold`` and ``val_trackml_score`` in the result); without
        validation clouds the model's own are used. The full matching result is kept in :attr:`track_report`."""
        test_clouds, val_clouds = list(test_clouds), list(val_clouds)
        if not test_clouds:
            raise ValueError("test_clouds: need at least one test cloud to report on")
        chosen: dict[str, float] = {}
        if val_clouds:
            t, r, g, score = self.choose_assignment(model, val_clouds)
            chosen = {"threshold": t, "merge_radius": r, "hit_threshold": g, "val_trackml_score": score}
        own = model.threshold
        if chosen:   # the slots' helix fits (param_fit) take the hits each slot claims at the chosen threshold too
            model.threshold = chosen["threshold"]
        try:
            pred = self.predict(model, test_clouds, [(t, r, g)] if chosen else None)
        finally:
            model.threshold = own
        pred = [(lab[0] if chosen else lab, o) for lab, o in pred]
        out, report = self._scores([lab for lab, _ in pred], test_clouds)
        self.track_report = report
        got: dict[str, list] = {k: [] for k in ("pt", "eta", "phi", "charge")}
        fits, matched, truths = [], [], []
        for (labels, o), c in zip(pred, test_clouds):
            tracks, truth = matched_track_truth(labels, c, self.match_pt_min, self.match_eta_max)
            params = track_parameters(o.params.reshape(-1, o.params.shape[-1]).double().cpu())
            for k in got:
                got[k].append(params[k][torch.as_tensor(tracks)].numpy())
            fits.append(fit_tracks(labels, c.inputs.x.numpy()))
            matched.append(tracks)
            truths.append(truth)
        want = {k: np.concatenate([t[k] for t in truths]) for k in got}
        self.param_pairs = ({k: np.concatenate(v) for k, v in got.items()}, want)
        out.update(parameter_resolutions(*self.param_pairs))
        self.fit_values = fitted_parameters(fits, matched)
        out.update(fit_resolutions(self.fit_values, want))
        out.update(chosen)
        return out
