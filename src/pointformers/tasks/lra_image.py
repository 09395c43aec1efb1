"""LRA Image: images classified from their grey-level pixels read as one sequence, registered at import
as ``task.name: lra-image`` (SAMSA / SFT's LRA Table, "Image (CIFAR-10)"), and LRA Pathfinder, the same
pipeline on Pathfinder's curve images, as ``task.name: lra-pathfinder`` (``data.format: pathfinder``;
its own name so that its results, sections and runs are its own).

Data (``data:`` section, :mod:`pointformers.data.images`): ``format`` ``cifar10-bin`` (the released
``cifar-10-batches-bin`` folder in ``root``: LRA's source, 32 × 32 RGB), ``idx``, ``npz`` or ``digits``
(scikit-learn's bundled 8 × 8 handwritten digits, the offline stand-in); ``pathfinder`` is LRA's
Pathfinder (32 × 32 grey curves, 2 classes: one difficulty folder of its release in ``root``, or the
generated stand-in of :mod:`pointformers.data.pathfinder`, ``sizes`` images per split, default
:data:`~pointformers.data.pathfinder.STANDIN_SIZES`; use ``upscale: 1``). Every image becomes 8-bit
grey levels (RGB weighted as LRA's pipeline, ``tf.image.rgb_to_grayscale``), optionally enlarged
``upscale`` × by pixel repetition, and is read row by row: a sequence of H·W tokens, grey level + 1
(257 symbols, 0 reserved for padding, which this task never needs). ``mini_batch`` images make one
engine sample.

What the digits stand-in keeps and what it cannot: with ``upscale: 4`` the sequences have LRA Image's
length (1,024) and its structure (a 2-D image flattened row by row, so vertically adjacent pixels are
32 tokens apart and no token alone tells the class); it has 10 classes of clean, centred strokes and
17 grey levels instead of CIFAR-10's natural photographs (256 levels, cluttered backgrounds), and
1,797 images instead of 60,000: much easier, a test of whether a mechanism mixes the sequence at all.
The ``lra-image-*`` configs use ``upscale: 2`` (16 × 16 = 256 tokens, vertical neighbours 16 apart): at
1,024 tokens their CPU budget trained no model (docs/results.md, issue 23).

Model: ``model(tokens (B, L) int64, mask (B, L) bool) -> logits (B, C)`` (any sequence classifier:
``samsa-seq``, ``full-seq``, ``mlp-seq``, …). Loss: cross-entropy. Metric: ``accuracy``, with ``loss``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .images import check_image_source, read_image_sets
from .minibatch import MiniBatch, check_mini_batch
from .registry import TaskSpec, config_section as _section, register_task
from .sequences import SequenceClassificationTask, token_pool

__all__ = ["VOCAB_SIZE", "pixel_tokens", "load_pixel_sets", "LRA_IMAGE_TASK", "LRA_PATHFINDER_TASK"]

#: 256 grey levels + the padding symbol 0.
VOCAB_SIZE = 257


def pixel_tokens(images: np.ndarray, upscale: int = 1) -> np.ndarray:
    """Images (N, H, W, C) in [0, 1] -> tokens (N, uH·uW) int64: grey level + 1, row by row."""
    from ..data.images import grey_levels, upscale as enlarge

    grey = grey_levels(enlarge(images, upscale) if upscale != 1 else images)
    return grey.reshape(grey.shape[0], -1).astype(np.int64) + 1


def load_pixel_sets(cfg: Mapping[str, Any], splits: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(tokens (N, L) int64, labels (N,)) of each split named by ``cfg["data"]``."""
    d = _section(cfg, "data", _DATA_DEFAULTS)
    sets = read_image_sets(d["format"], d["root"], splits, d["seed"], d["val_fraction"], d["sizes"])
    out = {}
    for s, st in sets.items():
        if st.images.shape[3] not in (1, 3):
            raise ValueError(f"data: grey levels need 1 or 3 channels, the {s} split has {st.images.shape[3]}")
        out[s] = (pixel_tokens(st.images, d["upscale"]), st.labels)
    _check_model(cfg, out)
    return out


def _check_model(cfg: Mapping[str, Any], sets: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
    opts = (cfg.get("model") or {}).get("options") or {}
    for s, (tokens, labels) in sets.items():
        if opts.get("max_len") is not None and opts["max_len"] < tokens.shape[1]:
            raise ValueError(f"model.options.max_len: the {s} split's images are sequences of {tokens.shape[1]} "
                             f"pixels, got {opts['max_len']}")
        if "num_classes" in opts and int(labels.max()) >= opts["num_classes"]:
            raise ValueError(f"model.options.num_classes: the {s} split has label {int(labels.max())}, got "
                             f"{opts['num_classes']} classes")


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[MiniBatch]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    return {s: token_pool(list(tokens), labels).batches(d["mini_batch"], resample=(s == "train" and t["resample"]))
            for s, (tokens, labels) in load_pixel_sets(cfg, splits).items()}


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"format": (str,), "root": (str, None), "seed": (int,), "upscale": (int,), "val_fraction": (float,),
                "mini_batch": (int,), "sizes": (list, None)}
