"""Coordinate-LSH softmax attention: HEPT's block layout hashed on the detector coordinates alone.

The encoder attention of the HEPT authors' track-reconstruction follow-up (issue 24 states the
design; this is our own code). Against HEPT (:mod:`.hept`) three things change:

* **Hashing on (η, φ) only, one order per head.** For each hash round t and head h the cloud is
  cut into B_η × B_φ ≈ G equal-population (η, φ) tiles (HEPT's region counts, drawn once and
  frozen: :func:`.hept_regions.sample_region_counts`), and inside a tile the points are ordered
  along a random direction u_th of the (η, φ) plane. Sort key T = u·(η, φ) + Δ·c with c the tile
  code and Δ the range of u·(η, φ) over the cloud (HEPT's :func:`.hept.sort_keys`). The key
  depends on the coordinates only, so queries and keys share one order: a query's block always
  holds its own key, and the orders are computed once per forward pass (:meth:`prepare`).
* **Softmax inside each block.** The sorted points are cut into blocks of ``block_size``; each
  query attends to the keys of its block with softmax(q·kᵀ/√d).
* **Rounds merged through their log-sum-exp.** Round t gives each query an output o_t and the
  log of its softmax normaliser ℓ_t; the result is Σ_t softmax_t(ℓ)·o_t — softmax over the union
  of the rounds' key sets, a key met in two rounds counted twice (as HEPT sums its tables).
* **QK-norm** (``qk_norm=True``): q and k are RMS-normalised per head (one learned gain of width
  d each) before the product, which bounds the logits.

Batching: each cloud's tiles are sized by its own point count and its hash range is its own;
padded rows sort last and are never a key, so a cloud's output does not depend on its batch.
Export mode: the same blocks by index arithmetic (N // b + 2 blocks per round and head, the
last all empty, all at once: no Python loop over N). On the CPU, training and inference run the
blocks through PyTorch's fused attention kernel (:class:`_FusedRounds`, :func:`block_softmax_inference`);
elsewhere, and under ``sdpa_kernel(SDPBackend.MATH)``, the scores are written out.

Shapes: x (B, N, D), pos (B, N, c) with η, φ in columns 0, 1, mask (B, N) -> (B, N, D).
"""
from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from ..nn.norms import RMSNorm
from .base import TokenMixer, check_attention_inputs, is_tracing
from .flop_count import FlopCount, dense_core, padded, projections
from .hept import sort_keys
from .hept_regions import region_codes, sample_region_counts
from .kernel import core_dtype, full_precision
from .registry import register
from .stable_sort import stable_argsort

#: Score entries per chunk of blocks in the eager path (16 MB of float32 scores).
DEFAULT_CHUNK_ELEMS = 1 << 22

#: Largest score count a training forward keeps for the backward pass; above it each chunk is
#: recomputed in the backward pass (activation checkpointing) instead.
STORE_SCORES_MAX = 1 << 25


def coord_lsh_flops(m: "CoordLSHAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """Projections and, per head and round, softmax attention inside blocks of b over n padded to whole blocks."""
    H, d, T, b = m.heads, m.head_dim, m.n_hashes, m.block_size
    f = FlopCount().add("projections", projections(n, dim, H, d))
    return f.add("block attention", H * T * dense_core(padded(n, b), d, d, keys=b))


def block_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_ok: torch.Tensor, scale: float):
    """Softmax attention inside each block, with the log of each query's normaliser.

    q, k, v (c, b, d) rows of c blocks, key_ok (c, b) bool -> o (c, b, d), lse (c, b). A block without
    keys gives o = 0 and a very negative lse (its rows are padding and are dropped)."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(~key_ok[:, None, :], torch.finfo(s.dtype).min)
    lse = torch.logsumexp(s, -1)
    o = torch.matmul(torch.exp(s - lse[..., None]), v)
    return o, lse


#: PyTorch's fused CPU attention kernel that also returns each query's log-sum-exp (torch 2.13's
#: ``aten._scaled_dot_product_flash_attention_for_cpu``; None where a build lacks it).
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _flash_cpu_block_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_ok: torch.Tensor,
                             scale: float, mask: torch.Tensor | None):
    """:func:`block_softmax` by the fused CPU kernel (blocked, online softmax: the (c, b, b) scores are
    never written out), each block one batch entry; ``mask`` = :func:`_key_mask` of ``key_ok`` (a keyless
    block: o = 0 from the kernel). Its log-sum-exp output carries no gradient (:class:`_FusedRounds` supplies
    the backward)."""
    o, lse = _FLASH_CPU(q[:, None], k[:, None], v[:, None], 0.0, False, attn_mask=mask, scale=scale)
    o, lse = o[:, 0], lse[:, 0]
    if mask is not None:
        lse = lse.masked_fill(~key_ok.any(-1)[:, None], torch.finfo(lse.dtype).min)
    return o, lse


