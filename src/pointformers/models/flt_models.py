"""FLT encoders (FLT paper, Choromanski et al., Sec. 5): sequences with a 1-D RPE, 3-D regression
with a Gaussian RPE.

Both stack pre-LN blocks (:class:`~pointformers.nn.transformer_block.TransformerBlock`, GeLU FFN)
whose token mixer is :class:`~pointformers.attention.flt.FLTAttention`: FAVOR+ linear attention
with a learned-Fourier relative positional encoding, exp(f(r_i − r_j) + q·k/√d) estimated in
O(N) time.

* ``flt-seq`` — :class:`FLTSequenceClassifier`: token embedding, positions r_j = j (ℓ = 1), the
  Gaussian-mixture RPE (or the local RPE, ``rpe_type="local"``), masked mean pooling, MLP head.
  Paper LM (App. B.1, :data:`PAPER_LM`): 6 layers, 8 heads, hidden 512, FFN 2048, m = 64, r = 32,
  dropout 0.1; RPE masks differ between heads and are **shared across layers** (``share_rpe``).
* ``flt-lm`` — :class:`FLTLanguageModel`: the paper's decoder for language modelling (App. B.1):
  causal FLT attention (chunked prefix sums; FLT never describes its causal form, the spec's §9.11
  reading), positions r_j = j, pre-LN blocks, a final LayerNorm and an output layer tied to the
  token embedding; next-token logits at every position (task ``language-model``).
* ``flt-vit`` — :class:`FLTImageClassifier`: the paper's ViT (Sec. 5.2): patch tokens, positions
  r_j = j (raster index, ℓ = 1) or (row, column) (ℓ = 2), the Gaussian-mixture RPE (T = 25) and
  the learnable ReLU feature map (``feature_map="relu"``), mean pooling, a linear head (task
  ``image-classification``). Paper sizes: :data:`PAPER_VIT`.
* ``flt-3d-reg`` — :class:`FLT3DRegressor`: per-atom features → D, the isotropic 3-D Gaussian-basis
  RPE of the FLT paper's Sec. 5.3 (g(ξ) = Σ_t w_t exp(−2π²σ_t²‖ξ‖²), T = 32, r = 16, learnable
  proposal stds σ_i), and an energy head (per-atom MLP, summed over the atoms, as Graphormer-3D's
  energy head).
  Paper OC20 (Sec. 5.3, App. B.3, :data:`PAPER_OC20`): 12 layers, 48 heads, hidden 768, FFN 2048,
  m = 64. The output is exactly translation-invariant; rotation-invariant in distribution over ξ.

``attention="flt_exact"`` is the quadratic twin with the *same* learned RPE: exact
softmax(f(r_i − r_j) + q·k/√d) attention (FLT's reference path, ``FLTAttention(exact=True)``), which
is what FLT approximates; any other registry key (``"full"``, ``"performer"``) swaps the mechanism
in the same layout.

The layout asks the mechanism, never its name: the FLT options above (``nb_features``,
``num_rpe_features``, ``rpe_type``, ``num_components``, ``coord_dim``, ``causal``,
``learn_proposal``) go to a mechanism whose constructor takes them (so FAVOR+'s ``nb_features`` and
``causal`` also reach ``"performer"``), ``attention_options`` win over them; ``share_rpe`` applies
to mixers that can share their RPE (``share_rpe_with``); and sequences get a learned absolute
position embedding (``positional="learned"``) unless the mixer encodes positions itself
(``encodes_positions``, as FLT's RPE).
Randomness: FAVOR+'s Ω and the RPE frequencies are drawn at init and frozen by default.
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import build as build_attention, entry as attention_entry
from ..data.batch import accepts_flat_batch, accepts_flat_inputs
from ..nn.model_inputs import check_point_inputs, check_token_inputs
from ..nn.pooling import masked_mean, masked_sum
from ..nn.transformer_block import TransformerBlock
from .registry import register_model

#: WikiText-103 LM settings (FLT paper, App. B.1), to combine with ``vocab_size``/``num_classes``.
PAPER_LM = dict(dim=512, depth=6, heads=8, nb_features=64, num_rpe_features=32, ffn_mult=4, dropout=0.1)
#: ViT settings (FLT paper, Sec. 5.2, App. B.2: 12 layers, 12 heads, FFN 3072, hidden 768 presumed (ViT-Base),
#: Gaussian-mixture RPE with T = 25 and r = 64, learnable ReLU features with m = 128, dropout 0.1).
PAPER_VIT = dict(dim=768, depth=12, heads=12, nb_features=128, num_rpe_features=64, num_components=25, ffn_mult=4,
                 feature_map="relu", dropout=0.1)
#: OC20 IS2RE settings (FLT paper, Sec. 5.3, App. B.3; T = 32 Gaussian basis functions, r = 16
#: frequencies).
PAPER_OC20 = dict(dim=768, depth=12, heads=48, nb_features=64, num_rpe_features=16, num_components=32,
                  ffn_hidden=2048)

#: ``attention`` values of these models that name a registry mechanism with options: FLT's exact
#: dense reference path (``FLTAttention(exact=True)``).
ATTENTION_PRESETS = {"flt_exact": ("flt", {"exact": True})}


def _mechanism(attention: str, attention_options: dict | None, model_options: dict) -> tuple[str, dict]:
    """The registry key and constructor options of the layers' mixer: ``attention`` (or its
    :data:`ATTENTION_PRESETS` entry), the model's options that its constructor takes, then the
    preset's and ``attention_options`` (which win)."""
    name, preset = ATTENTION_PRESETS.get(attention, (attention, {}))
    entry = attention_entry(name)
    opts = {k: v for k, v in model_options.items() if entry.accepts(k)}
    return name, {**opts, **preset, **(attention_options or {})}


