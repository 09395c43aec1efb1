"""Block-diagonal exp-kernel attention over separately sorted queries and keys, fused.

This is the compute core of HEPT (and of the OR-only LSH ablation). For every group g
(one cloud × one head) and OR table t, queries and keys are each permuted by their own sort
order and cut into blocks of ``b``; query block j attends only to key block j with weights
exp(min(0, q'·k')). Numerators and denominators are summed over tables before the
division, with 1e−20 added per table (HEPT paper §4.2 and the authors' code).

HEPT's RBF kernel exp(−½‖q̂ − k̂‖²) is a plain dot product of augmented rows
q' = [q̂, −½‖q̂‖², 1] and k' = [k̂, 1, −½‖k̂‖²] (built by the caller), so every chunk of
blocks is GEMM → clamp/exp → GEMM. The denominator is the last column of the value rows
v' = [v, 1] (0 for a padded key, whose whole row is 0, so padded keys add nothing).

Why a custom autograd function: the straightforward version materialises every block's
score matrix (T·G·n·b numbers), keeps it for the backward pass (far more memory than
full attention with a fused kernel) and spends its time in elementwise passes. Here:

* one table at a time, blocks are processed in chunks whose scores stay in cache; each chunk
  writes its results to contiguous rows of a sorted-order buffer, and one gather with the
  inverse permutation adds the table back in point order (no scatter, no atomics);
* the backward pass recomputes each chunk's scores instead of storing them (as
  FlashAttention does): training memory is the inputs, the permutations and one table's
  buffers.
"""
from __future__ import annotations

import torch

from .kernel import DENOM_EPS

#: Lower clamp of the logits. CPU exp takes a slow path below about −88 (5–10× slower), so
#: logits are clamped to −87 first: exp(−87) ≈ 1.6e−38 instead of an underflowed 0. With at
#: most T·b such terms per query this moves a sum by < 1e−35, far below the 1e−20 per-table
#: denominator guard, so outputs are unchanged.
_LOGIT_FLOOR = -87.0

#: Target number of score entries per chunk (fits in a core's L2 with its operands).
DEFAULT_CHUNK_ELEMS = 1 << 18


