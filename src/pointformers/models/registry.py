"""Models by name, each with its metadata (:class:`ModelInfo`), in the package's one registry type.

>>> import pointformers
>>> model = pointformers.models.build("hept-tracking", n_layers=2)     # doctest: +SKIP
>>> pointformers.models.info("hept-tracking").task                      # doctest: +SKIP
'tracking'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from ..registry import Entry, Registry

#: The export reason of models registered without ``export=None``.
NOT_EXPORTED = ("the `pointformers export` command writes the per-point models whose forward is (x (N, F), "
                "coords (N, c)) -> per-point outputs (hept-tracking, tracking-encoder, hept-pileup, "
                "pileup-encoder); this model's inputs and outputs are another kind (shapes, sequences or sets "
                "with per-cloud outputs or extra inputs). Export it from Python: "
                "pointformers.attention.set_exportable(model), then torch.export.export / torch.onnx.export "
                "(it refuses, naming the module, where a part has no exportable path)")

__all__ = ["ModelInfo", "MODELS", "register_model", "available", "build", "info", "entry"]


@dataclass(frozen=True)
class ModelInfo:
    """What configs, the CLI and export need to know about a model.

    Attributes:
        task: the task it is built for (``task.name`` of its configs), or None when generic.
        description: one line for listings (default: the factory's first docstring line).
        export: None when ``pointformers export`` handles the model (its mechanisms may still refuse,
            see :func:`pointformers.export.check_exportable`), else why it does not.
    """

    task: str | None = None
    description: str = ""
    export: str | None = NOT_EXPORTED


def _describe(entry: Entry) -> None:
    if not entry.info.description and entry.factory.__doc__:
        object.__setattr__(entry.info, "description", entry.factory.__doc__.strip().splitlines()[0])


#: The registry of models.
MODELS: Registry[nn.Module] = Registry("model", ModelInfo, _describe)


def register_model(name: str, **metadata) -> Callable:
    """Decorator: make a model factory buildable as ``build(name, **options)``; ``metadata`` are
    :class:`ModelInfo` fields."""
    return MODELS.register(name, **metadata)


def available() -> list[str]:
    """Registered model names, sorted."""
    return MODELS.available()


def build(name: str, **options) -> nn.Module:
    """Instantiate model ``name`` (see :func:`available`) with its options; the model records its
    registry name (``model.registry_name``)."""
    model = MODELS.build(name, **options)
    model.registry_name = name
    return model


def info(name: str) -> ModelInfo:
    """The :class:`ModelInfo` of ``name``."""
    return MODELS.info(name)


def entry(name: str) -> Entry:
    """The registry entry (factory and :class:`ModelInfo`) of ``name``."""
    return MODELS.get(name)
