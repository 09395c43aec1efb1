"""Differentiable sampling machinery shared by the sampling-based mechanisms (``sft``, ``samsa``).

Both mechanisms rank the real points of every cloud by a learned importance score, optionally
perturbed by Gumbel(0, 1) noise, keep the best ones as keys/values, and let the score learn
through a soft "bin competition" between the kept tokens and some rejected ones.

Padding rules kept by every helper here:

* padded points get the score ``-inf`` and are therefore ranked after every real point;
* ties are broken by a **stable** descending sort, i.e. by the original index order, so a cloud
  ranks its points the same way alone or inside a padded batch (the contract's padding
  invariance must not depend on how ``torch.topk`` happens to break ties).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores, noise and probabilities are computed in: float32 at least (float64 stays)."""
    return torch.promote_types(dtype, torch.float32)


def gumbel_noise(shape: tuple[int, ...], *, dtype: torch.dtype = torch.float32, device=None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """i.i.d. Gumbel(0, 1) samples ``g = -log(-log U)``, ``U ~ Uniform(0, 1)`` (clamped away from 0 and 1).

    Draws from ``generator`` when given, otherwise from torch's global RNG, so
    ``torch.manual_seed`` makes every forward reproducible.
    """
    u = torch.rand(shape, dtype=dtype, device=device, generator=generator)
    tiny = torch.finfo(dtype).tiny
    u = u.clamp(min=tiny, max=1.0 - torch.finfo(dtype).eps)
    return -torch.log(-torch.log(u))


def stable_descending_order(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort the last dim in descending order with ties kept in index order.

    Returns ``(values, indices)`` shaped like ``scores``; ``-inf`` (padding) goes last.
    O(n log n); the ranking must not depend on the padded length, which ``topk`` does not promise.
    """
    return torch.sort(scores, dim=-1, descending=True, stable=True)


def gather_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (..., n, c) at ``idx`` (..., k) -> (..., k, c). Leading dims must match."""
    return x.gather(-2, idx.unsqueeze(-1).expand(*idx.shape, x.shape[-1]))


def log_softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(softplus(x))`` without underflow: equals ``x`` (to double precision) for x < -30."""
    safe = torch.where(x < -30.0, torch.zeros_like(x), x)
    return torch.where(x < -30.0, x, torch.log(F.softplus(safe)))


def softplus_power_ratio(z_a: torch.Tensor, z_b: torch.Tensor, tau: float) -> torch.Tensor:
    """Two-way Softplus-power bin probability (SFT Eq. 9 with two candidates).

    ``p = SP(z_a)^{1/τ} / (SP(z_a)^{1/τ} + SP(z_b)^{1/τ})``, computed as
    ``sigmoid((log SP(z_a) − log SP(z_b)) / τ)`` so that neither the power nor the ratio can
    overflow. ``p >= 0.5`` whenever ``z_a >= z_b`` (Softplus is increasing).
    """
    return torch.sigmoid((log_softplus(z_a) - log_softplus(z_b)) / tau)


def straight_through(hard: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """Forward value ``hard``, gradient of ``soft`` (the reparameterization trick ∇g ≜ ∇g_soft)."""
    return hard + (soft - soft.detach())
