"""Padded batches of variable-size point clouds.

A batch is a set of padded ``(B, N, ·)`` tensors plus a ``(B, N)`` bool mask (True = real
point). Nothing assumes equal cloud sizes; large HEP events are usually batch size 1.
"""
from __future__ import annotations

from typing import Sequence

import torch


def pad_clouds(clouds: Sequence[torch.Tensor], pad_value: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack clouds of shapes ``(n_i, F)`` into ``(B, max n_i, F)`` plus a ``(B, max n_i)`` mask."""
    if len(clouds) == 0:
        raise ValueError("clouds: expected at least one cloud, got an empty sequence")
    feat = clouds[0].shape[1:]
    for i, c in enumerate(clouds):
        if c.dim() < 1 or c.shape[1:] != feat:
            raise ValueError(f"clouds[{i}]: expected shape (n, {tuple(feat)}), got {tuple(c.shape)}")
    n_max = max(int(c.shape[0]) for c in clouds)
    out = clouds[0].new_full((len(clouds), n_max, *feat), pad_value)
    mask = torch.zeros(len(clouds), n_max, dtype=torch.bool, device=clouds[0].device)
    for i, c in enumerate(clouds):
        out[i, : c.shape[0]] = c
        mask[i, : c.shape[0]] = True
    return out, mask


def unpad_clouds(padded: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of :func:`pad_clouds`: ``(B, N, ·)`` + ``(B, N)`` mask -> list of ``(n_i, ·)``."""
    return [padded[i][mask[i]] for i in range(padded.shape[0])]
