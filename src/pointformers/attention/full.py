"""Exact softmax multi-head attention via ``scaled_dot_product_attention`` (the quadratic baseline)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import TokenMixer, check_attention_inputs
from .flop_count import FlopCount, dense_core, projections
from .registry import register


def full_flops(m: "FullAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """Projections and the dense n × n core of every head (see :mod:`.flop_count`)."""
    H, d = m.heads, m.head_dim
    return FlopCount().add("projections", projections(n, dim, H, d)).add("attention", H * dense_core(n, d, d))


@register("full", flops=full_flops, bench={})
class FullAttention(TokenMixer):
    """softmax(QKᵀ/√d_h) V over all real points of each cloud, with a key-padding mask.

    Args:
        dim: model width D.
        heads: number of heads H.
        head_dim: per-head width d_h (default D // H, or D when H does not divide D).
        bias: whether the q/k/v projections carry a bias (the output projection always does).
        causal: query i attends to the real keys j ≤ i only (index order; a decoder, e.g. the
            language models of :mod:`pointformers.models.language_models`).
    Shapes: x (B, N, D), mask (B, N) -> (B, N, D). ``pos`` is accepted and ignored.
    Memory: PyTorch's fused SDPA kernels (flash / memory-efficient) avoid the N×N matrix when
    no float mask is needed; the boolean key mask is only passed when a batch has padding.
    Export mode (:func:`~.base.set_exportable`): the same path, except that a given mask is always
    passed to SDPA (deciding whether it has padding would read it on the host); mask=None skips it.
    """

    _repr_fields = ("causal",)

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, bias: bool = False, dropout: float = 0.0,
                 causal: bool = False):
        super().__init__(dim, heads, dropout)
        self.causal = bool(causal)
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        inner = heads * self.head_dim
        self._init_projections(inner, bias)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        """x (B, N, D), mask (B, N) or None (no padding) -> (B, N, D); ``context`` is not used."""
        unpadded = mask is None
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, who="full")
        if not unpadded:  # padding may hold anything (NaN too): keep it out of the keys and values
            x = x.masked_fill(~mask[..., None], 0.0)
        q, k, v = self.heads_of(self.w_q(x)), self.heads_of(self.w_k(x)), self.heads_of(self.w_v(x))
        # the key mask only when there is padding; export mode cannot look (host read), so a given mask is used
        no_padding = unpadded or (not self.exportable and bool(mask.all()))
        attn_mask = None if no_padding else mask[:, None, None, :]
        if self.causal and attn_mask is not None:
            N = x.shape[1]
            tri = torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
            # each query also sees itself: a padded query row is never empty (no NaN), a real one unchanged
            attn_mask = (attn_mask & tri) | torch.eye(N, dtype=torch.bool, device=x.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=self.causal and attn_mask is None)
        return self.merge_heads(o, mask)
