"""The set criterion of end-to-end track reconstruction: targets per sector, Hungarian matching of
track slots to target particles, and the class, focal and dice losses.

A track-slot decoder (:class:`pointformers.nn.track_decoder.TrackDecoder`) predicts, for each of
``M`` slots of a sector, an object logit (is this slot a track?) and an assignment logit for each of
the sector's ``n`` hits (does this hit belong to the slot's track?). The targets of a sector are the
target particles (pT above a cut, reconstructable: hits on at least three pixel layers) with at
least ``min_hits`` of their hits in the sector, each as a ``(n,)`` hit mask.

Matching (as in DETR / Mask2Former, and the HEPT authors' set decoder): for each sector and each
supervised decoder layer, the slot-to-target assignment minimising

    C[i, j] = w_class · (−σ(object_i)) + w_focal · focal(i, j) + w_dice · dice(i, j)

(:func:`scipy.optimize.linear_sum_assignment`), where ``focal(i, j)`` is the sigmoid focal loss of
slot ``i``'s assignment logits against target ``j``'s hit mask, averaged over the sector's real hits,
and ``dice(i, j) = 1 − (2 Σ p t + 1) / (Σ p + Σ t + 1)`` with ``p = σ(assignment)``. The loss uses
the same weights: ``w_class`` times the binary cross-entropy of every slot's object logit (matched
slots 1, the others 0, averaged over slots), plus ``w_focal`` and ``w_dice`` times the focal and
dice losses of the matched pairs, summed and divided by the number of targets (at least 1). The
published weights are 0.1 class, 200 focal and 2 dice.

Padding hits (``hit_mask`` False) take part in nothing: not in the costs, not in the losses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

try:
    from scipy.optimize import linear_sum_assignment
except ModuleNotFoundError as exc:  # optional dependency: the 'tasks' extra
    raise ModuleNotFoundError("pointformers.tasks.tracking.set_criterion needs scipy: "
                              "pip install 'pointformers[tasks]'", name=exc.name) from exc

__all__ = ["SetCriterionWeights", "sector_targets", "match_slots", "pair_costs", "set_loss",
           "sigmoid_focal", "dice_loss"]


@dataclass(frozen=True)
class SetCriterionWeights:
    """Weights of the matching cost and of the loss (the same weights for both).

    Attributes:
        cls: weight of the object/no-object term (published: 0.1).
        focal: weight of the focal term of the hit assignment (published: 200).
        dice: weight of the dice term of the hit assignment (published: 2).
        alpha: focal-loss α (weight of the positive class), 0.25 as in Lin et al.
        gamma: focal-loss γ, 2.
        no_object: relative weight of the unmatched slots' no-object targets in the object/no-object
            term, whose mean is then weighted by the targets' weights (DETR's ``eos_coef``, 0.1 there):
            with thousands of slots and a few hundred targets per event the unmatched slots otherwise
            dominate the term and hold every object score low. 1 (default): the plain mean, which the
            published design describes.
    """

    cls: float = 0.1
    focal: float = 200.0
    dice: float = 2.0
    alpha: float = 0.25
    gamma: float = 2.0
    no_object: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.no_object, (int, float)) and math.isfinite(self.no_object) and self.no_object > 0):
            raise ValueError(f"SetCriterionWeights.no_object: expected a finite number > 0, got {self.no_object!r}")
        for name in ("cls", "focal", "dice", "gamma"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"SetCriterionWeights.{name}: expected a finite number >= 0, got {v!r}")
        if not (isinstance(self.alpha, (int, float)) and 0.0 <= self.alpha <= 1.0):
            raise ValueError(f"SetCriterionWeights.alpha: expected a number in [0, 1], got {self.alpha!r}")
        if self.cls + self.focal + self.dice <= 0:
            raise ValueError("SetCriterionWeights: at least one of cls, focal and dice must be > 0")


def sector_targets(particle_id: torch.Tensor, hit_mask: torch.Tensor, is_target: torch.Tensor,
                   min_hits: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """The target particles of one sector as hit masks.

    Args:
        particle_id: ``(n,)`` int64 particle of each of the sector's hits (0 = noise).
        hit_mask: ``(n,)`` bool, True for a real hit (False = padding).
        is_target: ``(n,)`` bool, True where the hit's particle is a target of the event (e.g. pT above
            0.9 GeV and hits on at least three layers); evaluated per hit so that sectors need no table.
        min_hits: a target particle becomes a target of the sector when at least this many of its
            hits are among the sector's real hits.

    Returns:
        ``(masks, ids)``: ``(T, n)`` bool hit masks of the ``T`` targets (False at padding) and
        their ``(T,)`` particle ids, in increasing id order.
    """
    if particle_id.dim() != 1 or hit_mask.shape != particle_id.shape or is_target.shape != particle_id.shape:
        raise ValueError(f"sector_targets: particle_id, hit_mask and is_target must be (n,) tensors of one shape, "
                         f"got {tuple(particle_id.shape)}, {tuple(hit_mask.shape)}, {tuple(is_target.shape)}")
    if not isinstance(min_hits, int) or isinstance(min_hits, bool) or min_hits < 1:
        raise ValueError(f"sector_targets: min_hits must be an integer >= 1, got {min_hits!r}")
    keep = hit_mask.bool() & is_target.bool() & (particle_id > 0)
    ids, counts = torch.unique(particle_id[keep], return_counts=True)
    ids = ids[counts >= min_hits]
    masks = (particle_id[None, :] == ids[:, None]) & hit_mask.bool()[None, :]
    return masks, ids


def _check_pred(object_logits: torch.Tensor, assign_logits: torch.Tensor, hit_mask: torch.Tensor,
                target_masks: torch.Tensor) -> None:
    if assign_logits.dim() != 2 or object_logits.shape != assign_logits.shape[:1] \
            or hit_mask.shape != assign_logits.shape[1:]:
        raise ValueError(f"set criterion: expected object_logits (M,), assign_logits (M, n) and hit_mask (n,), got "
                         f"{tuple(object_logits.shape)}, {tuple(assign_logits.shape)}, {tuple(hit_mask.shape)}")
    if target_masks.dim() != 2 or target_masks.shape[1] != hit_mask.shape[0]:
        raise ValueError(f"set criterion: target_masks must be (T, {hit_mask.shape[0]}), got {tuple(target_masks.shape)}")


def sigmoid_focal(logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0) -> torch.Tensor:
    """Elementwise sigmoid focal loss (Lin et al. 2017), the same shape as ``logits``:
    ``−α t (1−p)^γ log p − (1−α)(1−t) p^γ log(1−p)`` with ``p = σ(logits)``."""
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    a_t = alpha * targets + (1 - alpha) * (1 - targets)
    return a_t * ce * (1 - p_t) ** gamma


def _focal_both(logits: torch.Tensor, p: torch.Tensor, alpha: float, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sigmoid_focal` of every logit against target 1 and against target 0, ``p = σ(logits)`` given:
    ``−α (1−p)^γ log p`` and ``−(1−α) p^γ log(1−p)``, with one log-sigmoid (log(1 − p) = log p − logits; a pair
    of costs per slot and hit is the matcher's largest elementwise work; γ = 2 squares instead of a power)."""
    q = 1 - p
    qg, pg = (q * q, p * p) if gamma == 2.0 else (q ** gamma, p ** gamma)
    log_p = F.logsigmoid(logits)
    return -alpha * qg * log_p, -(1 - alpha) * pg * (log_p - logits)      # log(1 − p) = log p − logits


