"""A minimal, task-agnostic training engine: one sample (cloud) per step, Adam + StepLR,
validation every epoch, best/last checkpoints and a JSON metrics log.

The engine knows nothing about tracking: a *task* supplies the loss of one sample and the
metrics of a list of samples (see :class:`Task`). Files written to ``run_dir``:

* ``best.pt`` -- the model of the epoch with the best validation metric (atomic write);
* ``last.pt`` -- the state after the latest completed epoch, with optimiser, scheduler and
  random-generator states, so :func:`fit` can resume (``resume=True``);
* ``metrics.json`` -- ``{"config", "epochs": [per-epoch dicts], "best", "test"}``.

Robustness: every file is written atomically (:mod:`.checkpoint`), so an exception or
Ctrl-C at any point leaves the previous complete files in place; nothing is written for
an epoch that did not finish. A non-finite loss stops training with FloatingPointError
before the bad update is applied.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch
from torch import nn

from .checkpoint import load_checkpoint, save_checkpoint, write_json
from .schedules import build_optimizer, build_step_lr

__all__ = ["Task", "TrainConfig", "TrainResult", "fit", "progress_enabled"]


class Task(Protocol):
    """What the engine needs from a task."""

    def loss(self, model: nn.Module, sample: Any, generator: torch.Generator | None = None) -> torch.Tensor:
        """Scalar training loss of one sample (model is in train mode)."""

    def evaluate(self, model: nn.Module, samples: Sequence[Any]) -> dict[str, float]:
        """Metrics over ``samples`` (the task switches the model to eval mode and disables grad)."""


@dataclass
class TrainConfig:
    """Training options (defaults: the HEPT paper's tracking settings, spec §3.3).

    Attributes:
        epochs: passes over the training samples (paper: up to 2000).
        lr: Adam learning rate (paper tracking: 1e-2).
        step_size, gamma: StepLR in epochs (paper: 500, 0.5); shrink step_size for short runs.
        weight_decay: Adam weight decay (paper: none).
        grad_clip: if set, clip the global gradient norm to this value before each step.
            Not in the paper; an option for short, high-lr runs where the first steps can
            blow the embedding scale up (see configs/tracking-hept-small.yaml).
        seed: seeds ``torch.manual_seed`` (dropout) and the generator used for shuffling and
            the task's per-step randomness (random pairs).
        metric: key of the validation metric that selects ``best.pt``; mode: "max" or "min".
        progress: show a tqdm bar; None = only when stderr is a TTY and ``$CI`` is unset.
    """

    epochs: int = 2000
    lr: float = 1e-2
    step_size: int = 500
    gamma: float = 0.5
    weight_decay: float = 0.0
    grad_clip: float | None = None
    seed: int = 42
    metric: str = "ap@k"
    mode: str = "max"
    progress: bool | None = None

    def validate(self) -> "TrainConfig":
        """Raise ValueError naming the first bad field; returns self."""
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if not is_int(self.epochs) or self.epochs < 1:
            raise ValueError(f"epochs: must be an integer >= 1, got {self.epochs!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr: must be a finite number > 0, got {self.lr!r}")
        if not is_int(self.step_size) or self.step_size < 1:
            raise ValueError(f"step_size: must be an integer >= 1 (epochs), got {self.step_size!r}")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, (int, float)) or not (0 < self.gamma <= 1):
            raise ValueError(f"gamma: must be a number in (0, 1], got {self.gamma!r}")
        if (isinstance(self.weight_decay, bool) or not isinstance(self.weight_decay, (int, float))
                or not (math.isfinite(self.weight_decay) and self.weight_decay >= 0)):
            raise ValueError(f"weight_decay: must be a finite number >= 0, got {self.weight_decay!r}")
        if self.grad_clip is not None and (isinstance(self.grad_clip, bool) or not isinstance(self.grad_clip, (int, float))
                                           or not (math.isfinite(self.grad_clip) and self.grad_clip > 0)):
            raise ValueError(f"grad_clip: must be a finite number > 0 or null, got {self.grad_clip!r}")
        if not is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed: must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"metric: must be a non-empty string, got {self.metric!r}")
        if self.mode not in ("max", "min"):
            raise ValueError(f"mode: must be 'max' or 'min', got {self.mode!r}")
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ValueError(f"progress: must be true, false or null, got {self.progress!r}")
        return self


@dataclass
class TrainResult:
    """What :func:`fit` returns. ``history``: one dict per completed epoch."""

    best_epoch: int
    best_metric: float
    history: list[dict[str, Any]] = field(default_factory=list)
    test: dict[str, float] | None = None
    run_dir: Path | None = None
    seconds: float = 0.0


def progress_enabled(progress: bool | None = None) -> bool:
    """Explicit choice, else: a bar only on an interactive terminal outside CI."""
    if progress is not None:
        return progress
    return bool(getattr(sys.stderr, "isatty", lambda: False)()) and not os.environ.get("CI")


def _better(value: float, best: float, mode: str) -> bool:
    if value is None or not math.isfinite(value):
        return False
    if best is None or not math.isfinite(best):
        return True
    return value > best if mode == "max" else value < best


def fit(
    model: nn.Module,
    task: Task,
    train: Sequence[Any],
    val: Sequence[Any],
    config: TrainConfig,
    run_dir: str | os.PathLike,
    model_name: str,
    model_config: Mapping[str, Any],
    test: Sequence[Any] | None = None,
    resume: bool = False,
    extra: Mapping[str, Any] | None = None,
    log: Callable[[str], None] | None = print,
) -> TrainResult:
    """Train ``model`` on ``train`` (batch size 1: one sample per optimiser step).

    Each epoch: shuffle (seeded generator), one Adam step per sample on ``task.loss``,
    StepLR step, ``task.evaluate(model, val)``; if ``config.metric`` improved, write
    ``best.pt``; then write ``last.pt`` and ``metrics.json``. After the last epoch the best
    weights are loaded back into ``model`` and, if ``test`` is given, evaluated on it.

    Args:
        model_name, model_config: stored in the checkpoints so
            :func:`pointformers.engine.model_from_checkpoint` can rebuild the model.
        resume: continue from ``run_dir/last.pt`` if it exists (same config expected).
        extra: JSON-able run metadata stored in ``metrics.json`` and the checkpoints.
        log: called with one line per epoch (None = silent).

    Returns:
        :class:`TrainResult`.
    Raises:
        ValueError for a bad config or empty ``train``/``val``; FloatingPointError if a loss
        is not finite (nothing is written for that epoch).
    """
    config.validate()
    if len(train) == 0:
        raise ValueError("train: no training samples")
    if len(val) == 0:
        raise ValueError("val: no validation samples (the best checkpoint is chosen on them)")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    say = log or (lambda s: None)
    t_start = time.perf_counter()

    torch.manual_seed(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    optimizer = build_optimizer(model.parameters(), config.lr, config.weight_decay)
    scheduler = build_step_lr(optimizer, config.step_size, config.gamma)
    history: list[dict[str, Any]] = []
    best_metric, best_epoch, start_epoch = float("nan"), 0, 1
    meta = {"config": asdict(config), "model_name": model_name, "model_config": dict(model_config),
            **({"extra": dict(extra)} if extra else {})}

    last_path, best_path = run_dir / "last.pt", run_dir / "best.pt"
    if resume and last_path.exists():
        ck = load_checkpoint(last_path, required=("model", "optimizer", "scheduler", "generator", "epoch"))
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        scheduler.load_state_dict(ck["scheduler"])
        gen.set_state(ck["generator"])
        if "torch_rng" in ck:
            torch.set_rng_state(ck["torch_rng"])
        history = list(ck.get("history", []))
        best_metric = float(ck.get("best_metric", float("nan")))
        best_epoch = int(ck.get("best_epoch", 0))
        start_epoch = int(ck["epoch"]) + 1
        say(f"resuming from {last_path} after epoch {start_epoch - 1}")

    def write_metrics(test_metrics: dict[str, float] | None = None) -> None:
        write_json(run_dir / "metrics.json", {**meta, "epochs": history,
                                              "best": {"epoch": best_epoch, config.metric: best_metric},
                                              "test": test_metrics})

    show = progress_enabled(config.progress)
    for epoch in range(start_epoch, config.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(len(train), generator=gen).tolist()
        lr = optimizer.param_groups[0]["lr"]
        total, steps = 0.0, 0
        bar = None
        if show:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(order), desc=f"epoch {epoch}/{config.epochs}", leave=False, dynamic_ncols=True)
        try:
            for i in order:
                loss = task.loss(model, train[i], gen)
                if not torch.isfinite(loss.detach()):
                    raise FloatingPointError(f"loss is {float(loss.detach())} at epoch {epoch}, sample {i}; "
                                             f"try a smaller lr (now {lr:g})")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if config.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                total += float(loss.detach())
                steps += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{total / steps:.4f}")
        finally:
            if bar is not None:
                bar.close()
        scheduler.step()
        t_train = time.perf_counter() - t0
        metrics = task.evaluate(model, val)
        value = float(metrics.get(config.metric, float("nan")))
        if config.metric not in metrics:
            raise ValueError(f"metric: the task's evaluate() returned no {config.metric!r} "
                             f"(it returned {sorted(metrics)})")
        improved = _better(value, best_metric, config.mode)
        if improved:
            best_metric, best_epoch = value, epoch
        row = {"epoch": epoch, "lr": lr, "train_loss": total / max(steps, 1),
               "val": {k: float(v) for k, v in metrics.items()}, "train_seconds": t_train,
               "seconds": time.perf_counter() - t0, "best": improved}
        history.append(row)
        state = {"model": model.state_dict(), "model_name": model_name, "model_config": dict(model_config),
                 "epoch": epoch, "metric_name": config.metric, "metric": value}
        if improved:
            save_checkpoint(best_path, {**state, **({"extra": dict(extra)} if extra else {})})
        save_checkpoint(last_path, {**state, "optimizer": optimizer.state_dict(),
                                    "scheduler": scheduler.state_dict(), "generator": gen.get_state(),
                                    "torch_rng": torch.get_rng_state(), "best_metric": best_metric,
                                    "best_epoch": best_epoch, "history": history})
        write_metrics()
        say(f"epoch {epoch:>3}/{config.epochs}  loss {row['train_loss']:.4f}  val {config.metric} {value:.4f}"
            f"{' *' if improved else '  '}  lr {lr:.3g}  {row['seconds']:.1f}s")

    if best_path.exists():
        model.load_state_dict(load_checkpoint(best_path)["model"])
    test_metrics = None
    if test is not None and len(test):
        test_metrics = {k: float(v) for k, v in task.evaluate(model, test).items()}
    write_metrics(test_metrics)
    return TrainResult(best_epoch, best_metric, history, test_metrics, run_dir, time.perf_counter() - t_start)
