"""SFT — Sampling Foundational Transformer attention (SFT paper: "SFT: Sampling-based Foundational Transformer").

Per layer, all n queries attend to k **soft duplets** of sampled tokens:

1. **Sampler** (SFT paper §4.2; where its description is ambiguous, we follow the reading below). A learned score ``z = Linear_S(x)`` (d → 1, shared by all
   heads) plus Gumbel(0, 1) noise in training ranks the real points of each cloud. The k best form
   S₁, k others form S₂ (S₁ ∩ S₂ = ∅, no duplicates); bin j pairs S₁[j] with S₂[j] and mixes them
   as ``p_j·x_{S₁[j]} + (1−p_j)·x_{S₂[j]}`` with the Softplus-power ratio
   ``p_j = SP(z̃₁)^{1/τ} / (SP(z̃₁)^{1/τ} + SP(z̃₂)^{1/τ}) ∈ [0.5, 1]`` (Eq. 9, same noisy z̃ that
   ranked them). K, V and the leak C are projected from the k mixed tokens (Table 7 cost scaling).
2. **Leaky-ReLU maxout attention** (SFT paper §4.3, the form with relative features)::

       A[i,j] = (Σ_c max(Q_ic, K_jc) / √d_h) · R_mul[i,j] + R_add[i,j]
       P[i,j] = ReLU(A[i,j]) / (Σ_r ReLU(A[i,r]) + Σ_r Softplus(C_r) + ε)      (leak per key, summed)

   so every row sums to < 1 (the missing mass is a null key with zero value): this is what makes
   an all-ones input gain rank over layers ("rank injection"), see
   :class:`~pointformers.models.sft_models.SFTEncoder`. The maxout
   sum is computed through ``max(a, b) = (a + b + |a − b|) / 2``:
   ``Σ_c max(Q_ic, K_jc) = ½(ΣQ_i + ΣK_j + ‖Q_i − K_j‖₁)`` with ``torch.cdist(p=1)`` forward and a
   chunked backward, so nothing of size B·h·n·k·d_h is materialised (only B·h·n·k attention maps).
3. **Relative features** (``rpe``), transformed per head by separate Linear_{R_mul}/Linear_{R_add}
   (r → h) for the S₁ and the S₂ member of each bin and mixed with (p, 1 − p) (the paper's 7 steps):

   * ``"points"``: ``[‖x_i − x_j‖², n_i·n_j]`` from ``pos = [xyz, normals]``; the last
     ``normal_dims`` columns of ``pos`` are the normals (0: no normals, r = 1), the rest coordinates;
   * ``"sequence"``: learnable linear combination S' = W_pe·Sinusoid1D(position) and the Hadamard
     feature S'_i ⊙ S'_j, whose linear map is the bilinear form ``(S'_i ⊙ w_h)·S'_j`` computed by
     matmul (the (n, k, d_pe) tensor is never built); positions are ``pos[..., 0]`` or 0..N−1;
   * ``"graph"``: a dense edge tensor ``edge_attr`` (B, N, N, r) passed as a keyword argument to
     ``forward`` (or, inside a block, in the forward context: ``ForwardContext(edge_attr=...)``),
     gathered at the sampled columns.

Randomness: frozen at init — nothing but the weights. Resampled per forward in training — the
Gumbel noise on the scores, the random partners S₂, the drop-token mask and the Q/K dropout.
``eval()`` is deterministic: no noise, no drop-token, no dropout, and S₂ is taken at evenly spaced
ranks of the rest ("stratified": rank k + ⌊(j + ½)·m/k⌋ of the m ranked leftovers, the deterministic
counterpart of a uniform draw), so a cloud gives the same output alone or in a padded batch.
The paper never describes inference; where it is silent, we use soft duplets without noise (the
default (``hard_eval=True`` uses S₁ alone).

Inference path: in ``eval()`` with autograd off, on the CPU, for ``rpe="none"`` and a batch without
padding (mask None or all True), :meth:`SFTAttention._forward_fast` (and, for a whole layer,
:meth:`SFTAttention.fused_residual` with the block's :meth:`~pointformers.nn.FeedForward.fused`)
compute the same function with fewer passes over memory (transposed layouts, a blocked maxout
kernel, in-place ReLU/GeLU, biases and residuals folded into GEMMs, a row-blocked FFN). Everything
else takes the general path; tests check the two agree.

Export mode (:func:`~.base.set_exportable`): the general path, with the maxout summed channel by
channel (:func:`maxout_by_channels`: no custom ``autograd.Function``, no ``cdist``, which ONNX
lacks) and the input checks that read data on the host skipped while tracing. The graph is traced
for N > k (a cloud with at most k points takes other branches of the sampler). ``rpe="graph"`` is
refused: its dense (N, N, r) ``edge_attr`` is no input of an exported (x, coords) model.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..nn import fast_linear
from ..nn.transformer_block import TransformerBlock
from .base import TokenMixer, check_attention_inputs, is_tracing
from .flop_count import FlopCount
from .registry import register
from .sampling import NEG_INF, gather_rows, gumbel_noise, softplus_power_ratio, stable_descending_order, work_dtype

_RPE_KINDS = ("none", "points", "sequence", "graph")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --------------------------------------------------------------------------------------------
# Maxout score
# --------------------------------------------------------------------------------------------
class _MaxoutScore(torch.autograd.Function):
    """``S[g, i, j] = Σ_c max(q[g, i, c], k[g, j, c])`` via the L1 identity; chunked backward."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, chunk_elems: int) -> torch.Tensor:
        ctx.save_for_backward(q, k)
        ctx.chunk_elems = chunk_elems
        if q.device.type == "cpu":
            # (G, m, n) result returned as a (G, n, m) view: the blocked kernel beats cdist on CPU
            return maxout_scores_t(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()).transpose(1, 2)
        l1 = torch.cdist(q, k, p=1.0)  # (G, n, m); CUDA kernel loops over pairs, no broadcast buffer
        return 0.5 * (q.sum(-1, keepdim=True) + k.sum(-1).unsqueeze(-2) + l1)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        q, k = ctx.saved_tensors
        G, n, d = q.shape
        m = k.shape[1]
        need_q, need_k = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # d max(a, b)/da = (1 + sign(a − b)) / 2 (½ at ties, as torch.maximum); chunk over queries so
        # that the sign tensor holds at most chunk_elems elements.
        # One sign buffer, reused by every chunk and overwritten in place (no per-chunk allocations):
        # the query gradient reads it as a batched GEMV, then it is scaled by g in place and summed
        # over the chunk's queries for the key gradient.
        rows = max(1, min(n, ctx.chunk_elems // max(1, G * m * d)))
        gq = torch.empty_like(q) if need_q else None
        gk = torch.zeros_like(k) if need_k else None
        g = g.to(q.dtype)
        buf = q.new_empty(G, rows, m, d)
        part = q.new_empty(G, m, d) if need_k else None
        for s in range(0, n, rows):
            c = min(rows, n - s)
            gs = g[:, s:s + c]                                          # (G, c, m)
            sign = buf[:, :c]
            torch.sub(q[:, s:s + c, None, :], k[:, None, :, :], out=sign)
            torch.sign(sign, out=sign)                                  # (G, c, m, d)
            if need_q:
                gsign = torch.matmul(gs.unsqueeze(-2), sign).squeeze(-2)   # (G, c, d)
                gq[:, s:s + c] = 0.5 * (gs.sum(-1, keepdim=True) + gsign)
            if need_k:
                sign.mul_(gs.unsqueeze(-1))
                torch.sum(sign, 1, out=part)
                gk += 0.5 * (gs.sum(1).unsqueeze(-1) - part)
        return gq, gk, None


def maxout_scores_t(qt: torch.Tensor, kt: torch.Tensor, scale: float = 1.0, block_elems: int = 1 << 19,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Transposed pairwise maxout ``S[g, j, i] = scale · Σ_c max(qt[g, c, i], kt[g, c, j])`` (no autograd).

    qt (G, d, n), kt (G, d, m), both contiguous -> (G, m, n) contiguous. The CPU kernel behind
    ``cdist(p=1)`` reduces every pair with a scalar loop; here each block is one vectorised
    ``maximum`` over a cache-sized (d, m', n') tile (queries contiguous, a key broadcast per row)
    followed by the channel sum as a (1 × d) GEMM, which also applies ``scale``. Exact up to float
    summation order; the work buffer holds at most ``block_elems`` elements (one reused tile).
    ``out``: optional contiguous (G, m, n) tensor to write into (a reused buffer).
    """
    G, d, n = qt.shape
    m = kt.shape[2]
    out = qt.new_empty(G, m, n) if out is None else out
    w = qt.new_full((1, d), scale)
    if d * m * n <= block_elems:  # several whole groups per tile
        gc = min(G, block_elems // (d * m * n))
        buf = qt.new_empty(gc, d, m, n)
        wg = w.expand(gc, 1, d)
        for s in range(0, G, gc):
            e = min(G, s + gc)
            b = buf[: e - s]
            torch.maximum(qt[s:e, :, None, :], kt[s:e, :, :, None], out=b)
            torch.bmm(wg[: e - s], b.view(e - s, d, m * n), out=out[s:e].view(e - s, 1, m * n))
        return out
    kc = max(1, block_elems // (d * n))           # keys per tile
    nc = n if kc > 1 else max(1, block_elems // d)  # with one key per tile, queries are split too
    buf = qt.new_empty(d * kc * nc)
    for g in range(G):
        qg, kg, og = qt[g], kt[g], out[g]
        for s in range(0, m, kc):
            e = min(m, s + kc)
            for t in range(0, n, nc):
                u = min(n, t + nc)
                b = buf[: d * (e - s) * (u - t)].view(d, e - s, u - t)
                torch.maximum(qg[:, None, t:u], kg[:, s:e, None], out=b)
                # og[s:e, t:u] is contiguous: either t:u spans all of n, or e − s = 1
                torch.mm(w, b.view(d, -1), out=og[s:e, t:u].view(1, -1))
    return out


def maxout_scores(q: torch.Tensor, k: torch.Tensor, chunk_elems: int = 1 << 22) -> torch.Tensor:
    """Pairwise maxout ``Σ_c max(q_ic, k_jc)`` for q (..., n, d), k (..., m, d) -> (..., n, m).

    Memory: O(n·m) outputs plus a backward work buffer of at most ``chunk_elems`` elements.
    (First-order gradients only.)
    """
    lead = q.shape[:-2]
    out = _MaxoutScore.apply(q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]), chunk_elems)
    return out.reshape(*lead, q.shape[-2], k.shape[-2])


def maxout_by_channels(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Pairwise maxout ``Σ_c max(q_ic, k_jc)`` summed one channel at a time: q (..., n, d), k (..., m, d)
    -> (..., n, m), with one (..., n, m) temporary per channel.

    The export mode's kernel: plain differentiable ops in a loop of static length d (no custom
    ``autograd.Function`` and no ``cdist``, neither of which torch.export / ONNX capture)."""
    out = None
    for c in range(q.shape[-1]):
        term = torch.maximum(q[..., :, c:c + 1], k[..., c].unsqueeze(-2))
        out = term if out is None else out + term
    return out


def maxout_scores_dense(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Reference: the literal broadcast ``max(q[:, None], k[None]).sum(-1)`` (materialises n·m·d)."""
    return torch.maximum(q[..., :, None, :], k[..., None, :, :]).sum(-1)


# --------------------------------------------------------------------------------------------
# Sampler
# --------------------------------------------------------------------------------------------
class SFTSample(NamedTuple):
    """Result of :class:`SFTSampler` for a batch; k' = min(k, N) bins.

    idx_top: (B, k') long, S₁ (rank j of the noisy score in bin j).
    idx_rand: (B, k') long, S₂ (the partner of bin j; equals idx_top where there is none).
    p: (B, k') bin probability of the S₁ member, in [0.5, 1]; 1 where there is no partner.
    key_valid: (B, k') bool, bin holds a real (non-dropped) point; invalid bins are masked keys.
    partner_valid: (B, k') bool, bin has an S₂ member.
    scores: (B, N) noisy scores z + g used for ranking (``-inf`` at padding / dropped points).
    """

    idx_top: torch.Tensor
    idx_rand: torch.Tensor
    p: torch.Tensor
    key_valid: torch.Tensor
    partner_valid: torch.Tensor
    scores: torch.Tensor


class SFTSampler(nn.Module):
    """SFT's differentiable sampler without replacement: top-k S₁ + k disjoint partners S₂ in binary bins.

    Args:
        dim: token width d (the score is ``Linear_S: d → 1``, shared across heads).
        k: number of bins (sampled tokens).
        tau: temperature of the Softplus-power ratio (paper: 1.0 throughout).
        drop_token: "Drop Token Probability": in training each real point leaves the candidate pool
            with this probability (it stays a query). The best-scored point is never dropped, so a
            cloud always has a key. (The paper never defines it; this is our reading.)
        partner: ``"random"`` — S₂ uniform among the points ranked after S₁ (paper: "k random
            vectors"); deterministic stratified ranks in eval. ``"next"`` — ranks k+1..2k
            (SAMSA-like), in training and eval.
        gumbel: add Gumbel(0, 1) noise to the scores in training.
    Shapes: x (B, N, d), mask (B, N) -> :class:`SFTSample`. Only real points are ranked; ties are
    broken by index order (stable sort), so ranking is the same alone or padded.
    Edge cases: a cloud with n ≤ k real points fills n bins and masks the rest; with k < n < 2k only
    n − k bins get a partner, the others have p = 1.
    """

    def __init__(self, dim: int, k: int, tau: float = 1.0, drop_token: float = 0.0, partner: str = "random",
                 gumbel: bool = True):
        super().__init__()
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau!r}")
        if not 0.0 <= drop_token < 1.0:
            raise ValueError(f"drop_token must be in [0, 1), got {drop_token!r}")
        if partner not in ("random", "next"):
            raise ValueError(f"partner must be 'random' or 'next', got {partner!r}")
        self.k, self.tau, self.drop_token, self.partner, self.gumbel = k, float(tau), float(drop_token), partner, gumbel
        self.score = nn.Linear(dim, 1)

    def reset_parameters(self) -> None:
        """Re-initialise the score ``Linear_S`` as the constructor does."""
        self.score.reset_parameters()

    def extra_repr(self) -> str:
        return (f"k={self.k}, tau={self.tau}, drop_token={self.drop_token}, partner={self.partner!r}, "
                f"gumbel={self.gumbel}")

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, generator: torch.Generator | None = None) -> SFTSample:
        """``mask`` None means every point is real (skips the masking work; same result as all True)."""
        B, N, _ = x.shape
        dev = x.device
        wd = work_dtype(x.dtype)
        z = self.score(x).squeeze(-1).to(wd)                                   # (B, N)
        if self.training and self.gumbel:
            z = z + gumbel_noise((B, N), dtype=wd, device=dev, generator=generator)
        if mask is None and self.training and self.drop_token > 0:
            mask = torch.ones(B, N, dtype=torch.bool, device=dev)
        cand = mask
        if self.training and self.drop_token > 0:
            drop = torch.rand((B, N), device=dev, generator=generator) < self.drop_token
            best = z.masked_fill(~mask, NEG_INF).argmax(-1)
            drop[torch.arange(B, device=dev), best] = False
            cand = mask & ~drop
        if cand is not None:
            z = z.masked_fill(~cand, NEG_INF)
        _, order = stable_descending_order(z)                                   # (B, N)
        n_c = cand.sum(-1) if cand is not None else torch.full((B,), N, device=dev)  # (B,) candidates
        # min(k, N), written as a branch: with N > k known (the export mode traces N > k) k stays a
        # plain int, where min() would make it a symbolic Min(k, N) that later broadcasts cannot resolve
        k = self.k if N > self.k else N
        j = torch.arange(k, device=dev)
        idx_top = order[:, :k]
        key_valid = j[None] < n_c[:, None]
        m = (n_c - k).clamp(min=0)                                              # leftovers per cloud
        partner_valid = j[None] < m[:, None]
        R = N - k                                                               # leftover rank slots
        if R == 0:
            idx_rand = idx_top
        else:
            if self.partner == "random" and self.training:
                keys = torch.rand((B, R), device=dev, generator=generator)
                keys = keys.masked_fill(torch.arange(R, device=dev)[None] >= m[:, None], -1.0)
                off = keys.topk(min(k, R), dim=-1).indices                      # real leftovers first
                if off.shape[1] < k:
                    off = F.pad(off, (0, k - off.shape[1]))
            elif self.partner == "random":                                      # eval: stratified ranks
                strat = torch.div((2 * j[None] + 1) * m[:, None], 2 * k, rounding_mode="floor")
                off = torch.where(m[:, None] >= k, strat, j[None].expand(B, k))
            else:                                                               # "next": ranks k..2k-1
                off = j[None].expand(B, k)
            off = torch.where(partner_valid, off, torch.zeros_like(off)).clamp(max=R - 1)
            idx_rand = torch.where(partner_valid, order.gather(1, k + off), idx_top)
        z1 = torch.where(key_valid, z.gather(1, idx_top), torch.zeros((), dtype=wd, device=dev))
        z2 = torch.where(partner_valid, z.gather(1, idx_rand), torch.zeros((), dtype=wd, device=dev))
        p = torch.where(partner_valid, softplus_power_ratio(z1, z2, self.tau), torch.ones((), dtype=wd, device=dev))
        return SFTSample(idx_top, idx_rand, p, key_valid, partner_valid, z)


# --------------------------------------------------------------------------------------------
# Relative features
# --------------------------------------------------------------------------------------------
def sinusoid_1d(positions: torch.Tensor, dim: int, exponent: str = "paper") -> torch.Tensor:
    """Sinusoid1D (SFT paper, App. D.1, Eqs. 23–24): S[i, 2j] = sin(i / 10000^{e_j}), S[i, 2j+1] = cos(i / 10000^{e_j}).

    ``exponent="paper"``: e_j = j / d (as printed); ``"standard"``: e_j = 2j / d (Vaswani et al.).
    positions (..., N) -> (..., N, dim); ``dim`` must be even.
    """
    j = torch.arange(dim // 2, device=positions.device, dtype=positions.dtype)
    e = j / dim if exponent == "paper" else 2 * j / dim
    ang = positions[..., None] / torch.pow(torch.tensor(10000.0, dtype=positions.dtype, device=positions.device), e)
    return torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(-2)


#: Values of ``rel_features``: the paper's pair features, or point-pair features (see below).
REL_FEATURES = ("paper", "ppf")


def point_relative_features(pos_q: torch.Tensor, pos_k: torch.Tensor, normal_dims: int,
                            kind: str = "paper") -> torch.Tensor:
    """Relative features of every (query, key) pair for pos = [coords, normals]: (B, N, P), (B, k, P)
    -> (B, N, k, r).

    ``"paper"``: ``[‖x_i − x_j‖², n_i·n_j]`` (r = 2 with normals, ``normal_dims`` > 0, else r = 1).
    ``"ppf"`` (with normals only): those two and the point-pair-feature terms ``n_i·(x_j − x_i)`` and
    ``n_j·(x_j − x_i)``, where the normals meet the pair's offset (r = 4): still SO(3)- and
    translation-invariant, and they tell a point on a flat face from one on a curved one, which the
    paper's two cannot. The squared distance is formed from differences (no ‖a‖²+‖b‖²−2ab
    cancellation); the temporary is (B, N, k, P − normal_dims).
    """
    c = pos_q.shape[-1] - normal_dims
    diff = pos_k[..., None, :, :c] - pos_q[..., None, :c]           # x_j − x_i, (B, N, k, c)
    d2 = diff.pow(2).sum(-1)
    if normal_dims == 0:
        return d2.unsqueeze(-1)
    nd = torch.matmul(pos_q[..., c:], pos_k[..., c:].transpose(-1, -2))
    if kind == "paper":
        return torch.stack([d2, nd], dim=-1)
    ni = (diff * pos_q[..., None, c:]).sum(-1)
    nj = (diff * pos_k[..., None, :, c:]).sum(-1)
    return torch.stack([d2, nd, ni, nj], dim=-1)


# --------------------------------------------------------------------------------------------
# The mixer
# --------------------------------------------------------------------------------------------
def sft_flops(m: "SFTAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """q on n tokens, k/v on the k' = min(k, n) sampled tokens, out projection, sampler score and
    leak, the L1 maxout (3 per pair and channel, not a matmul) and the value product."""
    H, d = m.heads, m.head_dim
    k = min(m.k, n)
    inner = H * d
    f = FlopCount()
    f.add("q projection", 2 * n * dim * inner)
    f.add("k, v projections (sampled tokens)", 2 * 2 * k * dim * inner)
    f.add("out projection", 2 * n * inner * dim)
    f.add("sampler score and leak", 2 * n * dim + 2 * k * dim * H)
    f.add("maxout scores (L1, non-matmul)", H * 3 * n * k * d)
    f.add("value product", H * 2 * n * k * (d + 1))
    return f


class _CheckedEdges:
    """An edge tensor already checked and masked for this forward pass (shared through the context)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


@register("sft", flops=sft_flops, bench={"k": 256})
class SFTAttention(TokenMixer):
    """SFT sampled leaky-ReLU maxout attention (the token mixer; residual and norms: :func:`SFTBlock`).

    Args:
        dim: model width D.
        heads: number of heads h.
        k: sampled tokens (bins) per layer, shared by all heads.
        head_dim: per-head width d_h (default D // h, or D when h does not divide D).
        rpe: relative features: ``"none"``, ``"points"``, ``"sequence"`` or ``"graph"`` (module docstring).
        normal_dims: for ``rpe="points"``, how many trailing ``pos`` columns are surface normals
            (default 0: all columns are coordinates; use 3 with pos = [xyz, normals]).
        rel_features: for ``rpe="points"``: ``"paper"`` (‖x_i − x_j‖², n_i·n_j) or ``"ppf"`` (with
            normals: also n_i·(x_j − x_i), n_j·(x_j − x_i); :func:`point_relative_features`).
        rpe_hidden: 0 (the paper): R_mul and R_add are linear in the relative features; > 0: the
            features first pass a shared Linear(r, rpe_hidden) + GELU, so each head's bias can be
            any smooth function of them, not a weighted sum.
        edge_dim: for ``rpe="graph"``, channels r of ``edge_attr`` (B, N, N, r).
        pe_dim: for ``rpe="sequence"``, sinusoid width d_pe (even; default D rounded up to even).
        sinusoid_exponent: ``"paper"`` (j/d, as printed) or ``"standard"`` (2j/d).
        leaky: add the learned leak Softplus(C) to the denominator (False: plain ReLU probability).
        leak_mode: ``"per_key_sum"`` — C = Linear_C(sampled tokens) (k × h), summed over the valid
            keys (default; matches the cost table and gives rank injection); ``"per_query"`` —
            C = Linear_C(query token) (n × h), Appendix B's indexing.
        tau: Softplus-power temperature τ of the sampler (1.0).
        drop_token: the sampler's Drop Token Probability (training only).
        partner: S₂ policy of :class:`SFTSampler` (``"random"`` or ``"next"``).
        hard: straight-through duplets in training (forward uses S₁ alone, gradient through p).
        hard_eval: in eval, use S₁ alone (p = 1) instead of soft duplets.
        qk_dropout: "attention score dropout" on the Q and K vectors (training only).
        bias: biases on the Q/K/V/C projections (needed for rank injection from an all-ones input).
        eps: ε of the probability denominator.
        dense_reference: compute the maxout by literal broadcast (slow; for tests).
    Shapes: x (B, N, D), pos (B, N, P), mask (B, N) bool, edge_attr (B, N, N, r) -> (B, N, D), padded
    rows zero. Cost O(N·k·(h·d_h + r)) time, O(N·k·h) memory; scores/probabilities are computed in
    float32 (float64 stays float64) even for bfloat16 inputs. Export mode: module docstring.
    ``reset_parameters()`` re-initialises every projection (sampler score, Q/K/V, C, out, relative
    features) as the constructor does, in its order; SFT has no frozen draws.
    """

    _repr_fields = ("k", "rpe", "leaky", "leak_mode", "rel_features", "rpe_hidden")

    def __init__(self, dim: int, heads: int = 8, k: int = 256, head_dim: int | None = None, rpe: str = "none",
                 normal_dims: int = 0, edge_dim: int | None = None, pe_dim: int | None = None,
                 sinusoid_exponent: str = "paper", leaky: bool = True, leak_mode: str = "per_key_sum",
                 tau: float = 1.0, drop_token: float = 0.0, partner: str = "random", hard: bool = False,
                 hard_eval: bool = False, qk_dropout: float = 0.0, bias: bool = True, eps: float = 1e-6,
                 dense_reference: bool = False, chunk_elems: int = 1 << 22, dropout: float = 0.0,
                 rel_features: str = "paper", rpe_hidden: int = 0):
        super().__init__(dim, heads, dropout)
        if rpe not in _RPE_KINDS:
            raise ValueError(f"rpe must be one of {_RPE_KINDS}, got {rpe!r}")
        if rel_features not in REL_FEATURES:
            raise ValueError(f"rel_features must be one of {REL_FEATURES}, got {rel_features!r}")
        if rel_features == "ppf" and (rpe != "points" or normal_dims == 0):
            raise ValueError("rel_features='ppf' needs rpe='points' with normals (normal_dims > 0)")
        if isinstance(rpe_hidden, bool) or not isinstance(rpe_hidden, int) or rpe_hidden < 0:
            raise ValueError(f"rpe_hidden must be an int >= 0, got {rpe_hidden!r}")
        if rpe_hidden and rpe not in ("points", "graph"):
            raise ValueError(f"rpe_hidden needs rpe='points' or 'graph', got rpe={rpe!r}")
        self.rel_features, self.rpe_hidden = rel_features, rpe_hidden
        if leak_mode not in ("per_key_sum", "per_query"):
            raise ValueError(f"leak_mode must be 'per_key_sum' or 'per_query', got {leak_mode!r}")
        if sinusoid_exponent not in ("paper", "standard"):
            raise ValueError(f"sinusoid_exponent must be 'paper' or 'standard', got {sinusoid_exponent!r}")
        if not isinstance(normal_dims, int) or normal_dims < 0:
            raise ValueError(f"normal_dims must be an int >= 0, got {normal_dims!r}")
        if rpe == "graph" and (not isinstance(edge_dim, int) or edge_dim < 1):
            raise ValueError(f"rpe='graph' needs edge_dim (channels of edge_attr) >= 1, got {edge_dim!r}")
        self.k, self.rpe, self.normal_dims, self.edge_dim = k, rpe, normal_dims, edge_dim
        self.leaky, self.leak_mode, self.hard, self.hard_eval = leaky, leak_mode, hard, hard_eval
        self.eps, self.dense_reference, self.chunk_elems = eps, dense_reference, chunk_elems
        self.sinusoid_exponent = sinusoid_exponent
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        inner = heads * self.head_dim
        self.sampler = SFTSampler(dim, k, tau=tau, drop_token=drop_token, partner=partner)
        self._init_projections(inner, bias, out=False)
        self.w_c = nn.Linear(dim, heads, bias=bias)   # the leak C, created before out_linear (init order)
        self.out_linear = nn.Linear(inner, dim)
        self.qk_dropout = nn.Dropout(qk_dropout)
        if rpe == "points":
            r = 1 if normal_dims == 0 else (2 if rel_features == "paper" else 4)
        elif rpe == "graph":
            r = edge_dim
        elif rpe == "sequence":
            r = pe_dim or (dim + dim % 2)
            if r % 2:
                raise ValueError(f"pe_dim must be even, got {pe_dim!r}")
            self.w_pe = nn.Linear(r, r, bias=False)  # "learnable linear combination of Sinusoid1D"
        self.rel_dim = r if rpe != "none" else 0
        self.rpe_mlp = nn.Sequential(nn.Linear(r, rpe_hidden), nn.GELU()) if rpe_hidden else None
        if rpe != "none":
            self.r_mul = nn.Linear(rpe_hidden or r, heads)
            self.r_add = nn.Linear(rpe_hidden or r, heads)

    # ---- relative bias ----------------------------------------------------------------------
    def _check_edge_attr(self, edge_attr, x, mask) -> torch.Tensor:
        B, N, _ = x.shape
        if edge_attr is None:
            raise ValueError("sft: rpe='graph' needs edge_attr, a dense (B, N, N, edge_dim) tensor")
        if not isinstance(edge_attr, torch.Tensor) or edge_attr.shape != (B, N, N, self.edge_dim):
            raise ValueError(f"sft: edge_attr must have shape (B, N, N, edge_dim) = {(B, N, N, self.edge_dim)}, "
                             f"got {tuple(getattr(edge_attr, 'shape', ())) or type(edge_attr).__name__}")
        if not edge_attr.is_floating_point():
            raise ValueError(f"sft: edge_attr must be a floating tensor, got dtype {edge_attr.dtype}")
        if edge_attr.device != x.device:
            raise ValueError(f"sft: edge_attr is on {edge_attr.device} but x is on {x.device}")
        pair = mask[:, :, None] & mask[:, None, :]
        out = edge_attr.masked_fill(~pair[..., None], 0.0)   # padding may hold anything, NaN included
        if not bool(torch.isfinite(out).all()):
            raise ValueError("sft: edge_attr contains NaN or inf between real points")
        return out

    def _relative_logits(self, samp: SFTSample, pos, edge_attr, x, wd):
        """Pre-activation R_mul / R_add logits for the S₁ and S₂ member of every bin: 4 × (B, h, N, k')."""
        if self.rpe in ("points", "graph"):
            if self.rpe == "points":
                pw = pos.to(wd)
                rel_t = point_relative_features(pw, gather_rows(pw, samp.idx_top), self.normal_dims, self.rel_features)
                rel_r = point_relative_features(pw, gather_rows(pw, samp.idx_rand), self.normal_dims,
                                                self.rel_features)
            else:
                B, N = x.shape[:2]
                e = edge_attr.to(wd)

                def cols(idx):
                    return e.gather(2, idx[:, None, :, None].expand(B, N, idx.shape[1], self.edge_dim))
                rel_t, rel_r = cols(samp.idx_top), cols(samp.idx_rand)           # (B, N, k', r)
            if self.rpe_mlp is not None:
                lin = self.rpe_mlp[0]
                w1, b1 = lin.weight.to(wd), lin.bias.to(wd)
                rel_t, rel_r = (F.gelu(F.linear(rel, w1, b1)) for rel in (rel_t, rel_r))
            wm, bm = self.r_mul.weight.to(wd), self.r_mul.bias.to(wd)
            wa, ba = self.r_add.weight.to(wd), self.r_add.bias.to(wd)
            out = [F.linear(rel, w, b).permute(0, 3, 1, 2) for rel in (rel_t, rel_r) for (w, b) in ((wm, bm), (wa, ba))]
            return out  # mul_t, add_t, mul_r, add_r
        # sequence: bilinear form of the sinusoid Hadamard product, by matmul
        B, N = x.shape[:2]
        if pos is not None:
            positions = pos[..., 0].to(wd)
        else:
            positions = torch.arange(N, device=x.device, dtype=wd).expand(B, N)
        s = F.linear(sinusoid_1d(positions, self.rel_dim, self.sinusoid_exponent), self.w_pe.weight.to(wd))  # (B,N,c)
        s_t, s_r = gather_rows(s, samp.idx_top), gather_rows(s, samp.idx_rand)  # (B, k', c)
        h = self.heads
        w = torch.cat([self.r_mul.weight, self.r_add.weight]).to(wd)               # (2h, c): R_mul's, R_add's
        bias = torch.cat([self.r_mul.bias, self.r_add.bias]).to(wd)[None, :, None, None]
        out = []
        for sk in (s_t, s_r):
            # the head weights on the k' sampled side, (S'_i ⊙ w_h)·S'_j = S'_i·(w_h ⊙ S'_j):
            # no (B, h, N, c) copy
            keys = sk[:, None] * w[None, :, None, :]                                # (B, 2h, k', c)
            logits = torch.matmul(s[:, None], keys.transpose(-1, -2)) + bias        # (B, 2h, N, k')
            out += [logits[:, :h], logits[:, h:]]
        return out

    # ---- forward ------------------------------------------------------------------------------
    #: Use :meth:`_forward_fast` where it applies (see :meth:`fast_path_applies`); tests switch it
    #: off to compare with the general path.
    fast_inference: bool = True

    def min_points(self) -> int:
        """The export graph is traced for N > k (smaller clouds take other branches of the sampler)."""
        return self.k + 1

    def export_refusal(self) -> str | None:
        if self.rpe == "graph":
            return ("rpe='graph' needs a dense (N, N, r) edge_attr input, which the exported (x, coords) "
                    "signature does not carry")
        return super().export_refusal()

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None, *, edge_attr: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, D), pos (B, N, P), mask (B, N), edge_attr (B, N, N, r) (``rpe="graph"`` only) -> (B, N, D).

        ``context``: read for ``edge_attr`` when the keyword is not given (``context.inputs``);
        nothing is prepared (the sampler depends on the layer's own x). Training randomness comes
        from the global torch RNG."""
        if (edge_attr is None and self.rpe == "graph" and context is not None
                and context.inputs.get("edge_attr") is not None):
            # the layers of one forward pass share the context's edge tensor: check and mask it once
            shared = context.inputs["edge_attr"]
            mask_in = self.check(x, pos, mask)
            edge_attr = context.get(("sft.edge_attr", self.edge_dim),
                                    lambda: _CheckedEdges(self._check_edge_attr(shared, x, mask_in)))
        if self.exportable:  # no host-side look at the data: checked eagerly, skipped while tracing
            return self._forward_general(x, pos, self.check(x, pos, mask), edge_attr=edge_attr)
        mask = self.validate(x, pos, mask)
        if mask is None and self.fast_path_applies(x):
            return self._forward_fast(x)
        return self._forward_general(x, pos, mask, edge_attr=edge_attr)

    def fused_residual(self, x: torch.Tensor, pos: torch.Tensor | None, mask: torch.Tensor | None,
                       norm: nn.Module | None = None) -> torch.Tensor | None:
        """``x + self(norm(x))`` by :meth:`_forward_fast` where it applies (:meth:`fast_path_applies`, a
        batch without padding), else None; the inputs are checked as :meth:`forward` does."""
        if self.exportable:
            return None
        if self.validate(x, pos, mask, who="sft block") is not None or not self.fast_path_applies(x):
            return None
        return self._forward_fast(x, residual=x, norm=norm)

    def check(self, x, pos, mask, who: str = "sft") -> torch.Tensor:
        """:func:`check_attention_inputs` with this module's pos requirement; returns the (B, N) mask."""
        if self.rpe == "points":
            return check_attention_inputs(x, pos, mask, dim=self.dim, requires_pos=True,
                                          min_pos_dim=self.normal_dims + 1, who=who)
        return check_attention_inputs(x, pos, mask, dim=self.dim, who=who)

    def validate(self, x, pos, mask, who: str = "sft") -> torch.Tensor | None:
        """Check the contract inputs once; returns the mask, or None when every point is real.

        The common case (no padding, or an all-True mask; finite x and pos) costs one reduction per
        tensor: a sum is finite only if every element is (NaN and inf propagate). Anything else
        goes through :func:`check_attention_inputs`, which raises the descriptive ``ValueError``
        (or, when the sum merely overflowed, returns the mask).
        """
        if is_tracing():  # eager-only checks (host reads break a compiled or exported graph)
            return mask
        B_N = x.shape[:2] if isinstance(x, torch.Tensor) and x.dim() == 3 else None
        if (B_N is not None and x.dtype in _FLOATS and x.shape[-1] == self.dim and x.numel() > 0
                and self._pos_well_formed(x, pos)
                and (mask is None or (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool
                                      and mask.shape == B_N and mask.device == x.device and bool(mask.all())))
                and bool(torch.isfinite(x.sum())) and (pos is None or bool(torch.isfinite(pos.sum())))):
            return None
        mask = self.check(x, pos, mask, who)
        return None if bool(mask.all()) else mask

    def _pos_well_formed(self, x, pos) -> bool:
        if pos is None:
            return self.rpe != "points"
        return (isinstance(pos, torch.Tensor) and pos.dim() == 3 and pos.shape[:2] == x.shape[:2]
                and pos.dtype in _FLOATS and pos.device == x.device
                and (self.rpe != "points" or pos.shape[-1] >= self.normal_dims + 1))

    def fast_path_applies(self, x: torch.Tensor) -> bool:
        """Inference kernels apply: eval, autograd off, CPU, no relative features, float32/64.

        (Only for inputs without padding: callers check that the mask is None.)
        """
        return (self.fast_inference and not self.training and not torch.is_grad_enabled() and self.rpe == "none"
                and not self.dense_reference and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64))

    def _forward_fast(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                      norm: nn.Module | None = None) -> torch.Tensor:
        """Eval/no-grad attention for a batch without padding (``rpe="none"``): ``residual + attn(norm(x))``.

        ``residual`` None adds nothing; ``norm`` None applies none (the pre-LN block passes its LN₁,
        applied here one sample at a time so that no normalised copy of the whole batch is made).
        Same mathematics as :meth:`_forward_general` (sampling is per cloud, so sample-by-sample is
        exact), laid out for the CPU: one sample at a time, its Qᵀ and attention map in reused
        cache-sized buffers, with the queries on the contiguous axis, i.e. on Qᵀ (h, d_h, N),
        Kᵀ/Vᵀ (h, d_h, k') and the attention map Aᵀ (h, k', N), so no transpose copy is needed (2-D
        GEMMs read transposed operands in place); the maxout is :func:`maxout_scores_t` with the
        1/√d_h folded into its channel sum; ReLU is in place; rows are normalised after ``P V``
        (d_h divisions per query instead of k'); biases and the residual are GEMM accumulators.
        """
        B, N, D = x.shape
        H, d = self.heads, self.head_dim
        wo = self.out_linear.weight.t()                                                # (h·d, D)
        if residual is None:
            out = self.out_linear.bias.expand(B, N, D).clone()
        else:
            out = residual + self.out_linear.bias
        num = None                                                                     # per-sample buffer
        scale = 1.0 / math.sqrt(d)
        for b in range(B):
            xb = x[b:b + 1] if norm is None else norm(x[b:b + 1])                      # (1, N, D)
            samp = self.sampler(xb, None)
            xs = gather_rows(xb, samp.idx_top)
            if not self.hard_eval:
                pcol = samp.p.unsqueeze(-1)
                xs = pcol * xs + (1 - pcol) * gather_rows(xb, samp.idx_rand)          # (1, k', D) duplets
            xs = xs[0]
            kk = xs.shape[0]
            if num is None:
                num = x.new_empty(H, kk, N)
            kt = fast_linear.linear(self.w_k, xs).t().reshape(H, d, kk)               # Kᵀ (small)
            vt = fast_linear.linear(self.w_v, xs).t().reshape(H, d, kk)               # Vᵀ
            qt = fast_linear.linear(self.w_q, xb[0]).t().contiguous()                  # Qᵀ (h·d, N)
            maxout_scores_t(qt.view(H, d, N), kt, scale=scale, out=num).relu_()        # (h, k', N)
            den = num.sum(1).add_(self.eps)                                            # (h, N)
            if self.leaky:
                if self.leak_mode == "per_key_sum":
                    den += F.softplus(self.w_c(xs)).sum(0)[:, None]                    # Σ_keys Softplus(C)
                else:
                    den += F.softplus(self.w_c(xb[0])).t()
            if kk <= d:
                # Associate as P (V Wₒᵀ): U_h = V_h Wₒ,ₕᵀ is (k' × D) per head, so the final GEMM over
                # [P_1 … P_h] (N × h·k') is no larger than the output projection and P·V disappears.
                num.div_(den.unsqueeze(1))                                             # P
                u = torch.matmul(vt.transpose(-1, -2), wo.view(H, d, D))              # (h, k', D)
                out[b] += fast_linear.matmul(num.view(H * kk, N).t(), u.view(H * kk, D))
            else:
                o = torch.bmm(vt, num).div_(den.unsqueeze(1))                          # (h, d, N) = (P V)ᵀ
                out[b] += fast_linear.linear(self.out_linear, o.view(H * d, N).t(), use_bias=False)
        return out

    def _forward_general(self, x, pos, mask, *, edge_attr=None) -> torch.Tensor:
        """The general path (training, autograd, padding, relative features, export mode); inputs
        already validated. mask (B, N) or None (no padding)."""
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if self.rpe == "graph":
            edge_attr = (edge_attr.tensor if isinstance(edge_attr, _CheckedEdges)
                         else self._check_edge_attr(edge_attr, x, mask))
        d = self.head_dim
        wd = work_dtype(x.dtype)
        keep = mask.unsqueeze(-1)
        x = x.masked_fill(~keep, 0.0)          # padding may hold anything; keep it out of every product
        if pos is not None:
            pos = pos.masked_fill(~keep, 0.0)

        samp = self.sampler(x, mask)
        if not self.training and self.hard_eval:
            pe = torch.ones_like(samp.p)
        elif self.training and self.hard:
            pe = 1.0 + (samp.p - samp.p.detach())       # forward S₁ alone, gradient through p
        else:
            pe = samp.p
        x1, x2 = gather_rows(x, samp.idx_top), gather_rows(x, samp.idx_rand)
        pcol = pe.unsqueeze(-1)
        xs = (pcol * x1.to(wd) + (1 - pcol) * x2.to(wd)).to(x.dtype)                 # (B, k', D) duplets

        q = self.heads_of(self.qk_dropout(self.w_q(x))).to(wd)     # (B, H, N, d)
        kt = self.heads_of(self.qk_dropout(self.w_k(xs))).to(wd)   # (B, H, k', d)
        v = self.heads_of(self.w_v(xs)).to(wd)

        if self.dense_reference:
            score = maxout_scores_dense(q, kt)
        elif self.exportable:
            score = maxout_by_channels(q, kt)
        else:
            score = maxout_scores(q, kt, self.chunk_elems)
        a = score / math.sqrt(d)                                                       # (B, H, N, k')
        if self.rpe != "none":
            mul_t, add_t, mul_r, add_r = self._relative_logits(samp, pos, edge_attr, x, wd)
            w_t = pe[:, None, None, :]
            r_mul = w_t * F.softplus(mul_t) + (1 - w_t) * F.softplus(mul_r)
            r_add = w_t * add_t + (1 - w_t) * add_r
            a = a * r_mul + r_add
        kv = samp.key_valid[:, None, None, :]
        num = F.relu(a).masked_fill(~kv, 0.0)
        den = num.sum(-1, keepdim=True) + self.eps
        if self.leaky:
            if self.leak_mode == "per_key_sum":
                c = F.softplus(self.w_c(xs).to(wd)).transpose(1, 2)                   # (B, H, k')
                den = den + c.masked_fill(~samp.key_valid[:, None, :], 0.0).sum(-1)[..., None, None]
            else:
                den = den + F.softplus(self.w_c(x).to(wd)).transpose(1, 2).unsqueeze(-1)  # (B, H, N, 1)
        return self.merge_heads(torch.matmul(num / den, v), mask, x.dtype)          # o (B, H, N, d)


# --------------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------------
def SFTBlock(dim: int, heads: int = 8, k: int = 256, norm_position: str = "pre", ffn_mult: int = 4,
             dropout: float = 0.0, ffn_dropout: float = 0.0, **attn_options) -> TransformerBlock:
    """SFT's layer: a LayerNorm :class:`~pointformers.nn.transformer_block.TransformerBlock` (Pre or
    Post, GeLU FFN ×``ffn_mult``) around :class:`SFTAttention`.

    Pre-LN:  x ← x + Drop(Attn(LN₁(x)));  x ← x + Drop(FFN(LN₂(x)))
    Post-LN: x ← LN₁(x + Drop(Attn(x)));  x ← LN₂(x + Drop(FFN(x)))

    Args:
        dim, heads, k: as :class:`SFTAttention`.
        norm_position: ``"pre"`` or ``"post"`` (the paper picks per experiment, Table 9).
        ffn_mult: FFN expansion (4).
        dropout: "token embedding dropout" after the attention and after the FFN.
        ffn_dropout: "feedforward dropout" after the FFN's expansion.
        **attn_options: passed to :class:`SFTAttention` (rpe, normal_dims, leaky, drop_token, ...).
    Shapes: x (B, N, D), pos (B, N, P), mask (B, N) -> (B, N, D), padded rows zero. ``edge_attr``
    reaches the attention through the forward context (``ForwardContext(edge_attr=...)``). In eval
    without autograd the block takes the fused inference path (:meth:`SFTAttention.fused_residual`)
    where it applies.
    """
    if norm_position not in ("pre", "post"):
        raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
    return TransformerBlock(dim, SFTAttention(dim, heads=heads, k=k, **attn_options), norm="layer",
                            norm_position=norm_position, activation="gelu", ffn_mult=ffn_mult, dropout=dropout,
                            ffn_dropout=ffn_dropout)
