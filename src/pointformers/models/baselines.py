"""Baselines for every task family: full-attention twins and MLP + pooling models.

Full-attention twins — the same architecture as the efficient model with the ``full`` mechanism
(softmax over all real points via ``scaled_dot_product_attention``):

* ``full-cls`` = ``sft-cls`` layout (embedding, LayerNorm blocks with GeLU FFN, sample-max head),
* ``full-partseg`` = ``sft-partseg`` layout,
* ``full-seq`` = ``samsa-seq`` layout (RMSNorm, ReZero, parallel FFN, learned positions),
* ``full-3d-reg`` = ``flt-3d-reg`` layout with *exact* softmax(f(r_i − r_j) + q·k/√d) attention and the
  same learned RPE (``flt_exact``: plain ``full`` would not see the geometry at all),
* ``full-lm`` / ``performer-lm`` = ``flt-lm`` layout with causal softmax attention / causal FAVOR+
  (the FLT paper's Table 1 rows; both with a learned absolute position embedding, FLT without),
* ``full-vit`` / ``performer-vit`` = ``flt-vit`` layout with softmax attention / FAVOR+ (learned
  absolute positions of the patches),
* sets: ``set-sab-pma`` (:mod:`.set_models`).

Any efficient model also takes ``attention="full"`` directly (e.g. ``build("sampled-cls",
attention="full")`` is the paper's dense row of Tables 3–4).

MLP + pooling baselines ("no attention"):

* ``mlp-cls`` — :class:`PointMLPClassifier`, PointNet without T-nets: shared per-point MLP,
  max pool, MLP head (the Sampled Transformer's "MLP + FC" row: the same idea).
* ``mlp-partseg`` — :class:`PointMLPSegmenter`, PointNet segmentation: local features concatenated
  with the max-pooled global feature (and a category embedding), per-point MLP.
* ``mlp-seq`` — :class:`SequenceMLPClassifier`: token embedding (optionally + learned position),
  per-token MLP, masked mean pool, MLP head.
* ``mlp-lm`` — :class:`PrefixMeanLanguageModel`: token embedding (+ learned position), a per-token MLP
  on [h_i, mean of h_j over j ≤ i] (causal mean pooling: the document's bag of words so far, no
  attention), next-token logits tied to the embedding.
* ``mlp-vit`` — :class:`PatchMLPClassifier`: patch embedding + learned position, per-patch MLP,
  masked mean pool, MLP head.
* ``mlp-3d-reg`` — :class:`PointMLPRegressor`, DeepSets ρ(Σ φ(x_i, p_i − p̄)): translation-invariant.
* ``mlp-set`` — :class:`SetMLPClusterer`, Set Transformer's "rFF + Pooling": per-point rFF, mean
  pool, MLP decoder to the k mixture components.

Every MLP uses Linear → LayerNorm → ReLU hidden layers (LayerNorm rather than PointNet's BatchNorm:
per point, so padding and the batch never change a cloud's output).
"""
from __future__ import annotations

import torch
from torch import nn

from ..data.batch import accepts_flat_batch, accepts_flat_inputs
from ..nn.model_inputs import check_point_inputs
from ..nn.pooling import masked_max, masked_mean, masked_sum
from .flt_models import (FLT3DRegressor, FLTImageClassifier, FLTLanguageModel, embed_tokens, output_layer,
                         position_embedding, token_embedding)
from .registry import register_model
from .samsa_models import SAMSASequenceClassifier
from .set_models import Mixture, MixtureHead, check_set_inputs
from .sft_models import SFTPartSegmenter, SFTPointClassifier, check_category


def point_mlp(widths: list[int]) -> nn.Sequential:
    """Linear → LayerNorm → ReLU for every layer (widths[0] → … → widths[-1]); (…, w₀) -> (…, w_L)."""
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.LayerNorm(b), nn.ReLU()]
    return nn.Sequential(*layers)


def mlp_head(widths: list[int], dropout: float = 0.0) -> nn.Sequential:
    """Hidden Linear → LayerNorm → ReLU → Dropout layers, plain Linear last."""
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-2], widths[1:-1]):
        layers += [nn.Linear(a, b), nn.LayerNorm(b), nn.ReLU(), nn.Dropout(dropout)]
    layers.append(nn.Linear(widths[-2], widths[-1]))
    return nn.Sequential(*layers)


