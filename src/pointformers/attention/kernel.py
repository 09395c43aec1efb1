"""Dense HEPT kernel attention: the exact target that HEPT approximates.

k(q_u, k_v) = exp(−½‖q̂_u − k̂_v‖²) with q̂ = [q̃ ‖ √(2ω)ρ], k̂ = [k̃ ‖ √(2ω)ρ]
(HEPT paper §4.1), row-normalised: y_u = Σ_v k(q_u, k_v) v_v / (Σ_v k(q_u, k_v) + ε).
There is no 1/√d temperature and no softmax log-sum-exp, as in the paper and its code.
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from .base import TokenMixer, check_attention_inputs
from .flop_count import FlopCount, dense_core, projections
from .registry import register

#: The per-table denominator guard of the authors' code.
DENOM_EPS = 1e-20


def core_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the RBF kernel family (kernel, HEPT, ``lsh_or``) computes its scores in: float32
    for float16 / bfloat16 inputs. Its logits −½‖q̂ − k̂‖² are differences of large terms (ω of a
    trained model reaches 1e7), its weights exp(−87 … 0) underflow float16 (a row of far keys then
    divides 0 by 0), so low precision would change the function, not just round it."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def full_precision(x: torch.Tensor):
    """A context that switches autocast off for the kernel core (a no-op when it is off)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def rbf_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """−½‖q − k‖² for all pairs, clamped at 0 as the authors' code does. (…, n, D), (…, m, D) -> (…, n, m)."""
    qk = q @ k.transpose(-1, -2)
    return (qk - 0.5 * q.pow(2).sum(-1, keepdim=True) - 0.5 * k.pow(2).sum(-1).unsqueeze(-2)).clamp_max(0.0)


