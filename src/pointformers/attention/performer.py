"""Performer attention (FAVOR+, Choromanski et al. 2021): softmax attention estimated with
positive orthogonal random features in O(N·m·d) time and O(N·m + m·d) memory.

softmax(QKᵀ/√d) ≈ D̂⁻¹ Q'(K'ᵀV), with Q' = ϕ(Q d^{-1/4}), K' = ϕ(K d^{-1/4}) and
ϕ(x) = exp(Ωx − ‖x‖²/2) (positive, so the denominators stay positive); see
:mod:`.random_features` for the features, the stabilisation and the redraw machinery.
"""
from __future__ import annotations

import torch

from .base import TokenMixer, check_attention_inputs
from .flop_count import FlopCount, favor_features, favor_products, projections
from .random_features import (CAUSAL_EXPORT_REFUSAL, OrthogonalFeatures, compute_dtype, dense_softmax_attention,
                              favor_attention, resolve_seed)
from .registry import register


def performer_flops(m: "PerformerAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """Projections, the feature maps of q and k and the two FAVOR+ products (see :mod:`.flop_count`)."""
    H, d = m.heads, m.head_dim
    f = FlopCount().add("projections", projections(n, dim, H, d))
    # Ω is a frozen draw: the feature maps' backward forms d(input) only
    f.add("feature maps", H * favor_features(n, d, m.nb_features), backward=1)
    return f.add("attention", H * favor_products(n, d, m.nb_features))


@register("performer", flops=performer_flops, bench={"nb_features": 256})
class PerformerAttention(TokenMixer):
    """Multi-head FAVOR+ attention with a key-padding mask, non-causal or causal.

    Args:
        dim: model width D.
        heads: number of heads H.
        head_dim: per-head width d (default D // H, or D when H does not divide D).
        nb_features: random features m (Performer default 256); one Ω (m, d) shared by the heads.
        redraw: when Ω is resampled in training: "never", "every_forward_in_training", or an
            int N = every N training forwards (default 1000, the usual Performer practice).
        causal: query i attends to keys j ≤ i (index order), by chunked prefix sums.
        chunk_size: rows per chunk of the causal path (speed/memory knob, not semantics).
        seed: master seed of Ω's draws (default: drawn from ``generator`` or the global RNG).
        generator: optional torch.Generator used only to draw ``seed``.
        bias: whether q/k/v projections carry a bias (the output projection always does).

    Randomness: Ω is drawn at init (draw 0) and stored as a buffer with its seed and counters
    (``features.*`` in the state_dict). In training it is redrawn per ``redraw``; in ``eval()``
    it is frozen. Draws are deterministic functions of (seed, draw index). ``reset_parameters()``
    re-initialises the projections as the constructor does; buffers (frozen draws: Ω, its seed and
    counters) are kept.
    Shapes: x (B, N, D), mask (B, N) -> (B, N, D); ``pos`` is accepted and ignored.
    Dtypes: projections run in the module's dtype; features/exp in at least float32.
    Export mode: the non-causal forward is already a static graph (eval reads the frozen Ω), so it
    is the export path as is; ``causal=True`` is refused (:meth:`export_refusal`).
    """

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, nb_features: int = 256,
                 redraw: str | int = 1000, causal: bool = False, chunk_size: int = 128, seed: int | None = None,
                 generator: torch.Generator | None = None, bias: bool = False, dropout: float = 0.0):
        super().__init__(dim, heads, dropout)
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        self.nb_features = nb_features
        self.causal = bool(causal)
        self.chunk_size = chunk_size
        inner = heads * self.head_dim
        self._init_projections(inner, bias)
        self.features = OrthogonalFeatures(nb_features, self.head_dim, redraw, resolve_seed(seed, generator), stream=0)

    def qkv(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (scaled by d^{-1/4}) and v, each (B, H, N, d) in the compute dtype.

        Padded rows of x are zeroed first, so arbitrary (even non-finite) padding cannot reach
        the features or the gradients."""
        x = x.masked_fill(~mask.unsqueeze(-1), 0.0)
        cd = compute_dtype(x.dtype)
        scale = self.head_dim ** -0.25
        q = self.heads_of(self.w_q(x)).to(cd) * scale
        k = self.heads_of(self.w_k(x)).to(cd) * scale
        v = self.heads_of(self.w_v(x)).to(cd)
        return q, k, v

    def export_refusal(self) -> str | None:
        return CAUSAL_EXPORT_REFUSAL if self.causal else super().export_refusal()

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        """x (B, N, D), mask (B, N) -> (B, N, D); ``context`` is not used."""
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, who="performer")
        omega = self.features()  # applies the redraw policy in training
        q, k, v = self.qkv(x, mask)
        o = favor_attention(q, k, v, omega, mask, causal=self.causal, chunk_size=self.chunk_size)
        return self.merge_heads(o, mask, x.dtype)

    def exact_attention(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None
                        ) -> torch.Tensor:
        """Reference path: the exact softmax(QKᵀ/√d) attention that FAVOR+ estimates, with the
        same projections, mask and causality. O(N²) memory."""
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, who="performer")
        q, k, v = self.qkv(x, mask)
        o = dense_softmax_attention(q @ k.transpose(-1, -2), v, mask, causal=self.causal)
        return self.merge_heads(o, mask, x.dtype)

    _repr_fields = ("nb_features", "causal")
