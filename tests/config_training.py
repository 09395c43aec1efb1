"""Shared by the task tests: train a config's model a few steps on one sample of its task's data."""
from __future__ import annotations

from pathlib import Path

import torch

from pointformers import models
from pointformers.engine.config import load_config
from pointformers.tasks.registry import get_task


def train_config_steps(path: Path, overrides: list[str], steps: int = 15, lr: float = 3e-3):
    """Load config ``path`` with ``overrides``, build its model (seed 0) and task, and take ``steps``
    Adam steps on the first training sample. Returns (losses, task, model, samples with train and val)."""
    cfg = load_config(path, overrides)
    spec = get_task(cfg["task"]["name"])
    spec.validate(cfg)
    samples = spec.load(cfg, ("train", "val"), False)
    torch.manual_seed(0)
    model = models.build(cfg["model"]["name"], **cfg["model"]["options"])
    task = spec.build(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = task.loss(model, samples["train"][0])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, task, model, samples
