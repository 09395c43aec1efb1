"""Every point-cloud / set / sequence config resolves, builds, and trains one step on tiny data."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from pointformers import models
from pointformers.engine.config import load_config
from pointformers.tasks import metrics
from pointformers.tasks.registry import get_task

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("shape-classification", "part-segmentation", "listops", "clustering", "pair-potential")
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if p.name.startswith(TASKS))
#: (task, model) pairs the issue asks configs for.
PAIRS = {"shape-classification": ["sft-cls", "sft-ri-cls", "samsa-cls", "sampled-cls", "sampled-hier-cls", "full-cls",
                                  "mlp-cls"],
         "part-segmentation": ["sft-partseg", "sft-ri-partseg", "samsa-partseg", "full-partseg", "mlp-partseg"],
         "listops": ["samsa-seq", "flt-seq", "full-seq", "mlp-seq"],
         "clustering": ["set-isab-pma", "set-isab-pma-sampled", "set-sab-pma", "mlp-set"],
         "pair-potential": ["flt-3d-reg", "full-3d-reg", "mlp-3d-reg"]}


def tiny_overrides(task: str, cache: str) -> list[str]:
    common = [f"data.cache_dir={cache}", "train.epochs=1"]
    if task == "shape-classification":
        return common + ["data.preset=tiny", "data.classes=[cone, cuboid, torus]", "data.per_class=[2, 1, 1]",
                         "data.num_points=32", "data.mini_batch=3"]
    if task == "part-segmentation":
        return common + ["data.preset=tiny", "data.classes=[mug, lamp]", "data.per_class=[2, 1, 1]",
                         "data.num_points=32", "data.mini_batch=2"]
    return common + ["data.preset=tiny", "data.mini_batch=3"]


def test_every_task_model_pair_has_a_config():
    have = {(load_config(p)["task"]["name"], load_config(p)["model"]["name"]) for p in CONFIGS}
    missing = [(t, m) for t, ms in PAIRS.items() for m in ms if (t, m) not in have]
    assert not missing, f"no config for {missing}"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_resolves_builds_and_one_step_trains(path, cache):
    cfg = load_config(path)
    task_name = cfg["task"]["name"]
    assert cfg["out"] == f"runs/{path.stem}"
    cfg = load_config(path, tiny_overrides(task_name, cache))
    spec = get_task(task_name)
    samples = spec.load(cfg, ("train", "val"), False)
    torch.manual_seed(0)
    model = models.build(cfg["model"]["name"], **cfg["model"]["options"])
    task = spec.build(cfg)
    loss = task.loss(model, samples["train"][0], torch.Generator().manual_seed(0))
    assert loss.dim() == 0 and math.isfinite(float(loss.detach()))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)          # the loss reaches the model
    out = task.evaluate(model, samples["val"])
    assert spec.metric in out and math.isfinite(out[spec.metric])
    if task_name == "shape-classification":                      # metrics = the metrics module on the predictions
        logits, labels = task.predict(model, samples["val"])
        assert out["oa"] == metrics.overall_accuracy(logits, labels)
        assert out["macc"] == metrics.mean_class_accuracy(logits, labels)


def test_paper_sizes_are_named_in_every_config():
    for p in CONFIGS:
        head = "".join(line for line in p.read_text().splitlines(True) if line.startswith("#"))
        assert "Paper sizes:" in head and "Run: pointformers train --config" in head, p.name