class PointMLPClassifier(nn.Module):
    """PointNet-like classifier. forward(x (B, N, F) | None, pos (B, N, 3), mask) -> logits (B, C).

    Args: num_classes; in_dim (F); widths: per-point MLP widths after the input (PointNet
    64, 64, 64, 128, 1024); head: hidden head widths (PointNet 512, 256); dropout in the head (0.3 in PointNet).
    """

    def __init__(self, num_classes: int = 40, in_dim: int = 3, widths: tuple[int, ...] = (32, 64),
                 head: tuple[int, ...] = (32,), dropout: float = 0.0):
        super().__init__()
        self.in_dim = in_dim
        self.point = point_mlp([3 + in_dim, *widths])
        self.head = mlp_head([widths[-1], *head, num_classes], dropout)

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        inp = pos if x is None else torch.cat([pos, x], -1)
        return self.head(masked_max(self.point(inp.masked_fill(~mask.unsqueeze(-1), 0.0)), mask))


class PointMLPSegmenter(nn.Module):
    """PointNet-like part segmenter. forward(x, pos, mask, category (B,)) -> logits (B, N, P), padded rows zero.

    Per point: local = MLP(local_widths), global = max-pool of MLP(global_widths) over the cloud;
    the head reads [local ‖ global ‖ category embedding].
    """

    def __init__(self, num_parts: int = 50, num_categories: int | None = None, in_dim: int = 3,
                 local_widths: tuple[int, ...] = (32, 32), global_widths: tuple[int, ...] = (64,),
                 head: tuple[int, ...] = (64, 32)):
        super().__init__()
        self.in_dim, self.num_categories = in_dim, num_categories
        self.local = point_mlp([3 + in_dim, *local_widths])
        self.globl = point_mlp([local_widths[-1], *global_widths])
        self.category_embed = nn.Embedding(num_categories, 16) if num_categories else None
        width = local_widths[-1] + global_widths[-1] + (16 if num_categories else 0)
        self.head = mlp_head([width, *head, num_parts])

    @accepts_flat_batch(per_point=True)
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None,
                category: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        cat = check_category(category, self.num_categories, pos)
        keep = mask.unsqueeze(-1)
        inp = pos if x is None else torch.cat([pos, x], -1)
        local = self.local(inp.masked_fill(~keep, 0.0))
        g = masked_max(self.globl(local), mask)                                    # (B, G)
        parts = [local, g[:, None, :].expand(-1, local.shape[1], -1)]
        if cat is not None:
            parts.append(self.category_embed(cat)[:, None, :].expand(-1, local.shape[1], -1))
        return self.head(torch.cat(parts, -1)).masked_fill(~keep, 0.0)


class SequenceMLPClassifier(nn.Module):
    """Embedding + per-token MLP + masked mean pool + MLP head. forward(tokens (B, N), mask) -> (B, C);
    PyG-style: forward(tokens (N,) concatenated sequences, batch=b (N,) | ptr=p (B + 1,)) -> (B, C).

    ``positional=True`` adds a learned absolute position embedding (up to ``max_len``); without it
    the model sees a bag of tokens.
    """

    def __init__(self, vocab_size: int = 20, num_classes: int = 10, dim: int = 32, widths: tuple[int, ...] = (32,),
                 head: tuple[int, ...] = (32,), positional: bool = False, max_len: int = 2048):
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Embedding(max_len, dim) if positional else None
        self.token = point_mlp([dim, *widths])
        self.head = mlp_head([widths[-1], *head, num_classes])

    @accepts_flat_inputs(1)
    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        tokens, mask, h = embed_tokens(self, tokens, mask)
        return self.head(masked_mean(self.token(h), mask))


