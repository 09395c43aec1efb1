"""The Long Range Graph Benchmark's tasks of the SFT and SAMSA papers, registered at import:

==================  ==============================  =====================  ===========================
``task.name``       what is predicted               loss                   metric (validation picks)
==================  ==============================  =====================  ===========================
``peptides-func``   10 functional labels per graph  BCE with logits        ``ap``: mean AP over labels
``peptides-struct`` 11 structural targets per graph L1                     ``mae`` (lower is better)
``pascalvoc-sp``    the class of every superpixel   cross-entropy          ``macro_f1`` over classes
==================  ==============================  =====================  ===========================

Data (``data:`` section): ``root`` -- a folder of LRGB's released split files (PyG's
``LRGBDataset`` raw files: ``{train,val,test}.pt`` for Peptides, ``.pickle`` for PascalVOC-sp;
:func:`pointformers.data.graphs.load_lrgb`); or, without ``root``, the generated stand-ins
(:mod:`pointformers.data.peptides`, :mod:`pointformers.data.superpixels`; ``preset``, ``seed``,
cached on disk). The metrics follow LRGB's evaluation: AP averaged over the labels with both
classes present (OGB's ``eval_ap``), MAE over all targets, macro F1 over the classes present.

Each engine sample is a mini-batch of ``mini_batch`` graphs (split sorted by node count, so a batch
pads little; the engine shuffles the order of the batches every epoch) in PyTorch Geometric's flat
layout; the model is called ``model(x (ΣN, F), edge_index (2, ΣE), edge_attr (ΣE, F_e), batch (ΣN,))``
and returns (B, T) per graph or (ΣN, C) per node (:mod:`pointformers.models.graph_models`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.graphs import GraphSet
from .metrics import macro_f1, mean_absolute_error, multilabel_average_precision
from .minibatch import check_mini_batch, predict_items
from .registry import TaskSpec, check_data_seed, config_section as _section, register_task

__all__ = ["GraphBatch", "graph_batches", "GraphTask", "load_graph_sets", "output_width"]

#: task name -> (generated kind, targets or classes, metric, mode)
_TASKS = {"peptides-func": ("func", 10, "ap", "max"), "peptides-struct": ("struct", 11, "mae", "min"),
          "pascalvoc-sp": ("superpixels", 21, "macro_f1", "max")}


@dataclass
class GraphBatch:
    """One engine sample: graphs ``index`` of ``graphs``, collated once into flat tensors."""

    graphs: GraphSet
    index: np.ndarray
    _cache: dict | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return int(len(self.index))

    def tensors(self) -> dict[str, torch.Tensor]:
        """``x`` (ΣN, F), ``edge_index`` (2, ΣE) (offset per graph), ``edge_attr`` (ΣE, F_e),
        ``batch`` (ΣN,), ``targets``: (B, T) float32 per graph or (ΣN,) int64 per node."""
        if self._cache is None:
            g, idx = self.graphs, [int(i) for i in self.index]
            sizes = [g.nodes[i].shape[0] for i in idx]
            offsets = np.cumsum([0] + sizes[:-1])
            cat = np.int64 if g.feature_kind == "categorical" else np.float32
            out = {"x": torch.from_numpy(np.concatenate([g.nodes[i] for i in idx]).astype(cat)),
                   "edge_index": torch.from_numpy(np.concatenate([g.edge_index[i].astype(np.int64) + o
                                                                  for i, o in zip(idx, offsets)], 1)),
                   "edge_attr": torch.from_numpy(np.concatenate([g.edges[i] for i in idx]).astype(cat)),
                   "batch": torch.repeat_interleave(torch.arange(len(idx)), torch.tensor(sizes))}
            if g.level == "graph":
                out["targets"] = torch.from_numpy(np.asarray(g.targets, np.float32)[idx])
            else:
                out["targets"] = torch.from_numpy(np.concatenate([np.asarray(g.targets[i], np.int64) for i in idx]))
            self._cache = out
        return self._cache

    @property
    def num_items(self) -> int:
        return len(self)


def graph_batches(graphs: GraphSet, size: int) -> list[GraphBatch]:
    """The split cut into mini-batches of ``size`` graphs of similar node counts (stable sort)."""
    size = check_mini_batch(size)
    order = np.argsort(graphs.sizes(), kind="stable")
    return [GraphBatch(graphs, order[a:a + size]) for a in range(0, len(graphs), size)]


def load_graph_sets(cfg: Mapping[str, Any], splits: Sequence[str]) -> dict[str, GraphSet]:
    """The :class:`GraphSet` of each split named by the config's ``task.name`` and ``data`` section."""
    name = cfg["task"]["name"]
    kind = _TASKS[name][0]
    d = _section(cfg, "data", _DATA_DEFAULTS)
    out = {}
    for s in splits:
        if d["root"] is not None:
            from ..data.graphs import load_lrgb

            out[s] = load_lrgb(Path(d["root"]).expanduser(), name, s)
        elif kind == "superpixels":
            from ..data.superpixels import load_generated_superpixels

            out[s] = load_generated_superpixels(s, preset=d["preset"], seed=d["seed"], cache_dir=d["cache_dir"])
        else:
            from ..data.peptides import load_generated_peptides

            out[s] = load_generated_peptides(kind, s, preset=d["preset"], seed=d["seed"], cache_dir=d["cache_dir"])
        if len(out[s]) == 0:
            raise ValueError(f"data: the {s} split of {name} has no graphs")
    return out


