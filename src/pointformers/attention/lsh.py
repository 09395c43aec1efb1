"""LSH attention without coordinate codes: the ablations of HEPT's Table 3.

The same kernel as HEPT (exp(−½‖q̂ − k̂‖²) on coordinate-augmented q/k) and the same
block computation, but the buckets come only from E2LSH hashes of the q̂/k̂ vectors:

* ``n_and = 1`` (default, registry key ``lsh_or``): OR-only LSH, Reformer/SMYRF-style — each
  of the m₁ tables sorts queries and keys by their own base hash a·q̂ / a·k̂.
* ``n_and = m₂ ≥ 2``: OR & AND without coordinates — m₂ − 1 further hashes per table are
  bucketed into equal-count buckets over the 2n query and key values (HEPT paper §4.2; the paper gives no more detail for its Table 3 variants without coordinates, so the aux codes are bucketed the same way),
  B_ij random with Π_j B_ij = G, and combined with the base hash as T = L + Δ·code.
* ``tied=True``: q = k (as in Reformer), which realigns query and key buckets (the * rows).

Without coordinates in the codes, separately sorted query and key blocks can come from
different regions — the misalignment HEPT's coordinate codes remove. The hash projections
and bucket counts are drawn at init, frozen and saved in the state_dict.
"""
from __future__ import annotations

import math

import torch

from .block_attention import DEFAULT_CHUNK_ELEMS, DEFAULT_GROUP_CHUNK, projected_sorted_block_attention
from .hept import block_flops, masked_range
from .kernel import KernelAttention, core_dtype, full_precision
from .registry import register
from .stable_sort import stable_argsort


