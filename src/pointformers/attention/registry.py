"""Attention mechanisms by name, each with its metadata (:class:`MechanismInfo`).

A mechanism is one file: its module class, registered here with what models, benchmarks and
export need to know about it, so none of them keeps a table of mechanism names::

    @register("mine", flops=my_flops, bench={"k": 64})
    class MyAttention(TokenMixer): ...

``build(name, **options)`` instantiates it; ``info(name)`` returns its metadata.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from torch import nn

from ..registry import Entry, Registry

__all__ = ["MechanismInfo", "MECHANISMS", "register", "available", "build", "info", "entry", "model_options"]

#: Constructor options a model fills from its own configuration when the mechanism takes them.
MODEL_SUPPLIED = ("head_dim", "coord_dim")


@dataclass(frozen=True)
class MechanismInfo:
    """What the rest of the package needs to know about a mechanism.

    Attributes:
        flops: ``flops(module, n, dim, pos_dim) -> FlopCount``: analytic FLOPs of one layer of the
            built ``module`` on one cloud of ``n`` points (conventions in
            :mod:`pointformers.attention.flop_count`). None: no formula.
        bench: benchmark default options (papers' values where they exist), merged under the
            options a benchmark is given.
        export: None when the mechanism has an export path (its module's ``exportable`` mode;
            option-dependent refusals come from the module's ``export_refusal()``), else the
            reason no export path can exist.
        model_options: constructor options a model supplies from its own config (e.g. the
            model's ``head_dim`` and ``coord_dim``); default: those of :data:`MODEL_SUPPLIED`
            that the constructor accepts (filled in at registration).
        shared: ``shared(**options) -> nn.Module | None``: a module the *model* owns once and
            binds to every layer (e.g. HEPT's region counts), built from the mechanism's options;
            None when the layers share nothing persistent.
        description: one line for listings.
    """

    flops: Callable[..., Any] | None = None
    bench: Mapping[str, Any] = field(default_factory=dict)
    export: str | None = None
    model_options: tuple[str, ...] | None = None
    shared: Callable[..., nn.Module | None] | None = None
    description: str = ""


def _tag(entry: Entry) -> None:
    cls = entry.factory
    cls.registry_name = entry.name
    if entry.info.model_options is None:
        supplied = tuple(o for o in MODEL_SUPPLIED if entry.accepts(o))
        object.__setattr__(entry.info, "model_options", supplied)
    if not entry.info.description and cls.__doc__:
        object.__setattr__(entry.info, "description", cls.__doc__.strip().splitlines()[0])


#: The registry of token mixers.
MECHANISMS: Registry[nn.Module] = Registry("attention mechanism", MechanismInfo, _tag)


def register(name: str, **metadata) -> Callable:
    """Class decorator: make a mechanism buildable as ``build(name, **options)``; ``metadata``
    are :class:`MechanismInfo` fields."""
    return MECHANISMS.register(name, **metadata)


def available() -> list[str]:
    """Registry keys of every mechanism, sorted."""
    return MECHANISMS.available()


def build(name: str, **options) -> nn.Module:
    """Instantiate mechanism ``name`` with its options (named as in the papers' code)."""
    return MECHANISMS.build(name, **options)


def entry(name: str) -> Entry:
    """The registry entry (class and :class:`MechanismInfo`) of ``name``."""
    return MECHANISMS.get(name)


def info(name: str) -> MechanismInfo:
    """The :class:`MechanismInfo` of ``name``."""
    return MECHANISMS.info(name)


def model_options(name: str, options: Mapping[str, Any] | None, **supplied) -> dict:
    """``options`` completed with the values a model supplies (``supplied``, e.g. ``head_dim=24,
    coord_dim=6``) for the options mechanism ``name`` declares in ``model_options``; values
    already in ``options`` win."""
    out = dict(options or {})
    for key in info(name).model_options or ():
        if key in supplied and supplied[key] is not None:
            out.setdefault(key, supplied[key])
    return out
