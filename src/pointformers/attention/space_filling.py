"""Space-filling-curve codes of point coordinates: Z-order (Morton) and Hilbert, any dimension.

Points are first snapped to a per-cloud grid of ``2**bits`` cells along the cloud's largest
extent (:func:`quantize`): cells are cubes (the same cell size on every axis, so the curve
sees the cloud's true aspect ratio), and the grid depends only on the cloud's own real points,
so a cloud's codes do not depend on the batch it is in. A grid point ``g`` (P integers in
``[0, 2**bits)``) then gets a ``P·bits``-bit code:

* **Z-order** (:func:`z_order_code`): the coordinates' bits interleaved, most significant bit
  level first; within a level, axis 0 takes the highest bit. On a 2-D grid
  ``(x, y) = (0,0), (0,1), (1,0), (1,1)`` get codes 0, 1, 2, 3.
* **Hilbert** (:func:`hilbert_code`): J. Skilling's construction ("Programming the Hilbert
  curve", AIP Conf. Proc. 707, 2004): undo the excess work of the curve's rotations/reflections
  level by level, Gray-encode across axes, then interleave bits exactly as Z-order. Cells with
  consecutive codes are grid neighbours (they differ by 1 along one axis). It is the textbook
  curve (Wikipedia's ``d2xy`` with x = axis 0): on a 4×4 grid it runs (0,0), (1,0), (1,1),
  (0,1), (0,2), …, (2,0), (3,0); its orientation alternates with the parity of ``bits``
  (on a 2×2 grid: (0,0), (0,1), (1,1), (1,0)).
* ``-trans`` variants swap axes 0 and 1 before coding (Point Transformer V3's "z-trans",
  "hilbert-trans"), giving a differently oriented curve over the same points.

:func:`serialize` sorts each cloud's real points by code (stable: points in the same cell keep
their input order), padded points last.
"""
from __future__ import annotations

import torch

#: The curves :func:`curve_code` knows, in the order ``SerializedAttention`` cycles through them.
CURVES = ("z", "z-trans", "hilbert", "hilbert-trans")

_MAX_CODE_BITS = 62  # codes are int64 and must stay non-negative, with room for the padding key


