"""Engine: the training loop, optimisers and schedules, atomic checkpoints, DDP and metric logs."""
from .checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    atomic_write,
    load_checkpoint,
    model_from_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
    write_json,
)
from .distributed import DistEnv, init_distributed, shutdown_distributed
from .logs import read_metrics_csv, write_metrics_csv
from .schedules import OPTIMIZERS, SCHEDULES, build_optimizer, build_scheduler, build_step_lr, param_groups
from .trainer import PRECISIONS, Task, TrainConfig, TrainResult, Trainer, fit, progress_enabled, sample_generator

__all__ = [
    "CHECKPOINT_FORMAT", "CheckpointError", "atomic_write", "load_checkpoint", "model_from_checkpoint",
    "remove_stale_temporaries", "save_checkpoint", "write_json", "DistEnv", "init_distributed",
    "shutdown_distributed", "read_metrics_csv", "write_metrics_csv", "build_optimizer", "build_step_lr",
    "build_scheduler", "param_groups", "OPTIMIZERS", "SCHEDULES",
    "PRECISIONS", "Task", "TrainConfig", "TrainResult", "Trainer", "fit", "progress_enabled", "sample_generator",
]
