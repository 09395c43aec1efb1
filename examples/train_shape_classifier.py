"""Train a point-cloud shape classifier from Python, then evaluate it (about 15 s on one CPU thread).

What ``pointformers train --config configs/shape-classification-sft-cls.yaml`` does, step by
step, on a tiny version of the task: four procedural shape classes, 128 points per shape, an SFT
classifier (sampled attention, Wang et al. 2023) a quarter of the paper's width.

    python examples/train_shape_classifier.py            # needs the `tasks` extra

The pieces:

* ``load_config(path, overrides)``: a config file of ``configs/`` with ``section.key=value``
  overrides (the command line's ``--set``), validated and filled with defaults;
* ``get_task(name)``: the task's :class:`~pointformers.tasks.registry.TaskSpec`: ``load`` makes
  (or reads from ``data.cache_dir``) the splits, ``build`` the task object with the loss and the
  metrics (overall accuracy ``oa``, mean class accuracy ``macc``);
* ``models.build(name, **options)``: the model of the config;
* ``engine.fit``: the training loop; it writes ``best.pt``, ``last.pt``, ``metrics.json`` and
  ``metrics.csv`` to the run folder and loads the best weights back into the model.

The run is deterministic (seeded data, initialisation and order). It exits with status 1 if
training did not lower the loss or the test accuracy is not above chance.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from pointformers import models
from pointformers.engine import TrainConfig, fit
from pointformers.engine.config import load_config
from pointformers.tasks.registry import get_task

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "shape-classification-sft-cls.yaml"
CLASSES = ["cone", "cuboid", "torus", "dumbbell"]


def main() -> int:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pointformers-example-") as tmp:
        # The shipped config, shrunk: 4 classes with 24 / 6 / 12 shapes each (train / val / test),
        # 128 points per shape, mini-batches of 8 shapes, a 32-wide two-layer model that samples
        # 32 of the 128 tokens per layer (the config's 25 %), 6 epochs.
        overrides = [
            f"data.cache_dir={tmp}/data", "data.preset=tiny", f"data.classes=[{', '.join(CLASSES)}]",
            "data.per_class=[24, 6, 12]", "data.num_points=128", "data.mini_batch=8",
            f"model.options.num_classes={len(CLASSES)}", "model.options.dim=32", "model.options.heads=4",
            "model.options.depth=2", "model.options.k=32", "model.options.head_k=64",
            "train.epochs=6", "train.step_size=4", "train.lr=0.005", "train.device=cpu", "train.progress=false",
            "train.tensorboard=false",
        ]
        cfg = load_config(CONFIG, overrides)

        # Data and task. Each sample of a split is one mini-batch of shapes.
        spec = get_task(cfg["task"]["name"])                   # "shape-classification"
        samples = spec.load(cfg, ("train", "val", "test"), False)
        task = spec.build(cfg)
        print(f"{spec.name}: {len(samples['train'])} / {len(samples['val'])} / {len(samples['test'])} "
              f"mini-batches (train / val / test), classes {CLASSES}")

        # The model, seeded so the run repeats exactly.
        torch.manual_seed(cfg["train"]["seed"])
        model = models.build(cfg["model"]["name"], **cfg["model"]["options"])
        print(f"model {cfg['model']['name']}: {sum(p.numel() for p in model.parameters()):,} parameters")

        # Train. `fit` selects the epoch with the best validation `oa` and returns with its weights.
        run_dir = Path(tmp) / "run"
        result = fit(model, task, samples["train"], samples["val"], TrainConfig(**cfg["train"]), run_dir,
                     cfg["model"]["name"], cfg["model"]["options"])
        assert (run_dir / "best.pt").is_file() and (run_dir / "metrics.csv").is_file()

        # Evaluate the best weights on the held-out test shapes.
        test = task.evaluate(model, samples["test"])
        print(f"test: OA {100 * test['oa']:.1f} %, mAcc {100 * test['macc']:.1f} % "
              f"(best epoch {result.best_epoch}, {result.seconds:.1f} s)")

        losses = [row["train_loss"] for row in result.history]
        chance = 1 / len(CLASSES)
        if not losses[-1] < losses[0]:
            print(f"FAILED: the training loss did not decrease ({losses[0]:.3f} -> {losses[-1]:.3f})")
            return 1
        if not test["oa"] > chance:
            print(f"FAILED: test OA {test['oa']:.3f} is not above chance ({chance:.3f})")
            return 1
        print(f"ok: loss {losses[0]:.3f} -> {losses[-1]:.3f}, test OA {test['oa']:.3f} > chance {chance:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
