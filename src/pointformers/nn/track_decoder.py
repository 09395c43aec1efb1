"""A track-slot decoder: learned track slots that read a sector of hits and claim their tracks.

End-to-end track reconstruction (the design of the HEPT authors' set decoder, after DETR and
Mask2Former) puts this decoder behind a point encoder. The event is cut into ``k`` azimuthal sectors
of (nearly) equal hit count (:func:`phi_sectors`), and the sectors run as one batch. ``M`` learned
slots are the decoder's queries; each layer does

1. cross-attention from the slots to the sector's hits (padding hits masked out; optionally the
   Mask2Former attention mask: a slot sees only the hits it claimed at the previous stage),
2. self-attention among the slots,
3. a feed-forward,

each pre-normed with a residual. After every layer the shared heads predict, per slot, an object
logit (is this slot a track?) and, per (slot, hit), an assignment logit: the dot product of the
slot's mask embedding with the hit's feature. Every layer's predictions are returned, for deep
supervision (:mod:`pointformers.tasks.tracking.set_criterion`).

At inference (:func:`assign_hits`) each real hit takes the slot of highest score
``σ(object)·σ(assignment)`` in its sector, or no track (−1) below a threshold; padding hits are never
assigned. :func:`labels_to_hits` brings the sectors' labels back to the event's hits (with overlapping
sectors, a hit keeps the label of its higher-scoring sector).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .model_inputs import is_tracing

__all__ = ["TrackDecoder", "DecoderOutput", "Sectors", "phi_sectors", "gather_sectors", "sector_frame", "assign_hits",
           "labels_to_hits", "stitch_tracks"]


class Sectors(NamedTuple):
    """The hits of each sector: ``index`` ``(B·k, L)`` int64 positions into the event's ``N`` hits (0 at
    padding), ``mask`` ``(B·k, L)`` bool (True = a real hit), ``k`` sectors per event (sector ``s`` of event
    ``b`` is row ``b·k + s``)."""

    index: torch.Tensor
    mask: torch.Tensor
    k: int


def _overlap_permille(overlap: float) -> int:
    if not (isinstance(overlap, (int, float)) and not isinstance(overlap, bool) and 0.0 <= overlap <= 0.5):
        raise ValueError(f"phi_sectors: overlap must be a fraction of a sector in [0, 0.5], got {overlap!r}")
    return int(round(overlap * 1000))


def phi_sectors(phi: torch.Tensor, mask: Optional[torch.Tensor], k: int, overlap: float = 0.0) -> Sectors:
    """Cut each event into ``k`` azimuthal sectors of equal hit count.

    The real hits of an event are ordered by φ; sector ``s`` takes positions ``[s·c, (s+1)·c)`` of that
    order (``c = ⌈n/k⌉``, the last sector may be shorter), widened by ``⌈overlap·c⌉`` hits on each side
    (cyclically, across φ = ±π) when ``overlap > 0``. The sector length ``L`` depends on the padded size
    ``N`` alone (``⌈N/k⌉ + 2⌈overlap·⌈N/k⌉⌉``), so the cut traces with a dynamic point count.

    Args:
        phi: ``(B, N)`` azimuth of every hit (any real numbers; the order is what matters).
        mask: ``(B, N)`` bool, True for a real hit, or None (all real).
        k: sectors per event, ``>= 1``.
        overlap: fraction of a sector added on each side, in ``[0, 0.5]``.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"phi_sectors: k must be an integer >= 1, got {k!r}")
    permille = _overlap_permille(overlap)
    if phi.dim() != 2:
        raise ValueError(f"phi_sectors: phi must be (B, N), got {tuple(phi.shape)}")
    b, n = phi.shape
    if mask is None:
        mask = torch.ones_like(phi, dtype=torch.bool)
    elif mask.shape != phi.shape or mask.dtype != torch.bool:
        raise ValueError(f"phi_sectors: mask must be a bool tensor of phi's shape {tuple(phi.shape)}, "
                         f"got {mask.dtype} {tuple(mask.shape)}")
    c_max = (n + k - 1) // k
    o_max = (c_max * permille + 999) // 1000
    length = c_max + 2 * o_max
    key = torch.where(mask, phi, torch.full_like(phi, float("inf")))
    order = torch.sort(key, dim=1, stable=True).indices                  # real hits first, by φ
    n_real = mask.sum(1)                                                   # (B,)
    c = (n_real + (k - 1)) // k
    o = (c * permille + 999) // 1000
    s = torch.arange(k, device=phi.device)
    core_start = s[None, :] * c[:, None]                                   # (B, k)
    core_end = torch.minimum(core_start + c[:, None], n_real[:, None])
    start = core_start - o[:, None]
    count = torch.where(core_end > core_start, core_end - core_start + 2 * o[:, None], torch.zeros_like(core_start))
    count = torch.minimum(count, n_real[:, None])
    j = torch.arange(length, device=phi.device)
    pos = torch.remainder(start[..., None] + j, n_real.clamp_min(1)[:, None, None])  # (B, k, L)
    smask = j < count[..., None]
    index = torch.gather(order[:, None, :].expand(b, k, n), 2, pos)        # (B, k, L), no reshape of symbolic sizes
    index = torch.where(smask, index, torch.zeros_like(index))
    return Sectors(index.reshape(b * k, length), smask.reshape(b * k, length), k)


