"""Keep freed memory in the process while a large forward pass runs (glibc's allocator on Linux).

glibc's ``malloc`` serves blocks above its mmap threshold (at most 32 MiB, adapted at run time)
from fresh mappings and returns them to the system when freed, so every such tensor is
page-faulted in afresh, page by page. HEPT's per-head temporaries at 1M points are 100-130 MB
each and a forward pass allocates hundreds of them: on the 2-core machine of docs/benchmarks.md
filling a fresh 128 MB tensor took 406 ms and 146 ms with the setting below ("Notes on HEPT's CPU
kernels"). :func:`keep_freed_memory` raises the mmap and trim thresholds for the duration of a
``with`` block, so freed blocks are reused, and afterwards sets them back to fixed values at the
level glibc's own adaptation reaches (32 MiB, trim at 64 MiB) and hands the free memory back to
the system (``malloc_trim``). Blocks nest (only the outermost one restores). Elsewhere (another C
library or operating system) it does nothing. ``POINTFORMERS_KEEP_MEMORY=0`` or
``ENABLED = False`` switches it off.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
from contextlib import contextmanager
from typing import Iterator

from .model_inputs import is_tracing

__all__ = ["keep_freed_memory", "ENABLED", "LARGE_ROWS"]

ENABLED = os.environ.get("POINTFORMERS_KEEP_MEMORY", "1").strip().lower() not in ("0", "false", "no", "off")

#: Rows (points) from which the HEPT layers keep freed memory: a head's (rows × 32) float32 temporaries
#: then exceed glibc's largest adaptive mmap threshold (32 MiB).
LARGE_ROWS = 200_000

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_KEEP = {_M_MMAP_THRESHOLD: 1 << 30, _M_TRIM_THRESHOLD: 2**31 - 1, _M_TOP_PAD: 64 << 20}
_AFTER = {_M_MMAP_THRESHOLD: 32 << 20, _M_TRIM_THRESHOLD: 64 << 20, _M_TOP_PAD: 128 << 10}
_lock = threading.Lock()
_depth = 0
_libc = None


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim"):
                    _libc = lib
            except OSError:
                pass
    return _libc or None


@contextmanager
def keep_freed_memory(active: bool = True) -> Iterator[bool]:
    """Inside the block, freed memory stays with the process for reuse (see the module docstring).
    ``active=False`` is a no-op (callers pass their size test). Yields whether it took effect."""
    global _depth
    lib = _glibc() if active and ENABLED else None
    if lib is None:
        yield False
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            for k, v in _KEEP.items():
                lib.mallopt(k, v)
    try:
        yield True
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for k, v in _AFTER.items():
                    lib.mallopt(k, v)
                lib.malloc_trim(0)


def large_cpu_input(x, rows: int | None = None) -> bool:
    """Whether a forward pass on ``x`` (B, N, …) should keep freed memory: eager (not traced), on the
    CPU, with at least :data:`LARGE_ROWS` rows (B·N, or ``rows``)."""
    if is_tracing() or x.device.type != "cpu":
        return False
    n = rows if rows is not None else x.shape[0] * x.shape[1]
    return n >= LARGE_ROWS