def _kernel_flops(m, n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    f = FlopCount().add("projections", projections(n, dim, m.heads, m.head_dim))
    return f.add("attention", m.heads * dense_core(n, m.head_dim + m.coord_dim + 2, m.head_dim))


@register("kernel", flops=_kernel_flops, bench={"coord_dim": 3, "head_dim": 64})
class KernelAttention(TokenMixer):
    """Dense (quadratic) row-normalised RBF attention on coordinate-augmented queries and keys.

    Args:
        dim: model width D.
        heads: heads H.
        head_dim: per-head width d (default D // H, or D when H does not divide D, as every mechanism;
            HEPT's published models set 24 with D = 24).
        coord_dim: number c of kernel coordinates in ``pos`` (B, N, c).
        tie_first_two: η and φ (columns 0, 1) share one ω, as in the authors' code
            ("they are used to calc dR").
        omega_init: initial ω (≈ 10 under the authors' parameterisation at default init).
        query_chunk: queries per chunk (memory O(chunk · N)); export mode takes all at once.
    ω is positive, per head and per coordinate: ω = exp(θ), θ ∈ ℝ^{H × c'} learnable.
    Shapes: x (B, N, D), pos (B, N, c), mask (B, N) -> (B, N, D).
    """

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, coord_dim: int = 2,
                 tie_first_two: bool = True, omega_init: float = 10.0, query_chunk: int = 1024, dropout: float = 0.0):
        super().__init__(dim, heads, dropout)
        if not isinstance(query_chunk, int) or query_chunk < 1:
            raise ValueError(f"query_chunk must be a positive int, got {query_chunk!r}")
        self.query_chunk = query_chunk
        if not isinstance(coord_dim, int) or coord_dim < 1:
            raise ValueError(f"coord_dim must be a positive int, got {coord_dim!r}")
        if omega_init <= 0:
            raise ValueError(f"omega_init must be > 0, got {omega_init}")
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        self.coord_dim = coord_dim
        self.omega_init = float(omega_init)
        self.tie_first_two = bool(tie_first_two and coord_dim >= 2)
        inner = heads * self.head_dim
        self._init_projections(inner)
        n_omega = coord_dim - 1 if self.tie_first_two else coord_dim
        self.log_omega = nn.Parameter(torch.full((heads, n_omega), math.log(omega_init)))

    _repr_fields = ("coord_dim", "tie_first_two", "omega_init")

    @torch.no_grad()
    def _reset_own_parameters(self) -> None:
        """log ω back to log(``omega_init``) for every head and coordinate (as at construction)."""
        self.log_omega.fill_(math.log(self.omega_init))

    def omega(self) -> torch.Tensor:
        """Positive ω per head and coordinate, (H, c); float32 for a float16/bfloat16 module (ω
        overflows float16)."""
        w = self.log_omega.to(core_dtype(self.log_omega.dtype)).exp()
        if self.tie_first_two:
            w = torch.cat([w[:, :1], w], dim=1)
        return w

    def augmented_qkv(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor):
        """q̂, k̂ (B, H, N, d + c) and v (B, H, N, d), zero at padded points."""
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        q = self.w_q(x).view(B, N, H, d)
        k = self.w_k(x).view(B, N, H, d)
        v = self.w_v(x).view(B, N, H, d)
        rho = (2.0 * self.omega()).sqrt().to(x.dtype) * pos.to(x.dtype).unsqueeze(2)  # (B, N, H, c)
        keep = mask[:, :, None, None]
        q = torch.cat([q, rho], -1).masked_fill(~keep, 0.0).transpose(1, 2)
        k = torch.cat([k, rho], -1).masked_fill(~keep, 0.0).transpose(1, 2)
        v = v.masked_fill(~keep, 0.0).transpose(1, 2)
        return q, k, v

    def key_projection(self) -> nn.Linear:
        """The key projection (``lsh_or`` with ``tied=True`` returns the query projection)."""
        return self.w_k

    def projection_inputs(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor):
        """Narrow input xp = [x ‖ ρ ‖ 1 ‖ 0…] (B·Np, D + c + 1 rounded up to a multiple of 8), zero at
        padded points, and the block
        weights wq, wk (H·(d+c+2), ·), wv (H·(d+1), ·) whose products are, per point and head,
        q' = [q̂, ·, 1], k' = [k̂, 1, ·] with q̂ = [q̃ ‖ √(2ω)ρ], and v' = [v, 1]
        (see :func:`.block_attention.projected_sorted_block_attention`): the wide rows are never
        kept for the backward pass, only xp and the small weights. Shared by HEPT and ``lsh_or``.
        """
        B, Np, _ = x.shape
        H, d, c = self.heads, self.head_dim, self.coord_dim
        keep = mask[..., None].to(x.dtype)
        # zero columns pad the width to a multiple of 8: the per-head GEMMs xp @ wᵀ run twice as
        # fast with K = 32 as with K = 31 (HEPT's D + c + 1 for D = 24, c = 6)
        pad = -(self.dim + c + 1) % 8
        real = mask[..., None]
        # masked_fill, not a product with the mask: a NaN or inf in a padded row (which may hold
        # anything) times 0 is NaN and would reach every real point through the sums
        xp = torch.cat([x.masked_fill(~real, 0.0), pos.to(x.dtype).masked_fill(~real, 0.0), keep,
                        x.new_zeros(B, Np, pad)], -1)  # (B, Np, Din)
        Din = xp.shape[-1]
        scale = torch.diag_embed((2.0 * self.omega()).sqrt().to(x.dtype))  # (H, c, c)
        one_row = x.new_zeros(H, 1, Din)
        one_row[..., self.dim + c] = 1.0  # picks the `keep` column
        zero_row = x.new_zeros(H, 1, Din)

        def projection(w: torch.Tensor) -> torch.Tensor:  # (H·d, D) -> (H, d, Din)
            return torch.cat([w.to(x.dtype).view(H, d, -1), x.new_zeros(H, d, c + 1 + pad)], -1)

        coords = torch.cat([x.new_zeros(H, c, self.dim), scale, x.new_zeros(H, c, 1 + pad)], -1)  # (H, c, Din)
        wq = torch.cat([projection(self.w_q.weight), coords, zero_row, one_row], 1).reshape(-1, Din)
        wk = torch.cat([projection(self.key_projection().weight), coords, one_row, zero_row], 1).reshape(-1, Din)
        wv = torch.cat([projection(self.w_v.weight), one_row], 1).reshape(-1, Din)
        return xp.reshape(B * Np, Din), wq, wk, wv

    def check(self, x, pos, mask, who: str):
        return check_attention_inputs(x, pos, mask, dim=self.dim, pos_dim=self.coord_dim,
                                      requires_pos=True, who=who)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        mask = self.check(x, pos, mask, "kernel")
        wdt = core_dtype(x.dtype)
        with full_precision(x):  # scores in float32 under autocast / for half inputs (see core_dtype)
            q, k, v = (t.to(wdt) for t in self.augmented_qkv(x, pos, mask))
            key_ok = mask[:, None, None, :]
            outs = []
            # chunk queries (memory O(chunk · N)); export mode: one chunk (a loop over N-dependent chunks
            # cannot be traced for a dynamic N)
            for qs in ([q] if self.exportable else q.split(self.query_chunk, dim=2)):
                a = rbf_logits(qs, k).exp().masked_fill(~key_ok, 0.0)
                outs.append((a @ v) / (a.sum(-1, keepdim=True) + DENOM_EPS))
            o = torch.cat(outs, 2).to(x.dtype)
        return self.merge_heads(o, mask)