_DATA_DEFAULTS = {"format": "digits", "root": None, "seed": 0, "upscale": 4, "val_fraction": 0.1, "mini_batch": 32,
                  "sizes": None}
_TASK_SCHEMA = {"label_smoothing": (float,), "resample": (bool,)}
_TASK_DEFAULTS = {"label_smoothing": 0.0, "resample": False}


def _validate(cfg: Mapping[str, Any]) -> None:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    check_image_source(d)
    if d["sizes"] is not None and (d["format"] != "pathfinder" or d["root"] is not None):
        raise ValueError("data.sizes: only for the generated Pathfinder stand-in (format pathfinder, no root)")
    if d["sizes"] is not None and (len(d["sizes"]) != 3 or any(not isinstance(n, int) or n < 1 for n in d["sizes"])):
        raise ValueError(f"data.sizes: expected three image counts >= 1 (train, val, test), got {d['sizes']}")
    if not 1 <= d["upscale"] <= 16:
        raise ValueError(f"data.upscale: expected a pixel repetition factor in 1..16, got {d['upscale']}")
    check_mini_batch(d["mini_batch"])
    try:
        SequenceClassificationTask(2, t["label_smoothing"])
    except ValueError as exc:
        raise ValueError(f"task.{exc}") from None
    opts = (cfg.get("model") or {}).get("options") or {}
    if "vocab_size" in opts and opts["vocab_size"] < VOCAB_SIZE:
        raise ValueError(f"model.options.vocab_size: grey levels need {VOCAB_SIZE} symbols (256 + padding), got "
                         f"{opts['vocab_size']}")
    if d["format"] == "digits":  # the size is known without reading files
        side = 8 * d["upscale"]
        if opts.get("max_len") is not None and opts["max_len"] < side * side:
            raise ValueError(f"model.options.max_len: {side} x {side} images are sequences of {side * side} pixels, "
                             f"got {opts['max_len']}")


def _build(cfg: Mapping[str, Any]) -> SequenceClassificationTask:
    opts = (cfg.get("model") or {}).get("options") or {}
    return SequenceClassificationTask(int(opts.get("num_classes", 10)),
                                      _section(cfg, "task", _TASK_DEFAULTS)["label_smoothing"], name="LRA Image")


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    sets = load_pixel_sets(cfg, splits)
    return [f"{s}: {len(sets[s][1])} images of {sets[s][0].shape[1]} pixels" for s in splits]


#: ``task.name: lra-image`` (LRA's pixel-sequence image classification).
LRA_IMAGE_TASK = register_task(TaskSpec(
    name="lra-image",
    description="LRA Image: images classified from their grey-level pixel sequence (CIFAR-10 or the digits); accuracy",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS, task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=_build, metric="accuracy", mode="max", validate=_validate, generate=_generate,
    default_model="samsa-seq",
))


_PATHFINDER_DATA_DEFAULTS = {**_DATA_DEFAULTS, "format": "pathfinder", "upscale": 1}


def _validate_pathfinder(cfg: Mapping[str, Any]) -> None:
    d = _section(cfg, "data", _PATHFINDER_DATA_DEFAULTS)
    if d["format"] != "pathfinder":
        raise ValueError(f"data.format: task lra-pathfinder reads Pathfinder images (format 'pathfinder'), got "
                         f"{d['format']!r}; other images are task lra-image")
    _validate({**cfg, "data": d})


def _build_pathfinder(cfg: Mapping[str, Any]) -> SequenceClassificationTask:
    opts = (cfg.get("model") or {}).get("options") or {}
    return SequenceClassificationTask(int(opts.get("num_classes", 2)),
                                      _section(cfg, "task", _TASK_DEFAULTS)["label_smoothing"], name="LRA Pathfinder")


#: ``task.name: lra-pathfinder`` (LRA's Pathfinder: are the two dots joined by one curve?).
LRA_PATHFINDER_TASK = register_task(TaskSpec(
    name="lra-pathfinder",
    description="LRA Pathfinder: are two dots joined by one dashed curve, from the image's pixel sequence; accuracy",
    data_schema=_DATA_SCHEMA, data_defaults=_PATHFINDER_DATA_DEFAULTS, task_schema=_TASK_SCHEMA,
    task_defaults=_TASK_DEFAULTS, load=_load, build=_build_pathfinder, metric="accuracy", mode="max",
    validate=_validate_pathfinder, generate=_generate, default_model="samsa-seq",
))
