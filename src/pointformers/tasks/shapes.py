"""Shape classification (ModelNet40-style) and part segmentation (ShapeNetPart-style) tasks.

Registered at import as ``task.name: shape-classification`` and ``task.name: part-segmentation``.

Data (``data:`` section). By default the procedural shapes of :mod:`pointformers.data.shapes`
(``preset`` plus optional overrides of its :class:`~pointformers.data.shapes.ShapeParams`:
``classes``, ``per_class``, ``num_points``, ``deform``, ``noise_std``), generated and cached. With
``root`` and ``format`` the real sets are read:

* ``modelnet40-txt`` -- ``modelnet40_normal_resampled`` (``num_points`` FPS points, 1,024 by
  default, as SFT/SAMSA); ``modelnet40-h5`` -- PointNet's HDF5 files (first ``num_points``);
  ModelNet has no validation list, so ``val_fraction`` of the training shapes (seeded) are held out;
* ``shapenetpart`` -- the ``..._v0_normal`` layout with its own train/val/test lists
  (``num_points`` random points, 2,500 by default as SFT/PointNet++).

Each engine sample is a mini-batch of ``mini_batch`` shapes padded to ``(B, N, ·)`` with a mask
(:mod:`.minibatch`); in training its membership is re-drawn every step from the engine's
generator (``task.resample``), and the augmentation is drawn from the same generator.

Model inputs: ``model(x, pos, mask)`` with ``pos`` (B, N, 3) the coordinates and ``x`` (B, N, 3) the
unit normals (``data.normals: true``) or None (``false``; the model then needs ``in_dim: 0``).
Segmenters also get ``category=`` (B,) the object class.

Task options (``task:``):

* ``augment`` -- a training augmentation name of
  :func:`pointformers.data.augment.paper_augmentation` (``sft``: scale U[0.6, 1.4]; ``sampled``:
  Point-BERT's per-axis scale U[2/3, 3/2] + shift U[-0.2, 0.2]; ``samsa``: none; ``pointnet2``:
  scale, shift and jitter; ``so3``/``up``: random rotations), a list of them applied in order,
  ``none``, or ``auto`` (default): what the model's paper does -- ``sft-*`` and its twins
  ``full-*`` → ``sft``, ``sampled-*`` → ``sampled``, ``samsa-*`` → none, the MLP (PointNet-like)
  baselines → ``pointnet2``. A twin built with ``attention: full`` keeps its family's augmentation.
* ``rotate_test`` -- ``none`` | ``so3`` | ``up``: rotate every *test* shape (points and normals) by
  a random rotation (uniform on SO(3), or about the up axis), seeded by ``data.seed``. Models are
  selected on unrotated validation shapes, so ``rotate_test: so3`` with a model trained on aligned
  shapes is SFT Table 1's "z/SO(3)" protocol.
* ``up_axis`` -- the up axis for ``up`` rotations (``y`` for ModelNet40, ShapeNetPart and the
  procedural shapes).
* ``label_smoothing`` -- of the cross-entropy (0: plain cross-entropy, as the papers state none).

Metrics (:mod:`.metrics`): classification -- ``oa`` (overall accuracy, the validation metric),
``macc`` (mean per-class accuracy) and the mean cross-entropy ``loss``; part segmentation --
``instance_miou`` (the validation metric) and ``class_miou`` with predictions restricted to the
parts of each shape's category (PointNet's protocol), point accuracy ``point_acc`` and ``loss``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.augment import Compose, paper_augmentation, rotate_so3, rotate_up
from ..data.clouds import ShapeCloudSet
from .metrics import (
    mean_class_accuracy,
    overall_accuracy,
    part_segmentation_mious,
    restricted_part_predictions,
)
from .minibatch import ItemPool, MiniBatch, check_mini_batch, predict_items
from .registry import TaskSpec, register_task, config_section as _section, check_data_seed

__all__ = [
    "FORMATS", "AUGMENTATIONS", "ROTATIONS", "shape_pool", "rotate_clouds", "auto_augmentation", "build_augmentation",
    "ShapeClassificationTask", "PartSegmentationTask", "load_shape_sets", "SHAPE_CLASSIFICATION_TASK",
    "PART_SEGMENTATION_TASK",
]

#: ``data.format`` values: generated shapes or a real data set's published layout.
FORMATS = ("procedural", "modelnet40-txt", "modelnet40-h5", "shapenetpart")
#: Augmentation names accepted by ``task.augment`` (besides ``auto`` and ``none``).
AUGMENTATIONS = ("sft", "sampled", "samsa", "pointnet2", "so3", "up")
#: ``task.rotate_test`` values.
ROTATIONS = ("none", "so3", "up")


# ----------------------------------------------------------------------------------------- data
def shape_pool(clouds: ShapeCloudSet, normals: bool = True, parts: bool = False) -> ItemPool:
    """An :class:`ItemPool` of ``clouds``: ragged ``points`` (n_i, 3), ``normals`` (n_i, 3) when
    ``normals``, ``parts`` (n_i,) when ``parts`` (padding -1); fixed ``labels`` (S,).

    Raises:
        ValueError: an empty set, or normals/part labels asked for but missing from a shape.
    """
    if len(clouds) == 0:
        raise ValueError("clouds: the split has no shapes")
    ragged: dict[str, list[torch.Tensor]] = {"points": [torch.from_numpy(np.ascontiguousarray(c.points))
                                                        for c in clouds]}
    if normals:
        missing = [c.name or str(i) for i, c in enumerate(clouds) if c.normals is None]
        if missing:
            raise ValueError(f"clouds: shape {missing[0]!r} has no normals (set data.normals: false and "
                             "model.options.in_dim: 0 to train on coordinates only)")
        ragged["normals"] = [torch.from_numpy(np.ascontiguousarray(c.normals)) for c in clouds]
    if parts:
        missing = [c.name or str(i) for i, c in enumerate(clouds) if c.parts is None]
        if missing or not clouds.class_parts:
            raise ValueError(f"clouds: part segmentation needs per-point part labels, shape "
                             f"{(missing or ['(label space)'])[0]!r} has none")
        ragged["parts"] = [torch.from_numpy(np.ascontiguousarray(c.parts)) for c in clouds]
    meta = {"class_names": clouds.class_names, "part_names": clouds.part_names, "class_parts": clouds.class_parts}
    return ItemPool(ragged, {"labels": torch.from_numpy(clouds.labels())}, {"parts": -1}, meta)


def rotate_clouds(clouds: ShapeCloudSet, rotation: str, seed: int, up_axis: str = "y") -> ShapeCloudSet:
    """A copy of ``clouds`` with every shape (points and normals) rotated at random.

    ``rotation``: ``"so3"`` (uniform on SO(3)) or ``"up"`` (about ``up_axis``) or ``"none"`` (no
    change). Shape ``i`` is rotated by the ``i``-th draw of a generator seeded with ``seed``.
    """
    if rotation not in ROTATIONS:
        raise ValueError(f"rotation: expected one of {list(ROTATIONS)}, got {rotation!r}")
    if rotation == "none":
        return clouds
    g = torch.Generator().manual_seed(int(seed))
    out = []
    from ..data.clouds import ShapeCloud

    for c in clouds:
        p = torch.from_numpy(np.asarray(c.points, np.float64))
        n = None if c.normals is None else torch.from_numpy(np.asarray(c.normals, np.float64))
        p, n = rotate_so3(p, n, g) if rotation == "so3" else rotate_up(p, n, g, up_axis)
        out.append(ShapeCloud(p.numpy().astype(np.float32), None if n is None else n.numpy().astype(np.float32),
                              c.label, c.parts, c.name))
    return ShapeCloudSet(out, clouds.class_names, clouds.part_names, clouds.class_parts,
                         {**clouds.meta, "rotated": rotation})



def _procedural_params(d: Mapping[str, Any]):
    """(ShapeParams of the preset with the config's overrides, whether anything was overridden)."""
    from ..data.shapes import PRESETS, ShapeParams

    if d["preset"] not in PRESETS:
        raise ValueError(f"data.preset: unknown shape preset {d['preset']!r} (valid: {', '.join(sorted(PRESETS))})")
    over = {k: (tuple(d[k]) if isinstance(d[k], list) else d[k]) for k in _PARAM_KEYS if d.get(k) is not None}
    try:
        return ShapeParams(**{**PRESETS[d["preset"]], **over}), bool(over)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data.{str(exc).splitlines()[0]}") from None


_PARAM_KEYS = ("classes", "per_class", "num_points", "deform", "noise_std")


def _holdout(cs: ShapeCloudSet, fraction: float, seed: int) -> tuple[ShapeCloudSet, ShapeCloudSet]:
    """(train, val): ``fraction`` of each class's shapes (at least one where a class has two or more),
    chosen with a seeded permutation, go to val."""
    rng = np.random.default_rng([int(seed), 7])
    labels = cs.labels()
    val = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = int(round(fraction * len(idx)))
        if len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        else:
            k = 0
        val.extend(rng.permutation(idx)[:k].tolist())
    val_set = set(val)
    train = [i for i in range(len(cs)) if i not in val_set]
    return cs.subset(train), cs.subset(sorted(val))


def load_shape_sets(cfg: Mapping[str, Any], splits: Sequence[str], parts: bool = False) -> dict[str, ShapeCloudSet]:
    """The :class:`ShapeCloudSet` of each split named by ``cfg["data"]`` (see the module doc),
    with ``task.rotate_test`` applied to the test split."""
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _CLS_TASK_DEFAULTS)
    fmt = d["format"]
    out: dict[str, ShapeCloudSet] = {}
    if fmt == "procedural":
        from ..data.shapes import load_shapes_dataset

        params, overridden = _procedural_params(d)
        preset = params if overridden else d["preset"]
        for s in splits:
            out[s] = load_shapes_dataset(preset, s, cache_dir=d["cache_dir"], seed=d["seed"])
    else:
        root = Path(d["root"]).expanduser()
        if fmt == "shapenetpart":
            from ..data.shapenetpart import load_shapenetpart

            n = d["num_points"] if d["num_points"] is not None else 2500
            for s in splits:
                out[s] = load_shapenetpart(root, s, num_points=n, sampling=d["sampling"] or "random",
                                           cache_dir=d["cache_dir"], seed=d["seed"])
        else:
            from ..data.modelnet import load_modelnet_h5, load_modelnet_normal_resampled

            n = d["num_points"] if d["num_points"] is not None else 1024
            if fmt == "modelnet40-txt":
                read = lambda s: load_modelnet_normal_resampled(  # noqa: E731
                    root, s, num_points=n, sampling=d["sampling"] or "fps", use_normals=d["normals"],
                    cache_dir=d["cache_dir"], seed=d["seed"])
            else:
                read = lambda s: load_modelnet_h5(  # noqa: E731
                    root, s, num_points=n, sampling=d["sampling"] or "first", use_normals=d["normals"],
                    cache_dir=d["cache_dir"], seed=d["seed"])
            if "train" in splits or "val" in splits:
                tr, va = _holdout(read("train"), d["val_fraction"], d["seed"])
                out.update({k: v for k, v in (("train", tr), ("val", va)) if k in splits})
            if "test" in splits:
                out["test"] = read("test")
    if "test" in out and t.get("rotate_test", "none") != "none":
        # a stream of its own, so the rotations never depend on the other splits
        out["test"] = rotate_clouds(out["test"], t["rotate_test"], seed=int(d["seed"]) * 1000 + 17,
                                    up_axis=t.get("up_axis", "y"))
    for s in splits:
        if len(out[s]) == 0:
            raise ValueError(f"data: the {s} split has no shapes ({fmt} data)")
    return out


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False, parts: bool = False
          ) -> dict[str, list[MiniBatch]]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _CLS_TASK_DEFAULTS)
    sets = load_shape_sets(cfg, splits, parts)
    out = {}
    for s in splits:
        pool = shape_pool(sets[s], normals=d["normals"], parts=parts)
        out[s] = pool.batches(d["mini_batch"], resample=(s == "train" and t["resample"]))
    return out


