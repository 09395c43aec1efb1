"""End-to-end track reconstruction: a point encoder with a track-slot decoder, from hits to tracks.

The encoder is the tracking skeleton (:class:`~pointformers.models.point_encoder.PointTransformerJK`)
around any attention mechanism (HEPT by default); its per-hit features feed

* two auxiliary heads, as in the HEPT authors' set-decoder design: a hit classifier (logit of "hit of
  a target particle", trained with BCE) and a hit embedding (trained with HEPT's InfoNCE);
* the track-slot decoder (:class:`~pointformers.nn.track_decoder.TrackDecoder`) on ``sectors``
  azimuthal sectors of equal hit count (φ is ``coords[..., phi_column]``), all sectors of all events
  as one batch;
* a track-parameter head on each slot's final state: ``log pT``, the charge logit, η and (cos φ, sin φ)
  of the slot's track (beyond the published design); with ``param_fit`` (the default) the parameters of a
  slot that claims at least three hits are instead the closed-form helix fit of those hits
  (:func:`slot_helix_fit`), and the head gives the others.

:meth:`TrackReconstructor.forward` is the inference (what export traces): each real hit takes its best slot
of its sector, or −1 below the score threshold, then the tracks are merged by embedding
(:func:`merge_tracks`: fragments of at most ``merge_max_hits`` hits join the most similar track, the
published design's post-processing; with ``merge_radius`` > 0 also each track whose mean embedding lies
within that radius of a larger track's, beyond it); labels are unique within an event. ``forward(...,
outputs=True)`` returns everything the losses need instead (:class:`TrackOutput`; the engine's task calls it
so, through DistributedDataParallel when distributed).
"""

import math
from typing import NamedTuple, Optional, Sequence

import torch
from torch import nn

from ..data.batch import accepts_flat_inputs
from ..data.helix import conformal_circle, helix_parameters
from ..nn import is_tracing
from ..nn.track_decoder import (Sectors, TrackDecoder, assign_hits, gather_sectors, labels_to_hits, phi_sectors,
                                sector_frame)
from .point_encoder import PointTransformerJK
from .registry import register_model

__all__ = ["TrackReconstructor", "TrackOutput", "TRACK_PARAMS", "track_parameters", "merge_tracks", "slot_helix_fit"]

#: The encoder options a model passes through ``encoder_options`` (see :class:`PointTransformerJK`).
ENCODER_OPTIONS = frozenset({"pe", "norm", "ffn", "ffn_hidden"})

#: The track-parameter head's outputs, in order.
TRACK_PARAMS = ("log_pt", "charge_logit", "eta", "cos_phi", "sin_phi")

#: Columns of the tracking inputs (:data:`~pointformers.tasks.tracking.core.TRACKING_FEATURES`) the slots'
#: helix fit reads (``param_fit``): r [m], φ / π, z [m], u, v [1 / m].
FIT_COLUMNS = (0, 1, 2, 4, 5)

#: Sectors decoded and assigned at a time at eager inference (:meth:`TrackReconstructor.track_labels`): the
#: ``(sectors, slots, hits)`` buffers of a full event's ~200 sectors of 2.6k hits and 600 slots would be GBs.
INFERENCE_SECTOR_CHUNK = 16

#: The fewest hits a slot's helix fit needs (three fix a circle and a line).
FIT_MIN_HITS = 3

#: The slots' helix fit is refitted without the hits farther from the first circle than this × the slot's mean
#: distance (+ 1 mm) (:func:`slot_helix_fit`). Measured on the small preset's end-to-end model (test tracks,
#: double-majority matched): 2 gives pT width 0.25, η 0.0054, φ 0.0026; no refit 0.28, 0.0057, 0.0028.
FIT_TRIM = 2.0


class TrackOutput(NamedTuple):
    """Everything the losses need.

    Attributes:
        embedding: ``(B, N, embed_dim)`` hit embeddings (InfoNCE head).
        hit_logits: ``(B, N)`` logits of "hit of a target particle".
        sectors: the φ-sectors (``index``/``mask`` ``(B·k, L)``).
        stages: one :class:`DecoderOutput` per decoder layer (``S = B·k`` sectors); the last is the prediction.
        params: ``(B·k, M, 5)`` track parameters of every slot of the last stage (:data:`TRACK_PARAMS`);
            ``(B·k, M, 0)`` from the labels-only inference pass (:meth:`TrackReconstructor.track_labels`).
    """

    embedding: torch.Tensor
    hit_logits: torch.Tensor
    sectors: Sectors
    stages: list
    params: torch.Tensor


