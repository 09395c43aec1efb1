"""Exact softmax multi-head attention via ``scaled_dot_product_attention`` (the quadratic baseline)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import TokenMixer, check_attention_inputs
from .registry import register


@register("full")
class FullAttention(TokenMixer):
    """softmax(QKᵀ/√d_h) V over all real points of each cloud, with a key-padding mask.

    Args:
        dim: model width D.
        heads: number of heads H.
        head_dim: per-head width d_h (default D // H, or D when H does not divide D).
        bias: whether the q/k/v projections carry a bias (the output projection always does).
    Shapes: x (B, N, D), mask (B, N) -> (B, N, D). ``pos`` is accepted and ignored.
    Memory: PyTorch's fused SDPA kernels (flash / memory-efficient) avoid the N×N matrix when
    no float mask is needed; the boolean key mask is only passed when a batch has padding.
    """

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, bias: bool = False):
        super().__init__(dim, heads)
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        inner = heads * self.head_dim
        self.w_q = nn.Linear(dim, inner, bias=bias)
        self.w_k = nn.Linear(dim, inner, bias=bias)
        self.w_v = nn.Linear(dim, inner, bias=bias)
        self.out_linear = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                **unused) -> torch.Tensor:
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, who="full")
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        q = self.w_q(x).view(B, N, H, d).transpose(1, 2)
        k = self.w_k(x).view(B, N, H, d).transpose(1, 2)
        v = self.w_v(x).view(B, N, H, d).transpose(1, 2)
        attn_mask = None if bool(mask.all()) else mask[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        y = self.out_linear(o.transpose(1, 2).reshape(B, N, H * d))
        return self.zero_padding(y, mask)
