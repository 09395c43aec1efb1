"""HEPT: LSH-based efficient point transformer attention (Miao et al., ICML 2024).

Per head, the augmented vectors q̂ = [q̃ ‖ √(2ω)ρ], k̂ = [k̃ ‖ √(2ω)ρ] are hashed with a frozen
E2LSH projection without bucketisation (L = a·q̂, one per OR table). Each table's sort key is
T = L + Δ·c where c is the coordinate region code (the extra AND codes, see
:mod:`.hept_regions`) and Δ = max − min of L over the cloud's queries and keys. Queries and
keys are sorted separately by T, cut into blocks of ``block_size``, and each query block
attends to its key block with the RBF kernel; numerators and denominators are summed over
tables (:mod:`.block_attention`).

Randomness: the E2LSH projections ``alpha`` (H, d + c, T) and the region counts are drawn
once at init (seedable through ``generator`` or the global seed) and frozen; they are saved
in the state_dict. Nothing is resampled per forward, so train and eval hash identically.
Batching: each cloud is sorted within its own row, padded keys have kernel value 0, and each
cloud's regions are sized by its own point count, so no attention crosses clouds and a
cloud's output does not depend on its batch.
"""
from __future__ import annotations

import torch

from ..nn import allocator
from .base import is_tracing
from .block_attention import (DEFAULT_CHUNK_ELEMS, DEFAULT_GROUP_CHUNK, materialized_sorted_block_attention,
                              projected_sorted_block_attention, value_width)
from .flop_count import FlopCount, block_core, e2lsh_hash, projections
from .hept_regions import HEPTContext, HEPTRegions
from .kernel import KernelAttention, core_dtype, full_precision
from .registry import register
from .stable_sort import stable_argsort


