"""Masked pooling over the points of padded clouds: padding never enters a cloud's pooled vector."""
from __future__ import annotations

import torch


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over each cloud's real points. x (B, N, D), mask (B, N) bool -> (B, D).

    Every cloud needs at least one real point (the callers' input checks guarantee it).
    """
    return x.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each cloud's real points. x (B, N, D), mask (B, N) bool -> (B, D)."""
    keep = mask.unsqueeze(-1)
    return x.masked_fill(~keep, 0.0).sum(1) / keep.sum(1).clamp_min(1).to(x.dtype)


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each cloud's real points (extensive quantities such as energies). (B, N, D) -> (B, D)."""
    return x.masked_fill(~mask.unsqueeze(-1), 0.0).sum(1)