_FLASH_CPU_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def _flash_cpu_ok(t: torch.Tensor) -> bool:
    """Whether the fused CPU kernel takes ``t``: on the CPU, float32/64 or bfloat16, where
    F.scaled_dot_product_attention would take it (the flash backend on: a ``sdpa_kernel(SDPBackend.MATH)``
    context turns it off, here too)."""
    return (_FLASH_CPU is not None and t.device.type == "cpu" and torch.backends.cuda.flash_sdp_enabled()
            and t.dtype in (torch.float32, torch.float64, torch.bfloat16))


def _key_mask(key_ok: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """(c, b) bool -> the kernel's additive mask (c, 1, 1, b) (−inf on empty slots), None when all are keys."""
    if bool(key_ok.all()):
        return None
    return torch.zeros(key_ok.shape, dtype=dtype, device=key_ok.device).masked_fill_(~key_ok, float("-inf"))[:, None, None]


class _FusedRounds(torch.autograd.Function):
    """Every round's block softmax by the fused CPU kernel, merged through the rounds' log-sum-exp, with
    exact gradients.

    The merged output is softmax attention over the union of a query's key sets (one per round), so its
    gradient is what the kernel's own backward computes for each block when it is given, for every query
    row, the *merged* output and the *merged* log-sum-exp (its P = exp(s − LSE) is then the query's
    weight in the union, and its D = rowsum(dO ⊙ O) the union's): no (c, b, b) score tensor is kept or
    recomputed by autograd.

    qb, kb, vb (c, b, d) the blocks' rows, key_ok (c, b), point_slot (B, T, H, N) -> (B, H, N, d).
    """

    @staticmethod
    def forward(ctx, qb, kb, vb, key_ok, point_slot, scale):
        mask = _key_mask(key_ok, qb.dtype)
        o, lse = _flash_cpu_block_softmax(qb, kb, vb, key_ok, scale, mask)   # a keyless block's rounds weigh 0
        lg = lse.flatten()[point_slot]                               # (B, T, H, N)
        top = torch.logsumexp(lg, dim=1)                             # (B, H, N): the union's log-normaliser
        out = (torch.exp(lg - top[:, None])[..., None] * o.flatten(0, 1)[point_slot]).sum(1)
        ctx.save_for_backward(qb, kb, vb, mask if mask is not None else qb.new_zeros(0), out, top, point_slot)
        ctx.scale, ctx.has_mask = scale, mask is not None
        return out

    @staticmethod
    def backward(ctx, dout):
        qb, kb, vb, mask, out, top, point_slot = ctx.saved_tensors
        c, b, d = qb.shape
        slot = point_slot.flatten()

        def rows(x: torch.Tensor, width: int) -> torch.Tensor:   # (B, H, N[, d]) -> every slot's point's value
            x = x.unsqueeze(1).expand(point_slot.shape + ((width,) if width else ()))
            flat = x.new_zeros((c * b, width) if width else (c * b,))
            return flat.index_put_((slot,), x.reshape((-1, width) if width else (-1,)))

        dq, dk, dv = _FLASH_CPU_BACKWARD(rows(dout.to(qb.dtype), d).view(c, 1, b, d), qb[:, None], kb[:, None],
                                         vb[:, None], rows(out, d).view(c, 1, b, d),
                                         rows(top, 0).view(c, 1, b), 0.0, False,
                                         attn_mask=mask if ctx.has_mask else None, scale=ctx.scale)
        return dq[:, 0], dk[:, 0], dv[:, 0], None, None, None


def block_softmax_inference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_ok: torch.Tensor,
                            scale: float):
    """:func:`block_softmax` without autograd. On the CPU (float32/64, bfloat16) by PyTorch's fused
    attention kernel, unless the flash backend of scaled-dot-product attention is switched off;
    elsewhere the (c, b, b) scores live in one buffer, masked, shifted by their row maximum and
    exponentiated in place, and the outputs are normalised after the product with v (c·b·d
    divisions instead of c·b·b). Same results up to float rounding."""
    if _flash_cpu_ok(q):
        return _flash_cpu_block_softmax(q, k, v, key_ok, scale, _key_mask(key_ok, q.dtype))
    s = torch.matmul(q * scale, k.transpose(-1, -2))
    # most chunks have no empty slot; on the CPU, where looking costs no device sync, skip their mask pass
    if s.device.type != "cpu" or not bool(key_ok.all()):
        s.masked_fill_(~key_ok[:, None, :], torch.finfo(s.dtype).min)
    top = s.amax(-1, keepdim=True)
    s.sub_(top).exp_()
    z = s.sum(-1)                                     # >= 1: the row maximum contributes exp(0)
    o = torch.matmul(s, v).div_(z[..., None])
    o.masked_fill_(~key_ok.any(-1)[:, None, None], 0.0)   # a block without keys: o = 0, as documented
    return o, top.squeeze(-1) + z.log()


