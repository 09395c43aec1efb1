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
        authors_sort: sort float64 hash keys with ``torch.argsort`` (PyTorch's default, unstable
            sort) over each cloud's own rows, as the authors' code, instead of the stable sort.
            Ties between a point and its duplicate (``padding="duplicate"``) are then broken as
            theirs are; a tie straddling a block boundary decides which copy's output is kept.
            Float32 keys keep the stable sort (ties broken by row, several times faster on the
            CPU): there float rounding already moves points across block boundaries (the
            authors' own float32 run agrees with their float64 one on ~80% of points at 1e-5 on
            random inputs, reference README), and which sort breaks the ties does not change how
            well float32 agrees with float64 (measured in docs/benchmarks.md, "Notes on HEPT's
            CPU kernels").
        lengths: (B,) rows of each cloud (its first ``lengths[b]`` rows are real); needed with
            ``authors_sort`` and more than one cloud.
        segments: clouds packed end to end in one row (B = 1): their (start, end) rows, each a
            whole number of blocks; codes, hash ranges and sorts are computed per segment.
    """

    mask: torch.Tensor
    codes: torch.Tensor
    n_points: int
    block_size: int
    authors_sort: bool = False
    lengths: torch.Tensor | None = None
    segments: tuple[tuple[int, int], ...] | None = None

    @property
    def n_padded(self) -> int:
        return self.mask.shape[1]  # no int(): a traced graph keeps the point count symbolic


def _ranks(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rank of each real point along the last dim (padded points rank last). (B, Np) -> (B, Np)."""
    v = values.masked_fill(~mask, float("inf"))
    order = stable_argsort(v)
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(v.shape[-1], device=v.device).expand_as(order))
    return ranks