def sample_bucket_counts(num_regions: float, n_tables: int, n_aux: int,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """(n_tables, n_aux) random bucket counts with Π_j B_ij ≈ G, each ≥ 1, rounded to 1/3."""
    if n_aux == 0:
        return torch.zeros(n_tables, 0)
    per = num_regions ** (1.0 / n_aux)
    lb, ub = 2.0, max(2.0, 2.0 * per - 2.0)
    b = lb + (ub - lb) * torch.rand(n_tables, n_aux, generator=generator)
    b = b * (num_regions / b.prod(-1, keepdim=True)) ** (1.0 / n_aux)
    return (torch.round(b * 3) / 3).clamp_min(1.0)


def _equal_count_buckets(values: torch.Tensor, valid: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Bucket index in 1..B by rank among the real values of each row.

    values: (R, M) with invalid entries anywhere; valid: (R, M); counts: (R,) float B.
    Each run of ceil(m / B) consecutive ranks (m = real values in the row) gets one bucket.
    Equal values share their lowest rank, so a tied query and key (q = k) share a bucket.
    """
    v = values.masked_fill(~valid, float("inf"))
    ranks = torch.searchsorted(v.sort(-1).values.contiguous(), v.contiguous())
    m = valid.sum(-1, keepdim=True).to(counts.dtype)
    size = torch.ceil(m / counts[:, None]).clamp_min(1).to(torch.int64)
    return torch.div(ranks, size, rounding_mode="floor") + 1


@register("lsh_or", flops=block_flops, bench={"coord_dim": 3, "block_size": 100, "n_hashes": 3, "head_dim": 64})
class LSHAttention(KernelAttention):
    """OR-only (or OR & AND) E2LSH block attention on the HEPT kernel, without coordinate codes.

    Args:
        dim, heads, head_dim, coord_dim, tie_first_two, omega_init: as :class:`KernelAttention`.
        block_size: b. n_hashes: OR tables m₁. n_and: hash functions per table m₂ (1 = OR-only).
        num_regions: G = Π_j B_ij for the aux codes (used when n_and ≥ 2).
        tied: share the query and key projection (q = k), as in Reformer.
        group_chunk: heads per block-attention chunk in export mode (a memory knob; None = all).
    Shapes: x (B, N, D), pos (B, N, c), mask (B, N) -> (B, N, D).
    ``reset_parameters()`` re-initialises the learnable parameters (projections, ω) as the
    constructor does; buffers (frozen draws: ``alpha``, ``bucket_counts``) are kept.
    """

    _repr_fields = ("coord_dim", "block_size", "n_hashes", "n_and", "num_regions", "tied")

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, coord_dim: int = 2,
                 block_size: int = 100, n_hashes: int = 3, n_and: int = 1, num_regions: float = 150,
                 tied: bool = False, tie_first_two: bool = True, omega_init: float = 10.0,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS, generator: torch.Generator | None = None,
                 group_chunk: int | None = DEFAULT_GROUP_CHUNK, dropout: float = 0.0):
        for name, val in (("block_size", block_size), ("n_hashes", n_hashes), ("n_and", n_and)):
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        super().__init__(dim, heads, head_dim, coord_dim, tie_first_two, omega_init, dropout=dropout)
        self.block_size, self.n_hashes, self.n_and, self.tied = block_size, n_hashes, n_and, bool(tied)
        self.num_regions = num_regions
        self.chunk_elems = chunk_elems
        self.group_chunk = group_chunk
        if self.tied:
            del self.w_k  # q = k: one projection
        D = self.head_dim + coord_dim
        self.register_buffer("alpha", torch.randn(heads, D, n_hashes, n_and, generator=generator))
        self.register_buffer("bucket_counts", sample_bucket_counts(num_regions, n_hashes, n_and - 1, generator))

    def augmented_qkv(self, x, pos, mask):
        if not self.tied:
            return super().augmented_qkv(x, pos, mask)
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        q = self.w_q(x).view(B, N, H, d)
        v = self.w_v(x).view(B, N, H, d)
        rho = (2.0 * self.omega()).sqrt().to(x.dtype) * pos.to(x.dtype).unsqueeze(2)
        keep = mask[:, :, None, None]
        q = torch.cat([q, rho], -1).masked_fill(~keep, 0.0).transpose(1, 2)
        return q, q, v.masked_fill(~keep, 0.0).transpose(1, 2)

    def key_projection(self) -> torch.nn.Linear:
        return self.w_q if self.tied else self.w_k

    def sort_keys(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor):
        """Sort keys T (B, T, H, Np) for queries and keys. q, k (B, H, Np, D)."""
        with torch.no_grad():
            alpha = self.alpha.to(q.dtype)
            lq = torch.einsum("bhnd,hdtj->bthjn", q, alpha)  # (B, T, H, m2, Np)
            lk = torch.einsum("bhnd,hdtj->bthjn", k, alpha)
            return self._sort_keys_from_hashes(lq, lk, mask)

    def head_sort_orders(self, qa: torch.Tensor, ka: torch.Tensor, mask: torch.Tensor, h: int):
        """Head ``h``'s per-table sort orders. q', k' rows (B·Np, ≥ d+c) whose first d + c columns
        are q̂, k̂ -> iq, ik (B, T, Np) row numbers b·Np + i (same keys as :meth:`sort_keys`)."""
        with torch.no_grad():
            B, Np = mask.shape
            a = self.alpha[h].to(qa.dtype)  # (d + c, T, m2)
            D, T, m2 = a.shape
            # zero rows for the extra columns of q', k': the GEMM reads whole contiguous rows
            a = torch.cat([a.reshape(D, T * m2), a.new_zeros(qa.shape[1] - D, T * m2)])
            lq = (qa @ a).view(B, Np, T, 1, m2).permute(0, 2, 3, 4, 1)  # (B, T, 1, m2, Np)
            lk = (ka @ a).view(B, Np, T, 1, m2).permute(0, 2, 3, 4, 1)
            tq, tk = self._sort_keys_from_hashes(lq, lk, mask)
            base = torch.arange(B, device=qa.device).view(B, 1, 1) * Np
            return stable_argsort(tq[:, :, 0].contiguous()).add_(base), stable_argsort(tk[:, :, 0].contiguous()).add_(base)

    def _sort_keys_from_hashes(self, lq: torch.Tensor, lk: torch.Tensor, mask: torch.Tensor):
        """E2LSH projections (B, T, H, m2, Np) of queries and keys -> sort keys (B, T, H, Np)."""
        tq, tk = lq[..., 0, :], lk[..., 0, :]
        if self.n_and > 1:
            B, T, H, m2, Np = lq.shape
            both = torch.cat([lq[..., 1:, :], lk[..., 1:, :]], -1)  # (B, T, H, m2−1, 2Np)
            valid = torch.cat([mask, mask], -1)[:, None, None, None, :].expand_as(both)
            counts = self.bucket_counts.to(both.dtype)[None, :, None, :].expand(B, T, H, m2 - 1)
            r = _equal_count_buckets(both.reshape(-1, 2 * Np), valid.reshape(-1, 2 * Np),
                                     counts.reshape(-1)).view(B, T, H, m2 - 1, 2 * Np)
            radix = torch.cumprod(torch.cat([torch.ones_like(self.bucket_counts[:, :1]),
                                             torch.ceil(self.bucket_counts[:, :-1])], 1), 1)  # (T, m2−1)
            code = ((r - 1).to(lq.dtype) * radix.to(lq.dtype)[None, :, None, :, None]).sum(3)  # (B, T, H, 2Np)
            delta = masked_range(tq, tk, mask)
            tq = tq + delta * code[..., :Np]
            tk = tk + delta * code[..., Np:]
        pad = ~mask[:, None, None, :]
        return tq.masked_fill(pad, float("inf")), tk.masked_fill(pad, float("inf"))

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        mask = self.check(x, pos, mask, "lsh_or")
        B, N, _ = x.shape
        b = self.block_size
        # export mode cuts blocks by index arithmetic: no padding to a multiple of b
        Np = N if self.exportable else -(-N // b) * b
        if Np != N:
            x = torch.cat([x, x.new_zeros(B, Np - N, x.shape[-1])], 1)
            pos = torch.cat([pos, pos.new_zeros(B, Np - N, pos.shape[-1])], 1)
            mask = torch.cat([mask, mask.new_zeros(B, Np - N)], 1)
        # one head at a time from the narrow input, as HEPT (see KernelAttention.projection_inputs)
        H, d = self.heads, self.head_dim
        wdt = core_dtype(x.dtype)
        with full_precision(x):  # the block core in float32 under autocast / for half inputs (see core_dtype)
            xp, wq, wk, wv = self.projection_inputs(x.to(wdt), pos.to(wdt), mask)
            o = projected_sorted_block_attention(xp, wq, wk, wv, H,
                                                 lambda qa, ka, h: self.head_sort_orders(qa, ka, mask, h), b,
                                                 self.chunk_elems, static=self.exportable, group_chunk=self.group_chunk)
        y = self.out_linear(o.view(B, Np, H * d).to(x.dtype))  # rows are (b, i, h): heads concatenated h-major
        return self.zero_padding(y, mask)[:, :N]

    def export_refusal(self) -> str | None:
        if self.n_and > 1:
            return (f"n_and={self.n_and} buckets its AND hashes with torch.searchsorted, which has no ONNX "
                    "translation; n_and=1 (OR-only) exports")
        return None
