"""Sampled attention: softmax over {self, successor} on a random Hamiltonian cycle (Sampled Transformer).

The paper (§4, Eqs. 3–5) splits a randomly permuted set π into l subsets of n_s points that
overlap by one (a sliding window of size n_s and stride n_s − 1 over π, with wrap-around),
and within each subset every token attends to itself and to its successor (Eq. 4, with
Eq. 5a's reading: query k uses keys/values A_k = {k, k+1}; the last token only itself). Chained,
the subsets' paths form one Hamiltonian cycle π₁→π₂→…→π_n→π₁ over the set, and drawing π
uniformly draws a uniform random directed cycle: every ordered pair a→b (a ≠ b) is an edge
with probability 1/(n − 1).

Kernels (``kernel=``):

* ``"roll"`` (default, O(n)): every point attends to itself and to its successor on the cycle
  (π rolled by one within each cloud), softmax over the two scores. This equals the literal
  subsets evaluated in parallel with each duplicated boundary element's self-only output
  dropped, and so does not depend on n_s. Without autograd it walks each cycle in cache-sized
  chunks (``_roll_along_cycle``); with autograd it runs batched over all points.
* ``"subsets"`` (reference, slow): the literal construction of Eqs. 3–4 — :func:`literal_subsets`
  cuts π into R¹…R^l of n_s − 1 points (the last one shorter when (n_s − 1) ∤ n), forms
  X^i = R^i ∪ {first point of R^{i+1}}, runs the shared projections and a dense softmax under the
  Eq. 4 path mask on each X^i, keeps the first |R^i| outputs. Used by tests to check the kernel.
  The paper's sequential composition (Eq. 5c, used only in its proof) is not implemented.

Cycles (``mode=``):

* ``"sampled"``: in training a fresh uniform permutation per forward, per cloud
  (``perm_scope="sample"``; ``"batch"`` shares one draw over the batch's ranks) and per layer (each
  module draws its own, from the global torch RNG, so ``torch.manual_seed`` reproduces a run). In
  ``eval()`` the cycle is *seeded* (``eval_cycle="seeded"``, default): for a cloud of n points it is
  ``randperm(n)`` from a private generator seeded with (``seed``, n), where ``seed`` is drawn once at
  init from the global RNG (or given) and saved in the state_dict. The eval output is therefore
  deterministic, independent of the global RNG and of the other clouds in the batch, and differs
  between layers. ``eval_cycle="random"`` keeps drawing fresh cycles in eval (a
  Monte-Carlo test-time option; the paper does not say how it evaluates).
  ``eval_cycle="coordinates"`` orders each cloud's real points in eval by a seeded pseudo-random
  hash of their coordinates (:func:`coordinate_cycle`, seeded with ``seed``): a fixed,
  uniform-looking function of the *set* of points, so the layer is exactly equivariant to the
  order in which the points are stored (and blind to padding) while the attention pattern stays
  random with respect to geometry (the point classifiers' default; the layer then needs ``pos``
  in eval).
* ``"sparse"``: the fixed cycle through the real points in input (index) order, wrapping round,
  in training and eval alike: the paper's "sparse attention" baseline (Tables 3–4). It is not
  permutation-equivariant; do not shuffle points in the loader if you want it fixed.

Cycles are over each cloud's real points only, taken by rank (the j-th real point of the row),
so padding, its position and the other clouds never change a cloud's cycle. The cycle is the
layer's prepared state (:meth:`~.base.TokenMixer.prepare`): each layer draws its own, except in
``mode="sparse"``, whose fixed cycle the layers of one :class:`~.base.ForwardContext` share. An
explicit cycle is passed through the context (:meth:`SampledAttention.use_order`): (B, N) int64,
row b a permutation of 0..N−1 whose first n_b entries are cloud b's real points in cycle order.

No export path (see :data:`EXPORT_REFUSAL`).

Equivariance: with an explicit cycle, permuting the points by σ and relabelling the cycle
accordingly permutes the output by σ exactly. With sampled cycles the output is equivariant in
distribution (the cycle is uniform, whatever the labels); a seeded eval cycle is a fixed function of
the ranks, so it is not; a coordinate eval cycle is a function of the point set, so it is exactly.

We depart from Eq. 1, which has no scale: scores are scaled by 1/√d (as in standard attention; pass ``scale=1.0``
for the literal equations). The module returns the mixer output only; the block adds the
residual of Eq. 5b.
"""
from __future__ import annotations

import math

import torch

from .base import ForwardContext, TokenMixer, check_attention_inputs
from .flop_count import FlopCount, dense_core, projections
from .knn import masked_softmax_attention, work_dtype
from .registry import register
from .space_filling import check_order