def _authors_ranks(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Ranks as the authors' code computes them: ``torch.argsort`` (default, unstable) of each
    cloud's own real values, so exact ties in η or φ order as theirs do. (B, Np) -> (B, Np);
    padded points get rank Np (they are never used)."""
    ranks = torch.full_like(values, values.shape[-1], dtype=torch.int64)
    for b in range(values.shape[0]):
        idx = mask[b].nonzero().squeeze(1)
        order = torch.argsort(values[b, idx])
        r = torch.empty_like(order)
        r[order] = torch.arange(len(order), device=values.device)
        ranks[b, idx] = r
    return ranks


def region_codes(eta: torch.Tensor, phi: torch.Tensor, mask: torch.Tensor, regions: torch.Tensor,
                 authors_sort: bool = False) -> torch.Tensor:
    """Bit-packed (η, φ) region codes ``c = (r_φ << bits) | r_η``.

    Args:
        eta, phi: (B, Np) coordinates; mask: (B, Np) real points.
        regions: (T, 2, H) bucket counts B_η = regions[:, 0], B_φ = regions[:, 1]; the region
            size is computed in this tensor's dtype (see :func:`region_indices`).
        authors_sort: rank with PyTorch's default sort as the authors (see :func:`region_indices`).
    Returns:
        (B, T, H, Np) int64 codes; ``bits = ceil(log2(max r_η + 1))`` per (cloud, table, head).

    Computed without ``log2`` and bit shifts, which not every graph exporter translates: ``bits`` is
    the number of powers of two ≤ max r_η (equal to ceil(log2(top + 1)) for top ≥ 0, in integers),
    and ``(r_φ << bits) | r_η`` is ``r_φ·2^bits + r_η`` because r_η < 2^bits at every real point.
    """
    r_eta, r_phi, top = region_indices(eta, phi, mask, regions, authors_sort)
    pow2 = torch.pow(2, torch.arange(62, device=eta.device, dtype=torch.int64))
    bits = (top.unsqueeze(-1) >= pow2).sum(-1)
    return r_phi * pow2[bits] + r_eta


def region_indices(eta: torch.Tensor, phi: torch.Tensor, mask: torch.Tensor, regions: torch.Tensor,
                   authors_sort: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-based η and φ region indices ``(B, T, H, Np)`` each, and the largest real η index per
    (cloud, table, head) ``(B, T, H, 1)`` (it sets the bit width of the packed code).

    The arithmetic is the authors' to the bit (reference README, "Exact arithmetic"): a cloud
    of n real points (its own count, before any padding) has regions of
    ``size = ceil(n · (1/B))`` points along each axis, evaluated in ``regions.dtype`` as their
    ``n / regions`` (PyTorch computes a Python number divided by a tensor as the number times
    the tensor's reciprocal; B, stored rounded to float32, makes the product inexact: 6000 and
    B = 13.333333 give 450.00003 → 451); a point of rank ρ along the axis is in region
    ``ρ // size + 1``. Ranks come from a stable sort (ties in index order) or, with
    ``authors_sort``, from ``torch.argsort`` of each cloud's own values as in the authors' code.
    Each cloud is sized by its own count, so its codes never depend on the batch.
    """
    if regions.dtype in (torch.float16, torch.bfloat16):  # a half-precision module: sizes as in float32
        regions = regions.float()
    n_real = mask.sum(-1).to(regions.dtype).view(-1, 1, 1)
    ranks = _authors_ranks if authors_sort else _ranks

    def axis(values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        size = torch.ceil(n_real * torch.reciprocal(counts).unsqueeze(0)).to(torch.int64).clamp_min(1)  # (B, T, H)
        return torch.div(ranks(values, mask)[:, None, None, :], size[..., None], rounding_mode="floor") + 1

    r_eta = axis(eta, regions[:, 0])
    r_phi = axis(phi, regions[:, 1])
    top = r_eta.masked_fill(~mask[:, None, None, :], 0).amax(-1, keepdim=True)
    return r_eta, r_phi, top


def duplicate_padding(codes: torch.Tensor, mask: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' padding: each cloud of n points is padded to P = ceil(n / b)·b rows with copies
    of its own points (reference README, "Exact arithmetic and padding", item 3).

    The copies are the points at positions n − b, …, n − b + p − 1 (p = P − n; negative positions
    count from the end, as Python indexing) of the cloud's points ordered by ``torch.argsort``
    (PyTorch's default, unstable sort, as theirs) of the table-0/head-0 region codes. Positions
    are taken modulo n, which is their indexing wherever theirs is defined (n ≥ b/2).

    Args:
        codes: (B, T, H, N) region codes of the real points; mask: (B, N) real points.
        block_size: b.
    Returns:
        gather (B, P_max) int64 source row of each padded row (rows past a cloud's P point at
        row 0 and are masked), and lengths (B,) = P per cloud. Row i < n of cloud b is its i-th
        real point (real points in index order), rows n … P − 1 are the copies.
    """
    B = mask.shape[0]
    counts = mask.sum(-1)
    lengths = (counts + block_size - 1) // block_size * block_size
    width = max(int(lengths.max()) if B else 0, block_size)
    gather = torch.zeros(B, width, dtype=torch.int64, device=mask.device)
    for b in range(B):
        idx = mask[b].nonzero().squeeze(1)
        n, P = len(idx), int(lengths[b])
        if n == 0:
            continue
        order = torch.argsort(codes[b, 0, 0, idx])
        pos = (n - block_size + torch.arange(P - n, device=mask.device)) % n
        gather[b, :n] = idx
        gather[b, n:P] = idx[order[pos]]
    return gather, lengths


class HEPTRegions(nn.Module):
    """Frozen region counts and the once-per-forward code computation.

    Args:
        num_regions: G, the target number of (η, φ) regions per table and head.
        n_hashes: OR tables m₁.
        heads: H.
        block_size: b.
    The counts are a buffer saved in the state_dict (key ``regions``, shape (T, 2, H)); they
    follow the module's dtype, and the region sizes are computed in it (as the authors').
    """

    def __init__(self, num_regions: float, n_hashes: int, heads: int, block_size: int,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.block_size = block_size
        self.register_buffer("regions", sample_region_counts(num_regions, n_hashes, heads, generator))

    def codes(self, pos: torch.Tensor, mask: torch.Tensor, authors_sort: bool = False) -> torch.Tensor:
        """Region codes (B, T, H, N) of ``pos`` (B, N, c ≥ 2) with η, φ in columns 0, 1."""
        with torch.no_grad():
            return region_codes(pos[..., 0], pos[..., 1], mask, self.regions, authors_sort)

    def duplicate_layout(self, pos: torch.Tensor, mask: torch.Tensor):
        """The authors' padding by duplicated points (:func:`duplicate_padding`), with the codes of
        the real points copied to their duplicates.

        pos (B, N, c), mask (B, N) -> rows (B, P) source row of each padded row, pmask (B, P) rows
        in use, and the :class:`HEPTContext` of the padded layout (sorted as the authors' code).
        """
        codes = self.codes(pos, mask, authors_sort=True)  # (B, T, H, N) from the real points only
        rows, lengths = duplicate_padding(codes, mask, self.block_size)
        P = rows.shape[1]
        T, H = codes.shape[1:3]
        pmask = torch.arange(P, device=pos.device)[None, :] < lengths[:, None]
        ctx = HEPTContext(mask=pmask, codes=codes.gather(3, rows[:, None, None, :].expand(-1, T, H, -1)),
                          n_points=P, block_size=self.block_size, authors_sort=True, lengths=lengths)
        return rows, pmask, ctx

    def forward(self, pos: torch.Tensor, mask: torch.Tensor, pad: bool = True,
                segments: tuple[tuple[int, int], ...] | None = None) -> HEPTContext:
        """pos (B, N, c ≥ 2) with η, φ in columns 0, 1; mask (B, N) -> :class:`HEPTContext`.

        ``pad``: extend the layout to a multiple of the block size (the training path's blocks);
        False for the export path, which cuts blocks by index arithmetic instead.
        ``segments``: clouds packed in one row (B = 1; :class:`~pointformers.data.batch.PackedLayout`),
        each segment a multiple of the block size; each cloud's codes are its own, as if alone."""
        B, N = mask.shape
        b = self.block_size
        if segments is not None:
            if B != 1 or not segments or segments[0][0] != 0 or segments[-1][1] != N or any(
                    (e - s) % b or s != prev for (s, e), prev in zip(segments, [0] + [e for _, e in segments])):
                raise ValueError(f"segments: expected consecutive (start, end) rows covering the one packed row of "
                                 f"{N} in multiples of block_size {b}, got {len(segments)} segment(s) for "
                                 f"{B} row(s)")
            codes = torch.cat([self.codes(pos[:, s:e], mask[:, s:e]) for s, e in segments], -1)
            return HEPTContext(mask=mask, codes=codes, n_points=N, block_size=b, segments=tuple(segments))
        Np = -(-N // b) * b if pad else N
        codes = self.codes(pos, mask)
        if pad and Np != N:
            mask = torch.cat([mask, mask.new_zeros(B, Np - N)], 1)
            codes = torch.cat([codes, codes.new_zeros(*codes.shape[:3], Np - N)], 3)
        return HEPTContext(mask=mask, codes=codes, n_points=N, block_size=b)