def _dice(overlap: torch.Tensor, p_sum: torch.Tensor, t_sum: torch.Tensor) -> torch.Tensor:
    """``1 − (2·overlap + 1) / (p_sum + t_sum + 1)``: the smoothed dice loss from its three sums."""
    return 1 - (2 * overlap + 1) / (p_sum + t_sum + 1)


def dice_loss(probs: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Dice loss per row: ``1 − (2 Σ w p t + 1) / (Σ w p + Σ w t + 1)``; ``probs``, ``targets`` ``(K, n)``,
    ``weight`` ``(n,)`` (1 for real hits, 0 for padding); returns ``(K,)``."""
    return _dice((probs * targets * weight).sum(-1), (probs * weight).sum(-1), (targets * weight).sum(-1))


def pair_costs(object_logits: torch.Tensor, assign_logits: torch.Tensor, hit_mask: torch.Tensor,
               target_masks: torch.Tensor, weights: SetCriterionWeights = SetCriterionWeights()) -> torch.Tensor:
    """The matching cost of every (slot, target) pair of one sector, ``(M, T)`` in the predictions' dtype (at
    least float32; no gradient).

    Args:
        object_logits: ``(M,)``; assign_logits: ``(M, n)``; hit_mask: ``(n,)`` bool;
        target_masks: ``(T, n)`` bool (see :func:`sector_targets`).
    """
    _check_pred(object_logits, assign_logits, hit_mask, target_masks)
    with torch.no_grad():
        # in the predictions' precision, at least float32: the costs only rank pairs, and float64 for float32
        # predictions doubles the elementwise work, the matcher's largest
        dt = torch.promote_types(assign_logits.dtype, torch.float32)
        x = assign_logits.to(dt)
        w = hit_mask.to(dt)
        t = target_masks.to(dt)
        n_real = w.sum().clamp_min(1.0)
        # focal(i, j) = Σ_h w_h [pos_ih t_jh + neg_ih (1 − t_jh)] / n_real = (Σ_h w_h (pos − neg)_ih t_jh + Σ_h w_h
        # neg_ih) / n_real, and the dice overlap Σ_h w_h p_ih t_jh: one matrix product for both, no (M, T, n) tensor
        p = torch.sigmoid(x)
        pos, neg = _focal_both(x, p, weights.alpha, weights.gamma)
        m = x.shape[0]
        both = torch.cat([(pos - neg) * w, p * w]) @ t.T                         # (2M, T)
        focal = (both[:m] + (neg * w).sum(-1)[:, None]) / n_real
        dice = _dice(both[m:], (p * w).sum(-1)[:, None], (t * w).sum(-1)[None, :])
        cls = -torch.sigmoid(object_logits.to(dt))[:, None]
        return weights.cls * cls + weights.focal * focal + weights.dice * dice


def match_slots(cost: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The slot-to-target assignment of least total cost: ``(slots, targets)`` index arrays, each of length
    ``min(M, T)``, sorted by slot (:func:`scipy.optimize.linear_sum_assignment`)."""
    if cost.dim() != 2:
        raise ValueError(f"match_slots: cost must be (M, T), got {tuple(cost.shape)}")
    c = cost.detach().cpu().double().numpy()
    if not np.isfinite(c).all():
        raise ValueError("match_slots: the cost matrix holds NaN or infinite values (non-finite predictions?)")
    if c.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rows, cols = linear_sum_assignment(c)
    return rows.astype(np.int64), cols.astype(np.int64)


