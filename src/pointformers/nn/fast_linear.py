"""Inference-time float32 linear layers on the CPU through oneDNN's prepacked kernels.

PyTorch's dense ``addmm``/``F.linear`` on the CPU call MKL's sgemm, which on some CPUs does not
pick its fastest code path. On the AMD EPYC of this project's benchmarks (same torch build,
2026-11-28) oneDNN's prepacked kernel runs the models' linears 10-30 % faster: (6000 × 256)·(256 ×
256) at 92 against 105 GFLOP/s on one thread, 193 against 218 on two; (60000 × 32)·(32 × 32) at 74
against 98 and 159 against 191; a 2048² GEMM at 96 against 113 and 190 against 226. PyTorch ships
oneDNN's linear with a prepacked weight as ``torch.ops.mkldnn._linear_pointwise`` (the kernel its
own compiler, inductor, uses for frozen CPU models), with an optional fused activation.

:func:`linear` uses it when it applies -- CPU, float32, the op present in this torch build, and
inference: autograd off and no operand that requires grad -- and falls back to
:func:`torch.nn.functional.linear` otherwise, so callers need no branches. The operand check
matters inside a custom ``autograd.Function`` of a training pass: its forward and backward run
with autograd off, but the weights there change with every optimiser step, so a pack would be
used once and thrown away (oneDNN's re-packing cost ~10% of a HEPT training step). Packed weights
are cached per module and re-packed when the weight changes: another tensor, storage or version
counter (an optimiser step updates in place and bumps the version; an update through ``.data``
does not, call :func:`forget` after one). The results equal ``F.linear`` up to float32 summation
order.

Switch it off for a run with ``POINTFORMERS_ONEDNN=0`` or :func:`set_enabled(False) <set_enabled>`
(benchmarks use this to separate what the GEMM library contributes from what an algorithm does).
"""
from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .model_inputs import is_tracing

__all__ = ["available", "enabled", "set_enabled", "disabled", "linear", "matmul", "forget"]

_ACTIVATIONS = ("none", "gelu")
_enabled = os.environ.get("POINTFORMERS_ONEDNN", "1").strip().lower() not in ("0", "false", "no", "off")
_available: bool | None = None
_packs: "weakref.WeakKeyDictionary[nn.Linear, tuple[weakref.ref, tuple, torch.Tensor]]" = weakref.WeakKeyDictionary()


def available() -> bool:
    """oneDNN's prepacked linear exists in this torch build and gives F.linear's result (checked once)."""
    global _available
    if _available is None:
        try:
            ops = torch.ops.mkldnn
            ok = torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
            if ok:
                with torch.no_grad():
                    g = torch.Generator().manual_seed(0)
                    x, w, b = (torch.randn(s, generator=g) for s in ((5, 7), (3, 7), (3,)))
                    y = ops._linear_pointwise(x, ops._reorder_linear_weight(w, 5), b, "none", [], "")
                    ok = bool(torch.allclose(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5))
        except (AttributeError, RuntimeError):
            ok = False
        _available = ok
    return _available


def _register_flop_formula() -> None:
    """Let ``torch.utils.flop_counter.FlopCounterMode`` count the oneDNN linear (2·rows·in·out), so
    FLOP counts do not depend on which path ran."""
    try:
        from torch.utils.flop_counter import register_flop_formula

        @register_flop_formula(torch.ops.mkldnn._linear_pointwise)
        def _flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
            rows = 1
            for s in x_shape[:-1]:
                rows *= s
            return 2 * rows * x_shape[-1] * w_shape[0]
    except (AttributeError, ImportError, RuntimeError, ValueError):
        pass  # no flop counter or no such op in this torch build: nothing to register


_register_flop_formula()  # at import: a FlopCounterMode copies the formulas when it is created


def enabled() -> bool:
    """Whether :func:`linear` may use oneDNN (switched on, and available)."""
    return _enabled and available()


def set_enabled(flag: bool) -> None:
    """Allow (True) or forbid (False) the oneDNN path for this process."""
    global _enabled
    _enabled = bool(flag)


