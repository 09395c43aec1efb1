"""Masked point pre-training for the Sampled Transformer (the paper's MAE-dense / MAE-sampled, a Point-MAE scheme).

* :class:`PointGroupTokenizer` — each cloud is cut into ``num_groups`` groups of ``group_size``
  points (farthest point sampling of the centres, kNN grouping, as Point-BERT); each group, in
  coordinates relative to its centre, is embedded to the token width by a mini-PointNet
  (shared MLP, max-pool, the pooled feature concatenated back to every point, a second shared MLP,
  max-pool: Point-MAE's two-stage PointNet).
* :class:`PointMAE` — random masking of ``mask_ratio`` of the groups; the encoder runs over the
  visible tokens only, the decoder over the visible tokens plus a learned mask token at every
  masked position, each with the positional embedding MLP(3 → 128 → C, GeLU) of the group centres
  added before every block; a head Linear(C, 3·group_size) predicts the masked groups' relative
  coordinates; the loss is :func:`chamfer_l2` between predicted and true points of the masked groups.
* :class:`PointMAEClassifier` — fine-tuning: the tokenizer and encoder of a (pre-trained)
  :class:`PointMAE`, no masking, max-pool over all tokens, FC head [C, C, num_classes].

``attention="full"`` is MAE-dense, ``attention="sampled"`` MAE-sampled (every attention layer,
encoder and decoder, uses the mechanism); any registered mechanism name works. Blocks are the
pre-LN form of :func:`~.sampled_models.sampled_block` (ReLU FFN of width ``ffn_hidden``), as
Point-MAE's pre-LN encoder with the Sampled Transformer's FFN; the encoder and the decoder end with
a LayerNorm (Point-MAE).

Where we depart from Point-MAE: its mini-PointNet uses BatchNorm; ours uses LayerNorm so that a
token never depends on the other clouds of the batch or on padding (padded and flat batches give
the same result). Clouds with fewer real points than ``num_groups`` get one group per real point
(the extra groups are padding); with fewer than ``group_size``, a group holds all the cloud's points.

Paper sizes (Sampled Transformer, MAE experiments): :data:`PAPER_MAE` (token dim 256, 8 heads of 32,
FFN 256, 12 encoder blocks, 1 decoder block, 64 groups of 32 points, 70 % masked). The constructor
defaults are small.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import torch
from torch import nn

from ..attention import ForwardContext
from ..data.batch import accepts_flat_batch
from ..nn.model_inputs import check_point_inputs
from ..nn.pooling import masked_max
from .registry import register_model
from .sampled_models import _EVAL_CYCLES, _build_mixer, _gather_points, farthest_point_sample, knn_group, sampled_block

__all__ = ["PAPER_MAE", "PointGroups", "PointGroupTokenizer", "chamfer_l2", "PointMAEEncoder", "PointMAE",
           "PointMAEClassifier", "point_mae", "point_mae_cls"]

#: The Sampled Transformer paper's MAE pre-training sizes (Point-MAE's defaults where it is silent).
PAPER_MAE = dict(num_groups=64, group_size=32, dim=256, heads=8, head_dim=32, ffn_hidden=256, depth=12,
                 decoder_depth=1, mask_ratio=0.7, tokenizer_hidden=128, pos_hidden=128)


# ------------------------------------------------------------------------------------------------
# Chamfer distance
# ------------------------------------------------------------------------------------------------
def chamfer_l2(pred: torch.Tensor, target: torch.Tensor, pred_mask: torch.Tensor | None = None,
               target_mask: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
    """Chamfer-L2 between point sets, batched: for each set, the mean over ``pred`` of the squared
    distance to the nearest ``target`` point plus the mean over ``target`` of the squared distance to
    the nearest ``pred`` point (Point-MAE's ``cdl2``: squared distances, no square root).

    pred (G, k, 3), target (G, k', 3); pred_mask (G, k), target_mask (G, k') bool or None (all real;
    every set needs at least one real point on each side). reduction ``"mean"`` -> () the mean over
    the G sets, ``"none"`` -> (G,).
    """
    if not isinstance(pred, torch.Tensor) or pred.dim() != 3:
        raise ValueError(f"pred: expected a (G, k, D) tensor, got "
                         f"{tuple(getattr(pred, 'shape', ())) or type(pred).__name__}")
    if not isinstance(target, torch.Tensor) or target.dim() != 3 or target.shape[0] != pred.shape[0] \
            or target.shape[2] != pred.shape[2]:
        raise ValueError(f"target: expected a (G, k', D) tensor with G = {pred.shape[0]} and D = {pred.shape[2]} "
                         f"(pred's), got {tuple(getattr(target, 'shape', ()))}")
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction: expected 'mean' or 'none', got {reduction!r}")
    for name, m, t in (("pred_mask", pred_mask, pred), ("target_mask", target_mask, target)):
        if m is not None and (not isinstance(m, torch.Tensor) or m.dtype != torch.bool or m.shape != t.shape[:2]):
            raise ValueError(f"{name}: expected a bool tensor of shape {tuple(t.shape[:2])}, got "
                             f"{getattr(m, 'dtype', type(m).__name__)} {tuple(getattr(m, 'shape', ()))}")
    pm = torch.ones(pred.shape[:2], dtype=torch.bool, device=pred.device) if pred_mask is None else pred_mask
    tm = torch.ones(target.shape[:2], dtype=torch.bool, device=target.device) if target_mask is None else target_mask
    d = (pred.unsqueeze(2) - target.unsqueeze(1)).pow(2).sum(-1)                      # (G, k, k')
    d = d.masked_fill(~(pm.unsqueeze(2) & tm.unsqueeze(1)), float("inf"))
    to_target = d.amin(2).masked_fill(~pm, 0.0).sum(1) / pm.sum(1).clamp_min(1)       # pred -> nearest target
    to_pred = d.amin(1).masked_fill(~tm, 0.0).sum(1) / tm.sum(1).clamp_min(1)         # target -> nearest pred
    per_set = to_target + to_pred
    return per_set.mean() if reduction == "mean" else per_set


# ------------------------------------------------------------------------------------------------
# tokenizer
# ------------------------------------------------------------------------------------------------
class PointGroups(NamedTuple):
    """The groups of a batch of clouds (G = ``num_groups``, k' = min(group_size, N)).

    tokens (B, G, C): the groups' embeddings (padding groups zero); centres (B, G, 3): the FPS
    centres (padding zero); valid (B, G) bool: real groups; centre_index (B, G) int64: the centres'
    point indices; index (B, G, k') int64: the groups' point indices (nearest first); relative
    (B, G, k', 3): the group points minus their centre; point_valid (B, G, k') bool: real group points.
    """

    tokens: torch.Tensor
    centres: torch.Tensor
    valid: torch.Tensor
    centre_index: torch.Tensor
    index: torch.Tensor
    relative: torch.Tensor
    point_valid: torch.Tensor


class PointGroupTokenizer(nn.Module):
    """FPS centres + kNN groups → relative coordinates → mini-PointNet tokens.

    Args:
        num_groups: G, groups per cloud (paper 64); group_size: k, points per group (paper 32).
        dim: C, the token width; hidden: h, the mini-PointNet's first width (Point-MAE: 128; the
            layers are (3 + F) → h → 2h, max-pool, [point, pooled] 4h → 4h → C, max-pool).
        in_dim: F, per-point feature channels appended to the relative coordinates (0: xyz only).
    Shapes: forward(pos (B, N, 3), mask (B, N) | None, x (B, N, F) | None) -> :class:`PointGroups`.
    """

    def __init__(self, num_groups: int = 8, group_size: int = 16, dim: int = 32, hidden: int = 16, in_dim: int = 0):
        super().__init__()
        for name, v in (("num_groups", num_groups), ("group_size", group_size), ("dim", dim), ("hidden", hidden)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        if isinstance(in_dim, bool) or not isinstance(in_dim, int) or in_dim < 0:
            raise ValueError(f"in_dim: expected an integer >= 0, got {in_dim!r}")
        self.num_groups, self.group_size, self.dim, self.in_dim = num_groups, group_size, dim, in_dim
        self.first = nn.Sequential(nn.Linear(3 + in_dim, hidden), nn.LayerNorm(hidden), nn.ReLU(),
                                   nn.Linear(hidden, 2 * hidden))
        self.second = nn.Sequential(nn.Linear(4 * hidden, 4 * hidden), nn.LayerNorm(4 * hidden), nn.ReLU(),
                                    nn.Linear(4 * hidden, dim))

    def forward(self, pos: torch.Tensor, mask: torch.Tensor | None = None,
                x: torch.Tensor | None = None) -> PointGroups:
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        pos = pos.masked_fill(~mask.unsqueeze(-1), 0.0)
        counts = mask.sum(1).clamp_max(self.num_groups)
        cidx, valid = farthest_point_sample(pos, mask, counts)                            # (B, M), M <= G
        pad = self.num_groups - cidx.shape[1]
        if pad:   # fewer real points than groups in every cloud: pad to G groups (invalid)
            cidx = torch.cat([cidx, cidx[:, :1].expand(-1, pad)], 1)
            valid = torch.cat([valid, valid.new_zeros(valid.shape[0], pad)], 1)
        centres = _gather_points(pos, cidx).masked_fill(~valid.unsqueeze(-1), 0.0)        # (B, G, 3)
        idx, pvalid = knn_group(centres, pos, mask, self.group_size)                      # (B, G, k')
        pvalid = pvalid & valid.unsqueeze(-1)
        rel = (_gather_points(pos, idx) - centres.unsqueeze(2)).masked_fill(~pvalid.unsqueeze(-1), 0.0)
        inp = rel if x is None else torch.cat([rel, _gather_points(x.masked_fill(~mask.unsqueeze(-1), 0.0), idx)], -1)
        keep = pvalid.unsqueeze(-1)
        f = self.first(inp)                                                               # (B, G, k', 2h)
        pooled = f.masked_fill(~keep, float("-inf")).amax(2, keepdim=True)
        pooled = pooled.masked_fill(~valid[..., None, None], 0.0)                         # padding groups: no -inf
        f = self.second(torch.cat([f, pooled.expand_as(f)], -1))                          # (B, G, k', C)
        tokens = f.masked_fill(~keep, float("-inf")).amax(2).masked_fill(~valid.unsqueeze(-1), 0.0)
        return PointGroups(tokens, centres.to(tokens.dtype), valid, cidx, idx, rel, pvalid)


# ------------------------------------------------------------------------------------------------
# encoder / decoder stack
# ------------------------------------------------------------------------------------------------
def _pos_mlp(hidden: int, dim: int) -> nn.Sequential:
    """Point-MAE's positional embedding of a group centre: Linear(3, hidden) → GeLU → Linear(hidden, dim)."""
    return nn.Sequential(nn.Linear(3, hidden), nn.GELU(), nn.Linear(hidden, dim))


class PointMAEEncoder(nn.Module):
    """Pre-LN transformer blocks over group tokens, the centres' positional embedding added before
    every block, a final LayerNorm. (Also the decoder, with its own weights.)

    Args: dim, depth, heads, head_dim, ffn_hidden, pos_hidden (the positional MLP's width), attention,
    attention_options, eval_cycle (as :class:`~.sampled_models.SampledBasicClassifier`).
    Shapes: forward(tokens (B, T, C), centres (B, T, 3), mask (B, T) bool) -> (B, T, C), padding zero.
    """

    def __init__(self, dim: int, depth: int, heads: int, head_dim: int, ffn_hidden: int, pos_hidden: int = 128,
                 attention: str = "full", attention_options: dict | None = None, eval_cycle: str = "coordinates"):
        super().__init__()
        self.pos_embed = _pos_mlp(pos_hidden, dim)
        self.blocks = nn.ModuleList(
            sampled_block(dim, _build_mixer(attention, dim, heads, head_dim, attention_options, eval_cycle, 16),
                          ffn_hidden, layout="pre_ln") for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor, centres: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pe = self.pos_embed(centres)
        context = ForwardContext(centres, mask)
        h = tokens
        for blk in self.blocks:
            h = blk(h + pe, centres, mask, context=context)
        return self.norm(h).masked_fill(~mask.unsqueeze(-1), 0.0)


def _check_int(name: str, v: Any, low: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {v!r}")


def _check_encoder_options(depth, heads, head_dim, pos_hidden, ffn_hidden, eval_cycle) -> None:
    """The options PointMAE and PointMAEClassifier share: ValueError naming the bad one."""
    for name, value in (("depth", depth), ("heads", heads), ("head_dim", head_dim), ("pos_hidden", pos_hidden)):
        _check_int(name, value, 1)
    if ffn_hidden is not None:
        _check_int("ffn_hidden", ffn_hidden, 1)
    if eval_cycle not in _EVAL_CYCLES:
        raise ValueError(f"eval_cycle: expected one of {_EVAL_CYCLES}, got {eval_cycle!r}")


# ------------------------------------------------------------------------------------------------
# pre-training model
# ------------------------------------------------------------------------------------------------
class PointMAE(nn.Module):
    """Masked point autoencoder (Point-MAE scheme; MAE-dense with ``attention="full"``, MAE-sampled
    with ``"sampled"``).

    Args:
        num_groups, group_size: G groups of k points per cloud (paper 64, 32).
        dim: token width C (paper 256); heads, head_dim (paper 8, 32); ffn_hidden: FFN width (paper 256).
        depth: encoder blocks (paper 12); decoder_depth: decoder blocks (paper 1).
        mask_ratio: fraction of each cloud's groups that are masked, ⌊ratio·g⌋ of its g real groups
            (at most g − 1: one stays visible) (paper 0.7).
        tokenizer_hidden: the mini-PointNet's first width (Point-MAE 128); pos_hidden: the
            positional MLP's width (128).
        in_dim: per-point feature channels given to the tokenizer (0: xyz only).
        attention, attention_options, eval_cycle: the mechanism of every attention layer (encoder
            and decoder) and its options (:class:`~.sampled_models.SampledBasicClassifier`).
        seed: seeds the masking in eval when no generator is given (deterministic evaluation).
    Masking: in training, drawn from ``generator`` when given, else from the global torch RNG; in
    eval, from ``generator`` when given, else from a private generator seeded with ``seed`` (the
    same masks at every evaluation of the same batch).
    Shapes: forward(pos (B, N, 3), mask (B, N) | None, x=(B, N, F) | None, generator=...) ->
    (loss (), details dict): ``pred`` (M, k, 3) and ``target`` (M, k', 3) with ``target_mask``
    (M, k') the M masked groups' predicted and true relative points, ``masked`` and ``visible``
    (B, G) bool, ``groups`` (:class:`PointGroups`), ``latent`` (B, V, C) the encoder output on the
    visible tokens with ``latent_mask`` (B, V) and ``visible_index`` (B, V) their group indices.
    """

    def __init__(self, num_groups: int = 8, group_size: int = 16, dim: int = 32, depth: int = 2, decoder_depth: int = 1,
                 heads: int = 4, head_dim: int = 8, ffn_hidden: int | None = None, mask_ratio: float = 0.7,
                 tokenizer_hidden: int = 16, pos_hidden: int = 128, in_dim: int = 0, attention: str = "full",
                 attention_options: dict | None = None, eval_cycle: str = "coordinates", seed: int = 0):
        super().__init__()
        _check_encoder_options(depth, heads, head_dim, pos_hidden, ffn_hidden, eval_cycle)
        _check_int("decoder_depth", decoder_depth, 1)
        _check_int("seed", seed, 0)
        if isinstance(mask_ratio, bool) or not isinstance(mask_ratio, (int, float)) or not 0 <= mask_ratio < 1:
            raise ValueError(f"mask_ratio: expected a number in [0, 1), got {mask_ratio!r}")
        ffn_hidden = ffn_hidden or dim
        #: the constructor options (for :meth:`PointMAEClassifier.from_pretrained`)
        self.config = dict(num_groups=num_groups, group_size=group_size, dim=dim, depth=depth,
                           decoder_depth=decoder_depth, heads=heads, head_dim=head_dim, ffn_hidden=ffn_hidden,
                           mask_ratio=float(mask_ratio), tokenizer_hidden=tokenizer_hidden, pos_hidden=pos_hidden,
                           in_dim=in_dim, attention=attention, attention_options=dict(attention_options or {}),
                           eval_cycle=eval_cycle, seed=seed)
        self.in_dim, self.mask_ratio, self.seed = in_dim, float(mask_ratio), seed
        self.tokenizer = PointGroupTokenizer(num_groups, group_size, dim, tokenizer_hidden, in_dim)
        stack = dict(heads=heads, head_dim=head_dim, ffn_hidden=ffn_hidden, pos_hidden=pos_hidden, attention=attention,
                     attention_options=attention_options, eval_cycle=eval_cycle)
        self.encoder = PointMAEEncoder(dim, depth, **stack)
        self.decoder = PointMAEEncoder(dim, decoder_depth, **stack)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.mask_token, std=0.02)   # Point-MAE's init
        self.head = nn.Linear(dim, 3 * group_size)

    # -------------------------------------------------------------------------------- masking
    def random_mask(self, valid: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Which groups to mask: valid (B, G) bool -> masked (B, G) bool, exactly ⌊ratio·g_b⌋ (at most
        g_b − 1) of cloud b's g_b real groups, uniformly at random (see the class doc for the RNG)."""
        if generator is None and not self.training:
            generator = torch.Generator().manual_seed(self.seed)
        if generator is None:
            scores = torch.rand(valid.shape, device=valid.device)
        else:
            scores = torch.rand(valid.shape, generator=generator, device=generator.device).to(valid.device)
        g = valid.sum(1)
        n_mask = torch.minimum(torch.floor(g.double() * self.mask_ratio).long(), (g - 1).clamp_min(0))
        # rank of each real group among its cloud's real groups by score; mask the n_mask lowest
        rank = scores.masked_fill(~valid, float("inf")).argsort(1).argsort(1)
        return (rank < n_mask.unsqueeze(1)) & valid

    @staticmethod
    def _select(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keep (B, G) bool -> (index (B, T) of the kept groups in group order, padded; valid (B, T)),
        T = the largest kept count."""
        G = keep.shape[1]
        ar = torch.arange(G, device=keep.device)
        order = (ar + G * (~keep).long()).argsort(1)      # kept groups first, each part in group order
        n = keep.sum(1)
        T = int(n.max()) if keep.numel() else 0
        return order[:, :T], ar[:T].unsqueeze(0) < n.unsqueeze(1)

    # -------------------------------------------------------------------------------- forward
    def forward(self, pos: torch.Tensor, mask: torch.Tensor | None = None, *, x: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        groups = self.tokenizer(pos, mask, x)
        masked = self.random_mask(groups.valid, generator)
        visible = groups.valid & ~masked
        vis_idx, vis_valid = self._select(visible)                                       # (B, V)
        msk_idx, msk_valid = self._select(masked)                                        # (B, M)
        tokens, centres = groups.tokens, groups.centres
        # the encoder sees the visible tokens only: they are gathered out, masked ones never enter
        v_centres = _gather_points(centres, vis_idx).masked_fill(~vis_valid.unsqueeze(-1), 0.0)
        v_tokens = _gather_points(tokens, vis_idx).masked_fill(~vis_valid.unsqueeze(-1), 0.0)  # padding slots: zero
        latent = self.encoder(v_tokens, v_centres, vis_valid)                            # (B, V, C)
        m_centres = _gather_points(centres, msk_idx).masked_fill(~msk_valid.unsqueeze(-1), 0.0)
        B, M = msk_idx.shape
        mask_tokens = self.mask_token.to(latent.dtype).expand(B, M, -1).masked_fill(~msk_valid.unsqueeze(-1), 0.0)
        V = latent.shape[1]
        dec = self.decoder(torch.cat([latent, mask_tokens], 1), torch.cat([v_centres, m_centres], 1),
                           torch.cat([vis_valid, msk_valid], 1))[:, V:]                 # (B, M, C)
        k = self.tokenizer.group_size
        pred = self.head(dec[msk_valid]).view(-1, k, 3)                                 # (M_total, k, 3)
        flat_idx = msk_idx[msk_valid]
        rows = torch.arange(B, device=pos.device).unsqueeze(1).expand(B, M)[msk_valid]
        target = groups.relative[rows, flat_idx].to(pred.dtype)                          # (M_total, k', 3)
        target_mask = groups.point_valid[rows, flat_idx]
        if pred.shape[0]:
            loss = chamfer_l2(pred, target, target_mask=target_mask)
        else:   # nothing masked (mask_ratio 0 or one-group clouds): a zero that keeps the graph
            loss = self.head.weight.sum() * 0.0
        details = dict(pred=pred, target=target, target_mask=target_mask, masked=masked, visible=visible,
                       groups=groups, latent=latent, latent_mask=vis_valid, visible_index=vis_idx)
        return loss, details


# ------------------------------------------------------------------------------------------------
# fine-tuning classifier
# ------------------------------------------------------------------------------------------------
class PointMAEClassifier(nn.Module):
    """Fine-tuning model: the tokenizer and encoder of a :class:`PointMAE` over all groups (no
    masking), max-pool over the tokens, FC head Linear(C, C) → ReLU → [Dropout] → Linear(C, num_classes).

    Args: num_classes; dropout: of the head (0: none); the other options are :class:`PointMAE`'s
    (its decoder-only options are accepted and ignored, so a pre-training config's options carry over).
    Build from pre-trained weights with :meth:`from_pretrained`.
    Shapes: forward(x (B, N, F) | None, pos (B, N, 3), mask (B, N) | None) -> logits (B, num_classes).
    """

    def __init__(self, num_classes: int = 40, num_groups: int = 8, group_size: int = 16, dim: int = 32,
                 depth: int = 2, heads: int = 4, head_dim: int = 8, ffn_hidden: int | None = None,
                 tokenizer_hidden: int = 16, pos_hidden: int = 128, in_dim: int = 0, attention: str = "full",
                 attention_options: dict | None = None, eval_cycle: str = "coordinates", dropout: float = 0.0,
                 decoder_depth: int | None = None, mask_ratio: float | None = None, seed: int | None = None):
        super().__init__()
        _check_int("num_classes", num_classes, 1)
        _check_encoder_options(depth, heads, head_dim, pos_hidden, ffn_hidden, eval_cycle)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"dropout: expected a number in [0, 1), got {dropout!r}")
        ffn_hidden = ffn_hidden or dim
        self.in_dim = in_dim
        self.tokenizer = PointGroupTokenizer(num_groups, group_size, dim, tokenizer_hidden, in_dim)
        self.encoder = PointMAEEncoder(dim, depth, heads, head_dim, ffn_hidden, pos_hidden, attention,
                                       attention_options, eval_cycle)
        layers: list[nn.Module] = [nn.Linear(dim, dim), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        self.head = nn.Sequential(*layers, nn.Linear(dim, num_classes))

    @classmethod
    def from_pretrained(cls, source: PointMAE | Mapping[str, torch.Tensor], num_classes: int = 40,
                        dropout: float = 0.0, **options) -> "PointMAEClassifier":
        """A classifier whose tokenizer and encoder are a copy of ``source``'s (structure and weights).

        ``source``: a :class:`PointMAE` (its options are used), a PointMAE ``state_dict`` with the
        ``options`` it was built with, or an engine checkpoint (``best.pt``/``last.pt`` of a
        ``point-mae`` run: the state_dict under ``"model"``, its options under ``"model_config"``,
        which ``options`` override). The head is new.
        """
        if isinstance(source, PointMAE):
            options = {**source.config, **options}
            state = source.state_dict()
        elif isinstance(source, Mapping):
            state = source
            if isinstance(source.get("model"), Mapping):   # an engine checkpoint
                state = source["model"]
                options = {**dict(source.get("model_config") or {}), **options}
        else:
            raise ValueError(f"source: expected a PointMAE or its state_dict, got {type(source).__name__}")
        model = cls(num_classes=num_classes, dropout=dropout, **options)
        wanted = {k: v for k, v in state.items() if k.startswith(("tokenizer.", "encoder."))}
        if not wanted:
            raise ValueError("source: no 'tokenizer.' / 'encoder.' weights (not a PointMAE state_dict)")
        missing, _ = model.load_state_dict(wanted, strict=False)
        missing = [k for k in missing if not k.startswith("head.")]
        if missing:
            raise ValueError(f"source: the state_dict does not match the options (missing {missing[:3]})")
        return model

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        groups = self.tokenizer(pos, mask, x)
        h = self.encoder(groups.tokens, groups.centres, groups.valid)
        return self.head(masked_max(h, groups.valid))


def _load_checkpoint(path: str) -> Mapping[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a missing file, or not a weights-only torch file
        raise ValueError(f"pretrained: cannot load {path!r} "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(state, Mapping):
        raise ValueError(f"pretrained: {path!r} does not hold a state_dict")
    return state


@register_model("point-mae")
def point_mae(**options) -> PointMAE:
    """Masked point pre-training (Point-MAE scheme; Sampled Transformer MAE-dense / MAE-sampled)."""
    return PointMAE(**options)


@register_model("point-mae-cls")
def point_mae_cls(pretrained: str | None = None, **options) -> PointMAEClassifier:
    """Point-MAE fine-tuning classifier (tokenizer + encoder, max-pool, FC head); ``pretrained``: a
    point-mae run's checkpoint file (its options are used) or a PointMAE state_dict file built with
    the given options."""
    if pretrained is None:
        return PointMAEClassifier(**options)
    num_classes, dropout = options.pop("num_classes", 40), options.pop("dropout", 0.0)
    return PointMAEClassifier.from_pretrained(_load_checkpoint(pretrained), num_classes, dropout, **options)