def set_loss(object_logits: torch.Tensor, assign_logits: torch.Tensor, hit_mask: torch.Tensor,
             target_masks: Sequence[torch.Tensor], weights: SetCriterionWeights = SetCriterionWeights(),
             matches: Optional[Sequence[tuple[np.ndarray, np.ndarray]]] = None) -> dict[str, torch.Tensor]:
    """The set loss of one decoder layer over a batch of ``S`` sectors.

    Args:
        object_logits: ``(S, M)`` object logits of the slots.
        assign_logits: ``(S, M, n)`` hit-assignment logits.
        hit_mask: ``(S, n)`` bool, True for real hits.
        target_masks: ``S`` bool tensors ``(T_s, n)``, the targets of each sector (:func:`sector_targets`).
        weights: the cost and loss weights.
        matches: the matches to use (one ``(slots, targets)`` pair per sector); computed when None.

    Returns:
        ``{"loss", "cls", "focal", "dice"}``: the weighted total and its unweighted parts, scalars.
    """
    if object_logits.dim() != 2 or assign_logits.dim() != 3 or assign_logits.shape[:2] != object_logits.shape \
            or hit_mask.shape != (assign_logits.shape[0], assign_logits.shape[2]):
        raise ValueError(f"set_loss: expected object_logits (S, M), assign_logits (S, M, n), hit_mask (S, n); got "
                         f"{tuple(object_logits.shape)}, {tuple(assign_logits.shape)}, {tuple(hit_mask.shape)}")
    s_count = object_logits.shape[0]
    if len(target_masks) != s_count:
        raise ValueError(f"set_loss: {len(target_masks)} target sets for {s_count} sectors")
    if matches is None:
        matches = [match_slots(pair_costs(object_logits[s], assign_logits[s], hit_mask[s], target_masks[s], weights))
                   for s in range(s_count)]
    obj_target = torch.zeros_like(object_logits)
    focal_sum = assign_logits.new_zeros(())
    dice_sum = assign_logits.new_zeros(())
    n_targets = 0
    for s, (rows, cols) in enumerate(matches):
        n_targets += int(target_masks[s].shape[0])
        if len(rows) == 0:
            continue
        r = torch.as_tensor(rows, device=object_logits.device)
        c = torch.as_tensor(cols, device=object_logits.device)
        obj_target[s, r] = 1.0
        x = assign_logits[s, r]                       # (K, n) the matched slots' logits
        t = target_masks[s][c].to(x.dtype)            # (K, n) their targets
        w = hit_mask[s].to(x.dtype)
        n_real = w.sum().clamp_min(1.0)
        focal_sum = focal_sum + (sigmoid_focal(x, t, weights.alpha, weights.gamma) * w).sum() / n_real
        dice_sum = dice_sum + dice_loss(torch.sigmoid(x), t, w).sum()
    denom = max(n_targets, 1)
    if weights.no_object == 1.0:
        cls = F.binary_cross_entropy_with_logits(object_logits, obj_target)
    else:  # the mean weighted by the targets' weights (matched slots 1, unmatched ones no_object)
        w = torch.where(obj_target > 0, 1.0, weights.no_object).to(object_logits.dtype)
        cls = (F.binary_cross_entropy_with_logits(object_logits, obj_target, reduction="none") * w).sum() / w.sum()
    focal = focal_sum / denom
    dice = dice_sum / denom
    return {"loss": weights.cls * cls + weights.focal * focal + weights.dice * dice,
            "cls": cls, "focal": focal, "dice": dice}