# ----------------------------------------------------------------------------------- augmentation
def auto_augmentation(model_name: str | None) -> list[str]:
    """The training augmentation of a model's paper (see the module doc), as a list of names."""
    name = model_name or ""
    if name.startswith(("sft-", "full-")):
        return ["sft"]
    if name.startswith("sampled-"):
        return ["sampled"]
    if name.startswith("mlp-"):
        return ["pointnet2"]
    return []  # SAMSA ("no augmentation") and anything unknown


def build_augmentation(augment: str | Sequence[str], model_name: str | None, up_axis: str = "y") -> Compose:
    """The :class:`~pointformers.data.augment.Compose` of ``task.augment``."""
    names: list[str]
    if isinstance(augment, str):
        names = auto_augmentation(model_name) if augment == "auto" else [] if augment == "none" else [augment]
    elif isinstance(augment, (list, tuple)):
        names = list(augment)
    else:
        raise ValueError(f"augment: expected a name or a list of names, got {augment!r}")
    bad = [a for a in names if a not in AUGMENTATIONS]
    if bad:
        raise ValueError(f"augment: unknown augmentation {bad[0]!r} (valid: auto, none, {', '.join(AUGMENTATIONS)})")
    steps = []
    for a in names:
        steps.extend(paper_augmentation(a, up_axis).transforms)
    return Compose(steps)