def gather_sectors(x: torch.Tensor, sectors: Sectors) -> torch.Tensor:
    """The per-hit tensor ``x`` ``(B, N, ...)`` cut into sectors: ``(B·k, L, ...)``, zeros at padding."""
    b = x.shape[0]
    rows = torch.arange(b, device=x.device).repeat_interleave(sectors.k)[:, None]   # (B·k, 1)
    out = x[rows, sectors.index]
    m = sectors.mask.reshape(sectors.mask.shape + (1,) * (out.dim() - 2))
    return torch.where(m, out, torch.zeros_like(out))


def sector_frame(eta: torch.Tensor, phi: torch.Tensor, sectors: Sectors) -> torch.Tensor:
    """Each sector's hits in the sector's own frame: ``(B·k, L, 3)`` = (η, cos Δφ, sin Δφ), Δφ the azimuth from
    the sector's centre (the direction of the mean of its real hits' unit vectors (cos φ, sin φ)); zeros at
    padding. The same hit pattern gives the same positions in every sector, whatever its azimuth.

    Args:
        eta, phi: ``(B, N)`` of every hit; sectors: from :func:`phi_sectors`.
    """
    eta, cos, sin = gather_sectors(torch.stack([eta, torch.cos(phi), torch.sin(phi)], -1), sectors).unbind(-1)
    cc, cs = cos.sum(1, keepdim=True), sin.sum(1, keepdim=True)        # padding gathered as zeros: real hits only
    norm = torch.sqrt(cc * cc + cs * cs).clamp_min(1e-12)
    cc, cs = cc / norm, cs / norm
    return torch.stack([eta, cos * cc + sin * cs, sin * cc - cos * cs], -1)   # still zeros at padding


class DecoderOutput(NamedTuple):
    """One stage of predictions: ``object_logits`` ``(S, M)``, ``assign_logits`` ``(S, M, n)`` (values at
    padding hits are meaningless: mask them) and the normed slot states ``slots`` ``(S, M, dim)`` the heads
    read (for heads of one's own, e.g. track parameters)."""

    object_logits: torch.Tensor
    assign_logits: torch.Tensor
    slots: torch.Tensor


def _eager_inference() -> bool:
    """Whether this call runs eagerly without autograd: the inference-only fast paths (in place, shared buffers,
    the claims' attention) may run; a traced graph or a training step keeps the general form."""
    return not is_tracing() and not torch.is_grad_enabled()


class _Claims(NamedTuple):
    """The Mask2Former mask in the form eager inference attends by: ``claimed`` ``(S, M, n)`` bool, the hits each
    slot claims (real hits only), ``some`` ``(S, M)`` whether it claims any, ``keys`` ``(S, n)`` bool, the hits a
    slot claiming none sees (the real hits; every position in a sector without one)."""

    claimed: torch.Tensor
    some: torch.Tensor
    keys: torch.Tensor


