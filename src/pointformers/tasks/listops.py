"""The ListOps task (Long Range Arena), registered at import as ``task.name: listops``.

Data (``data:`` section): generated ListOps expressions (:mod:`pointformers.data.listops`,
``preset`` ``tiny`` | ``small`` | ``lra`` with optional overrides ``sizes``, ``min_length``,
``max_length``), cached on disk; or LRA's TSV files with ``root`` (a folder holding
``basic_train.tsv``, ``basic_val.tsv``, ``basic_test.tsv``). Tokens are LRA's symbols without the
parentheses (:data:`~pointformers.data.listops.VOCAB`, padding id 0); ``max_len`` truncates
(LRA: 2,000), ``add_cls`` prepends ``<cls>``.

Each engine sample is a mini-batch of ``mini_batch`` sequences padded to ``(B, L)`` with a
``(B, L)`` mask. The sequences of a split are sorted by length before they are cut into
mini-batches, so a batch pads little (lengths range over an order of magnitude); the engine
shuffles the order of the batches every epoch. ``task.resample: true`` instead re-draws each
training batch's membership from the whole split every step (more padding, more mixing).

Model: ``model(tokens (B, L) int64, mask (B, L) bool) -> logits (B, 10)``. Loss: cross-entropy.
Metric: ``accuracy`` (the fraction of sequences whose value is predicted; LRA's metric), with the
mean cross-entropy ``loss``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..data.listops import VOCAB, ListOpsSet
from .minibatch import ItemPool, MiniBatch, check_mini_batch
from .sequences import SequenceClassificationTask, token_pool
from .registry import TaskSpec, register_task, config_section as _section, check_data_seed

__all__ = ["NUM_CLASSES", "listops_pool", "load_listops_sets", "ListOpsTask", "LISTOPS_TASK"]

#: ListOps labels are the values 0-9.
NUM_CLASSES = 10


def listops_pool(data: ListOpsSet) -> ItemPool:
    """An :class:`ItemPool` of token sequences (ragged ``tokens`` (L_i,), padding 0) and ``labels`` (S,)."""
    return token_pool(data.tokens, data.labels, VOCAB["<pad>"])


def _params(d: Mapping[str, Any]):
    from ..data.listops import PRESETS, ListOpsParams

    if d["preset"] not in PRESETS:
        raise ValueError(f"data.preset: unknown ListOps preset {d['preset']!r} (valid: {', '.join(sorted(PRESETS))})")
    over = {k: (tuple(d[k]) if isinstance(d[k], list) else d[k]) for k in ("sizes", "min_length", "max_length")
            if d.get(k) is not None}
    try:
        return ListOpsParams(**{**PRESETS[d["preset"]], **over}), bool(over)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data.{str(exc).splitlines()[0]}") from None


def load_listops_sets(cfg: Mapping[str, Any], splits: Sequence[str]) -> dict[str, ListOpsSet]:
    """Token sequences and labels of each split named by ``cfg["data"]``."""
    d = _section(cfg, "data", _DATA_DEFAULTS)
    out = {}
    if d["root"] is not None:
        from ..data.listops import load_listops_tsv

        for s in splits:
            path = Path(d["root"]).expanduser() / f"basic_{s}.tsv"
            if not path.is_file():
                raise ValueError(f"data.root: {path} not found (expected LRA's basic_{{train,val,test}}.tsv)")
            out[s] = load_listops_tsv(path, add_cls=d["add_cls"], max_len=d["max_len"])
    else:
        from ..data.listops import load_listops_dataset

        params, overridden = _params(d)
        preset = params if overridden else d["preset"]
        for s in splits:
            out[s] = load_listops_dataset(preset, s, cache_dir=d["cache_dir"], seed=d["seed"], add_cls=d["add_cls"],
                                          max_len=d["max_len"])
    for s in splits:
        if len(out[s]) == 0:
            raise ValueError(f"data: the {s} split has no sequences")
    return out


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[MiniBatch]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    sets = load_listops_sets(cfg, splits)
    out = {}
    for s in splits:
        pool = listops_pool(sets[s])
        # stable sort by length: batches of similar lengths pad little
        order = torch.from_numpy(np.argsort(pool.sizes.numpy(), kind="stable"))
        out[s] = pool.batches(d["mini_batch"], resample=(s == "train" and t["resample"]), order=order)
    return out


class ListOpsTask(SequenceClassificationTask):
    """Cross-entropy training and accuracy of a sequence classifier on ListOps (10 classes).

    Args:
        label_smoothing: of the cross-entropy (0 = plain, LRA's loss).
    """

    def __init__(self, label_smoothing: float = 0.0) -> None:
        super().__init__(NUM_CLASSES, label_smoothing, name="ListOps")


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "root": (str, None),
                "sizes": (list, None), "min_length": (int, None), "max_length": (int, None),
                "max_len": (int, None), "add_cls": (bool,), "mini_batch": (int,)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "root": None, "sizes": None, "min_length": None,
                  "max_length": None, "max_len": None, "add_cls": False, "mini_batch": 32}
_TASK_SCHEMA = {"label_smoothing": (float,), "resample": (bool,)}
_TASK_DEFAULTS = {"label_smoothing": 0.0, "resample": False}


def _validate(cfg: Mapping[str, Any]) -> None:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    check_data_seed(d)
    if d["root"] is not None:
        if not Path(d["root"]).expanduser().is_dir():
            raise ValueError(f"data.root: {d['root']!r} is not a folder (expected LRA's listops folder)")
    else:
        _params(d)
    if d["max_len"] is not None and d["max_len"] < 1:
        raise ValueError(f"data.max_len: must be >= 1 or null, got {d['max_len']}")
    check_mini_batch(d["mini_batch"])
    try:
        ListOpsTask(t["label_smoothing"])
    except ValueError as exc:
        raise ValueError(f"task.{exc}") from None
    opts = (cfg.get("model") or {}).get("options") or {}
    if "num_classes" in opts and opts["num_classes"] < NUM_CLASSES:
        raise ValueError(f"model.options.num_classes: ListOps has {NUM_CLASSES} classes, got {opts['num_classes']}")
    if "vocab_size" in opts and opts["vocab_size"] < len(VOCAB):
        raise ValueError(f"model.options.vocab_size: the ListOps vocabulary has {len(VOCAB)} symbols, got "
                         f"{opts['vocab_size']}")
    if d["root"] is None and opts.get("max_len") is not None:
        longest = _params(d)[0].max_length - 1 + int(d["add_cls"])
        if d["max_len"] is not None:
            longest = min(longest, d["max_len"])
        if opts["max_len"] < longest:
            raise ValueError(f"model.options.max_len: sequences reach {longest} tokens, got {opts['max_len']} "
                             "(raise it or set data.max_len)")


def _build(cfg: Mapping[str, Any]) -> ListOpsTask:
    return ListOpsTask(_section(cfg, "task", _TASK_DEFAULTS)["label_smoothing"])


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    sets = load_listops_sets(cfg, splits)
    return [f"{s}: {len(sets[s])} sequences" for s in splits]


#: ``task.name: listops`` (LRA ListOps; SAMSA/SFT Table "ListOps", FLT's sequence setting).
LISTOPS_TASK = register_task(TaskSpec(
    name="listops",
    description="ListOps (Long Range Arena): the value 0-9 of a nested MIN/MAX/MED/SM expression; accuracy",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS, task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=_build, metric="accuracy", mode="max", validate=_validate, generate=_generate,
    default_model="samsa-seq",
))
