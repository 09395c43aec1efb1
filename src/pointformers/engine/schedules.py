"""Optimiser and learning-rate schedule of the HEPT paper (App. C.2, and the authors' configs)."""
from __future__ import annotations

import math
from typing import Iterable

import torch

__all__ = ["build_optimizer", "build_step_lr"]


def build_optimizer(params: Iterable[torch.nn.Parameter], lr: float = 1e-2, weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam, the paper's optimiser for every model (tracking lr 1e-2 in the authors' config)."""
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr: must be a finite number > 0, got {lr!r}")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay: must be a finite number >= 0, got {weight_decay!r}")
    return torch.optim.Adam(params, lr=float(lr), weight_decay=float(weight_decay))


def build_step_lr(optimizer: torch.optim.Optimizer, step_size: int = 500, gamma: float = 0.5) -> torch.optim.lr_scheduler.StepLR:
    """``StepLR(step_size, gamma)`` stepped once per **epoch** (paper: ×0.5 every 500 epochs).

    Short runs shrink ``step_size`` so the decay still happens within the run.
    """
    if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
        raise ValueError(f"step_size: must be an integer >= 1 (epochs), got {step_size!r}")
    if not (isinstance(gamma, (int, float)) and 0 < gamma <= 1):
        raise ValueError(f"gamma: must be a number in (0, 1], got {gamma!r}")
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=float(gamma))