def output_width(cfg: Mapping[str, Any]) -> int:
    """Targets (Peptides) or node classes (PascalVOC-sp: 21 in LRGB's files, the stand-in preset's
    object classes + background otherwise) of the config's task."""
    name = cfg["task"]["name"]
    d = _section(cfg, "data", _DATA_DEFAULTS)
    if name != "pascalvoc-sp" or d["root"] is not None:
        return _TASKS[name][1]
    from ..data.superpixels import preset_params

    try:
        return preset_params(d["preset"]).num_classes + 1
    except ValueError as exc:
        raise ValueError(f"data.{exc}") from None


class GraphTask:
    """Loss and metrics of one LRGB task (module docstring).

    Args:
        name: ``"peptides-func"``, ``"peptides-struct"`` or ``"pascalvoc-sp"``.
        width: the targets per graph or classes per node (default: LRGB's, 10 / 11 / 21).
    """

    def __init__(self, name: str, width: int | None = None) -> None:
        if name not in _TASKS:
            raise ValueError(f"task.name: expected one of {sorted(_TASKS)}, got {name!r}")
        self.name = name
        _, self.width, self.metric, self.mode = _TASKS[name]
        self.width = int(width or self.width)
        self.node_level = name == "pascalvoc-sp"

    def _outputs(self, model: nn.Module, b: Mapping[str, torch.Tensor]) -> torch.Tensor:
        p = next(model.parameters(), None)
        dev = p.device if p is not None else torch.device("cpu")
        out = model(b["x"].to(dev), b["edge_index"].to(dev), b["edge_attr"].to(dev), b["batch"].to(dev))
        rows = b["x"].shape[0] if self.node_level else b["targets"].shape[0]
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != rows or out.shape[1] < self.width \
                or (not self.node_level and out.shape[1] != self.width):
            want = f"({rows}, >= {self.width}) per node" if self.node_level else f"({rows}, {self.width}) per graph"
            raise ValueError(f"model: {self.name} expects outputs {want}, got {tuple(getattr(out, 'shape', ()))}; "
                             f"set model.options.out_dim (and level: {'node' if self.node_level else 'graph'})")
        return out

    def _loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.to(out.device)
        if self.name == "peptides-func":
            return F.binary_cross_entropy_with_logits(out, target)
        if self.name == "peptides-struct":
            return F.l1_loss(out, target)
        return F.cross_entropy(out, target)

    def loss(self, model: nn.Module, sample: GraphBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        if not isinstance(sample, GraphBatch):
            raise ValueError(f"sample: expected a GraphBatch (from this task's load), got {type(sample).__name__}")
        b = sample.tensors()
        return self._loss(self._outputs(model, b), b["targets"])

    @torch.no_grad()
    def predict(self, model: nn.Module, samples: Sequence[GraphBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs, targets) of every graph (or node) of ``samples``, float32 on the CPU, eval mode."""
        return predict_items(model, samples, lambda s: self._outputs(model, s.tensors()), "graphs", "targets")

    def evaluate(self, model: nn.Module, samples: Sequence[GraphBatch]) -> dict[str, float]:
        """``{metric, "loss"}`` over every graph (node) of ``samples``."""
        out, target = self.predict(model, samples)
        if self.name == "peptides-func":
            value = multilabel_average_precision(torch.sigmoid(out), target)
        elif self.name == "peptides-struct":
            value = mean_absolute_error(out, target)
        else:
            value = macro_f1(out[:, :self.width], target)
        return {self.metric: value, "loss": float(self._loss(out, target))}


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "root": (str, None),
                "mini_batch": (int,)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "root": None, "mini_batch": 32}


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[GraphBatch]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    sets = load_graph_sets(cfg, splits)
    return {s: graph_batches(sets[s], d["mini_batch"]) for s in splits}


def _validate(cfg: Mapping[str, Any]) -> None:
    name = cfg["task"]["name"]
    d = _section(cfg, "data", _DATA_DEFAULTS)
    check_data_seed(d)
    check_mini_batch(d["mini_batch"])
    if d["root"] is not None:
        if not Path(d["root"]).expanduser().is_dir():
            raise ValueError(f"data.root: {d['root']!r} is not a folder (expected LRGB's {name} split files)")
    else:
        if _TASKS[name][0] == "superpixels":
            from ..data.superpixels import PRESETS
        else:
            from ..data.peptides import PRESETS
        if d["preset"] not in PRESETS:
            raise ValueError(f"data.preset: unknown {name} preset {d['preset']!r} "
                             f"(valid: {', '.join(sorted(PRESETS))})")
    opts = (cfg.get("model") or {}).get("options") or {}
    width = output_width(cfg)
    level = "node" if name == "pascalvoc-sp" else "graph"
    if "level" in opts and opts["level"] != level:
        raise ValueError(f"model.options.level: {name} predicts per {level}, got {opts['level']!r}")
    out_dim = opts.get("out_dim")
    if out_dim is not None and (out_dim < width if level == "node" else out_dim != width):
        raise ValueError(f"model.options.out_dim: {name} has {width} {'classes' if level == 'node' else 'targets'}, "
                         f"got {out_dim}")
    if "categorical" in opts and opts["categorical"] != (name != "pascalvoc-sp"):
        raise ValueError(f"model.options.categorical: {name}'s features are "
                         f"{'integer codes' if name != 'pascalvoc-sp' else 'real values'}: set it to "
                         f"{name != 'pascalvoc-sp'}")


def _build(cfg: Mapping[str, Any]) -> GraphTask:
    return GraphTask(cfg["task"]["name"], output_width(cfg))


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    sets = load_graph_sets(cfg, splits)
    return [f"{s}: {len(g)} graphs, {int(g.sizes().sum())} nodes" for s, g in sets.items()]


_DESCRIPTIONS = {
    "peptides-func": "LRGB Peptides-func: 10 functional labels per peptide graph (multi-label); mean AP",
    "peptides-struct": "LRGB Peptides-struct: 11 structural targets per peptide graph (regression); MAE",
    "pascalvoc-sp": "LRGB PascalVOC-sp: the class of every superpixel node; macro F1",
}
GRAPH_TASKS = {name: register_task(TaskSpec(
    name=name, description=_DESCRIPTIONS[name], data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS,
    task_schema={}, task_defaults={}, load=_load, build=_build, metric=metric, mode=mode, validate=_validate,
    generate=_generate, default_model="sft-graph")) for name, (_, _, metric, mode) in _TASKS.items()}