class _Attention(nn.Module):
    """Multi-head attention with its own projections and a boolean mask: PyTorch's fused attention when eager,
    written out (scores, masked softmax, weighted sum) when traced, so that torch.export traces it for any hit
    count."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.dropout = nn.Dropout(dropout)

    def forward(self, q: torch.Tensor, kv: torch.Tensor, allowed: Optional[torch.Tensor],
                key_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        """q ``(S, M, dim)``, kv ``(S, n, dim)``, allowed ``(S, 1, M or 1, n)`` (bool, or additive when eager) or None,
        key_pos ``(S, n, dim)``
        or None (added to the keys only, as DETR adds its positional encoding) -> ``(S, M, dim)``."""
        s, m, d = q.shape
        k_in = kv if key_pos is None else kv + key_pos
        h = self.heads

        def split(proj: nn.Linear, t: torch.Tensor) -> torch.Tensor:   # (S, ·, d) -> (S, h, ·, d/h)
            # the projection on (S·n, d) made by flatten: a Linear on (S, n, d) reshapes it, and that reshape makes
            # torch.export guard on the hit count (n != 1) in a form it cannot prove
            return proj(t.flatten(0, 1)).unflatten(0, t.shape[:2]).unflatten(-1, (h, d // h)).transpose(1, 2)

        scale = (d // h) ** -0.5
        if isinstance(allowed, _Claims):
            y = _attend_claims(split(self.q, q), split(self.k, k_in), split(self.v, kv), allowed, scale)
            return self.o(y.transpose(1, 2).reshape(s, m, d))
        if not is_tracing():
            # eager (training and inference): PyTorch's fused attention, forward and backward (no (S, h, M, n)
            # score tensor kept); every row of ``allowed`` has a True entry (_allowed's fallbacks), so no row
            # is empty. A traced graph takes the written-out form below, which exports for any hit count.
            y = F.scaled_dot_product_attention(split(self.q, q), split(self.k, k_in), split(self.v, kv),
                                               attn_mask=allowed, scale=scale,
                                               dropout_p=self.dropout.p if self.training else 0.0)
            return self.o(y.transpose(1, 2).reshape(s, m, d))
        scores = split(self.q, q) @ split(self.k, k_in).transpose(-1, -2) * scale   # (S, h, M, n)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        y = self.dropout(torch.softmax(scores, -1)) @ split(self.v, kv)
        return self.o(y.transpose(1, 2).reshape(s, m, d))


def _attend_claims(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, claims: _Claims, scale: float) -> torch.Tensor:
    """Attention under the Mask2Former mask without the ``(S, M, n)`` mask: the slots that claim no hit (most of them)
    attend to their sector's ``keys`` by the fused kernel (a ``(S, 1, 1, n)`` mask at most), each slot that claims
    hits to those alone, pair by pair (a softmax per slot over its few pairs). q ``(S, h, M, e)``, k, v
    ``(S, h, n, e)`` -> ``(S, h, M, e)``; the same as the masked attention up to float rounding."""
    S, h, M, e = q.shape
    out = q.new_zeros(S, h, M, e)
    rest = ~claims.some                                                         # (S, M)
    if bool(rest.any()):
        # the non-claiming slots of each sector first (stable order), padded to the most any sector has
        count = rest.sum(1)
        width = int(count.max())
        order = torch.sort((~rest).to(torch.int8), dim=1, stable=True).indices[:, :width]   # (S, width)
        rows = order[:, None, :, None].expand(S, h, width, e)
        key_mask = None
        if not bool(claims.keys.all()):
            key_mask = torch.zeros(claims.keys.shape, dtype=q.dtype, device=q.device).masked_fill_(
                ~claims.keys, float("-inf"))[:, None, None]
        y = F.scaled_dot_product_attention(torch.gather(q, 2, rows), k, v, attn_mask=key_mask, scale=scale)
        valid = torch.arange(width, device=q.device)[None] < count[:, None]         # (S, width)
        out.scatter_(2, rows, y * valid[:, None, :, None].to(y.dtype))
    if bool(claims.some.any()):
        sec, slot, hit = torch.nonzero(claims.claimed, as_tuple=True)               # (P,) each, slot-major
        row = sec * M + slot
        qp = q.permute(0, 2, 1, 3)[sec, slot]                                       # (P, h, e)
        kp, vp = k.permute(0, 2, 1, 3)[sec, hit], v.permute(0, 2, 1, 3)[sec, hit]
        z = (qp * kp).sum(-1) * scale                                               # (P, h)
        top = torch.full((S * M, h), float("-inf"), dtype=z.dtype, device=z.device).scatter_reduce_(
            0, row[:, None].expand(-1, h), z, "amax")
        w = torch.exp(z - top[row])
        norm = torch.zeros(S * M, h, dtype=z.dtype, device=z.device).index_add_(0, row, w)
        acc = torch.zeros(S * M, h, e, dtype=z.dtype, device=z.device).index_add_(0, row, w[..., None] * vp)
        some = claims.some.flatten()
        y = acc[some] / norm[some][..., None]                                       # (R, h, e)
        ys, ym = torch.nonzero(claims.some, as_tuple=True)
        out[ys, :, ym] = y
    return out


class _DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, dropout: float):
        super().__init__()
        self.norm_cross, self.norm_self, self.norm_ffn = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.cross = _Attention(dim, heads, dropout)
        self.self_attn = _Attention(dim, heads, dropout)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))

    def forward(self, slots: torch.Tensor, hits: torch.Tensor, allowed: torch.Tensor,
                hit_pos: Optional[torch.Tensor]) -> torch.Tensor:
        slots = slots + self.cross(self.norm_cross(slots), hits, allowed, hit_pos)
        z = self.norm_self(slots)
        slots = slots + self.self_attn(z, z, None)
        return slots + self.ffn(self.norm_ffn(slots))


class TrackDecoder(nn.Module):
    """Learned track slots decoding a batch of sectors of hit features.

    Args:
        dim: width of the hit features and the slots.
        num_slots: ``M``, slots per sector (the published design: 3,000 for 60k hits in 3 sectors;
            scale it with the hits per sector).
        heads: attention heads (``dim`` must be divisible by it).
        n_layers: decoder layers, each supervised.
        hidden: feed-forward width (default ``4·dim``).
        dropout: dropout of attention weights and the feed-forward.
        attention_mask: the Mask2Former attention mask: at each layer a slot cross-attends only to the
            hits whose assignment probability at the previous stage is at least ``mask_threshold``
            (a slot that claims no hit sees all of them).
        mask_threshold: see ``attention_mask``.
        pos_dim: ``> 0``: ``forward`` takes each hit's position ``pos`` ``(S, n, pos_dim)`` (e.g. in its
            sector's frame, :func:`sector_frame`), embedded by a small MLP and added to the keys of every
            cross-attention (DETR's positional encoding of the keys; the values and the assignment heads read
            the hit features alone), so that slots shared by all sectors can learn where to look. 0: none.
        seed_slots: each slot starts as its bank vector plus a projection of one seed hit of its sector (its
            normed feature, plus its embedded position with ``pos_dim``): slot ``m`` of ``M`` takes the real hit
            at position ⌊(2m + 1)·n / 2M⌋ of the sector's ``n`` real hits, in the sector's row order (φ order
            for :func:`phi_sectors`), so the seeds spread over the sector. Beyond the published design (DETR's
            learned queries alone; anchor- and query-selection variants of DETR converge in far fewer steps).
        assign_dim: ``> 0``: the assignment logits are a kernel in a hit embedding space of this size instead
            of the dot product with the hit features: ``forward`` takes each hit's embedding ``keys``
            ``(S, n, assign_dim)`` (e.g. the encoder's InfoNCE embedding, which groups a particle's hits
            early in training), each slot predicts a centre ``c`` there, and ``logit = α − β·‖e − c‖²``
            (``α``, ``β > 0`` learned): a slot claims the hits around its centre, as a density clustering
            of the embedding would. Beyond the published design. 0 (default): the published dot product.
        seed_centres: with ``seed_slots`` and ``assign_dim``: a slot's centre is its seed hit's key plus the
            offset the centre head predicts (its last layer starts at zero), so every slot starts out claiming
            the hits around a real hit of its sector, as a density clustering seeded there would, and learns
            to move, widen and score it (two-stage DETR's query selection, here from spread seeds). Beyond
            the published design.
        assign_refine: with ``assign_dim``: each slot also predicts its own kernel width (``β_m`` = softplus of
            the shared parameter plus a per-slot offset) and adds the published dot product of its mask embedding
            with the normed hit features to the kernel, ``logit = α − β_m·‖e − c‖² + w_m·h``; both start at zero
            (the kernel alone), so a slot learns to narrow its claim and to refuse hits near its centre whose
            features disagree (fewer impure tracks). Beyond the published design.

    Shapes: ``forward(hits (S, n, dim), mask (S, n) bool, pos (S, n, pos_dim) | None, keys (S, n, assign_dim) | None)``
    returns a list of ``n_layers``
    :class:`DecoderOutput` (one per layer, the last is the prediction); ``last_only=True`` returns the
    last one alone (a list of one), skipping the intermediate heads inference does not read (unless the
    attention mask needs them).
    """

    def __init__(self, dim: int, num_slots: int, heads: int = 8, n_layers: int = 2, hidden: Optional[int] = None,
                 dropout: float = 0.0, attention_mask: bool = False, mask_threshold: float = 0.5, pos_dim: int = 0,
                 seed_slots: bool = False, assign_dim: int = 0, seed_centres: bool = False,
                 assign_refine: bool = False):
        super().__init__()
        for name, flag in (("seed_slots", seed_slots), ("seed_centres", seed_centres), ("assign_refine", assign_refine)):
            if not isinstance(flag, bool):
                raise ValueError(f"TrackDecoder: {name} must be true or false, got {flag!r}")
        if seed_centres and not (seed_slots and isinstance(assign_dim, int) and assign_dim > 0):
            raise ValueError(f"TrackDecoder: seed_centres puts each slot's centre at its seed hit's key: it needs "
                             f"seed_slots=True and assign_dim > 0, got seed_slots={seed_slots!r}, "
                             f"assign_dim={assign_dim!r}")
        if assign_refine and not (isinstance(assign_dim, int) and assign_dim > 0):
            raise ValueError(f"TrackDecoder: assign_refine refines the kernel assignment: it needs assign_dim > 0, "
                             f"got assign_dim={assign_dim!r}")
        for name, v, lo in (("dim", dim, 1), ("num_slots", num_slots, 1), ("heads", heads, 1), ("n_layers", n_layers, 1),
                            ("pos_dim", pos_dim, 0), ("assign_dim", assign_dim, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"TrackDecoder: {name} must be an integer >= {lo}, got {v!r}")
        if dim % heads:
            raise ValueError(f"TrackDecoder: dim={dim} is not divisible by heads={heads}")
        if not (0.0 <= dropout < 1.0):
            raise ValueError(f"TrackDecoder: dropout must be in [0, 1), got {dropout!r}")
        if not (0.0 < mask_threshold < 1.0):
            raise ValueError(f"TrackDecoder: mask_threshold must be in (0, 1), got {mask_threshold!r}")
        hidden = 4 * dim if hidden is None else hidden
        self.dim, self.num_slots = dim, num_slots
        self.attention_mask, self.mask_threshold = bool(attention_mask), float(mask_threshold)
        self.slots = nn.Parameter(torch.randn(num_slots, dim) / math.sqrt(dim))   # the slot bank
        self.hit_norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(_DecoderLayer(dim, heads, hidden, dropout) for _ in range(n_layers))
        self.out_norm = nn.LayerNorm(dim)
        self.class_head = nn.Linear(dim, 1)
        self.mask_embed = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.pos_dim = pos_dim
        self.pos_embed = (nn.Sequential(nn.Linear(pos_dim, dim), nn.GELU(), nn.Linear(dim, dim)) if pos_dim
                          else None)
        self.seed_proj = nn.Linear(dim, dim) if seed_slots else None
        self.assign_dim = assign_dim
        if assign_dim:   # the slot's centre in the key space; α and β = softplus(·) start at 1 and 10
            self.centre = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, assign_dim))
            self.kernel = nn.Parameter(torch.tensor([1.0, math.log(math.expm1(10.0))]))
        self.seed_centres = seed_centres
        if seed_centres:   # the offset from the seed hit's key starts at zero: the centre starts on the seed
            nn.init.zeros_(self.centre[-1].weight)
            nn.init.zeros_(self.centre[-1].bias)
        # assign_refine: the per-slot width offset and the residual dot product start at zero (the kernel alone)
        self.width = nn.Linear(dim, 1) if assign_refine else None
        if self.width is not None:
            for lin in (self.width, self.mask_embed[-1]):
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)

    def seed_index(self, mask: torch.Tensor) -> torch.Tensor:
        """``(S, M)`` int64: the row of each slot's seed hit (``seed_slots``), ⌊(2m + 1)·n / 2M⌋ for the ``n``
        real hits of each sector (rows 0 … n − 1: real hits come first; 0 in a sector without one)."""
        n = mask.sum(1, keepdim=True)                                               # (S, 1)
        m = torch.arange(self.num_slots, device=mask.device)[None]
        return (2 * m + 1) * n // (2 * self.num_slots)

    def predict(self, slots: torch.Tensor, hits: torch.Tensor, keys: Optional[torch.Tensor] = None,
                out: Optional[torch.Tensor] = None, base: Optional[torch.Tensor] = None) -> DecoderOutput:
        """The heads on slots ``(S, M, dim)`` and normed hit features ``(S, n, dim)`` (with ``assign_dim``: the
        hits' embeddings ``keys`` ``(S, n, assign_dim)``, and with ``seed_centres`` the seed hits' keys ``base``
        ``(S, M, assign_dim)`` the centres are offsets from); ``out``: an ``(S, M, n)`` buffer the assignment
        logits are written into (no autograd)."""
        z = self.out_norm(slots)
        if not self.assign_dim:
            return DecoderOutput(self.class_head(z).squeeze(-1), torch.matmul(self.mask_embed(z), hits.transpose(1, 2),
                                                                              out=out), z)
        c = self.centre(z) if base is None else base + self.centre(z)                        # (S, M, E)
        # β: shared, or with assign_refine per slot (S, M, 1)
        beta = F.softplus(self.kernel[1] if self.width is None else self.kernel[1] + self.width(z))
        # α − β‖e − c‖² = [α − β‖c‖², 2βc, −β] · [1, e, ‖e‖²]: one batched product writes the (S, M, n) logits,
        # no elementwise pass over them (the largest tensors of the model at 60k hits); assign_refine's dot
        # product w·h joins the same product as further columns
        slot_parts = [self.kernel[0] - beta * (c * c).sum(-1, keepdim=True), (2.0 * beta) * c,
                      (-beta).expand(c.shape[:-1] + (1,))]                                     # (S, M, E + 2)
        hit_parts = [torch.ones_like(keys[..., :1]), keys, (keys * keys).sum(-1, keepdim=True)]
        if self.width is not None:
            slot_parts.append(self.mask_embed(z))
            hit_parts.append(hits)
        slot_side, hit_side = torch.cat(slot_parts, -1), torch.cat(hit_parts, -1)
        logits = torch.matmul(slot_side, hit_side.transpose(1, 2), out=out)
        return DecoderOutput(self.class_head(z).squeeze(-1), logits, z)

    def _allowed(self, mask: torch.Tensor, prev: Optional[DecoderOutput], dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Which hits each slot may attend to, ``(S, 1, M, n)`` (``(S, 1, 1, n)`` without a previous stage):
        bool when traced, the equivalent additive mask (0 or −inf, of ``dtype``) when eager, which the
        fused attention takes as it is (a bool mask it would convert, one more pass over the largest tensor);
        in eager inference with a previous stage, the claims themselves (:class:`_Claims`), which
        :func:`_attend_claims` attends by without a mask over every slot and hit.
        A slot claims the hits whose assignment probability at the previous stage is at least the threshold;
        a row with nothing allowed (a sector with no real hit, or a slot that claims none) falls back to the
        real hits, then to every position, so softmax never sees an empty row. None (everything allowed)
        without a previous stage when every position is a real hit (eager on the CPU only, where looking
        costs no device sync: a traced graph keeps the general form)."""
        eager = not is_tracing()
        all_real = eager and mask.device.type == "cpu" and bool(mask.all())
        if prev is None:
            if all_real:
                return None
            allowed = (mask | ~mask.any(-1, keepdim=True))[:, None, None]
            return allowed if not eager else torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill_(
                ~allowed, float("-inf"))
        # σ(logit) ≥ t exactly when logit ≥ log(t / (1 − t)): no sigmoid pass over the (S, M, n) logits.
        # One comparison per entry with a per-row level: the threshold where the slot claims a real hit, below
        # every finite logit where it claims none (its real hits), −inf in a sector without real hits (all)
        level = math.log(self.mask_threshold) - math.log1p(-self.mask_threshold)
        logits = prev.assign_logits
        if _eager_inference() and not self.training:   # inference: the claims (:func:`_attend_claims`)
            claimed = logits >= level if all_real else (logits >= level) & mask[:, None, :]
            return _Claims(claimed, claimed.any(-1), mask | ~mask.any(-1, keepdim=True))
        if not all_real:
            logits = logits.masked_fill(~mask[:, None, :], float("-inf"))   # padding never claimed
        top = logits.amax(-1, keepdim=True)                                  # (S, M, 1)
        floor = torch.where(top > float("-inf"), torch.full_like(top, torch.finfo(top.dtype).min),
                            torch.full_like(top, float("-inf")))
        row_level = torch.where(top >= level, torch.full_like(top, level), floor)
        if not eager:
            return (logits >= row_level)[:, None]
        zero = torch.zeros((), dtype=dtype, device=logits.device)
        return torch.where(logits >= row_level, zero, zero - float("inf"))[:, None]

    def forward(self, hits: torch.Tensor, mask: Optional[torch.Tensor] = None, pos: Optional[torch.Tensor] = None,
                last_only: bool = False, keys: Optional[torch.Tensor] = None) -> list[DecoderOutput]:
        if hits.dim() != 3 or hits.shape[-1] != self.dim:
            raise ValueError(f"TrackDecoder: hits must be (S, n, {self.dim}), got {tuple(hits.shape)}")
        if (keys is None) != (not self.assign_dim) or (keys is not None and keys.shape != hits.shape[:2] + (self.assign_dim,)):
            want = f"keys (S, n, {self.assign_dim})" if self.assign_dim else "no keys (assign_dim=0)"
            raise ValueError(f"TrackDecoder: expected {want}, got {None if keys is None else tuple(keys.shape)}")
        if (pos is None) != (self.pos_embed is None) or (pos is not None and pos.shape != hits.shape[:2] + (self.pos_dim,)):
            want = f"pos (S, n, {self.pos_dim}) = {tuple(hits.shape[:2]) + (self.pos_dim,)}" if self.pos_dim else "no pos (pos_dim=0)"
            raise ValueError(f"TrackDecoder: expected {want}, got "
                             f"{None if pos is None else tuple(pos.shape)}")
        if mask is None:
            mask = torch.ones(hits.shape[:2], dtype=torch.bool, device=hits.device)
        elif mask.shape != hits.shape[:2] or mask.dtype != torch.bool:
            raise ValueError(f"TrackDecoder: mask must be a bool tensor of shape {tuple(hits.shape[:2])}, "
                             f"got {mask.dtype} {tuple(mask.shape)}")
        hits = self.hit_norm(hits) * mask[..., None].to(hits.dtype)   # padding rows are zeros
        slots = self.slots[None].expand(hits.shape[0], -1, -1)
        hit_pos = None if self.pos_embed is None else self.pos_embed(pos.to(hits.dtype))
        base = None
        if self.seed_proj is not None:
            # checked where looking costs no device sync (as _allowed); phi_sectors always puts real hits first
            if mask.device.type == "cpu" and not is_tracing() and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
                raise ValueError("TrackDecoder: seed_slots needs each sector's real hits first (mask True, then "
                                 "padding), as phi_sectors cuts them")
            seed_in = hits if hit_pos is None else hits + hit_pos * mask[..., None].to(hits.dtype)
            rows = self.seed_index(mask)[..., None]
            slots = slots + self.seed_proj(torch.gather(seed_in, 1, rows.expand(-1, -1, self.dim)))
            if self.seed_centres:
                base = torch.gather(keys, 1, rows.expand(-1, -1, self.assign_dim))             # (S, M, E)
        # eager inference of the last stage alone: every stage's logits in one buffer (each stage's are read before
        # the next is written); a fresh (S, M, n) tensor per stage costs its first-touch page faults, which at
        # 60k hits take as long as the product that fills it
        buf = (hits.new_empty(hits.shape[0], self.num_slots, hits.shape[1])
               if last_only and _eager_inference() else None)
        prev = self.predict(slots, hits, keys, out=buf, base=base) if self.attention_mask else None
        outs = []
        for i, layer in enumerate(self.layers):
            allowed = self._allowed(mask, prev if self.attention_mask else None, hits.dtype)
            slots = layer(slots, hits, allowed, hit_pos)
            if last_only and not self.attention_mask and i + 1 < len(self.layers):
                continue
            prev = self.predict(slots, hits, keys, out=buf, base=base)
            outs.append(prev)
        return outs[-1:] if last_only else outs


def assign_hits(out: DecoderOutput, mask: torch.Tensor, threshold: float = 0.5,
                consume: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each real hit's slot: the one of highest ``σ(object)·σ(assignment)``, or −1 below ``threshold``.

    ``consume``: ``out.assign_logits`` may be overwritten (eager inference: the scores take their buffer
    instead of a new one of their size). Returns ``(labels, scores)``, both ``(S, n)``: int64 slot index
    (−1 = no track, always −1 at padding) and the best score (0 at padding).
    """
    if not (0.0 <= threshold < 1.0):
        raise ValueError(f"assign_hits: threshold must be in [0, 1), got {threshold!r}")
    if not _eager_inference():
        score = torch.sigmoid(out.object_logits)[..., None] * torch.sigmoid(out.assign_logits)   # (S, M, n)
    else:   # eager inference: one (S, M, n) buffer (the logits' own with consume), updated in place
        score = out.assign_logits.sigmoid_() if consume else torch.sigmoid(out.assign_logits)
        score = score.mul_(torch.sigmoid(out.object_logits)[..., None])
    best, slot = score.max(1)
    keep = mask & (best >= threshold)
    return torch.where(keep, slot, torch.full_like(slot, -1)), torch.where(mask, best, torch.zeros_like(best))


def labels_to_hits(labels: torch.Tensor, scores: torch.Tensor, sectors: Sectors, num_hits: int,
                   num_slots: int, stitch_min_hits: int = 0) -> torch.Tensor:
    """Sector labels ``(B·k, L)`` back to the event's hits: ``(B, num_hits)`` int64 track labels, unique within an
    event (sector ``s``'s slot ``m`` is track ``s·num_slots + m``), −1 for no track and at padding. A hit that
    lies in two overlapping sectors keeps the label of the sector where its score is higher.

    ``stitch_min_hits`` > 0 stitches overlapping sectors (:func:`stitch_tracks`): two tracks of neighbouring
    sectors that share at least that many hits of the overlap become one track."""
    bk, length = labels.shape
    b = bk // sectors.k
    sector = torch.arange(bk, device=labels.device) % sectors.k
    track = torch.where(labels >= 0, sector[:, None] * num_slots + labels, torch.full_like(labels, -1))
    event = torch.arange(bk, device=labels.device) // sectors.k
    flat = (event[:, None] * num_hits + sectors.index).flatten()
    valid = sectors.mask.flatten()
    # one key per (hit, sector): the score first, the track label to break ties the same way every time
    key = torch.where(valid, scores.flatten().double() + 1, torch.zeros_like(scores.flatten(), dtype=torch.float64))
    best = torch.zeros(b * num_hits, dtype=torch.float64, device=labels.device)
    best = best.scatter_reduce(0, flat, key, reduce="amax")
    win = valid & (key == best[flat])
    out = torch.full((b * num_hits,), -1, dtype=torch.int64, device=labels.device)
    cand = torch.where(win, track.flatten(), torch.full_like(track.flatten(), -1))
    out = out.scatter_reduce(0, flat, cand, reduce="amax").reshape(b, num_hits)
    if stitch_min_hits > 0 and sectors.k > 1:
        out = stitch_tracks(out, track, sectors, num_hits, num_slots, stitch_min_hits)
    return out


def stitch_tracks(hit_labels: torch.Tensor, track: torch.Tensor, sectors: Sectors, num_hits: int, num_slots: int,
                  min_hits: int) -> torch.Tensor:
    """Join the tracks that overlapping sectors found twice.

    A particle crossing the border of two neighbouring sectors is seen by both; in the overlap each sector
    gives its hits a track of its own. For every pair of neighbouring sectors (s, s+1, cyclically) the hits of
    the overlap that both sectors assign count the co-assignments of their tracks; each track's link is the
    neighbouring sector's track it shares the most such hits with, if at least ``min_hits``. Linked tracks
    become one (the smallest label of the linked tracks, by label propagation with pointer jumping over a
    fixed 2k rounds), so a stitched label is still unique within its event.

    Args:
        hit_labels: ``(B, N)`` event track labels from :func:`labels_to_hits` (−1: none).
        track: ``(B·k, L)`` the sector's track label of each of its hits (``s·num_slots + m``; −1: none).
        sectors, num_hits, num_slots: as :func:`labels_to_hits`.
        min_hits: the fewest shared overlap hits that link two tracks, ``>= 1``.
    Returns:
        ``(B, N)`` int64 labels, the stitched tracks sharing one label. No host reads or data-dependent
        loops: it traces for export.
    """
    b, k, m = hit_labels.shape[0], sectors.k, num_slots
    dev = hit_labels.device
    # each sector's track at each hit of the event (−1 where the hit is not in the sector or has no track)
    per_sector = torch.full((b * k, num_hits), -1, dtype=torch.int64, device=dev)
    per_sector = per_sector.scatter_reduce(1, sectors.index, torch.where(sectors.mask, track, -1), reduce="amax")
    left = per_sector.view(b, k, num_hits)
    right = left.roll(-1, dims=1)                                        # sector s's neighbour s+1 (cyclic)
    both = (left >= 0) & (right >= 0)
    cell = (torch.arange(b * k, device=dev).view(b, k, 1) * m + left.remainder(m)) * m + right.remainder(m)
    counts = torch.zeros(b * k * m * m, dtype=torch.int64, device=dev)
    counts = counts.scatter_add(0, cell.flatten(), both.flatten().long()).view(b, k, m, m)
    best, partner = counts.max(-1)                                       # (B, k, M): sector s's track -> s+1
    node = torch.arange(b * k * m, device=dev).view(b, k, m)
    next_sector = torch.arange(1, k + 1, device=dev).remainder(k).view(1, k, 1)
    other = (torch.arange(b, device=dev).view(b, 1, 1) * k + next_sector) * m + partner
    src, dst = node.flatten(), torch.where(best >= min_hits, other, node).flatten()   # unlinked: to itself
    root = torch.arange(b * k * m, device=dev)
    for _ in range(2 * k):  # label propagation with pointer jumping: the smallest label of each linked set
        low = torch.minimum(root[src], root[dst])
        root = root.scatter_reduce(0, src, low, reduce="amin").scatter_reduce(0, dst, low, reduce="amin")
        root = torch.minimum(root, root[root])
    local = root - torch.arange(b, device=dev).repeat_interleave(k * m) * (k * m)   # labels within the event
    stitched = local[torch.arange(b, device=dev)[:, None] * (k * m) + hit_labels.clamp_min(0)]
    return torch.where(hit_labels >= 0, stitched, hit_labels)