@register("coord_lsh", flops=coord_lsh_flops,
          bench={"coord_dim": 3, "block_size": 1024, "n_hashes": 3, "num_regions": 100, "head_dim": 16},
          model_options=("head_dim", "coord_dim", "block_size", "n_hashes", "num_regions"))
class CoordLSHAttention(TokenMixer):
    """Softmax attention in blocks of points hashed on (η, φ), hash rounds merged by log-sum-exp.

    Args:
        dim: model width D.
        heads: H (published encoder: 8).
        head_dim: per-head width d (default D // H).
        coord_dim: columns c of ``pos``; columns 0, 1 must be η and φ (the only ones hashed).
        block_size: b, points per block (published: 1024).
        n_hashes: hash rounds T, merged through their log-sum-exp.
        num_regions: G, equal-population (η, φ) tiles per round and head (published: about 100).
        qk_norm: RMS-normalise q and k per head before the product (published: yes).
        bias: whether the q/k/v projections carry a bias (the output projection always does).
        chunk_elems: score entries per chunk of blocks (a speed/memory knob, not semantics).
        generator: optional torch.Generator for the frozen draws (tile counts, directions).
        dropout: on the output (training only).
    Shapes: x (B, N, D), pos (B, N, c), mask (B, N) -> (B, N, D), padded rows zero.
    The tile counts ``regions`` (T, 2, H) and directions ``directions`` (T, H, 2) are buffers
    (saved in the state_dict, kept by ``reset_parameters()``).
    """

    _repr_fields = ("coord_dim", "block_size", "n_hashes", "num_regions", "qk_norm")

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, coord_dim: int = 2,
                 block_size: int = 1024, n_hashes: int = 3, num_regions: float = 100, qk_norm: bool = True,
                 bias: bool = False, chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                 generator: torch.Generator | None = None, dropout: float = 0.0):
        super().__init__(dim, heads, dropout)
        if not isinstance(coord_dim, int) or coord_dim < 2:
            raise ValueError(f"coord_dim must be an int >= 2 (η and φ are hashed), got {coord_dim!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if not isinstance(n_hashes, int) or n_hashes < 1:
            raise ValueError(f"n_hashes must be a positive int, got {n_hashes!r}")
        if not isinstance(chunk_elems, int) or chunk_elems < 1:
            raise ValueError(f"chunk_elems must be a positive int, got {chunk_elems!r}")
        if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 1):
            raise ValueError(f"head_dim must be a positive int or None, got {head_dim!r}")
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        self.coord_dim, self.block_size, self.n_hashes = coord_dim, block_size, n_hashes
        self.num_regions, self.qk_norm, self.chunk_elems = num_regions, bool(qk_norm), chunk_elems
        self.scale = self.head_dim ** -0.5
        self._init_projections(heads * self.head_dim, bias)
        self.q_norm = RMSNorm(self.head_dim) if self.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim) if self.qk_norm else None
        self.register_buffer("regions", sample_region_counts(num_regions, n_hashes, heads, generator))
        angle = 2 * math.pi * torch.rand(n_hashes, heads, generator=generator)
        self.register_buffer("directions", torch.stack([angle.cos(), angle.sin()], -1))

    # ------------------------------------------------------------------ shared work
    def prepare(self, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each (round, head)'s order of the cloud's points, shared by queries and keys:
        pos (B, N, c), mask (B, N) -> (B, T, H, N) int64, real points first."""
        with torch.no_grad():
            # in at least float32: a half-precision key would tie points that the coordinates tell apart
            eta, phi = (pos[..., i].to(torch.promote_types(pos.dtype, torch.float32)) for i in (0, 1))
            codes = region_codes(eta, phi, mask, self.regions)  # (B, T, H, N)
            u = self.directions.to(eta.dtype)  # (T, H, 2)
            proj = eta[:, None, None, :] * u[..., 0, None] + phi[:, None, None, :] * u[..., 1, None]
            keys, _ = sort_keys(proj, proj, codes, mask)  # padded rows +inf: sorted last
            return stable_argsort(keys)

    def prepare_key(self):
        return ("coord_lsh", id(self))

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        """x (B, N, D), pos (B, N, c), mask (B, N) -> (B, N, D)."""
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, pos_dim=self.coord_dim, requires_pos=True,
                                      who="coord_lsh")
        order = self.prepared(pos, mask, context)
        if not is_tracing() and tuple(order.shape) != (x.shape[0], self.n_hashes, self.heads, x.shape[1]):
            raise ValueError(f"coord_lsh: the context's orders are for {tuple(order.shape)} (B, T, H, N), got x "
                             f"{tuple(x.shape)} with ({self.n_hashes}, {self.heads}) rounds and heads")
        x = x.masked_fill(~mask[..., None], 0.0)  # padding may hold anything; keep it out of gradients
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        wdt = core_dtype(x.dtype)
        with full_precision(x):
            o = self._attend(*self._qkv(x, wdt), order, mask)  # (B, N, H, d)
        return self.zero_padding(self.out_linear(o.reshape(B, N, H * d).to(x.dtype)), mask)

    def _qkv(self, x: torch.Tensor, dtype: torch.dtype):
        """q, k (QK-normed when ``qk_norm``), v of x (B, N, D) in ``dtype``: 3 × (B, N, H, d)."""
        B, N, _ = x.shape
        q, k, v = (w(x).to(dtype).view(B, N, self.heads, self.head_dim) for w in (self.w_q, self.w_k, self.w_v))
        return (self.q_norm(q), self.k_norm(k), v) if self.qk_norm else (q, k, v)

    def _slots(self, order: torch.Tensor, mask: torch.Tensor, static: bool):
        """The block layout. order (B, T, H, N), mask (B, N) -> src (G·P, b) row of every slot in the
        flat head-major (B·H·N + 1) head-point table (B·H·N: empty slot), point_slot (B, T, H, N) the slot of
        every point, and P, the blocks per group (G = B·T·H groups: cloud × round × head)."""
        B, T, H, N = order.shape
        S, dev = self.block_size, order.device
        dummy = B * N * H
        j = torch.arange(N, device=dev)
        # head-major table rows ((b·H + h)·N + point): one (round, head) group's gathers stay inside its
        # head's N rows, a region that stays in the CPU's cache, not strided over all heads' rows
        rows = ((torch.arange(B, device=dev).view(B, 1, 1, 1) * H + torch.arange(H, device=dev).view(1, 1, H, 1)) * N
                + order)
        rows = rows.masked_fill(j >= mask.sum(1).view(B, 1, 1, 1), dummy)  # sorted position past the cloud's points
        rows = torch.cat([rows, torch.full((B, T, H, 2 * S), dummy, dtype=torch.int64, device=dev)], -1)
        # export: N // b + 2 blocks by index arithmetic (P >= 2: the exporter needs no size-1 case of the
        # flatten below); eager: exactly the blocks that hold points
        P = N // S + 2 if static else -(-N // S)
        blk = (torch.arange(P, device=dev) * S).unsqueeze(-1) + torch.arange(S, device=dev)  # (P, S)
        src = rows[..., blk].flatten(0, 3)  # (G·P, S); flatten, not a view with a symbolic size to prove
        rank = torch.empty_like(order).scatter(-1, order, j.expand_as(order))  # sorted position of every point
        groups = torch.arange(B * T * H, device=dev).view(B, T, H, 1)
        return src, groups * (P * S) + rank, P

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """q, k, v (B, N, H, d), order (B, T, H, N), mask (B, N) -> (B, N, H, d): every round's
        block softmax, merged through the rounds' log-sum-exp."""
        B, N, H, d = q.shape
        T, S = self.n_hashes, self.block_size
        static = self.exportable or is_tracing()
        src, point_slot, P = self._slots(order, mask, static)
        dummy = B * N * H

        def table(t):  # (B, N, H, d) -> (B·H·N + 1, d) head-major, the last row zero (empty slots)
            if static:
                return torch.cat([t.permute(0, 2, 1, 3).reshape(B * H * N, d), t.new_zeros(1, d)])
            out = t.new_empty(B * H * N + 1, d)   # one copy pass (permute and cat would be two)
            out[:-1].view(B, H, N, d).copy_(t.permute(0, 2, 1, 3))
            out[-1] = 0
            return out

        qt, kt, vt = table(q), table(k), table(v)
        if (not static and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
                and _FLASH_CPU_BACKWARD is not None
                and _flash_cpu_ok(q)):
            # training on the CPU: the fused kernel forward and backward, no score tensor stored or recomputed
            idx = src.reshape(-1)
            blocks = [t.index_select(0, idx).view(*src.shape, d) for t in (qt, kt, vt)]
            return _FusedRounds.apply(*blocks, src != dummy, point_slot, self.scale).permute(0, 2, 1, 3)
        if static:
            o, lse = block_softmax(qt[src], kt[src], vt[src], src != dummy, self.scale)
        else:
            chunk = max(1, self.chunk_elems // (S * S))
            recompute = torch.is_grad_enabled() and q.requires_grad and src.shape[0] * S * S > STORE_SCORES_MAX
            parts = []
            for s in range(0, src.shape[0], chunk):
                idx = src[s:s + chunk]
                args = (qt.index_select(0, idx.reshape(-1)).view(*idx.shape, d),
                        kt.index_select(0, idx.reshape(-1)).view(*idx.shape, d),
                        vt.index_select(0, idx.reshape(-1)).view(*idx.shape, d), idx != dummy)
                if recompute:
                    parts.append(checkpoint(block_softmax, *args, self.scale, use_reentrant=False))
                elif torch.is_grad_enabled() and any(t.requires_grad for t in args[:3]):
                    parts.append(block_softmax(*args, self.scale))
                else:   # inference: in-place passes over one score buffer
                    parts.append(block_softmax_inference(*args, self.scale))
            o = torch.cat([p[0] for p in parts])
            lse = torch.cat([p[1] for p in parts])
        if static:
            o = o.flatten(0, 1)[point_slot]  # (B, T, H, N, d): indexing keeps the index's shape, no view
            w = torch.softmax(lse.flatten()[point_slot], dim=1)  # (B, T, H, N): each round's share of a query
            return (w[..., None] * o).sum(1).permute(0, 2, 1, 3)  # (B, N, H, d)
        # eager: index_select (several times faster on the CPU than advanced indexing), one round at a time
        o = o.flatten(0, 1)
        w = torch.softmax(lse.flatten().index_select(0, point_slot.reshape(-1)).view(point_slot.shape), dim=1)
        in_place = not (torch.is_grad_enabled() and (o.requires_grad or w.requires_grad))
        out = None
        for t in range(T):
            ot = o.index_select(0, point_slot[:, t].reshape(-1)).view(B, H, N, d)
            wt = w[:, t, ..., None]
            term = ot.mul_(wt) if in_place else ot * wt
            out = term if out is None else (out.add_(term) if in_place else out + term)
        return out.permute(0, 2, 1, 3)  # (B, N, H, d)

    # ------------------------------------------------------------------ reference (tests)
    def attention_pattern(self, order: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T, H, N, N) bool: round t puts real points i and j in one block (sum over T: rounds per pair)."""
        B, T, H, N = order.shape
        rank = torch.empty_like(order).scatter(-1, order, torch.arange(N, device=order.device).expand_as(order))
        blk = rank // self.block_size
        same = (blk[..., :, None] == blk[..., None, :]) & mask[:, None, None, :, None] & mask[:, None, None, None, :]
        return same

    def reference(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The same output by dense softmax over all keys with each key weighted by the number of
        rounds that share its block with the query (O(N²); for tests)."""
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, pos_dim=self.coord_dim, requires_pos=True,
                                      who="coord_lsh")
        order = self.prepare(pos, mask)
        x = x.masked_fill(~mask[..., None], 0.0)
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        q, k, v = self._qkv(x, x.dtype)
        count = self.attention_pattern(order, mask).sum(1).to(x.dtype)  # (B, H, N, N) rounds per pair
        s = torch.einsum("bnhd,bmhd->bhnm", q, k) * self.scale
        a = torch.softmax(s.masked_fill(count == 0, float("-inf")), -1).nan_to_num(0.0) * count
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-300)
        o = torch.einsum("bhnm,bmhd->bnhd", a, v)
        return self.zero_padding(self.out_linear(o.reshape(B, N, H * d)), mask)
