"""DistributedDataParallel: 2 CPU processes under torchrun (gloo) follow the same loss trajectory
as one process on the same global batch; the batch semantics (loss of a step = mean over its
samples) checked against a hand-written optimiser loop."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import engine_toy_task  # noqa: F401  (registers task "toy" and model "toy-mlp")
from engine_toy_task import TOY_SETS, ToyMLP, ToyTask, make_samples
from pointformers.cli import main
from pointformers.engine import DistEnv, TrainConfig, fit, load_checkpoint, sample_generator

HERE = Path(__file__).resolve().parent
# No host-RNG draws and no dropout: those are per-process streams (as in any DDP job), so only
# the engine's own randomness (data order, per-sample generators) is shared across ranks.
DDP_SETS = [*TOY_SETS, "--set", "task.host_rng=false", "--set", "model.options.dropout=0.0",
            "--set", "train.batch_size=4", "--set", "train.epochs=3"]


def test_batch_step_is_the_mean_over_its_samples(tmp_path: Path) -> None:
    """fit with batch_size 3 == Adam on the mean loss of each batch, order from the seeded generator."""
    train, val = make_samples(7, 0), make_samples(2, 1)
    cfg = TrainConfig(epochs=2, lr=0.01, step_size=1, gamma=0.5, seed=3, batch_size=3, metric="mse", mode="min",
                      progress=False, tensorboard=False, device="cpu")
    task = ToyTask(noise=0.05, host_rng=False)
    torch.manual_seed(0)
    model = ToyMLP(dropout=0.0)
    ref = ToyMLP(dropout=0.0)
    ref.load_state_dict(model.state_dict())
    fit(model, task, train, val, cfg, tmp_path, "toy-mlp", {"dropout": 0.0}, log=None)

    opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    gen = torch.Generator().manual_seed(3)
    for epoch in (1, 2):
        order = torch.randperm(7, generator=gen).tolist()
        for start in range(0, 7, 3):
            batch = order[start:start + 3]
            opt.zero_grad()
            losses = [task.loss(ref, train[i], sample_generator(3, epoch, start + j)) for j, i in enumerate(batch)]
            torch.stack(losses).mean().backward()
            opt.step()
        sched.step()
    last = load_checkpoint(tmp_path / "last.pt")["model"]
    for k, v in ref.state_dict().items():
        assert torch.allclose(last[k], v, rtol=1e-5, atol=1e-6), k


def test_world_size_guard(tmp_path: Path) -> None:
    env = DistEnv(rank=0, world_size=4, local_rank=0)
    with pytest.raises(ValueError, match="cannot feed 4 processes"):
        fit(ToyMLP(), ToyTask(), make_samples(3, 0), make_samples(1, 1),
            TrainConfig(epochs=1, metric="mse", mode="min", progress=False, device="cpu"), tmp_path, "toy-mlp", {},
            log=None, dist=env)


@pytest.mark.heavy
def test_two_processes_under_torchrun_match_one_process(tmp_path: Path) -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available in this torch build")
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    assert main(["train", *DDP_SETS, "--out", str(single)]) == 0

    env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(HERE / "engine_toy_task.py"), "cli", "train", *DDP_SETS, "--out", str(ddp)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "2 process(es)" in proc.stdout

    a = json.loads((single / "metrics.json").read_text())
    b = json.loads((ddp / "metrics.json").read_text())
    assert a["world_size"] == 1 and b["world_size"] == 2
    assert len(a["epochs"]) == len(b["epochs"]) == 3
    # 9 samples, global batch 4: batches of 4, 4, 1 -- the last one leaves rank 1 idle.
    for ra, rb in zip(a["epochs"], b["epochs"]):
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-5)
        assert rb["val"]["mse"] == pytest.approx(ra["val"]["mse"], rel=1e-5)
    assert b["test"]["mse"] == pytest.approx(a["test"]["mse"], rel=1e-5)
    wa, wb = load_checkpoint(single / "last.pt")["model"], load_checkpoint(ddp / "last.pt")["model"]
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-6), k
    # Only rank 0 wrote files; every rank's RNG state is in last.pt for an exact resume.
    assert len(load_checkpoint(ddp / "last.pt")["rng"]["ranks"]) == 2
    assert sorted(p.name for p in ddp.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in single.iterdir() if not p.name.startswith("."))