def _flt_stack(dim: int, depth: int, heads: int, attention: str, flt_options: dict, share_rpe: bool,
               ffn_hidden: int, dropout: float, attention_options: dict | None) -> nn.ModuleList:
    name, opts = _mechanism(attention, attention_options, flt_options)
    mixers = [build_attention(name, dim=dim, heads=heads, **opts) for _ in range(depth)]
    if share_rpe:  # one RPE for all layers, where the mixer has one to share
        for m in mixers[1:]:
            share = getattr(m, "share_rpe_with", None)
            if share is not None:
                share(mixers[0])
    return nn.ModuleList(TransformerBlock(dim, m, norm_position="pre", activation="gelu", ffn_hidden=ffn_hidden,
                                          dropout=dropout, ffn_dropout=0.0) for m in mixers)


def _positional(attention: str, positional: str | None) -> str:
    """``positional`` checked, or by default ``"none"`` where the mixer encodes the positions it is
    given (``encodes_positions``, FLT's RPE) and ``"learned"`` otherwise."""
    if positional is None:
        mixer = attention_entry(_mechanism(attention, None, {})[0]).factory
        positional = "none" if getattr(mixer, "encodes_positions", False) else "learned"
    if positional not in ("none", "learned"):
        raise ValueError(f"positional must be 'none' or 'learned', got {positional!r}")
    return positional


def embed_tokens(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor | None):
    """Checked token ids and mask of a sequence model (``vocab_size``, ``max_len``, ``embed``,
    ``pos_embed`` or None) and their embeddings, position rows added where the model has them:
    tokens (B, N), mask (B, N) | None -> (tokens, mask, h (B, N, D))."""
    tokens, mask = check_token_inputs(tokens, mask, vocab_size=model.vocab_size,
                                      max_len=model.max_len if model.pos_embed is not None else None,
                                      who=type(model).__name__)
    h = model.embed(tokens)
    if model.pos_embed is not None:
        h = h + model.pos_embed.weight[: tokens.shape[1]]
    return tokens, mask, h


