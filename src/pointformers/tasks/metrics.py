"""Metrics of the point-cloud, set and sequence tasks, exactly as the papers define them.

* Classification (ModelNet40, ListOps, ...): :func:`overall_accuracy` (OA, also plain
  :func:`accuracy`) and :func:`mean_class_accuracy` (mAcc, the mean over classes of the per-class
  recall).
* Part segmentation (ShapeNetPart, PointNet's evaluation protocol): per shape, the IoU of every
  part of the shape's *category* (not of all 50 parts), averaged to the shape's mIoU; the
  **instance mIoU** is the mean over shapes, the **class mIoU** the mean over categories of the
  mean shape mIoU within the category. Predictions are restricted to the category's parts
  (:func:`restricted_part_predictions`), as the standard evaluation does.
* Amortised clustering (Set Transformer, Sampled Transformer App. C): the log-likelihood per data
  point of a diagonal Gaussian mixture (:func:`mixture_log_likelihood`, "LL0/data"), and the same
  after one EM step started from the predicted parameters (:func:`em_step`, "LL1/data").
* Regression (FLT on OC20, Peptides-struct): :func:`mean_absolute_error` and
  :func:`energy_within_threshold` (EwT).
* Graph tasks (LRGB, SFT/SAMSA): :func:`multilabel_average_precision` (Peptides-func's AP: the mean over
  labels of each label's average precision, labels without both classes skipped, as OGB's
  ``eval_ap``) and :func:`macro_f1` (PascalVOC-sp: the unweighted mean of the per-class F1).
* Language modelling (FLT on WikiText-103): :func:`perplexity`, exp of the mean negative
  log-likelihood in nats per predicted token (:func:`token_nll` sums it over batches).

Every function rejects malformed input with a ``ValueError`` naming the argument.
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import torch

__all__ = [
    "as_labels", "overall_accuracy", "accuracy", "mean_class_accuracy", "restricted_part_predictions",
    "shape_part_ious", "part_segmentation_mious", "MixtureParams", "mixture_log_likelihood",
    "em_step", "clustering_log_likelihoods", "mean_absolute_error", "energy_within_threshold", "token_nll",
    "perplexity", "average_precision", "multilabel_average_precision", "macro_f1",
]


# ------------------------------------------------------------------------------------------------
# input checks
# ------------------------------------------------------------------------------------------------
def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        try:
            t = torch.as_tensor(t)
        except Exception as e:  # noqa: BLE001 - re-raised as a ValueError naming the argument
            raise ValueError(f"{name}: expected a tensor or array, got {type(t).__name__}") from e
    return t


def _int_labels(name: str, t, num_classes: int | None = None) -> torch.Tensor:
    t = _tensor(name, t)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name}: expected integer class labels, got dtype {t.dtype}")
    t = t.long()
    if t.numel() and int(t.min()) < 0:
        raise ValueError(f"{name}: class labels must be >= 0, got {int(t.min())}")
    if num_classes is not None and t.numel() and int(t.max()) >= num_classes:
        raise ValueError(f"{name}: label {int(t.max())} out of range for num_classes={num_classes}")
    return t


def as_labels(pred, name: str = "pred") -> torch.Tensor:
    """Class labels from predictions: integer labels (M,) as they are, scores/logits (M, C) by argmax."""
    pred = _tensor(name, pred)
    if pred.is_floating_point():
        if pred.dim() != 2 or pred.shape[1] == 0:
            raise ValueError(f"{name}: float scores must have shape (M, C) with C >= 1, got {tuple(pred.shape)}")
        if not bool(torch.isfinite(pred).all()):
            raise ValueError(f"{name}: scores contain NaN or inf")
        return pred.argmax(-1)
    if pred.dim() != 1:
        raise ValueError(f"{name}: integer labels must have shape (M,), got {tuple(pred.shape)}")
    return _int_labels(name, pred)


def _pair(pred, target) -> tuple[torch.Tensor, torch.Tensor]:
    p = as_labels(pred)
    t = _int_labels("target", target)
    if t.dim() != 1 or t.shape[0] != p.shape[0]:
        raise ValueError(f"target: expected shape ({p.shape[0]},) matching pred, got {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError("target: is empty; a metric needs at least one sample")
    return p, t


# ------------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------------
def overall_accuracy(pred, target) -> float:
    """OA: the fraction of samples whose predicted class equals the target.

    pred: (M,) integer labels or (M, C) scores; target: (M,) integer labels -> float in [0, 1].
    """
    p, t = _pair(pred, target)
    return float((p == t).double().mean())


def accuracy(pred, target) -> float:
    """Accuracy of sequence/set classification (LRA ListOps etc.); the same quantity as OA."""
    return overall_accuracy(pred, target)


def mean_class_accuracy(pred, target, num_classes: int | None = None) -> float:
    """mAcc: the mean over classes of the per-class accuracy (recall) ``|pred = c ∧ target = c| / |target = c|``.

    As in PointNet's ModelNet40 evaluation, the mean runs over the classes that occur in
    ``target`` (a class with no test sample has no accuracy). ``num_classes`` only validates labels.
    pred: (M,) labels or (M, C) scores; target: (M,) -> float in [0, 1].
    """
    p, t = _pair(pred, target)
    if num_classes is not None:
        _int_labels("target", t, num_classes)
    C = int(max(int(t.max()), int(p.max()) if p.numel() else 0)) + 1
    total = torch.bincount(t, minlength=C).double()
    correct = torch.bincount(t[p == t], minlength=C).double()
    present = total > 0
    return float((correct[present] / total[present]).mean())


# ------------------------------------------------------------------------------------------------
# part segmentation
# ------------------------------------------------------------------------------------------------
def _check_category_parts(category_parts: Sequence[Sequence[int]]) -> list[list[int]]:
    if isinstance(category_parts, Mapping):
        keys = sorted(category_parts)
        if keys != list(range(len(keys))):
            raise ValueError(f"category_parts: mapping keys must be the categories 0..K-1, got {keys[:10]}")
        category_parts = [category_parts[k] for k in keys]
    out = []
    for c, parts in enumerate(category_parts):
        parts = [int(p) for p in parts]
        if not parts:
            raise ValueError(f"category_parts: category {c} has no parts")
        if min(parts) < 0 or len(set(parts)) != len(parts):
            raise ValueError(f"category_parts: category {c} has negative or repeated part ids {parts}")
        out.append(parts)
    if not out:
        raise ValueError("category_parts: is empty; expected a list of part-id lists, one per category")
    return out


def restricted_part_predictions(logits: torch.Tensor, category, category_parts: Sequence[Sequence[int]],
                                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-point part labels, the argmax over the parts of each shape's category only (PointNet's evaluation).

    logits: (B, N, P) part scores; category: (B,) category ids; category_parts: list (per category)
    of its part ids; mask: (B, N) bool, True = real point (padded points get label -1).
    Returns (B, N) int64 part ids.
    """
    logits = _tensor("logits", logits)
    if logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError(f"logits: expected float (B, N, P) part scores, got {logits.dtype} {tuple(logits.shape)}")
    parts = _check_category_parts(category_parts)
    B, N, P = logits.shape
    cat = _int_labels("category", category, len(parts))
    if cat.shape != (B,):
        raise ValueError(f"category: expected shape ({B},), got {tuple(cat.shape)}")
    if max(max(p) for p in parts) >= P:
        raise ValueError(f"category_parts: a part id exceeds the {P} logit columns")
    allowed = torch.zeros(len(parts), P, dtype=torch.bool)
    for c, ps in enumerate(parts):
        allowed[c, ps] = True
    allowed = allowed.to(logits.device)[cat]                                # (B, P)
    pred = logits.masked_fill(~allowed[:, None, :], float("-inf")).argmax(-1)
    if mask is not None:
        pred = pred.masked_fill(~mask, -1)
    return pred


