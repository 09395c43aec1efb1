"""Pre-LN transformer block around any token mixer of the attention contract."""
from __future__ import annotations

import torch
from torch import nn


class FeedForward(nn.Sequential):
    """Linear(D, hidden) → ReLU → Linear(hidden, D). (…, D) -> (…, D)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))


class PreLNBlock(nn.Module):
    """x ← x + Drop(mixer(LN₁(x))); x ← x + Drop(FFN(LN₂(x))).

    Args:
        dim: width D.
        mixer: a token mixer ``mixer(x, pos, mask, context=None)`` (see :mod:`pointformers.attention`).
        ffn_hidden: FFN hidden width (HEPT: D, no 4× expansion).
        dropout: residual dropout (HEPT: 0.1).
    Shapes: x (B, N, D), pos (B, N, P), mask (B, N) -> (B, N, D); padded rows stay zero.
    ``context``: the forward pass's :class:`~pointformers.attention.ForwardContext`, handed to the mixer.
    """

    def __init__(self, dim: int, mixer: nn.Module, ffn_hidden: int | None = None, dropout: float = 0.1):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.mixer = mixer
        self.norm2 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, ffn_hidden or dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None, mask: torch.Tensor, context=None) -> torch.Tensor:
        keep = mask.unsqueeze(-1)
        x = x + self.dropout(self.mixer(self.norm1(x), pos, mask, context=context))
        x = x + self.dropout(self.ff(self.norm2(x)))
        return x * keep
