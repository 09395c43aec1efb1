"""A tiny regression task for engine tests: trains in milliseconds, uses every kind of randomness
the engine must reproduce (the engine's generator, dropout, numpy's and Python's global
generators), and is registered as task ``toy`` with model ``toy-mlp`` so the real CLI can
train it -- in-process, in a subprocess that gets SIGKILLed, or under torchrun.

Run as a script (tests start it with subprocess)::

    python tests/engine_toy_task.py cli ARGS...        # pointformers.cli.main(ARGS) with the toy task registered
    python tests/engine_toy_task.py rewrite PATH MB    # keep rewriting a ~MB checkpoint at PATH, printing each index

With ``$TOY_KILL_AT_EPOCH=E`` the process SIGKILLs itself during the first training step of epoch E.
"""
from __future__ import annotations

import math
import os
import random
import signal
import sys
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from pointformers.models.registry import available, register_model
from pointformers.tasks.registry import TaskSpec, available_tasks, register_task

TOY_SETS = ["--set", "task.name=toy", "--set", "train.epochs=4", "--set", "train.lr=0.01",
            "--set", "train.step_size=2", "--set", "train.progress=false", "--threads", "1"]


class ToyMLP(nn.Module):
    """``(n, 3) -> (n,)``: Linear-ReLU-Dropout-Linear."""

    def __init__(self, hidden: int = 16, dropout: float = 0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


if "toy-mlp" not in available():
    @register_model("toy-mlp")
    def toy_mlp(**options) -> ToyMLP:
        return ToyMLP(**options)


def make_samples(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` clouds of 5-12 points in 3-D with target ``sin(x0) + x1 * x2``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        m = int(torch.randint(5, 13, (1,), generator=g))
        x = torch.randn(m, 3, generator=g)
        out.append((x, torch.sin(x[:, 0]) + x[:, 1] * x[:, 2]))
    return out


class ToyTask:
    """MSE regression. ``noise``: input jitter drawn from the engine's generator; ``host_rng``:
    also draw a loss weight from numpy's and Python's global generators."""

    def __init__(self, noise: float = 0.05, host_rng: bool = True):
        self.noise, self.host_rng = noise, host_rng
        self.evaluations = 0
        self.kill_at = int(os.environ.get("TOY_KILL_AT_EPOCH", "0") or 0)

    def loss(self, model: nn.Module, sample, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.kill_at and self.evaluations + 1 == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, no cleanup of any kind
        x, y = sample
        x = x + self.noise * torch.randn(x.shape, generator=generator)
        w = 1.0
        if self.host_rng:
            w = 1.0 + 0.1 * float(np.random.rand()) + 0.1 * random.random()
        dev = next(model.parameters()).device
        return w * ((model(x.to(dev)) - y.to(dev)) ** 2).mean()

    @torch.no_grad()
    def evaluate(self, model: nn.Module, samples: Sequence[Any]) -> dict[str, float]:
        self.evaluations += 1
        was = model.training
        model.eval()
        try:
            dev = next(model.parameters()).device
            errs = torch.cat([(model(x.to(dev)).float().cpu() - y) ** 2 for x, y in samples])
        finally:
            model.train(was)
        mse = float(errs.mean())
        return {"mse": mse, "rmse": math.sqrt(mse), "count": float(errs.numel())}


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list]:
    d = cfg["data"]
    sizes = {"train": d["n_train"], "val": 4, "test": 4}
    return {s: make_samples(sizes[s], d["seed"] + 1000 * i) for i, s in enumerate(("train", "val", "test"))
            if s in splits}


def _validate(cfg: Mapping[str, Any]) -> None:
    if cfg["data"]["n_train"] < 1:
        raise ValueError(f"data.n_train: must be >= 1, got {cfg['data']['n_train']}")
    if not cfg["task"]["noise"] >= 0:
        raise ValueError(f"task.noise: must be >= 0, got {cfg['task']['noise']}")


if "toy" not in available_tasks():
    register_task(TaskSpec(
        name="toy", description="engine test task: MSE regression on tiny random clouds",
        data_schema={"n_train": (int,), "seed": (int,)}, data_defaults={"n_train": 9, "seed": 0},
        task_schema={"noise": (float,), "host_rng": (bool,)}, task_defaults={"noise": 0.05, "host_rng": True},
        load=_load, build=lambda cfg: ToyTask(cfg["task"]["noise"], cfg["task"]["host_rng"]),
        metric="mse", mode="min", validate=_validate, default_model="toy-mlp"))


def _rewrite(path: str, mb: float) -> None:
    """Rewrite a checkpoint forever; checkpoint ``i`` holds a tensor filled with ``i``."""
    from pointformers.engine import save_checkpoint

    n = int(mb * 2**20 / 4)
    i = 0
    while True:
        i += 1
        save_checkpoint(path, {"model": {"w": torch.full((n,), float(i))}, "epoch": i})
        print(i, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "cli":
        from pointformers.cli import main

        sys.exit(main(sys.argv[2:]))
    elif sys.argv[1] == "rewrite":
        _rewrite(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit(f"unknown mode {sys.argv[1]!r}")
