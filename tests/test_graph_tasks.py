"""LRGB tasks (issue 23): peptides-func, peptides-struct and pascalvoc-sp train through their configs
on the tiny stand-ins, the metrics are LRGB's, and config errors name the key."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pointformers.engine.config import load_config
from pointformers.tasks.graphs import GraphBatch, GraphTask, graph_batches
from pointformers.tasks.registry import get_task

from config_training import train_config_steps

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("peptides-func", "peptides-struct", "pascalvoc-sp")
KINDS = ("sft", "sft-rwpe", "samsa", "full", "mlp")


def _configs(task):
    return sorted((ROOT / "configs").glob(f"{task}-*.yaml"))


@pytest.mark.parametrize("task", TASKS)
def test_every_graph_config_trains_and_its_loss_falls(task, tmp_path):
    paths = _configs(task)
    assert {p.stem for p in paths} == {f"{task}-{k}" for k in KINDS}
    spec = get_task(task)
    for path in paths:
        losses, t, model, samples = train_config_steps(
            path, [f"data.cache_dir={tmp_path}", "data.preset=tiny", "data.mini_batch=8"])
        assert losses[-1] < 0.85 * losses[0], (path.name, losses)
        out = t.evaluate(model, samples["val"])
        assert set(out) == {spec.metric, "loss"} and np.isfinite(out[spec.metric]), (path.name, out)


def test_collated_batch_is_pyg_flat_and_offsets_the_edges(tmp_path):
    cfg = load_config(_configs("peptides-func")[0], [f"data.cache_dir={tmp_path}", "data.preset=tiny"])
    graphs = get_task("peptides-func")  # registered
    from pointformers.tasks.graphs import load_graph_sets

    sets = load_graph_sets(cfg, ["val"])
    g = sets["val"]
    b = graph_batches(g, 5)[1]
    t = b.tensors()
    idx = [int(i) for i in b.index]
    n = [g.nodes[i].shape[0] for i in idx]
    assert t["x"].shape == (sum(n), 9) and t["x"].dtype == torch.int64
    assert torch.equal(torch.bincount(t["batch"]), torch.tensor(n))
    assert t["targets"].shape == (5, 10)
    # every edge stays inside its graph, and the second graph's edges point at its own nodes
    assert torch.equal(t["batch"][t["edge_index"][0]], t["batch"][t["edge_index"][1]])
    e0 = g.edge_index[idx[0]].shape[1]
    assert int(t["edge_index"][:, e0:e0 + g.edge_index[idx[1]].shape[1]].min()) >= n[0]
    assert graphs.metric == "ap"


def test_metrics_are_lrgbs():
    """AP over labels with both classes, MAE, macro F1 over the classes: against hand computations."""
    class Fixed(torch.nn.Module):
        def __init__(self, out):
            super().__init__()
            self.out, self.w = out, torch.nn.Parameter(torch.zeros(()))

        def forward(self, x, edge_index, edge_attr, batch):
            return self.out + 0 * self.w

    from pointformers.data.graphs import GraphSet

    nodes = [np.zeros((3, 9), np.int64), np.zeros((2, 9), np.int64)]
    ei = [np.array([[0, 1], [1, 0]]), np.array([[0, 1], [1, 0]])]
    ea = [np.zeros((2, 3), np.int64)] * 2
    y = np.array([[1, 0], [0, 0]], np.float32)                      # label 1 has no positive: skipped
    g = GraphSet(nodes, ei, ea, y, name="peptides-func")
    task = GraphTask("peptides-func", width=2)
    out = task.evaluate(Fixed(torch.tensor([[2.0, 0.0], [-1.0, 5.0]])), [GraphBatch(g, np.arange(2))])
    assert out["ap"] == pytest.approx(1.0)
    task = GraphTask("peptides-struct", width=2)
    out = task.evaluate(Fixed(torch.tensor([[1.5, 0.0], [0.0, -1.0]])), [GraphBatch(g, np.arange(2))])
    assert out["mae"] == pytest.approx((0.5 + 0 + 0 + 1) / 4)
    gv = GraphSet([np.zeros((3, 14), np.float32), np.zeros((2, 14), np.float32)], ei,
                  [np.zeros((2, 2), np.float32)] * 2, [np.array([0, 1, 1]), np.array([2, 0])], level="node",
                  name="pascalvoc-sp", feature_kind="continuous")
    pred = torch.nn.functional.one_hot(torch.tensor([0, 1, 0, 2, 2]), 3).float()  # node classes 0 1 0 | 2 2
    out = GraphTask("pascalvoc-sp", width=3).evaluate(Fixed(pred), [GraphBatch(gv, np.arange(2))])
    # class 0: tp 1 fp 1 fn 1 -> 0.5; class 1: tp 1 fn 1 -> 2/3; class 2: tp 1 fp 1 -> 2/3
    assert out["macro_f1"] == pytest.approx((0.5 + 2 / 3 + 2 / 3) / 3)


def test_graph_config_errors_name_the_key():
    for task, key, value, match in (("peptides-func", "out_dim", 11, "model.options.out_dim"),
                                    ("peptides-struct", "level", "node", "model.options.level"),
                                    ("pascalvoc-sp", "out_dim", 5, "model.options.out_dim"),
                                    ("pascalvoc-sp", "categorical", True, "model.options.categorical")):
        cfg = load_config(_configs(task)[0])
        bad = {**cfg, "model": {**cfg["model"], "options": {**cfg["model"]["options"], key: value}}}
        with pytest.raises(ValueError, match=match):
            get_task(task).validate(bad)
    cfg = load_config(_configs("peptides-func")[0])
    for key, value, match in (("preset", "huge", "data.preset"), ("mini_batch", 0, "data.mini_batch"),
                              ("root", "/no/such/folder", "data.root")):
        with pytest.raises(ValueError, match=match):
            get_task("peptides-func").validate({**cfg, "data": {**cfg["data"], key: value}})
