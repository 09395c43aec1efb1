"""Exact k-nearest-neighbour attention in coordinate space (Sampled Transformer paper, Def. B.1).

Each real point attends, with a softmax over scaled dot products, to its k Euclidean nearest
real neighbours in ``pos`` within its own cloud, itself always included (its own distance is
taken as −1, so duplicates of a point cannot push it out). ``k`` larger than a cloud's size is
clamped to that size: the cloud's every point is then attended to (dense attention).

The search is exact and chunked over queries: per chunk of ``c`` query rows one
``(B, c, N)`` distance block (``torch.cdist`` computed directly, not through the
‖a‖² − 2ab + ‖b‖² matrix product, so distances are exact to rounding and do not depend on
the batch they are computed in), then ``topk``. Peak memory of the search is
``O(B·c·N + B·N·k)``; the attention gathers keys/values per chunk too, so inference memory
is ``O(B·N·k)`` indices plus ``O(B·c·k·D)`` per chunk (training keeps the gathered chunks for the
backward pass: ``O(B·N·k·D)``). Time is ``O(N²·P)`` for the search, ``O(N·k·D)`` for attention.

Ties in distance at the k-th place are broken by ``topk`` (implementation-defined); with
real-valued coordinates they have probability zero, except exact duplicate points.

Nothing is random. The k-NN graph depends on ``pos`` and k only: it is the layer's prepared state
(:meth:`~.base.TokenMixer.prepare`), so the layers with equal k of one forward pass that share a
:class:`~.base.ForwardContext` search once.

No export path (see :data:`EXPORT_REFUSAL`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import ForwardContext, TokenMixer, check_attention_inputs
from .flop_count import FlopCount, dense_core, projections
from .registry import register

#: Distance entries per chunk of the neighbour search when ``chunk_size`` is not given (64 MiB in float32).
DEFAULT_CHUNK_ELEMS = 1 << 24

#: Why k-NN attention has no export path.
EXPORT_REFUSAL = ("its exact k-NN search loops over query chunks whose number depends on the point count "
                  "(chunk = 2^24 // N rows), which a static graph cannot express, and an unchunked search needs the "
                  "full N × N distance matrix (13 GiB at 60k points in float32)")


def masked_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                             scale: float) -> torch.Tensor:
    """Dense reference: softmax(q kᵀ·scale) v over the allowed keys only.

    q, k, v (B, H, N, d); allowed (B, N, N) bool (query, key) -> (B, H, N, d). A row with no
    allowed key gives zeros. O(N²) memory: for tests and small inputs.
    """
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    a = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return a @ v


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Scores and softmax run in at least float32 (bfloat16/float16 inputs)."""
    return torch.promote_types(dtype, torch.float32)


@dataclass
class KNNGraph:
    """Neighbours of every point: ``index`` (B, N, k') int64 point indices within the cloud,
    nearest first (column 0 is the point itself); ``valid`` (B, N, k') bool, False where a
    cloud has fewer than k' points (the slot then points at padding and is ignored)."""

    index: torch.Tensor
    valid: torch.Tensor


