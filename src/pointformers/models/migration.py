"""State-dict migrations: checkpoints written by older versions of this package still load.

Each change of a model's parameter or buffer layout bumps :data:`STATE_VERSION` and adds a step
here; a checkpoint records the version it was written with (``version`` in
:mod:`pointformers.engine.checkpoint`) and :func:`migrate_state_dict` replays the steps after it.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

__all__ = ["STATE_VERSION", "migrate_state_dict"]


def _shared_regions(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """1 → 2: the model-owned HEPT region counts moved from ``region_hash`` to the generic
    ``shared`` (the module a mechanism's registry entry asks its model to own). A layer's own
    ``….mixer.region_hash.regions`` is unchanged."""
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if len(parts) >= 2 and parts[-2:] == ["region_hash", "regions"] and (len(parts) < 3 or parts[-3] != "mixer"):
            key = ".".join(parts[:-2] + ["shared", "regions"])
        out[key] = value
    return out


#: version -> the step that upgrades a state_dict of that version to the next.
_STEPS: dict[int, Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]] = {1: _shared_regions}

#: The layout version of the state_dicts this code writes.
STATE_VERSION = max(_STEPS) + 1


def migrate_state_dict(state: Mapping[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    """``state`` written at layout ``version`` brought to :data:`STATE_VERSION` (a new dict)."""
    if not isinstance(version, int) or version < 1 or version > STATE_VERSION:
        raise ValueError(f"version: expected a state_dict layout version in 1..{STATE_VERSION}, got {version!r}")
    out = dict(state)
    for v in range(version, STATE_VERSION):
        out = _STEPS[v](out)
    return out
