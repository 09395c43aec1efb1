"""SAMSA models for point clouds and sequences (SAMSA paper, Lenhat et al., Sec. 5 and App. B).

The backbone is SAMSA's Algorithm-1 layer stack (:class:`SAMSAEncoder` of
:func:`~pointformers.attention.samsa.SAMSABlock`:
pre-RMSNorm, per-head sampled softmax attention with 2k support vectors, GELU FFN ×4 in parallel,
one zero-initialised ReZero scalar shared by all layers), followed by a final RMSNorm and a task head.
The paper gives no width, depth, heads, pooling or positional encoding; where it is silent, we use
one shared backbone, D = 256, H = 4, L = 6, with the paper's k ∈ {128, 256, 512} per head and hard
or soft sampling (:data:`PAPER_BACKBONE`). Constructor defaults are small so tests run in seconds.

* ``samsa-cls`` — :class:`SAMSAPointClassifier`: tokens = points (``Linear([xyz, features]) → D``, no
  positional encoding: coordinates are features, which keeps permutation equivariance); masked
  max ‖ mean pooling → MLP → classes (the paper gives no head; where it is silent, we pool so).
* ``samsa-partseg`` — :class:`SAMSAPartSegmenter`: per-point MLP head on the tokens plus a learned
  embedding of the object category (not in the paper; standard practice for ShapeNetPart).
* ``samsa-seq`` — :class:`SAMSASequenceClassifier`: one-hot tokens (≡ an embedding) plus a learned
  absolute position embedding (the paper names no positional encoding), masked mean pooling → MLP → classes (LRA, e.g. ListOps).

``attention="full"`` (or another registry key) gives the full-attention twin: the very same blocks
(RMSNorm, ReZero, FFN) with SAMSA's sampled attention replaced by that mechanism ("Full Attention"
column of SAMSA Table 1; :class:`SAMSAEncoder`); it gets the model's ``k`` if its constructor
takes one (``mode`` is SAMSA's sampling mode and stays SAMSA's), ``attention_options`` win.
Randomness: Gumbel noise in training only; ``eval()`` is deterministic.
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import build as build_attention, entry as attention_entry
from ..attention.samsa import SAMSAAttention, SAMSABlock
from ..attention.sft import sinusoid_1d
from ..data.batch import accepts_flat_batch, accepts_flat_inputs
from ..nn import RMSNorm
from ..nn.model_inputs import check_point_inputs, check_token_inputs
from ..nn.pooling import masked_max, masked_mean
from .registry import register_model
from .sft_models import check_category

#: Our shared SAMSA backbone where the paper is silent (it states only k per head and the mode).
PAPER_BACKBONE = dict(dim=256, depth=6, heads=4, k=256, mode="hard")


class SAMSAEncoder(nn.Module):
    """A stack of SAMSA layers (:func:`~pointformers.attention.samsa.SAMSABlock`) sharing one ReZero
    scalar α (init 0) across all layers (``alpha``, registered here once).

    Args:
        dim, depth, heads, k: width, layers, heads and SAMSA's sampled tokens per head.
        attention: the layers' token mixer, a registry key (default ``"samsa"``). Another mechanism
            replaces SAMSA's in every layer (the twin): the layers are built with a k = 1 SAMSA
            mixer first, which the replacement discards, so that every other module keeps the
            initialisation it has always had (seeded twins unchanged); it gets ``k`` if its
            constructor takes one.
        mixer_options: options of the mixer (win over ``k``).
        **block_options: for every :func:`~pointformers.attention.samsa.SAMSABlock` (parallel,
            ffn_mult, dropout and the :class:`~pointformers.attention.samsa.SAMSAAttention` options,
            e.g. mode, score_input; a twin's discarded SAMSA mixers get them too).
    Shapes: x (B, N, D), mask (B, N) -> (B, N, D).
    """

    def __init__(self, dim: int, depth: int, heads: int = 4, k: int = 256, attention: str = "samsa",
                 mixer_options: dict | None = None, **block_options):
        super().__init__()
        mechanism = attention_entry(attention)
        opts = {"k": k} if mechanism.accepts("k") else {}
        opts.update(mixer_options or {})
        own = mechanism.factory is SAMSAAttention   # the layer's own mixer: built in place
        self.alpha = nn.Parameter(torch.zeros(()))
        self.blocks = nn.ModuleList(SAMSABlock(dim, heads=heads, rezero=self.alpha, **block_options,
                                               **(opts if own else {"k": 1})) for _ in range(depth))
        if not own:
            for blk in self.blocks:
                blk.mixer = build_attention(attention, dim=dim, heads=heads, **opts)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                context=None) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x, pos, mask, context=context)
        return x


class SAMSABackbone(nn.Module):
    """SAMSA layers (or their twin with another mechanism) plus the final RMSNorm.

    Args:
        dim, depth, heads: width D, layers L, heads H.
        k: sampled tokens per head (a twin's mechanism gets it if it takes a ``k``); mode: ``"hard"``
            (τ = 1, straight-through) or ``"soft"`` (τ = 0.1).
        parallel: Algorithm 1's parallel FFN (True) or the sequential pre-norm variant.
        attention: ``"samsa"`` or another registry key for the twin; attention_options: extra options.
    Shapes: h (B, N, D), mask (B, N) -> (B, N, D), padded rows zero.
    """

    def __init__(self, dim: int = 32, depth: int = 2, heads: int = 4, k: int = 8, mode: str = "hard",
                 parallel: bool = True, attention: str = "samsa", attention_options: dict | None = None):
        super().__init__()
        # SAMSA's layers around the mechanism (``mode`` reaches SAMSA's own mixer only)
        self.encoder = SAMSAEncoder(dim, depth, heads=heads, k=k, attention=attention,
                                    mixer_options=attention_options, parallel=parallel, mode=mode)
        self.attention = attention
        self.final_norm = RMSNorm(dim)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(h, None, mask)
        return self.final_norm(h).masked_fill(~mask.unsqueeze(-1), 0.0)


class SAMSAPointClassifier(nn.Module):
    """SAMSA shape classifier. forward(x (B, N, F) | None, pos (B, N, 3), mask (B, N)) -> logits (B, C).

    Args: num_classes, in_dim (per-point feature channels F, 0 = coordinates only) and the
    :class:`SAMSABackbone` options. Head: [masked max ‖ masked mean] → Linear(2D, D) → GELU → Linear(D, C).
    """

    def __init__(self, num_classes: int = 40, in_dim: int = 3, **backbone_options):
        super().__init__()
        self.in_dim = in_dim
        self.backbone = SAMSABackbone(**backbone_options)
        D = self.backbone.final_norm.weight.shape[0]
        self.embed = nn.Linear(3 + in_dim, D)
        self.head = nn.Sequential(nn.Linear(2 * D, D), nn.GELU(), nn.Linear(D, num_classes))

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        inp = pos if x is None else torch.cat([pos, x], -1)
        h = self.embed(inp.masked_fill(~mask.unsqueeze(-1), 0.0))
        h = self.backbone(h, mask)
        return self.head(torch.cat([masked_max(h, mask), masked_mean(h, mask)], -1))


class SAMSAPartSegmenter(nn.Module):
    """SAMSA part segmenter. forward(x, pos, mask, category (B,)) -> logits (B, N, P), padded rows zero.

    With ``num_categories``, a learned category embedding is added to the input tokens and to the
    head input. Head: per point Linear(D, D) → GELU → Linear(D, P).
    """

    def __init__(self, num_parts: int = 50, num_categories: int | None = None, in_dim: int = 3, **backbone_options):
        super().__init__()
        self.in_dim, self.num_categories = in_dim, num_categories
        self.backbone = SAMSABackbone(**backbone_options)
        D = self.backbone.final_norm.weight.shape[0]
        self.embed = nn.Linear(3 + in_dim, D)
        self.category_embed = nn.Embedding(num_categories, D) if num_categories else None
        self.head = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, num_parts))

    @accepts_flat_batch(per_point=True)
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None,
                category: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        cat = check_category(category, self.num_categories, pos)
        keep = mask.unsqueeze(-1)
        inp = pos if x is None else torch.cat([pos, x], -1)
        h = self.embed(inp.masked_fill(~keep, 0.0))
        c = self.category_embed(cat)[:, None, :] if cat is not None else 0.0
        h = self.backbone((h + c).masked_fill(~keep, 0.0), mask)
        return self.head(h + c).masked_fill(~keep, 0.0)


class SAMSASequenceClassifier(nn.Module):
    """SAMSA sequence classifier (LRA). forward(tokens (B, N) int, mask (B, N)) -> logits (B, C); PyG-style:
    forward(tokens (N,) concatenated sequences, batch=b (N,) | ptr=p (B + 1,)) -> logits (B, C).

    Args:
        vocab_size: symbols (one-hot inputs ≡ ``nn.Embedding``); num_classes: C (ListOps 10).
        max_len: longest sequence (ListOps 2,048).
        positional: ``"learned"`` (default: a learned absolute position embedding), ``"sinusoidal"``
            (the fixed 1-D sinusoids of Vaswani et al., no parameters: an offset of Δ tokens is the
            same rotation at every position, so a 2-D image's vertical neighbours, a row apart, are
            reachable from the start of training) or ``"none"``.
        **backbone_options: :class:`SAMSABackbone`.
    Tokens at padded positions are ignored (any value). Head: masked mean → Linear → GELU → Linear.
    """

    def __init__(self, vocab_size: int = 20, num_classes: int = 10, max_len: int = 2048, positional: str = "learned",
                 **backbone_options):
        super().__init__()
        if positional not in ("learned", "sinusoidal", "none"):
            raise ValueError(f"positional must be 'learned', 'sinusoidal' or 'none', got {positional!r}")
        self.vocab_size, self.max_len = vocab_size, max_len
        self.backbone = SAMSABackbone(**backbone_options)
        D = self.backbone.final_norm.weight.shape[0]
        self.embed = nn.Embedding(vocab_size, D)
        self.pos_embed = nn.Embedding(max_len, D) if positional == "learned" else None
        if positional == "sinusoidal":
            if D % 2:
                raise ValueError(f"positional 'sinusoidal' needs an even width, got dim {D}")
            # a buffer, not saved: rebuilt from max_len and the width, so checkpoints stay as they were
            self.register_buffer("pos_table", sinusoid_1d(torch.arange(max_len, dtype=torch.float32), D, "standard"),
                                 persistent=False)
        else:
            self.pos_table = None
        self.head = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, num_classes))

    @accepts_flat_inputs(1)
    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        tokens, mask = check_token_inputs(tokens, mask, vocab_size=self.vocab_size, max_len=self.max_len,
                                          who=type(self).__name__)
        h = self.embed(tokens)
        if self.pos_embed is not None:
            h = h + self.pos_embed.weight[: tokens.shape[1]]
        elif self.pos_table is not None:
            h = h + self.pos_table[: tokens.shape[1]].to(h.dtype)
        h = self.backbone(h.masked_fill(~mask.unsqueeze(-1), 0.0), mask)
        return self.head(masked_mean(h, mask))


@register_model("samsa-cls")
def samsa_cls(**options) -> SAMSAPointClassifier:
    """SAMSA point classifier (ModelNet40-style)."""
    return SAMSAPointClassifier(**options)


@register_model("samsa-partseg")
def samsa_partseg(**options) -> SAMSAPartSegmenter:
    """SAMSA part segmenter (ShapeNetPart-style)."""
    return SAMSAPartSegmenter(**options)


@register_model("samsa-seq")
def samsa_seq(**options) -> SAMSASequenceClassifier:
    """SAMSA sequence classifier (LRA ListOps-style)."""
    return SAMSASequenceClassifier(**options)