def shape_part_ious(pred, target, parts: Sequence[int]) -> torch.Tensor:
    """IoU of each of a shape's category parts: (n,) pred and target part ids -> (len(parts),).

    IoU_p = |pred = p ∧ target = p| / |pred = p ∨ target = p|. **Convention**: a part absent from
    both the prediction and the ground truth of the shape has IoU = 1 (PointNet's evaluation code,
    also used by PointNet++, DGCNN, Point Transformer), so a shape that lacks a part of its
    category is not penalised for (correctly) not predicting it.
    """
    p = _int_labels("pred", pred)
    t = _int_labels("target", target)
    if p.dim() != 1 or p.shape != t.shape:
        raise ValueError(f"pred/target: expected equal 1-D shapes (n,), got {tuple(p.shape)} and {tuple(t.shape)}")
    ious = []
    for part in parts:
        ip, it = p == part, t == part
        union = int((ip | it).sum())
        ious.append(1.0 if union == 0 else int((ip & it).sum()) / union)
    return torch.tensor(ious, dtype=torch.float64)


def part_segmentation_mious(preds: Sequence, targets: Sequence, categories,
                            category_parts: Sequence[Sequence[int]]) -> dict[str, float]:
    """ShapeNetPart class mIoU and instance mIoU (SFT Table 2 "c. IoU" / "i. IoU").

    Args:
        preds, targets: per shape, (n_s,) integer part ids of its real points (use
            :func:`restricted_part_predictions` for the predictions).
        categories: (S,) category id of every shape.
        category_parts: per category, the list of its part ids (e.g. ShapeNetPart's 16 → 50 map).
    Returns ``{"instance_miou", "class_miou"}``: instance = mean over shapes of the shape mIoU (the
    mean IoU over its category's parts, :func:`shape_part_ious`); class = mean over the categories
    that occur of the mean shape mIoU of that category. Both in [0, 1].
    """
    parts = _check_category_parts(category_parts)
    cats = _int_labels("categories", categories, len(parts))
    if cats.dim() != 1 or len(preds) != cats.shape[0] or len(targets) != cats.shape[0]:
        raise ValueError(f"preds/targets/categories: expected one entry per shape, got {len(preds)}, "
                         f"{len(targets)} and {tuple(cats.shape)}")
    if cats.numel() == 0:
        raise ValueError("categories: is empty; the mIoU needs at least one shape")
    per_cat: dict[int, list[float]] = {}
    shape_mious = []
    for s, (p, t) in enumerate(zip(preds, targets)):
        c = int(cats[s])
        t = _int_labels(f"targets[{s}]", t)
        bad = set(torch.unique(t).tolist()) - set(parts[c])
        if bad:
            raise ValueError(f"targets[{s}]: part ids {sorted(bad)} are not parts of category {c} ({parts[c]})")
        m = float(shape_part_ious(p, t, parts[c]).mean())
        shape_mious.append(m)
        per_cat.setdefault(c, []).append(m)
    class_miou = sum(sum(v) / len(v) for v in per_cat.values()) / len(per_cat)
    return {"instance_miou": sum(shape_mious) / len(shape_mious), "class_miou": class_miou}


