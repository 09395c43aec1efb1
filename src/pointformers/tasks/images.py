"""Image classification with a ViT-style model, registered at import as ``task.name: image-classification``
(FLT §5.2: ViT on ImageNet, Places365, Fashion-MNIST).

Data (``data:`` section, :mod:`pointformers.data.images`): ``format`` ``digits`` (scikit-learn's
bundled 8 × 8 digits, real data that needs no download; seeded per-class split), ``idx`` (MNIST /
Fashion-MNIST's released IDX files in ``root``), ``npz`` (``root/{train,val,test}.npz``),
``cifar10-bin`` (the ``cifar-10-batches-bin`` folder; val = the last ``val_fraction``) or
``pathfinder`` (LRA Pathfinder, :mod:`pointformers.data.pathfinder`: one difficulty folder of LRA's
release in ``root``, or without ``root`` the generated stand-in; 2 classes). Images
are cut into ``patch`` × ``patch`` tokens (x: the patch's pixels, p·p·C values) in raster order with
``positions`` ``raster`` (the patch index, ℓ = 1: the FLT paper's r_j = j) or ``grid`` ((row,
column), ℓ = 2); ``mini_batch`` images make one engine sample.

Model: ``model(x (B, P, p·p·C), pos (B, P, ℓ), mask (B, P)) -> logits (B, C)`` (``flt-vit``,
``performer-vit``, ``full-vit``, ``mlp-vit``); ``model.options.in_dim`` must be p·p·C and
``coord_dim`` ℓ. Loss: cross-entropy (``task.label_smoothing``). Metrics: ``accuracy`` (top-1),
``macc`` (mean per-class accuracy) and the mean cross-entropy ``loss``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .metrics import accuracy, mean_class_accuracy
from .minibatch import ItemPool, MiniBatch, check_mini_batch, predict_items
from .registry import TaskSpec, check_data_seed, config_section as _section, register_task

__all__ = ["load_image_sets", "ImageClassificationTask", "IMAGE_TASK"]

FORMATS = ("digits", "idx", "npz", "cifar10-bin", "pathfinder")

#: Formats that need no files: data generated or shipped with a package (``pathfinder`` reads LRA's
#: release when ``root`` is given, else generates its stand-in).
NO_FILES = ("digits", "pathfinder")


def read_image_sets(fmt: str, root: str | None, splits: Sequence[str], seed: int, val_fraction: float,
                    sizes: Sequence[int] | None = None):
    """The :class:`~pointformers.data.images.ImageSet` of each split in data format ``fmt`` (:data:`FORMATS`);
    ``sizes``: the generated Pathfinder stand-in's images per split."""
    from ..data import images as im

    if fmt == "digits":
        sets = im.load_digits_sets(seed)
        sets = {s: sets[s] for s in splits}
    elif fmt == "pathfinder":
        from ..data import pathfinder as pf

        raw = (pf.load_generated_pathfinder(splits, seed, tuple(sizes or pf.STANDIN_SIZES)) if root is None
               else pf.load_pathfinder_release(root, splits, seed))
        sets = {s: im.ImageSet(x[..., None].astype(np.float32) / 255.0, y) for s, (x, y) in raw.items()}
    elif fmt not in FORMATS:
        raise ValueError(f"data.format: unknown image format {fmt!r} (valid: {', '.join(FORMATS)})")
    elif root is None:
        raise ValueError(f"data.root: format {fmt!r} reads files; give the folder that holds them")
    elif fmt == "idx":
        sets = im.load_idx_sets(root, splits, val_fraction)
    elif fmt == "cifar10-bin":
        sets = im.load_cifar10_sets(root, splits, val_fraction)
    else:
        sets = im.load_npz_sets(root, splits)
    for s, st in sets.items():
        if len(st) == 0:
            raise ValueError(f"data: the {s} split has no images")
    return sets


def check_image_source(d: Mapping[str, Any]) -> None:
    """The checks of a ``data:`` section's image source that need no file read: seed, ``format``,
    ``root`` (a folder for every format but digits) and ``val_fraction``."""
    check_data_seed(d)
    if d["format"] not in FORMATS:
        raise ValueError(f"data.format: expected one of {', '.join(FORMATS)}, got {d['format']!r}")
    if (d["format"] not in NO_FILES or d["root"] is not None) and (
            d["root"] is None or not Path(d["root"]).expanduser().is_dir()):
        raise ValueError(f"data.root: format {d['format']!r} needs a folder of its files, got {d['root']!r}")
    if not 0 < d["val_fraction"] < 1:
        raise ValueError(f"data.val_fraction: expected a fraction in (0, 1), got {d['val_fraction']}")


def load_image_sets(cfg: Mapping[str, Any], splits: Sequence[str]):
    """The :class:`~pointformers.data.images.ImageSet` of each split named by ``cfg["data"]``."""
    d = _section(cfg, "data", _DATA_DEFAULTS)
    sets = read_image_sets(d["format"], d["root"], splits, d["seed"], d["val_fraction"])
    opts = (cfg.get("model") or {}).get("options") or {}
    for s, st in sets.items():
        H, W, C = st.images.shape[1:]
        if H % d["patch"] or W % d["patch"]:
            raise ValueError(f"data.patch: {d['patch']} does not divide the {H} x {W} images")
        if "in_dim" in opts and opts["in_dim"] != d["patch"] ** 2 * C:
            raise ValueError(f"model.options.in_dim: patches of {d['patch']} x {d['patch']} x {C} have "
                             f"{d['patch'] ** 2 * C} values, got {opts['in_dim']}")
        if "num_classes" in opts and int(st.labels.max()) >= opts["num_classes"]:
            raise ValueError(f"model.options.num_classes: the {s} split has label {int(st.labels.max())}, got "
                             f"{opts['num_classes']} classes")
    return sets


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[MiniBatch]]:
    from ..data.images import patch_positions, patchify

    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    out = {}
    for s, st in load_image_sets(cfg, splits).items():
        tokens = torch.from_numpy(patchify(st.images, d["patch"]))
        pos = torch.from_numpy(patch_positions(st.images.shape[1], st.images.shape[2], d["patch"], d["positions"]))
        pool = ItemPool({"x": list(tokens), "pos": [pos] * len(tokens)}, {"labels": torch.from_numpy(st.labels)})
        out[s] = pool.batches(d["mini_batch"], resample=(s == "train" and t["resample"]))
    return out


