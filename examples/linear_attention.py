"""A new attention mechanism in one file: linear attention (Katharopoulos et al., ICML 2020).

softmax(QKᵀ)V is replaced by φ(Q)(φ(K)ᵀV) / φ(Q)(φ(K)ᵀ1) with φ(x) = elu(x) + 1: O(N·d²)
instead of O(N²·d). Importing this file registers it as ``"linear"``; from then on the package's
models, training, benchmarks and export take it like any built-in mechanism::

    import pointformers, linear_attention                       # noqa: F401  (registers "linear")
    model = pointformers.models.build("tracking-encoder", attention="linear")
    pointformers.bench.flops.attention_flops("linear", n=4096, dim=64, heads=4).total()
    pointformers.export.export_model(model, "linear.onnx")

What a mechanism provides (docs/adding-a-mechanism.md): a :class:`~pointformers.attention.TokenMixer`
subclass with ``forward(x, pos=None, mask=None, context=None)`` that zeroes padded rows, and a
``register`` call with its metadata — here a FLOP formula, benchmark options, and (implicitly,
``export=None``) the statement that its forward traces for a dynamic point count as it is.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pointformers.attention import TokenMixer, check_attention_inputs, register
from pointformers.attention.flop_count import FlopCount, projections


def linear_flops(m: "LinearAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """q/k/v/out projections, then per head φ(K)ᵀ[V, 1] and φ(Q)·(φ(K)ᵀ[V, 1]): 4·n·d·(d+1)."""
    H, d = m.heads, m.head_dim
    return FlopCount().add("projections", projections(n, dim, H, d)).add("attention", H * 4 * n * d * (d + 1))


@register("linear", flops=linear_flops, bench={"head_dim": 16})
class LinearAttention(TokenMixer):
    """Linear attention with the elu + 1 feature map (Katharopoulos et al. 2020).

    Args:
        dim: model width D. heads: H. head_dim: per-head width d (default D // H).
    Shapes: x (B, N, D), mask (B, N) -> (B, N, D); ``pos`` is accepted and ignored.
    """

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None):
        super().__init__(dim, heads)
        self.head_dim = head_dim or max(1, dim // heads)
        inner = heads * self.head_dim
        self.w_qkv = nn.Linear(dim, 3 * inner, bias=False)
        self.out_linear = nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, who="linear")
        B, N, _ = x.shape
        q, k, v = self.w_qkv(x).view(B, N, 3, self.heads, self.head_dim).unbind(2)  # (B, N, H, d) each
        keep = mask[:, :, None, None].to(x.dtype)
        q, k = F.elu(q) + 1, (F.elu(k) + 1) * keep  # padded keys contribute nothing
        kv = torch.einsum("bnhd,bnhe->bhde", k, torch.cat([v, torch.ones_like(v[..., :1])], -1))
        num = torch.einsum("bnhd,bhde->bnhe", q, kv)  # (B, N, H, d + 1): numerators and denominator
        out = num[..., :-1] / num[..., -1:]
        return self.zero_padding(self.out_linear(out.reshape(B, N, -1)), mask)


if __name__ == "__main__":
    # python examples/linear_attention.py: run as a script, the file has registered "linear" (as
    # "__main__"); a package model takes it by name. One forward pass of two clouds, the second
    # padded; padding must not change a real point's output (the contract's padding invariance).
    import pointformers
    from pointformers.bench.flops import attention_flops

    torch.manual_seed(0)
    model = pointformers.models.build("tracking-encoder", attention="linear", n_layers=2).eval()
    x, coords = torch.randn(2, 300, model.in_dim), torch.randn(2, 300, model.coord_dim)
    mask = torch.ones(2, 300, dtype=torch.bool)
    mask[1, 200:] = False  # the second cloud has 200 points
    with torch.no_grad():
        out = model(x, coords, mask)
        alone = model(x[1:, :200], coords[1:, :200])
    torch.testing.assert_close(out[1:, :200], alone, rtol=1e-5, atol=1e-5)
    assert bool((out[1, 200:] == 0).all())
    flops = attention_flops("linear", n=4096, dim=64, heads=4).total()
    print(f"tracking-encoder with attention='linear': out {tuple(out.shape)}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters; one layer on 4,096 points: {flops / 1e6:.0f} MFLOP")