def _rows(mat: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows of ``mat`` (R, C) at block indices ``idx`` (c, b) -> (c, b, C); index_select is a row memcpy."""
    return mat.index_select(0, idx.reshape(-1)).view(*idx.shape, mat.shape[1])


def _scores(logits: torch.Tensor) -> torch.Tensor:
    """exp(clamp(logits, −87, 0)), in place. (c, b, b)."""
    return logits.clamp_(_LOGIT_FLOOR, 0.0).exp_()


def _unsort_index(idx_t: torch.Tensor, n_rows: int) -> torch.Tensor:
    """For one table: position in the sorted order of every row. idx_t (G, n) -> (R,)."""
    inv = torch.empty(n_rows, dtype=idx_t.dtype, device=idx_t.device)
    inv[idx_t.reshape(-1)] = torch.arange(idx_t.numel(), device=idx_t.device)
    return inv


class _SortedBlockAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qa, ka, va, iq, ik, block_size, chunk_blocks):
        R, dv1 = va.shape
        G, T, n = iq.shape
        b = block_size
        acc = va.new_zeros(R, dv1)  # [Σ_t numerator, Σ_t denominator] in row order
        buf = va.new_empty(G * n // b, b, dv1)  # one table, in sorted order
        for t in range(T):
            bq_all, bk_all = iq[:, t].reshape(-1, b), ik[:, t].reshape(-1, b)
            for s in range(0, bq_all.shape[0], chunk_blocks):
                bq, bk = bq_all[s:s + chunk_blocks], bk_all[s:s + chunk_blocks]
                scores = _scores(torch.bmm(_rows(qa, bq), _rows(ka, bk).transpose(1, 2)))
                torch.bmm(scores, _rows(va, bk), out=buf[s:s + chunk_blocks])
            acc += buf.view(-1, dv1).index_select(0, _unsort_index(iq[:, t], R))
        den = acc[:, -1] + T * DENOM_EPS
        out = acc[:, :-1] / den[:, None]
        ctx.save_for_backward(qa, ka, va, iq, ik, out, den)
        ctx.block_size, ctx.chunk_blocks = b, chunk_blocks
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        qa, ka, va, iq, ik, out, den = ctx.saved_tensors
        b, chunk_blocks = ctx.block_size, ctx.chunk_blocks
        R = qa.shape[0]
        G, T, n = iq.shape
        # out = N / Dn  =>  dN = g / Dn,  dDn = −Σ_c g·out / Dn
        dacc = torch.cat([grad_out / den[:, None], (-(grad_out * out).sum(-1) / den)[:, None]], 1)
        dqa, dka, dva = torch.zeros_like(qa), torch.zeros_like(ka), torch.zeros_like(va)
        dq_buf = qa.new_empty(G * n // b, b, qa.shape[1])
        dk_buf = ka.new_empty(G * n // b, b, ka.shape[1])
        dv_buf = va.new_empty(G * n // b, b, va.shape[1])
        for t in range(T):
            bq_all, bk_all = iq[:, t].reshape(-1, b), ik[:, t].reshape(-1, b)
            for s in range(0, bq_all.shape[0], chunk_blocks):
                sl = slice(s, s + chunk_blocks)
                bq, bk = bq_all[sl], bk_all[sl]
                Q, K, V = _rows(qa, bq), _rows(ka, bk), _rows(va, bk)
                logits = torch.bmm(Q, K.transpose(1, 2))
                above = logits > 0  # the clamp at 0 passes no gradient there
                scores = _scores(logits)  # in place: logits are not needed again
                dNV = _rows(dacc, bq)
                torch.bmm(scores.transpose(1, 2), dNV, out=dv_buf[sl])
                dlog = torch.bmm(dNV, V.transpose(1, 2)).mul_(scores).masked_fill_(above, 0.0)
                torch.bmm(dlog, K, out=dq_buf[sl])
                torch.bmm(dlog.transpose(1, 2), Q, out=dk_buf[sl])
            unsort_q, unsort_k = _unsort_index(iq[:, t], R), _unsort_index(ik[:, t], R)
            dqa += dq_buf.view(R, -1).index_select(0, unsort_q)
            dka += dk_buf.view(R, -1).index_select(0, unsort_k)
            dva += dv_buf.view(R, -1).index_select(0, unsort_k)
        return dqa, dka, dva, None, None, None, None


def sorted_block_attention(
    qa: torch.Tensor,
    ka: torch.Tensor,
    va: torch.Tensor,
    iq: torch.Tensor,
    ik: torch.Tensor,
    block_size: int,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> torch.Tensor:
    """Σ_t A⁽ᵗ⁾V / (Σ_t A⁽ᵗ⁾1 + T·1e−20) with block-diagonal A⁽ᵗ⁾ in each table's sorted order.

    Args:
        qa, ka: (R, Da) augmented query / key rows; the kernel is exp(min(0, qa·ka)).
        va: (R, dv + 1) value rows with a last column of 1 for real keys; padded keys are all 0.
        iq, ik: (G, T, n) int64 row numbers: for group g (cloud × head) and table t, the rows of
            g's n points in the table's query / key sort order (each a permutation of g's rows;
            every row belongs to exactly one group, so R = G·n). n must be a multiple of b.
        block_size: b.
        chunk_elems: score entries computed at once (a speed/memory knob, not semantics).
    Returns:
        (R, dv) attention output per row.
    """
    if iq.shape != ik.shape or iq.dim() != 3:
        raise ValueError(f"iq/ik must both have shape (G, T, n), got {tuple(iq.shape)} and {tuple(ik.shape)}")
    G, T, n = iq.shape
    if n % block_size:
        raise ValueError(f"point count {n} must be a multiple of block_size={block_size} (pad first)")
    if qa.shape[0] != G * n or ka.shape != qa.shape or va.shape[0] != G * n:
        raise ValueError(f"qa/ka/va must have G·n = {G * n} rows and qa, ka the same shape; got "
                         f"{tuple(qa.shape)}, {tuple(ka.shape)}, {tuple(va.shape)}")
    chunk_blocks = max(1, chunk_elems // (block_size * block_size))
    return _SortedBlockAttention.apply(qa, ka, va, iq, ik, block_size, chunk_blocks)
