"""The task-agnostic training engine: Adam/AdamW/SGD with step, cosine, linear, inverse-sqrt, plateau
or constant schedules and warm-up (:mod:`.schedules`; default Adam + StepLR), global batches of
samples, validation every epoch, best/last checkpoints, exact resume, DistributedDataParallel,
CSV/JSON/TensorBoard logs.

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
from .run_folder import RUN_FILES
from .schedules import (
    OPTIMIZERS,
    SCHEDULE_UNITS,
    SCHEDULES,
    WARMUPS,
    build_optimizer,
    build_scheduler,
    param_groups,
    schedule_uses_total,
    scheduler_interval,
    scheduler_state_fits,
    warmup_length,
)

__all__ = ["Task", "TrainConfig", "TrainResult", "Trainer", "fit", "progress_enabled", "sample_generator", "PRECISIONS"]

#: Values of ``train.precision``.
PRECISIONS = ("fp32", "bf16")


class Task(Protocol):
    """What the engine needs from a task."""

    def loss(self, model: nn.Module, sample: Any, generator: torch.Generator | None = None) -> torch.Tensor:
        """Scalar training loss of one sample (model is in train mode; move inputs to its device)."""

    def evaluate(self, model: nn.Module, samples: Sequence[Any]) -> dict[str, float]:
        """Metrics over ``samples`` (the task switches the model to eval mode and disables grad)."""

    # Optional (see :func:`validated_options`): model options that validation chooses, e.g. the
    # track reconstruction's assignment threshold.
    #   validated_options(metrics) -> {option: value} from one validation pass's metrics;
    #   use_validated(model, options): after training, before the test pass: the model and the
    #   task's later evaluate() calls use these options instead of choosing again.


def validated_options(task: Any, metrics: Mapping[str, float]) -> dict[str, Any]:
    """The model options ``task`` chose on validation (``task.validated_options(metrics)``; none for a
    task without that method). They are stored in ``best.pt``'s ``model_config``, so a model rebuilt
    from it (``evaluate``, ``predict``, ``export``) uses them, and are fixed on the model before the
    test pass (``task.use_validated``), so test metrics use what validation chose, not the test set."""
    fn = getattr(task, "validated_options", None)
    return dict(fn(metrics)) if callable(fn) else {}


@dataclass
class TrainConfig:
    """Training options (defaults: the HEPT paper's tracking settings, App. C.2).

    Attributes:
        epochs: passes over the training samples (paper: up to 2000).
        lr: the peak learning rate (paper tracking: 1e-2).
        step_size, gamma: schedule ``step``: ``StepLR``, ×gamma every step_size epochs (paper: 500,
            0.5; shrink step_size for short runs), or optimiser steps with ``schedule_unit: step``.
            Schedule ``plateau``: gamma is the factor of each reduction (must be < 1).
        weight_decay: L2 term in the gradient for adam and sgd, decoupled decay for adamw
            (paper: none; torch's AdamW default of 0.01 does not apply).
        optimizer: "adam" (the paper's), "adamw" or "sgd" (:mod:`.schedules`).
        betas, eps: Adam/AdamW's ``[beta1, beta2]`` and epsilon (torch's defaults).
        momentum, nesterov: SGD's momentum and Nesterov flag (needs momentum > 0); sgd only.
        decay_exempt: no weight decay for biases, normalisation-layer weights and every
            parameter with fewer than 2 dimensions (two param groups).
        schedule: "step" (default), "cosine" (from lr down to ``min_lr`` at the end of the run),
            "linear" (straight from lr down to ``min_lr`` at the end of the run), "inverse_sqrt"
            (after the warm-up ∝ 1/sqrt(step), per optimiser step only), "plateau"
            (``ReduceLROnPlateau`` on the validation ``plateau_metric``/``plateau_mode``, by default
            ``metric`` and ``mode``, factor ``gamma``, ``patience`` epochs, floor ``min_lr``) or
            "constant" (:func:`.schedules.lr_factor` has the formulas).
        schedule_unit: "epoch" or "step": what the decay of ``step``, ``cosine`` and ``linear``
            counts (with "step", cosine and linear decay over all ``epochs × steps per epoch``
            optimiser steps after the warm-up). Everything but the plain per-epoch StepLR and
            plateau is a ``LambdaLR`` updated after every optimiser step.
        min_lr: the floor of ``cosine`` and ``linear`` (<= lr) and of ``plateau``.
        warmup: null, "linear" (``warmup_steps`` steps from lr/warmup_steps up to lr) or
            "untuned" (Ma & Yarats 2021: 2/(1-beta2) steps, adam/adamw only);
            ``warmup_steps`` > 0 alone means linear. The warm-up multiplies the schedule;
            not with plateau.
        warmup_steps: length of the linear warm-up in optimiser steps (0 = none).
        patience: ``plateau``: epochs without improvement before a reduction.
        plateau_metric, plateau_mode: ``plateau``: the validation metric it watches and whether
            it should rise ("max") or fall ("min"), when not ``metric``/``mode`` (e.g. the HEPT
            authors halve the rate on a validation-loss plateau but keep the checkpoint of the
            best AUC); null = ``metric``/``mode``. Only with schedule ``plateau``.
        grad_clip: if set, clip the global gradient norm to this value before each step.
            Not in the HEPT paper; SFT (max grad norm 1.0) and SAMSA (2.0) clip.
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
    optimizer: str = "adam"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    momentum: float = 0.0
    nesterov: bool = False
    decay_exempt: bool = False
    schedule: str = "step"
    schedule_unit: str = "epoch"
    min_lr: float = 0.0
    warmup: str | None = None
    warmup_steps: int = 0
    patience: int = 10
    plateau_metric: str | None = None
    plateau_mode: str | None = None
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
        self._validate_recipe(is_int, is_num)
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
        if isinstance(self.compile, str):
            backends = torch.compiler.list_backends(exclude_tags=())
            if self.compile not in backends:
                raise ValueError(f"compile: {self.compile!r} is not a torch.compile backend; expected true, false or "
                                 f"one of {', '.join(b for b in backends if 'TESTING' not in b)}")
        if self.tensorboard is not None and not isinstance(self.tensorboard, bool):
            raise ValueError(f"tensorboard: must be true, false or null, got {self.tensorboard!r}")
        if not isinstance(self.device, str) or not (self.device in ("auto", "cpu", "cuda")
                                                    or (self.device.startswith("cuda:")
                                                        and self.device[5:].isdigit())):
            raise ValueError(f"device: must be 'auto', 'cpu', 'cuda' or 'cuda:K', got {self.device!r}")
        if not isinstance(self.find_unused_parameters, bool):
            raise ValueError(f"find_unused_parameters: must be true or false, got {self.find_unused_parameters!r}")
        return self

    def _validate_recipe(self, is_int: Callable[[Any], bool], is_num: Callable[[Any], bool]) -> None:
        """The optimiser and schedule keys (see :meth:`validate`)."""
        def one_of(key: str, allowed: Sequence[Any]) -> None:
            value = getattr(self, key)
            if not isinstance(value, (str, type(None))) or value not in allowed:
                names = ", ".join("null" if a is None else a for a in allowed)
                raise ValueError(f"{key}: must be one of {names}, got {value!r}")

        def finite(v: Any) -> bool:
            return is_num(v) and math.isfinite(v)

        one_of("optimizer", OPTIMIZERS)
        if (not isinstance(self.betas, (list, tuple)) or len(self.betas) != 2
                or not all(finite(b) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"betas: must be two numbers in [0, 1) ([beta1, beta2]), got {self.betas!r}")
        if not finite(self.eps) or self.eps <= 0:
            raise ValueError(f"eps: must be a finite number > 0, got {self.eps!r}")
        if not finite(self.momentum) or not 0 <= self.momentum < 1:
            raise ValueError(f"momentum: must be a number in [0, 1), got {self.momentum!r}")
        if not isinstance(self.nesterov, bool):
            raise ValueError(f"nesterov: must be true or false, got {self.nesterov!r}")
        if self.optimizer != "sgd" and (self.momentum or self.nesterov):
            key = "momentum" if self.momentum else "nesterov"
            raise ValueError(f"{key}: only used by optimizer sgd, got optimizer {self.optimizer!r} "
                             f"(Adam's momentum is betas[0])")
        if self.nesterov and not self.momentum:
            raise ValueError("nesterov: needs momentum > 0, got momentum 0")
        if not isinstance(self.decay_exempt, bool):
            raise ValueError(f"decay_exempt: must be true or false, got {self.decay_exempt!r}")
        one_of("schedule", SCHEDULES)
        one_of("schedule_unit", SCHEDULE_UNITS)
        if not finite(self.min_lr) or self.min_lr < 0:
            raise ValueError(f"min_lr: must be a finite number >= 0, got {self.min_lr!r}")
        one_of("warmup", (None, *WARMUPS))
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: must be an integer >= 0 (optimiser steps), got {self.warmup_steps!r}")
        if not is_int(self.patience) or self.patience < 0:
            raise ValueError(f"patience: must be an integer >= 0 (epochs), got {self.patience!r}")
        if self.warmup == "linear" and not self.warmup_steps:
            raise ValueError("warmup: 'linear' needs warmup_steps >= 1")
        if self.warmup == "untuned":
            if self.warmup_steps:
                raise ValueError(f"warmup_steps: must be 0 with warmup 'untuned' (its length is 2/(1-beta2) "
                                 f"steps), got {self.warmup_steps!r}")
            if self.optimizer not in ("adam", "adamw"):
                raise ValueError(f"warmup: 'untuned' needs optimizer adam or adamw (it is set by beta2), "
                                 f"got optimizer {self.optimizer!r}")
        if self.schedule == "plateau":
            if self.schedule_unit != "epoch":
                raise ValueError("schedule_unit: must be 'epoch' with schedule 'plateau' (it steps on the "
                                 f"validation metric once per epoch), got {self.schedule_unit!r}")
            if warmup_length(self):
                raise ValueError("warmup: not supported with schedule 'plateau'; use null and warmup_steps 0")
            if self.gamma >= 1:
                raise ValueError(f"gamma: must be < 1 with schedule 'plateau' (the reduction factor), "
                                 f"got {self.gamma!r}")
        if self.plateau_metric is not None and (not isinstance(self.plateau_metric, str) or not self.plateau_metric):
            raise ValueError(f"plateau_metric: must be a non-empty string or null, got {self.plateau_metric!r}")
        one_of("plateau_mode", (None, "max", "min"))
        if self.schedule != "plateau" and (self.plateau_metric is not None or self.plateau_mode is not None):
            key = "plateau_metric" if self.plateau_metric is not None else "plateau_mode"
            raise ValueError(f"{key}: only used by schedule 'plateau', got schedule {self.schedule!r}")
        if self.schedule == "inverse_sqrt" and self.schedule_unit != "step":
            raise ValueError("schedule_unit: must be 'step' with schedule 'inverse_sqrt' (it decays per "
                             f"optimiser step), got {self.schedule_unit!r}")
        if self.schedule in ("cosine", "linear") and self.min_lr > self.lr:
            raise ValueError(f"min_lr: must be <= lr ({self.lr!r}) with schedule {self.schedule!r}, "
                             f"got {self.min_lr!r}")

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


class Trainer:
    """One training run of :func:`fit`, phase by phase.

    :meth:`run` calls, in order: :meth:`setup` (checks, run folder, seeds, optimiser and
    schedule), :meth:`resume_from_last` (``resume=True``), :meth:`wrap_model` (DDP and/or
    ``torch.compile``), then per epoch :meth:`train_epoch` (one :meth:`train_step` per global
    batch), :meth:`validate` and :meth:`end_epoch` (best/last checkpoints, logs), and
    :meth:`finish` (best weights back on every rank, test metrics); :meth:`close` always runs
    last. The arguments are those of :func:`fit`.
    """

    def __init__(self, model: nn.Module, task: Task, train: Sequence[Any], val: Sequence[Any], config: TrainConfig,
                 run_dir: str | os.PathLike, model_name: str, model_config: Mapping[str, Any],
                 test: Sequence[Any] | None = None, resume: bool = False, extra: Mapping[str, Any] | None = None,
                 log: Callable[[str], None] | None = print, dist: DistEnv | None = None,
                 on_start: Callable[[], None] | None = None, accept_config_change: bool = False):
        self.model, self.task, self.config = model, task, config
        self.on_start = on_start
        self.accept_config_change = accept_config_change
        #: Config changes taken at resumes: ``{"epoch", "changes": {key: [old, new]}, "accepted"}``.
        self.config_changes: list[dict[str, Any]] = []
        self.train, self.val, self.test = train, val, test
        self.run_dir = Path(run_dir)
        self.model_name, self.model_config = model_name, dict(model_config)
        self.resume, self.extra, self.log, self.dist = resume, extra, log, dist
        self.last_path, self.best_path = self.run_dir / "last.pt", self.run_dir / "best.pt"
        self.history: list[dict[str, Any]] = []
        self.best_metric, self.best_epoch, self.start_epoch = float("nan"), 0, 1
        #: The model options validation chose at the best epoch (:func:`validated_options`).
        self.best_options: dict[str, Any] = {}
        self.test_metrics: dict[str, float] | None = None
        # The module the steps run through (DDP and/or compiled) and the one validation uses.
        self.train_model: nn.Module = model
        self.eval_model: nn.Module = model
        self.ddp = None
        self.tb: TensorBoardLog | None = None

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Check the inputs, create the run folder, seed every generator, build the optimiser."""
        config, train = self.config, self.train
        config.validate()
        if len(train) == 0:
            raise ValueError("train: no training samples")
        if len(self.val) == 0:
            raise ValueError("val: no validation samples (the best checkpoint is chosen on them)")
        self.env = env = self.dist if self.dist is not None else DistEnv(device=resolve_device(config.device))
        if env.distributed and env.world_size > len(train):
            raise ValueError(f"train: {len(train)} samples cannot feed {env.world_size} processes")
        self.main = env.is_main
        self.say = (self.log or (lambda s: None)) if self.main else (lambda s: None)
        self.show_progress = self.main and progress_enabled(config.progress)
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            # left by a process killed mid-write (config.yaml included: the CLI writes it atomically too)
            remove_stale_temporaries(self.run_dir, RUN_FILES)

        self.device = env.device
        self.model.to(self.device)
        # Every global generator a task might use starts from the seed (per rank), so a run is a
        # function of its config and a resumed run can restore all of them.
        torch.manual_seed(config.seed + env.rank)
        np.random.seed(config.seed + env.rank)
        random.seed(config.seed + env.rank)
        self.gen = torch.Generator().manual_seed(config.seed)
        self.optimizer = build_optimizer(param_groups(self.model, config.decay_exempt), config.lr,
                                         config.weight_decay, config.optimizer, config.betas, config.eps,
                                         config.momentum, config.nesterov)
        # Global batches per epoch: per-step schedules run over epochs * this many steps.
        self.steps_per_epoch = math.ceil(len(train) / config.batch_size)
        self.scheduler = build_scheduler(self.optimizer, config, self.steps_per_epoch)
        self.schedule_interval = scheduler_interval(config)
        self.meta = {"config": asdict(config), "model_name": self.model_name, "model_config": self.model_config,
                     "world_size": env.world_size, **({"extra": dict(self.extra)} if self.extra else {})}

    def resume_from_last(self) -> None:
        """Restore model, optimiser, schedule, generators and history from ``last.pt`` if it exists."""
        env, config, say, last_path = self.env, self.config, self.say, self.last_path
        # Rank 0 reads the file and sends it to the others: no shared file system needed.
        ck = None
        if self.main and last_path.exists():
            ck = load_checkpoint(last_path, required=("model", "optimizer", "scheduler", "generator", "epoch"))
        ck = broadcast_object(env, ck)
        if ck is None:  # killed before its first epoch ended (or a new folder): nothing to continue
            say(f"resume: no {last_path} yet (no epoch finished); starting from epoch 1")
            return
        self.check_resume_config(ck)  # before anything is restored: a refusal changes nothing
        if not scheduler_state_fits(self.scheduler, ck["scheduler"]):
            raise ValueError(f"--resume: {last_path} holds the state of another kind of schedule than "
                             f"{type(self.scheduler).__name__} (train.schedule {config.schedule!r}, warm-up, "
                             f"schedule_unit); a run cannot switch schedules: start a new run")
        self.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.scheduler.load_state_dict(ck["scheduler"])
        self.gen.set_state(ck["generator"])
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
        self.history = list(ck.get("history", []))
        self.best_metric = float(ck.get("best_metric", float("nan")))
        self.best_epoch = int(ck.get("best_epoch", 0))
        self.best_options = dict(ck.get("best_options") or {})
        self.start_epoch = int(ck["epoch"]) + 1
        say(f"resuming from {last_path} after epoch {self.start_epoch - 1}")
        self.meta["config_changes"] = self.config_changes

    def check_resume_config(self, ck: Mapping[str, Any]) -> None:
        """Compare the run's stored config (``train_config``, ``model_name``, ``model_config`` of
        ``last.pt``) with the one given now. More ``epochs`` is taken unless the schedule depends
        on the run's length (``cosine``, ``linear``: its remaining rates would not continue the ones already
        used); ``progress`` and ``tensorboard`` (display and logging only) and ``device`` (a run may continue
        on another machine; checkpoints are loaded onto the current device) are ignored; any other
        difference raises ValueError listing the keys, unless ``accept_config_change``. A train
        key the stored config lacks (a run of an older version) counts as its default, the
        behaviour of that version. Taken changes are recorded in ``config_changes`` (kept in
        ``last.pt`` and ``metrics.json``) and logged."""
        self.config_changes = [dict(c) for c in ck.get("config_changes", [])]
        stored = {}
        if ck.get("train_config"):
            stored.update({f"train.{k}": v for k, v in asdict(TrainConfig()).items()})
        for k, v in (ck.get("train_config") or {}).items():
            stored[f"train.{k}"] = v
        if "model_name" in ck:
            stored["model.name"] = ck["model_name"]
        for k, v in (ck.get("model_config") or {}).items():
            stored[f"model.options.{k}"] = v
        now = {f"train.{k}": v for k, v in asdict(self.config).items()}
        now["model.name"] = self.model_name
        now.update({f"model.options.{k}": v for k, v in self.model_config.items()})
        ignored = {"train.progress", "train.tensorboard", "train.device"}
        missing = object()
        keys = [k for k in stored if k not in ignored] + \
               [k for k in now if k not in stored and k not in ignored and k.startswith("model.options.")]
        diffs = {}
        for k in keys:
            old, new = stored.get(k, missing), now.get(k, missing)
            if k not in stored or k not in now:
                if k.startswith("model.options."):  # an option only one side names
                    diffs[k] = (None if old is missing else old, None if new is missing else new)
                continue  # a train field of another package version: nothing to compare
            if _normalise(old) != _normalise(new):
                diffs[k] = (old, new)
        if not diffs:
            return
        epoch = int(ck.get("epoch", 0))
        more_epochs = {k for k, (old, new) in diffs.items()
                       if k == "train.epochs" and isinstance(old, int) and isinstance(new, int) and new > old}
        takeable = set() if schedule_uses_total(self.config) else more_epochs
        refused = [k for k in diffs if k not in takeable]
        if refused and not self.accept_config_change:
            why = {k: f": schedule {self.config.schedule!r} decays over the run's total length, so more epochs "
                      f"would change the rates of the epochs already run" for k in more_epochs}
            listed = ", ".join(f"{k} ({diffs[k][0]!r} -> {diffs[k][1]!r}{why.get(k, '')})" for k in refused)
            raise ValueError(f"--resume: the config differs from the run's in {listed}; pass "
                             f"--accept-config-change to resume with the new values anyway")
        # "accepted": the keys taken only because of --accept-config-change
        self.config_changes.append({"epoch": epoch, "changes": {k: [old, new] for k, (old, new) in diffs.items()},
                                    "accepted": refused})
        listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in diffs.items())
        if refused:
            self.say(f"warning: resuming with a changed config (--accept-config-change): {listed}")
        else:
            self.say(f"resuming with {listed}")

    def wrap_model(self) -> None:
        """Wrap the training module in DDP (under torchrun) and compile both modules if asked."""
        config, device, model = self.config, self.device, self.model
        if self.env.distributed:
            from torch.nn.parallel import DistributedDataParallel

            self.train_model = self.ddp = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=config.find_unused_parameters)
        if config.compile:
            backend = "inductor" if config.compile is True else config.compile
            # dynamic=True: clouds differ in size, one graph serves them all instead of a recompile each.
            self.train_model = torch.compile(self.train_model, backend=backend, dynamic=True)
            self.eval_model = torch.compile(model, backend=backend, dynamic=True)

    # --------------------------------------------------------------- helpers
    def autocast(self):
        if self.config.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def evaluate(self, samples: Sequence[Any]) -> dict[str, float]:
        """Metrics on rank 0 (unwrapped model: no DDP hooks), broadcast to every rank."""
        metrics = None
        if self.main:
            with self.autocast():
                metrics = {k: float(v) for k, v in self.task.evaluate(self.eval_model, samples).items()}
        return broadcast_object(self.env, metrics)

    def write_logs(self, test_metrics: dict[str, float] | None = None) -> None:
        write_json(self.run_dir / "metrics.json", {**self.meta, "epochs": self.history,
                                                   "best": {"epoch": self.best_epoch,
                                                            self.config.metric: self.best_metric},
                                                   "test": test_metrics})
        write_metrics_csv(self.run_dir / "metrics.csv", self.history)

    # ---------------------------------------------------------------- epochs
    def train_step(self, epoch: int, order: list[int], start: int, lr: float) -> float:
        """One optimiser step on the global batch ``order[start:start + batch_size]``; returns the
        sum of its samples' losses over all ranks. FloatingPointError (before the update) if any
        loss is not finite."""
        config, env, task, train = self.config, self.env, self.task, self.train
        world, rank = env.world_size, env.rank
        shared_stream = config.batch_size == 1 and world == 1  # the demo's draw order (see module docstring)
        batch = order[start:start + config.batch_size]
        positions = list(range(start + rank, start + len(batch), world))  # this rank's share
        self.optimizer.zero_grad(set_to_none=True)
        local_sum, bad_sample = 0.0, None
        if not positions:
            # Fewer samples than ranks in this batch: a zero-weight pass keeps this rank
            # in DDP's gradient all-reduce without changing the result.
            with self.autocast():
                loss = task.loss(self.train_model, train[batch[0]], sample_generator(config.seed, epoch, start))
            (loss * 0.0).backward()
        for j, pos in enumerate(positions):
            g = self.gen if shared_stream else sample_generator(config.seed, epoch, pos)
            sync = j == len(positions) - 1  # DDP all-reduces on the last backward of the step
            ctx = self.ddp.no_sync() if (self.ddp is not None and not sync) else contextlib.nullcontext()
            with ctx:
                with self.autocast():
                    loss = task.loss(self.train_model, train[order[pos]], g)
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
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        if self.schedule_interval == "step":
            self.scheduler.step()
        return step_sum

    def train_epoch(self, epoch: int) -> tuple[float, float]:
        """One pass over the training samples in a seeded order, then a step of a per-epoch
        schedule. Returns ``(lr, mean training loss)``; ``lr`` is the rate of the epoch's first
        step (per-step schedules change it within the epoch)."""
        config, n = self.config, len(self.train)
        self.model.train()
        order = torch.randperm(n, generator=self.gen).tolist()
        lr = self.optimizer.param_groups[0]["lr"]
        total, count = 0.0, 0
        last_val = self.history[-1]["val"].get(config.metric) if self.history else None
        bar = EpochProgress(self.show_progress, n, f"epoch {epoch}/{config.epochs}", config.metric, last_val)
        try:
            for start in range(0, n, config.batch_size):
                total += self.train_step(epoch, order, start, lr)
                size = min(config.batch_size, n - start)
                count += size
                bar.update(size, total / count)
        finally:
            bar.close()
        if self.schedule_interval == "epoch":
            self.scheduler.step()
        return lr, total / max(count, 1)

    def validate(self) -> dict[str, float]:
        """The task's metrics on the validation samples, then a ``plateau`` schedule's step on
        ``config.plateau_metric`` (default ``config.metric``; before ``last.pt`` saves it);
        ValueError if a metric is missing."""
        metrics = self.evaluate(self.val)
        watched = [("metric", self.config.metric)]
        if self.schedule_interval == "metric" and self.config.plateau_metric is not None:
            watched.append(("plateau_metric", self.config.plateau_metric))
        for key, name in watched:
            if name not in metrics:
                raise ValueError(f"{key}: the task's evaluate() returned no {name!r} (it returned {sorted(metrics)})")
        if self.schedule_interval == "metric":
            self.scheduler.step(float(metrics[self.config.plateau_metric or self.config.metric]))
        return metrics

    def end_epoch(self, epoch: int, lr: float, train_loss: float, metrics: dict[str, float],
                  t0: float, t_train: float) -> None:
        """Bookkeeping of a completed epoch: best-so-far, history, ``best.pt`` (if improved),
        ``last.pt``, ``metrics.json``/``metrics.csv``, TensorBoard and the epoch's log line."""
        config, extra = self.config, self.extra
        value = float(metrics[config.metric])
        improved = _better(value, self.best_metric, config.mode)
        if improved:
            self.best_metric, self.best_epoch = value, epoch
            self.best_options = validated_options(self.task, metrics)
        row = {"epoch": epoch, "lr": lr, "train_loss": train_loss, "val": metrics,
               "train_seconds": t_train, "seconds": time.perf_counter() - t0, "best": improved}
        self.history.append(row)
        rng_states = all_gather_object(self.env, capture_rng_state())
        if self.main:
            state = {"model": self.model.state_dict(), "model_name": self.model_name,
                     "model_config": dict(self.model_config), "epoch": epoch, "metric_name": config.metric,
                     "metric": value}
            if improved:  # the options validation chose belong to the best model's config
                save_checkpoint(self.best_path, {**state, "model_config": {**state["model_config"], **self.best_options},
                                                 **({"extra": dict(extra)} if extra else {})})
            save_checkpoint(self.last_path, {**state, "optimizer": self.optimizer.state_dict(),
                                             "scheduler": self.scheduler.state_dict(), "generator": self.gen.get_state(),
                                             "rng": {"ranks": rng_states}, "best_metric": self.best_metric,
                                             "best_epoch": self.best_epoch, "best_options": self.best_options,
                                             "history": self.history,
                                             "train_config": asdict(config), "world_size": self.env.world_size,
                                             "config_changes": self.config_changes,
                                             # the experiment's config too, so evaluate can use last.pt
                                             **({"extra": dict(extra)} if extra else {})})
            self.write_logs()
            self.tb.log_epoch(row)
        self.say(f"epoch {epoch:>3}/{config.epochs}  loss {row['train_loss']:.4f}  val {config.metric} {value:.4f}"
                 f"{' *' if improved else '  '}  lr {lr:.3g}  {row['seconds']:.1f}s")

    def finish(self) -> None:
        """Load the best weights back (on every rank), evaluate ``test`` if given, write the logs."""
        env = self.env
        barrier(env)
        if self.main and self.best_path.exists():
            self.model.load_state_dict(load_checkpoint(self.best_path)["model"])
        broadcast_module_state(env, self.model)  # every rank ends with the best weights
        use = getattr(self.task, "use_validated", None)
        if self.best_options and callable(use):
            use(self.model, dict(self.best_options))
        test = self.test
        self.test_metrics = self.evaluate(test) if test is not None and len(test) else None
        if self.main:
            self.write_logs(self.test_metrics)

    def close(self) -> None:
        """Close the TensorBoard log and release DDP's hooks."""
        if self.tb is not None:
            self.tb.close()
        if self.ddp is not None:
            # Free DDP's reducer (it hooks the model's parameters) now, while the process group
            # still exists: destroyed later, at interpreter exit, it can abort the process.
            self.train_model = self.eval_model = self.ddp = None
            gc.collect()

    # ------------------------------------------------------------------- run
    def run(self) -> TrainResult:
        """All phases in order (see the class docstring)."""
        t_start = time.perf_counter()
        self.setup()
        if self.resume:
            self.resume_from_last()
        if self.main and self.on_start is not None:
            self.on_start()  # after the resume checks: a failed resume has changed nothing
        self.wrap_model()
        self.tb = TensorBoardLog(self.run_dir / "tensorboard", self.config.tensorboard) if self.main else None
        try:
            for epoch in range(self.start_epoch, self.config.epochs + 1):
                t0 = time.perf_counter()
                lr, train_loss = self.train_epoch(epoch)
                t_train = time.perf_counter() - t0
                metrics = self.validate()
                self.end_epoch(epoch, lr, train_loss, metrics, t0, t_train)
            self.finish()
        finally:
            self.close()
        return TrainResult(self.best_epoch, self.best_metric, self.history, self.test_metrics, self.run_dir,
                           time.perf_counter() - t_start)


def _normalise(v: Any) -> Any:
    """Compare configs by value: tuples as lists, ints equal to floats (1 == 1.0)."""
    if isinstance(v, Mapping):
        return {str(k): _normalise(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_normalise(x) for x in v]
    return v


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
    on_start: Callable[[], None] | None = None,
    accept_config_change: bool = False,
) -> TrainResult:
    """Train ``model`` on ``train`` (``config.batch_size`` samples per optimiser step).

    Each epoch: a seeded permutation of ``train``, one optimiser step per global batch on the
    mean of ``task.loss`` (and a step of a per-step schedule), a step of a per-epoch schedule,
    ``task.evaluate(model, val)`` on rank 0 (and a ``plateau`` step on its metric); if
    ``config.metric`` improved, write ``best.pt``; then ``last.pt``, ``metrics.json`` and
    ``metrics.csv``. After the last epoch the best weights are loaded back into ``model`` (on
    every rank) and, if ``test`` is given, evaluated on it.

    Args:
        model_name, model_config: stored in the checkpoints so
            :func:`pointformers.engine.model_from_checkpoint` can rebuild the model.
        resume: continue from ``run_dir/last.pt`` if it exists (same config and world size
            give exactly the run that was not interrupted). The stored train and model config
            must match the given one, except a larger ``epochs`` (taken and recorded, unless
            the schedule is ``cosine`` or ``linear``); any
            other difference raises ValueError naming the keys (see
            :meth:`Trainer.check_resume_config`).
        accept_config_change: resume even when the config differs; the changes are recorded
            under ``config_changes`` in ``metrics.json`` and ``last.pt`` and logged.
        extra: JSON-able run metadata stored in ``metrics.json`` and the checkpoints.
        log: called with one line per epoch on rank 0 (None = silent).
        dist: this process's place in a torchrun job (:func:`~.distributed.init_distributed`);
            None = a single process without ``torch.distributed``.
        on_start: called once on rank 0 after the setup and the resume succeeded, before the
            first epoch (the CLI writes ``config.yaml`` there, so a failed resume leaves it alone).

    Returns:
        :class:`TrainResult` (its ``test`` and the file-derived fields are the same on every rank).
    Raises:
        ValueError for a bad config or empty ``train``/``val``; FloatingPointError if a loss
        is not finite (nothing is written for that epoch).
    """
    return Trainer(model, task, train, val, config, run_dir, model_name, model_config, test=test, resume=resume,
                   extra=extra, log=log, dist=dist, on_start=on_start,
                   accept_config_change=accept_config_change).run()
