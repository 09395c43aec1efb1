"""Point-set operations in plain torch: farthest point sampling, kNN and ball-query grouping.

All functions take padded batches ``pos: (B, N, 3)`` with an optional ``mask: (B, N)`` bool
(True = real point); padded points are never selected. Farthest point sampling (FPS) picks
the first point (``start="first"``: the first real point; ``"random"``: a uniform real point
drawn from ``generator``) and then, ``k - 1`` times, the real point whose distance to the
chosen set is largest (ties: the lowest index), as PointNet++ does. Used for ModelNet40's
1024-point inputs (SAMSA/SFT) and Point-BERT style group centres (Sampled Transformer: 64
centres, kNN groups of 32).
"""
from __future__ import annotations

import torch

__all__ = ["farthest_point_sample", "knn_indices", "ball_query", "gather_points", "fps_numpy"]


def _check(pos: torch.Tensor, mask: torch.Tensor | None, name: str = "pos") -> torch.Tensor:
    if not isinstance(pos, torch.Tensor) or pos.dim() != 3 or pos.shape[-1] < 1:
        raise ValueError(f"{name}: expected a tensor of shape (B, N, D), got "
                         f"{tuple(pos.shape) if isinstance(pos, torch.Tensor) else type(pos).__name__}")
    if not pos.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {pos.dtype}")
    if mask is None:
        mask = torch.ones(pos.shape[:2], dtype=torch.bool, device=pos.device)
    elif not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != tuple(pos.shape[:2]):
        raise ValueError(f"mask: expected a bool tensor of shape {tuple(pos.shape[:2])}, got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
    if not torch.isfinite(pos[mask]).all():
        raise ValueError(f"{name}: expected finite coordinates at real points, got NaN or inf")
    return mask


def farthest_point_sample(
    pos: torch.Tensor,
    k: int,
    mask: torch.Tensor | None = None,
    start: str = "first",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Indices ``(B, k)`` of ``k`` farthest-point samples of each cloud in ``pos`` (B, N, D).

    A cloud with fewer than ``k`` real points gets all of them first (in FPS order), then
    repeats of an already chosen point; ``arange(k) < mask.sum(1, keepdim=True)`` marks the
    distinct picks.
    """
    mask = _check(pos, mask)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected an integer >= 1, got {k!r}")
    if start not in ("first", "random"):
        raise ValueError(f"start: expected 'first' or 'random', got {start!r}")
    B, N, _ = pos.shape
    counts = mask.sum(1)
    if (counts == 0).any():
        raise ValueError(f"mask: cloud {int((counts == 0).nonzero()[0])} has no real point")
    if start == "first":
        cur = mask.float().argmax(1)  # first True
    else:
        u = torch.rand(B, N, generator=generator, device="cpu").to(pos.device)
        cur = torch.where(mask, u, torch.full_like(u, -1.0)).argmax(1)  # uniform over real points
    x = pos.detach().to(torch.float64 if pos.dtype == torch.float64 else torch.float32)
    # Squared distance to the chosen set; padded points are pinned at -inf so never chosen.
    dist = torch.where(mask, torch.full((B, N), float("inf"), dtype=x.dtype, device=x.device),
                       torch.full((B, N), float("-inf"), dtype=x.dtype, device=x.device))
    out = torch.empty(B, k, dtype=torch.long, device=pos.device)
    rows = torch.arange(B, device=pos.device)
    for i in range(k):
        out[:, i] = cur
        d = ((x - x[rows, cur].unsqueeze(1)) ** 2).sum(-1)
        dist = torch.minimum(dist, d)
        cur = dist.argmax(1)
    return out


def fps_numpy(points, k: int, start: str = "first", seed: int | None = None):
    """FPS of one cloud given as a numpy array (n, D); returns (min(k, n),) int64 indices."""
    import numpy as np

    pts = torch.as_tensor(np.asarray(points, dtype=np.float64)).unsqueeze(0)
    g = None
    if start == "random":
        g = torch.Generator().manual_seed(int(seed or 0))
    idx = farthest_point_sample(pts, min(int(k), pts.shape[1]), start=start, generator=g)
    return idx[0].numpy()


def gather_points(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Gather rows: ``x`` (B, N, C) with ``idx`` (B, ...) -> (B, ..., C)."""
    if x.dim() != 3 or idx.dim() < 2 or idx.shape[0] != x.shape[0]:
        raise ValueError(f"idx: expected shape (B, ...) with B = {x.shape[0]} for x of shape (B, N, C), got "
                         f"{tuple(idx.shape)} and x {tuple(x.shape)}")
    B = x.shape[0]
    flat = idx.reshape(B, -1)
    out = torch.gather(x, 1, flat.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return out.reshape(*idx.shape, x.shape[-1])


def _sq_dist(query: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    # Direct differences (not the |a|²+|b|²-2ab expansion) so ties and zeros stay exact.
    return ((query.unsqueeze(2) - pos.unsqueeze(1)) ** 2).sum(-1)


def knn_indices(query: torch.Tensor, pos: torch.Tensor, k: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Indices ``(B, M, k)`` of the ``k`` nearest real points of ``pos`` (B, N, D) to each
    query (B, M, D), nearest first (ties: lowest index). If a cloud has fewer than ``k``
    real points the missing slots repeat the nearest neighbour."""
    mask = _check(pos, mask)
    if query.dim() != 3 or query.shape[0] != pos.shape[0] or query.shape[2] != pos.shape[2]:
        raise ValueError(f"query: expected shape ({pos.shape[0]}, M, {pos.shape[2]}), got {tuple(query.shape)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= pos.shape[1]:
        raise ValueError(f"k: expected an integer in [1, {pos.shape[1]}], got {k!r}")
    d = _sq_dist(query, pos).masked_fill(~mask.unsqueeze(1), float("inf"))
    # Stable sort keeps equal distances in index order.
    order = torch.sort(d, dim=-1, stable=True).indices[..., :k]
    counts = mask.sum(1).view(-1, 1, 1)
    slot = torch.arange(k, device=pos.device).view(1, 1, k)
    return torch.where(slot < counts, order, order[..., :1])


def ball_query(query: torch.Tensor, pos: torch.Tensor, radius: float, k: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """PointNet++ ball query: indices ``(B, M, k)`` of the first ``k`` real points (in index
    order) within ``radius`` of each query; missing slots repeat the first one found, and a
    query with no point in range gets its nearest real point."""
    mask = _check(pos, mask)
    if query.dim() != 3 or query.shape[0] != pos.shape[0] or query.shape[2] != pos.shape[2]:
        raise ValueError(f"query: expected shape ({pos.shape[0]}, M, {pos.shape[2]}), got {tuple(query.shape)}")
    if not (isinstance(radius, (int, float)) and radius > 0 and radius < float("inf")):
        raise ValueError(f"radius: expected a finite number > 0, got {radius!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected an integer >= 1, got {k!r}")
    N = pos.shape[1]
    d = _sq_dist(query, pos).masked_fill(~mask.unsqueeze(1), float("inf"))
    inside = d <= radius * radius
    key = torch.where(inside, torch.arange(N, device=pos.device).view(1, 1, N), torch.full_like(d, N, dtype=torch.long))
    first = torch.sort(key, dim=-1).values[..., : min(k, N)]
    nearest = d.argmin(-1, keepdim=True)
    head = torch.where(first[..., :1] < N, first[..., :1], nearest)
    out = torch.where(first < N, first, head)
    if k > N:
        out = torch.cat([out, head.expand(*head.shape[:2], k - N)], -1)
    return out