#: Why sampled attention has no export path.
EXPORT_REFUSAL = ("its eval cycle is randperm(n) drawn from a CPU torch.Generator seeded with (seed, n), a new "
                  "random permutation for every point count that no ONNX/graph op reproduces (mode='sparse' has "
                  "no export path either)")

_MODES = ("sampled", "sparse")
_KERNELS = ("roll", "subsets")
_SCOPES = ("sample", "batch")
_EVAL_CYCLES = ("seeded", "random", "coordinates")


def literal_subsets(order: torch.Tensor, n_s: int) -> list[torch.Tensor]:
    """Eq. 3: the subsets X^i = R^i ∪ {R^{γ(i)}₁} of one cycle order.

    order (n,) int64 (π), n_s >= 2 -> list of l index tensors; subset i holds the n_s − 1 points of
    R^i (fewer for the last one when (n_s − 1) ∤ n) followed by the first point of R^{i+1 mod l}.
    """
    if not isinstance(n_s, int) or n_s < 2:
        raise ValueError(f"n_s must be an int >= 2, got {n_s!r}")
    chunks = torch.split(order, n_s - 1)
    return [torch.cat([r, chunks[(i + 1) % len(chunks)][:1]]) for i, r in enumerate(chunks)]


def successors(order: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Successor of every point on its cloud's cycle. order (B, N), mask (B, N) -> (B, N) int64.

    ``succ[b, order[b, j]] = order[b, (j + 1) mod n_b]`` for j < n_b; a padded point is its own successor.
    """
    B, N = order.shape
    n = mask.sum(1, keepdim=True)
    j = torch.arange(N, device=order.device).expand(B, N)
    nxt = torch.where(j < n, (j + 1) % n.clamp_min(1), j)
    return torch.empty_like(order).scatter_(1, order, order.gather(1, nxt))


def _real_first(mask: torch.Tensor) -> torch.Tensor:
    """(B, N): each row's real point indices in ascending order, then its padded ones."""
    return torch.argsort((~mask).to(torch.int8), dim=1, stable=True)


def coordinate_cycle(pos: torch.Tensor, mask: torch.Tensor, seed: int) -> torch.Tensor:
    """A cycle through each cloud's real points, ordered by a seeded hash of the coordinates.

    pos (B, N, P), mask (B, N) -> order (B, N) int64: row b lists cloud b's real points in cycle order,
    then its padded points (the format of :meth:`SampledAttention.use_order`). The hash
    ``frac(sin(pos·w + c)·43758.5453)`` (w, c drawn from ``seed``) depends on a point's coordinates
    only, so permuting the points permutes the order consistently; distinct points get distinct keys
    almost surely (ties, e.g. duplicated points, fall back to index order).
    """
    g = torch.Generator().manual_seed(int(seed) % (1 << 63))
    w = (torch.rand(pos.shape[-1], generator=g, dtype=torch.float64) * 2 - 1) * 97.0
    c = float(torch.rand((), generator=g, dtype=torch.float64)) * 2 * math.pi
    key = torch.frac(torch.sin(pos.double() @ w.to(pos.device) + c).abs() * 43758.5453)
    key = key.masked_fill(~mask, 2.0)                                 # padding after all real points
    return torch.argsort(key, dim=1, stable=True)


def sampled_flops(m: "SampledAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """Projections and every query against 2 keys (itself and its successor), without the
    denominator column (the softmax is over two scores)."""
    H, d = m.heads, m.head_dim
    f = FlopCount().add("projections", projections(n, dim, H, d))
    return f.add("attention", H * dense_core(n, d, d, keys=2) - H * 2 * n * 2)


@register("sampled", flops=sampled_flops, bench={}, export=EXPORT_REFUSAL)
class SampledAttention(TokenMixer):
    """Random Hamiltonian-cycle attention: each point attends to itself and its cycle successor.

    Args:
        dim: model width D (the paper: 256).
        heads: number of heads h (the paper: 8).
        head_dim: per-head width d (paper: 32; default D // h, or D when h does not divide D).
        mode: ``"sampled"`` (random cycles) or ``"sparse"`` (fixed input-order cycle).
        kernel: ``"roll"`` (O(n)) or ``"subsets"`` (the literal Eq. 3–4 construction, reference).
        n_s: subset size for ``kernel="subsets"`` (default None: n + 1, a single subset); the
            roll kernel's output does not depend on it.
        perm_scope: ``"sample"`` (a cycle per cloud) or ``"batch"`` (one draw of random keys over
            ranks shared by the batch: clouds of equal size share the cycle).
        eval_cycle: the cycle in eval: ``"seeded"`` (deterministic per cloud size), ``"random"``
            (fresh draws) or ``"coordinates"`` (a seeded hash of the point coordinates, needs
            ``pos``: exactly equivariant; module docstring).
        seed: the eval-cycle seed (default None: drawn from the global torch RNG at init).
        scale: score scale (default 1/√d).
        bias: whether the q/k/v projections carry a bias (the output projection always does).
    Shapes: x (B, N, D), mask (B, N) -> (B, N, D). ``pos`` (B, N, P) is accepted and ignored (the
    paper adds a positional embedding to x before the layer), except by ``eval_cycle="coordinates"``
    in eval, which orders the points by it.
    """

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, mode: str = "sampled",
                 kernel: str = "roll", n_s: int | None = None, perm_scope: str = "sample",
                 eval_cycle: str = "seeded", seed: int | None = None, scale: float | None = None,
                 bias: bool = False, dropout: float = 0.0):
        super().__init__(dim, heads, dropout)
        for name, value, allowed in (("mode", mode, _MODES), ("kernel", kernel, _KERNELS),
                                     ("perm_scope", perm_scope, _SCOPES), ("eval_cycle", eval_cycle, _EVAL_CYCLES)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if n_s is not None and (not isinstance(n_s, int) or n_s < 2):
            raise ValueError(f"n_s must be an int >= 2 or None, got {n_s!r}")
        self.mode, self.kernel, self.n_s = mode, kernel, n_s
        self.perm_scope, self.eval_cycle = perm_scope, eval_cycle
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        self.scale = self.head_dim ** -0.5 if scale is None else float(scale)
        inner = heads * self.head_dim
        self._init_projections(inner, bias)
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        self.register_buffer("seed", torch.tensor(int(seed), dtype=torch.int64))

    # ----------------------------------------------------------------------------- cycles
    def cycle_order(self, mask: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Draw the cycles for a batch. mask (B, N) bool -> order (B, N) int64 (see module doc).

        ``pos`` (B, N, P): the coordinates that ``eval_cycle="coordinates"`` orders the points by in
        eval (:func:`coordinate_cycle`; required there, ignored otherwise)."""
        if self.mode == "sampled" and self.eval_cycle == "coordinates" and not self.training:
            if pos is None:
                raise ValueError("sampled: eval_cycle='coordinates' orders the points by their coordinates; "
                                 "pos (B, N, P) is required in eval")
            return coordinate_cycle(pos, mask, int(self.seed))
        B, N = mask.shape
        dev = mask.device
        n = mask.sum(1, keepdim=True)
        ranks = torch.arange(N, device=dev).expand(B, N)
        if self.mode == "sparse":
            rank_perm = ranks
        elif self.training or self.eval_cycle == "random":
            # float64 keys: ties (which argsort would break by position) are negligible even at 1e6 points
            keys = (torch.rand(B, N, dtype=torch.float64, device=dev) if self.perm_scope == "sample"
                    else torch.rand(N, dtype=torch.float64, device=dev).expand(B, N))
            rank_perm = keys.masked_fill(ranks >= n, 2.0).argsort(dim=1)
        else:
            rank_perm = ranks.clone()
            sizes = n.squeeze(1)
            for size in torch.unique(sizes).tolist():
                g = torch.Generator().manual_seed((int(self.seed) * 1_000_003 + size) % (1 << 63))
                p = torch.randperm(size, generator=g).to(dev)
                rank_perm[sizes == size, :size] = p
        return _real_first(mask).gather(1, rank_perm)

    def prepare(self, pos: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
        """This layer's cycles (:meth:`cycle_order`), (B, N) int64."""
        return self.cycle_order(mask, pos)

    def prepare_key(self):
        # the sparse cycle is the same for every layer; sampled cycles are each layer's own draw
        return ("sampled", "sparse") if self.mode == "sparse" else super().prepare_key()

    def use_order(self, context: ForwardContext, order: torch.Tensor, mask: torch.Tensor | None = None
                  ) -> ForwardContext:
        """Store an explicit cycle ``order`` (B, N) int64 in ``context`` for this layer (and every
        layer with its :meth:`prepare_key`): rows are permutations of 0..N-1 listing each cloud's real
        points (``mask``, default all) first, in cycle order. ValueError if it is not one, or if
        ``context`` already holds this layer's cycle. Returns ``context``."""
        if self.prepare_key() in context:
            raise ValueError("sampled: the context already holds this layer's cycle")
        order = check_order(order, mask, "sampled")
        context.get(self.prepare_key(), lambda: order)
        return context

    # ----------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context: ForwardContext | None = None) -> torch.Tensor:
        """x (B, N, D), mask (B, N) -> (B, N, D); the cycle comes from ``context`` when it holds one."""
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, who="sampled")
        order = self.prepared(pos, mask, context)
        if tuple(order.shape) != tuple(mask.shape):
            raise ValueError(f"sampled: the context's cycle is for {tuple(order.shape)} (B, N) points, "
                             f"got x {tuple(x.shape)}")
        if self.kernel == "roll" and not torch.is_grad_enabled():
            return self._roll_along_cycle(x, mask, order)  # reads real rows only: no masked copy of x
        x = x.masked_fill(~mask[..., None], 0.0)  # padding may hold anything; keep it out of gradients
        if self.kernel == "subsets":
            return self.zero_padding(self._subsets(x, mask, order), mask)
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        q = self.w_q(x).view(B, N, H, d)
        k = self.w_k(x).view(B * N, H, d)
        v = self.w_v(x).view(B * N, H, d)
        rows = (successors(order, mask) + torch.arange(B, device=x.device)[:, None] * N).reshape(-1)
        k_next = k.index_select(0, rows).view(B, N, H, d)
        v_next = v.index_select(0, rows).view(B, N, H, d)
        k, v = k.view(B, N, H, d), v.view(B, N, H, d)
        o = self._self_and_successor(q, k, k_next, v, v_next)
        return self.zero_padding(self.out_linear(o.reshape(B, N, H * d)), mask)

    def _self_and_successor(self, q, k, k_next, v, v_next) -> torch.Tensor:
        """Softmax attention of each query over A_k = {k, k+1}: q, k, k_next, v, v_next (..., H, d) -> (..., H, d).
        Scores in at least float32 (work_dtype)."""
        wd = work_dtype(q.dtype)
        qw = q.to(wd)
        s = torch.stack([(qw * k.to(wd)).sum(-1), (qw * k_next.to(wd)).sum(-1)], -1) * self.scale  # (..., H, 2)
        a = torch.softmax(s, dim=-1).to(v.dtype)
        return a[..., :1] * v + a[..., 1:] * v_next

    def _roll_along_cycle(self, x: torch.Tensor, mask: torch.Tensor, order: torch.Tensor,
                          chunk: int = 2048) -> torch.Tensor:
        """The roll kernel without autograd, walking each cycle in chunks of ``chunk`` points.

        In cycle order a point's successor is simply the next row, so a chunk needs its own points
        plus one (the next chunk's first point; the cycle's first point after its last): gather
        those rows of x once, project them, attend, project out and write the chunk's rows of the
        output. Every intermediate is chunk-sized and stays in cache, which keeps the time per
        point flat as N grows; the batched path (used with autograd) instead makes ~10 passes
        over (N, h, d) tensors that leave the cache once N is in the tens of thousands. Same
        arithmetic per point as the batched path.
        """
        B, N, D = x.shape
        H, d = self.heads, self.head_dim
        out = x.new_zeros(B, N, D)                                                     # padded rows stay 0
        n_real = mask.sum(1).tolist()
        for b in range(B):
            n = n_real[b]
            cyc = order[b, :n]
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                nxt = cyc[e:e + 1] if e < n else cyc[:1]
                idx = torch.cat([cyc[s:e], nxt])
                xc = x[b].index_select(0, idx)                                         # (m + 1, D)
                m = e - s
                q = self.w_q(xc[:m]).view(m, H, d)
                k = self.w_k(xc).view(m + 1, H, d)
                v = self.w_v(xc).view(m + 1, H, d)
                o = self._self_and_successor(q, k[:m], k[1:], v[:m], v[1:])           # successor = next row
                # .to: under autocast out_linear returns bf16 into the float32 output
                out[b].index_copy_(0, cyc[s:e], self.out_linear(o.reshape(m, H * d)).to(out.dtype))
        return out

    def _subsets(self, x: torch.Tensor, mask: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """The literal Eq. 3–5a construction, parallel form, one cloud and one subset at a time."""
        B, N, D = x.shape
        H, d = self.heads, self.head_dim
        n_real = mask.sum(1).tolist()
        ys = []
        for b in range(B):
            n = n_real[b]
            n_s = min(self.n_s or n + 1, n + 1)
            idx_all, out_all = [], []
            for idx in literal_subsets(order[b, :n], n_s):
                m = idx.numel()
                xi = x[b, idx]  # X^i (m, D), shared weights
                q, k, v = (w(xi).view(1, m, H, d).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
                path = torch.eye(m, dtype=torch.bool, device=x.device) | torch.eye(m, dtype=torch.bool,
                                                                                     device=x.device).roll(1, 1)
                path[-1, 0] = False  # Eq. 4: A_k = {k, k+1} for k < n_s, A_{n_s} = {n_s}
                o = masked_softmax_attention(q, k, v, path[None], self.scale)
                out = self.out_linear(o.transpose(1, 2).reshape(m, H * d))
                idx_all.append(idx[:-1])
                out_all.append(out[:-1])  # the duplicated boundary point's self-only output is dropped
            ys.append(x.new_zeros(N, D).index_copy(0, torch.cat(idx_all), torch.cat(out_all)))
        return torch.stack(ys)
