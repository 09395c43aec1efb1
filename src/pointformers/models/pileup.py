"""HEPT's pile-up mitigation model: a PID embedding, the point-transformer skeleton and a
one-logit head per particle (paper App. C.1; the authors' ``Transformer(task="pileup")``).

The input's last column is HEPT's PID category (0..6); it goes through ``nn.Embedding(7, 10)``
and replaces the column, so the encoder sees ``8 − 1 + 10 = 17`` features. The encoder is
:class:`~pointformers.models.point_encoder.PointTransformerJK` with a 12-wide output (the
authors' ``h_dim // 2``), followed by ``Linear(12, 1)``. The authors apply a sigmoid in the
model; here the model returns the **logit** and the task applies the sigmoid (the focal loss
is computed from logits, which is the same function without the log(0) clamp).

``pileup-encoder`` is the same model around any registered attention mechanism, with the
authors' q/k/v width for every mechanism (``head_dim`` 24 per head, as their baselines use)
and the kernel coordinates ``[η, φ, η, φ]`` passed as the mechanism's ``pos`` (its
``coord_dim`` is set to 4 for mechanisms that take one), so every mechanism is compared on
the same skeleton.
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import is_tracing
from .point_encoder import PointTransformerJK
from .registry import register_model

#: The HEPT authors' pile-up configuration (their code and configs; HEPT paper, App. C): 8 input
#: columns (PID last), coordinates (η, φ, η, φ), width 24, 8 heads of 24, 4 layers, 12-d JK output, G = 140.
PILEUP_DEFAULTS = dict(in_dim=8, coord_dim=4, dim=24, heads=8, head_dim=24, n_layers=4, out_dim=12,
                       mlp_hidden=256, mlp_layers=5, block_size=100, n_hashes=3, num_regions=140,
                       num_pid=7, pid_dim=10)


class PileupClassifier(nn.Module):
    """Per-particle LC-vs-pile-up logits.

    Args:
        in_dim: input columns F, the last being the PID category (HEPT: 8).
        coord_dim: kernel coordinates c (HEPT: 4, ``[η, φ, η, φ]``).
        num_pid, pid_dim: PID categories and embedding width (HEPT: 7, 10).
        dim, heads, head_dim, n_layers, out_dim, mlp_hidden, mlp_layers, dropout, attention,
            block_size, n_hashes, num_regions, attention_options: the
            :class:`PointTransformerJK` encoder's options (``out_dim`` is the width fed to the
            final ``Linear(out_dim, 1)``; HEPT: 12).
        pe: "none" (HEPT) or "learned" (the coordinate encoding of HEPT's transformer baselines).
    Shapes: forward(x (B, N, F), coords (B, N, c), mask (B, N) | None) -> logits (B, N);
    a single cloud (N, F), (N, c) gives (N,). Padded points get logit 0.

    With the defaults the model has 287k trainable parameters: the authors' 0.31M minus their
    per-layer ``w_rpe`` Linear(30, 192) (5,952 each), of which only ω (here ``log_omega``) is used.
    """

    #: The exported graph's inputs (see :mod:`pointformers.export`): one event's x (N, F) and coords (N, c).
    export_inputs = ("x", "coords")

    def __init__(self, in_dim: int = 8, coord_dim: int = 4, num_pid: int = 7, pid_dim: int = 10, dim: int = 24,
                 heads: int = 8, head_dim: int | None = 24, n_layers: int = 4, out_dim: int = 12,
                 mlp_hidden: int = 256, mlp_layers: int = 5, dropout: float = 0.1, attention: str = "hept",
                 block_size: int = 100, n_hashes: int = 3, num_regions: float = 140,
                 attention_options: dict | None = None, pe: str = "none"):
        super().__init__()
        for name, v in (("in_dim", in_dim), ("num_pid", num_pid), ("pid_dim", pid_dim), ("coord_dim", coord_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < (2 if name == "in_dim" else 1):
                raise ValueError(f"{name}: expected a positive integer{' >= 2' if name == 'in_dim' else ''}, got {v!r}")
        self.in_dim, self.coord_dim, self.num_pid = in_dim, coord_dim, num_pid
        self.pid_embedding = nn.Embedding(num_pid, pid_dim)
        self.encoder = PointTransformerJK(
            in_dim=in_dim - 1 + pid_dim, coord_dim=coord_dim, dim=dim, heads=heads, head_dim=head_dim,
            n_layers=n_layers, out_dim=out_dim, mlp_hidden=mlp_hidden, mlp_layers=mlp_layers, dropout=dropout,
            attention=attention, block_size=block_size, n_hashes=n_hashes, num_regions=num_regions,
            attention_options=attention_options, pe=pe)
        self.out_proj = nn.Linear(out_dim, 1)

    def export_refusal(self) -> str | None:
        """Why this model cannot be exported as built, or None (its encoder's reason)."""
        return self.encoder.export_refusal()

    def forward(self, x: torch.Tensor, coords: torch.Tensor, mask: torch.Tensor | None = None, *,
                batch: torch.Tensor | None = None, ptr: torch.Tensor | None = None) -> torch.Tensor:
        """See the class doc; PyG-style flat x (N, F), coords (N, c) with ``batch``/``ptr`` -> (N,)."""
        if batch is not None or ptr is not None:
            if mask is not None:
                raise ValueError("mask: flat input (batch= or ptr=) has no padding; give no mask")
            if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[-1] != self.in_dim:
                raise ValueError(f"x: with batch= or ptr= expected flat (N, {self.in_dim}) features with the PID "
                                 f"category last, got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
            # per-particle features, then the encoder's own flat path (packed clouds with HEPT)
            feats = self._features(x[None], torch.ones(1, x.shape[0], dtype=torch.bool, device=x.device))[0]
            return self.out_proj(self.encoder(feats, coords, batch=batch, ptr=ptr)).squeeze(-1)
        if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3) or x.shape[-1] != self.in_dim:
            raise ValueError(f"x: expected (B, N, {self.in_dim}) or (N, {self.in_dim}) features with the PID "
                             f"category last, got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dim() == 2:
            if not isinstance(coords, torch.Tensor) or coords.dim() != 2:
                raise ValueError(f"coords: expected (N, {self.coord_dim}) with x of shape (N, F), got "
                                 f"{tuple(coords.shape) if isinstance(coords, torch.Tensor) else type(coords).__name__}")
            return self.forward(x[None], coords[None], None if mask is None else mask[None])[0]
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask
        if not isinstance(real, torch.Tensor) or real.dtype != torch.bool or real.shape != x.shape[:2]:
            raise ValueError(f"mask: expected a bool tensor of shape {tuple(x.shape[:2])}, got "
                             f"{getattr(real, 'dtype', type(real).__name__)} {tuple(getattr(real, 'shape', ()))}")
        emb = self.encoder(self._features(x, real), coords, mask)
        return self.out_proj(emb).squeeze(-1) * real

    def _features(self, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """The encoder's input: x's columns but the last, then the PID embedding. x (B, N, F), real (B, N)
        -> (B, N, F − 1 + pid_dim); the PID column is checked at real points (eager only)."""
        if not x.is_floating_point():
            raise ValueError(f"x: expected a floating tensor, got {x.dtype}")
        pid = x[..., -1]
        if not is_tracing():  # eager-only: a boolean gather and host syncs cannot be traced
            pid_real = pid[real]
            if not bool(torch.isfinite(pid_real).all()) or bool((pid_real != pid_real.round()).any()) or (
                    pid_real.numel() and (float(pid_real.min()) < 0 or float(pid_real.max()) > self.num_pid - 1)):
                raise ValueError(f"x: the last column must hold integer PID categories 0..{self.num_pid - 1} "
                                 "at real points")
        pid = torch.where(real, pid, torch.zeros_like(pid)).long()
        return torch.cat([x[..., :-1], self.pid_embedding(pid).to(x.dtype)], dim=-1)


@register_model("hept-pileup", export=None)
def hept_pileup(**options) -> PileupClassifier:
    """The paper's pile-up model (HEPT attention); any :class:`PileupClassifier` option overrides."""
    return PileupClassifier(**{**PILEUP_DEFAULTS, **options})


@register_model("pileup-encoder", export=None)
def pileup_encoder(attention: str = "hept", **options) -> PileupClassifier:
    """The pile-up model around any attention mechanism (``attention`` = a registry key).

    Mechanisms that take ``head_dim`` get 24 per head and those that take ``coord_dim`` get the
    model's coordinate count, unless ``attention_options`` sets them (the options a mechanism's
    registry entry lists as ``model_options``; :class:`PointTransformerJK` fills them).
    """
    return PileupClassifier(**{**PILEUP_DEFAULTS, "attention": attention, **options})


__all__ = ["PILEUP_DEFAULTS", "PileupClassifier", "hept_pileup", "pileup_encoder"]
