"""Speed and memory of one configured (task, model) pair: ``pointformers benchmark --config F``.

Measures, on the first ``num_samples`` samples of a split, in one process:

* **train step** -- ``task.loss`` forward + backward + an Adam step, per sample (on a copy
  of the model, so the model itself is not changed);
* **evaluate** -- ``task.evaluate(model, [sample])`` per sample: the eval-mode forward plus
  the task's metric (what validation costs per sample);
* **peak memory** -- on CUDA the peak allocated bytes of the step; on CPU the process's peak
  resident size so far (coarse: it includes the data and everything loaded before).

Each timing is the median over ``repeats`` rounds after ``warmup`` untimed rounds. For
mechanism-level tables on controlled inputs use the suite (``pointformers benchmark`` without
``--config``).
"""
from __future__ import annotations

import contextlib
import copy
import resource
import statistics
import sys
import time
from typing import Any, Sequence

import torch
from torch import nn

__all__ = ["benchmark_task_model"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux reports KiB


def benchmark_task_model(model: nn.Module, task: Any, samples: Sequence[Any], device: torch.device,
                         precision: str = "fp32", repeats: int = 3, warmup: int = 1,
                         lr: float = 1e-3) -> dict[str, Any]:
    """Median milliseconds per sample of a training step and of evaluation, and peak memory.

    Args:
        model: the model (left unchanged; a copy is trained).
        task: object with ``loss(model, sample, generator)`` and ``evaluate(model, samples)``.
        samples: the samples to time (each timed separately, times averaged over them).
        precision: "fp32" or "bf16" (autocast), as in training.
    Returns:
        ``{"train_step_ms", "evaluate_ms", "peak_memory_mb", "memory_kind", "num_samples",
        "repeats", "device", "precision", "parameters"}``.
    """
    if not samples:
        raise ValueError("samples: nothing to benchmark (the split is empty)")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats/warmup: expected repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")

    def autocast():
        if precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    work = copy.deepcopy(model).to(device).train()
    opt = torch.optim.Adam(work.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def train_round() -> list[float]:
        times = []
        for s in samples:
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = task.loss(work, s, gen)
            loss.backward()
            opt.step()
            _sync(device)
            times.append(time.perf_counter() - t0)
        return times

    def eval_round() -> list[float]:
        times = []
        for s in samples:
            _sync(device)
            t0 = time.perf_counter()
            with autocast():
                task.evaluate(work, [s])
            _sync(device)
            times.append(time.perf_counter() - t0)
        return times

    for _ in range(warmup):
        train_round()
        eval_round()
    train_ms = statistics.median(statistics.fmean(train_round()) for _ in range(repeats)) * 1e3
    eval_ms = statistics.median(statistics.fmean(eval_round()) for _ in range(repeats)) * 1e3
    if device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(device), "CUDA peak allocated"
    else:
        peak, kind = _peak_rss_bytes(), "process peak RSS"
    return {"train_step_ms": train_ms, "evaluate_ms": eval_ms, "peak_memory_mb": peak / 2**20,
            "memory_kind": kind, "num_samples": len(samples), "repeats": repeats, "device": str(device),
            "precision": precision, "parameters": sum(p.numel() for p in model.parameters())}