class TrackReconstructor(nn.Module):
    """Hits to tracks: encoder, auxiliary heads, sector batching, slot decoder, parameter head.

    Args:
        in_dim, coord_dim: per-hit features and kernel coordinates (the tracking inputs: 15 and 6).
        dim: width of the encoder and the decoder.
        heads, head_dim, n_layers, attention, attention_options, block_size, n_hashes, num_regions,
            dropout: the encoder's options (see :class:`PointTransformerJK`).
        embed_dim: size of the InfoNCE hit embedding.
        num_slots: track slots per sector.
        sectors: azimuthal sectors per event (published: 3).
        sector_hits: ``> 0``: each event is cut into ``max(sectors, ⌈n / sector_hits⌉)`` sectors (``n`` the most
            real hits of an event in the batch), so that a model trained on clouds of ``sectors · sector_hits``
            hits meets sectors of the size it was trained on in a larger event (a full 60k-hit event for a model
            of the tracking-6k preset): its ``num_slots`` per sector cover the sector's tracks. Eager only: an
            exported graph has a fixed sector count (export with ``sectors`` set and ``sector_hits`` 0). 0
            (default): always ``sectors``.
        overlap: fraction of a sector added on each side (0 = disjoint sectors).
        stitch_min_hits: with overlapping sectors, two tracks of neighbouring sectors that share at least
            this many overlap hits become one (:func:`~pointformers.nn.track_decoder.stitch_tracks`); 0: off.
        decoder_heads, decoder_layers, attention_mask: the decoder's options (see :class:`TrackDecoder`).
        sector_frame: the decoder's cross-attention keys carry each hit's position in its sector's frame
            (η and the azimuth from the sector's centre, :func:`~pointformers.nn.track_decoder.sector_frame`),
            so that the slot bank, shared by all sectors, can learn where to look whatever the sector's azimuth
            (beyond the published design; DETR's positional keys). η is ``coords[..., eta_column]``.
        frame_columns: further columns of ``coords`` appended to each hit's position in the sector frame (needs
            ``sector_frame``), e.g. ``[2, 4]`` = (r, z) in the tracking inputs: a particle's hits lie on a line in
            (r, z) whatever its vertex, while their η spreads with the vertex's z (most in the barrel).
        threshold: the score below which a hit is left without a track at inference.
        hit_threshold: at inference, a hit whose hit-classifier probability (σ of ``hit_logits``) is below this
            takes no track (0, default: off). With the classifier trained on hits of pT above the metrics' cut
            (the task's ``hit_pt_min``) while every particle is a slot target, it keeps the hits of low-pT
            particles out of the tracks; the task chooses it on validation data. Beyond the published design.
        merge_max_hits: at inference, a track of at most this many hits (a fragment) joins the track of more
            hits whose mean embedding is nearest (published: 2; 0: off), :func:`merge_tracks`.
        merge_radius: at inference, a track whose mean embedding lies within this (Euclidean) radius of a
            larger track's joins the nearest such track (0: off; beyond the published design: it joins the
            pieces of a particle that two slots split).
        seed_slots: each slot starts from a seed hit of its sector as well as its bank vector (the decoder's
            ``seed_slots``, :class:`~pointformers.nn.track_decoder.TrackDecoder`; beyond the published design).
        seed_centres: with ``seed_slots`` and ``assign_space="embedding"``: each slot's centre is its seed hit's
            InfoNCE embedding plus a learned offset (starting at zero), so every slot starts out claiming the hits
            around a real hit, as DBSCAN's neighbourhoods do (the decoder's ``seed_centres``; beyond the
            published design).
        assign_refine: with ``assign_space="embedding"``: each slot also learns its own kernel width and adds the
            published dot product with the hit features to the kernel, both starting at zero (the decoder's
            ``assign_refine``; beyond the published design).
        assign_space: ``"features"`` (default, published): a hit's assignment logit is the dot product of the
            slot's mask embedding with the hit's feature; ``"embedding"``: a kernel around a centre the slot
            predicts in the InfoNCE embedding (the decoder's ``assign_dim``), which the contrastive loss shapes
            early; beyond the published design.
        param_fit: the track parameters of a slot that claims at least :data:`FIT_MIN_HITS` hits (each hit's best
            slot, at a score of at least ``threshold``) are the closed-form helix fit of those hits
            (:func:`slot_helix_fit`, no gradient); the head gives the others and is trained on them. ``x`` must
            then hold the tracking inputs (:data:`FIT_COLUMNS`). Beyond the published design: a head on the slot
            state alone learns a track's curvature slowly (it sees an attention-weighted mean of its hits, not
            their geometry), and a learned correction of the fit made it worse at this scale (docs/results.md).
            Adds no weights: a checkpoint loads either way.
        encoder_options: further options of the encoder (:data:`ENCODER_OPTIONS`): the published
            encoder's pre-RMSNorm SwiGLU blocks with a coordinate encoding at every layer are
            ``{"norm": "rms", "ffn": "swiglu", "pe": "learned-each-layer"}`` with ``attention="coord_lsh"``.
        phi_column, eta_column: the columns of ``coords`` holding φ and η (1 and 0 in the tracking inputs).

    Shapes: ``forward(x (B, N, in_dim), coords (B, N, coord_dim), mask (B, N) | None)`` -> :class:`TrackOutput`;
    ``track_labels(...)`` -> ``(B, N)`` int64.
    """

    export_inputs = ("x", "coords")

    def __init__(self, in_dim: int = 15, coord_dim: int = 6, dim: int = 32, heads: int = 4, head_dim: Optional[int] = None,
                 n_layers: int = 3, attention: str = "hept", attention_options: Optional[dict] = None,
                 block_size: int = 100, n_hashes: int = 3, num_regions: float = 150, dropout: float = 0.0,
                 embed_dim: int = 12, num_slots: int = 64, sectors: int = 3, overlap: float = 0.0,
                 decoder_heads: int = 4, decoder_layers: int = 2, attention_mask: bool = False,
                 threshold: float = 0.5, phi_column: int = 1, encoder_options: Optional[dict] = None,
                 stitch_min_hits: int = 0, sector_frame: bool = False, eta_column: int = 0,
                 frame_columns: Sequence[int] = (),
                 merge_max_hits: int = 2, merge_radius: float = 0.0, param_fit: bool = True, seed_slots: bool = False,
                 assign_space: str = "features", sector_hits: int = 0, seed_centres: bool = False,
                 assign_refine: bool = False, hit_threshold: float = 0.0):
        super().__init__()
        if not isinstance(sector_hits, int) or isinstance(sector_hits, bool) or sector_hits < 0:
            raise ValueError(f"sector_hits: expected an integer >= 0 (0: always `sectors` sectors), got {sector_hits!r}")
        self.sector_hits = sector_hits
        if assign_space not in ("features", "embedding"):
            raise ValueError(f"assign_space: expected 'features' (the published dot product with the hit features) or "
                             f"'embedding' (a kernel around each slot's centre in the InfoNCE embedding), got {assign_space!r}")
        self.assign_space = assign_space
        if seed_centres is True and (seed_slots is not True or assign_space != "embedding"):
            raise ValueError(f"seed_centres: centres at the seed hits' embeddings need seed_slots=true and "
                             f"assign_space='embedding', got seed_slots={seed_slots!r}, assign_space={assign_space!r}")
        if assign_refine is True and assign_space != "embedding":
            raise ValueError(f"assign_refine refines the kernel in the InfoNCE embedding: it needs "
                             f"assign_space='embedding', got {assign_space!r}")
        if not isinstance(param_fit, bool):
            raise ValueError(f"param_fit: expected true or false, got {param_fit!r}")
        if param_fit and in_dim <= max(FIT_COLUMNS):
            raise ValueError(f"param_fit fits helices to the tracking inputs' columns {list(FIT_COLUMNS)} "
                             f"(r, phi/pi, z, u, v): it needs in_dim > {max(FIT_COLUMNS)}, got in_dim={in_dim} "
                             f"(or set param_fit to false)")
        for name, col in (("phi_column", phi_column), ("eta_column", eta_column)):
            if not isinstance(col, int) or isinstance(col, bool) or not (0 <= col < coord_dim):
                raise ValueError(f"{name}: expected a column of coords in [0, {coord_dim}), got {col!r}")
        if not isinstance(sector_frame, bool):
            raise ValueError(f"sector_frame: expected true or false, got {sector_frame!r}")
        if (isinstance(frame_columns, (str, bytes)) or not isinstance(frame_columns, Sequence)
                or any(not isinstance(c, int) or isinstance(c, bool) or not (0 <= c < coord_dim) for c in frame_columns)):
            raise ValueError(f"frame_columns: expected a list of columns of coords in [0, {coord_dim}), got {frame_columns!r}")
        if frame_columns and not sector_frame:
            raise ValueError(f"frame_columns={list(frame_columns)} extend the sector frame: it needs sector_frame=true")
        if not (0.0 <= threshold < 1.0):
            raise ValueError(f"threshold: expected a score in [0, 1), got {threshold!r}")
        _check_hit_threshold(hit_threshold)
        self.hit_threshold = float(hit_threshold)
        phi_sectors(torch.zeros(1, 1), None, sectors, overlap)   # checks sectors and overlap by name
        if not isinstance(stitch_min_hits, int) or isinstance(stitch_min_hits, bool) or stitch_min_hits < 0:
            raise ValueError(f"stitch_min_hits: expected an integer >= 0 (0: no stitching), got {stitch_min_hits!r}")
        if stitch_min_hits > 0 and (overlap == 0 or sectors == 1):
            raise ValueError(f"stitch_min_hits={stitch_min_hits} stitches overlapping sectors: it needs overlap > 0 and "
                             f"sectors > 1, got overlap={overlap!r}, sectors={sectors!r}")
        self.stitch_min_hits = stitch_min_hits
        _check_merge(merge_max_hits, merge_radius)
        self.merge_max_hits, self.merge_radius = merge_max_hits, float(merge_radius)
        encoder_options = dict(encoder_options or {})
        if set(encoder_options) - ENCODER_OPTIONS:
            raise ValueError(f"encoder_options: unknown option(s) {sorted(set(encoder_options) - ENCODER_OPTIONS)}; "
                             f"expected some of {sorted(ENCODER_OPTIONS)} (the other encoder options are the model's own)")
        self.in_dim, self.coord_dim, self.dim = in_dim, coord_dim, dim
        self.num_slots, self.num_sectors, self.overlap = num_slots, sectors, float(overlap)
        self.threshold, self.phi_column, self.eta_column = float(threshold), phi_column, eta_column
        self.sector_frame, self.frame_columns = sector_frame, [int(c) for c in frame_columns]
        self.encoder = PointTransformerJK(in_dim, coord_dim, dim=dim, heads=heads, head_dim=head_dim, n_layers=n_layers,
                                          out_dim=dim, mlp_hidden=2 * dim, mlp_layers=2, dropout=dropout,
                                          attention=attention, attention_options=attention_options,
                                          block_size=block_size, n_hashes=n_hashes, num_regions=num_regions,
                                          **encoder_options)
        self.embed_head = nn.Linear(dim, embed_dim)
        self.hit_head = nn.Linear(dim, 1)
        self.decoder = TrackDecoder(dim, num_slots, heads=decoder_heads, n_layers=decoder_layers, dropout=dropout,
                                    attention_mask=attention_mask, pos_dim=3 + len(self.frame_columns) if sector_frame else 0,
                                    seed_slots=seed_slots, assign_dim=embed_dim if assign_space == "embedding" else 0,
                                    seed_centres=seed_centres, assign_refine=assign_refine)
        self.param_fit = param_fit
        self.param_head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, len(TRACK_PARAMS)))

    def forward(self, x: torch.Tensor, coords: torch.Tensor, mask: Optional[torch.Tensor] = None, *,
                outputs: bool = False, batch: Optional[torch.Tensor] = None, ptr: Optional[torch.Tensor] = None):
        """Track labels ``(B, N)`` int64 (−1: no track, and at padding), or with ``outputs=True`` the
        :class:`TrackOutput` the losses need. One event ``x (N, F)``, ``coords (N, c)`` (as the encoder takes
        it) gives the labels ``(N,)`` (``outputs=True``: the outputs of a batch of one). Flat PyG-style input
        (``x (N, F)``, ``coords (N, c)`` with ``batch=`` or ``ptr=``) gives the labels ``(N,)`` in the input's order."""
        if batch is None and ptr is None and isinstance(x, torch.Tensor) and x.dim() == 2:   # one event
            if not isinstance(coords, torch.Tensor) or coords.dim() != 2:
                raise ValueError(f"coords: with one event x (N, F) expected coords (N, c), got "
                                 f"{tuple(coords.shape) if isinstance(coords, torch.Tensor) else type(coords).__name__}")
            out = self.forward(x[None], coords[None], None if mask is None else mask[None], outputs=outputs)
            return out if outputs else out[0]
        if batch is not None or ptr is not None:
            if outputs:
                raise ValueError("outputs: the training outputs need padded input (B, N, ·) with a mask; flat input "
                                 "(batch= or ptr=) gives the track labels only")
            return self.track_labels(x, coords, mask, batch=batch, ptr=ptr)
        if outputs:
            return self._outputs(x, coords, mask)
        return self.labels_and_embedding(x, coords, mask)[0]

    def _encoded(self, x: torch.Tensor, coords: torch.Tensor, mask: Optional[torch.Tensor]):
        """The encoder's side of the forward: ``(h (B, N, dim), embedding (B, N, embed_dim), sectors, the
        decoder's inputs per sector: hit features (S, L, dim), positions (S, L, ·) or None, keys or None)``."""
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        h = self.encoder(x, coords, mask)                                    # (B, N, dim), checked inputs
        sectors = phi_sectors(coords[..., self.phi_column], mask, self.sector_count(mask), self.overlap)
        pos = None
        if self.sector_frame:
            pos = sector_frame(coords[..., self.eta_column], coords[..., self.phi_column], sectors)
            if self.frame_columns:
                pos = torch.cat([pos, gather_sectors(coords[..., self.frame_columns], sectors)], -1)
        embedding = self.embed_head(h)
        keys = gather_sectors(embedding, sectors) if self.assign_space == "embedding" else None
        return h, embedding, sectors, gather_sectors(h, sectors), pos, keys

    def _assigned(self, x: torch.Tensor, coords: torch.Tensor, mask: Optional[torch.Tensor]):
        """Inference before merging: the gated track labels ``(B, N)`` (:meth:`assign` at the model's own
        threshold and gate), the hit embedding and the sectors per event. Eager, an event of more than
        :data:`INFERENCE_SECTOR_CHUNK` sectors is decoded and assigned that many sectors at a time (sectors are
        independent), so its ``(sectors, slots, hits)`` buffers stay the size of a few sectors' whatever the
        event's size; a traced graph decodes all sectors at once."""
        h, embedding, sectors, hits, pos, keys = self._encoded(x, coords, mask)
        total = hits.shape[0]
        step = total if is_tracing() else INFERENCE_SECTOR_CHUNK
        parts = []
        for lo in range(0, total, step):
            part = slice(lo, lo + step)
            stage = self.decoder(hits[part], sectors.mask[part], None if pos is None else pos[part], last_only=True,
                                 keys=None if keys is None else keys[part])[-1]
            parts.append(assign_hits(stage, sectors.mask[part], self.threshold, consume=True))
        labels, scores = parts[0] if len(parts) == 1 else (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
        labels = labels_to_hits(labels, scores, sectors, x.shape[1], self.num_slots, self.stitch_min_hits)
        if self.hit_threshold > 0:
            labels = self.gate(labels, self.hit_head(h).squeeze(-1))
        return labels, embedding, sectors.k

    def _outputs(self, x: torch.Tensor, coords: torch.Tensor, mask: Optional[torch.Tensor],
                 last_only: bool = False) -> TrackOutput:
        """The forward's outputs; ``last_only``: only the last decoder stage (no track parameters)."""
        h, embedding, sectors, hits, pos, keys = self._encoded(x, coords, mask)
        stages = self.decoder(hits, sectors.mask, pos, last_only=last_only, keys=keys)
        last = stages[-1]
        if last_only:   # the labels need no track parameters
            params = last.slots.new_zeros(*last.slots.shape[:2], 0)
        else:
            params = self.param_head(last.slots)
            if self.param_fit:
                fitted, fit = self.fitted_parameters(x, last, sectors)
                params = torch.where(fitted[..., None], fit, params)
        return TrackOutput(embedding, self.hit_head(h).squeeze(-1), sectors, stages, params)

    def fitted_parameters(self, x: torch.Tensor, stage, sectors: Sectors) -> tuple[torch.Tensor, torch.Tensor]:
        """The helix fit of the hits each slot of a decoder stage claims (each real hit's best slot by
        σ(object)·σ(assignment), at a score of at least ``threshold``; :func:`slot_helix_fit`, no gradient), from
        the tracking inputs ``x`` ``(B, N, in_dim)``: ``fitted`` ``(S, M)`` bool and the parameters ``(S, M, 5)``
        as :data:`TRACK_PARAMS` (the charge logit ±1; 0 where not fitted)."""
        with torch.no_grad():
            labels, _ = assign_hits(stage, sectors.mask, self.threshold)               # (S, L), −1: unclaimed
        hits = gather_sectors(x[..., list(FIT_COLUMNS)].detach(), sectors)
        fit = slot_helix_fit(hits, labels.clamp(min=0), (labels >= 0).to(hits.dtype), self.num_slots, FIT_TRIM)
        ok = fit["fitted"]
        cols = torch.stack([fit["pt"].log(), fit["charge"], torch.asinh(fit["cot"]), torch.cos(fit["phi"]),
                            torch.sin(fit["phi"])], -1)
        return ok, torch.where(ok[..., None], cols, torch.zeros_like(cols)).to(stage.slots.dtype)

    def min_points(self) -> int:
        """The fewest hits an exported graph takes: two per sector (a graph traced for longer sectors cannot
        run sectors of one hit)."""
        return 2 * self.num_sectors

    def sector_count(self, mask: torch.Tensor) -> int:
        """Sectors per event for a batch of events with real-hit ``mask`` ``(B, N)``: ``sectors``, or with
        ``sector_hits`` the count that keeps every sector within ``sector_hits`` real hits (never fewer than
        ``sectors``)."""
        if not self.sector_hits:
            return self.num_sectors
        if is_tracing():
            raise ValueError(f"sector_hits={self.sector_hits}: the sector count follows the event's size in eager "
                             f"mode only; export a model with a fixed `sectors` and sector_hits 0")
        most = int(mask.sum(1).max()) if mask.numel() else 0
        return max(self.num_sectors, -(-most // self.sector_hits))

    def assign(self, out: TrackOutput, num_hits: int, threshold: Optional[float] = None,
               consume: bool = False, hit_threshold: Optional[float] = None) -> torch.Tensor:
        """Track labels ``(B, N)`` from a forward's output before merging: each hit's best slot of its
        sector (−1 = no track, and at padding), then :meth:`gate`; ``threshold`` and ``hit_threshold`` override
        the model's own; ``consume``: the output's last assignment logits may be overwritten
        (:func:`~pointformers.nn.track_decoder.assign_hits`)."""
        labels, scores = assign_hits(out.stages[-1], out.sectors.mask, self.threshold if threshold is None else threshold,
                                     consume=consume)
        labels = labels_to_hits(labels, scores, out.sectors, num_hits, self.num_slots, self.stitch_min_hits)
        return self.gate(labels, out.hit_logits, hit_threshold)

    def gate(self, labels: torch.Tensor, hit_logits: torch.Tensor, hit_threshold: Optional[float] = None) -> torch.Tensor:
        """``labels`` ``(B, N)`` with −1 wherever the hit classifier's probability (σ of ``hit_logits``
        ``(B, N)``) is below ``hit_threshold`` (default: the model's own; 0: unchanged)."""
        h = self.hit_threshold if hit_threshold is None else _check_hit_threshold(hit_threshold)
        if h <= 0:
            return labels
        keep = torch.sigmoid(hit_logits.float()) >= h
        return torch.where(keep, labels, torch.full_like(labels, -1))

    def merge(self, labels: torch.Tensor, embedding: torch.Tensor, merge_radius: Optional[float] = None,
              sectors: Optional[int] = None) -> torch.Tensor:
        """:meth:`assign`'s labels ``(B, N)`` merged by the hit embedding ``(B, N, D)`` (:func:`merge_tracks`
        with the model's ``merge_max_hits``; ``merge_radius`` overrides the model's own); ``sectors``: the
        sectors per event of the forward that gave the labels (default: the model's ``sectors``)."""
        radius = self.merge_radius if merge_radius is None else merge_radius
        if self.merge_max_hits == 0 and radius == 0:
            return labels
        k = self.num_sectors if sectors is None else sectors
        return merge_tracks(labels, embedding, k * self.num_slots, self.merge_max_hits, radius, sectors=k)

    def labels_from(self, out: TrackOutput, num_hits: int, threshold: Optional[float] = None,
                    merge_radius: Optional[float] = None, consume: bool = False) -> torch.Tensor:
        """Track labels ``(B, N)`` from a forward's output (−1 = no track, and at padding): :meth:`assign` then
        :meth:`merge`; ``threshold`` and ``merge_radius`` override the model's own (e.g. ones chosen on
        validation data); ``consume``: as :meth:`assign` (the forward's own labels pass do)."""
        return self.merge(self.assign(out, num_hits, threshold, consume), out.embedding, merge_radius,
                          sectors=out.sectors.k)

    @accepts_flat_inputs(2, 2, per_point=True)
    def track_labels(self, x: torch.Tensor, coords: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Inference: ``(B, N)`` int64 track label of every hit, unique within an event, −1 for none (the
        forward's default output); flat input with ``batch=``/``ptr=`` as the forward."""
        return self.labels_and_embedding(x, coords, mask)[0]

    def labels_and_embedding(self, x: torch.Tensor, coords: torch.Tensor,
                             mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Inference in one pass: the track labels ``(B, N)`` of :meth:`track_labels` and the InfoNCE hit
        embedding ``(B, N, embed_dim)`` the merging read (what ``pointformers predict`` writes per hit)."""
        labels, embedding, k = self._assigned(x, coords, mask)
        return self.merge(labels, embedding, sectors=k), embedding


def track_parameters(params: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parameter head's raw outputs ``(..., 5)`` as physics: ``pt`` [GeV], ``charge`` (±1), ``eta``, ``phi``."""
    return {"pt": params[..., 0].exp(), "charge": torch.where(params[..., 1] >= 0, 1.0, -1.0).to(params.dtype),
            "eta": params[..., 2], "phi": torch.atan2(params[..., 4], params[..., 3])}


def slot_helix_fit(hits: torch.Tensor, slot: torch.Tensor, weight: torch.Tensor, num_slots: int,
                   trim: float = 0.0) -> dict:
    """The helix of each slot's weighted hits (:mod:`pointformers.data.helix`), in float64, fixed shapes.

    Args:
        hits: ``(S, L, 5)`` r [m], φ / π, z [m], u, v [1 / m] of each sector's hits (:data:`FIT_COLUMNS`).
        slot: ``(S, L)`` int64 the slot in ``[0, num_slots)`` each hit belongs to.
        weight: ``(S, L)`` each hit's weight on its slot, ``>= 0`` (0: left out, e.g. padding).
        num_slots: M.
        trim: ``> 0``: a second fit without the hits farther from the slot's first circle than ``trim`` × the
            slot's weighted mean distance (+ 1 mm), so that a few hits of other particles do not pull it (the
            numpy fit of tracks, :func:`~pointformers.tasks.tracking.track_fit.fit_tracks`, scales by the median,
            which has no fixed-shape form); 0: one fit.

    Returns:
        ``(S, M)`` float64 each: ``pt`` [GeV], ``charge`` (±1), ``phi`` [rad], ``cot`` (cot θ), ``weight`` (Σ w of
        the hits fitted) and the bool ``fitted``: Σ w ≥ :data:`FIT_MIN_HITS` and every parameter finite (the others are
        meaningless where it is False).
    """
    h = hits.double()
    w = weight.double()
    r, phi, z, u, v = h[..., 0], h[..., 1] * torch.pi, h[..., 2], h[..., 3], h[..., 4]

    def total(a: torch.Tensor) -> torch.Tensor:
        return torch.zeros(slot.shape[0], num_slots, dtype=torch.float64, device=h.device).scatter_add(1, slot, a * w)

    def at(g: torch.Tensor) -> torch.Tensor:   # a per-slot value at each hit
        return g.gather(1, slot)

    d, e, det = conformal_circle(u, v, total)
    if trim > 0:
        dist = (at(d) * u + at(e) * v + 1).abs() / at(torch.hypot(d, e)) * r * r   # ≈ metres from the circle
        dist = torch.where(torch.isfinite(dist), dist, torch.zeros_like(dist))
        scale = total(dist) / total(torch.ones_like(dist))
        w = w * (dist <= trim * at(scale) + 1e-3)
        d, e, det = conformal_circle(u, v, total)
    fit = helix_parameters(d, e, r, phi, z, total, at)
    fit["fitted"] = ((fit["weight"] >= FIT_MIN_HITS) & (det > 0) & torch.isfinite(fit["pt"])
                     & torch.isfinite(fit["cot"]) & torch.isfinite(fit["charge"]) & torch.isfinite(fit["phi"]))
    return fit


def _check_hit_threshold(h) -> float:
    if isinstance(h, bool) or not isinstance(h, (int, float)) or not (0.0 <= h < 1.0):
        raise ValueError(f"hit_threshold: expected a probability in [0, 1) (0: no gate), got {h!r}")
    return float(h)


def _check_merge(max_hits, radius) -> None:
    if not isinstance(max_hits, int) or isinstance(max_hits, bool) or max_hits < 0:
        raise ValueError(f"merge_max_hits: expected an integer >= 0 (0: no fragment merging), got {max_hits!r}")
    if isinstance(radius, bool) or not isinstance(radius, (int, float)) or not (0 <= radius < float("inf")):
        raise ValueError(f"merge_radius: expected a finite number >= 0 (0: off), got {radius!r}")


def merge_tracks(labels: torch.Tensor, embedding: torch.Tensor, num_tracks: Optional[int] = None,
                 max_hits: int = 2, radius: float = 0.0, sectors: int = 0) -> torch.Tensor:
    """Tracks joined by their mean hit embedding, per event.

    * A **fragment** (a track of at most ``max_hits`` hits; 0: none) joins the track of more than
      ``max_hits`` hits whose mean embedding is nearest (Euclidean) to its own (the published design's
      post-processing); it stays as it is in an event without such a track.
    * With ``radius`` > 0, every other track joins the nearest *larger* track (more hits; equal size: the
      higher label) whose mean embedding lies within ``radius`` of its own.
    * With ``sectors`` > 3 (an event cut into more φ-sectors than the published three, e.g. a full event with the
      model's ``sector_hits``), a track joins only tracks of its own sector or of a neighbouring one (cyclic): the
      pieces of one particle lie there, and tracks farther apart in φ that an embedding learned on clouds of a
      few sectors puts close together are different particles. It also keeps the merging linear in the event's
      size (the tracks near a track in the embedding grow with the event otherwise).

    Joins chain (a track joins where its target goes); labels are those of the receiving tracks. Traced
    (export), fixed shapes throughout (``(B, num_tracks)`` sizes and centres, a ``(B, num_tracks, num_tracks)``
    distance table); eager, the same joins from each event's tracks that have hits alone, each joining track
    compared with the whole tracks near it (:func:`_grid_joins`: a full event's sectors give tens of thousands of
    possible labels and thousands of tracks), its distances computed as differences or in float64 (a near tie or
    a distance within float32 rounding of ``radius`` may go the other way than in the table's float32 product).

    Args:
        labels: ``(B, N)`` or ``(N,)`` int64 track labels in ``[0, num_tracks)``, −1 = no track (never changed).
        embedding: ``(B, N, D)`` or ``(N, D)`` hit embeddings (e.g. :attr:`TrackOutput.embedding`).
        num_tracks: the number of possible labels (default: the largest label + 1, read from the data).
        max_hits: the largest fragment, ``>= 0``.
        radius: the joining radius of the other tracks, ``>= 0``.
        sectors: ``> 3``: the labels are ``sector · (num_tracks / sectors) + slot`` of φ-sectors in order around
            the event (:func:`~pointformers.nn.track_decoder.labels_to_hits`), and joins stay within neighbouring
            sectors; ``num_tracks`` must then be given, a multiple of ``sectors``. 0 to 3: no restriction.

    Returns:
        The new labels, the shape of ``labels``.
    """
    _check_merge(max_hits, radius)
    if isinstance(sectors, bool) or not isinstance(sectors, int) or sectors < 0:
        raise ValueError(f"merge_tracks: sectors must be an integer >= 0, got {sectors!r}")
    if sectors > 3 and (num_tracks is None or num_tracks % sectors):
        raise ValueError(f"merge_tracks: with sectors={sectors} num_tracks must be a multiple of it (the labels of "
                         f"sector s are s * num_tracks / sectors + slot), got {num_tracks!r}")
    ring = sectors if sectors > 3 else 0
    one = labels.dim() == 1
    if one:
        labels, embedding = labels[None], embedding[None]
    if labels.dim() != 2 or embedding.dim() != 3 or embedding.shape[:2] != labels.shape:
        raise ValueError(f"merge_tracks: expected labels (B, N) and embedding (B, N, D), got "
                         f"{tuple(labels.shape)} and {tuple(embedding.shape)}")
    if num_tracks is None:
        num_tracks = int(labels.max()) + 1 if labels.numel() else 0
    if num_tracks <= 0:
        return labels[0] if one else labels
    if not is_tracing() and labels.numel() and int(labels.max()) >= num_tracks:
        raise ValueError(f"merge_tracks: labels must lie in [-1, num_tracks={num_tracks}), got {int(labels.max())}")
    if not is_tracing():
        return torch.stack([_merge_event(lab, emb, num_tracks, max_hits, radius, ring)
                            for lab, emb in zip(labels, embedding)])[0 if one else slice(None)]
    b, t = labels.shape[0], num_tracks
    real = labels >= 0
    idx = torch.where(real, labels, torch.zeros_like(labels))
    emb = embedding.float() * real[..., None]
    size = torch.zeros(b, t, dtype=emb.dtype, device=emb.device).scatter_add(1, idx, real.to(emb.dtype))
    centre = torch.zeros(b, t, emb.shape[-1], dtype=emb.dtype, device=emb.device)
    centre = centre.scatter_add(1, idx[..., None].expand(-1, -1, emb.shape[-1]), emb) / size.clamp(min=1)[..., None]
    sq = (centre * centre).sum(-1)
    dist2 = (sq[:, :, None] + sq[:, None, :] - 2 * centre @ centre.transpose(1, 2)).clamp(min=0)   # (B, T, T)
    own = torch.arange(t, device=labels.device).expand(b, t)
    frag = (size > 0) & (size <= max_hits)
    whole = size > max_hits
    inf = float("inf")
    target = whole[:, None, :]                                                 # (B, 1 or T, T): who may join whom
    if ring:
        sec = torch.arange(t, device=labels.device) // (t // ring)
        gap = (sec[:, None] - sec[None, :]).remainder(ring)
        target = target & ((gap <= 1) | (gap == ring - 1))[None]
    # a fragment: the nearest whole track, if there is one
    best, near = dist2.masked_fill(~target, inf).min(2)
    parent = torch.where(frag & torch.isfinite(best), near, own)
    if radius > 0:
        # a whole track: the nearest larger whole track within the radius (equal size: the higher label)
        rank = size.long() * t + own                                           # size, then label: all distinct
        larger = rank[:, None, :] > rank[:, :, None]
        best, near = dist2.masked_fill(~(target & larger & (dist2 < radius * radius)), inf).min(2)
        parent = torch.where(whole & torch.isfinite(best), near, parent)
    # follow the joins to their end: each step goes to a larger track, so there are no cycles
    for _ in range(max(1, (t - 1).bit_length())):
        parent = parent.gather(1, parent)
    out = torch.where(real, parent.gather(1, idx), labels)
    return out[0] if one else out


#: (track, track) distances per chunk in the eager merge (16 MB of float32).
MERGE_CHUNK_ELEMS = 1 << 22

#: Whole tracks per grid cell the eager merge aims at (its cell size follows from it).
MERGE_CELL_TRACKS = 4


def _dense_joins(centre, rank, whole, rows, cols, radius):
    """Each row's join: the nearest column (a fragment row: any; a whole row: larger and within ``radius``), all
    columns compared, in chunks of rows. Returns ``(best d², column)`` per row (``inf`` where none). The squared
    distances are ‖a‖² + ‖b‖² − 2a·b in float64 (one matrix product per chunk; float64 keeps the cancellation of
    float32 centres far below their own rounding)."""
    best = torch.full((rows.numel(),), float("inf"), device=centre.device)
    near = torch.zeros(rows.numel(), dtype=torch.long, device=centre.device)
    step = max(1, MERGE_CHUNK_ELEMS // max(1, cols.numel()))
    col_c = centre.index_select(0, cols).double()
    col_sq = (col_c * col_c).sum(-1)
    for s in range(0, rows.numel(), step):
        r = rows[s:s + step]
        row_c = centre.index_select(0, r).double()
        d2 = ((row_c * row_c).sum(-1)[:, None] + col_sq[None] - 2.0 * row_c @ col_c.T).clamp_(min=0)   # (c, W)
        ok = ~whole[r, None] | ((rank[None, cols] > rank[r, None]) & (d2 < radius * radius))
        b, n = d2.masked_fill(~ok, float("inf")).min(1)
        best[s:s + step], near[s:s + step] = b, cols[n]
    return best, near


def _cell_joins(centre, rank, whole, rows, cols, radius, proj, col_proj, h):
    """:func:`_dense_joins` among the columns in the neighbouring cells (3^g) of each row's cell, on a grid of cell
    size ``h`` on the tracks' projections ``proj`` ``(A, g)`` onto orthonormal axes (``col_proj`` = the columns'
    rows of it): every column within ``h`` of a row is among them (a projection's coordinates differ by at most
    the distance)."""
    dev = centre.device
    lo = col_proj.amin(0)
    cell = lambda p: torch.floor((p - lo) / h).long()                          # noqa: E731
    ccell = cell(col_proj)                                                     # (W, g), >= 0
    ext = ccell.amax(0) + 3                                                    # room for the ±1 offsets
    stride = torch.cumprod(torch.cat([ext.new_ones(1), ext[:-1]]), 0)
    ckey = ((ccell + 1) * stride).sum(1)
    order = ckey.argsort()
    skey, scol = ckey[order], cols[order]
    # a row outside the grid by more than a cell has no column within h: clamped, its keys may alias other
    # cells, which only adds candidates (every distance is computed exactly)
    rcell = torch.minimum(cell(proj.index_select(0, rows)).clamp(min=-1), ext - 2)
    offsets = torch.cartesian_prod(*[torch.arange(-1, 2, device=dev)] * proj.shape[1]).view(-1, proj.shape[1])
    keys = ((rcell[:, None, :] + 1 + offsets[None]) * stride).sum(-1).flatten()   # (R·3^g,)
    first = torch.searchsorted(skey, keys)
    count = torch.searchsorted(skey, keys, right=True) - first
    pair_row = torch.arange(rows.numel(), device=dev).repeat_interleave(offsets.shape[0]).repeat_interleave(count)
    start = torch.repeat_interleave(first - (torch.cumsum(count, 0) - count), count)
    pair_col = scol[start + torch.arange(pair_row.numel(), device=dev)]
    best = torch.full((rows.numel(),), float("inf"), device=dev)
    near = torch.zeros(rows.numel(), dtype=torch.long, device=dev)
    none = int(cols.max()) + 1
    for s in range(0, pair_row.numel(), MERGE_CHUNK_ELEMS):
        pr, pc = pair_row[s:s + MERGE_CHUNK_ELEMS], pair_col[s:s + MERGE_CHUNK_ELEMS]
        r = rows.index_select(0, pr)
        # the difference itself, not the expansion of the table's product: no cancellation (near ties may go the
        # other way than the exported table's, at float32 rounding)
        d2 = (centre.index_select(0, r) - centre.index_select(0, pc)).square_().sum(-1)
        ok = ~whole.index_select(0, r) | ((rank.index_select(0, pc) > rank.index_select(0, r)) & (d2 < radius * radius))
        d2 = d2.masked_fill_(~ok, float("inf"))
        # the nearest, ties to the lowest column, merged with the earlier chunks' best
        cand = torch.full_like(best, float("inf")).scatter_reduce(0, pr, d2, "amin")
        win = torch.full_like(near, none).scatter_reduce(0, pr, torch.where(d2 == cand.index_select(0, pr), pc, none),
                                                           "amin")
        take = (cand < best) | ((cand == best) & (win < near) & torch.isfinite(cand))
        best, near = torch.where(take, cand, best), torch.where(take, win, near)
    return best, near


def _grid_joins(centre, rank, whole, rows, cols, radius):
    """:func:`_dense_joins` by :func:`_cell_joins` on the whole tracks' (at most) 3 principal axes (the embedding's
    tracks lie near a low-dimensional subspace), with cells of about ``MERGE_CELL_TRACKS`` columns where the columns
    are densest (a Gaussian's peak density) and at least ``radius`` wide: a whole row's join and a fragment's
    nearest column found within a cell size are exact; the fragments with none are looked up again with cells
    twice as large, and compared with every column once the cells span the grid. Linear in the tracks where
    :func:`_dense_joins` is quadratic."""
    pts = centre.index_select(0, cols)
    mu = pts.mean(0)
    evals, evecs = torch.linalg.eigh(((pts - mu).T @ (pts - mu) / pts.shape[0]).double())   # ascending
    g = min(3, centre.shape[1])
    axes = evecs[:, -g:].to(centre.dtype)                                      # (D, g), orthonormal
    proj = (centre - mu) @ axes                                                # (A, g)
    peak = (2 * math.pi) ** (g / 2) * float(evals[-g:].clamp(min=1e-12).sqrt().prod())
    slack = 1.0 + 1e-4                                                         # the projection's float rounding
    h = max(float(radius) * slack, (MERGE_CELL_TRACKS * peak / cols.numel()) ** (1.0 / g), 1e-6)
    col_proj = proj.index_select(0, cols)
    diagonal = float((col_proj.amax(0) - col_proj.amin(0)).norm())
    best = torch.full((rows.numel(),), float("inf"), device=centre.device)
    near = torch.zeros(rows.numel(), dtype=torch.long, device=centre.device)
    todo = torch.arange(rows.numel(), device=centre.device)
    while todo.numel():
        if h > diagonal:   # cells as large as the grid: every column
            best[todo], near[todo] = _dense_joins(centre, rank, whole, rows[todo], cols, radius)
            break
        b, n = _cell_joins(centre, rank, whole, rows[todo], cols, radius, proj, col_proj, h)
        best[todo], near[todo] = b, n
        todo = todo[~whole[rows[todo]] & (b > (h / slack) ** 2)]               # fragments with nothing within h
        h *= 2.0
    return best, near


def _ring_joins(centre, rank, whole, rows, cols, radius, sector, ring):
    """:func:`_dense_joins` of each sector's rows against the columns of that sector and its two neighbours
    (``sector`` ``(A,)`` each track's sector in ``[0, ring)``): linear in the sectors. Columns are taken in label
    order within each sector, so ties go to the lowest column as in :func:`_dense_joins`."""
    best = torch.full((rows.numel(),), float("inf"), device=centre.device)
    near = torch.zeros(rows.numel(), dtype=torch.long, device=centre.device)
    row_sec, col_sec = sector.index_select(0, rows), sector.index_select(0, cols)
    row_order = torch.argsort(row_sec, stable=True)
    bounds = torch.searchsorted(row_sec[row_order], torch.arange(ring + 1, device=centre.device)).tolist()
    col_bounds = torch.searchsorted(col_sec, torch.arange(ring + 1, device=centre.device)).tolist()   # cols ascend
    for s in range(ring):
        if bounds[s] == bounds[s + 1]:
            continue
        picked = row_order[bounds[s]:bounds[s + 1]]
        near_secs = sorted({(s - 1) % ring, s, (s + 1) % ring})
        c = torch.cat([cols[col_bounds[q]:col_bounds[q + 1]] for q in near_secs])
        if c.numel():
            best[picked], near[picked] = _dense_joins(centre, rank, whole, rows.index_select(0, picked), c, radius)
    return best, near


@torch.no_grad()   # labels only
def _merge_event(labels: torch.Tensor, embedding: torch.Tensor, num_tracks: int, max_hits: int,
                 radius: float, ring: int = 0) -> torch.Tensor:
    """:func:`merge_tracks` of one event ``labels (N,)``, ``embedding (N, D)`` over the tracks that have hits: each
    track that may join another (a fragment; with ``radius`` a whole track too) against the whole tracks near it
    (:func:`_grid_joins`), or with ``ring`` sectors against the whole tracks of its own and the neighbouring
    sectors (:func:`_ring_joins`)."""
    real = labels >= 0
    if not bool(real.any()):
        return labels.clone()
    ids, inv = torch.unique(labels[real], return_inverse=True)                 # (A,) sorted labels
    a = ids.numel()
    emb = embedding[real].float()
    size = torch.zeros(a, dtype=emb.dtype, device=emb.device).index_add_(0, inv, torch.ones_like(emb[:, 0]))
    centre = torch.zeros(a, emb.shape[-1], dtype=emb.dtype, device=emb.device).index_add_(0, inv, emb) / size[:, None]
    whole = size > max_hits
    rank = size.long() * num_tracks + ids                                      # size, then label: all distinct
    parent = torch.arange(a, device=labels.device)
    cols = torch.nonzero(whole).flatten()                                      # (W,): a join always goes to one
    rows = torch.nonzero((size <= max_hits) | (radius > 0 and whole)).flatten() if cols.numel() else cols
    if rows.numel():
        if ring:
            best, near = _ring_joins(centre, rank, whole, rows, cols, radius, ids // (num_tracks // ring), ring)
        else:
            best, near = _grid_joins(centre, rank, whole, rows, cols, radius)
        parent[rows] = torch.where(torch.isfinite(best), near, rows)
    # follow the joins to their end: each step goes to a larger track, so there are no cycles
    for _ in range(max(1, (a - 1).bit_length())):
        parent = parent[parent]
    out = labels.clone()
    out[real] = ids[parent[inv]]
    return out


@register_model("track-reconstruction", task="track-reconstruction", export=None)
def track_reconstruction(**options) -> TrackReconstructor:
    """End-to-end tracks from hits: a point encoder, phi-sectors and a track-slot decoder (labels per hit)."""
    return TrackReconstructor(**options)
