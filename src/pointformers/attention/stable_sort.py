"""A fast stable argsort along the last dimension (HEPT sorts every head's hashes in every layer).

On the CPU, ``torch.argsort(stable=True)`` on float32 runs a comparison sort, and HEPT's per-layer
sorts were a large share of a 60k-point forward pass. Here each float32 key is mapped to an
order-preserving int32 (the float's bits with the magnitude bits of negatives flipped), so that
integer order is float order and any stable sort of the integers is exactly
``torch.argsort(x, dim=-1, stable=True)``. Rows of at least :data:`RADIX_MIN_LENGTH` keys are sorted
one at a time by ``torch.sort(stable=True)`` on those int32 keys, which PyTorch runs as a radix sort
of four byte-passes (stable by construction); shorter rows are packed with their index into one
int64 ``(key << 32) | index`` (all keys then distinct, so any order is the stable one) and sorted
by numpy, all rows at once. Measured on an Intel Xeon (AVX-512), 2 threads, one row: 1M keys 7.5 ms
against 36 ms for the int64-packed radix sort used before, 60k 0.43 against 1.06 ms
(docs/benchmarks.md, "Notes from measurements"). Other devices and dtypes use ``torch.argsort``
itself.
"""
from __future__ import annotations

import numpy as np
import torch

from ..nn.model_inputs import is_tracing

__all__ = ["stable_argsort"]

#: Shortest row sorted by ``torch.sort``'s radix sort (PyTorch takes it for 1-D integer tensors of
#: at least its parallel grain size, 32768; shorter ones go through a comparison sort, slower than
#: numpy's sort of the packed keys).
RADIX_MIN_LENGTH = 32768


def stable_argsort(x: torch.Tensor) -> torch.Tensor:
    """``torch.argsort(x, dim=-1, stable=True)`` (int64), without autograd. x: (..., n), no NaN."""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or x.shape[-1] >= 2**31 or x.numel() == 0
            or is_tracing()):
        return torch.argsort(x.detach(), dim=-1, stable=True)
    n = x.shape[-1]
    x = x.detach() + 0.0  # −0.0 becomes +0.0, equal as torch compares
    if n >= RADIX_MIN_LENGTH:
        bits = x.contiguous().view(torch.int32)  # x is this function's own copy: mapped in place
        bits ^= (bits >> 31) & 0x7FFFFFFF
        rows = bits.view(-1, n)
        out = torch.empty(rows.shape, dtype=torch.int64)
        values = torch.empty(n, dtype=torch.int32)  # the sorted keys, unused
        for r in range(rows.shape[0]):
            torch.sort(rows[r], stable=True, out=(values, out[r]))
        return out.view(x.shape)
    keys = _packed_keys(x.contiguous().numpy().view(np.int32).astype(np.int64), np.arange(n, dtype=np.int64))
    keys.sort(axis=-1)
    keys &= 0xFFFFFFFF
    return torch.from_numpy(keys)


def _packed_keys(bits, index):
    """``(order-preserving key << 32) | index`` from a float32 array's bits as sign-extended int64
    (numpy or torch), in place on ``bits``."""
    # IEEE floats order like sign-magnitude ints: flipping the magnitude bits of negatives makes
    # signed comparison agree with float comparison (inf included; the same map as the long rows'
    # int32 keys in stable_argsort). In place on one int64 buffer:
    # fresh temporaries of this size cost more than the arithmetic.
    bits ^= (bits >> 31) & 0x7FFFFFFF
    bits <<= 32
    bits |= index
    return bits