# ------------------------------------------------------------------------------------------- tasks
def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _check_sample(sample: Any, need_parts: bool) -> MiniBatch:
    if not isinstance(sample, MiniBatch) or "points" not in sample.pool.ragged:
        raise ValueError(f"sample: expected a shape MiniBatch (from this task's load), got {type(sample).__name__}")
    if need_parts and "parts" not in sample.pool.ragged:
        raise ValueError("sample: part segmentation needs shapes with part labels (load with the part-segmentation task)")
    return sample


class _ShapeTask:
    def __init__(self, augment: str | Sequence[str] = "auto", model_name: str | None = None, up_axis: str = "y",
                 label_smoothing: float = 0.0) -> None:
        if up_axis not in ("x", "y", "z"):
            raise ValueError(f"up_axis: expected 'x', 'y' or 'z', got {up_axis!r}")
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
                or not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing: expected a number in [0, 1), got {label_smoothing!r}")
        self.augmentation = build_augmentation(augment, model_name, up_axis)
        self.augment_names = [getattr(t, "__name__", "transform") for t in self.augmentation.transforms]
        self.up_axis, self.label_smoothing = up_axis, float(label_smoothing)

    def _inputs(self, batch: Mapping[str, torch.Tensor], device: torch.device, generator: torch.Generator | None,
                train: bool) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        pos, nrm, mask = batch["points"], batch.get("normals"), batch["mask"]
        if train and self.augmentation.transforms:
            pos, nrm = self.augmentation(pos, nrm, generator)
        return (None if nrm is None else nrm.to(device)), pos.to(device), mask.to(device)


