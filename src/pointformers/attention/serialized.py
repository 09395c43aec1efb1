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

Nothing is random. The order depends only on ``pos``, the curve and ``bits``: it is the layer's
prepared state (:meth:`~.base.TokenMixer.prepare`), so the layers of one forward pass that share
a :class:`~.base.ForwardContext` and a curve sort the points once. An explicit order is passed the
same way (:meth:`SerializedAttention.use_order`).

Export mode (:func:`~.base.set_exportable`): the packed layout needs the number of non-empty
patches on the host, so the export path (:meth:`SerializedAttention._static_slots`) gives every
cloud the same P = ⌊(N + offset)/S⌋ + 2 patches by index arithmetic instead (its points in curve
order after ``offset`` empty slots, then padding and empty slots): the same patches of real
points, plus all-empty ones whose outputs are dropped. Both layouts feed one attention routine
(:meth:`SerializedAttention._attend_patches`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import ForwardContext, TokenMixer, check_attention_inputs, is_tracing
from .flop_count import FlopCount, dense_core, padded, projections
from .knn import masked_softmax_attention
from .registry import register
from .space_filling import CURVES, check_order, serialize


def serialized_flops(m: "SerializedAttention", n: int, dim: int, pos_dim: int | None = None) -> FlopCount:
    """Projections and dense attention inside patches: n rounded up to whole patches of S slots."""
    H, d = m.heads, m.head_dim
    f = FlopCount().add("projections", projections(n, dim, H, d))
    return f.add("attention", H * dense_core(padded(n, m.patch_size), d, d, keys=m.patch_size))


@register("serialized", flops=serialized_flops, bench={"patch_size": 1024, "coord_dim": 3})
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
    Shapes: x (B, N, D), pos (B, N, P), mask (B, N) -> (B, N, D); ``pos`` may be None when
    ``context`` already holds this layer's order (:meth:`use_order`, or an earlier layer).
    """

    _repr_fields = ("patch_size", "curve", "shift", "coord_dim")

    def __init__(self, dim: int, heads: int = 8, head_dim: int | None = None, patch_size: int = 1024,
                 curve: str = "auto", layer_index: int = 0, shift: bool = False, bits: int | None = None,
                 coord_dim: int | None = None, bias: bool = False, dropout: float = 0.0):
        super().__init__(dim, heads, dropout)
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
        self._init_projections(inner, bias)

    @property
    def offset(self) -> int:
        """Empty slots before a cloud's first point: 0, or patch_size // 2 when shifted."""
        return self.patch_size // 2 if self.shift else 0

    def serialize(self, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """This layer's curve order. pos (B, N, P), mask (B, N) -> (B, N) int64, real points first."""
        if mask is None:
            mask = torch.ones(pos.shape[:2], dtype=torch.bool, device=pos.device)
        return serialize(pos, mask, self.curve, self.bits)

    # ------------------------------------------------------------------ shared work
    def prepare(self, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The curve order, shared by the layers with this curve and grid: (B, N) int64."""
        return self.serialize(pos, mask)

    def prepare_key(self):
        return ("serialized", self.curve, self.bits)

    def use_order(self, context: ForwardContext, order: torch.Tensor, mask: torch.Tensor | None = None
                  ) -> ForwardContext:
        """Store an explicit ``order`` (B, N) int64 in ``context`` for this layer (and every layer
        with its :meth:`prepare_key`): rows are permutations of 0..N-1 listing each cloud's real
        points (``mask``, default all) first. ValueError if it is not one, or if ``context``
        already holds an order for this key. Returns ``context``."""
        if self.prepare_key() in context:
            raise ValueError("serialized: the context already holds an order for this layer's curve")
        order = check_order(order, mask, "serialized")
        context.get(self.prepare_key(), lambda: order)
        return context

    def _inputs(self, x, pos, mask, context):
        """Checked inputs: x with padding zeroed, the (B, N) mask and this layer's order."""
        has_order = context is not None and self.prepare_key() in context
        mask = check_attention_inputs(x, pos, mask, dim=self.dim, pos_dim=self.coord_dim,
                                      requires_pos=not has_order, who="serialized")
        order = self.prepared(pos, mask, context)
        if not is_tracing() and tuple(order.shape) != tuple(mask.shape):
            raise ValueError(f"serialized: the context's order is for {tuple(order.shape)} (B, N) points, "
                             f"got x {tuple(x.shape)}")
        x = x.masked_fill(~mask[..., None], 0.0)  # padding may hold anything; keep it out of gradients
        return x, mask, order

    def _qkv(self, x):
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        return [w(x).view(B, N, H, d) for w in (self.w_q, self.w_k, self.w_v)]

    # ------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context: ForwardContext | None = None) -> torch.Tensor:
        """x (B, N, D), pos (B, N, P), mask (B, N) -> (B, N, D)."""
        x, mask, order = self._inputs(x, pos, mask, context)
        # export mode, and under torch.compile: the static layout (the packed one reads a count on the host)
        static = self.exportable or is_tracing()
        src, point_slot = (self._static_slots if static else self._packed_slots)(order, mask)
        return self._attend_patches(x, mask, src, point_slot)

    def _packed_slots(self, order: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Only the patches that hold real points, packed over the batch (T of them, T read on the host).

        order (B, N), mask (B, N) -> src (T, S) flat point row of every slot (B·N: empty) and
        point_slot (B, N) the slot of every point (padded points: slot 0, their output is zeroed).
        Cloud b's sorted point j goes to slot first_b·S + offset + j."""
        B, N = order.shape
        S, dev = self.patch_size, order.device
        n = mask.sum(1)
        n_patches = (n + self.offset + S - 1) // S
        first = torch.cumsum(n_patches, 0) - n_patches
        T = int(n_patches.sum())
        j = torch.arange(N, device=dev).expand(B, N)
        real = j < n[:, None]
        slot = (first[:, None] * S + self.offset + j).masked_fill(~real, 0)  # (B, N) by sorted position
        row = order + torch.arange(B, device=dev)[:, None] * N  # flat row of the point at sorted position j
        src = torch.full((T * S,), B * N, dtype=torch.int64, device=dev)
        src[slot[real]] = row[real]
        point_slot = torch.zeros(B * N, dtype=torch.int64, device=dev)
        point_slot[row[real]] = slot[real]
        return src.view(T, S), point_slot.view(B, N)

    def _static_slots(self, order: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The export layout: P = ⌊(N + offset)/S⌋ + 2 patches per cloud, by index arithmetic (shapes
        static in N, nothing read on the host). The same patches of real points as :meth:`_packed_slots`.

        Cloud b's slots: ``offset`` empty, its points in curve order (padded ones as empty slots), then
        2·S empty. P patches cover every point and are always >= 2 (the exporter then needs no size-1
        special case); all-empty patches are computed and their outputs dropped."""
        B, N = order.shape
        S, off, dev = self.patch_size, self.offset, order.device
        dummy = B * N
        j = torch.arange(N, device=dev)
        rows = (order + (torch.arange(B, device=dev) * N).view(B, 1)).masked_fill(j >= mask.sum(1, keepdim=True), dummy)
        slots = torch.cat([torch.full((B, off), dummy, dtype=torch.int64, device=dev), rows,
                           torch.full((B, 2 * S), dummy, dtype=torch.int64, device=dev)], 1)
        blk = (torch.arange((N + off) // S + 2, device=dev) * S).unsqueeze(-1) + torch.arange(S, device=dev)  # (P, S)
        P = blk.shape[0]
        src = slots[:, blk].reshape(B * P, S)
        # the point at sorted position j of cloud b sits in slot b·P·S + off + j: invert the curve order
        slot = torch.empty_like(order).scatter(1, order, (j + off).expand(B, N))
        return src, slot + (torch.arange(B, device=dev) * (P * S)).view(B, 1)

    def _attend_patches(self, x: torch.Tensor, mask: torch.Tensor, src: torch.Tensor, point_slot: torch.Tensor
                        ) -> torch.Tensor:
        """Softmax attention inside patches. x (B, N, D) (padding zeroed), src (T, S) flat point row per
        slot (B·N = empty slot), point_slot (B, N) slot of every point -> (B, N, D), padded rows zero."""
        B, N, _ = x.shape
        H, d = self.heads, self.head_dim
        T, S = src.shape
        dummy = B * N

        def patches(t):  # (B, N, H, d) -> (T, H, S, d)
            flat = torch.cat([t.reshape(B * N, H, d), t.new_zeros(1, H, d)])  # + an all-zero row for empty slots
            if self.exportable or is_tracing():
                # indexing by the 2-D src keeps its (T, S) shape: no view with a symbolic T that the exporter
                # would have to prove divides the element count
                return flat[src].transpose(1, 2)
            return flat.index_select(0, src.reshape(-1)).view(T, S, H, d).transpose(1, 2)

        q, k, v = (patches(t) for t in self._qkv(x))
        key_ok = (src != dummy)[:, None, None, :]
        # the key mask only where a patch has empty slots; export mode cannot look (host read), so always
        attn_mask = key_ok if self.exportable or is_tracing() or not bool(key_ok.all()) else None
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)  # (T, H, S, d)
        o = o.transpose(1, 2).reshape(T * S, H * d).index_select(0, point_slot.reshape(B * N)).view(B, N, H * d)
        return self.zero_padding(self.out_linear(o), mask)

    def attention_pattern(self, mask: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """Dense (B, N, N) bool: i and j are real points of one cloud in the same patch of ``order``."""
        B, N = mask.shape
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(N, device=mask.device).expand(B, N))
        patch = (rank + self.offset) // self.patch_size  # patch of every point, by its rank on the curve
        return (patch[:, :, None] == patch[:, None, :]) & mask[:, :, None] & mask[:, None, :]

    def reference(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                  context: ForwardContext | None = None) -> torch.Tensor:
        """The same output by dense masked softmax over :meth:`attention_pattern` (O(N²), for tests)."""
        x, mask, order = self._inputs(x, pos, mask, context)
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x))
        return self.merge_heads(masked_softmax_attention(q, k, v, self.attention_pattern(mask, order), self.scale), mask)
