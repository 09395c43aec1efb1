"""End-to-end track reconstruction: a point encoder with a track-slot decoder, from hits to tracks.

The encoder is the tracking skeleton (:class:`~pointformers.models.point_encoder.PointTransformerJK`)
around any attention mechanism (HEPT by default); its per-hit features feed

* two auxiliary heads, as in the HEPT authors' set-decoder design: a hit classifier (logit of "hit of
  a target particle", trained with BCE) and a hit embedding (trained with HEPT's InfoNCE);
* the track-slot decoder (:class:`~pointformers.nn.track_decoder.TrackDecoder`) on ``sectors``
  azimuthal sectors of equal hit count (φ is ``coords[..., phi_column]``), all sectors of all events
  as one batch;
* a track-parameter head on each slot's final state: ``log pT``, the charge logit, η and (cos φ, sin φ)
  of the slot's track (beyond the published design).

:meth:`TrackReconstructor.track_labels` is the inference: each real hit takes its best slot of its
sector, or −1 below the score threshold; labels are unique within an event.
"""

from typing import NamedTuple, Optional

import torch
from torch import nn

from ..nn.track_decoder import DecoderOutput, Sectors, TrackDecoder, assign_hits, gather_sectors, labels_to_hits, phi_sectors
from .point_encoder import PointTransformerJK

__all__ = ["TrackReconstructor", "TrackOutput", "TRACK_PARAMS", "track_parameters"]

#: The track-parameter head's outputs, in order.
TRACK_PARAMS = ("log_pt", "charge_logit", "eta", "cos_phi", "sin_phi")


class TrackOutput(NamedTuple):
    """Everything the losses need.

    Attributes:
        embedding: ``(B, N, embed_dim)`` hit embeddings (InfoNCE head).
        hit_logits: ``(B, N)`` logits of "hit of a target particle".
        sectors: the φ-sectors (``index``/``mask`` ``(B·k, L)``).
        stages: one :class:`DecoderOutput` per decoder layer (``S = B·k`` sectors); the last is the prediction.
        params: ``(B·k, M, 5)`` track parameters of every slot of the last stage (:data:`TRACK_PARAMS`).
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
        overlap: fraction of a sector added on each side (0 = disjoint sectors).
        decoder_heads, decoder_layers, attention_mask: the decoder's options (see :class:`TrackDecoder`).
        threshold: the score below which a hit is left without a track at inference.
        phi_column: the column of ``coords`` holding φ (1 in the tracking inputs).

    Shapes: ``forward(x (B, N, in_dim), coords (B, N, coord_dim), mask (B, N) | None)`` -> :class:`TrackOutput`;
    ``track_labels(...)`` -> ``(B, N)`` int64.
    """

    export_inputs = ("x", "coords")

    def __init__(self, in_dim: int = 15, coord_dim: int = 6, dim: int = 32, heads: int = 4, head_dim: Optional[int] = None,
                 n_layers: int = 3, attention: str = "hept", attention_options: Optional[dict] = None,
                 block_size: int = 100, n_hashes: int = 3, num_regions: float = 150, dropout: float = 0.0,
                 embed_dim: int = 12, num_slots: int = 64, sectors: int = 3, overlap: float = 0.0,
                 decoder_heads: int = 4, decoder_layers: int = 2, attention_mask: bool = False,
                 threshold: float = 0.5, phi_column: int = 1):
        super().__init__()
        if not isinstance(phi_column, int) or not (0 <= phi_column < coord_dim):
            raise ValueError(f"phi_column: expected a column of coords in [0, {coord_dim}), got {phi_column!r}")
        if not (0.0 <= threshold < 1.0):
            raise ValueError(f"threshold: expected a score in [0, 1), got {threshold!r}")
        phi_sectors(torch.zeros(1, 1), None, sectors, overlap)   # checks sectors and overlap by name
        self.in_dim, self.coord_dim, self.dim = in_dim, coord_dim, dim
        self.num_slots, self.num_sectors, self.overlap = num_slots, sectors, float(overlap)
        self.threshold, self.phi_column = float(threshold), phi_column
        self.encoder = PointTransformerJK(in_dim, coord_dim, dim=dim, heads=heads, head_dim=head_dim, n_layers=n_layers,
                                          out_dim=dim, mlp_hidden=2 * dim, mlp_layers=2, dropout=dropout,
                                          attention=attention, attention_options=attention_options,
                                          block_size=block_size, n_hashes=n_hashes, num_regions=num_regions)
        self.embed_head = nn.Linear(dim, embed_dim)
        self.hit_head = nn.Linear(dim, 1)
        self.decoder = TrackDecoder(dim, num_slots, heads=decoder_heads, n_layers=decoder_layers, dropout=dropout,
                                    attention_mask=attention_mask)
        self.param_head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, len(TRACK_PARAMS)))

    def forward(self, x: torch.Tensor, coords: torch.Tensor, mask: Optional[torch.Tensor] = None) -> TrackOutput:
        if x.dim() == 2:   # one event (N, F)
            raise ValueError("x: expected a padded batch (B, N, F) with coords (B, N, c); add a batch dimension "
                             "for one event (x[None], coords[None])")
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        h = self.encoder(x, coords, mask)                                    # (B, N, dim), checked inputs
        sectors = phi_sectors(coords[..., self.phi_column], mask, self.num_sectors, self.overlap)
        stages = self.decoder(gather_sectors(h, sectors), sectors.mask)
        return TrackOutput(self.embed_head(h), self.hit_head(h).squeeze(-1), sectors, stages,
                           self.param_head(stages[-1].slots))

    def labels_from(self, out: TrackOutput, num_hits: int) -> torch.Tensor:
        """Track labels ``(B, N)`` from a forward's output (−1 = no track, and at padding)."""
        labels, scores = assign_hits(out.stages[-1], out.sectors.mask, self.threshold)
        return labels_to_hits(labels, scores, out.sectors, num_hits, self.num_slots)

    def track_labels(self, x: torch.Tensor, coords: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Inference: ``(B, N)`` int64 track label of every hit, unique within an event, −1 for none."""
        return self.labels_from(self.forward(x, coords, mask), x.shape[1])


def track_parameters(params: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parameter head's raw outputs ``(..., 5)`` as physics: ``pt`` [GeV], ``charge`` (±1), ``eta``, ``phi``."""
    return {"pt": params[..., 0].exp(), "charge": torch.where(params[..., 1] >= 0, 1.0, -1.0).to(params.dtype),
            "eta": params[..., 2], "phi": torch.atan2(params[..., 4], params[..., 3])}