def knn_flops(m: "KNNAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """Projections, the exact search (3 per point pair and coordinate, no gradient) and every head's
    n queries against k' = min(k, n) keys. ``pos_dim``: coordinate columns (default coord_dim or 3)."""
    H, d = m.heads, m.head_dim
    k = min(m.k, n)
    P = pos_dim or m.coord_dim or 3
    f = FlopCount().add("projections", projections(n, dim, H, d))
    f.add("neighbour search (cdist, non-matmul)", 3 * n * n * P, grad=False)
    return f.add("attention", H * dense_core(n, d, d, keys=k))


@register("knn", flops=knn_flops, bench={"k": 16, "coord_dim": 3}, export=EXPORT_REFUSAL)
class KNNAttention(TokenMixer):
    """Softmax attention of every point over its k nearest neighbours (self included).

    Args:
        dim: model width D.
        heads: number of heads H.
        head_dim: per-head width d (default D // H, or D when H does not divide D).
        k: neighbours per point, self included (default 16, our choice; the paper
            does not give it). Clamped to each cloud's size.
        coord_dim: number of columns of ``pos`` (default None: any P >= 1, all columns used).
        bias: whether the q/k/v projections carry a bias (the output projection always does).
        chunk_size: query rows per chunk of the search and the attention (default None: as many
            as fit in 2**24 distance entries, ``max(1, 2**24 // (B·N))``). A speed/memory knob:
            results do not depend on it.
    Shapes: x (B, N, D), pos (B, N, P), mask (B, N) -> (B, N, D).
    """

    _repr_fields = ("k", "coord_dim")

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, k: int = 16,
                 coord_dim: int | None = None, bias: bool = False, chunk_size: int | None = None, dropout: float = 0.0):
        super().__init__(dim, heads, dropout)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if coord_dim is not None and (not isinstance(coord_dim, int) or coord_dim < 1):
            raise ValueError(f"coord_dim must be a positive int or None, got {coord_dim!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        self.k = k
        self.coord_dim = coord_dim
        self.chunk_size = chunk_size
        self.scale = self.head_dim ** -0.5
        inner = heads * self.head_dim
        self._init_projections(inner, bias)

    def _chunk(self, B: int, N: int) -> int:
        return self.chunk_size or max(1, DEFAULT_CHUNK_ELEMS // (B * N))

    @torch.no_grad()
    def knn_graph(self, pos: torch.Tensor, mask: torch.Tensor | None = None) -> KNNGraph:
        """Exact k-NN of every point among its cloud's real points. pos (B, N, P), mask (B, N)."""
        B, N, _ = pos.shape
        if mask is None:
            mask = torch.ones(B, N, dtype=torch.bool, device=pos.device)
        kk = min(self.k, N)
        p = pos.to(work_dtype(pos.dtype)).masked_fill(~mask[..., None], 0.0)
        c = self._chunk(B, N)
        index, valid = [], []
        for s in range(0, N, c):
            e = min(s + c, N)
            d = torch.cdist(p[:, s:e], p, compute_mode="donot_use_mm_for_euclid_dist")  # (B, c, N)
            d.masked_fill_(~mask[:, None, :], float("inf"))
            rows = torch.arange(e - s, device=pos.device)
            # Self first, whatever the duplicates; a padded query keeps itself too, so its
            # (discarded) softmax stays finite.
            d[:, rows, rows + s] = -1.0
            dist, idx = d.topk(kk, dim=-1, largest=False, sorted=True)
            index.append(idx)
            valid.append(torch.isfinite(dist))
        return KNNGraph(torch.cat(index, 1), torch.cat(valid, 1))

    def _qkv(self, x: torch.Tensor, mask: torch.Tensor):
        B, N, _ = x.shape
        x = x.masked_fill(~mask[..., None], 0.0)  # padding may hold anything; keep it out of gradients
        H, d = self.heads, self.head_dim
        return (self.w_q(x).view(B, N, H, d), self.w_k(x).view(B, N, H, d), self.w_v(x).view(B, N, H, d))

    def _check(self, x, pos, mask):
        return check_attention_inputs(x, pos, mask, dim=self.dim, pos_dim=self.coord_dim, requires_pos=True,
                                      who="knn")

    def prepare(self, pos: torch.Tensor, mask: torch.Tensor) -> KNNGraph:
        """The k-NN graph (:meth:`knn_graph`), shared by the layers with this k."""
        return self.knn_graph(pos, mask)

    def prepare_key(self):
        return ("knn", self.k)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context: ForwardContext | None = None) -> torch.Tensor:
        """x (B, N, D), pos (B, N, P) (required), mask (B, N) -> (B, N, D)."""
        mask = self._check(x, pos, mask)
        B, N, _ = x.shape
        graph = self.prepared(pos, mask, context)
        if graph.index.shape[:2] != (B, N) or graph.valid.shape != graph.index.shape:
            raise ValueError(f"knn: graph was built for {tuple(graph.index.shape[:2])} (B, N), got x {tuple(x.shape)}")
        q, k, v = self._qkv(x, mask)
        H, d = self.heads, self.head_dim
        kf, vf = k.reshape(B * N, H, d), v.reshape(B * N, H, d)
        offset = (torch.arange(B, device=x.device) * N).view(B, 1, 1)
        wd = work_dtype(x.dtype)
        c = self._chunk(B, N)
        outs = []
        for s in range(0, N, c):
            idx = graph.index[:, s:s + c]  # (B, c, k')
            rows = (idx + offset).reshape(-1)
            kn = kf.index_select(0, rows).view(*idx.shape, H, d)  # (B, c, k', H, d)
            vn = vf.index_select(0, rows).view(*idx.shape, H, d)
            scores = torch.einsum("bchd,bckhd->bchk", q[:, s:s + c].to(wd), kn.to(wd)) * self.scale
            scores = scores.masked_fill(~graph.valid[:, s:s + c, None, :], float("-inf"))
            a = torch.softmax(scores, dim=-1).to(x.dtype)
            outs.append(torch.einsum("bchk,bckhd->bchd", a, vn))
        o = torch.cat(outs, 1).reshape(B, N, H * d)
        return self.zero_padding(self.out_linear(o), mask)

    def attention_pattern(self, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Dense (B, N, N) bool: query i may attend key j. Built by a full sort of the distance
        matrix (slow, obviously correct): the min(k, n) nearest real points of a real i, self first."""
        B, N, _ = pos.shape
        p = pos.to(torch.float64).masked_fill(~mask[..., None], 0.0)
        d = ((p[:, :, None, :] - p[:, None, :, :]) ** 2).sum(-1)  # (B, N, N)
        d = d.masked_fill(~mask[:, None, :], float("inf"))
        d = d.masked_fill(torch.eye(N, dtype=torch.bool, device=pos.device), -1.0)
        ranks = torch.argsort(torch.argsort(d, dim=-1, stable=True), dim=-1)  # rank of key j for query i
        n = mask.sum(1).view(B, 1, 1)
        return (ranks < torch.clamp(n, max=self.k)) & mask[:, :, None] & mask[:, None, :]

    def reference(self, x: torch.Tensor, pos: torch.Tensor | None = None,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
        """The same output by dense masked softmax over :meth:`attention_pattern` (O(N²), for tests)."""
        mask = self._check(x, pos, mask)
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, mask))
        return self.merge_heads(masked_softmax_attention(q, k, v, self.attention_pattern(pos, mask), self.scale), mask)