# ------------------------------------------------------------------------------------------------
# amortised clustering: Gaussian-mixture log-likelihood, one EM step
# ------------------------------------------------------------------------------------------------
class MixtureParams(NamedTuple):
    """Diagonal Gaussian mixture parameters for a batch of sets.

    log_pi: (B, K) log mixing weights (normalised: logsumexp over K is 0).
    mu: (B, K, d) means.  sigma: (B, K, d) standard deviations (> 0).
    """

    log_pi: torch.Tensor
    mu: torch.Tensor
    sigma: torch.Tensor


def _check_mixture(x: torch.Tensor, params: MixtureParams, mask: torch.Tensor | None) -> torch.Tensor:
    x = _tensor("x", x)
    if x.dim() != 3 or not x.is_floating_point():
        raise ValueError(f"x: expected float points (B, N, d), got {x.dtype} {tuple(x.shape)}")
    B, N, d = x.shape
    if not isinstance(params, tuple) or len(params) != 3:
        raise ValueError("params: expected MixtureParams(log_pi (B, K), mu (B, K, d), sigma (B, K, d))")
    log_pi, mu, sigma = params
    if not isinstance(log_pi, torch.Tensor) or log_pi.dim() != 2 or log_pi.shape[0] != B:
        raise ValueError(f"params.log_pi: expected shape ({B}, K), got {tuple(getattr(log_pi, 'shape', ()))}")
    K = log_pi.shape[1]
    for name, t in (("params.mu", mu), ("params.sigma", sigma)):
        if not isinstance(t, torch.Tensor) or t.shape != (B, K, d):
            raise ValueError(f"{name}: expected shape {(B, K, d)}, got {tuple(getattr(t, 'shape', ()))}")
    for name, t in (("params.log_pi", log_pi), ("params.mu", mu), ("params.sigma", sigma)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name}: contains NaN or inf")
    if not bool((sigma > 0).all()):
        raise ValueError("params.sigma: standard deviations must be > 0")
    if mask is None:
        mask = torch.ones(B, N, dtype=torch.bool, device=x.device)
    elif not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != (B, N):
        raise ValueError(f"mask: expected a bool (B, N) = {(B, N)} tensor, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
    if bool((~mask.any(1)).any()):
        raise ValueError("mask: every set needs at least one real point")
    if not bool(torch.isfinite(x[mask]).all()):
        raise ValueError("x: contains NaN or inf at real points")
    return mask


def _component_log_density(x: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """log N(x_i; μ_j, diag σ_j²): x (B, N, d), mu/sigma (B, K, d) -> (B, N, K)."""
    z = (x[:, :, None, :] - mu[:, None]) / sigma[:, None]
    d = x.shape[-1]
    return -0.5 * z.pow(2).sum(-1) - torch.log(sigma).sum(-1)[:, None, :] - 0.5 * d * math.log(2 * math.pi)


def mixture_log_likelihood(x: torch.Tensor, params: MixtureParams, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Log-likelihood per data point of each set, ``(1/n) Σ_i log Σ_j π_j N(x_i; μ_j, diag σ_j²)`` (Eq. 6 / n).

    x: (B, N, d) points; params: :class:`MixtureParams`; mask: (B, N) bool, True = real point.
    Returns (B,) in float64. ``log_pi`` is renormalised (log-softmax) so unnormalised logits work too.
    """
    mask = _check_mixture(x, params, mask)
    xd = x.double().masked_fill(~mask[..., None], 0.0)
    log_pi = torch.log_softmax(params.log_pi.double(), -1)
    lp = torch.logsumexp(log_pi[:, None, :] + _component_log_density(xd, params.mu.double(), params.sigma.double()), -1)
    return (lp * mask).sum(1) / mask.sum(1)


def em_step(x: torch.Tensor, params: MixtureParams, mask: torch.Tensor | None = None,
            reg_covar: float = 1e-6) -> MixtureParams:
    """One EM update of a diagonal Gaussian mixture started from ``params`` (the "LL1" protocol).

    E-step: responsibilities γ_ij = π_j N(x_i; μ_j, σ_j²) / Σ_l π_l N(x_i; μ_l, σ_l²) over the real
    points. M-step (as scikit-learn's ``GaussianMixture(covariance_type="diag")``, which the
    Sampled Transformer paper uses): n_j = Σ_i γ_ij + 10·eps, π_j = n_j / Σ_l n_l,
    μ_j = Σ_i γ_ij x_i / n_j, σ_j² = Σ_i γ_ij (x_i − μ_j)² / n_j + reg_covar.
    Shapes as :func:`mixture_log_likelihood`; returns new :class:`MixtureParams` in float64.
    """
    if not reg_covar >= 0:
        raise ValueError(f"reg_covar: must be >= 0, got {reg_covar!r}")
    mask = _check_mixture(x, params, mask)
    xd = x.double().masked_fill(~mask[..., None], 0.0)
    logits = torch.log_softmax(params.log_pi.double(), -1)[:, None, :] + \
        _component_log_density(xd, params.mu.double(), params.sigma.double())
    resp = torch.softmax(logits, -1) * mask[..., None]                           # (B, N, K)
    nk = resp.sum(1) + 10 * torch.finfo(torch.float64).eps                       # (B, K)
    mu = torch.einsum("bnk,bnd->bkd", resp, xd) / nk[..., None]
    var = torch.einsum("bnk,bnkd->bkd", resp, (xd[:, :, None, :] - mu[:, None]).pow(2)) / nk[..., None] + reg_covar
    log_pi = torch.log(nk / nk.sum(-1, keepdim=True))
    return MixtureParams(log_pi, mu, var.sqrt())


def clustering_log_likelihoods(x: torch.Tensor, params: MixtureParams, mask: torch.Tensor | None = None
                               ) -> dict[str, float]:
    """The amortised-clustering metrics of Sampled Transformer Table 8 / Set Transformer Table 3.

    ``ll0``: log-likelihood per data point of the predicted parameters; ``ll1``: the same after one
    EM step (:func:`em_step`) from them. Each is the mean over real points of all sets (every point
    weighs the same, as Set Transformer's batches of equal-size sets do). x (B, N, d), mask (B, N).
    """
    mask = _check_mixture(x, params, mask)
    n = mask.sum(1).double()
    ll0 = mixture_log_likelihood(x, params, mask)
    ll1 = mixture_log_likelihood(x, em_step(x, params, mask), mask)
    return {"ll0": float((ll0 * n).sum() / n.sum()), "ll1": float((ll1 * n).sum() / n.sum())}


# ------------------------------------------------------------------------------------------------
# regression
# ------------------------------------------------------------------------------------------------
def _reg_pair(pred, target) -> tuple[torch.Tensor, torch.Tensor]:
    p, t = _tensor("pred", pred), _tensor("target", target)
    if p.shape != t.shape:
        raise ValueError(f"pred/target: shapes differ, {tuple(p.shape)} vs {tuple(t.shape)}")
    if p.numel() == 0:
        raise ValueError("target: is empty; a metric needs at least one sample")
    for name, v in (("pred", p), ("target", t)):
        if v.dtype == torch.bool or v.is_complex():
            raise ValueError(f"{name}: expected real numbers, got dtype {v.dtype}")
        if not bool(torch.isfinite(v.double()).all()):
            raise ValueError(f"{name}: contains NaN or inf")
    return p.double(), t.double()


def mean_absolute_error(pred, target) -> float:
    """MAE = mean |pred − target| over all elements (FLT OC20 energy MAE, Peptides-struct)."""
    p, t = _reg_pair(pred, target)
    return float((p - t).abs().mean())


def energy_within_threshold(pred, target, threshold: float = 0.02) -> float:
    """EwT: the fraction of samples with |pred − target| < threshold (OC20 standard: 0.02 eV)."""
    if not threshold > 0:
        raise ValueError(f"threshold: must be > 0, got {threshold!r}")
    p, t = _reg_pair(pred, target)
    return float(((p - t).abs() < threshold).double().mean())


def token_nll(logits, target, mask=None) -> tuple[float, int]:
    """(Σ −log softmax(logits)[target], number of tokens) over the positions where ``mask``.

    logits: (..., V) scores; target: (...) integer ids in [0, V); mask: (...) bool or None (all).
    The sum is accumulated in float64 so that batches add up exactly enough for a perplexity."""
    lg = _tensor("logits", logits)
    if lg.dim() < 1 or lg.shape[-1] < 1 or lg.dtype == torch.bool or lg.is_complex():
        raise ValueError(f"logits: expected real scores (..., V), got {lg.dtype} {tuple(lg.shape)}")
    t = _tensor("target", target)
    if t.shape != lg.shape[:-1] or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"target: expected integer ids of shape {tuple(lg.shape[:-1])}, got {t.dtype} {tuple(t.shape)}")
    m = torch.ones_like(t, dtype=torch.bool) if mask is None else _tensor("mask", mask)
    if m.dtype != torch.bool or m.shape != t.shape:
        raise ValueError(f"mask: expected bool of shape {tuple(t.shape)}, got {m.dtype} {tuple(m.shape)}")
    lg, t = lg[m].double(), t[m].long()
    if t.numel() == 0:
        return 0.0, 0
    if int(t.min()) < 0 or int(t.max()) >= lg.shape[-1]:
        raise ValueError(f"target: ids must lie in [0, {lg.shape[-1]}), got [{int(t.min())}, {int(t.max())}]")
    if not bool(torch.isfinite(lg).all()):
        raise ValueError("logits: contain NaN or inf at real positions")
    nll = torch.logsumexp(lg, -1) - lg.gather(-1, t[:, None]).squeeze(-1)
    return float(nll.sum()), int(t.numel())


def perplexity(logits, target, mask=None) -> float:
    """exp(mean NLL per token) of next-token ``logits`` (..., V) for ``target`` (...) where ``mask``
    (FLT Table 1's metric; a uniform model over V words has perplexity V)."""
    total, n = token_nll(logits, target, mask)
    if n == 0:
        raise ValueError("mask: selects no token; perplexity needs at least one")
    return math.exp(total / n)


def average_precision(scores, target) -> float:
    """AP of one binary label: Σ_n (R_n − R_{n−1}) P_n over the distinct score thresholds, highest
    first (scikit-learn's ``average_precision_score``; tied scores form one threshold).
    scores: (M,) real; target: (M,) 0/1 with at least one positive -> float in [0, 1]."""
    s, t = _reg_pair(scores, target)
    if not bool(((t == 0) | (t == 1)).all()):
        raise ValueError("target: expected 0/1 labels")
    pos = float(t.sum())
    if pos == 0:
        raise ValueError("target: has no positive; average precision is undefined")
    order = torch.argsort(s, descending=True, stable=True)
    s, t = s[order], t[order]
    tp = torch.cumsum(t, 0)
    last = torch.ones_like(s, dtype=torch.bool)  # the last row of every run of tied scores
    last[:-1] = s[1:] != s[:-1]
    tp, n = tp[last], torch.nonzero(last).flatten().double() + 1
    precision, recall = tp / n, tp / pos
    prev = torch.cat([recall.new_zeros(1), recall[:-1]])
    return float(((recall - prev) * precision).sum())


def multilabel_average_precision(scores, target) -> float:
    """Mean over labels of :func:`average_precision` (Peptides-func, LRGB), over the labels whose
    column has both a positive and a negative; NaN targets are unlabelled and skipped (OGB's
    ``eval_ap``). scores, target: (M, L) -> float in [0, 1]."""
    s, t = _tensor("scores", scores).double(), _tensor("target", target).double()
    if s.dim() != 2 or s.shape != t.shape:
        raise ValueError(f"scores/target: expected two (M, L) arrays of one shape, got {tuple(s.shape)} and "
                         f"{tuple(t.shape)}")
    aps = []
    for j in range(t.shape[1]):
        labelled = ~torch.isnan(t[:, j])
        col = t[labelled, j]
        if bool((col == 1).any()) and bool((col == 0).any()):
            aps.append(average_precision(s[labelled, j], col))
    if not aps:
        raise ValueError("target: no label has both a positive and a negative; AP is undefined")
    return float(sum(aps) / len(aps))


def macro_f1(pred, target) -> float:
    """Macro F1: the unweighted mean over classes of 2·TP / (2·TP + FP + FN), over the classes that
    occur in ``target`` or in the predictions (a class with no TP, FP or FN scores 0), as
    scikit-learn's ``f1_score(average="macro")`` (PascalVOC-sp, LRGB).
    pred: (M,) labels or (M, C) scores; target: (M,) -> float in [0, 1]."""
    p, t = _pair(pred, target)
    C = int(max(int(t.max()), int(p.max()))) + 1
    tp = torch.bincount(t[p == t], minlength=C).double()
    fp = torch.bincount(p[p != t], minlength=C).double()
    fn = torch.bincount(t[p != t], minlength=C).double()
    present = (torch.bincount(t, minlength=C) + torch.bincount(p, minlength=C)) > 0
    f1 = 2 * tp / (2 * tp + fp + fn).clamp_min(1.0)
    return float(f1[present].mean())
