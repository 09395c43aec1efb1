"""Sampled Transformer point-set classifiers ("Sampled Transformer for Point Sets", Sec. 5.2–5.3).

* ``sampled-cls`` — :class:`SampledBasicClassifier`, the paper's "basic classification setting"
  (Sec. 5.2): two separate MLPs with hidden dims [64, 256] embed the normals (features) and the xyz
  (position); their outputs are **added** and fed to **one** transformer layer (Eq. 5: sampled
  Hamiltonian-cycle attention, h = 8 heads of d = 32, FFN width r = 256); the n × 256 output is
  max-pooled and **one FC layer** maps it to the classes. The attention is swappable
  (``attention="full" | "knn" | ...``, and ``attention_options={"mode": "sparse"}``): the paper's
  dense / kNN / sparse variants on the same layout (Tables 3–4).
* ``sampled-hier-cls`` — :class:`SampledHierarchicalClassifier`, the hierarchical model (Sec. 5.3) in
  the Point Transformer framework: every stage does farthest point sampling, kNN grouping, MLP + max
  pooling ("transition down") and transformer blocks with scalar attention. Paper: t = 5 stages,
  kNN k {8, 16, 16, 16, 16}, strides {4, 4, 4, 4, 4} (with 1024 points that leaves too few for
  k = 16, so we use the public Point Transformer code's [1, 4, 4, 4, 4]: the first stage keeps all
  points), dims {32, 64, 128, 256, 512}, blocks {2, 3, 4, 6, 3}; where the paper is silent, we end
  with a global max pool and an MLP classifier.

Paper option dicts: :data:`PAPER_BASIC`, :data:`PAPER_HIERARCHICAL`; the constructor defaults are
small. Inputs: ``x`` (B, N, F) per-point features (normals; F = ``in_dim``, 0 = none), ``pos``
(B, N, 3), ``mask`` (B, N).

Cycles. In training each sampled layer draws a fresh uniform random cycle per cloud (re-sampled
every batch, as the paper does). In ``eval()`` the default here (``eval_cycle="coordinates"``) orders
each cloud's real points by a seeded pseudo-random hash of their coordinates: the cycle is a fixed,
uniform-looking function of the *set* of points, so the classifier is exactly invariant to the
order in which the points are stored (and to padding) while keeping the attention pattern random
with respect to geometry. That is the mechanism's own option
(:class:`~pointformers.attention.sampled.SampledAttention`'s ``eval_cycle="coordinates"``,
:func:`~pointformers.attention.sampled.coordinate_cycle`), which the model sets for every mechanism
that takes an ``eval_cycle``; ``eval_cycle="attention"`` keeps the mechanism's own (sampled: its
seeded eval cycle, which depends on the point ranks: equivariant only in distribution).

The layout asks the mechanism, never its name: ``k`` (kNN's neighbours; for SAMSA and SFT their
sampled tokens) is the layout's neighbour count (16 in the basic classifier, the stage's
``neighbours`` in the hierarchical one) for every mechanism whose constructor takes it, unless
``attention_options`` sets it.
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import ForwardContext, build as build_attention, entry as attention_entry
from ..attention.sampled import coordinate_cycle  # noqa: F401  (its home before it moved to the mechanism)
from ..data.batch import accepts_flat_batch
from ..nn import TransformerBlock
from ..nn.model_inputs import check_point_inputs
from ..nn.pooling import masked_max
from .registry import register_model

#: The basic setting (Sec. 5.2): MLPs [64, 256]; one layer with h = 8, d = 32, r = 256; FC to 40 classes.
PAPER_BASIC = dict(num_classes=40, in_dim=3, dim=256, mlp_hidden=64, heads=8, head_dim=32, ffn_hidden=256)
#: The hierarchical model (Sec. 5.3 with Point Transformer's [1, 4, 4, 4, 4] strides).
PAPER_HIERARCHICAL = dict(num_classes=40, in_dim=3, dims=(32, 64, 128, 256, 512), blocks=(2, 3, 4, 6, 3),
                          neighbours=(8, 16, 16, 16, 16), strides=(1, 4, 4, 4, 4), head_dim=32)
_EVAL_CYCLES = ("coordinates", "attention")


# ------------------------------------------------------------------------------------------------
# cycles, farthest point sampling, kNN grouping
# ------------------------------------------------------------------------------------------------
def farthest_point_sample(pos: torch.Tensor, mask: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Farthest point sampling of ``counts[b]`` real points per cloud.

    pos (B, N, 3), mask (B, N), counts (B,) -> idx (B, M) int64 and valid (B, M) bool, M = max(counts).
    Starts from the real point farthest from the cloud's centroid (deterministic and independent of
    storage order up to ties), then repeatedly takes the real point with the largest distance to the
    chosen set. Entries j >= counts[b] are invalid (their index repeats a chosen point).
    """
    B, N, _ = pos.shape
    M = int(counts.max())
    p = pos.double().masked_fill(~mask.unsqueeze(-1), 0.0)
    centroid = p.sum(1, keepdim=True) / mask.sum(1).view(B, 1, 1)
    d0 = (p - centroid).pow(2).sum(-1).masked_fill(~mask, -1.0)
    idx = torch.empty(B, M, dtype=torch.long, device=pos.device)
    cur = d0.argmax(1)
    mind = torch.full((B, N), float("inf"), dtype=torch.float64, device=pos.device)
    rows = torch.arange(B, device=pos.device)
    for j in range(M):
        idx[:, j] = cur
        d = (p - p[rows, cur].unsqueeze(1)).pow(2).sum(-1)
        mind = torch.minimum(mind, d)
        cur = mind.masked_fill(~mask, -1.0).argmax(1)
    valid = torch.arange(M, device=pos.device)[None] < counts[:, None]
    return idx, valid


