"""Build models by name."""
from __future__ import annotations

from typing import Callable

from torch import nn

_MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable:
    def deco(fn):
        if name in _MODELS:
            raise ValueError(f"model {name!r} is already registered")
        _MODELS[name] = fn
        return fn

    return deco


def available() -> list[str]:
    return sorted(_MODELS)


def build(name: str, **options) -> nn.Module:
    """Instantiate model ``name`` (see :func:`available`) with its options."""
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available())}")
    return _MODELS[name](**options)
