"""Input checks of the task-level models (point clouds, token sequences, sets).

They raise a ``ValueError`` naming the argument and what was expected, so a bad batch never
fails deep inside torch. All return the (B, N) bool mask (all True when none is given).
"""
from __future__ import annotations

import torch

from ..attention import check_attention_inputs


def check_point_inputs(x: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor | None, *, in_dim: int,
                       pos_dim: int = 3, who: str = "model") -> torch.Tensor:
    """x (B, N, in_dim) per-point features (None when ``in_dim == 0``), pos (B, N, pos_dim) -> mask (B, N)."""
    if not isinstance(pos, torch.Tensor) or pos.dim() != 3:
        raise ValueError(f"{who}: pos must be a (B, N, {pos_dim}) coordinate tensor, got "
                         f"{tuple(pos.shape) if isinstance(pos, torch.Tensor) else type(pos).__name__}")
    if in_dim == 0:
        if x is not None:
            raise ValueError(f"{who}: built with in_dim=0 (coordinates only), so x must be None")
        return check_attention_inputs(pos, None, mask, dim=pos_dim, who=f"{who} (pos)")
    if x is None:
        raise ValueError(f"{who}: x (B, N, {in_dim}) per-point features are required")
    return check_attention_inputs(x, pos, mask, dim=in_dim, pos_dim=pos_dim, requires_pos=True, who=who)


def check_token_inputs(tokens: torch.Tensor, mask: torch.Tensor | None, *, vocab_size: int,
                       max_len: int | None = None, who: str = "model") -> tuple[torch.Tensor, torch.Tensor]:
    """tokens (B, N) integer ids in [0, vocab_size) at real positions -> (tokens with padding set to 0, mask)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError(f"{who}: tokens must be a (B, N) integer tensor, got "
                         f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise ValueError(f"{who}: tokens must hold integer ids, got dtype {tokens.dtype}")
    B, N = tokens.shape
    if B == 0 or N == 0:
        raise ValueError(f"{who}: tokens is empty (shape {(B, N)}); every sequence needs at least one token")
    if max_len is not None and N > max_len:
        raise ValueError(f"{who}: sequences of length {N} exceed max_len={max_len}")
    if mask is None:
        mask = torch.ones(B, N, dtype=torch.bool, device=tokens.device)
    else:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != (B, N):
            raise ValueError(f"{who}: mask must be a bool (B, N) = {(B, N)} tensor, got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
        if bool((~mask.any(1)).any()):
            raise ValueError(f"{who}: mask marks sequence(s) {(~mask.any(1)).nonzero().flatten().tolist()} as empty")
    real = tokens[mask]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_size):
        raise ValueError(f"{who}: token ids must lie in [0, {vocab_size}), got range "
                         f"[{int(real.min())}, {int(real.max())}]")
    return tokens.long().masked_fill(~mask, 0), mask