class ShapeClassificationTask(_ShapeTask):
    """Cross-entropy training and OA / mAcc evaluation of a point-cloud classifier.

    Args:
        augment: ``task.augment`` (see the module doc); model_name: the model's registry name (for
            ``augment="auto"``); up_axis: axis of ``up`` rotations; label_smoothing: of the loss.
    The model is called ``model(x, pos, mask)`` -> logits (B, C).
    """

    def _logits(self, model: nn.Module, batch: Mapping[str, torch.Tensor], generator: torch.Generator | None,
                train: bool) -> torch.Tensor:
        x, pos, mask = self._inputs(batch, _device(model), generator, train)
        logits = model(x, pos, mask)
        C = int(batch["labels"].max()) + 1
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != pos.shape[0] \
                or logits.shape[1] < C:
            raise ValueError(f"model: expected class logits of shape ({pos.shape[0]}, C) with C >= {C} (the data's "
                             f"labels), got {tuple(getattr(logits, 'shape', ()))}; use a classifier (e.g. sft-cls) "
                             "with num_classes set to the data set's class count")
        return logits

    def loss(self, model: nn.Module, sample: MiniBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean cross-entropy over the shapes of the (re-drawn, augmented) mini-batch."""
        batch = _check_sample(sample, False).members(generator)
        logits = self._logits(model, batch, generator, train=True)
        return F.cross_entropy(logits, batch["labels"].to(logits.device), label_smoothing=self.label_smoothing)

    def predict(self, model: nn.Module, samples: Sequence[MiniBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (S, C) float32 on CPU, labels (S,)) of every shape, model in eval mode."""
        return predict_items(model, samples, lambda s: self._logits(model, _check_sample(s, False).tensors(), None,
                                                                    train=False), "shapes")

    def evaluate(self, model: nn.Module, samples: Sequence[MiniBatch]) -> dict[str, float]:
        """``{"oa", "macc", "loss"}`` over every shape of ``samples`` (no augmentation)."""
        logits, labels = self.predict(model, samples)
        return {"oa": overall_accuracy(logits, labels), "macc": mean_class_accuracy(logits, labels),
                "loss": float(F.cross_entropy(logits, labels))}


class PartSegmentationTask(_ShapeTask):
    """Per-point cross-entropy training and instance / class mIoU evaluation of a part segmenter.

    The model is called ``model(x, pos, mask, category=labels)`` -> part logits (B, N, P), P at
    least the data's part count. Evaluation restricts each shape's prediction to its category's
    parts (:func:`~pointformers.tasks.metrics.restricted_part_predictions`).
    """

    def _logits(self, model: nn.Module, batch: Mapping[str, torch.Tensor], generator: torch.Generator | None,
                train: bool) -> torch.Tensor:
        x, pos, mask = self._inputs(batch, _device(model), generator, train)
        logits = model(x, pos, mask, category=batch["labels"].to(pos.device))
        P = int(batch["parts"].max()) + 1
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != pos.shape[:2] \
                or logits.shape[2] < P:
            raise ValueError(f"model: expected part logits of shape ({pos.shape[0]}, {pos.shape[1]}, P) with P >= {P} "
                             f"(the data's parts), got {tuple(getattr(logits, 'shape', ()))}; use a segmenter "
                             "(e.g. sft-partseg) with num_parts set to the data set's part count")
        return logits

    def loss(self, model: nn.Module, sample: MiniBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean cross-entropy over every real point of the (re-drawn, augmented) mini-batch."""
        batch = _check_sample(sample, True).members(generator)
        logits = self._logits(model, batch, generator, train=True)
        mask = batch["mask"].to(logits.device)
        return F.cross_entropy(logits[mask], batch["parts"].to(logits.device)[mask],
                               label_smoothing=self.label_smoothing)

    def evaluate(self, model: nn.Module, samples: Sequence[MiniBatch]) -> dict[str, float]:
        """``{"instance_miou", "class_miou", "point_acc", "loss"}`` over every shape of ``samples``."""
        was = model.training
        model.eval()
        preds, targets, cats = [], [], []
        ce_sum, n_points, correct = 0.0, 0, 0
        class_parts = None
        try:
            with torch.no_grad():
                for s in samples:
                    s = _check_sample(s, True)
                    class_parts = s.pool.meta["class_parts"]
                    batch = s.tensors()
                    logits = self._logits(model, batch, None, train=False).float().cpu()
                    mask, parts, labels = batch["mask"], batch["parts"], batch["labels"]
                    ce_sum += float(F.cross_entropy(logits[mask], parts[mask], reduction="sum"))
                    pred = restricted_part_predictions(logits, labels, class_parts, mask)
                    correct += int((pred[mask] == parts[mask]).sum())
                    n_points += int(mask.sum())
                    for b in range(pred.shape[0]):
                        preds.append(pred[b][mask[b]])
                        targets.append(parts[b][mask[b]])
                    cats.append(labels)
        finally:
            model.train(was)
        if not preds:
            raise ValueError("samples: no shapes to evaluate")
        m = part_segmentation_mious(preds, targets, torch.cat(cats), class_parts)
        return {**m, "point_acc": correct / n_points, "loss": ce_sum / n_points}


# -------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "format": (str,), "root": (str, None),
                "classes": (list, None), "per_class": (list, None), "num_points": (int, None),
                "deform": (float, None), "noise_std": (float, None), "normals": (bool,), "mini_batch": (int,),
                "val_fraction": (float,), "sampling": (str, None)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "format": "procedural", "root": None,
                  "classes": None, "per_class": None, "num_points": None, "deform": None, "noise_std": None,
                  "normals": True, "mini_batch": 16, "val_fraction": 0.1, "sampling": None}
_CLS_TASK_SCHEMA = {"augment": (str, list), "rotate_test": (str,), "up_axis": (str,), "label_smoothing": (float,),
                    "resample": (bool,)}
_CLS_TASK_DEFAULTS = {"augment": "auto", "rotate_test": "none", "up_axis": "y", "label_smoothing": 0.0,
                      "resample": True}


def _shape_counts(cfg: Mapping[str, Any]) -> tuple[int, int] | None:
    """(classes, parts) of the configured data where known without reading files."""
    d = _section(cfg, "data", _DATA_DEFAULTS)
    if d["format"] == "procedural":
        from ..data.shapes import class_parts

        params, _ = _procedural_params(d)
        names, _blocks = class_parts(params.class_names)
        return len(params.class_names), len(names)
    if d["format"] == "shapenetpart":
        return 16, 50
    if d["format"] in ("modelnet40-txt", "modelnet40-h5"):
        return 40, 0
    return None


def _validate(cfg: Mapping[str, Any], parts: bool) -> None:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _CLS_TASK_DEFAULTS)
    check_data_seed(d)
    if d["format"] not in FORMATS:
        raise ValueError(f"data.format: expected one of {', '.join(FORMATS)}, got {d['format']!r}")
    if parts and d["format"] not in ("procedural", "shapenetpart"):
        raise ValueError(f"data.format: part segmentation needs part labels (procedural or shapenetpart), "
                         f"got {d['format']!r}")
    if d["format"] == "procedural":
        _procedural_params(d)
    else:
        if d["root"] is None:
            raise ValueError(f"data.root: format {d['format']!r} reads a data set folder; set data.root")
        if not Path(d["root"]).expanduser().is_dir():
            raise ValueError(f"data.root: {d['root']!r} is not a folder")
        if d["num_points"] is not None and d["num_points"] < 1:
            raise ValueError(f"data.num_points: must be >= 1 or null, got {d['num_points']}")
    try:
        check_mini_batch(d["mini_batch"])
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if not (0 < d["val_fraction"] < 1):
        raise ValueError(f"data.val_fraction: must be in (0, 1), got {d['val_fraction']}")
    if d["sampling"] is not None and d["sampling"] not in ("fps", "first", "random", "all"):
        raise ValueError(f"data.sampling: expected fps, first, random, all or null, got {d['sampling']!r}")
    if t["rotate_test"] not in ROTATIONS:
        raise ValueError(f"task.rotate_test: expected one of {', '.join(ROTATIONS)}, got {t['rotate_test']!r}")
    try:
        _ShapeTask(t["augment"], (cfg.get("model") or {}).get("name"), t["up_axis"], t["label_smoothing"])
    except ValueError as exc:
        raise ValueError(f"task.{str(exc).splitlines()[0]}") from None
    model = cfg.get("model") or {}
    opts = model.get("options") or {}
    in_dim = opts.get("in_dim")
    if not d["normals"] and in_dim not in (0,):
        raise ValueError("model.options.in_dim: data.normals is false (coordinates only), so the model needs in_dim: 0")
    if d["normals"] and in_dim is not None and in_dim != 3:
        raise ValueError(f"model.options.in_dim: data.normals is true (x = unit normals, 3 channels), got in_dim {in_dim}")
    counts = _shape_counts(cfg)
    if counts is not None:
        n_cls, n_parts = counts
        key, want = ("num_parts", n_parts) if parts else ("num_classes", n_cls)
        if key in opts and opts[key] < want:
            raise ValueError(f"model.options.{key}: the data has {want} {'parts' if parts else 'classes'}, "
                             f"got {opts[key]}")
        if parts and opts.get("num_categories") is not None and opts["num_categories"] < n_cls:
            raise ValueError(f"model.options.num_categories: the data has {n_cls} categories, got "
                             f"{opts['num_categories']}")


def _build_cls(cfg: Mapping[str, Any]) -> ShapeClassificationTask:
    t = _section(cfg, "task", _CLS_TASK_DEFAULTS)
    return ShapeClassificationTask(t["augment"], (cfg.get("model") or {}).get("name"), t["up_axis"],
                                   t["label_smoothing"])


def _build_seg(cfg: Mapping[str, Any]) -> PartSegmentationTask:
    t = _section(cfg, "task", _CLS_TASK_DEFAULTS)
    return PartSegmentationTask(t["augment"], (cfg.get("model") or {}).get("name"), t["up_axis"],
                                t["label_smoothing"])


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    sets = load_shape_sets(cfg, splits)
    root = Path(d["cache_dir"]) if d["cache_dir"] is not None else None
    where = f" (cache under {root})" if root is not None else ""
    return [f"{s}: {len(sets[s])} shapes, {sets[s].num_classes} classes{where}" for s in splits]


#: ``task.name: shape-classification`` (SFT/SAMSA/Sampled Transformer ModelNet40 experiments).
SHAPE_CLASSIFICATION_TASK = register_task(TaskSpec(
    name="shape-classification",
    description="3-D shape classification (ModelNet40-style): overall and mean-class accuracy",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS,
    task_schema=_CLS_TASK_SCHEMA, task_defaults=_CLS_TASK_DEFAULTS,
    load=lambda cfg, splits, progress=False: _load(cfg, splits, progress, parts=False),
    build=_build_cls, metric="oa", mode="max", validate=lambda cfg: _validate(cfg, parts=False),
    generate=_generate, default_model="sft-cls",
))

#: ``task.name: part-segmentation`` (SFT/SAMSA ShapeNetPart experiments).
PART_SEGMENTATION_TASK = register_task(TaskSpec(
    name="part-segmentation",
    description="3-D part segmentation (ShapeNetPart-style): instance and class mIoU",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS,
    task_schema=_CLS_TASK_SCHEMA, task_defaults=_CLS_TASK_DEFAULTS,
    load=lambda cfg, splits, progress=False: _load(cfg, splits, progress, parts=True),
    build=_build_seg, metric="instance_miou", mode="max", validate=lambda cfg: _validate(cfg, parts=True),
    generate=_generate, default_model="sft-partseg",
))