def default_bits(n_axes: int) -> int:
    """Bits per axis when not given: 16, or fewer so that ``n_axes·bits <= 62``."""
    if n_axes < 1 or n_axes > _MAX_CODE_BITS:
        raise ValueError(f"pos must have between 1 and {_MAX_CODE_BITS} coordinate columns, got {n_axes}")
    return min(16, _MAX_CODE_BITS // n_axes)


def _check_bits(bits: int, n_axes: int) -> None:
    if not isinstance(bits, int) or bits < 1 or bits * n_axes > _MAX_CODE_BITS:
        raise ValueError(f"bits must be an int in [1, {_MAX_CODE_BITS // max(n_axes, 1)}] for {n_axes} axes "
                         f"(codes have bits·axes <= {_MAX_CODE_BITS} bits), got {bits!r}")


def quantize(pos: torch.Tensor, mask: torch.Tensor, bits: int) -> torch.Tensor:
    """Per-cloud cubic grid cells. pos (B, N, P) float, mask (B, N) -> (B, N, P) int64 in [0, 2**bits).

    The cloud's bounding box corner (over real points) maps to 0 and its largest extent to
    ``2**bits`` cells; padded points get cell 0. Computed in float64.
    """
    _check_bits(bits, pos.shape[-1])
    p = pos.to(torch.float64)
    m = mask.unsqueeze(-1)
    lo = p.masked_fill(~m, float("inf")).amin(1, keepdim=True)  # (B, 1, P)
    hi = p.masked_fill(~m, float("-inf")).amax(1, keepdim=True)
    extent = (hi - lo).amax(-1, keepdim=True)  # (B, 1, 1): one cell size for every axis
    cells = float(1 << bits)
    scale = torch.where(extent > 0, cells / extent.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    g = ((p - lo) * scale).floor().clamp_(0, cells - 1).masked_fill(~m, 0.0)
    return g.to(torch.int64)


def _interleave(axes: list[torch.Tensor], bits: int) -> torch.Tensor:
    """Interleave the bits of P int64 tensors: level b, axis a -> bit ``b·P + (P − 1 − a)``."""
    P = len(axes)
    code = torch.zeros_like(axes[0])
    for b in range(bits):
        for a, xa in enumerate(axes):
            code |= ((xa >> b) & 1) << (b * P + (P - 1 - a))
    return code


def z_order_code(grid: torch.Tensor, bits: int) -> torch.Tensor:
    """Morton code of integer grid points. grid (..., P) int64 in [0, 2**bits) -> (...,) int64."""
    _check_bits(bits, grid.shape[-1])
    return _interleave(list(grid.unbind(-1)), bits)


def hilbert_code(grid: torch.Tensor, bits: int) -> torch.Tensor:
    """Hilbert index of integer grid points (Skilling 2004). grid (..., P) int64 -> (...,) int64."""
    P = grid.shape[-1]
    _check_bits(bits, P)
    X = [a.clone() for a in grid.unbind(-1)]
    # Inverse undo of the per-level rotations/reflections, from the top level down.
    q = 1 << (bits - 1)
    while q > 1:
        low = q - 1  # the bits below this level
        for i in range(P):
            has = (X[i] & q) != 0
            if i == 0:
                X[0] = torch.where(has, X[0] ^ low, X[0])  # invert the low bits of axis 0
                continue
            t = (X[0] ^ X[i]) & low  # exchange the low bits of axes 0 and i
            X[0], X[i] = torch.where(has, X[0] ^ low, X[0] ^ t), torch.where(has, X[i], X[i] ^ t)
        q >>= 1
    # Gray encode across axes.
    for i in range(1, P):
        X[i] = X[i] ^ X[i - 1]
    t = torch.zeros_like(X[0])
    q = 1 << (bits - 1)
    while q > 1:
        t = torch.where((X[P - 1] & q) != 0, t ^ (q - 1), t)
        q >>= 1
    X = [xi ^ t for xi in X]
    return _interleave(X, bits)


def curve_code(pos: torch.Tensor, mask: torch.Tensor, curve: str, bits: int | None = None) -> torch.Tensor:
    """Codes of every point on ``curve`` (one of :data:`CURVES`). pos (B, N, P), mask (B, N) -> (B, N) int64.

    Padded points get the code ``2**62``, above every real code.
    """
    if curve not in CURVES:
        raise ValueError(f"curve must be one of {CURVES}, got {curve!r}")
    P = pos.shape[-1]
    bits = default_bits(P) if bits is None else bits
    g = quantize(pos, mask, bits)
    if curve.endswith("-trans") and P >= 2:
        g = g[..., [1, 0, *range(2, P)]]
    code = z_order_code(g, bits) if curve.startswith("z") else hilbert_code(g, bits)
    return code.masked_fill(~mask, 1 << _MAX_CODE_BITS)


def serialize(pos: torch.Tensor, mask: torch.Tensor, curve: str, bits: int | None = None) -> torch.Tensor:
    """Each cloud's points in curve order. pos (B, N, P), mask (B, N) -> order (B, N) int64.

    ``order[b, :n_b]`` are the indices of cloud b's real points sorted by code (ties keep input
    order), ``order[b, n_b:]`` its padded points.
    """
    return torch.argsort(curve_code(pos, mask, curve, bits), dim=1, stable=True)


def check_order(order, mask: torch.Tensor | None, who: str) -> torch.Tensor:
    """Validate an explicit order as :func:`serialize` returns it: an int64 (B, N) tensor whose row b
    is a permutation of 0..N−1 listing cloud b's real points (``mask`` (B, N); None: all) first.
    Returns it on mask's device; ValueError naming ``who`` otherwise."""
    if mask is None:
        if not isinstance(order, torch.Tensor) or order.dim() != 2:
            raise ValueError(f"{who}: order must be an int64 (B, N) tensor, got "
                             f"{getattr(order, 'dtype', type(order).__name__)} {tuple(getattr(order, 'shape', ()))}")
        mask = torch.ones(order.shape, dtype=torch.bool, device=order.device)
    B, N = mask.shape
    if not isinstance(order, torch.Tensor) or order.shape != (B, N) or order.dtype != torch.int64:
        raise ValueError(f"{who}: order must be an int64 (B, N) = {(B, N)} tensor, got "
                         f"{getattr(order, 'dtype', type(order).__name__)} {tuple(getattr(order, 'shape', ()))}")
    order = order.to(mask.device)
    j = torch.arange(N, device=mask.device).expand(B, N)
    if (not torch.equal(order.sort(1).values, j)  # a permutation first: only then is the gather in range
            or not torch.equal(mask.gather(1, order), j < mask.sum(1, keepdim=True))):
        raise ValueError(f"{who}: order rows must be permutations of 0..N-1 listing each cloud's real points first")
    return order
