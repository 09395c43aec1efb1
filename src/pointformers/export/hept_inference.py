"""Export-friendly inference path of HEPT (and of the kernel family: ``lsh_or``, ``kernel``).

The training path of :class:`~pointformers.attention.HEPTAttention` runs its block attention
through a custom ``autograd.Function`` whose forward is a Python loop over chunks of blocks
(the number of chunks depends on the point count) accumulating with ``index_add_``. Neither
``torch.export`` nor ONNX can capture that for a dynamic point count. This module computes the
same function with a fixed graph:

* **region codes** (:func:`region_codes`): the same ranks, bucket sizes and bit packing as
  :func:`pointformers.attention.hept_regions.region_codes`, with the two non-exportable steps
  rewritten exactly: ``ceil(log2(top + 1))`` is the number of powers of two ≤ top (an integer
  count, no floating log), and ``(r_φ << bits) | r_η`` is ``r_φ·2^bits + r_η`` (equal because
  r_η < 2^bits at every real point; padded points are sorted last whatever their code).
* **blocks without padding the tensors** (:func:`sorted_block_attention_static`): each group's
  sort order (length N) is extended by ``b`` indices of an all-zero dummy row and cut into
  ``N // b + 1`` blocks by index arithmetic. Real points fall in the same blocks as in the
  padded layout of the training path (block j = sorted positions jb … jb + b − 1); the dummy
  keys have value row 0, so they add nothing, exactly like padded keys. No shape depends on
  ``ceil(N / b)`` arithmetic that the exporter would have to prove non-negative.
* **all blocks at once, per table**: gather → batched matmul → clamp/exp → batched matmul, then
  back to point order by a gather with the *inverse* permutation (a scatter of ``arange`` into
  the sort order), summed over tables in table order, then numerator / denominator. This is
  the training path's math (logits exp(min(0, q'·k')) with q' = [q̂, −½‖q̂‖², 1],
  k' = [k̂, 1, −½‖k̂‖²], the −87 logit floor, 1e−20 per table) without a data-dependent loop.
  ``group_chunk`` bounds memory: groups (cloud × head) are processed that many at a time
  (a static Python loop, unrolled in the exported graph).

Sorting uses ``torch.sort(stable=True)``; the ONNX exporter lowers it to ``TopK`` (see
:mod:`.onnx_export`), whose specification breaks ties by the lower index — the same order.
Everything here is inference only (no gradient bookkeeping).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention.hept import HEPTAttention, masked_range
from ..attention.hept_regions import region_indices
from ..attention.kernel import DENOM_EPS, KernelAttention, rbf_logits

#: The training path's lower logit clamp (see :mod:`pointformers.attention.block_attention`).
LOGIT_FLOOR = -87.0

#: Default groups (cloud × head) per block-attention chunk for PyTorch (eager, torch.export). All 8
#: heads of a 60k-point cloud keep ~190 MB of float32 scores alive per table; one head keeps 24 MB,
#: which stays in a large CPU cache: eager 5.7 s vs 10.7 s for the 4-layer tracking model (60k
#: points, 1 thread). onnxruntime does not gain from it (3.9 s vs 3.7 s) and the unrolled graph is
#: 4x larger, so ONNX export uses all heads at once (``group_chunk=None``).
DEFAULT_GROUP_CHUNK = 1


def _powers_of_two(device: torch.device) -> torch.Tensor:
    return torch.pow(2, torch.arange(62, device=device, dtype=torch.int64))


def region_codes(eta: torch.Tensor, phi: torch.Tensor, mask: torch.Tensor, regions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """HEPT's bit-packed (η, φ) region codes, export-friendly; equal to the training path's at real points.

    Args:
        eta, phi: (B, N) coordinates; mask: (B, N) real points (padding may be anywhere).
        regions: (T, 2, H) float bucket counts (the ``regions`` buffer; its dtype sets the arithmetic).
        block_size: unused (kept for the signature); a cloud of n points sizes its regions by n.
    Returns:
        (B, T, H, N) int64 codes (meaningless at padded points, which sort last anyway).
    """
    # the training path's arithmetic, in the regions' dtype (HEPTRegions.codes)
    r_eta, r_phi, top = region_indices(eta, phi, mask, regions)
    # no log2 / bit shifts (not exportable everywhere): count the powers of two <= top instead
    pow2 = _powers_of_two(eta.device)
    bits = (top.unsqueeze(-1) >= pow2).sum(-1)  # = ceil(log2(top + 1)) for top >= 0, exactly
    return r_phi * pow2[bits] + r_eta


def stable_order(keys: torch.Tensor) -> torch.Tensor:
    """Ascending stable sort order along the last dim (ties in index order)."""
    return torch.sort(keys, dim=-1, stable=True).indices


def sorted_block_attention_static(qa: torch.Tensor, ka: torch.Tensor, va: torch.Tensor, iq: torch.Tensor,
                                  ik: torch.Tensor, block_size: int,
                                  group_chunk: int | None = DEFAULT_GROUP_CHUNK) -> torch.Tensor:
    """Σ_t A⁽ᵗ⁾V' over tables, in point order, with block-diagonal A⁽ᵗ⁾ in each table's sort order.

    Args:
        qa, ka: (G, N, Dq) augmented rows q' = [q̂, −½‖q̂‖², 1], k' = [k̂, 1, −½‖k̂‖²] per group
            (cloud × head); va: (G, N, Dv) value rows [v, 1], all zero for padded keys.
        iq, ik: (G, T, N) int64 per-table sort orders (local point indices 0..N−1).
        block_size: b. N need not be a multiple of b.
        group_chunk: groups per chunk (None: all at once). ``G`` must be a Python int.
    Returns:
        (G, N, Dv): Σ_t numerators (first Dv − 1 columns) and denominators (last column).
    """
    G, N, Dq = qa.shape
    Dv = va.shape[-1]
    T = iq.shape[1]
    b = block_size
    dev = qa.device
    # Blocks of the sort order extended by dummy slots: block j = sorted positions jb .. jb+b-1.
    # N // b + 2 blocks: always >= 2 (so the exporter needs no size-1 special case) and enough
    # for the N real points; the trailing all-dummy blocks cost one block of work per group.
    nb = N // b + 2
    blk = (torch.arange(nb, device=dev) * b).unsqueeze(-1) + torch.arange(b, device=dev)  # (nb, b)
    ranks = torch.arange(N, device=dev)
    step = G if not group_chunk else min(group_chunk, G)
    outs = []
    for g0 in range(0, G, step):
        g1 = min(g0 + step, G)
        g = g1 - g0
        dummy = g * N  # index of the appended all-zero row
        rows_q = torch.cat([qa[g0:g1].reshape(g * N, Dq), qa.new_zeros(1, Dq)])
        rows_k = torch.cat([ka[g0:g1].reshape(g * N, Dq), ka.new_zeros(1, Dq)])
        rows_v = torch.cat([va[g0:g1].reshape(g * N, Dv), va.new_zeros(1, Dv)])
        base = (torch.arange(g, device=dev) * N).view(g, 1)
        pad = torch.full((g, 2 * b), dummy, dtype=torch.int64, device=dev)  # covers slots N .. nb·b − 1
        slot_base = torch.arange(g, device=dev).view(g, 1) * (nb * b)
        acc = None
        for t in range(T):
            oq, ok = iq[g0:g1, t], ik[g0:g1, t]  # (g, N)
            sq = torch.cat([oq + base, pad], 1)[:, blk]  # (g, nb, b) rows in block order
            sk = torch.cat([ok + base, pad], 1)[:, blk]
            Q, K, V = rows_q[sq], rows_k[sk], rows_v[sk]  # (g, nb, b, ·)
            scores = torch.matmul(Q, K.transpose(-1, -2)).clamp(LOGIT_FLOOR, 0.0).exp()
            res = torch.matmul(scores, V).flatten(0, 2)  # (g·nb·b, Dv), sorted (block) order
            # back to point order: query i of group j sits at slot j·nb·b + rank_t(i)
            inv = torch.empty_like(oq).scatter(1, oq, ranks.expand(g, N))
            back = res[inv + slot_base]  # (g, N, Dv)
            acc = back if acc is None else acc + back
        outs.append(acc)
    return outs[0] if len(outs) == 1 else torch.cat(outs, 0)


def _augment(qh: torch.Tensor, kh: torch.Tensor, v: torch.Tensor, keep: torch.Tensor):
    """q' = [q̂, −½‖q̂‖², 1], k' = [k̂, keep, −½‖k̂‖²], v' = [v·keep, keep]; keep broadcast to rows."""
    qa = torch.cat([qh, -0.5 * qh.pow(2).sum(-1, keepdim=True), torch.ones_like(keep)], -1)
    ka = torch.cat([kh, keep, -0.5 * kh.pow(2).sum(-1, keepdim=True)], -1)
    va = torch.cat([v * keep, keep], -1)
    return qa, ka, va


