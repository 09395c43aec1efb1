"""Masked point pre-training (``task.name: point-mae-pretrain``): Point-MAE / the Sampled Transformer's
MAE-dense and MAE-sampled on the shape data sets of :mod:`.shapes`.

Importing this module registers the task and, through :mod:`pointformers.models.point_mae`, the
models ``point-mae`` and ``point-mae-cls``. It is not (yet) one of the built-in task modules: load
it as a plugin (``pointformers train --plugin pointformers.tasks.point_mae --config ...``, or
``POINTFORMERS_PLUGINS=pointformers.tasks.point_mae``).

Data (``data:``): the keys and formats of ``shape-classification`` (procedural shapes by default,
or ``modelnet40-txt`` / ``modelnet40-h5`` / ``shapenetpart`` with ``root``); labels are loaded
but unused. Coordinates only by default (``data.normals: false``; with ``true`` the model needs
``in_dim: 3`` and the normals are appended to each group point's relative coordinates).

Task options (``task:``): ``augment`` -- training augmentation names as ``shape-classification``'s
(default ``sampled``: Point-BERT's per-axis scale U[2/3, 3/2] and shift U[-0.2, 0.2], as Point-MAE
pre-trains); ``up_axis``; ``resample`` (re-draw each mini-batch's shapes every step).

The model is called ``model(pos, mask, x=normals | None, generator=g) -> (loss, details)``
(:class:`~pointformers.models.point_mae.PointMAE`); in training the masks are drawn from the
engine's generator, in evaluation from the model's own seeded generator (the same masks at every
validation). Metric: ``chamfer`` (the mean masked-group Chamfer-L2 over the shapes, mode min);
``loss`` is the same number.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..models import point_mae as _models  # noqa: F401  (registers point-mae and point-mae-cls)
from .minibatch import MiniBatch
from .registry import TaskSpec, check_data_seed, config_section as _section, register_task
from .shapes import _DATA_DEFAULTS as _SHAPE_DATA_DEFAULTS, _DATA_SCHEMA, _ShapeTask, _check_sample, _device, _load, \
    _validate as _validate_shapes

__all__ = ["PointMAEPretrainTask", "POINT_MAE_PRETRAIN_TASK"]


class PointMAEPretrainTask(_ShapeTask):
    """Masked-reconstruction training and Chamfer evaluation of a :class:`~pointformers.models.point_mae.PointMAE`.

    Args: augment (a name or list of ``shape-classification``'s augmentation names, or ``none``),
    up_axis (the axis of ``up`` rotations).
    """

    def __init__(self, augment: str | Sequence[str] = "sampled", up_axis: str = "y") -> None:
        if augment == "auto":   # "auto" picks by a classifier's name; a pre-training run names its augmentation
            raise ValueError("augment: name the augmentation (e.g. 'sampled', 'none'); 'auto' is for classifiers")
        super().__init__(augment, None, up_axis)

    def _loss(self, model: nn.Module, batch: Mapping[str, torch.Tensor], generator: torch.Generator | None,
              train: bool) -> torch.Tensor:
        x, pos, mask = self._inputs(batch, _device(model), generator, train)
        out = model(pos, mask, x=x, generator=generator if train else None)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor) and out[0].dim() == 0):
            raise ValueError("model: expected (loss, details) from a masked autoencoder (use model.name: point-mae)")
        return out[0]

    def loss(self, model: nn.Module, sample: MiniBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        """The masked-group Chamfer-L2 of the (re-drawn, augmented) mini-batch, masks drawn from ``generator``."""
        return self._loss(model, _check_sample(sample, False).members(generator), generator, train=True)

    def evaluate(self, model: nn.Module, samples: Sequence[MiniBatch]) -> dict[str, float]:
        """``{"chamfer", "loss"}``: the mean over every shape of ``samples`` of its mini-batch's
        Chamfer-L2 (no augmentation, the model's eval masks)."""
        was = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            with torch.no_grad():
                for s in samples:
                    batch = _check_sample(s, False).tensors()
                    n = int(batch["mask"].shape[0])
                    total += float(self._loss(model, batch, None, train=False)) * n
                    count += n
        finally:
            model.train(was)
        if not count:
            raise ValueError("samples: no shapes to evaluate")
        return {"chamfer": total / count, "loss": total / count}


_DATA_DEFAULTS = {**_SHAPE_DATA_DEFAULTS, "normals": False}
_TASK_SCHEMA = {"augment": (str, list), "up_axis": (str,), "resample": (bool,)}
_TASK_DEFAULTS = {"augment": "sampled", "up_axis": "y", "resample": True}


def _data_cfg(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config with this task's data defaults (normals off) made explicit for the shape helpers."""
    return {**cfg, "data": _section(cfg, "data", _DATA_DEFAULTS)}


def _validate(cfg: Mapping[str, Any]) -> None:
    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    check_data_seed(d)
    try:
        PointMAEPretrainTask(t["augment"], t["up_axis"])
    except ValueError as exc:
        raise ValueError(f"task.{str(exc).splitlines()[0]}") from None
    # the data checks of shape-classification (formats, root, mini_batch, normals vs in_dim), with
    # PointMAE's default in_dim 0 where the config leaves it out
    model = dict(cfg.get("model") or {})
    model["options"] = {"in_dim": 0, **(model.get("options") or {})}
    _validate_shapes({**_data_cfg(cfg), "model": model, "task": {"augment": "none"}}, parts=False)


def _build(cfg: Mapping[str, Any]) -> PointMAEPretrainTask:
    t = _section(cfg, "task", _TASK_DEFAULTS)
    return PointMAEPretrainTask(t["augment"], t["up_axis"])


#: ``task.name: point-mae-pretrain`` (Sampled Transformer MAE-dense / MAE-sampled pre-training).
POINT_MAE_PRETRAIN_TASK = register_task(TaskSpec(
    name="point-mae-pretrain",
    description="masked point pre-training (Point-MAE): Chamfer-L2 of the reconstructed masked groups",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS,
    task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=lambda cfg, splits, progress=False: _load(
        {**_data_cfg(cfg), "task": {"resample": _section(cfg, "task", _TASK_DEFAULTS)["resample"]}}, splits, progress),
    build=_build, metric="chamfer", mode="min", validate=_validate, default_model="point-mae",
))
