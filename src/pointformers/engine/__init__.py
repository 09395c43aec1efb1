"""Engine: the training loop, optimiser/schedule, atomic checkpoints and metric logs."""
from .checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    atomic_write,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    write_json,
)
from .schedules import build_optimizer, build_step_lr
from .trainer import Task, TrainConfig, TrainResult, fit, progress_enabled

__all__ = [
    "CHECKPOINT_FORMAT", "CheckpointError", "atomic_write", "load_checkpoint", "model_from_checkpoint",
    "save_checkpoint", "write_json", "build_optimizer", "build_step_lr", "Task", "TrainConfig", "TrainResult",
    "fit", "progress_enabled",
]
