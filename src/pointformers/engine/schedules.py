"""Optimisers and learning-rate schedules of the training engine (``train.optimizer``,
``train.schedule`` and friends; see :class:`~.trainer.TrainConfig` for the keys).

The default -- Adam with L2 weight decay and ``StepLR`` stepped once per epoch -- is the HEPT
paper's recipe (App. C.2) and is built from exactly the same torch objects as before these
options existed, so default runs and their checkpoints are unchanged.

Every other schedule is one ``LambdaLR`` stepped after each optimiser step, whose factor is
``warm-up(n) * shape(n)`` (:func:`lr_factor`); ``plateau`` is torch's ``ReduceLROnPlateau``
stepped on the validation metric. Both kinds keep all their state in ``state_dict()`` (the
lambda is rebuilt from the config), so ``last.pt`` resumes them exactly.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch import nn

__all__ = ["OPTIMIZERS", "SCHEDULES", "SCHEDULE_UNITS", "WARMUPS", "NORM_LAYERS", "param_groups", "build_optimizer",
           "build_step_lr", "warmup_length", "scheduler_interval", "schedule_uses_total", "lr_factor",
           "build_scheduler", "scheduler_state_fits"]

#: Values of ``train.optimizer``, ``train.schedule``, ``train.schedule_unit`` and ``train.warmup``.
OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("step", "cosine", "linear", "inverse_sqrt", "plateau", "constant")
SCHEDULE_UNITS = ("epoch", "step")
WARMUPS = ("linear", "untuned")

#: Modules whose parameters ``decay_exempt`` spares (whatever their shape).
NORM_LAYERS: tuple[type, ...] = tuple(t for t in (
    nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm,
    getattr(nn, "RMSNorm", None)) if t is not None)


def param_groups(model: nn.Module, decay_exempt: bool = False) -> list:
    """The parameters to optimise: all of them in one list, or with ``decay_exempt`` two groups,
    ``[{"params": decayed}, {"params": exempt, "weight_decay": 0.0}]``, where *exempt* are
    biases, the weights of normalisation layers and every parameter with fewer than 2 dimensions
    (scales and offsets: decaying them towards 0 only hurts). Both keep the order of
    ``model.parameters()``; a shared parameter counts once (exempt if any owner exempts it)."""
    params = list(model.parameters())
    if not decay_exempt:
        return params
    spared = {id(p) for module in model.modules() for name, p in module.named_parameters(recurse=False)
              if p.ndim < 2 or name == "bias" or isinstance(module, NORM_LAYERS)}
    groups = [{"params": [p for p in params if id(p) not in spared]},
              {"params": [p for p in params if id(p) in spared], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(params: Iterable[Any], lr: float = 1e-2, weight_decay: float = 0.0, name: str = "adam",
                    betas: Iterable[float] = (0.9, 0.999), eps: float = 1e-8, momentum: float = 0.0,
                    nesterov: bool = False) -> torch.optim.Optimizer:
    """``torch.optim`` optimiser ``name`` over ``params`` (parameters or param-group dicts, e.g.
    from :func:`param_groups`):

    * ``"adam"`` -- Adam, weight decay as an L2 term in the gradient (the HEPT paper's optimiser);
    * ``"adamw"`` -- AdamW, decoupled weight decay (``weight_decay`` as given: torch's 0.01
      default does not apply);
    * ``"sgd"`` -- SGD with ``momentum`` (Nesterov with ``nesterov``) and L2 weight decay.

    ``betas``, ``eps``: Adam/AdamW only.
    """
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr: must be a finite number > 0, got {lr!r}")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay: must be a finite number >= 0, got {weight_decay!r}")
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        b1, b2 = betas
        return cls(params, lr=float(lr), betas=(float(b1), float(b2)), eps=float(eps), weight_decay=float(weight_decay))
    if name == "sgd":
        return torch.optim.SGD(params, lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay),
                               nesterov=bool(nesterov))
    raise ValueError(f"optimizer: must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def build_step_lr(optimizer: torch.optim.Optimizer, step_size: int = 500, gamma: float = 0.5) -> torch.optim.lr_scheduler.StepLR:
    """``StepLR(step_size, gamma)``: the engine steps it once per **epoch** by default (paper:
    ×0.5 every 500 epochs), once per optimiser step with ``schedule_unit: step``.

    Short runs shrink ``step_size`` so the decay still happens within the run.
    """
    if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
        raise ValueError(f"step_size: must be an integer >= 1 (epochs), got {step_size!r}")
    if not (isinstance(gamma, (int, float)) and 0 < gamma <= 1):
        raise ValueError(f"gamma: must be a number in (0, 1], got {gamma!r}")
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=float(gamma))


def warmup_length(config: Any) -> float:
    """Warm-up length in optimiser steps (0 = none): ``warmup_steps``, or for ``warmup: untuned``
    the 2 / (1 - β₂) steps of Ma & Yarats (2021), "On the adequacy of untuned warmup for
    adaptive optimization" (2000 steps for β₂ = 0.999)."""
    if config.warmup == "untuned":
        return 2.0 / (1.0 - float(config.betas[1]))
    return float(config.warmup_steps)


def scheduler_interval(config: Any) -> str:
    """When the engine steps the scheduler: ``"epoch"`` (after each epoch's last optimiser step),
    ``"step"`` (after every optimiser step) or ``"metric"`` (``plateau``: after validation, with
    the validation metric)."""
    if config.schedule == "plateau":
        return "metric"
    if config.schedule == "step" and not warmup_length(config):
        return config.schedule_unit  # the StepLR of the default recipe
    return "step"


def schedule_uses_total(config: Any) -> bool:
    """Whether the learning rates depend on the run's length (``epochs``): then a resumed run
    with more epochs would not continue the schedule it started (``cosine`` and ``linear``)."""
    return config.schedule in ("cosine", "linear")


def lr_factor(config: Any, steps_per_epoch: int) -> Callable[[int], float]:
    """The ``LambdaLR`` factor of the schedule: a function of ``n``, the optimiser steps taken so
    far (0 for the first step), returning ``warm-up(n) * shape(n)``:

    * warm-up (``W`` = :func:`warmup_length` > 0): ``min(1, (n + 1) / W)``, linear from lr/W;
    * the decay's clock ``c`` and horizon ``C``: with ``schedule_unit: step``, steps after the
      warm-up (``c = max(0, n - W)``, ``C = epochs * steps_per_epoch - W``); with ``epoch``, the
      epoch index ``n // steps_per_epoch`` and ``C = epochs`` (the warm-up only scales the first
      steps);
    * ``step``: ``gamma ** floor(c / step_size)``;
    * ``cosine``: ``m + (1 - m) (1 + cos(pi min(1, c / C))) / 2`` with ``m = min_lr / lr``
      (torch's ``CosineAnnealingLR(T_max=C, eta_min=min_lr)``);
    * ``linear``: ``m + (1 - m) (1 - min(1, c / C))`` (torch's ``LinearLR(1, m, total_iters=C)``;
      with the warm-up, the "linear warm-up then linear decay to zero" of BERT and fairseq's
      ``polynomial_decay``);
    * ``inverse_sqrt``: ``min(1, sqrt(max(W, 1) / (n + 1)))``: with the warm-up, ``lr min(t/W,
      sqrt(W/t))`` at step ``t = n + 1`` (the Transformer's schedule scaled to peak at ``lr``);
    * ``constant``: 1.
    """
    # the config's values now: the function must not follow later edits of the config object
    schedule, gamma, step_size = config.schedule, float(config.gamma), config.step_size
    w = warmup_length(config)
    per_step = config.schedule_unit == "step"
    horizon = config.epochs * steps_per_epoch - w if per_step else config.epochs
    floor = config.min_lr / config.lr

    def clock(n: int) -> float:
        return max(0.0, n - w) if per_step else float(n // steps_per_epoch)

    def shape(n: int) -> float:
        if schedule == "step":
            return gamma ** math.floor(clock(n) / step_size)
        if schedule in ("cosine", "linear"):
            progress = min(1.0, clock(n) / horizon) if horizon > 0 else 0.0
            shape = (1.0 + math.cos(math.pi * progress)) / 2.0 if schedule == "cosine" else 1.0 - progress
            return floor + (1.0 - floor) * shape
        if schedule == "inverse_sqrt":
            return min(1.0, math.sqrt(max(w, 1.0) / (n + 1)))
        if schedule == "constant":
            return 1.0
        raise ValueError(f"schedule: {schedule!r} is not a LambdaLR schedule")

    def factor(n: int) -> float:
        return (min(1.0, (n + 1) / w) if w else 1.0) * shape(n)

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, config: Any,
                    steps_per_epoch: int) -> torch.optim.lr_scheduler.LRScheduler:
    """The scheduler of ``config`` (a validated :class:`~.trainer.TrainConfig`); step it as
    :func:`scheduler_interval` says. ``steps_per_epoch``: optimiser steps per epoch."""
    if config.schedule == "plateau":
        mode = getattr(config, "plateau_mode", None) or config.mode
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode=mode, factor=float(config.gamma),
                                                          patience=config.patience, min_lr=float(config.min_lr))
    if config.schedule == "step" and not warmup_length(config):
        return build_step_lr(optimizer, config.step_size, config.gamma)  # the default recipe's object
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch: must be >= 1, got {steps_per_epoch!r}")
    # A plain function (not a callable object): LambdaLR's state_dict then holds only counters,
    # and the rebuilt lambda is the one of the config the run was resumed with.
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config, steps_per_epoch))


def scheduler_state_fits(scheduler: Any, state: dict) -> bool:
    """Whether ``state`` (a ``state_dict()``) is one of a scheduler of ``scheduler``'s kind:
    torch's ``load_state_dict`` takes any dict, and a mismatch (a schedule changed with
    ``--accept-config-change``) would fail later or silently. A key of each kind's own tells."""
    own = {torch.optim.lr_scheduler.LambdaLR: "lr_lambdas", torch.optim.lr_scheduler.StepLR: "step_size",
           torch.optim.lr_scheduler.ReduceLROnPlateau: "patience"}
    marks = set(own.values())
    mine = own.get(type(scheduler))
    return mine is None or (mine in state and not (marks - {mine}) & set(state))
