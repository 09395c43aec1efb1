"""A LayerNorm transformer block (pre- or post-LN, GeLU FFN) around any token mixer of the contract.

It is the layout of SFT's layer (Fig. 1, Table 9: LayerNorm Pre or Post, GeLU FFN ×4, token and
feed-forward dropouts) and of FLT's Performer/ViT layers, with the mixer left open, so that a
model's full-attention twin is the same block with the ``full`` mechanism.
"""
from __future__ import annotations

import torch
from torch import nn


class TransformerBlock(nn.Module):
    """Pre-LN:  x ← x + Drop(mixer(LN₁(x)));  x ← x + Drop(FFN(LN₂(x)))
    Post-LN: x ← LN₁(x + Drop(mixer(x)));  x ← LN₂(x + Drop(FFN(x)))

    Args:
        dim: width D.
        mixer: a token mixer ``mixer(x, pos, mask, context=None)`` (see :mod:`pointformers.attention`).
        norm_position: ``"pre"`` or ``"post"``.
        ffn_mult: FFN expansion (D → ffn_mult·D → D, GeLU); ffn_hidden: an explicit hidden width instead.
        dropout: residual ("token embedding") dropout; ffn_dropout: after the FFN expansion.
    Shapes: x (B, N, D), pos (B, N, P) or None, mask (B, N) bool -> (B, N, D); padded rows zero.
    ``context``: the forward pass's :class:`~pointformers.attention.ForwardContext`, handed to the mixer.
    """

    def __init__(self, dim: int, mixer: nn.Module, norm_position: str = "pre", ffn_mult: int = 4,
                 dropout: float = 0.0, ffn_dropout: float = 0.0, ffn_hidden: int | None = None):
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        self.norm_position = norm_position
        self.mixer = mixer
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        hidden = ffn_hidden or ffn_mult * dim
        self.ffn = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(ffn_dropout), nn.Linear(hidden, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None, mask: torch.Tensor, context=None) -> torch.Tensor:
        keep = mask.unsqueeze(-1)
        x = x.masked_fill(~keep, 0.0)
        if self.norm_position == "pre":
            x = x + self.dropout(self.mixer(self.norm1(x), pos, mask, context=context))
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout(self.mixer(x, pos, mask, context=context)))
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x.masked_fill(~keep, 0.0)