class PrefixMeanLanguageModel(nn.Module):
    """Next-token logits from each token and the causal mean of the tokens before it, no attention:
    forward(tokens (B, L) int, mask (B, L)) -> (B, L, V); PyG-style: forward(tokens (N,), batch=b | ptr=p)
    -> (N, V).

    ``widths``: the per-token MLP on [h_i, mean_{j ≤ i} h_j] (2·dim in); its output is projected
    back to ``dim`` and scored against the (tied) embedding. ``positional``: learned absolute
    positions up to ``max_len``. Padded positions are ignored and their logits zero.
    """

    def __init__(self, vocab_size: int = 32, dim: int = 64, widths: tuple[int, ...] = (128,), positional: bool = True,
                 max_len: int = 1024, tie_embeddings: bool = True, dropout: float = 0.0):
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed = token_embedding(vocab_size, dim)
        self.pos_embed = position_embedding(max_len, dim) if positional else None
        self.mlp = point_mlp([2 * dim, *widths])
        self.drop = nn.Dropout(dropout)
        self.proj = nn.Linear(widths[-1], dim)
        self.norm = nn.LayerNorm(dim)
        self.out = output_layer(self.embed, tie_embeddings)

    @accepts_flat_inputs(1, per_point=True)
    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        tokens, mask, h = embed_tokens(self, tokens, mask)
        keep = mask.unsqueeze(-1)
        h = h.masked_fill(~keep, 0.0)
        count = keep.to(h.dtype).cumsum(1).clamp_min(1.0)
        prefix = h.cumsum(1) / count  # mean over the real tokens j <= i
        y = self.proj(self.drop(self.mlp(torch.cat([h, prefix], -1))))
        return self.out(self.norm(y + h)).masked_fill(~keep, 0.0)


class PatchMLPClassifier(nn.Module):
    """Patch embedding (+ learned position of the patch index) → per-patch MLP → masked mean → MLP head:
    forward(x (B, P, F), pos (B, P, ℓ), mask) -> (B, C) (``pos`` only checked: the positions enter
    through the index embedding); PyG-style: forward(x (N, F), pos (N, ℓ), batch=b | ptr=p)."""

    def __init__(self, in_dim: int = 4, num_classes: int = 10, dim: int = 64, widths: tuple[int, ...] = (64,),
                 head: tuple[int, ...] = (64,), coord_dim: int = 1, max_len: int = 1024):
        super().__init__()
        self.in_dim, self.coord_dim, self.max_len = in_dim, coord_dim, max_len
        self.embed = nn.Linear(in_dim, dim)
        self.pos_embed = nn.Embedding(max_len, dim)
        self.token = point_mlp([dim, *widths])
        self.head = mlp_head([widths[-1], *head, num_classes])

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, pos_dim=self.coord_dim, who=type(self).__name__)
        if x.shape[1] > self.max_len:
            raise ValueError(f"{type(self).__name__}: {x.shape[1]} patches exceed max_len={self.max_len}")
        h = self.embed(x.masked_fill(~mask.unsqueeze(-1), 0.0)) + self.pos_embed.weight[: x.shape[1]]
        return self.head(masked_mean(self.token(h), mask))


class PointMLPRegressor(nn.Module):
    """DeepSets regressor ρ(Σ_i φ([x_i, p_i − p̄])): forward(x (B, N, F) | None, pos (B, N, 3), mask) -> (B,).

    Coordinates enter relative to the cloud's centroid p̄ (translation invariance); the sum pooling
    makes the output extensive like an energy.
    """

    def __init__(self, in_dim: int = 1, widths: tuple[int, ...] = (32, 64), head: tuple[int, ...] = (32,)):
        super().__init__()
        self.in_dim = in_dim
        self.phi = point_mlp([3 + in_dim, *widths])
        self.rho = mlp_head([widths[-1], *head, 1])

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        keep = mask.unsqueeze(-1)
        pos = pos.masked_fill(~keep, 0.0)
        rel = pos - masked_mean(pos, mask)[:, None, :]
        inp = rel if x is None else torch.cat([rel, x], -1)
        return self.rho(masked_sum(self.phi(inp.masked_fill(~keep, 0.0)), mask)).squeeze(-1)


