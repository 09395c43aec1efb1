"""Build attention mechanisms by name."""
from __future__ import annotations

from typing import Callable

from torch import nn

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register(name: str) -> Callable:
    """Class decorator: make a mechanism buildable as ``build(name, **options)``."""

    def deco(cls):
        if name in _REGISTRY:
            raise ValueError(f"attention mechanism {name!r} is already registered")
        _REGISTRY[name] = cls
        cls.registry_name = name
        return cls

    return deco


def available() -> list[str]:
    """Registry keys of every mechanism, sorted."""
    return sorted(_REGISTRY)


def build(name: str, **options) -> nn.Module:
    """Instantiate mechanism ``name`` with its options (named as in the papers' code)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention mechanism {name!r}; available: {', '.join(available())}")
    return _REGISTRY[name](**options)