def _check(sample: Any) -> MiniBatch:
    if not isinstance(sample, MiniBatch) or "x" not in sample.pool.ragged or "pos" not in sample.pool.ragged:
        raise ValueError(f"sample: expected an image MiniBatch (from this task's load), got {type(sample).__name__}")
    return sample


class ImageClassificationTask:
    """Cross-entropy training and top-1 / mean-class accuracy of a patch-token image classifier."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
                or not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing: expected a number in [0, 1), got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)

    @staticmethod
    def _logits(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        p = next(model.parameters(), None)
        dev = p.device if p is not None else torch.device("cpu")
        dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
        x, pos, mask = batch["x"].to(dev, dtype), batch["pos"].to(dev, dtype), batch["mask"].to(dev)
        logits = model(x, pos, mask)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != x.shape[0]:
            raise ValueError(f"model: expected class logits of shape ({x.shape[0]}, C), got "
                             f"{tuple(getattr(logits, 'shape', ()))}; use an image classifier (e.g. flt-vit)")
        return logits

    def loss(self, model: nn.Module, sample: MiniBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        batch = _check(sample).members(generator)
        logits = self._logits(model, batch)
        return F.cross_entropy(logits, batch["labels"].to(logits.device), label_smoothing=self.label_smoothing)

    def predict(self, model: nn.Module, samples: Sequence[MiniBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (S, C) float32 on CPU, labels (S,)) of every image, model in eval mode."""
        return predict_items(model, samples, lambda s: self._logits(model, _check(s).tensors()), "images")

    def evaluate(self, model: nn.Module, samples: Sequence[MiniBatch]) -> dict[str, float]:
        """``{"accuracy", "macc", "loss"}`` over every image of ``samples``."""
        logits, labels = self.predict(model, samples)
        return {"accuracy": accuracy(logits, labels), "macc": mean_class_accuracy(logits, labels),
                "loss": float(F.cross_entropy(logits, labels))}


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"format": (str,), "root": (str, None), "seed": (int,), "patch": (int,), "positions": (str,),
                "val_fraction": (float,), "mini_batch": (int,)}
_DATA_DEFAULTS = {"format": "digits", "root": None, "seed": 0, "patch": 2, "positions": "raster",
                  "val_fraction": 1 / 12, "mini_batch": 32}
_TASK_SCHEMA = {"label_smoothing": (float,), "resample": (bool,)}
_TASK_DEFAULTS = {"label_smoothing": 0.0, "resample": False}


def _validate(cfg: Mapping[str, Any]) -> None:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    check_image_source(d)
    if d["patch"] < 1:
        raise ValueError(f"data.patch: must be >= 1, got {d['patch']}")
    if d["positions"] not in ("raster", "grid"):
        raise ValueError(f"data.positions: expected 'raster' or 'grid', got {d['positions']!r}")
    check_mini_batch(d["mini_batch"])
    try:
        ImageClassificationTask(t["label_smoothing"])
    except ValueError as exc:
        raise ValueError(f"task.{exc}") from None
    opts = (cfg.get("model") or {}).get("options") or {}
    ell = 1 if d["positions"] == "raster" else 2
    if "coord_dim" in opts and opts["coord_dim"] != ell:
        raise ValueError(f"model.options.coord_dim: positions {d['positions']!r} have {ell} column(s), got "
                         f"{opts['coord_dim']}")
    if d["format"] == "digits":
        if 8 % d["patch"]:
            raise ValueError(f"data.patch: must divide the digits' 8 x 8 images, got {d['patch']}")
        if "in_dim" in opts and opts["in_dim"] != d["patch"] ** 2:
            raise ValueError(f"model.options.in_dim: {d['patch']} x {d['patch']} grey patches have {d['patch'] ** 2} "
                             f"values, got {opts['in_dim']}")
        if "num_classes" in opts and opts["num_classes"] < 10:
            raise ValueError(f"model.options.num_classes: the digits have 10 classes, got {opts['num_classes']}")


def _build(cfg: Mapping[str, Any]) -> ImageClassificationTask:
    return ImageClassificationTask(_section(cfg, "task", _TASK_DEFAULTS)["label_smoothing"])


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    sets = load_image_sets(cfg, splits)
    return [f"{s}: {len(sets[s])} images of {tuple(sets[s].images.shape[1:])}" for s in splits]


#: ``task.name: image-classification`` (FLT's ViT experiments; LRA Image's source images).
IMAGE_TASK = register_task(TaskSpec(
    name="image-classification",
    description="image classification from patch tokens (digits, MNIST/Fashion-MNIST IDX, npz arrays); accuracy",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS, task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=_build, metric="accuracy", mode="max", validate=_validate, generate=_generate,
    default_model="flt-vit",
))
