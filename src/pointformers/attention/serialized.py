"""Serialized patch attention: space-filling-curve order + dense attention in fixed-size patches.

The idea of Point Transformer V3 (Wu et al., CVPR 2024; FlatFormer, Liu et al. 2023, is its
axis-sorting cousin in HEPT's tables): instead of searching neighbours, sort each cloud's points
along a space-filling curve of their coordinates (:mod:`.space_filling`), cut the sorted
sequence into patches of ``patch_size`` points and run exact softmax attention
(``scaled_dot_product_attention``) inside each patch. Points close on the curve are close in
space, so a patch is a compact neighbourhood; cost is O(N·patch_size).

Per cloud: each cloud is sorted and cut on its own, so no patch spans two clouds; a cloud's
last patch is usually partial and its empty slots are masked. Only patches that hold real
points are computed (patches of all clouds are packed into one (T, patch_size) batch).

Curves vary across layers, so information crosses patch boundaries as layers stack:
``curve="auto"`` (default) picks ``CURVES[layer_index % 4]`` = z, z-trans, hilbert,
hilbert-trans (axes 0 and 1 swapped in the "-trans" ones), as PTv3 cycles its four
serializations; pass ``layer_index`` = the block's depth. ``shift=True`` additionally offsets the
patch boundaries by half a patch along the curve (the first patch of each cloud holds
``patch_size // 2`` points), the Swin-style shift, e.g. for two consecutive layers on one curve.
Not included from PTv3: its random shuffling of the curve order per forward, the xCPE
positional convolution, and fixed-size (metric) grids; the grid here is per cloud, ``2**bits``
cubic cells across the cloud's largest extent, so codes are translation- and scale-invariant.

Nothing is random. The order depends only on ``pos`` and the curve: a model can compute it once
per curve per forward pass (:meth:`SerializedAttention.serialize` or
:func:`.space_filling.serialize`) and pass it to its layers as ``order=``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import TokenMixer, check_attention_inputs
from .knn import masked_softmax_attention
from .registry import register
from .space_filling import CURVES, serialize


@register("serialized")
class SerializedAttention(TokenMixer):
    """Softmax attention within patches of consecutive points along a space-filling curve.

    Args:
        dim: model width D.
        heads: number of heads H.
        head_dim: per-head width d (default D // H, or D when H does not divide D).
        patch_size: points per patch (default 1024, PTv3's default).
        curve: ``"auto"`` (by ``layer_index``), or one of ``"z"``, ``"z-trans"``, ``"hilbert"``,
            ``"hilbert-trans"``.
        layer_index: the layer's depth; selects the curve when ``curve="auto"``.
        shift: offset patch boundaries by ``patch_size // 2`` along the curve.
        bits: grid bits per axis (default None: ``min(16, 62 // P)``).
        coord_dim: number of columns of ``pos`` (default None: any P, all columns used).
        bias: whether the q/k/v projections carry a bias (the output projection always does).
    Shapes: x (B, N, D), pos (B, N, P), mask (B, N) -> (B, N, D); ``order`` (B, N) int64 as
    returned by :meth:`serialize` replaces ``pos`` when given.
    """

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, patch_size: int = 1024,
                 curve: str = "auto", layer_index: int = 0, shift: bool = False, bits: int | None = None,
                 coord_dim: int | None = None, bias: bool = False):
        super().__init__(dim, heads)
        if not isinstance(patch_size, int) or patch_size < 1:
            raise ValueError(f"patch_size must be a positive int, got {patch_size!r}")
        if curve != "auto" and curve not in CURVES:
            raise ValueError(f"curve must be 'auto' or one of {CURVES}, got {curve!r}")
        if not isinstance(layer_index, int) or layer_index < 0:
            raise ValueError(f"layer_index must be a non-negative int, got {layer_index!r}")
        if coord_dim is not None and (not isinstance(coord_dim, int) or coord_dim < 1):
            raise ValueError(f"coord_dim must be a positive int or None, got {coord_dim!r}")
        if bits is not None and (not isinstance(bits, int) or bits < 1 or bits * (coord_dim or 1) > 62):
            raise ValueError(f"bits must be a positive int with bits·coord_dim <= 62, got {bits!r}")
        self.head_dim = head_dim or (dim // heads if dim % heads == 0 else dim)
        self.patch_size = patch_size
        self.curve = CURVES[layer_index % len(CURVES)] if curve == "auto" else curve
        self.layer_index = layer_index
        self.shift = bool(shift)
        self.bits = bits
        self.coord_dim = coord_dim
        self.scale = self.head_dim ** -0.5
        inner = heads * self.head_dim
        self.w_q = nn.Linear(dim, inner, bias=bias)
        self.w_k = nn.Linear(dim, inner, bias=bias)
        self.w_v = nn.Linear(dim, inner, bias=bias)
        self.out_linear = nn.Linear(inner, dim)

    @property
    def offset(self) -> int:
        """Empty slots before a cloud's first point: 0, or patch_size // 2 when shifted."""
        return self.patch_size // 2 if self.shift else 0

    def serialize(self, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """This layer's curve order. pos (B, N, P), mask (B, N) -> (B, N) int64, real points first."""
        if mask is None:
            mask = torch.ones(pos.shape[:2], dtype=torch.bool, device=pos.device)
        return serialize(pos, mask, self.curve, self.bits)

    def _inputs(self, x, pos, mask, order):
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, pos_dim=self.coord_dim,
                                      requires_pos=order is None, who="serialized")
        B, N = mask.shape
        if order is None:
            order = self.serialize(pos, mask)
        else:
            j = torch.arange(N, device=x.device).expand(B, N)
            if (not isinstance(order, torch.Tensor) or order.shape != (B, N) or order.dtype != torch.int64
                    or not torch.equal(order.sort(1).values, j)
                    or not torch.equal(mask.gather(1, order), j < mask.sum(1, keepdim=True))):
                raise ValueError("serialized: order must be an int64 (B, N) tensor whose rows are permutations "
                                 "of 0..N-1 listing each cloud's real points first")
        x = x.masked_fill(~mask[..., None], 0.0)  # padding may hold anything; keep it out of gradients
        return x, mask, order

    def _qkv(self, x):
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        return [w(x).view(B, N, H, d) for w in (self.w_q, self.w_k, self.w_v)]

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                order: torch.Tensor | None = None, **unused) -> torch.Tensor:
        x, mask, order = self._inputs(x, pos, mask, order)
        B, N, _ = x.shape
        H, d, S = self.heads, self.head_dim, self.patch_size
        dev = x.device
        # Slots: cloud b's sorted point j goes to slot first_b·S + offset + j of the packed patches.
        n = mask.sum(1)
        n_patches = (n + self.offset + S - 1) // S
        first = torch.cumsum(n_patches, 0) - n_patches
        T = int(n_patches.sum())
        j = torch.arange(N, device=dev).expand(B, N)
        real = j < n[:, None]
        slot = (first[:, None] * S + self.offset + j).masked_fill(~real, 0)  # (B, N) by sorted position
        row = order + torch.arange(B, device=dev)[:, None] * N  # flat row of the point at sorted position j
        dummy = B * N  # an extra all-zero row for empty slots
        src = torch.full((T * S,), dummy, dtype=torch.int64, device=dev)
        src[slot[real]] = row[real]
        point_slot = torch.zeros(B * N, dtype=torch.int64, device=dev)
        point_slot[row[real]] = slot[real]

        def patches(t):  # (B, N, H, d) -> (T, H, S, d)
            flat = torch.cat([t.reshape(B * N, H, d), t.new_zeros(1, H, d)])
            return flat.index_select(0, src).view(T, S, H, d).transpose(1, 2)

        q, k, v = (patches(t) for t in self._qkv(x))
        key_ok = (src != dummy).view(T, 1, 1, S)
        attn_mask = None if bool(key_ok.all()) else key_ok
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)  # (T, H, S, d)
        o = o.transpose(1, 2).reshape(T * S, H * d).index_select(0, point_slot).view(B, N, H * d)
        return self.zero_padding(self.out_linear(o), mask)

    def attention_pattern(self, mask: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Dense (B, N, N) bool: i and j are real points of one cloud in the same patch of ``order``."""
        B, N = mask.shape
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(N, device=mask.device).expand(B, N))
        patch = (rank + self.offset) // self.patch_size  # patch of every point, by its rank on the curve
        return (patch[:, :, None] == patch[:, None, :]) & mask[:, :, None] & mask[:, None, :]

    def reference(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                  order: torch.Tensor | None = None) -> torch.Tensor:
        """The same output by dense masked softmax over :meth:`attention_pattern` (O(N²), for tests)."""
        x, mask, order = self._inputs(x, pos, mask, order)
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x))
        o = masked_softmax_attention(q, k, v, self.attention_pattern(mask, order), self.scale)
        B, H, N, d = o.shape
        return self.zero_padding(self.out_linear(o.transpose(1, 2).reshape(B, N, H * d)), mask)
