"""HEPT's coordinate region codes: the extra AND hash codes that align query and key blocks.

Each (OR table t, head h) partitions the cloud into B_η[t, h] × B_φ[t, h] equal-count
regions of the (η, φ) plane (axis-aligned quantile buckets, as in the authors' code), with
B_η·B_φ ≈ G = ``num_regions`` drawn at random once at init and frozen. A point's region
is bit-packed into one integer code c = (r_φ << bits) | r_η, so that sorting by
L + Δ·c groups points by region first and by their base hash L second (paper §4.2–4.3).

The codes depend only on the coordinates, so they are computed once per forward pass and
shared by every layer (:class:`HEPTContext`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .stable_sort import stable_argsort


def sample_region_counts(num_regions: float, n_hashes: int, heads: int,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """Random bucket counts (n_hashes, 2, heads) with B_η·B_φ ≈ G, as the authors' ``get_regions``.

    B ~ U(2, 2√G − 2)² per row, rescaled so that B_η·B_φ = G, rounded to multiples of 1/3
    ("do not have to be integers"); varying B across tables plays the role of E2LSH's random
    shift against boundary effects.
    """
    if not num_regions >= 1:
        raise ValueError(f"num_regions must be >= 1, got {num_regions}")
    lb, ub = 2.0, 2.0 * math.sqrt(num_regions) - 2.0
    rows = n_hashes * heads
    if ub <= lb:  # G < 16: too few regions to randomise; split evenly
        b = torch.full((rows, 2), math.sqrt(num_regions))
    else:
        b = lb + (ub - lb) * torch.rand(rows, 2, generator=generator)
        b = b * (num_regions / b.prod(-1, keepdim=True)).sqrt()
    b = (torch.round(b * 3) / 3).clamp_min(1.0)
    return b.view(n_hashes, heads, 2).permute(0, 2, 1).contiguous()


@dataclass
class HEPTContext:
    """Work shared by all HEPT layers of one forward pass.

    Attributes:
        mask: (B, Np) bool, real points after padding the tensor width to Np (a multiple of b).
        codes: (B, T, H, Np) int64 region code of each point per (table, head).
        n_points: N, the unpadded tensor width.
        block_size: b.
    """

    mask: torch.Tensor
    codes: torch.Tensor
    n_points: int
    block_size: int

    @property
    def n_padded(self) -> int:
        return int(self.mask.shape[1])


def _ranks(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rank of each real point along the last dim (padded points rank last). (B, Np) -> (B, Np)."""
    v = values.masked_fill(~mask, float("inf"))
    order = stable_argsort(v)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(v.shape[-1], device=v.device).expand_as(order))
    return ranks


def region_codes(eta: torch.Tensor, phi: torch.Tensor, mask: torch.Tensor, regions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Bit-packed (η, φ) region codes.

    Args:
        eta, phi: (B, Np) coordinates; mask: (B, Np) real points.
        regions: (T, 2, H) bucket counts B_η = regions[:, 0], B_φ = regions[:, 1].
        block_size: b; each cloud's own point count is padded to a multiple of b to size its
            regions (``rank // ceil(n_pad / B) + 1`` as the authors' code), so a cloud's codes
            never depend on the other clouds in its batch.
    Returns:
        (B, T, H, Np) int64 codes.
    """
    r_eta, r_phi, top = region_indices(eta, phi, mask, regions, block_size)
    bits = torch.ceil(torch.log2(top.double() + 1)).to(torch.int64)
    return (r_phi << bits) | r_eta


def region_indices(eta: torch.Tensor, phi: torch.Tensor, mask: torch.Tensor, regions: torch.Tensor,
                   block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-based η and φ region indices ``(B, T, H, Np)`` each, and the largest real η index per
    (cloud, table, head) ``(B, T, H, 1)`` (it sets the bit width of the packed code).
    Arguments as :func:`region_codes`."""
    n_real = mask.sum(-1)
    n_pad = (torch.div(n_real + block_size - 1, block_size, rounding_mode="floor") * block_size)
    n_pad = n_pad.to(regions.dtype).view(-1, 1, 1)

    def axis(values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        size = torch.ceil(n_pad / counts.unsqueeze(0)).to(torch.int64)  # (B, T, H)
        return torch.div(_ranks(values, mask)[:, None, None, :], size[..., None], rounding_mode="floor") + 1

    r_eta = axis(eta, regions[:, 0])
    r_phi = axis(phi, regions[:, 1])
    top = r_eta.masked_fill(~mask[:, None, None, :], 0).amax(-1, keepdim=True)
    return r_eta, r_phi, top


class HEPTRegions(nn.Module):
    """Frozen region counts and the once-per-forward code computation.

    Args:
        num_regions: G, the target number of (η, φ) regions per table and head.
        n_hashes: OR tables m₁.
        heads: H.
        block_size: b.
    The counts are a buffer saved in the state_dict (key ``regions``, shape (T, 2, H)).
    """

    def __init__(self, num_regions: float, n_hashes: int, heads: int, block_size: int,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.block_size = block_size
        self.register_buffer("regions", sample_region_counts(num_regions, n_hashes, heads, generator))

    def forward(self, pos: torch.Tensor, mask: torch.Tensor) -> HEPTContext:
        """pos (B, N, c ≥ 2) with η, φ in columns 0, 1; mask (B, N) -> :class:`HEPTContext`."""
        B, N = mask.shape
        b = self.block_size
        Np = -(-N // b) * b
        if Np != N:
            mask = torch.cat([mask, mask.new_zeros(B, Np - N)], 1)
            pos = torch.cat([pos, pos.new_zeros(B, Np - N, pos.shape[-1])], 1)
        with torch.no_grad():
            codes = region_codes(pos[..., 0], pos[..., 1], mask, self.regions.float(), b)
        return HEPTContext(mask=mask, codes=codes, n_points=N, block_size=b)
