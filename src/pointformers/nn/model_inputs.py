"""Input checks of the attention contract and of the task-level models (point clouds, token
sequences, sets).

They raise a ``ValueError`` naming the argument and what was expected, so a bad batch never
fails deep inside torch. All return the (B, N) bool mask (all True when none is given).

The checks are eager-only: while ``torch.compile``, ``torch.export`` or a tracer captures a
graph (:func:`is_tracing`) they return the mask unchecked, because data-dependent Python
branches (``if nan anywhere: raise``) would break the graph; a compiled or exported model is
checked where its inputs are made.
"""
from __future__ import annotations

import torch


def is_tracing() -> bool:
    """True while ``torch.compile``, ``torch.export`` or ``torch.jit`` traces the running code."""
    return bool(torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing())


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
    no cloud is empty; x and pos are finite at real points. While tracing (:func:`is_tracing`)
    nothing is checked and the mask (or an all-True one) is returned as is.
    """
    if is_tracing():
        return mask if mask is not None else torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
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
        # pos is computed with x's precision (a float64 pos meets a float32 module): the narrower limit
        _check_values(pos, mask, "pos", who, x.dtype)
    _check_values(x, mask, "x", who)
    return mask


#: Largest |value| of x and pos at real points that every mechanism keeps finite, per dtype
#: (measured: each mechanism's output stays finite up to 1e15 in float32 and fails from 1e19;
#: bfloat16 has float32's range; in float16 every mechanism stays finite to 1e4, ``kernel`` gives
#: NaN from 2e4).
MAX_MAGNITUDE = {torch.float16: 1e4, torch.float32: 1e15, torch.bfloat16: 1e15, torch.float64: 1e100}


def _check_values(t: torch.Tensor, mask: torch.Tensor, name: str, who: str,
                  compute_dtype: torch.dtype | None = None) -> None:
    """t (B, N, ·) must be finite and within :data:`MAX_MAGNITUDE` at every real point of mask: the
    limit of t's dtype, or of ``compute_dtype`` (the dtype t is computed with) where that is lower.

    One streaming reduction over all of t first (its min and max are NaN or inf if any entry is,
    and bound every entry); only when it fails, which padding (which may hold anything) can cause,
    are the real points looked at one by one.
    """
    limit, limit_dtype = MAX_MAGNITUDE.get(t.dtype), t.dtype
    if compute_dtype in MAX_MAGNITUDE and (limit is None or MAX_MAGNITUDE[compute_dtype] < limit):
        limit, limit_dtype = MAX_MAGNITUDE[compute_dtype], compute_dtype
    if t.numel():  # min and max in one pass without an |t| copy; NaN propagates into both
        lo, hi = torch.aminmax(t.detach())
        top = torch.maximum(-lo, hi)
    else:
        top = t.new_zeros(())
    if bool(torch.isfinite(top)) and (limit is None or float(top) <= limit):
        return
    real = t.detach()[mask]
    if not bool(torch.isfinite(real).all()):
        raise ValueError(f"{who}: {name} contains NaN or inf at real points")
    if limit is not None and real.numel() and float(real.abs().max()) > limit:
        raise ValueError(f"{who}: {name} has values up to {float(real.abs().max()):.3g} at real points; the "
                         f"mechanisms stay finite for |{name}| <= {limit:.0e} in {str(limit_dtype).replace('torch.', '')} "
                         "(rescale the input, or use float64)")


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
    if not is_tracing():  # value checks read the data: eager only (a traced graph keeps no host reads)
        if bool((~mask.any(1)).any()):
            raise ValueError(f"{who}: mask marks sequence(s) {(~mask.any(1)).nonzero().flatten().tolist()} as empty")
        real = tokens[mask]
        if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_size):
            raise ValueError(f"{who}: token ids must lie in [0, {vocab_size}), got range "
                             f"[{int(real.min())}, {int(real.max())}]")
    return tokens.long().masked_fill(~mask, 0), mask