@contextmanager
def disabled() -> Iterator[None]:
    """Context manager: the plain ``F.linear`` path inside, the previous setting restored after."""
    old = _enabled
    set_enabled(False)
    try:
        yield
    finally:
        set_enabled(old)


def forget(lin: nn.Linear) -> None:
    """Drop the cached packed weight of ``lin`` (needed only after changing it through ``.data``)."""
    _packs.pop(lin, None)


def _packed_weight(lin: nn.Linear) -> torch.Tensor:
    """``lin.weight`` packed for oneDNN, cached per weight version: the same tensor object (a weak
    reference, so a new weight at a reused address is not mistaken for the old one), storage,
    version counter and shape."""
    w = lin.weight
    key = (w.data_ptr(), w._version, tuple(w.shape))
    hit = _packs.get(lin)
    if hit is not None and hit[0]() is w and hit[1] == key:
        return hit[2]
    packed = torch.ops.mkldnn._reorder_linear_weight(w.detach())
    _packs[lin] = (weakref.ref(w), key, packed)
    return packed


def _tracks_grad(t: torch.Tensor) -> bool:
    """t (or the tensor it is a view of) requires grad: a training pass, also inside a custom
    autograd Function, where autograd is off but the operands are the graph's tensors."""
    return t.requires_grad or (t._base is not None and t._base.requires_grad)


def _applies(x: torch.Tensor, w: torch.Tensor, w_fixed: bool) -> bool:
    """oneDNN for x (rows, in) and weight w: inference only. ``w_fixed``: w is a module's weight
    (a parameter requires grad in inference too, so only x decides); else w is an operand that
    must not require grad either."""
    # not while tracing or compiling: exported graphs (ONNX, torch.export) keep portable ops
    # (tracing first: the availability probe is a function torch.compile refuses to trace)
    return (not is_tracing() and x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu"
            and w.dtype == torch.float32 and w.device.type == "cpu" and not torch.is_grad_enabled()
            and not _tracks_grad(x) and (w_fixed or not _tracks_grad(w)) and enabled())


def _run(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, activation, [],
                                              "none" if activation == "gelu" else "")


def linear(lin: nn.Linear, x: torch.Tensor, activation: str = "none", use_bias: bool = True) -> torch.Tensor:
    """``act(lin(x))`` for x (rows, in_features) -> (rows, out_features); act is ``"none"`` or exact ``"gelu"``.

    oneDNN's prepacked kernel (activation fused, packed weight cached per module and weight
    version) when :func:`enabled`, x is a float32 CPU matrix, autograd is off and x does not
    require grad (inference); otherwise ``F.linear`` (+ ``F.gelu``). ``use_bias=False`` leaves the
    module's bias out. Always returns a new tensor.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation: expected one of {_ACTIVATIONS}, got {activation!r}")
    bias = lin.bias if use_bias else None
    if _applies(x, lin.weight, w_fixed=True):
        return _run(x, _packed_weight(lin), bias, activation)
    y = F.linear(x, lin.weight, bias)
    return F.gelu(y) if activation == "gelu" else y


#: Fewest rows of the left factor for which :func:`matmul` packs its right factor for oneDNN: the
#: packing costs about 110 µs whatever m is. One HEPT head's (P × 32)·(32 × 32) rows at one thread:
#: P = 6000: ``torch.mm`` 147 µs, pack + oneDNN 255 µs; P = 60000: 1823 against 1414 µs; 1M: equal.
MATMUL_MIN_ROWS = 16384


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for matrices a (m, k), b (k, n) -> (m, n) contiguous, through oneDNN when :func:`linear` would be
    and m ≥ :data:`MATMUL_MIN_ROWS`.

    For a right factor that changes every call (it is packed each time: worth it when m ≫ k, n),
    so only in inference: plain ``torch.mm`` when either factor requires grad (a training pass).
    """
    if a.shape[0] >= MATMUL_MIN_ROWS and _applies(a, b, w_fixed=False):
        return _run(a, torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), a.shape[0]), None, "none")
    return torch.mm(a, b)
