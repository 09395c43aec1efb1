"""Shared test helpers: random float64 clouds and hostile padded batches."""
import torch


def scattered_batch(clouds, g, extra=3):
    """Clouds (x (n, D), pos (n, P)) placed at random order-preserving positions of rows of
    max(n) + extra; padding holds huge values and NaN. -> x, pos, mask, list of positions."""
    N = max(c[0].shape[0] for c in clouds) + extra
    B = len(clouds)
    x = torch.full((B, N, clouds[0][0].shape[1]), 1e6, dtype=torch.float64)
    pos = torch.full((B, N, clouds[0][1].shape[1]), float("nan"), dtype=torch.float64)
    x[:, ::2, 0] = float("nan")
    mask = torch.zeros(B, N, dtype=torch.bool)
    where = []
    for b, (xc, pc) in enumerate(clouds):
        p = torch.randperm(N, generator=g)[: xc.shape[0]].sort().values
        x[b, p], pos[b, p], mask[b, p] = xc, pc, True
        where.append(p)
    return x, pos, mask, where


def cloud(n, g, dim=16, P=3):
    """A cloud of n points: features (n, dim) and coordinates (n, P), float64."""
    return (torch.randn(n, dim, generator=g, dtype=torch.float64), torch.randn(n, P, generator=g, dtype=torch.float64))
