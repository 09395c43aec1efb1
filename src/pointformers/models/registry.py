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

__all__ = ["ModelInfo", "MODELS", "register_model", "available", "build", "info", "entry"]


@dataclass(frozen=True)
class ModelInfo:
    """What configs, the CLI and export need to know about a model.

    Attributes:
        task: the task it is built for (``task.name`` of its configs), or None when generic.
        description: one line for listings (default: the factory's first docstring line).
    Whether a built model can be exported is a property of the instance (its ``export_inputs``
    and its mechanisms' refusals, see :func:`pointformers.export.check_exportable`).
    """

    task: str | None = None
    description: str = ""


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
    """Instantiate model ``name`` (see :func:`available`) with its options."""
    return MODELS.build(name, **options)


def info(name: str) -> ModelInfo:
    """The :class:`ModelInfo` of ``name``."""
    return MODELS.info(name)


def entry(name: str) -> Entry:
    """The registry entry (factory and :class:`ModelInfo`) of ``name``."""
    return MODELS.get(name)
