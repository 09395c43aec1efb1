"""Block-diagonal RBF attention over sorted queries and keys, fused and recomputed.

This is the compute core of HEPT (and of the OR-only LSH ablation): for every group g
(one cloud × one head) and every OR table t, queries and keys are each permuted by their
own sort order, cut into blocks of ``b`` points, and query block j attends only to key block
j with weights exp(min(0, −½‖q̂ − k̂‖²)). Numerators and denominators are summed over tables
before the division (HEPT paper §4.2 / authors' code).

Why a custom autograd function: the straightforward version materialises every block's
score matrix (T·G·n·b numbers) and keeps it for the backward pass, which costs far more
memory than full attention with a fused kernel and spends its time in elementwise passes.
Here the work runs in chunks of blocks that stay in cache:

* the −½‖q̂‖², −½‖k̂‖² terms and the key-padding mask are folded into two extra GEMM
  columns (q' = [q̂, −½‖q̂‖², 1], k' = [k̂, 1, −½‖k̂‖² or −∞-like]), and the denominator
  into an extra column of ones on v, so each chunk is GEMM → clamp/exp → GEMM;
* the backward pass recomputes each chunk's scores instead of storing them (as
  FlashAttention does), so training memory is O(T·G·n) indices + the inputs.
"""
from __future__ import annotations

import torch

from .kernel import DENOM_EPS

#: Logit offset that removes a padded key (exp underflows to exactly 0 in every float type).
_MASKED_KEY = -3.0e4

#: Target number of score entries per chunk (fits in a core's L2 together with the operands).
DEFAULT_CHUNK_ELEMS = 1 << 18


def _augment(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor):
    """(M, D), (M, D), (M, dv), (M,) -> q' (M, D+2), k' (M, D+2), v' (M, dv+1)."""
    one = q.new_ones(q.shape[0], 1)
    qa = torch.cat([q, -0.5 * q.pow(2).sum(-1, keepdim=True), one], 1)
    kn = (-0.5 * k.pow(2).sum(-1, keepdim=True)).masked_fill(~key_valid[:, None], _MASKED_KEY)
    ka = torch.cat([k, one, kn], 1)
    va = torch.cat([v, one], 1)
    return qa, ka, va


def _block_indices(perm: torch.Tensor, block_size: int) -> torch.Tensor:
    """Sort permutations (G, T, n) -> flat row indices (G·T·n/b, b) into a (G·n, ·) matrix."""
    G, T, n = perm.shape
    base = (torch.arange(G, device=perm.device) * n).view(G, 1, 1)
    return (perm + base).reshape(-1, block_size)


class _SortedBlockRBF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_valid, perm_q, perm_k, block_size, n_tables, chunk_blocks):
        G, n, D = q.shape
        dv = v.shape[-1]
        qf, kf, vf = q.reshape(G * n, D), k.reshape(G * n, D), v.reshape(G * n, dv)
        valid = key_valid.reshape(G * n)
        iq = _block_indices(perm_q, block_size)
        ik = _block_indices(perm_k, block_size)
        qa, ka, va = _augment(qf, kf, vf, valid)
        acc = q.new_zeros(G * n, dv + 1)  # [Σ_t numerator, Σ_t denominator]
        for s in range(0, iq.shape[0], chunk_blocks):
            bq, bk = iq[s:s + chunk_blocks], ik[s:s + chunk_blocks]
            scores = torch.bmm(qa[bq], ka[bk].transpose(1, 2)).clamp_max_(0.0).exp_()
            acc.index_add_(0, bq.reshape(-1), torch.bmm(scores, va[bk]).flatten(0, 1))
        den = acc[:, dv] + n_tables * DENOM_EPS
        out = acc[:, :dv] / den[:, None]
        ctx.save_for_backward(qf, kf, vf, valid, iq, ik, out, den)
        ctx.shape = (G, n, D, dv)
        ctx.chunk_blocks = chunk_blocks
        return out.view(G, n, dv)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        qf, kf, vf, valid, iq, ik, out, den = ctx.saved_tensors
        G, n, D, dv = ctx.shape
        g = grad_out.reshape(G * n, dv)
        # out = N / Dn  =>  dN = g / Dn,  dDn = −Σ_c g·out / Dn
        dacc = torch.cat([g / den[:, None], (-(g * out).sum(-1) / den)[:, None]], 1)
        qa, ka, va = _augment(qf, kf, vf, valid)
        dqa, dka = torch.zeros_like(qa), torch.zeros_like(ka)
        dvf = torch.zeros_like(vf)
        for s in range(0, iq.shape[0], ctx.chunk_blocks):
            bq, bk = iq[s:s + ctx.chunk_blocks], ik[s:s + ctx.chunk_blocks]
            Q, K, V = qa[bq], ka[bk], va[bk]
            logits = torch.bmm(Q, K.transpose(1, 2))
            scores = logits.clamp_max(0.0).exp_()
            dNV = dacc[bq]
            dvf.index_add_(0, bk.reshape(-1), torch.bmm(scores.transpose(1, 2), dNV[..., :dv]).flatten(0, 1))
            dlog = torch.bmm(dNV, V.transpose(1, 2)).mul_(scores).masked_fill_(logits > 0, 0.0)
            dqa.index_add_(0, bq.reshape(-1), torch.bmm(dlog, K).flatten(0, 1))
            dka.index_add_(0, bk.reshape(-1), torch.bmm(dlog.transpose(1, 2), Q).flatten(0, 1))
        # chain rule through the folded columns: ∂(−½‖x‖²)/∂x = −x; padded keys get no gradient
        dq = dqa[:, :D] - dqa[:, D:D + 1] * qf
        dk = (dka[:, :D] - dka[:, D + 1:D + 2] * kf).masked_fill_(~valid[:, None], 0.0)
        return dq.view(G, n, D), dk.view(G, n, D), dvf.view(G, n, dv), None, None, None, None, None, None


def sorted_block_rbf_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_valid: torch.Tensor,
    perm_q: torch.Tensor,
    perm_k: torch.Tensor,
    block_size: int,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> torch.Tensor:
    """Σ_t A⁽ᵗ⁾V / Σ_t A⁽ᵗ⁾1 with block-diagonal A⁽ᵗ⁾ in each table's sorted order.

    Args:
        q, k: (G, n, D) augmented queries / keys (G = clouds × heads); n a multiple of b.
        v: (G, n, dv) values.
        key_valid: (G, n) bool, False for padded keys (their kernel value is exactly 0).
        perm_q, perm_k: (G, T, n) int64, per-table permutations sorting queries / keys.
        block_size: b.
        chunk_elems: score entries computed at once (memory/cache trade-off, not semantics).
    Returns:
        (G, n, dv) — numerators and denominators (each + 1e-20 per table) summed over tables.
    """
    G, n, D = q.shape
    if n % block_size:
        raise ValueError(f"point count {n} must be a multiple of block_size={block_size} (pad first)")
    if perm_q.shape != perm_k.shape or perm_q.shape[0] != G or perm_q.shape[2] != n:
        raise ValueError(f"perm_q/perm_k must have shape (G, T, n) = ({G}, T, {n}), got "
                         f"{tuple(perm_q.shape)} and {tuple(perm_k.shape)}")
    chunk_blocks = max(1, chunk_elems // (block_size * block_size))
    return _SortedBlockRBF.apply(q, k, v, key_valid, perm_q, perm_k, block_size, perm_q.shape[1], chunk_blocks)
