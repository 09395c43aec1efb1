"""HEPT's point-transformer skeleton: encoder → pre-LN blocks → jumping-knowledge head.

The skeleton takes any registered attention mechanism, so HEPT and its baselines are
compared on the same architecture (as the paper does).
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import ForwardContext, build as build_attention, check_attention_inputs, entry as attention_entry
from ..attention import is_tracing, model_options
from ..data.batch import packed_layout, run_flat
from ..nn import MLP, TransformerBlock, allocator


#: The positional encodings of :class:`PointTransformerJK` (its ``pe``).
PE_KINDS = ("none", "learned", "learned-each-layer")


class PointTransformerJK(nn.Module):
    """Per-point embeddings from features and kernel coordinates (HEPT paper App. C.1, authors' code).

    Layers: feat_encoder Linear(in_dim, D) → ReLU → Linear(D, D) = h₀; ``n_layers`` pre-LN blocks
    h₁..h_L (:class:`~pointformers.nn.TransformerBlock`: LayerNorm, ReLU FFN of width D, residual
    dropout); jumping knowledge e = W[h₀ ‖ … ‖ h_L] (no bias); output e + Drop(MLP(e)) with a
    ``mlp_layers``-layer, ``mlp_hidden``-wide LayerNorm/tanh MLP.

    Args:
        in_dim: input features F. coord_dim: kernel coordinates c (η, φ first for HEPT).
        dim: width D; heads, head_dim: attention heads and per-head width.
        n_layers: blocks; out_dim: embedding size; dropout: residual/head dropout.
        attention: registry key of the token mixer; attention_options: its extra options.
        block_size, n_hashes, num_regions: HEPT options, passed to mechanisms that declare them
            among their registry ``model_options`` (HEPT).
        pe: "none" (HEPT: coordinates enter through its kernel) or "learned": the absolute
            positional encoding HEPT's transformer baselines use (authors' ``pe_type: learned``,
            HEPT paper Sec. 6.2): Linear(c, D) → LayerNorm → ReLU → Linear(D, D) of the coordinates, added to
            the encoded features h₀ once, before the first block. "learned-each-layer": the same
            encoding added to the input of every block (the track-reconstruction encoder of the
            HEPT authors' follow-up; the jumping-knowledge input h₀ holds it once).
        norm: the blocks' norm, "layer" (HEPT) or "rms" (the follow-up's pre-RMSNorm blocks).
        ffn: the blocks' feed-forward, "relu" (HEPT), "gelu" or "swiglu" (the follow-up; gated).
        ffn_hidden: its hidden width (default D, HEPT's).
        padding: how HEPT fills a cloud up to a multiple of ``block_size``. ``"mask"`` (default,
            this project's contract): padded rows take no part in attention, so a cloud's output
            does not depend on its batch or on the tensor width. ``"duplicate"``: the authors'
            code — the cloud is padded with copies of its own points (chosen as theirs, see
            :meth:`~pointformers.attention.HEPTRegions.duplicate_layout`) that attend and are
            attended to like any point, and sorts use PyTorch's default ``torch.argsort`` as
            theirs; the copies' outputs are dropped. Models loaded with
            :func:`~pointformers.models.from_reference_checkpoint` use it, so that their output at
            any point count equals the authors' for each cloud (batched clouds too).
    Shapes: forward(x (B, N, F), coords (B, N, c), mask (B, N) | None) -> (B, N, out_dim); PyG-style
    flat x (N, F), coords (N, c) with ``batch=`` (N,) or ``ptr=`` (B+1,) -> (N, out_dim). With HEPT in
    every layer, flat input is packed: each cloud padded only to a multiple of ``block_size``, the
    clouds end to end in one row (as the authors' code, whose region codes carry the cloud index),
    each cloud's result equal to its padded forward's; other mechanisms pad to the largest cloud.
    """

    #: The exported graph's inputs (see :mod:`pointformers.export`): one cloud's x (N, F) and coords (N, c).
    export_inputs = ("x", "coords")

    def __init__(self, in_dim: int, coord_dim: int, dim: int = 24, heads: int = 8, head_dim: int | None = 24,
                 n_layers: int = 4, out_dim: int = 12, mlp_hidden: int = 256, mlp_layers: int = 5,
                 dropout: float = 0.1, attention: str = "hept", block_size: int = 100, n_hashes: int = 3,
                 num_regions: float = 150, attention_options: dict | None = None, pe: str = "none",
                 padding: str = "mask", norm: str = "layer", ffn: str = "relu", ffn_hidden: int | None = None):
        super().__init__()
        if pe not in PE_KINDS:
            raise ValueError(f"pe: expected one of {PE_KINDS}, got {pe!r}")
        if norm not in ("layer", "rms"):
            raise ValueError(f"norm: expected 'layer' or 'rms', got {norm!r}")
        if ffn not in ("relu", "gelu", "swiglu"):
            raise ValueError(f"ffn: expected 'relu', 'gelu' or 'swiglu', got {ffn!r}")
        if ffn_hidden is not None and (not isinstance(ffn_hidden, int) or ffn_hidden < 1):
            raise ValueError(f"ffn_hidden: expected a positive int or None, got {ffn_hidden!r}")
        self.pe = pe
        if padding not in ("mask", "duplicate"):
            raise ValueError(f"padding: expected 'mask' or 'duplicate', got {padding!r}")
        spec = attention_entry(attention).info  # ValueError listing the mechanisms if unknown
        self.padding = padding
        self.in_dim, self.coord_dim, self.dim = in_dim, coord_dim, dim
        self.attention = attention
        opts = model_options(attention, attention_options, head_dim=head_dim, coord_dim=coord_dim,
                             block_size=block_size, n_hashes=n_hashes, num_regions=num_regions)
        # work the layers share across forward passes (HEPT's region counts): owned here once
        self.shared = spec.shared(dim=dim, heads=heads, **opts) if spec.shared is not None else None
        if self.shared is not None:
            opts["shared"] = self.shared
        if padding == "duplicate" and not hasattr(self.shared, "duplicate_layout"):
            raise ValueError(f"padding='duplicate' is the authors' HEPT padding: it needs attention='hept', "
                             f"got attention={attention!r}")
        self.feat_encoder = nn.Sequential(nn.Linear(in_dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.pos_encoder = (nn.Sequential(nn.Linear(coord_dim, dim), nn.LayerNorm(dim), nn.ReLU(), nn.Linear(dim, dim))
                            if pe != "none" else None)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, build_attention(attention, dim=dim, heads=heads, **opts), norm=norm,
                             norm_position="pre", activation=ffn, ffn_hidden=ffn_hidden or dim, dropout=dropout)
            for _ in range(n_layers))
        self.W = nn.Linear(dim * (n_layers + 1), out_dim, bias=False)
        self.mlp_out = MLP([out_dim] + [mlp_hidden] * (mlp_layers - 1) + [out_dim])
        self.dropout = nn.Dropout(dropout)

    def export_refusal(self) -> str | None:
        """Why this model cannot be exported as built, or None."""
        if self.padding == "duplicate":
            return ("padding='duplicate' reproduces the authors' padding through PyTorch's unstable sort order, "
                    "which no exported graph reproduces; load with padding='mask' (export's load_model does)")
        return None

    def forward(self, x: torch.Tensor, coords: torch.Tensor, mask: torch.Tensor | None = None, *,
                batch: torch.Tensor | None = None, ptr: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, F), coords (B, N, c), mask (B, N) -> (B, N, out_dim); or PyG-style flat x (N, F),
        coords (N, c) with ``batch`` (N,) sorted cloud indices or ``ptr`` offsets -> (N, out_dim)."""
        if batch is not None or ptr is not None:
            if mask is not None:
                raise ValueError("mask: flat input (batch= or ptr=) has no padding; give no mask")
            if self._packs_clouds():
                return self._forward_packed(x, coords, batch, ptr)
            return run_flat(self.forward, x, coords, batch, ptr)
        if x.dim() == 2:  # a single cloud (N, F)
            return self.forward(x[None], coords[None], None if mask is None else mask[None])[0]
        mask = self._check(x, coords, mask)
        if self.padding == "duplicate":
            return self._forward_duplicated(x, coords, mask)
        return self._trunk(x, coords, mask, ForwardContext(coords, mask))

    def _packs_clouds(self) -> bool:
        """Flat input is packed (each cloud padded to a multiple of the block size, clouds end to end
        in one row) when every layer's mixer keeps packed clouds apart (HEPT), outside export mode."""
        return (self.padding == "mask" and not is_tracing() and self.shared is not None
                and all(getattr(b.mixer, "packs_clouds", False) and not b.mixer.exportable for b in self.blocks))

    def _forward_packed(self, x: torch.Tensor, coords: torch.Tensor, batch, ptr) -> torch.Tensor:
        """Flat x (N, F), coords (N, c) packed (:func:`~pointformers.data.batch.packed_layout`) -> (N, out_dim);
        each cloud's output equals its padded forward's."""
        for name, t, width in (("x", x, self.in_dim), ("coords", coords, self.coord_dim)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[-1] != width or t.shape[0] != x.shape[0]:
                raise ValueError(f"{name}: with batch= or ptr= expected flat ({x.shape[0]}, {width}), got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        layout = packed_layout(x.shape[0], batch, ptr, multiple=self.shared.block_size, device=x.device)
        xp, cp, mp = layout.pad(x), layout.pad(coords), layout.mask()
        mp = self._check(xp, cp, mp)
        return layout.unpad(self._trunk(xp, cp, mp, ForwardContext(cp, mp, segments=layout.segments)))

    def _check(self, x: torch.Tensor, coords: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The padded forward's input checks; returns the (B, N) mask."""
        if x.dim() != 3 or x.shape[-1] != self.in_dim:
            raise ValueError(f"x: expected (B, N, {self.in_dim}) features, got shape {tuple(x.shape)}"
                             + (" — the feature count does not match this model (e.g. a loaded checkpoint)"
                                if x.dim() == 3 else ""))
        if coords is None or coords.dim() != 3 or coords.shape[-1] != self.coord_dim:
            raise ValueError(f"coords: expected (B, N, {self.coord_dim}) kernel coordinates "
                             f"(η and φ in columns 0 and 1), got "
                             f"{None if coords is None else tuple(coords.shape)}")
        return check_attention_inputs(x, coords, mask, dim=self.in_dim, pos_dim=self.coord_dim,
                                      requires_pos=True, who=type(self).__name__)

    def _trunk(self, x: torch.Tensor, coords: torch.Tensor, mask: torch.Tensor, context: ForwardContext) -> torch.Tensor:
        """Encoder, blocks and head on checked inputs; ``context`` carries what the layers share.
        Large clouds on the CPU keep freed memory for reuse meanwhile (:mod:`~pointformers.nn.allocator`)."""
        if allocator.large_cpu_input(x):
            with allocator.keep_freed_memory():
                return self._trunk_layers(x, coords, mask, context)
        return self._trunk_layers(x, coords, mask, context)

    def _trunk_layers(self, x: torch.Tensor, coords: torch.Tensor, mask: torch.Tensor,
                      context: ForwardContext) -> torch.Tensor:
        h = self.feat_encoder(x)
        p = self.pos_encoder(coords) if self.pos_encoder is not None else None
        if p is not None:
            h = h + p
        h = h * mask.unsqueeze(-1)
        hs = [h]
        for i, block in enumerate(self.blocks):
            if i > 0 and self.pe == "learned-each-layer":  # the encoding enters every block's input
                h = (h + p) * mask.unsqueeze(-1)
            h = block(h, coords, mask, context=context)
            hs.append(h)
        e = self.W(torch.cat(hs, -1))
        return (e + self.dropout(self.mlp_out(e))) * mask.unsqueeze(-1)

    def _forward_duplicated(self, x: torch.Tensor, coords: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``padding="duplicate"``: each cloud padded with copies of its points as the authors' code
        (:meth:`HEPTRegions.duplicate_layout`), the trunk on the padded rows, the copies' outputs
        dropped. (B, N, F), (B, N, c), (B, N) -> (B, N, out_dim)."""
        rows, pmask, prepared = self.shared.duplicate_layout(coords, mask)  # rows (B, P) source row per padded row
        B, P = rows.shape
        pick = lambda t: t.gather(1, rows[..., None].expand(-1, -1, t.shape[-1]))  # noqa: E731
        context = ForwardContext(pick(coords), pmask)
        context.put(self.shared, prepared)  # the layers' prepared state, keyed by the shared module
        y = self._trunk(pick(x), pick(coords), pmask, context)
        # the first n rows of cloud b are its real points in index order: put them back in place
        own = torch.arange(P, device=x.device)[None, :] < mask.sum(-1, keepdim=True)
        cloud = torch.arange(B, device=x.device)[:, None].expand(B, P)
        out = y.new_zeros(B, x.shape[1], y.shape[-1])
        out[cloud[own], rows[own]] = y[own]
        return out