def masked_range(lq: torch.Tensor, lk: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Δ = max − min of the base hashes over real queries ∪ keys. (B, T, H, Np) ×2 -> (B, T, H, 1)."""
    # no padded row: no masked copies of the hashes (eager CPU only: on a GPU the check waits for the device)
    if mask.device.type == "cpu" and not is_tracing() and bool(mask.all()):
        return (torch.maximum(lq.amax(-1), lk.amax(-1)) - torch.minimum(lq.amin(-1), lk.amin(-1))).unsqueeze(-1)
    m = mask[:, None, None, :]
    hi = torch.maximum(lq.masked_fill(~m, float("-inf")).amax(-1), lk.masked_fill(~m, float("-inf")).amax(-1))
    lo = torch.minimum(lq.masked_fill(~m, float("inf")).amin(-1), lk.masked_fill(~m, float("inf")).amin(-1))
    return (hi - lo).unsqueeze(-1)


def sort_keys(lq: torch.Tensor, lk: torch.Tensor, codes: torch.Tensor, mask: torch.Tensor):
    """HEPT's sort keys T = L + Δ·c of queries and keys, +inf at padded rows (sorted last).
    lq, lk (B, nh, T, Np) base hashes, codes (B, nh, T, Np) region codes, mask (B, Np) -> tq, tk."""
    delta = masked_range(lq, lk, mask)  # (B, nh, T, 1)
    offset = codes.to(lq.dtype) * delta
    if mask.device.type == "cpu" and not is_tracing() and bool(mask.all()):
        return lq + offset, lk + offset
    pad = ~mask[:, None, None, :]
    return (lq + offset).masked_fill_(pad, float("inf")), (lk + offset).masked_fill_(pad, float("inf"))


def authors_argsort(keys: torch.Tensor, ctx: HEPTContext) -> torch.Tensor:
    """Sort order of each cloud's keys by ``torch.argsort`` (PyTorch's default sort, as the authors'
    code), over the cloud's own ``ctx.lengths[b]`` rows only, so that ties break as in their code
    run on that cloud alone; rows past a cloud's length (padding, keys +inf) keep their places.
    (B, …, Np) -> (B, …, Np) int64 (each row sorted alone: the leading dims do not matter)."""
    B, Np = keys.shape[0], keys.shape[-1]
    if B == 1 and (ctx.lengths is None or int(ctx.lengths[0]) == Np):
        return torch.argsort(keys, dim=-1)
    if ctx.lengths is None:
        raise ValueError("authors_sort with several clouds needs the context's lengths")
    out = torch.arange(Np, device=keys.device).expand(keys.shape).clone()
    for b in range(B):
        n = int(ctx.lengths[b])
        out[b, ..., :n] = torch.argsort(keys[b, ..., :n], dim=-1)
    return out


def block_flops(m, n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """One layer of HEPT or ``lsh_or`` (see :mod:`.flop_count`): projections, E2LSH hashes (no
    gradient) and the block kernel, its value product at the padded width the kernel runs
    (:func:`.block_attention.value_width`)."""
    H, d, c = m.heads, m.head_dim, m.coord_dim
    f = FlopCount().add("projections", projections(n, dim, H, d))
    f.add("hash projections", H * e2lsh_hash(n, d + c, m.n_hashes, getattr(m, "n_and", 1)), grad=False)
    # the value rows [v, 1] at the width the fused kernel multiplies them (zero-padded to whole vectors)
    f.add("block attention", H * block_core(n, d, c, m.block_size, m.n_hashes, v_width=value_width(d + 1) - 1))
    return f


def shared_regions(dim: int, heads: int = 8, block_size: int = 100, n_hashes: int = 3, num_regions: float = 150,
                   generator: torch.Generator | None = None, **_options) -> HEPTRegions:
    """The region counts a HEPT model owns once for all its layers (the authors' layout), built
    from the layers' options."""
    return HEPTRegions(num_regions, n_hashes, heads, block_size, generator)


@register("hept", flops=block_flops, shared=shared_regions,
          bench={"coord_dim": 3, "block_size": 100, "n_hashes": 3, "num_regions": 150, "head_dim": 64},
          model_options=("head_dim", "coord_dim", "block_size", "n_hashes", "num_regions"))
class HEPTAttention(KernelAttention):
    """HEPT attention (OR & AND E2LSH with coordinate AND codes, block attention).

    Args:
        dim: model width D.
        heads: H (paper: 8).
        head_dim: per-head width d (default D // H as every mechanism; the paper's models: 24 with D = 24).
        coord_dim: kernel coordinates c in ``pos``; columns 0, 1 must be η and φ (the region
            hash axes). Tracking uses c = 6, pile-up c = 4.
        block_size: b (paper: 100).
        n_hashes: OR tables m₁ (paper: 3).
        num_regions: G, regions per table (paper: 150 for Tracking-60k).
        shared: the :class:`HEPTRegions` a model owns once for all its layers (the authors'
            layout; built by the registry's ``shared`` factory); None: the layer owns its own.
        own_regions: False for a layer that is given its regions later (:meth:`bind_shared`).
        chunk_elems: score entries per fused chunk (speed/memory knob, not semantics).
        all_heads: attend all heads at once (True) or one at a time (False); None (default):
            all at once off the CPU (see :func:`.block_attention.projected_sorted_block_attention`;
            a speed knob, not semantics).
        group_chunk: heads per block-attention chunk in export mode (a memory knob; None = all).
        implementation: ``"fused"`` (default: chunked blocks, recomputing backward,
            :func:`.block_attention.projected_sorted_block_attention`) or ``"materialized"``
            (every block's scores at once, as the authors' code: the reference path and the
            benchmark baseline). Same function; export mode uses its own static path.
        generator: optional torch.Generator for the frozen random draws.
    Shapes: x (B, N, D), pos (B, N, c), mask (B, N) -> (B, N, D).
    ``reset_parameters()`` re-initialises the learnable parameters (projections, ω) as the
    constructor does; buffers (frozen draws: ``alpha``, the region counts) are kept.
    """

    _repr_fields = ("coord_dim", "block_size", "n_hashes", "num_regions", "implementation")

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, coord_dim: int = 2,
                 block_size: int = 100, n_hashes: int = 3, num_regions: float = 150,
                 tie_first_two: bool = True, omega_init: float = 10.0, own_regions: bool = True,
                 chunk_elems: int = DEFAULT_CHUNK_ELEMS, generator: torch.Generator | None = None,
                 all_heads: bool | None = None, group_chunk: int | None = DEFAULT_GROUP_CHUNK,
                 shared: HEPTRegions | None = None, implementation: str = "fused", dropout: float = 0.0):
        if coord_dim < 2:
            raise ValueError(f"coord_dim must be >= 2 (η and φ drive HEPT's region hashing), got {coord_dim}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if not isinstance(n_hashes, int) or n_hashes < 1:
            raise ValueError(f"n_hashes must be a positive int, got {n_hashes!r}")
        super().__init__(dim, heads, head_dim, coord_dim, tie_first_two, omega_init, dropout=dropout)
        self.block_size = block_size
        self.n_hashes = n_hashes
        self.num_regions = num_regions
        self.chunk_elems = chunk_elems
        self.all_heads = all_heads
        self.group_chunk = group_chunk
        if implementation not in ("fused", "materialized"):
            raise ValueError(f"implementation must be 'fused' or 'materialized', got {implementation!r}")
        self.implementation = implementation
        alpha = torch.randn(heads, self.head_dim + coord_dim, n_hashes, generator=generator)
        self.register_buffer("alpha", alpha)
        own = own_regions and shared is None
        self.region_hash = HEPTRegions(num_regions, n_hashes, heads, block_size, generator) if own else None
        self._shared = None
        if shared is not None:
            self.bind_shared(shared)

    def bind_shared(self, regions: HEPTRegions) -> None:
        """Use ``regions``, owned by the model and shared by all its layers (not registered here,
        so the model's state_dict holds it once)."""
        if not isinstance(regions, HEPTRegions) or regions.regions.shape != (self.n_hashes, 2, self.heads):
            raise ValueError(f"bind_shared: expected HEPTRegions for ({self.n_hashes} tables, {self.heads} heads)")
        object.__setattr__(self, "_shared", regions)

    @property
    def regions_module(self) -> HEPTRegions:
        regions = self.region_hash if self.region_hash is not None else self._shared
        if regions is None:
            raise ValueError("this HEPTAttention has own_regions=False and no bound regions: build it inside a "
                             "model (which calls bind_shared) or pass own_regions=True")
        return regions

    def prepare_key(self):
        # the state depends only on the region counts, and on the layout: padded to blocks, or not in
        # export mode. Keyed by the regions module itself, so a model can put a state it prepared
        # (the authors' duplicate padding) under it.
        return (self.regions_module, "export") if self.exportable else self.regions_module

    #: Clouds packed end to end in one row stay apart: each cloud's region codes, hash range Δ and
    #: sorts are its own, and its segment is a whole number of blocks (see :meth:`sort_orders`).
    packs_clouds = True

    def flat_input_layout(self, n, batch, ptr, device):
        """Flat input is packed (:func:`~pointformers.data.batch.packed_layout`): each cloud padded
        to a multiple of ``block_size`` only, not to the largest cloud. Export mode: padded."""
        if self.exportable or is_tracing():
            return super().flat_input_layout(n, batch, ptr, device)
        from ..data.batch import packed_layout

        return packed_layout(n, batch, ptr, multiple=self.block_size, device=device)

    def prepare(self, pos: torch.Tensor, mask: torch.Tensor | None = None,
                segments: tuple[tuple[int, int], ...] | None = None) -> HEPTContext:
        """Region codes and padding layout for ``pos`` (B, N, c); shared by layers with the same regions.
        ``segments``: clouds packed in one row (B = 1), see :class:`~.base.ForwardContext`."""
        if mask is None:
            mask = torch.ones(pos.shape[:2], dtype=torch.bool, device=pos.device)
        if segments is not None and self.exportable:
            raise ValueError("context: packed clouds (segments) have no export-mode path; pad the clouds")
        return self.regions_module(pos, mask, pad=not self.exportable, segments=segments)

    def sort_orders(self, qa: torch.Tensor, ka: torch.Tensor, ctx: HEPTContext, heads: list[int]):
        """Per-table sort orders of the heads ``heads`` (nh of them) at once.

        q', k' rows (B·Np, nh, d+c+2) -> iq, ik (B, nh, T, Np) row numbers b·Np + i.
        """
        with torch.no_grad():
            B, Np = ctx.mask.shape
            alpha = self.alpha[heads].to(qa.dtype)  # (nh, d + c, T)
            D = alpha.shape[1]
            # E2LSH base hash (no bucketing) of q̂, k̂; alpha padded with zero rows for the two norm
            # columns so the GEMM reads the contiguous rows instead of a strided slice
            alpha = torch.cat([alpha, alpha.new_zeros(len(heads), qa.shape[-1] - D, alpha.shape[-1])], 1)
            nh = len(heads)
            if nh == 1:  # one head: αᵀ (T, ·) times the rows' transpose gives (T, rows), the order the sort reads,
                # from a GEMM that reads the rows once (several times faster than the (rows, T) product)
                at = alpha[0].T.contiguous()
                lq, lk = (torch.mm(at, r[:, 0].T).view(1, -1, B, Np).permute(2, 0, 1, 3) for r in (qa, ka))
            else:
                lq = torch.bmm(qa.transpose(0, 1), alpha).view(nh, B, Np, -1).permute(1, 0, 3, 2)  # (B, nh, T, Np)
                lk = torch.bmm(ka.transpose(0, 1), alpha).view(nh, B, Np, -1).permute(1, 0, 3, 2)
            codes = ctx.codes[:, :, heads].transpose(1, 2)  # (B, nh, T, Np)
            if ctx.segments is not None:  # packed clouds: each segment keyed and sorted alone, in place
                if ctx.authors_sort or B != 1:
                    raise ValueError("packed clouds (segments) need one row and the stable sort")
                parts = [sort_keys(lq[..., s:e], lk[..., s:e], codes[..., s:e], ctx.mask[:, s:e])
                         for s, e in ctx.segments]
                iq = torch.cat([stable_argsort(tq).add_(s) for (tq, _), (s, _) in zip(parts, ctx.segments)], -1)
                ik = torch.cat([stable_argsort(tk).add_(s) for (_, tk), (s, _) in zip(parts, ctx.segments)], -1)
                return iq, ik
            tq, tk = sort_keys(lq, lk, codes, ctx.mask)
            base = torch.arange(B, device=qa.device).view(B, 1, 1, 1) * Np
            if ctx.authors_sort and tq.dtype != torch.float32:  # float32: the stable sort (see HEPTContext)
                iq, ik = authors_argsort(tq, ctx), authors_argsort(tk, ctx)
            else:
                iq, ik = stable_argsort(tq), stable_argsort(tk)
        return iq.add_(base), ik.add_(base)

    def head_sort_orders(self, qa: torch.Tensor, ka: torch.Tensor, ctx: HEPTContext, h: int):
        """Head ``h``'s per-table sort orders. q', k' rows (B·Np, d+c+2) -> iq, ik (B, T, Np) row numbers b·Np + i."""
        iq, ik = self.sort_orders(qa[:, None], ka[:, None], ctx, [h])
        return iq[:, 0], ik[:, 0]

    def sort_indices(self, qa: torch.Tensor, ka: torch.Tensor, ctx: HEPTContext):
        """All heads' sort orders as row numbers into (B, Np, H) rows. q', k' (B, Np, H, d+c+2) -> 2 × (B·H, T, Np)."""
        B, Np, H, _ = qa.shape
        iq, ik = self.sort_orders(qa.reshape(B * Np, H, -1), ka.reshape(B * Np, H, -1), ctx, list(range(H)))
        # row of (cloud b, point i, head h) in the (B, Np, H) layout: (b·Np + i)·H + h
        heads = torch.arange(H, device=qa.device).view(1, H, 1, 1)
        return tuple((o * H + heads).reshape(B * H, -1, Np) for o in (iq, ik))

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        """x (B, N, D), pos (B, N, c), mask (B, N); ``context``: a :class:`~.base.ForwardContext`
        shared by the model's layers (or, as before, a prepared :class:`HEPTContext`)."""
        mask = self.check(x, pos, mask, "hept")
        ctx = context if isinstance(context, HEPTContext) else self.prepared(pos, mask, context)
        B, N, _ = x.shape
        if not is_tracing() and (ctx.n_points != N or ctx.mask.shape[0] != B
                                 or ctx.codes.shape[1:3] != (self.n_hashes, self.heads)):
            raise ValueError(f"context was prepared for {tuple(ctx.mask.shape[:1])} clouds × {ctx.n_points} points, "
                             f"{tuple(ctx.codes.shape[1:3])} (tables, heads); got x {tuple(x.shape)} and "
                             f"({self.n_hashes}, {self.heads})")
        if allocator.large_cpu_input(x):  # a no-op inside a model that already does so
            with allocator.keep_freed_memory():
                return self._forward_checked(x, pos, ctx)
        return self._forward_checked(x, pos, ctx)

    def _forward_checked(self, x: torch.Tensor, pos: torch.Tensor, ctx: HEPTContext) -> torch.Tensor:
        """The forward on checked inputs and their context."""
        B, N, _ = x.shape
        Np = ctx.n_padded
        if Np != N:
            x = torch.cat([x, x.new_zeros(B, Np - N, x.shape[-1])], 1)
            pos = torch.cat([pos, pos.new_zeros(B, Np - N, pos.shape[-1])], 1)
        H, d = self.heads, self.head_dim
        wdt = core_dtype(x.dtype)
        with full_precision(x):  # the block core in float32 under autocast / for half inputs (see core_dtype)
            xp, wq, wk, wv = self.projection_inputs(x.to(wdt), pos.to(wdt), ctx.mask)
            sort_heads = lambda qa, ka: self.sort_indices(qa.view(B, Np, H, -1), ka.view(B, Np, H, -1), ctx)  # noqa: E731
            if self.implementation == "materialized" and not self.exportable:
                o = materialized_sorted_block_attention(xp, wq, wk, wv, H, sort_heads, self.block_size)
            else:
                # the output projection inside when it runs in the core's dtype (no autocast, no cast back)
                fuse = x.dtype == wdt and not torch.is_autocast_enabled(x.device.type)
                o = projected_sorted_block_attention(
                    xp, wq, wk, wv, H, lambda qa, ka, h: self.head_sort_orders(qa, ka, ctx, h), self.block_size,
                    self.chunk_elems, sort_heads=sort_heads, all_heads=self.all_heads, static=self.exportable,
                    group_chunk=self.group_chunk,
                    out_proj=(self.out_linear.weight, self.out_linear.bias) if fuse else None)
                if fuse:
                    return self.zero_padding(o.view(B, Np, -1), ctx.mask)[:, :N]
        y = self.out_linear(o.view(B, Np, H * d).to(x.dtype))  # rows are (b, i, h): heads concatenated h-major
        return self.zero_padding(y, ctx.mask)[:, :N]