class SetMLPClusterer(nn.Module):
    """Set Transformer's "rFF + Pooling" clusterer: per-point rFF, mean pool, MLP → k mixture components.

    Official: 4 rFF layers of width 128, mean pooling, 3-layer decoder. forward(x (B, N, d), mask) -> Mixture;
    PyG-style: forward(x (N, d), batch=b (N,) | ptr=p (B + 1,)) -> the same per-set Mixture (B, ·).
    """

    def __init__(self, in_dim: int = 2, num_components: int = 4, dim: int = 32, encoder_layers: int = 4,
                 decoder_layers: int = 3):
        super().__init__()
        self.in_dim, self.k, self.dim = in_dim, num_components, dim
        self.rff = nn.Sequential(*[m for i in range(encoder_layers)
                                   for m in (nn.Linear(in_dim if i == 0 else dim, dim), nn.ReLU())])
        dec: list[nn.Module] = []
        for i in range(decoder_layers - 1):
            dec += [nn.Linear(dim if i == 0 else dim, dim), nn.ReLU()]
        dec.append(nn.Linear(dim, num_components * dim))
        self.decoder = nn.Sequential(*dec)
        self.head = MixtureHead(dim, in_dim)

    @accepts_flat_inputs(2)
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Mixture:
        mask = check_set_inputs(x, mask, self.in_dim, type(self).__name__)
        pooled = masked_mean(self.rff(x.masked_fill(~mask.unsqueeze(-1), 0.0)), mask)
        return self.head(self.decoder(pooled).view(-1, self.k, self.dim))


# ---------------------------------------------------------------------------------------- twins
@register_model("full-cls")
def full_cls(**options) -> SFTPointClassifier:
    """``sft-cls`` layout with full softmax attention."""
    return SFTPointClassifier(**{"attention": "full", **options})


@register_model("full-partseg")
def full_partseg(**options) -> SFTPartSegmenter:
    """``sft-partseg`` layout with full softmax attention."""
    return SFTPartSegmenter(**{"attention": "full", **options})


@register_model("full-seq")
def full_seq(**options) -> SAMSASequenceClassifier:
    """``samsa-seq`` layout with full softmax attention."""
    return SAMSASequenceClassifier(**{"attention": "full", **options})


@register_model("full-3d-reg")
def full_3d_reg(**options) -> FLT3DRegressor:
    """``flt-3d-reg`` layout with exact (quadratic) softmax attention and the same learned RPE.

    The exact path draws no frequencies, so the proposal stds are a (loadable) buffer, not parameters.
    """
    return FLT3DRegressor(**{"attention": "flt_exact", "learn_proposal": False, **options})


@register_model("full-lm")
def full_lm(**options) -> FLTLanguageModel:
    """``flt-lm`` layout with causal softmax attention (and learned absolute positions)."""
    return FLTLanguageModel(**{"attention": "full", **options})


@register_model("performer-lm")
def performer_lm(**options) -> FLTLanguageModel:
    """``flt-lm`` layout with causal FAVOR+ (Performer; learned absolute positions, no RPE)."""
    return FLTLanguageModel(**{"attention": "performer", **options})


@register_model("full-vit")
def full_vit(**options) -> FLTImageClassifier:
    """``flt-vit`` layout with softmax attention (and learned absolute positions)."""
    return FLTImageClassifier(**{"attention": "full", **options})


@register_model("performer-vit")
def performer_vit(**options) -> FLTImageClassifier:
    """``flt-vit`` layout with FAVOR+ (Performer; learned absolute positions, no RPE)."""
    return FLTImageClassifier(**{"attention": "performer", **options})


# ---------------------------------------------------------------------------------------- MLPs
@register_model("mlp-cls")
def mlp_cls(**options) -> PointMLPClassifier:
    """PointNet-like MLP + max-pool classifier."""
    return PointMLPClassifier(**options)


@register_model("mlp-partseg")
def mlp_partseg(**options) -> PointMLPSegmenter:
    """PointNet-like MLP segmenter (local ‖ global features)."""
    return PointMLPSegmenter(**options)


@register_model("mlp-seq")
def mlp_seq(**options) -> SequenceMLPClassifier:
    """Embedding + MLP + mean-pool sequence classifier."""
    return SequenceMLPClassifier(**options)


@register_model("mlp-lm")
def mlp_lm(**options) -> PrefixMeanLanguageModel:
    """Embedding + causal mean pooling + per-token MLP language model (no attention)."""
    return PrefixMeanLanguageModel(**options)


@register_model("mlp-vit")
def mlp_vit(**options) -> PatchMLPClassifier:
    """Patch embedding + per-patch MLP + mean-pool image classifier (no attention)."""
    return PatchMLPClassifier(**options)


@register_model("mlp-3d-reg")
def mlp_3d_reg(**options) -> PointMLPRegressor:
    """DeepSets MLP + sum-pool regressor."""
    return PointMLPRegressor(**options)


@register_model("mlp-set")
def mlp_set(**options) -> SetMLPClusterer:
    """rFF + pooling amortised clusterer."""
    return SetMLPClusterer(**options)
