"""LRA Retrieval: byte-level document matching, registered at import as ``task.name: lra-retrieval``
(SAMSA / SFT's LRA Table, "Retrieval (AAN)").

Data (``data:`` section, :mod:`pointformers.data.retrieval`): generated stand-in pairs (``preset``
``tiny`` | ``small`` | ``aan``, optional ``sizes``), cached on disk; or, with ``root``, LRA's released
``new_aan_pairs.{train,eval,test}.tsv``. Documents are bytes (tokens byte + 1, padding 0, 257
symbols), each cut to ``max_len``; ``mini_batch`` pairs (sorted by length) make one engine sample.

Model: ``model(first (B, L1), first_mask, second (B, L2), second_mask) -> logits (B, 2)``
(``dual-encoder`` around any sequence classifier). Loss: cross-entropy. Metric: ``accuracy`` (LRA's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.retrieval import PairSet
from .metrics import accuracy
from .minibatch import ItemPool, check_mini_batch, predict_items
from .registry import TaskSpec, check_data_seed, config_section as _section, register_task

__all__ = ["NUM_CLASSES", "PairBatch", "pair_batches", "load_pair_sets", "RetrievalTask"]

NUM_CLASSES = 2


@dataclass
class PairBatch:
    """One engine sample: pairs ``index`` of two aligned pools (first and second documents)."""

    first: ItemPool
    second: ItemPool
    index: torch.Tensor
    _cache: dict | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def tensors(self) -> dict[str, torch.Tensor]:
        """``first``/``second`` (B, L) tokens with ``first_mask``/``second_mask`` and ``labels`` (B,)."""
        if self._cache is None:
            a, b = self.first.collate(self.index), self.second.collate(self.index)
            self._cache = {"first": a["tokens"], "first_mask": a["mask"], "second": b["tokens"],
                           "second_mask": b["mask"], "labels": a["labels"]}
        return self._cache

    @property
    def num_items(self) -> int:
        return len(self)


def pair_batches(pairs: PairSet, size: int) -> list[PairBatch]:
    """The split in mini-batches of ``size`` pairs, sorted by the longer document (little padding)."""
    size = check_mini_batch(size)
    if len(pairs) == 0:
        raise ValueError("data: the split has no pairs")
    labels = torch.from_numpy(np.asarray(pairs.labels, np.int64))
    first = ItemPool({"tokens": [torch.from_numpy(t) for t in pairs.first]}, {"labels": labels})
    second = ItemPool({"tokens": [torch.from_numpy(t) for t in pairs.second]})
    order = torch.from_numpy(np.argsort(np.maximum(first.sizes.numpy(), second.sizes.numpy()), kind="stable"))
    return [PairBatch(first, second, order[i:i + size]) for i in range(0, len(pairs), size)]


def _params(d: Mapping[str, Any]):
    from ..data.retrieval import PRESETS, PairParams

    if d["preset"] not in PRESETS:
        raise ValueError(f"data.preset: unknown retrieval preset {d['preset']!r} (valid: {', '.join(sorted(PRESETS))})")
    over = {"sizes": tuple(d["sizes"])} if d.get("sizes") is not None else {}
    try:
        return PairParams(**{**PRESETS[d["preset"]], **over}), bool(over)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data.{str(exc).splitlines()[0]}") from None


def load_pair_sets(cfg: Mapping[str, Any], splits: Sequence[str]) -> dict[str, PairSet]:
    """The :class:`~pointformers.data.retrieval.PairSet` of each split named by ``cfg["data"]``."""
    from ..data.retrieval import load_aan, load_generated_pairs

    d = _section(cfg, "data", _DATA_DEFAULTS)
    if d["root"] is not None:
        return load_aan(d["root"], splits, d["max_len"])
    params, overridden = _params(d)
    preset = params if overridden else d["preset"]
    return {s: load_generated_pairs(preset, s, d["max_len"], d["cache_dir"], d["seed"]) for s in splits}


class RetrievalTask:
    """Cross-entropy training and accuracy of a pair classifier (2 classes)."""

    def _logits(self, model: nn.Module, b: Mapping[str, torch.Tensor]) -> torch.Tensor:
        p = next(model.parameters(), None)
        dev = p.device if p is not None else torch.device("cpu")
        out = model(*(b[k].to(dev) for k in ("first", "first_mask", "second", "second_mask")))
        if not isinstance(out, torch.Tensor) or out.shape != (b["labels"].shape[0], NUM_CLASSES):
            raise ValueError(f"model: expected logits of shape ({b['labels'].shape[0]}, {NUM_CLASSES}), got "
                             f"{tuple(getattr(out, 'shape', ()))}; use a pair model (dual-encoder)")
        return out

    def loss(self, model: nn.Module, sample: PairBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        if not isinstance(sample, PairBatch):
            raise ValueError(f"sample: expected a PairBatch (from this task's load), got {type(sample).__name__}")
        b = sample.tensors()
        logits = self._logits(model, b)
        return F.cross_entropy(logits, b["labels"].to(logits.device))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, samples: Sequence[PairBatch]) -> dict[str, float]:
        """``{"accuracy", "loss"}`` over every pair of ``samples`` (model in eval mode, restored after)."""
        logits, labels = predict_items(model, samples, lambda s: self._logits(model, s.tensors()), "pairs")
        return {"accuracy": accuracy(logits, labels), "loss": float(F.cross_entropy(logits, labels))}


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "root": (str, None),
                "sizes": (list, None), "max_len": (int,), "mini_batch": (int,)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "root": None, "sizes": None, "max_len": 1024,
                  "mini_batch": 32}


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[PairBatch]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    return {s: pair_batches(p, d["mini_batch"]) for s, p in load_pair_sets(cfg, splits).items()}


def _validate(cfg: Mapping[str, Any]) -> None:
    from ..data.byte_text import VOCAB_SIZE

    d = _section(cfg, "data", _DATA_DEFAULTS)
    check_data_seed(d)
    if d["root"] is not None:
        if not Path(d["root"]).expanduser().is_dir():
            raise ValueError(f"data.root: {d['root']!r} is not a folder (expected LRA's new_aan_pairs.*.tsv)")
    else:
        _params(d)
    if d["max_len"] < 1:
        raise ValueError(f"data.max_len: must be >= 1 (bytes per document), got {d['max_len']}")
    check_mini_batch(d["mini_batch"])
    opts = (cfg.get("model") or {}).get("options") or {}
    if opts.get("num_classes", NUM_CLASSES) != NUM_CLASSES:
        raise ValueError(f"model.options.num_classes: LRA Retrieval has {NUM_CLASSES} classes, got "
                         f"{opts['num_classes']}")
    enc = opts.get("encoder_options") or {}
    if "vocab_size" in enc and enc["vocab_size"] < VOCAB_SIZE:
        raise ValueError(f"model.options.encoder_options.vocab_size: bytes need {VOCAB_SIZE} symbols (256 + "
                         f"padding), got {enc['vocab_size']}")
    if enc.get("max_len") is not None and enc["max_len"] < d["max_len"]:
        raise ValueError(f"model.options.encoder_options.max_len: documents reach data.max_len={d['max_len']} "
                         f"bytes, got {enc['max_len']}")


def _build(cfg: Mapping[str, Any]) -> RetrievalTask:
    return RetrievalTask()


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    sets = load_pair_sets(cfg, splits)
    return [f"{s}: {len(sets[s])} pairs" for s in splits]


#: ``task.name: lra-retrieval`` (LRA's byte-level AAN document matching).
LRA_RETRIEVAL_TASK = register_task(TaskSpec(
    name="lra-retrieval",
    description="LRA Retrieval: byte-level document matching (AAN pairs or a generated stand-in); accuracy",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS, task_schema={}, task_defaults={},
    load=_load, build=_build, metric="accuracy", mode="max", validate=_validate, generate=_generate,
    default_model="dual-encoder",
))
