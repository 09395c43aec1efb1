"""The attention contract shared by every mechanism, and its input checks.

Every mechanism is a ``torch.nn.Module`` token mixer::

    y = attn(x, pos=None, mask=None)   # x (B, N, D); pos (B, N, P); mask (B, N) bool, True = real
                                       # returns (B, N, D) with padded rows set to zero

Bad input is rejected here with a ``ValueError`` that names the argument, so that no
mechanism fails deep inside torch.
"""
from __future__ import annotations

import torch
from torch import nn

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_attention_inputs(
    x: torch.Tensor,
    pos: torch.Tensor | None,
    mask: torch.Tensor | None,
    *,
    dim: int,
    pos_dim: int | None = None,
    min_pos_dim: int | None = None,
    requires_pos: bool = False,
    who: str = "attention",
) -> torch.Tensor:
    """Validate the contract's inputs and return the mask (all True when ``mask`` is None).

    Checks: x is a floating ``(B, N, dim)`` tensor; pos (when needed) is ``(B, N, P)`` on the
    same device with P == pos_dim (or P >= min_pos_dim); mask is a bool ``(B, N)`` tensor;
    no cloud is empty; x and pos are finite at real points.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"{who}: x must be a (B, N, D) tensor, got {type(x).__name__} of shape "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else '?'}")
    if x.dtype not in _FLOATS:
        raise ValueError(f"{who}: x must be a floating tensor, got dtype {x.dtype}")
    B, N, D = x.shape
    if D != dim:
        raise ValueError(f"{who}: x has feature size {D}, expected dim={dim}")
    if N == 0 or B == 0:
        raise ValueError(f"{who}: x is empty (shape {tuple(x.shape)}); every cloud needs at least one point")
    if mask is None:
        mask = torch.ones(B, N, dtype=torch.bool, device=x.device)
    else:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError(f"{who}: mask must be a bool tensor (True = real point), got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)}")
        if mask.shape != (B, N):
            raise ValueError(f"{who}: mask has shape {tuple(mask.shape)}, expected (B, N) = {(B, N)}")
        if mask.device != x.device:
            raise ValueError(f"{who}: mask is on {mask.device} but x is on {x.device}")
        empty = ~mask.any(dim=1)
        if bool(empty.any()):
            raise ValueError(f"{who}: mask marks cloud(s) {empty.nonzero().flatten().tolist()} as empty; "
                             "every cloud needs at least one real point")
    if requires_pos and pos is None:
        raise ValueError(f"{who}: pos (B, N, P) coordinates are required")
    if pos is not None:
        if not isinstance(pos, torch.Tensor) or pos.dim() != 3 or pos.shape[:2] != (B, N):
            raise ValueError(f"{who}: pos must have shape (B, N, P) = ({B}, {N}, P), got "
                             f"{tuple(pos.shape) if isinstance(pos, torch.Tensor) else type(pos).__name__}")
        if pos.dtype not in _FLOATS:
            raise ValueError(f"{who}: pos must be a floating tensor, got dtype {pos.dtype}")
        if pos.device != x.device:
            raise ValueError(f"{who}: pos is on {pos.device} but x is on {x.device}")
        P = pos.shape[-1]
        if pos_dim is not None and P != pos_dim:
            raise ValueError(f"{who}: pos has {P} coordinate columns, expected {pos_dim}")
        if min_pos_dim is not None and P < min_pos_dim:
            raise ValueError(f"{who}: pos has {P} coordinate columns, expected at least {min_pos_dim}")
        if not _finite_at(pos, mask):
            raise ValueError(f"{who}: pos contains NaN or inf at real points")
    if not _finite_at(x, mask):
        raise ValueError(f"{who}: x contains NaN or inf at real points")
    return mask


def _finite_at(t: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether t (B, N, ·) is finite at every real point of mask (B, N).

    First one streaming reduction over all of t: a NaN or inf anywhere makes the sum non-finite,
    so a finite sum proves every entry finite without the masked copy. Only when the sum is not
    finite (a non-finite value somewhere, possibly in padding, which may hold anything, or a
    finite overflow) are the real points checked one by one.
    """
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t[mask]).all())


class TokenMixer(nn.Module):
    """Base class of the mechanisms: holds ``dim`` and ``heads`` and the zero-padding rule."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not isinstance(heads, int) or heads < 1:
            raise ValueError(f"heads must be a positive int, got {heads!r}")
        self.dim = dim
        self.heads = heads

    @staticmethod
    def zero_padding(y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Set padded rows of ``y`` (B, N, D) to zero."""
        return y.masked_fill(~mask.unsqueeze(-1), 0.0)
