"""The task-agnostic training engine: Adam + StepLR, global batches of samples, validation
every epoch, best/last checkpoints, exact resume, DistributedDataParallel, CSV/JSON/TensorBoard logs.

The engine knows nothing about tracking: a *task* supplies the loss of one sample and the
metrics of a list of samples (see :class:`Task`). Files written to ``run_dir`` (rank 0 only):

* ``best.pt`` -- the model of the epoch with the best validation metric;
* ``last.pt`` -- the state after the latest completed epoch: model, optimiser, scheduler,
  the engine's generator, every rank's torch/CUDA/numpy/Python RNG states, epoch,
  best-so-far and history, so :func:`fit` resumes exactly (``resume=True``);
* ``metrics.json`` -- ``{"config", "epochs": [per-epoch dicts], "best", "test"}`` and
  ``metrics.csv`` -- one row per epoch (:mod:`.logs`);
* ``tensorboard/`` -- event files when TensorBoard is installed (``train.tensorboard``).

**Steps and batches.** An epoch visits the training samples in a seeded random order and
takes ``batch_size`` of them per optimiser step; the step's loss is the mean of its samples'
losses (the last batch of an epoch may be smaller). Under DDP (``torchrun``) every rank
draws the same order and takes every ``world_size``-th sample of each global batch, each
scaled so DDP's gradient average equals the single-process mean over the global batch:
2 processes with batch 4 follow the same trajectory as 1 process with batch 4.

**Randomness.** ``torch.manual_seed(seed + rank)`` seeds dropout. The task's own randomness
(e.g. tracking's random pairs) comes from a generator passed to ``task.loss``: with one
process and ``batch_size`` 1 it is the engine's generator itself, in sample order (the
published demo numbers depend on that order); otherwise each sample gets a generator
seeded by ``(seed, epoch, position in the epoch's order)``, so its draws do not depend on
which rank processes it.

**Robustness.** Every file is written atomically (:mod:`.checkpoint`): a crash or SIGKILL at
any point leaves the previous complete files; nothing is written for an unfinished epoch.
A non-finite loss stops training with FloatingPointError before the bad update is applied
(on all ranks together). Validation runs on rank 0 with the unwrapped model and its metrics
are broadcast, so non-decomposable metrics (average precision, TrackML score) are exact.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from .checkpoint import load_checkpoint, remove_stale_temporaries, save_checkpoint, write_json
from .distributed import (
    DistEnv,
    all_gather_object,
    all_reduce_sum,
    barrier,
    broadcast_module_state,
    broadcast_object,
    resolve_device,
)
from .logs import EpochProgress, TensorBoardLog, write_metrics_csv
from .rng_state import capture_rng_state, restore_rng_state
from .schedules import build_optimizer, build_step_lr

__all__ = ["Task", "TrainConfig", "TrainResult", "fit", "progress_enabled", "sample_generator", "PRECISIONS"]

#: Values of ``train.precision``.
PRECISIONS = ("fp32", "bf16")


class Task(Protocol):
    """What the engine needs from a task."""

    def loss(self, model: nn.Module, sample: Any, generator: torch.Generator | None = None) -> torch.Tensor:
        """Scalar training loss of one sample (model is in train mode; move inputs to its device)."""

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
            Not in the paper; an option for short, high-lr runs.
        seed: seeds torch's, numpy's and Python's global generators (dropout; ``seed + rank``
            under DDP) and the generator
            used for the data order and the task's per-step randomness.
        metric: key of the validation metric that selects ``best.pt``; mode: "max" or "min".
        progress: show a tqdm bar; None = only when stderr is a TTY and ``$CI`` is unset.
        batch_size: samples per optimiser step over all processes (the global batch); the
            step's loss is the mean over them. The paper trains with one event per step.
        precision: "fp32" or "bf16" (``torch.autocast`` with bfloat16 on the model's device).
        compile: ``torch.compile`` the model: False, True (inductor) or a backend name
            (e.g. "aot_eager"). bf16 and compile are off by default: on CPU they rarely
            help (bf16 matmuls are emulated on most CPUs; compilation costs more than it saves
            on short runs); on recent GPUs both usually speed training up.
        tensorboard: write TensorBoard event files: True, False, or None (when installed).
        device: "auto" (CUDA if available), "cpu", "cuda" or "cuda:K"; under torchrun
            each process uses ``cuda:LOCAL_RANK``.
        find_unused_parameters: passed to DistributedDataParallel (set it for models with
            parameters that some steps do not use).
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
    batch_size: int = 1
    precision: str = "fp32"
    compile: bool | str = False
    tensorboard: bool | None = None
    device: str = "auto"
    find_unused_parameters: bool = False

    def validate(self) -> "TrainConfig":
        """Raise ValueError naming the first bad field; returns self."""
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        if not is_int(self.epochs) or self.epochs < 1:
            raise ValueError(f"epochs: must be an integer >= 1, got {self.epochs!r}")
        if not is_num(self.lr) or not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr: must be a finite number > 0, got {self.lr!r}")
        if not is_int(self.step_size) or self.step_size < 1:
            raise ValueError(f"step_size: must be an integer >= 1 (epochs), got {self.step_size!r}")
        if not is_num(self.gamma) or not (0 < self.gamma <= 1):
            raise ValueError(f"gamma: must be a number in (0, 1], got {self.gamma!r}")
        if not is_num(self.weight_decay) or not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay: must be a finite number >= 0, got {self.weight_decay!r}")
        if self.grad_clip is not None and (not is_num(self.grad_clip)
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
        if not is_int(self.batch_size) or self.batch_size < 1:
            raise ValueError(f"batch_size: must be an integer >= 1 (samples per step), got {self.batch_size!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not isinstance(self.compile, (bool, str)) or (isinstance(self.compile, str) and not self.compile):
            raise ValueError(f"compile: must be true, false or a torch.compile backend name, got {self.compile!r}")
        if self.tensorboard is not None and not isinstance(self.tensorboard, bool):
            raise ValueError(f"tensorboard: must be true, false or null, got {self.tensorboard!r}")
        if not isinstance(self.device, str) or not (self.device in ("auto", "cpu", "cuda")
                                                    or (self.device.startswith("cuda:")
                                                        and self.device[5:].isdigit())):
            raise ValueError(f"device: must be 'auto', 'cpu', 'cuda' or 'cuda:K', got {self.device!r}")
        if not isinstance(self.find_unused_parameters, bool):
            raise ValueError(f"find_unused_parameters: must be true or false, got {self.find_unused_parameters!r}")
        return self

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


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


def sample_generator(seed: int, epoch: int, position: int) -> torch.Generator:
    """The generator a sample's task randomness uses in batched or distributed training: a
    function of ``(seed, epoch, position in the epoch's order)`` only, so it is the same
    whichever rank processes the sample."""
    hi, lo = np.random.SeedSequence([int(seed), int(epoch), int(position)]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed((int(hi) << 32) | int(lo))


def _better(value: float, best: float, mode: str) -> bool:
    if value is None or not math.isfinite(value):
        return False
    if best is None or not math.isfinite(best):
        return True
    return value > best if mode == "max" else value < best


_RUN_FILES = ("best.pt", "last.pt", "metrics.json", "metrics.csv")


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
    dist: DistEnv | None = None,
) -> TrainResult:
    """Train ``model`` on ``train`` (``config.batch_size`` samples per optimiser step).

    Each epoch: a seeded permutation of ``train``, one Adam step per global batch on the mean
    of ``task.loss``, a StepLR step, ``task.evaluate(model, val)`` on rank 0; if
    ``config.metric`` improved, write ``best.pt``; then ``last.pt``, ``metrics.json`` and
    ``metrics.csv``. After the last epoch the best weights are loaded back into ``model`` (on
    every rank) and, if ``test`` is given, evaluated on it.

    Args:
        model_name, model_config: stored in the checkpoints so
            :func:`pointformers.engine.model_from_checkpoint` can rebuild the model.
        resume: continue from ``run_dir/last.pt`` if it exists (same config and world size
            give exactly the run that was not interrupted).
        extra: JSON-able run metadata stored in ``metrics.json`` and the checkpoints.
        log: called with one line per epoch on rank 0 (None = silent).
        dist: this process's place in a torchrun job (:func:`~.distributed.init_distributed`);
            None = a single process without ``torch.distributed``.

    Returns:
        :class:`TrainResult` (its ``test`` and the file-derived fields are the same on every rank).
    Raises:
        ValueError for a bad config or empty ``train``/``val``; FloatingPointError if a loss
        is not finite (nothing is written for that epoch).
    """
    config.validate()
    if len(train) == 0:
        raise ValueError("train: no training samples")
    if len(val) == 0:
        raise ValueError("val: no validation samples (the best checkpoint is chosen on them)")
    env = dist if dist is not None else DistEnv(device=resolve_device(config.device))
    if env.distributed and env.world_size > len(train):
        raise ValueError(f"train: {len(train)} samples cannot feed {env.world_size} processes")
    run_dir = Path(run_dir)
    main = env.is_main
    say = (log or (lambda s: None)) if main else (lambda s: None)
    t_start = time.perf_counter()
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(run_dir, _RUN_FILES)  # left by a process killed mid-write

    device = env.device
    model.to(device)
    # Every global generator a task might use starts from the seed (per rank), so a run is a
    # function of its config and a resumed run can restore all of them.
    torch.manual_seed(config.seed + env.rank)
    np.random.seed(config.seed + env.rank)
    random.seed(config.seed + env.rank)
    gen = torch.Generator().manual_seed(config.seed)
    optimizer = build_optimizer(model.parameters(), config.lr, config.weight_decay)
    scheduler = build_step_lr(optimizer, config.step_size, config.gamma)
    history: list[dict[str, Any]] = []
    best_metric, best_epoch, start_epoch = float("nan"), 0, 1
    meta = {"config": asdict(config), "model_name": model_name, "model_config": dict(model_config),
            "world_size": env.world_size, **({"extra": dict(extra)} if extra else {})}

    last_path, best_path = run_dir / "last.pt", run_dir / "best.pt"
    if resume:
        # Rank 0 reads the file and sends it to the others: no shared file system needed.
        ck = None
        if main and last_path.exists():
            ck = load_checkpoint(last_path, required=("model", "optimizer", "scheduler", "generator", "epoch"))
        ck = broadcast_object(env, ck)
        if ck is not None:
            model.load_state_dict(ck["model"])
            optimizer.load_state_dict(ck["optimizer"])
            scheduler.load_state_dict(ck["scheduler"])
            gen.set_state(ck["generator"])
            rng = ck.get("rng")
            if rng is not None:
                ranks = list(rng.get("ranks", []))
                if len(ranks) != env.world_size:
                    say(f"warning: {last_path} was written by {len(ranks)} processes, now {env.world_size}: "
                        f"the run continues but not bit-for-bit as an uninterrupted one")
                if ranks:
                    restore_rng_state(ranks[env.rank] if env.rank < len(ranks) else ranks[0])
            elif "torch_rng" in ck:  # checkpoints of the first engine version
                torch.set_rng_state(ck["torch_rng"])
            saved_bs = (ck.get("train_config") or {}).get("batch_size", config.batch_size)
            if saved_bs != config.batch_size:
                say(f"warning: resuming with batch_size {config.batch_size}, the checkpoint used {saved_bs}")
            history = list(ck.get("history", []))
            best_metric = float(ck.get("best_metric", float("nan")))
            best_epoch = int(ck.get("best_epoch", 0))
            start_epoch = int(ck["epoch"]) + 1
            say(f"resuming from {last_path} after epoch {start_epoch - 1}")

    # The module the steps run through (DDP and/or compiled) and the one validation uses.
    train_model: nn.Module = model
    ddp = None
    if env.distributed:
        from torch.nn.parallel import DistributedDataParallel

        train_model = ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                              find_unused_parameters=config.find_unused_parameters)
    eval_model: nn.Module = model
    if config.compile:
        backend = "inductor" if config.compile is True else config.compile
        # dynamic=True: clouds differ in size, one graph serves them all instead of a recompile each.
        train_model = torch.compile(train_model, backend=backend, dynamic=True)
        eval_model = torch.compile(model, backend=backend, dynamic=True)

    def autocast():
        if config.precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def evaluate(samples: Sequence[Any]) -> dict[str, float]:
        """Metrics on rank 0 (unwrapped model: no DDP hooks), broadcast to every rank."""
        metrics = None
        if main:
            with autocast():
                metrics = {k: float(v) for k, v in task.evaluate(eval_model, samples).items()}
        return broadcast_object(env, metrics)

    tb = TensorBoardLog(run_dir / "tensorboard", config.tensorboard) if main else None

    def write_logs(test_metrics: dict[str, float] | None = None) -> None:
        write_json(run_dir / "metrics.json", {**meta, "epochs": history,
                                              "best": {"epoch": best_epoch, config.metric: best_metric},
                                              "test": test_metrics})
        write_metrics_csv(run_dir / "metrics.csv", history)

    show = main and progress_enabled(config.progress)
    n, bs, world, rank = len(train), config.batch_size, env.world_size, env.rank
    shared_stream = bs == 1 and world == 1  # the demo's draw order (see module docstring)
    try:
        for epoch in range(start_epoch, config.epochs + 1):
            t0 = time.perf_counter()
            model.train()
            order = torch.randperm(n, generator=gen).tolist()
            lr = optimizer.param_groups[0]["lr"]
            total, count = 0.0, 0
            last_val = history[-1]["val"].get(config.metric) if history else None
            bar = EpochProgress(show, n, f"epoch {epoch}/{config.epochs}", config.metric, last_val)
            try:
                for start in range(0, n, bs):
                    batch = order[start:start + bs]
                    positions = list(range(start + rank, start + len(batch), world))  # this rank's share
                    optimizer.zero_grad(set_to_none=True)
                    local_sum, bad_sample = 0.0, None
                    if not positions:
                        # Fewer samples than ranks in this batch: a zero-weight pass keeps this rank
                        # in DDP's gradient all-reduce without changing the result.
                        with autocast():
                            loss = task.loss(train_model, train[batch[0]], sample_generator(config.seed, epoch, start))
                        (loss * 0.0).backward()
                    for j, pos in enumerate(positions):
                        g = gen if shared_stream else sample_generator(config.seed, epoch, pos)
                        sync = j == len(positions) - 1  # DDP all-reduces on the last backward of the step
                        ctx = ddp.no_sync() if (ddp is not None and not sync) else contextlib.nullcontext()
                        with ctx:
                            with autocast():
                                loss = task.loss(train_model, train[order[pos]], g)
                            # DDP averages over ranks: scale so the result is the mean over the global batch.
                            scale = world / len(batch)
                            (loss if scale == 1.0 else loss * scale).backward()
                        value = float(loss.detach())
                        if not math.isfinite(value) and bad_sample is None:
                            bad_sample = (order[pos], value)
                        local_sum += value
                    step_sum, step_bad = all_reduce_sum(env, [local_sum, float(bad_sample is not None)])
                    if step_bad or not math.isfinite(step_sum):
                        where = (f"sample {bad_sample[0]}" if bad_sample else "another rank's sample")
                        value = bad_sample[1] if bad_sample else step_sum
                        raise FloatingPointError(f"loss is {value} at epoch {epoch}, {where}; "
                                                 f"try a smaller lr (now {lr:g})")
                    if config.grad_clip is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                    optimizer.step()
                    total += step_sum
                    count += len(batch)
                    bar.update(len(batch), total / count)
            finally:
                bar.close()
            scheduler.step()
            t_train = time.perf_counter() - t0
            metrics = evaluate(val)
            if config.metric not in metrics:
                raise ValueError(f"metric: the task's evaluate() returned no {config.metric!r} "
                                 f"(it returned {sorted(metrics)})")
            value = float(metrics[config.metric])
            improved = _better(value, best_metric, config.mode)
            if improved:
                best_metric, best_epoch = value, epoch
            row = {"epoch": epoch, "lr": lr, "train_loss": total / max(count, 1), "val": metrics,
                   "train_seconds": t_train, "seconds": time.perf_counter() - t0, "best": improved}
            history.append(row)
            rng_states = all_gather_object(env, capture_rng_state())
            if main:
                state = {"model": model.state_dict(), "model_name": model_name, "model_config": dict(model_config),
                         "epoch": epoch, "metric_name": config.metric, "metric": value}
                if improved:
                    save_checkpoint(best_path, {**state, **({"extra": dict(extra)} if extra else {})})
                save_checkpoint(last_path, {**state, "optimizer": optimizer.state_dict(),
                                            "scheduler": scheduler.state_dict(), "generator": gen.get_state(),
                                            "rng": {"ranks": rng_states}, "best_metric": best_metric,
                                            "best_epoch": best_epoch, "history": history,
                                            "train_config": asdict(config), "world_size": world})
                write_logs()
                tb.log_epoch(row)
            say(f"epoch {epoch:>3}/{config.epochs}  loss {row['train_loss']:.4f}  val {config.metric} {value:.4f}"
                f"{' *' if improved else '  '}  lr {lr:.3g}  {row['seconds']:.1f}s")

        barrier(env)
        if main and best_path.exists():
            model.load_state_dict(load_checkpoint(best_path)["model"])
        broadcast_module_state(env, model)  # every rank ends with the best weights
        test_metrics = evaluate(test) if test is not None and len(test) else None
        if main:
            write_logs(test_metrics)
    finally:
        if tb is not None:
            tb.close()
        if ddp is not None:
            # Free DDP's reducer (it hooks the model's parameters) now, while the process group
            # still exists: destroyed later, at interpreter exit, it can abort the process.
            train_model = eval_model = ddp = None
            gc.collect()
    return TrainResult(best_epoch, best_metric, history, test_metrics, run_dir, time.perf_counter() - t_start)