def token_embedding(vocab_size: int, dim: int) -> nn.Embedding:
    """A language model's token embedding, N(0, 1/dim) (fairseq's LM scale: logits O(1) at init)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size: expected an integer >= 2, got {vocab_size!r}")
    embed = nn.Embedding(vocab_size, dim)
    nn.init.normal_(embed.weight, std=dim ** -0.5)
    return embed


def position_embedding(max_len: int, dim: int) -> nn.Embedding:
    """A language model's learned absolute positions, N(0, 1/dim) like :func:`token_embedding`: at
    PyTorch's default N(0, 1) the positions would outweigh the tokens 8-20× at init, and the causal
    models stayed near the unigram perplexity (measured, docs/results.md)."""
    pos = nn.Embedding(max_len, dim)
    nn.init.normal_(pos.weight, std=dim ** -0.5)
    return pos


def output_layer(embed: nn.Embedding, tie: bool) -> nn.Linear:
    """Next-token logits layer (dim -> vocab), its weight tied to ``embed`` when ``tie``."""
    out = nn.Linear(embed.embedding_dim, embed.num_embeddings)
    if tie:
        out.weight = embed.weight
    return out


class FLTSequenceClassifier(nn.Module):
    """FLT sequence classifier. forward(tokens (B, N) int, mask (B, N)) -> logits (B, C); PyG-style:
    forward(tokens (N,) concatenated sequences, batch=b (N,) | ptr=p (B + 1,)) -> logits (B, C).

    Args:
        vocab_size, num_classes: symbols and classes (ListOps: 10 classes).
        dim, depth, heads, ffn_mult, dropout: the transformer (paper LM: :data:`PAPER_LM`).
        nb_features: FAVOR+ features m; num_rpe_features: RPE frequencies r.
        rpe_type: ``"gaussian_mixture"`` (default) or ``"local"``; num_components: T (default 25/16).
        share_rpe: one RPE per head shared by all layers (the paper's LM); mixers without an RPE
            (no ``share_rpe_with``) ignore it.
        causal: causal attention (the LM); classification is non-causal.
        positional: ``"none"`` (FLT: relative positions only) or ``"learned"`` absolute embedding
            (default for mixers that do not encode positions, ``encodes_positions``). max_len:
            longest sequence for ``"learned"``.
        attention: ``"flt"``, ``"flt_exact"`` (FLT's exact reference path) or another registry key;
            attention_options: extra options (module docstring: which model options a mechanism gets).
    Positions are the token indices (r_j = j); padded tokens (any id) are ignored.
    """

    def __init__(self, vocab_size: int = 20, num_classes: int = 10, dim: int = 32, depth: int = 2, heads: int = 4,
                 nb_features: int = 16, num_rpe_features: int = 8, rpe_type: str = "gaussian_mixture",
                 num_components: int | None = None, share_rpe: bool = True, causal: bool = False,
                 ffn_mult: int = 4, dropout: float = 0.0, positional: str | None = None, max_len: int = 2048,
                 attention: str = "flt", attention_options: dict | None = None):
        super().__init__()
        if rpe_type not in ("gaussian_mixture", "local"):
            raise ValueError(f"rpe_type for sequences must be 'gaussian_mixture' or 'local', got {rpe_type!r}")
        positional = _positional(attention, positional)  # relative positions only where the mixer encodes them
        self.vocab_size, self.max_len = vocab_size, max_len
        flt_options = dict(nb_features=nb_features, num_rpe_features=num_rpe_features, rpe_type=rpe_type,
                           num_components=num_components, coord_dim=1, causal=causal)
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Embedding(max_len, dim) if positional == "learned" else None
        self.blocks = _flt_stack(dim, depth, heads, attention, flt_options, share_rpe, ffn_mult * dim, dropout,
                                 attention_options)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, num_classes))

    @accepts_flat_inputs(1)
    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        tokens, mask, h = embed_tokens(self, tokens, mask)
        B, N = tokens.shape
        pos = torch.arange(N, device=tokens.device, dtype=h.dtype).view(1, N, 1).expand(B, N, 1)
        keep = mask.unsqueeze(-1)
        h = h.masked_fill(~keep, 0.0)
        for blk in self.blocks:
            h = blk(h, pos, mask)
        return self.head(masked_mean(self.norm(h), mask))


class FLTLanguageModel(nn.Module):
    """Decoder-only language model with causal attention: forward(tokens (B, L) int, mask (B, L)) ->
    next-token logits (B, L, V) (position i predicts token i + 1 from tokens ≤ i); PyG-style:
    forward(tokens (N,) concatenated sequences, batch=b (N,) | ptr=p (B + 1,)) -> (N, V).

    Args:
        vocab_size: V (the corpus's vocabulary, padding id 0 included).
        dim, depth, heads, ffn_mult, dropout: the transformer (paper: :data:`PAPER_LM`).
        nb_features: FAVOR+ features m; num_rpe_features: RPE frequencies r; rpe_type:
            ``"gaussian_mixture"`` or ``"local"`` (the paper's two LM variants); num_components: T.
        share_rpe: one RPE per head shared by all layers (the paper's LM).
        positional: ``"none"`` (FLT: relative positions only) or ``"learned"`` absolute embedding
            (default for mixers that do not encode positions); max_len: longest sequence then.
        tie_embeddings: the output layer reuses the embedding matrix (plus its own bias), as in
            fairseq's LM configurations the paper follows.
        chunk_size: rows per causal chunk of prefix-sum mechanisms (speed/memory, not semantics).
        attention: ``"flt"`` or another registry key with a causal mode (``"performer"``,
            ``"full"``); a mechanism without one is refused. attention_options: extra options.
    Padded positions (any id) are ignored; their logits are zero.
    """

    def __init__(self, vocab_size: int = 32, dim: int = 64, depth: int = 2, heads: int = 4, nb_features: int = 32,
                 num_rpe_features: int = 16, rpe_type: str = "gaussian_mixture", num_components: int | None = None,
                 share_rpe: bool = True, ffn_mult: int = 4, dropout: float = 0.0, positional: str | None = None,
                 max_len: int = 1024, tie_embeddings: bool = True, chunk_size: int = 64, attention: str = "flt",
                 attention_options: dict | None = None):
        super().__init__()
        if rpe_type not in ("gaussian_mixture", "local"):
            raise ValueError(f"rpe_type for sequences must be 'gaussian_mixture' or 'local', got {rpe_type!r}")
        positional = _positional(attention, positional)
        self.vocab_size, self.max_len = vocab_size, max_len
        flt_options = dict(nb_features=nb_features, num_rpe_features=num_rpe_features, rpe_type=rpe_type,
                           num_components=num_components, coord_dim=1, causal=True, chunk_size=chunk_size)
        self.embed = token_embedding(vocab_size, dim)
        self.pos_embed = position_embedding(max_len, dim) if positional == "learned" else None
        self.blocks = _flt_stack(dim, depth, heads, attention, flt_options, share_rpe, ffn_mult * dim, dropout,
                                 attention_options)
        if not all(getattr(b.mixer, "causal", False) for b in self.blocks):
            raise ValueError(f"attention={attention!r}: the mechanism has no causal mode (a language model needs "
                             "one: flt, performer or full)")
        self.drop = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)
        self.out = output_layer(self.embed, tie_embeddings)

    @accepts_flat_inputs(1, per_point=True)
    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        tokens, mask, h = embed_tokens(self, tokens, mask)
        B, N = tokens.shape
        keep = mask.unsqueeze(-1)
        h = self.drop(h).masked_fill(~keep, 0.0)
        pos = torch.arange(N, device=tokens.device, dtype=h.dtype).view(1, N, 1).expand(B, N, 1)
        for blk in self.blocks:
            h = blk(h, pos, mask)
        return self.out(self.norm(h)).masked_fill(~keep, 0.0)


class FLTImageClassifier(nn.Module):
    """ViT-style classifier of patch tokens: forward(x (B, P, F) patch pixels, pos (B, P, ℓ) patch
    positions, mask (B, P)) -> logits (B, C); PyG-style: forward(x (N, F), pos (N, ℓ), batch=b | ptr=p).

    Args:
        in_dim: F = p·p·C values per patch; num_classes: C.
        dim, depth, heads, ffn_mult, dropout: the transformer (paper: :data:`PAPER_VIT`).
        nb_features: m; num_rpe_features: r; num_components: T (default 25, the paper's ViT);
        rpe_type: "gaussian_mixture" (the paper's ViT) or "local"; coord_dim: ℓ of ``pos``.
        feature_map: "relu" (the paper's learnable ReLU map) or "favor".
        share_rpe: one RPE per head shared by the layers (the paper is silent for ViT; its < 0.03M
            RPE-parameter budget reads as sharing).
        positional: "none" (FLT) or "learned" absolute embedding of the token index (default for
            mixers that do not encode positions); max_len: most patches then.
        attention: "flt" or another registry key (``performer-vit``, ``full-vit`` are the twins).
    No class token: the paper does not say; mean pooling over the patches (the spec's suggestion).
    """

    def __init__(self, in_dim: int = 4, num_classes: int = 10, dim: int = 64, depth: int = 2, heads: int = 4,
                 nb_features: int = 32, num_rpe_features: int = 16, num_components: int | None = 25,
                 rpe_type: str = "gaussian_mixture", coord_dim: int = 1, feature_map: str = "relu",
                 share_rpe: bool = True, ffn_mult: int = 4, dropout: float = 0.0, positional: str | None = None,
                 max_len: int = 1024, attention: str = "flt", attention_options: dict | None = None):
        super().__init__()
        if rpe_type not in ("gaussian_mixture", "local"):
            raise ValueError(f"rpe_type for images must be 'gaussian_mixture' or 'local', got {rpe_type!r}")
        positional = _positional(attention, positional)
        self.in_dim, self.coord_dim, self.max_len = in_dim, coord_dim, max_len
        flt_options = dict(nb_features=nb_features, num_rpe_features=num_rpe_features, rpe_type=rpe_type,
                           num_components=num_components, coord_dim=coord_dim, feature_map=feature_map)
        self.embed = nn.Linear(in_dim, dim)
        self.pos_embed = nn.Embedding(max_len, dim) if positional == "learned" else None
        self.blocks = _flt_stack(dim, depth, heads, attention, flt_options, share_rpe, ffn_mult * dim, dropout,
                                 attention_options)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, pos_dim=self.coord_dim, who=type(self).__name__)
        keep = mask.unsqueeze(-1)
        h = self.embed(x.masked_fill(~keep, 0.0))
        if self.pos_embed is not None:
            if x.shape[1] > self.max_len:
                raise ValueError(f"{type(self).__name__}: {x.shape[1]} patches exceed max_len={self.max_len}")
            h = h + self.pos_embed.weight[: x.shape[1]]
        h = h.masked_fill(~keep, 0.0)
        pos = pos.masked_fill(~keep, 0.0)
        for blk in self.blocks:
            h = blk(h, pos, mask)
        return self.head(masked_mean(self.norm(h), mask))


class FLT3DRegressor(nn.Module):
    """FLT regressor of a per-structure scalar (energy) from 3-D point sets.

    Args:
        in_dim: per-atom feature channels F (e.g. one-hot species); 0 = no features (every atom gets
            the same learned token and only geometry matters).
        dim, depth, heads: the transformer; ffn_hidden: FFN width (default 4·dim; paper 2048).
        nb_features, num_rpe_features, num_components: m, r, T of the 3-D Gaussian-basis RPE.
        learn_proposal: learnable proposal stds σ_i (paper: yes).
        share_rpe: one RPE shared by all layers (the paper states sharing only for LM; where it is silent
            we read its < 0.03M RPE-parameter budget as sharing); mixers without an RPE ignore it.
        dropout: residual dropout.
        attention: ``"flt"``, ``"flt_exact"`` (FLT's exact reference path) or another registry key;
            attention_options: extra options (module docstring: which model options a mechanism gets).
    Shapes: forward(x (B, N, F) | None, pos (B, N, 3), mask (B, N)) -> energy (B,).
    """

    def __init__(self, in_dim: int = 1, dim: int = 32, depth: int = 2, heads: int = 4, nb_features: int = 16,
                 num_rpe_features: int = 8, num_components: int = 8, learn_proposal: bool = True,
                 share_rpe: bool = True, ffn_hidden: int | None = None, dropout: float = 0.0,
                 attention: str = "flt", attention_options: dict | None = None):
        super().__init__()
        ffn_hidden = ffn_hidden or 4 * dim
        self.in_dim = in_dim
        flt_options = dict(nb_features=nb_features, num_rpe_features=num_rpe_features, rpe_type="gaussian_basis",
                           num_components=num_components, coord_dim=3, learn_proposal=learn_proposal)
        self.embed = nn.Linear(in_dim, dim) if in_dim else None
        self.token = nn.Parameter(torch.randn(dim) * 0.02) if not in_dim else None
        self.blocks = _flt_stack(dim, depth, heads, attention, flt_options, share_rpe, ffn_hidden, dropout,
                                 attention_options)
        self.norm = nn.LayerNorm(dim)
        self.energy = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, 1))

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        keep = mask.unsqueeze(-1)
        pos = pos.masked_fill(~keep, 0.0)
        if self.embed is not None:
            h = self.embed(x.masked_fill(~keep, 0.0))
        else:
            h = self.token.to(pos.dtype).expand(*pos.shape[:2], -1)
        h = h.masked_fill(~keep, 0.0)
        for blk in self.blocks:
            h = blk(h, pos, mask)
        return masked_sum(self.energy(self.norm(h)), mask).squeeze(-1)


@register_model("flt-seq")
def flt_seq(**options) -> FLTSequenceClassifier:
    """FLT sequence classifier with the 1-D learned-Fourier RPE (paper LM options: :data:`PAPER_LM`)."""
    return FLTSequenceClassifier(**options)


@register_model("flt-lm")
def flt_lm(**options) -> FLTLanguageModel:
    """FLT causal language model with the 1-D learned-Fourier RPE (paper: :data:`PAPER_LM`, WikiText-103)."""
    return FLTLanguageModel(**options)


@register_model("flt-vit")
def flt_vit(**options) -> FLTImageClassifier:
    """FLT ViT: patch tokens, 1-D (or 2-D) learned-Fourier RPE, learnable ReLU features (paper: :data:`PAPER_VIT`)."""
    return FLTImageClassifier(**options)


@register_model("flt-3d-reg")
def flt_3d_reg(**options) -> FLT3DRegressor:
    """FLT 3-D regressor with the Gaussian-basis RPE (paper OC20 options: :data:`PAPER_OC20`)."""
    return FLT3DRegressor(**options)
