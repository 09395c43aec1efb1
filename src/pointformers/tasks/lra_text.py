"""LRA Text: byte-level document classification, registered at import as ``task.name: lra-text``
(SAMSA / SFT's LRA Table, "Text (IMDb)").

Data (``data:`` section, :mod:`pointformers.data.byte_text`): generated stand-in reviews (``preset``
``tiny`` | ``small`` | ``imdb``, optional ``sizes``), cached on disk; or, with ``root``, Stanford's
released ``aclImdb`` folder (``val_fraction`` of its training reviews held out for validation).
Documents are bytes (tokens byte + 1, padding 0, 257 symbols) cut to ``max_len`` (SAMSA/SFT: 1,024;
the LRA paper: 4,096); ``mini_batch`` documents, sorted by length, make one engine sample.

Model: ``model(tokens (B, L) int64, mask (B, L) bool) -> logits (B, 2)`` (any sequence classifier:
``samsa-seq``, ``flt-seq``, ``full-seq``, ``mlp-seq``; ``attention=...`` swaps the mechanism).
Loss: cross-entropy. Metric: ``accuracy`` (LRA's), with the mean cross-entropy ``loss``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from .minibatch import MiniBatch, check_mini_batch
from .registry import TaskSpec, check_data_seed, config_section as _section, register_task
from .sequences import SequenceClassificationTask, token_pool

__all__ = ["NUM_CLASSES", "load_text_sets", "LRA_TEXT_TASK"]

#: Negative / positive.
NUM_CLASSES = 2


def _params(d: Mapping[str, Any]):
    from ..data.byte_text import PRESETS, ReviewParams

    if d["preset"] not in PRESETS:
        raise ValueError(f"data.preset: unknown review preset {d['preset']!r} (valid: {', '.join(sorted(PRESETS))})")
    over = {"sizes": tuple(d["sizes"])} if d.get("sizes") is not None else {}
    try:
        return ReviewParams(**{**PRESETS[d["preset"]], **over}), bool(over)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data.{str(exc).splitlines()[0]}") from None


def load_text_sets(cfg: Mapping[str, Any], splits: Sequence[str]):
    """The :class:`~pointformers.data.byte_text.TextSet` of each split named by ``cfg["data"]``."""
    from ..data.byte_text import load_generated_reviews, load_imdb

    d = _section(cfg, "data", _DATA_DEFAULTS)
    if d["root"] is not None:
        return load_imdb(d["root"], splits, d["max_len"], d["val_fraction"], d["seed"])
    params, overridden = _params(d)
    preset = params if overridden else d["preset"]
    return {s: load_generated_reviews(preset, s, d["max_len"], d["cache_dir"], d["seed"]) for s in splits}


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[MiniBatch]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    out = {}
    for s, st in load_text_sets(cfg, splits).items():
        pool = token_pool(st.tokens, st.labels)
        order = torch.from_numpy(np.argsort(pool.sizes.numpy(), kind="stable"))  # batches of similar lengths
        out[s] = pool.batches(d["mini_batch"], resample=(s == "train" and t["resample"]), order=order)
    return out


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "root": (str, None),
                "sizes": (list, None), "max_len": (int,), "val_fraction": (float,), "mini_batch": (int,)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "root": None, "sizes": None, "max_len": 1024,
                  "val_fraction": 0.1, "mini_batch": 32}
_TASK_SCHEMA = {"label_smoothing": (float,), "resample": (bool,)}
_TASK_DEFAULTS = {"label_smoothing": 0.0, "resample": False}


def _validate(cfg: Mapping[str, Any]) -> None:
    from ..data.byte_text import VOCAB_SIZE

    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    check_data_seed(d)
    if d["root"] is not None:
        if not Path(d["root"]).expanduser().is_dir():
            raise ValueError(f"data.root: {d['root']!r} is not a folder (expected Stanford's aclImdb)")
    else:
        _params(d)
    if d["max_len"] < 1:
        raise ValueError(f"data.max_len: must be >= 1 (bytes per document), got {d['max_len']}")
    if not 0 < d["val_fraction"] < 1:
        raise ValueError(f"data.val_fraction: expected a fraction in (0, 1), got {d['val_fraction']}")
    check_mini_batch(d["mini_batch"])
    try:
        SequenceClassificationTask(NUM_CLASSES, t["label_smoothing"])
    except ValueError as exc:
        raise ValueError(f"task.{exc}") from None
    opts = (cfg.get("model") or {}).get("options") or {}
    if "num_classes" in opts and opts["num_classes"] < NUM_CLASSES:
        raise ValueError(f"model.options.num_classes: LRA Text has {NUM_CLASSES} classes, got {opts['num_classes']}")
    if "vocab_size" in opts and opts["vocab_size"] < VOCAB_SIZE:
        raise ValueError(f"model.options.vocab_size: bytes need {VOCAB_SIZE} symbols (256 + padding), got "
                         f"{opts['vocab_size']}")
    if opts.get("max_len") is not None and opts["max_len"] < d["max_len"]:
        raise ValueError(f"model.options.max_len: documents reach data.max_len={d['max_len']} bytes, got "
                         f"{opts['max_len']}")


def _build(cfg: Mapping[str, Any]) -> SequenceClassificationTask:
    return SequenceClassificationTask(NUM_CLASSES, _section(cfg, "task", _TASK_DEFAULTS)["label_smoothing"],
                                      name="LRA Text")


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    sets = load_text_sets(cfg, splits)
    return [f"{s}: {len(sets[s])} documents" for s in splits]


#: ``task.name: lra-text`` (LRA's byte-level IMDb classification).
LRA_TEXT_TASK = register_task(TaskSpec(
    name="lra-text",
    description="LRA Text: byte-level review classification (IMDb or a generated stand-in); accuracy",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS, task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=_build, metric="accuracy", mode="max", validate=_validate, generate=_generate,
    default_model="samsa-seq",
))
