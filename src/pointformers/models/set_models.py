"""Set models for amortised clustering (Set Transformer; Sampled Transformer App. C, Table 8).

* ``set-isab-pma`` — :class:`SetTransformerClusterer` with dense attention: encoder 2 × ISAB(16),
  decoder PMA(k) + 2 × SAB, then a linear layer per seed to the mixture parameters
  (π_j, μ_j, σ_j) of a k-component diagonal Gaussian mixture (the official Set Transformer model as
  the Sampled Transformer paper uses it: 2 ISABs with 16 inducing points, k = 4 in 2-D).
* ``set-isab-pma-sampled`` — the same with the Sampled Transformer's "loose" sampled attention in
  both MABs of every ISAB (two random keys per query row; ``mode="sampled"``, the MABs' own mode —
  :mod:`pointformers.nn.set_attention` — not a registry mechanism).
* ``set-sab-pma`` — the full-self-attention twin: 2 × SAB instead of the ISABs (O(n²)).

Output: :class:`~pointformers.tasks.metrics.MixtureParams`-compatible ``(log_pi (B, k),
mu (B, k, d), sigma (B, k, d))``: log π from a log-softmax over the seeds, σ = softplus(·) as in Set
Transformer's code. The loss is the negative log-likelihood per point (Eq. 6),
:func:`mixture_nll`. Official hyperparameters (Set Transformer's code, ``juho-lee/set_transformer``): width
128, 4 heads, no LayerNorm.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import check_attention_inputs
from ..data.batch import accepts_flat_inputs
from ..nn.set_attention import ISAB, PMA, SAB, resolve_mode
from .registry import register_model

#: Official Set Transformer amortised-clustering settings as used by the Sampled Transformer paper.
PAPER_CLUSTERING = dict(in_dim=2, num_components=4, dim=128, heads=4, num_inducing=16, ln=False)


class Mixture(NamedTuple):
    """Predicted mixture per set: log_pi (B, k), mu (B, k, d), sigma (B, k, d) > 0."""

    log_pi: torch.Tensor
    mu: torch.Tensor
    sigma: torch.Tensor


class MixtureHead(nn.Module):
    """Linear(D, 1 + 2d) per seed -> :class:`Mixture` (log-softmax over seeds, softplus σ)."""

    def __init__(self, dim: int, out_dim: int, min_sigma: float = 1e-4):
        super().__init__()
        self.out_dim, self.min_sigma = out_dim, min_sigma
        self.fc = nn.Linear(dim, 1 + 2 * out_dim)

    def forward(self, seeds: torch.Tensor) -> Mixture:
        o = self.fc(seeds)                                                   # (B, k, 1 + 2d)
        d = self.out_dim
        log_pi = torch.log_softmax(o[..., 0], -1)
        return Mixture(log_pi, o[..., 1:1 + d], F.softplus(o[..., 1 + d:]) + self.min_sigma)


def mixture_nll(x: torch.Tensor, mixture: Mixture, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Training loss: mean negative log-likelihood per real point, −(1/Σn) Σ_b Σ_i log Σ_j π_j N(x_i; μ_j, σ_j²).

    x (B, N, d), mixture (log_pi (B, k), mu/sigma (B, k, d)), mask (B, N) -> scalar (differentiable).
    """
    log_pi, mu, sigma = mixture
    if mask is None:
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    z = (x[:, :, None, :] - mu[:, None]) / sigma[:, None]
    logn = -0.5 * z.pow(2).sum(-1) - torch.log(sigma).sum(-1)[:, None] - 0.5 * x.shape[-1] * math.log(2 * math.pi)
    ll = torch.logsumexp(log_pi[:, None, :] + logn, -1)                     # (B, N)
    return -(ll * mask).sum() / mask.sum()


def check_set_inputs(x: torch.Tensor, mask: torch.Tensor | None, in_dim: int, who: str) -> torch.Tensor:
    """x (B, N, in_dim) finite points, mask (B, N) -> mask."""
    return check_attention_inputs(x, None, mask, dim=in_dim, who=who)


class SetTransformerClusterer(nn.Module):
    """ISAB/SAB encoder + PMA/SAB decoder predicting a k-component Gaussian mixture per set.

    Args:
        in_dim: point dimension d (2). num_components: k (4).
        dim, heads: width and heads (official 128, 4). num_inducing: m of ISAB(m) (16). ln: LayerNorms.
        encoder: ``"isab"`` (2 × ISAB) or ``"sab"`` (2 × SAB, full self-attention twin).
        num_encoder_blocks, num_decoder_sabs: 2 and 2.
        mode: the ISABs' MAB mode, ``"dense"`` (default) or ``"sampled"`` (loose sampled ISAB, Sampled
            Transformer; :mod:`pointformers.nn.set_attention`).
        attention: the former name of ``mode``, still accepted: ``"full"`` (= ``"dense"``) or ``"sampled"``.
    Shapes: forward(x (B, N, d), mask (B, N)) -> :class:`Mixture`; PyG-style forward(x (N, d),
    batch=b (N,) | ptr=p (B + 1,)) -> the same per-set :class:`Mixture` (B, ·).
    """

    def __init__(self, in_dim: int = 2, num_components: int = 4, dim: int = 32, heads: int = 4,
                 num_inducing: int = 16, ln: bool = False, encoder: str = "isab", num_encoder_blocks: int = 2,
                 num_decoder_sabs: int = 2, mode: str | None = None, attention: str | None = None):
        super().__init__()
        if encoder not in ("isab", "sab"):
            raise ValueError(f"encoder must be 'isab' or 'sab', got {encoder!r}")
        mode = resolve_mode(mode, attention)
        if encoder == "sab" and mode != "dense":
            raise ValueError("encoder='sab' is full self-attention; the sampled variant applies to ISAB")
        self.in_dim, self.mode = in_dim, mode
        widths = [in_dim] + [dim] * num_encoder_blocks
        self.encoder = nn.ModuleList(
            ISAB(a, dim, heads, num_inducing, ln, mode) if encoder == "isab" else SAB(a, dim, heads, ln)
            for a in widths[:-1])
        self.pma = PMA(dim, heads, num_components, ln)
        self.decoder = nn.ModuleList(SAB(dim, dim, heads, ln) for _ in range(num_decoder_sabs))
        self.head = MixtureHead(dim, in_dim)

    @accepts_flat_inputs(2)
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Mixture:
        mask = check_set_inputs(x, mask, self.in_dim, type(self).__name__)
        h = x.masked_fill(~mask.unsqueeze(-1), 0.0)
        for blk in self.encoder:
            h = blk(h, mask)
        s = self.pma(h, mask)
        for blk in self.decoder:
            s = blk(s)
        return self.head(s)


@register_model("set-isab-pma")
def set_isab_pma(**options) -> SetTransformerClusterer:
    """Set Transformer ISAB(16) + PMA amortised clusterer (dense attention)."""
    return SetTransformerClusterer(**options)


@register_model("set-isab-pma-sampled")
def set_isab_pma_sampled(**options) -> SetTransformerClusterer:
    """ISAB(16) + PMA with the Sampled Transformer's loose sampled attention inside the ISABs."""
    if "attention" not in options:   # the former option, if given, decides alone
        options = {"mode": "sampled", **options}
    return SetTransformerClusterer(**options)


@register_model("set-sab-pma")
def set_sab_pma(**options) -> SetTransformerClusterer:
    """Full self-attention twin: SAB encoder + PMA decoder."""
    return SetTransformerClusterer(**{"encoder": "sab", **options})
