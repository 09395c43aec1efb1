"""Normalisation layers the blocks use besides ``nn.LayerNorm``."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight over the last dim (SAMSA's norm). (…, D) -> (…, D)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        """The gain back to 1, as at construction."""
        with torch.no_grad():
            self.weight.fill_(1.0)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, eps={self.eps}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
