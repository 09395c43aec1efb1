"""Multi-layer perceptron with normalisation and activation after every hidden layer."""
from __future__ import annotations

import torch
from torch import nn

from . import fast_linear
from .model_inputs import is_tracing


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) computed as 2·σ(2x) − 1; the backward is tanh's own, (1 − y²)·g."""

    @staticmethod
    def forward(ctx, x):
        y = torch.mul(x, 2.0).sigmoid_().mul_(2.0).sub_(1.0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``torch.tanh`` for float32 CPU tensors as 2·σ(2x) − 1: PyTorch's CPU tanh takes 3.9 ms for
    6000 × 256 floats on the benchmarks' CPU, the sigmoid form 1.0 ms (HEPT's 256-wide tanh head
    spent 4-5 % of a forward pass in it). The two agree to 2e-7 absolute (float32 rounding of
    values in [−1, 1]); other dtypes, devices and traced graphs use ``torch.tanh`` itself.
    Shapes: any -> the same."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or is_tracing():
        return torch.tanh(x)
    return _SigmoidTanh.apply(x)


class MLP(nn.Module):
    """Linear → LayerNorm → act for each hidden layer, plain Linear last.

    Args:
        channels: widths, e.g. [12, 256, 256, 256, 256, 12] for HEPT's tracking head.
        act: activation module class (HEPT: Tanh).
    Parameters are named ``lins.i`` and ``norms.i`` (the layout of HEPT's checkpoints).
    Shapes: (…, channels[0]) -> (…, channels[-1]).
    """

    #: Rows per chunk in inference (no grad). A 60k-point cloud's 256-wide hidden layer is a 61 MB
    #: tensor: allocating a fresh one per layer costs page faults that took longer than the GEMMs on
    #: a 2-core CPU; 4096-row chunks (4 MB) stay in cache and reuse the allocator's memory.
    INFERENCE_CHUNK_ROWS = 4096

    def __init__(self, channels: list[int], act: type[nn.Module] = nn.Tanh):
        super().__init__()
        if len(channels) < 2:
            raise ValueError(f"channels needs at least an input and an output width, got {channels}")
        self.channels = list(channels)
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(channels[:-1], channels[1:]))
        self.norms = nn.ModuleList(nn.LayerNorm(c) for c in channels[1:-1])
        self.act = act()

    def reset_parameters(self) -> None:
        """Re-initialise every Linear, then every LayerNorm (and a learnable activation), as the
        constructor does (in its order)."""
        for lin in self.lins:
            lin.reset_parameters()
        for norm in self.norms:
            norm.reset_parameters()
        if callable(getattr(self.act, "reset_parameters", None)):
            self.act.reset_parameters()

    def extra_repr(self) -> str:
        return f"channels={self.channels}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return self._rows(x)  # (export and compile see one static graph, no size branch)
        # inference: 2-D rows through fast_linear (oneDNN on the CPU where available), in chunks
        rows = x.numel() // max(x.shape[-1], 1)
        flat = x.reshape(rows, x.shape[-1])
        if rows <= 2 * self.INFERENCE_CHUNK_ROWS:
            return self._rows(flat, fast=True).view(*x.shape[:-1], -1)
        out = flat.new_empty(rows, self.lins[-1].out_features)
        for s in range(0, rows, self.INFERENCE_CHUNK_ROWS):  # rows are independent: same result
            out[s:s + self.INFERENCE_CHUNK_ROWS] = self._rows(flat[s:s + self.INFERENCE_CHUNK_ROWS], fast=True)
        return out.view(*x.shape[:-1], -1)

    def _rows(self, x: torch.Tensor, fast: bool = False) -> torch.Tensor:
        """The layers on x (..., C); ``fast``: x is 2-D and autograd is off (:func:`fast_linear.linear`)."""
        linear = fast_linear.linear if fast else (lambda lin, h: lin(h))
        act = tanh if type(self.act) is nn.Tanh else self.act
        for lin, norm in zip(self.lins[:-1], self.norms):
            x = act(norm(linear(lin, x)))
        return linear(self.lins[-1], x)
