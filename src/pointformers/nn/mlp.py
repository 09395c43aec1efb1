"""Multi-layer perceptron with normalisation and activation after every hidden layer."""
from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Linear → LayerNorm → act for each hidden layer, plain Linear last.

    Args:
        channels: widths, e.g. [12, 256, 256, 256, 256, 12] for HEPT's tracking head.
        act: activation module class (HEPT: Tanh).
    Parameters are named ``lins.i`` and ``norms.i`` (the layout of HEPT's checkpoints).
    Shapes: (…, channels[0]) -> (…, channels[-1]).
    """

    def __init__(self, channels: list[int], act: type[nn.Module] = nn.Tanh):
        super().__init__()
        if len(channels) < 2:
            raise ValueError(f"channels needs at least an input and an output width, got {channels}")
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(channels[:-1], channels[1:]))
        self.norms = nn.ModuleList(nn.LayerNorm(c) for c in channels[1:-1])
        self.act = act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin, norm in zip(self.lins[:-1], self.norms):
            x = self.act(norm(lin(x)))
        return self.lins[-1](x)