def _normalise(acc: torch.Tensor, n_tables: int) -> torch.Tensor:
    den = acc[..., -1:] + n_tables * DENOM_EPS
    return acc[..., :-1] / den


def hept_prepare(model, coords: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Region codes shared by all HEPT layers of ``model`` (its ``region_hash``): (B, T, H, N)."""
    rh = model.region_hash
    return region_codes(coords[..., 0], coords[..., 1], mask, rh.regions, rh.block_size)


def hept_attention(attn: HEPTAttention, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                   codes: torch.Tensor, group_chunk: int | None = DEFAULT_GROUP_CHUNK) -> torch.Tensor:
    """HEPT attention (eval) with a static graph. x (B, N, D), pos (B, N, c), mask (B, N), codes (B, T, H, N) -> (B, N, D).

    The same function as ``attn(x, pos, mask, context=...)`` (up to float rounding; the sort
    can resolve a near-tie differently only when rounding moves a key, see the reference README).
    """
    B, N, _ = x.shape
    H, d = attn.heads, attn.head_dim
    dt = x.dtype
    keep = mask.unsqueeze(-1).to(dt)  # (B, N, 1)
    xk = x * keep
    q = F.linear(xk, attn.w_q.weight.to(dt)).view(B, N, H, d)
    k = F.linear(xk, attn.w_k.weight.to(dt)).view(B, N, H, d)
    v = F.linear(xk, attn.w_v.weight.to(dt)).view(B, N, H, d)
    rho = (2.0 * attn.omega()).sqrt().to(dt) * (pos.to(dt) * keep).unsqueeze(2)  # (B, N, H, c)
    qh = torch.cat([q, rho], -1)
    kh = torch.cat([k, rho], -1)
    # E2LSH base hashes and sort keys T = L + Δ·code, padded points last
    alpha = attn.alpha.to(dt)
    lq = torch.einsum("bnhd,hdt->bthn", qh, alpha)
    lk = torch.einsum("bnhd,hdt->bthn", kh, alpha)
    offset = codes.to(dt) * masked_range(lq, lk, mask)
    pad = ~mask[:, None, None, :]
    iq = stable_order((lq + offset).masked_fill(pad, float("inf")))  # (B, T, H, N)
    ik = stable_order((lk + offset).masked_fill(pad, float("inf")))
    keep4 = keep.unsqueeze(2).expand(B, N, H, 1)
    qa, ka, va = _augment(qh, kh, v, keep4)  # (B, N, H, ·)

    def groups(t: torch.Tensor) -> torch.Tensor:  # (B, N, H, C) -> (B·H, N, C)
        return t.transpose(1, 2).reshape(B * H, N, t.shape[-1])

    def orders(o: torch.Tensor) -> torch.Tensor:  # (B, T, H, N) -> (B·H, T, N)
        return o.transpose(1, 2).reshape(B * H, o.shape[1], N)

    acc = sorted_block_attention_static(groups(qa), groups(ka), groups(va), orders(iq), orders(ik),
                                        attn.block_size, group_chunk)
    o = _normalise(acc, attn.n_hashes).view(B, H, N, d).transpose(1, 2).reshape(B, N, H * d)
    return attn.out_linear(o) * keep


def lsh_attention(attn, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                  group_chunk: int | None = DEFAULT_GROUP_CHUNK) -> torch.Tensor:
    """OR-only LSH attention (``lsh_or`` with ``n_and == 1``), static graph. Shapes as :func:`hept_attention`."""
    B, N, _ = x.shape
    H, d = attn.heads, attn.head_dim
    q, k, v = attn.augmented_qkv(x, pos, mask)  # (B, H, N, ·), zero at padded points
    tq, tk = attn.sort_keys(q, k, mask)  # (B, T, H, N); n_and == 1: no bucketing
    T = tq.shape[1]
    keep = mask[:, None, :, None].to(x.dtype).expand(B, H, N, 1)
    qa, ka, va = _augment(q, k, v, keep)

    def orders(o: torch.Tensor) -> torch.Tensor:
        return o.transpose(1, 2).reshape(B * H, T, N)

    acc = sorted_block_attention_static(qa.reshape(B * H, N, -1), ka.reshape(B * H, N, -1),
                                        va.reshape(B * H, N, -1), orders(stable_order(tq)), orders(stable_order(tk)),
                                        attn.block_size, group_chunk)
    return attn.merge_heads(_normalise(acc, T).view(B, H, N, d), mask)


def kernel_attention(attn: KernelAttention, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Dense RBF kernel attention without query chunking (O(N²) memory). Shapes as :func:`hept_attention`."""
    q, k, v = attn.augmented_qkv(x, pos, mask)
    a = rbf_logits(q, k).exp().masked_fill(~mask[:, None, None, :], 0.0)
    return attn.merge_heads((a @ v) / (a.sum(-1, keepdim=True) + DENOM_EPS), mask)


__all__ = ["region_codes", "stable_order", "sorted_block_attention_static", "hept_prepare", "hept_attention",
           "lsh_attention", "kernel_attention", "DEFAULT_GROUP_CHUNK", "LOGIT_FLOOR"]
