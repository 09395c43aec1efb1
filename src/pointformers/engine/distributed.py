"""Process-group plumbing for multi-GPU / multi-node training launched by ``torchrun``.

``torchrun --nproc_per_node G [--nnodes N --rdzv_endpoint HOST:PORT] -m pointformers.cli train ...``
starts one process per device and sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``. :func:`init_distributed` reads them and joins the
process group (NCCL when CUDA is available, gloo on CPU). Without those variables (or with
``WORLD_SIZE=1``) it returns a single-process :class:`DistEnv` and ``torch.distributed`` is
never touched, so the same engine code runs with or without a launcher.

The collective helpers below are no-ops for a single process.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

import torch

__all__ = ["DistEnv", "init_distributed", "shutdown_distributed", "resolve_device", "all_reduce_sum",
           "broadcast_object", "all_gather_object", "barrier", "broadcast_module_state"]

#: How long a collective may wait. Validation runs on rank 0 only while the other ranks wait
#: in a broadcast, so this must exceed the longest validation pass (the NCCL default, 10 min,
#: does not on large data sets).
DIST_TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job.

    Attributes:
        rank, world_size, local_rank: as set by torchrun (0, 1, 0 for a single process).
        device: the device this process trains on.
        backend: "nccl", "gloo" or None (single process, no process group).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def distributed(self) -> bool:
        """True when a process group with more than one process is in use."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that writes files, logs and draws progress bars."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"${name}: expected an integer (set by torchrun), got {raw!r}") from None


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` -> ``cuda:LOCAL_RANK`` when CUDA is available, else CPU; ``"cpu"``; ``"cuda"``
    (-> ``cuda:LOCAL_RANK``) or ``"cuda:K"``. ValueError for an unavailable or unknown device."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"train.device: {device!r} requested but CUDA is not available")
        dev = torch.device(f"cuda:{local_rank}" if device == "cuda" else device)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"train.device: {device!r} but only {torch.cuda.device_count()} CUDA devices exist")
        return dev
    raise ValueError(f"train.device: expected 'auto', 'cpu', 'cuda' or 'cuda:K', got {device!r}")


def init_distributed(device: str = "auto") -> DistEnv:
    """Join the torchrun process group if this process was launched by torchrun.

    Args:
        device: ``train.device`` ("auto" | "cpu" | "cuda"); under torchrun each process uses
            ``cuda:LOCAL_RANK`` (one process per GPU).
    Returns:
        A :class:`DistEnv`. For ``WORLD_SIZE`` unset or 1 no process group is created.
    Raises:
        ValueError for inconsistent launcher variables or an unavailable device.
    """
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if world < 1 or not (0 <= rank < world) or local_rank < 0:
        raise ValueError(f"$RANK/$WORLD_SIZE: got rank {rank} of world size {world}")
    dev = resolve_device(device, local_rank)
    if world == 1:
        return DistEnv(0, 1, 0, dev, None)
    import torch.distributed as dist

    if not dist.is_available():
        raise ValueError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"backend": backend, "timeout": DIST_TIMEOUT}
        if dev.type == "cuda":
            kwargs["device_id"] = dev  # binds NCCL to this GPU (avoids a guess on the first collective)
        dist.init_process_group(**kwargs)
    else:
        backend = dist.get_backend()
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, dev, backend)


def shutdown_distributed(env: DistEnv) -> None:
    """Leave the process group (a no-op for a single process)."""
    if env.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            # Leave together: a rank that tears its gloo/NCCL threads down while another still
            # uses the group aborts the process ("terminate called without an active exception").
            barrier(env)
            dist.destroy_process_group()


def all_reduce_sum(env: DistEnv, values: Sequence[float]) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (float64, so sums of many losses stay exact enough)."""
    if not env.distributed:
        return [float(v) for v in values]
    import torch.distributed as dist

    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().tolist()


def broadcast_object(env: DistEnv, obj: Any, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank (pickled; for small objects such as metric dicts)."""
    if not env.distributed:
        return obj
    import torch.distributed as dist

    box = [obj if env.rank == src else None]
    dist.broadcast_object_list(box, src=src, device=env.device if env.backend == "nccl" else None)
    return box[0]


def all_gather_object(env: DistEnv, obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
    if not env.distributed:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    """Wait for every rank (a no-op for a single process)."""
    if env.distributed:
        import torch.distributed as dist

        if env.backend == "nccl":
            dist.barrier(device_ids=[env.device.index])
        else:
            dist.barrier()


def broadcast_module_state(env: DistEnv, module: torch.nn.Module, src: int = 0) -> None:
    """Copy every parameter and buffer of rank ``src``'s ``module`` into the other ranks' copies."""
    if not env.distributed:
        return
    import torch.distributed as dist

    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src)
