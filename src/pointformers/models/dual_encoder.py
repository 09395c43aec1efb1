"""LRA Retrieval's two-tower model: one sequence encoder reads each document of a pair, a small MLP
decides from the two document vectors (the LRA paper's matching setup, followed by SFT and SAMSA).

``dual-encoder`` — :class:`DualEncoderClassifier`: ``encoder`` names any registered sequence
classifier (``samsa-seq``, ``full-seq``, ``flt-seq``, ``mlp-seq``; ``samsa-seq`` with
``attention: sft`` for SFT) built with ``num_classes = embed_dim``, so its pooled head output is the
document vector; both documents go through the same weights in one call. With u, v the two vectors
the logits are MLP([u, v, u ⊙ v, u − v]) (LRA's combination).
"""
from __future__ import annotations

import torch
from torch import nn

from .registry import build as build_model, register_model

__all__ = ["DualEncoderClassifier"]


class DualEncoderClassifier(nn.Module):
    """Two documents -> class logits through one shared encoder.

    Args:
        encoder: registry name of a sequence classifier ``model(tokens (B, L), mask (B, L)) -> (B, C)``.
        encoder_options: its options (``num_classes`` is set to ``embed_dim`` here).
        embed_dim: width of a document vector; hidden: the decision MLP's width; num_classes: 2.
    Shapes: first (B, L1) int64, first_mask (B, L1) bool, second (B, L2), second_mask (B, L2) -> (B, num_classes).
    """

    def __init__(self, encoder: str = "samsa-seq", encoder_options: dict | None = None, embed_dim: int = 64,
                 hidden: int = 64, num_classes: int = 2):
        super().__init__()
        for name, v in (("embed_dim", embed_dim), ("hidden", hidden), ("num_classes", num_classes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        opts = dict(encoder_options or {})
        if "num_classes" in opts:
            raise ValueError("encoder_options.num_classes: set by the dual encoder (embed_dim); leave it out")
        self.encoder_name = encoder
        self.encoder = build_model(encoder, num_classes=embed_dim, **opts)
        self.head = nn.Sequential(nn.Linear(4 * embed_dim, hidden), nn.GELU(), nn.Linear(hidden, num_classes))

    def forward(self, first: torch.Tensor, first_mask: torch.Tensor, second: torch.Tensor,
                second_mask: torch.Tensor) -> torch.Tensor:
        for name, t, m in (("first", first, first_mask), ("second", second, second_mask)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or not isinstance(m, torch.Tensor) or m.shape != t.shape:
                raise ValueError(f"{name}, {name}_mask: expected tokens (B, L) and a bool mask of the same shape, "
                                 f"got {tuple(getattr(t, 'shape', ()))} and {tuple(getattr(m, 'shape', ()))}")
        if first.shape[0] != second.shape[0]:
            raise ValueError(f"first, second: {first.shape[0]} and {second.shape[0]} documents; pairs need as many")
        B, L = first.shape[0], max(first.shape[1], second.shape[1])

        def widen(t, m):   # both towers in one encoder call: pad to the longer length
            pad = L - t.shape[1]
            return (nn.functional.pad(t, (0, pad)), nn.functional.pad(m, (0, pad))) if pad else (t, m)

        (a, am), (b, bm) = widen(first, first_mask), widen(second, second_mask)
        vec = self.encoder(torch.cat([a, b]), torch.cat([am, bm]))
        u, v = vec[:B], vec[B:]
        return self.head(torch.cat([u, v, u * v, u - v], -1))


@register_model("dual-encoder")
def dual_encoder(**options) -> DualEncoderClassifier:
    """LRA Retrieval's two-tower matcher around any sequence classifier (``encoder``)."""
    return DualEncoderClassifier(**options)
