"""A fast stable argsort along the last dimension (HEPT sorts every head's hashes in every layer).

On the CPU, ``torch.argsort(stable=True)`` on float32 runs a comparison sort, and HEPT's per-layer
sorts were a large share of a 60k-point forward pass. Here each float32 key
is mapped to an order-preserving int32, packed with its index into one int64
``(key << 32) | index`` and sorted with numpy's vectorised int64 sort: all keys are then
distinct, so any sort order equals the stable one (ties broken by index), and the result is
exactly ``torch.argsort(x, dim=-1, stable=True)``, several times faster (docs/benchmarks.md,
"Notes from measurements"). Other devices and dtypes use ``torch.argsort`` itself.
"""
from __future__ import annotations

import numpy as np
import torch

from ..nn.model_inputs import is_tracing

__all__ = ["stable_argsort"]


def stable_argsort(x: torch.Tensor) -> torch.Tensor:
    """``torch.argsort(x, dim=-1, stable=True)`` (int64), without autograd. x: (..., n), no NaN."""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or x.shape[-1] >= 2**31 or x.numel() == 0
            or is_tracing()):
        return torch.argsort(x.detach(), dim=-1, stable=True)
    a = (x.detach() + 0.0).contiguous().numpy()  # + 0.0: −0.0 becomes +0.0, equal as torch compares
    bits = a.view(np.int32)
    # IEEE floats order like sign-magnitude ints: flipping the magnitude bits of negatives makes
    # signed int32 comparison agree with float comparison (inf included).
    ordered = np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits).astype(np.int64)
    keys = (ordered << 32) | np.arange(a.shape[-1], dtype=np.int64)
    keys.sort(axis=-1)
    return torch.from_numpy(keys & 0xFFFFFFFF)
