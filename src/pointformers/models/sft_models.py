"""SFT point-cloud models (SFT paper, Sec. 5.2, App. D): classifier, part segmenter, rotation-invariant variants.

* ``sft-cls`` — :class:`SFTPointClassifier`: tokens ``Linear([xyz, normals]) → D``; a stack of SFT
  layers (:class:`SFTEncoder` of :func:`~pointformers.attention.sft.SFTBlock`) with the relative features ``[‖x_i − x_j‖², n_i·n_j]`` (r = 2); the ModelNet40 head "uses
  our differentiable sampling to sample 512 tokens and then uses a maximum aggregation": an
  :class:`~pointformers.attention.sft.SFTSampler` with k = 512 bins, max-pool over the soft duplets,
  then a linear layer to the classes.
* ``sft-partseg`` — :class:`SFTPartSegmenter`: the same encoder and a per-token linear head to the
  part logits (the paper describes no per-token head; where it is silent, we use a linear one).
* ``sft-ri-cls`` / ``sft-ri-partseg`` — the rotation-invariant variant (SFT paper, Table 1 and
  App. D.1): "input token value are replaced by tensor filled with one"; the only geometric input is
  the relative features, both SO(3)-invariant, so the model output is exactly invariant to rotations of the
  cloud (and to translations). The leak of SFT's probability injects the rank that lets the
  all-ones tokens become distinct.

Paper settings (Tables 8–9, experiments 1.1–1.4), as option dicts :data:`PAPER_CLS`,
:data:`PAPER_PARTSEG`: d = 256, 16 heads, 8 layers, k = 256 sampled tokens per layer, head k = 512,
Drop Token 0.5 (cls) / 0.2 (seg), Q/K dropout 0.1, token dropout 0.1, FFN dropout 0.2, FFN ×4
GeLU, τ = 1. The constructors' defaults are small (tests run in seconds); configs set paper sizes.
Norm position: Table 9's row is garbled (6 entries for 12 experiments); default pre-LN (post-LN for
the rotation-invariant variant, whose all-ones input needs the post-LN of the rank-injection study).

``attention="full"`` (or any other registry key) gives the **full-attention twin**: the same
embedding, depth, width, heads, norm position, FFN, dropouts and head, with the token mixer
replaced by that mechanism inside :class:`~pointformers.nn.transformer_block.TransformerBlock`.
The layout asks the mechanism, never its name: SFT's options (``k``, ``drop_token``,
``qk_dropout``) go to a mechanism whose constructor takes them (``attention_options`` win), and
a mechanism that takes relative features (an ``rpe`` option, as SFT) runs in :class:`SFTEncoder`,
which feeds it the relative-feature payload ``[xyz, normals]`` (``relative=True``: ``rpe="points"``)
and makes the rotation-invariant variant possible; any other runs in plain blocks on ``xyz``
(state keys ``encoder.blocks.*`` instead of ``encoder.encoder.blocks.*``).

Inputs: ``x`` (B, N, F) per-point features (F = ``in_dim``; with ``normals=True`` these are the unit
surface normals, which also feed the n_i·n_j relative feature), ``pos`` (B, N, 3) coordinates,
``mask`` (B, N) bool (True = real point). Padded points never change a real cloud's output in eval.
Randomness: SFT's sampler draws Gumbel noise, random partners and drop-token masks in training only;
``eval()`` is deterministic. The plain models are then exactly invariant (classifier) / equivariant
(segmenter) to the storage order of the points. The rotation-invariant variant is not: its first
layer scores identical all-ones tokens, so the eval sampler's tie-break (index order) picks the
first points; it is exactly rotation-invariant and order-invariant only in distribution (in
training the Gumbel noise breaks the ties at random).
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import ForwardContext, build as build_attention, entry as attention_entry
from ..attention.sampling import gather_rows
from ..attention.sft import SFTSampler
from ..data.batch import accepts_flat_batch
from ..nn.model_inputs import check_point_inputs
from ..nn.pooling import masked_max
from ..nn.transformer_block import TransformerBlock
from .registry import register_model

#: Paper options of the ModelNet40 classifier (exp. 1.1; 1.3 adds ``rotation_invariant=True``).
PAPER_CLS = dict(num_classes=40, in_dim=3, dim=256, depth=8, heads=16, k=256, head_k=512, drop_token=0.5,
                 qk_dropout=0.1, dropout=0.1, ffn_dropout=0.2)
#: Paper options of the ShapeNetPart segmenter (exp. 1.2; 1.4 adds ``rotation_invariant=True``).
PAPER_PARTSEG = dict(num_parts=50, in_dim=3, dim=256, depth=8, heads=16, k=256, drop_token=0.2,
                     qk_dropout=0.1, dropout=0.1, ffn_dropout=0.2)


def sft_layer(dim: int, attention: str = "sft", heads: int = 8, norm_position: str = "pre", ffn_mult: int = 4,
              dropout: float = 0.0, ffn_dropout: float = 0.0, **mixer_options) -> TransformerBlock:
    """SFT's layer around mechanism ``attention``: a LayerNorm
    :class:`~pointformers.nn.transformer_block.TransformerBlock` (pre or post, GeLU FFN ×``ffn_mult``,
    ``dropout`` after both branches, ``ffn_dropout`` inside the FFN) whose mixer is
    ``build(attention, dim=dim, heads=heads, **mixer_options)``. With ``"sft"`` this is
    :func:`~pointformers.attention.sft.SFTBlock` (same modules, same initialisation order)."""
    if norm_position not in ("pre", "post"):
        raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
    return TransformerBlock(dim, build_attention(attention, dim=dim, heads=heads, **mixer_options), norm="layer",
                            norm_position=norm_position, activation="gelu", ffn_mult=ffn_mult, dropout=dropout,
                            ffn_dropout=ffn_dropout)


class SFTEncoder(nn.Module):
    """A stack of SFT layers (:func:`sft_layer`, default mixer SFT's), with the rotation-invariant
    point variant (SFT §5.1, Table 1).

    With ``rotation_invariant=True`` the tokens are replaced by all-ones vectors (B, N, D) and the
    only geometric input is the relative features ``[‖x_i − x_j‖², n_i·n_j]`` of ``pos = [xyz,
    normals]`` (``rpe="points"``, ``normal_dims`` = 3 by default): both are SO(3)-invariant, so the
    whole model is exactly rotation-invariant; the leak injects the rank that lets the all-ones
    tokens become distinct. ``x`` is then ignored and may be None.

    Args:
        dim: width D; depth: number of blocks; heads, k: as :class:`~pointformers.attention.sft.SFTAttention`
            (``k`` reaches a mechanism whose constructor takes it).
        rotation_invariant: the variant above (needs a mechanism that takes relative features, ``rpe``).
        tokens: the rotation-invariant variant's input tokens: ``"ones"`` (the paper's all-ones vectors)
            or ``"radial"`` (a remedy for their slow start, not the paper's: a linear embedding of each
            point's invariants about its cloud's centroid c, ‖x_i − c‖ and, with normals,
            n_i·(x_i − c)/‖x_i − c‖; still exactly invariant to rotations and translations), or
            ``"local"`` (also invariant descriptors of each point's neighbourhood: :meth:`_local`).
        norm_position: ``"pre"``/``"post"``; default post for the rotation-invariant variant (Table 9,
            exp. 1.3) and pre otherwise.
        attention: the registry key of the layers' mixer (default ``"sft"``).
        **block_options: passed to every :func:`sft_layer` (``ffn_mult``, ``dropout``, ``ffn_dropout``;
            the rest to the mixer: ``rpe``, ``normal_dims``, ``drop_token``, ...).
    Shapes: x (B, N, D) or None, pos (B, N, P), mask (B, N) -> (B, N, D). ``edge_attr`` (B, N, N, r),
    for ``rpe="graph"``, reaches every layer through the forward pass's
    :class:`~pointformers.attention.ForwardContext`.
    """

    def __init__(self, dim: int, depth: int, heads: int = 8, k: int = 256, rotation_invariant: bool = False,
                 norm_position: str | None = None, attention: str = "sft", tokens: str = "ones", **block_options):
        super().__init__()
        if tokens not in TOKENS:
            raise ValueError(f"tokens: expected 'ones' (the paper's), 'radial' or 'local', got {tokens!r}")
        if tokens != "ones" and not rotation_invariant:
            raise ValueError(f"tokens={tokens!r} is an input of the rotation-invariant variant (rotation_invariant=True)")
        mechanism = attention_entry(attention)
        if rotation_invariant:
            if not mechanism.accepts("rpe"):
                raise ValueError(f"rotation_invariant=True needs a mechanism that takes relative features (rpe=, "
                                 f"as 'sft'); {attention!r} does not")
            if block_options.setdefault("rpe", "points") != "points":
                raise ValueError("rotation_invariant=True needs rpe='points' (relative features only)")
            block_options.setdefault("normal_dims", 3)
        if mechanism.accepts("k"):
            block_options.setdefault("k", k)
        norm_position = norm_position or ("post" if rotation_invariant else "pre")
        self.dim, self.rotation_invariant = dim, rotation_invariant
        self.normal_dims = block_options.get("normal_dims", 0)
        self.tokens = tokens
        width = {"ones": 0, "radial": 1 + (self.normal_dims > 0), "local": 4 + 3 * (self.normal_dims > 0)}[tokens]
        self.token_embed = nn.Linear(width, dim) if width else None
        self.blocks = nn.ModuleList(sft_layer(dim, attention, heads=heads, norm_position=norm_position,
                                              **block_options) for _ in range(depth))

    def forward(self, x: torch.Tensor | None = None, pos: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *, edge_attr: torch.Tensor | None = None) -> torch.Tensor:
        if self.rotation_invariant:
            if not isinstance(pos, torch.Tensor) or pos.dim() != 3:
                raise ValueError("sft: the rotation-invariant encoder needs pos (B, N, P) = [xyz, normals]")
            if self.token_embed is None:
                x = pos.new_ones(*pos.shape[:2], self.dim)
            else:
                x = self._radial(pos, mask) if self.tokens == "radial" else self._local(pos, mask)
        elif x is None:
            raise ValueError("sft: x (B, N, D) is required unless rotation_invariant=True")
        context = ForwardContext(pos, mask, edge_attr=edge_attr)
        for blk in self.blocks:
            x = blk(x, pos, mask, context=context)
        return x

    def _radial_invariants(self, pos: torch.Tensor, mask: torch.Tensor | None):
        """Each point's invariants about its cloud's masked centroid c: ``(r, nr, w)`` with r = ‖x_i − c‖,
        nr = n_i·(x_i − c)/r (None without normals), each (B, N, 1), and w (B, N, 1) 1 at real points."""
        xyz = pos[..., :3]
        w = torch.ones_like(xyz[..., :1]) if mask is None else mask.unsqueeze(-1).to(xyz.dtype)
        c = (xyz * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1.0)
        d = xyz - c
        r = d.norm(dim=-1, keepdim=True)
        nr = (pos[..., 3:6] * d).sum(-1, keepdim=True) / r.clamp_min(1e-12) if self.normal_dims else None
        return r, nr, w

    def _radial(self, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``tokens="radial"``: Linear([‖x_i − c‖, n_i·(x_i − c)/‖x_i − c‖]) with c the masked centroid.
        pos (B, N, 3 + normal_dims), mask (B, N) | None -> (B, N, D)."""
        r, nr, w = self._radial_invariants(pos, mask)
        return self.token_embed(torch.cat([r] if nr is None else [r, nr], -1)) * w

    def _local(self, pos: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``tokens="local"``: a linear map of each point's rotation- and translation-invariant
        descriptors (a remedy, not the paper's): the radial pair of :meth:`_radial`; over its
        :data:`LOCAL_NEIGHBOURS` nearest real neighbours j, the mean distance, and the two smallest
        eigenvalues of their offsets' covariance over its trace (flatness, elongation); with normals,
        the mean n_i·n_j (curvature), the mean n_i·(x_j − x_i)/‖x_j − x_i‖ (convex or concave) and
        n_i·(x_i − c)/‖x_i − c‖. Each is a function of distances and dot products of rotated vectors,
        so the tokens are exactly invariant (up to rounding). pos (B, N, 3 + normal_dims) -> (B, N, D)."""
        xyz = pos[..., :3]
        B, N, _ = xyz.shape
        r, nr, w = self._radial_invariants(pos, mask)
        real = w.squeeze(-1) > 0
        dist = torch.cdist(xyz, xyz).masked_fill(~real[:, None, :], float("inf"))
        dist.diagonal(dim1=1, dim2=2).fill_(float("inf"))                    # not its own neighbour
        kk = max(1, min(LOCAL_NEIGHBOURS, N - 1))
        nd, idx = dist.topk(kk, dim=-1, largest=False)                      # (B, N, k)
        ok = torch.isfinite(nd)                                              # fewer real neighbours: skip
        okf = ok.to(xyz.dtype).unsqueeze(-1)
        cnt = okf.sum(2).clamp_min(1.0)                                      # (B, N, 1)

        def neighbours(t):   # (B, N, 3) -> each point's kk nearest neighbours' rows, (B, N, kk, 3)
            return torch.gather(t.unsqueeze(1).expand(B, N, N, 3), 2, idx.unsqueeze(-1).expand(B, N, kk, 3))

        nb = neighbours(xyz)
        off = (nb - xyz.unsqueeze(2)) * okf                                  # (B, N, k, 3)
        mean_d = (nd.nan_to_num(0.0, posinf=0.0).unsqueeze(-1) * okf).sum(2) / cnt
        cov = off.transpose(-1, -2) @ off / cnt.unsqueeze(-1)                # (B, N, 3, 3)
        ev = torch.linalg.eigvalsh(cov)                                      # ascending
        shape = ev[..., :2] / ev.sum(-1, keepdim=True).clamp_min(1e-12)
        feats = [r, mean_d, shape]
        if self.normal_dims:
            nrm = pos[..., 3:6]
            curv = ((neighbours(nrm) * nrm.unsqueeze(2)).sum(-1, keepdim=True) * okf).sum(2) / cnt
            unit = off / off.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            convex = ((unit * nrm.unsqueeze(2)).sum(-1, keepdim=True) * okf).sum(2) / cnt
            feats += [nr, curv, convex]
        return self.token_embed(torch.cat(feats, -1)) * w


#: Input tokens of the rotation-invariant variant (:class:`SFTEncoder`'s ``tokens``).
TOKENS = ("ones", "radial", "local")
#: Neighbours of ``tokens="local"``'s descriptors.
LOCAL_NEIGHBOURS = 16


class SFTPointEncoder(nn.Module):
    """Per-point SFT encoder: (x, pos, mask) -> tokens (B, N, D), shared by the classifier and segmenter.

    Args:
        in_dim: per-point feature channels F of ``x`` (0: coordinates only, x is None).
        normals: ``x`` holds unit normals (needs in_dim = 3), used in the n_i·n_j relative feature.
        dim, depth, heads: width D, layers, heads.
        k: sampled tokens per layer (paper 256).
        rotation_invariant: all-ones tokens, relative features only (needs a mechanism that takes
            relative features, an ``rpe`` option: ``attention="sft"``).
        tokens: the rotation-invariant tokens, ``"ones"`` (paper), ``"radial"`` or ``"local"`` (see :class:`SFTEncoder`).
        relative: feed the point relative features to a mechanism that takes them (``rpe="points"``;
            paper: yes).
        norm_position: ``"pre"``/``"post"`` (default: post when rotation-invariant, else pre).
        drop_token, qk_dropout: SFT's Drop Token Probability and attention-score (Q/K) dropout.
        dropout, ffn_dropout: token-embedding dropout and feed-forward dropout.
        attention: ``"sft"`` or any registry key for the twin; attention_options: its extra options.
    ``k``, ``drop_token`` and ``qk_dropout`` reach a mechanism whose constructor takes them (module
    docstring); ``attention_options`` win over them.
    Shapes: x (B, N, F) | None, pos (B, N, 3), mask (B, N) | None -> tokens (B, N, D), mask (B, N).
    """

    def __init__(self, in_dim: int = 3, normals: bool = True, dim: int = 32, depth: int = 2, heads: int = 4,
                 k: int = 16, rotation_invariant: bool = False, relative: bool = True,
                 norm_position: str | None = None, drop_token: float = 0.0, qk_dropout: float = 0.0,
                 dropout: float = 0.0, ffn_dropout: float = 0.0, attention: str = "sft",
                 attention_options: dict | None = None, tokens: str = "ones"):
        super().__init__()
        if tokens != "ones" and not rotation_invariant:
            raise ValueError(f"tokens={tokens!r} is an input of the rotation-invariant variant (rotation_invariant=True)")
        if not isinstance(in_dim, int) or in_dim < 0:
            raise ValueError(f"in_dim must be an int >= 0, got {in_dim!r}")
        if normals and in_dim != 3:
            raise ValueError(f"normals=True needs in_dim=3 (x = unit normals), got in_dim={in_dim}")
        mechanism = attention_entry(attention)
        takes_relative = mechanism.accepts("rpe")   # SFT's relative features of the points
        if rotation_invariant and not takes_relative:
            raise ValueError(f"rotation_invariant=True needs a mechanism that takes relative features (rpe=, as "
                             f"'sft'); {attention!r} does not, and all-ones tokens carry no information without them")
        if rotation_invariant and not relative:
            raise ValueError("rotation_invariant=True needs relative=True (relative features are its only input)")
        self.in_dim, self.normals, self.dim = in_dim, normals, dim
        self.rotation_invariant, self.attention = rotation_invariant, attention
        self.norm_position = norm_position or ("post" if rotation_invariant else "pre")
        opts = {name: value for name, value in (("k", k), ("drop_token", drop_token), ("qk_dropout", qk_dropout))
                if mechanism.accepts(name)}
        opts.update(attention_options or {})
        if takes_relative:
            if relative:
                opts.update(rpe="points", normal_dims=3 if normals else 0)
            self.encoder = SFTEncoder(dim, depth, heads=heads, rotation_invariant=rotation_invariant, tokens=tokens,
                                      norm_position=self.norm_position, attention=attention, dropout=dropout,
                                      ffn_dropout=ffn_dropout, **opts)
            self.blocks = None
        else:   # SFT's layer with a mixer that reads no relative features, on the coordinates
            self.encoder = None
            self.blocks = nn.ModuleList(sft_layer(dim, attention, heads=heads, norm_position=self.norm_position,
                                                  dropout=dropout, ffn_dropout=ffn_dropout, **opts)
                                        for _ in range(depth))
        self.embed = None if rotation_invariant else nn.Linear(3 + in_dim, dim)
        # a pre-LN stack ends un-normalised: normalise once before the head (post-LN already is)
        self.final_norm = nn.LayerNorm(dim) if self.norm_position == "pre" else nn.Identity()

    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None,
                extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``extra`` (B, D): a per-cloud vector added to every input token (e.g. a category embedding)."""
        mask = check_point_inputs(x, pos, mask, in_dim=self.in_dim, who=type(self).__name__)
        keep = mask.unsqueeze(-1)
        pos = pos.masked_fill(~keep, 0.0)
        x = None if x is None else x.masked_fill(~keep, 0.0)
        rel = torch.cat([pos, x], -1) if self.normals else pos       # SFT's relative-feature payload
        if self.rotation_invariant:
            h = self.encoder(None, rel, mask)
        else:
            inp = pos if x is None else torch.cat([pos, x], -1)
            h = self.embed(inp)
            if extra is not None:
                h = h + extra[:, None, :]
            h = h.masked_fill(~keep, 0.0)
            if self.encoder is not None:
                h = self.encoder(h, rel, mask)
            else:
                for blk in self.blocks:
                    h = blk(h, pos, mask)
        return self.final_norm(h).masked_fill(~keep, 0.0), mask


class SampledMaxHead(nn.Module):
    """SFT's ModelNet40 head: sample ``k`` soft duplets with SFT's sampler, max-pool them, linear to classes.

    ``pool="max"`` is a plain masked max over all tokens instead. tokens (B, N, D), mask (B, N) -> (B, C).
    """

    def __init__(self, dim: int, num_classes: int, k: int = 512, pool: str = "sample_max"):
        super().__init__()
        if pool not in ("sample_max", "max"):
            raise ValueError(f"pool must be 'sample_max' or 'max', got {pool!r}")
        self.pool = pool
        self.sampler = SFTSampler(dim, k) if pool == "sample_max" else None
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.sampler is None:
            return self.fc(masked_max(h, mask))
        s = self.sampler(h, mask)
        p = s.p.unsqueeze(-1).to(h.dtype)
        duplets = p * gather_rows(h, s.idx_top) + (1 - p) * gather_rows(h, s.idx_rand)  # (B, k', D)
        return self.fc(masked_max(duplets, s.key_valid))


class SFTPointClassifier(nn.Module):
    """SFT shape classifier: :class:`SFTPointEncoder` → sample-``head_k`` + max head → class logits.

    Args: ``num_classes``, ``head_k`` (paper 512), ``head_pool`` (``"sample_max"`` paper, or ``"max"``) and
    every option of :class:`SFTPointEncoder`. Paper options: :data:`PAPER_CLS`.
    Shapes: forward(x (B, N, F) | None, pos (B, N, 3), mask (B, N) | None) -> logits (B, num_classes).
    """

    def __init__(self, num_classes: int = 40, head_k: int = 16, head_pool: str = "sample_max", **encoder_options):
        super().__init__()
        self.encoder = SFTPointEncoder(**encoder_options)
        self.head = SampledMaxHead(self.encoder.dim, num_classes, head_k, head_pool)

    @accepts_flat_batch()
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h, mask = self.encoder(x, pos, mask)
        return self.head(h, mask)


class SFTPartSegmenter(nn.Module):
    """SFT part segmenter: :class:`SFTPointEncoder` → per-token linear head → part logits.

    Args:
        num_parts: part classes P (ShapeNetPart 50).
        num_categories: when given, the object category conditions the model (the paper does not say
            whether it does): a category embedding is added to the input tokens (not in
            the rotation-invariant variant, whose tokens are all ones) and a per-category logit bias
            to the head. ``forward`` then needs ``category`` (B,).
        **encoder_options: as :class:`SFTPointEncoder`. Paper options: :data:`PAPER_PARTSEG`.
    Shapes: forward(x, pos, mask, category) -> logits (B, N, P), padded rows zero.
    """

    def __init__(self, num_parts: int = 50, num_categories: int | None = None, **encoder_options):
        super().__init__()
        self.encoder = SFTPointEncoder(**encoder_options)
        D = self.encoder.dim
        self.num_categories = num_categories
        self.category_embed = nn.Embedding(num_categories, D) if num_categories and not \
            self.encoder.rotation_invariant else None
        self.category_bias = nn.Embedding(num_categories, num_parts) if num_categories else None
        self.head = nn.Linear(D, num_parts)

    @accepts_flat_batch(per_point=True)
    def forward(self, x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None = None,
                category: torch.Tensor | None = None) -> torch.Tensor:
        cat = check_category(category, self.num_categories, pos)
        extra = self.category_embed(cat) if self.category_embed is not None else None
        h, mask = self.encoder(x, pos, mask, extra=extra)
        logits = self.head(h)
        if self.category_bias is not None:
            logits = logits + self.category_bias(cat)[:, None, :]
        return logits.masked_fill(~mask.unsqueeze(-1), 0.0)


def check_category(category: torch.Tensor | None, num_categories: int | None, ref: torch.Tensor) -> torch.Tensor | None:
    """Validate the per-cloud category ids (B,) of a segmenter built with ``num_categories``."""
    if not num_categories:
        return None
    B = ref.shape[0] if isinstance(ref, torch.Tensor) and ref.dim() >= 1 else None
    if not isinstance(category, torch.Tensor) or category.shape != (B,) or category.is_floating_point() \
            or category.dtype == torch.bool:
        raise ValueError(f"category: expected (B,) = ({B},) integer category ids (the model was built with "
                         f"num_categories={num_categories}), got "
                         f"{getattr(category, 'dtype', type(category).__name__)} {tuple(getattr(category, 'shape', ()))}")
    if int(category.min()) < 0 or int(category.max()) >= num_categories:
        raise ValueError(f"category: ids must lie in [0, {num_categories}), got [{int(category.min())}, "
                         f"{int(category.max())}]")
    return category.long()


@register_model("sft-cls")
def sft_cls(**options) -> SFTPointClassifier:
    """SFT ModelNet40-style classifier (paper options: :data:`PAPER_CLS`)."""
    return SFTPointClassifier(**options)


@register_model("sft-ri-cls")
def sft_ri_cls(**options) -> SFTPointClassifier:
    """Rotation-invariant SFT classifier: all-ones tokens, relative features only (SFT Table 1)."""
    return SFTPointClassifier(**{"rotation_invariant": True, **options})


@register_model("sft-partseg")
def sft_partseg(**options) -> SFTPartSegmenter:
    """SFT ShapeNetPart-style part segmenter (paper options: :data:`PAPER_PARTSEG`)."""
    return SFTPartSegmenter(**options)


@register_model("sft-ri-partseg")
def sft_ri_partseg(**options) -> SFTPartSegmenter:
    """Rotation-invariant SFT part segmenter (SFT exp. 1.4)."""
    return SFTPartSegmenter(**{"rotation_invariant": True, **options})