def knn_group(centres: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k nearest real points of every centre (itself included when it is a point of ``pos``).

    centres (B, M, 3), pos (B, N, 3), mask (B, N) -> idx (B, M, k') int64 and valid (B, M, k') bool,
    k' = min(k, N); neighbours beyond a cloud's real point count are invalid.
    """
    d = torch.cdist(centres.double(), pos.double().masked_fill(~mask.unsqueeze(-1), 0.0))
    d = d.masked_fill(~mask[:, None, :], float("inf"))
    kk = min(k, pos.shape[1])
    idx = d.topk(kk, dim=-1, largest=False).indices
    valid = torch.arange(kk, device=pos.device)[None, None] < mask.sum(1).view(-1, 1, 1)
    return idx, valid.expand(idx.shape)


def _gather_points(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t (B, N, C), idx (B, ...) -> (B, ..., C)."""
    B = t.shape[0]
    flat = idx.reshape(B, -1)
    out = t.gather(1, flat.unsqueeze(-1).expand(B, flat.shape[1], t.shape[-1]))
    return out.view(*idx.shape, t.shape[-1])


# ------------------------------------------------------------------------------------------------
# blocks
# ------------------------------------------------------------------------------------------------
def sampled_block(dim: int, mixer: nn.Module, ffn_hidden: int, layout: str = "paper") -> TransformerBlock:
    """The sampled transformer block (Eq. 5b/5d), or its pre-LN form, as a
    :class:`~pointformers.nn.TransformerBlock` (ReLU FFN of width ``ffn_hidden``, no dropout).

    ``layout="paper"``: y = x + Attn(x); y = y + W₂·ReLU(W₁y) (no norm, as Eq. 5).
    ``layout="pre_ln"``: y = x + Attn(LN(x)); y = y + W₂·ReLU(W₁·LN(y)) (Point-MAE style).
    Shapes: x (B, N, D), pos (B, N, 3), mask (B, N) -> (B, N, D), padded rows zero.
    """
    if layout not in ("paper", "pre_ln"):
        raise ValueError(f"layout must be 'paper' or 'pre_ln', got {layout!r}")
    return TransformerBlock(dim, mixer, norm="layer" if layout == "pre_ln" else "none", norm_position="pre",
                            activation="relu", ffn_hidden=ffn_hidden)


def _build_mixer(attention: str, dim: int, heads: int, head_dim: int, options: dict | None, eval_cycle: str,
                 knn_k: int | None = None):
    """The mixer ``attention`` with ``options``, completed by what the layout supplies to a mechanism
    that takes it: ``head_dim``, ``k`` = ``knn_k`` and, with ``eval_cycle="coordinates"``, its
    ``eval_cycle`` (which replaces one in ``options``: the model's option decides the eval cycle)."""
    entry = attention_entry(attention)
    opts = dict(options or {})
    opts.setdefault("head_dim", head_dim)
    if knn_k is not None and entry.accepts("k"):
        opts.setdefault("k", knn_k)
    if eval_cycle == "coordinates" and entry.accepts("eval_cycle"):
        opts["eval_cycle"] = "coordinates"
    return build_attention(attention, dim=dim, heads=heads, **opts)


# ------------------------------------------------------------------------------------------------
# the basic classifier
# ------------------------------------------------------------------------------------------------
class SampledBasicClassifier(nn.Module):
    """Basic setting: MLP(xyz) + MLP(features) → one sampled transformer layer → max pool → FC.

    Args:
        num_classes: C. in_dim: per-point feature channels (normals: 3; 0 = xyz only).
        dim: token width (paper 256); mlp_hidden: hidden width of both input MLPs (paper 64).
        heads, head_dim: h, d (paper 8, 32); ffn_hidden: r (paper 256).
        layout: ``"paper"`` (Eq. 5, no norm) or ``"pre_ln"`` (:func:`sampled_block`).
        attention: ``"sampled"`` (paper), or ``"full"``/``"knn"``/... for the same-layout variants;
            attention_options: extra mechanism options (e.g. ``{"mode": "sparse"}``, ``{"k": 8}``;
            a mechanism taking ``k`` gets 16 by default).
        eval_cycle: ``"coordinates"`` or ``"attention"`` (module docstring).
    Shapes: forward(x (B, N, F) | None, pos (B, N, 3), mask (B, N)) -> logits (B, C).
    """

    def __init__(self, num_classes: int = 40, in_dim: int = 3, dim: int = 32, mlp_hidden: int = 16, heads: int = 4,
                 head_dim: int = 8, ffn_hidden: int = 32, layout: str = "paper", attention: str = "sampled",
                 attention_options: dict | None = None, eval_cycle: str = "coordinates"):
        super().__init__()
        if eval_cycle not in _EVAL_CYCLES:
            raise ValueError(f"eval_cycle must be one of {_EVAL_CYCLES}, got {eval_cycle!r}")
        self.in_dim, self.eval_cycle = in_dim, eval_cycle
        self.pos_mlp = nn.Sequential(nn.Linear(3, mlp_hidden), nn.ReLU(), nn.Linear(mlp_hidden, dim))
        self.feat_mlp = nn.Sequential(nn.Linear(in_dim, mlp_hidden), nn.ReLU(), nn.Linear(mlp_hidden, dim)) \
            if in_dim else None
        self.block = sampled_block(dim, _build_mixer(attention, dim, heads, head_dim, attention_options, eval_cycle,
                                                     16), ffn_hidden, layout)
        self.fc = nn.Linear(dim, num_classes)

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        keep = mask.unsqueeze(-1)
        pos = pos.masked_fill(~keep, 0.0)
        h = self.pos_mlp(pos)                              # E = W_P·P, "added" to the features (X := X + E)
        if self.feat_mlp is not None:
            h = h + self.feat_mlp(x.masked_fill(~keep, 0.0))
        h = self.block(h, pos, mask, context=ForwardContext(pos, mask))
        return self.fc(masked_max(h, mask))


# ------------------------------------------------------------------------------------------------
# the hierarchical classifier
# ------------------------------------------------------------------------------------------------
class TransitionDown(nn.Module):
    """FPS to ⌈n/stride⌉ points, kNN grouping, MLP([p_j − p_c, f_j]) → LayerNorm → ReLU, max over the group."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, k: int):
        super().__init__()
        self.stride, self.k = stride, k
        self.mlp = nn.Sequential(nn.Linear(3 + in_dim, out_dim), nn.LayerNorm(out_dim), nn.ReLU())

    def forward(self, h: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        counts = torch.div(mask.sum(1) + self.stride - 1, self.stride, rounding_mode="floor")
        idx, valid = farthest_point_sample(pos, mask, counts)
        centres = _gather_points(pos, idx).masked_fill(~valid.unsqueeze(-1), 0.0)     # (B, M, 3)
        nb, nb_valid = knn_group(centres, pos, mask, self.k)                            # (B, M, k)
        rel = _gather_points(pos, nb) - centres.unsqueeze(2)
        g = self.mlp(torch.cat([rel, _gather_points(h, nb)], -1).to(h.dtype))          # (B, M, k, C)
        g = g.masked_fill(~nb_valid.unsqueeze(-1), float("-inf")).amax(2)
        return g.masked_fill(~valid.unsqueeze(-1), 0.0), centres, valid


class SampledHierarchicalClassifier(nn.Module):
    """Hierarchical point classifier with sampled attention in every stage (Point Transformer framework).

    Args:
        num_classes, in_dim: classes and per-point feature channels.
        dims, blocks, neighbours, strides: per stage width, number of blocks, kNN k, FPS stride
            (``strides[0]`` must be 1: the first stage embeds all points with an MLP).
        head_dim: per-head width (heads per stage = max(1, dim // head_dim)).
        ffn_mult: FFN hidden = ffn_mult · dim (Eq. 1c's r).
        attention: ``"sampled"`` (paper), ``"knn"`` (the paper's kNN attention, k = the stage's
            neighbours), ``"full"``, ...; attention_options: extra mechanism options.
        layout, eval_cycle: as :class:`SampledBasicClassifier` (default layout pre-LN: the paper's
            Eq. 5 block has no LayerNorm, and it does not say what its deeper models used).
    Every block adds the stage's absolute position embedding Linear(3, C)·xyz to its input (where the
    paper is silent on positional encoding in scalar attention, we add W_P·xyz at each block).
    Shapes: forward(x (B, N, F) | None, pos (B, N, 3), mask (B, N)) -> logits (B, C).
    """

    def __init__(self, num_classes: int = 40, in_dim: int = 3, dims: tuple[int, ...] = (16, 32),
                 blocks: tuple[int, ...] = (1, 1), neighbours: tuple[int, ...] = (4, 8),
                 strides: tuple[int, ...] = (1, 4), head_dim: int = 8, ffn_mult: int = 1,
                 attention: str = "sampled", attention_options: dict | None = None, layout: str = "pre_ln",
                 eval_cycle: str = "coordinates"):
        super().__init__()
        t = len(dims)
        if t == 0 or not (len(blocks) == len(neighbours) == len(strides) == t):
            raise ValueError(f"dims, blocks, neighbours and strides need one entry per stage, got lengths "
                             f"{len(dims)}, {len(blocks)}, {len(neighbours)}, {len(strides)}")
        if strides[0] != 1 or any(s < 1 for s in strides):
            raise ValueError(f"strides must be >= 1 with strides[0] == 1 (first stage keeps all points), got {strides}")
        if eval_cycle not in _EVAL_CYCLES:
            raise ValueError(f"eval_cycle must be one of {_EVAL_CYCLES}, got {eval_cycle!r}")
        self.in_dim, self.eval_cycle = in_dim, eval_cycle
        self.embed = nn.Sequential(nn.Linear(3 + in_dim, dims[0]), nn.LayerNorm(dims[0]), nn.ReLU(),
                                   nn.Linear(dims[0], dims[0]))
        self.downs = nn.ModuleList(TransitionDown(dims[i - 1], dims[i], strides[i], neighbours[i]) for i in range(1, t))
        self.pos_embeds = nn.ModuleList(nn.Linear(3, c) for c in dims)
        self.stages = nn.ModuleList(
            nn.ModuleList(sampled_block(c, _build_mixer(attention, c, max(1, c // head_dim), head_dim,
                                                        attention_options, eval_cycle, neighbours[i]),
                                        ffn_mult * c, layout) for _ in range(blocks[i]))
            for i, c in enumerate(dims))
        self.head = nn.Sequential(nn.Linear(dims[-1], dims[-1]), nn.ReLU(), nn.Linear(dims[-1], num_classes))

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        keep = mask.unsqueeze(-1)
        pos = pos.masked_fill(~keep, 0.0)
        inp = pos if x is None else torch.cat([pos, x.masked_fill(~keep, 0.0)], -1)
        h = self.embed(inp).masked_fill(~keep, 0.0)
        for i, blocks in enumerate(self.stages):
            if i > 0:
                h, pos, mask = self.downs[i - 1](h, pos, mask)
                pos = pos.to(h.dtype)
            pe = self.pos_embeds[i](pos)
            context = ForwardContext(pos, mask)
            for blk in blocks:
                h = blk(h + pe, pos, mask, context=context)
        return self.head(masked_max(h, mask))


@register_model("sampled-cls")
def sampled_cls(**options) -> SampledBasicClassifier:
    """Sampled Transformer basic classifier (paper options: :data:`PAPER_BASIC`)."""
    return SampledBasicClassifier(**options)


@register_model("sampled-hier-cls")
def sampled_hier_cls(**options) -> SampledHierarchicalClassifier:
    """Sampled Transformer hierarchical classifier (paper options: :data:`PAPER_HIERARCHICAL`)."""
    return SampledHierarchicalClassifier(**options)
