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


def _one_block_class(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """2 → 3: every model's blocks are one class (:class:`~pointformers.nn.TransformerBlock`). The
    blocks that had an ``ffn`` (SFT, SAMSA, FLT, the Sampled Transformer, the full-attention twins)
    name it ``ff`` (as HEPT's blocks already did; the layer indices inside are unchanged), SFT's
    and SAMSA's token mixer ``attn`` is ``mixer`` and SAMSA's norm ``norm`` is ``norm1``. A block
    is a prefix P with a ``P + "ffn.0.weight"`` key; only its direct children are renamed."""
    tail = "ffn.0.weight"
    blocks = sorted({k[:-len(tail)] for k in state if k == tail or k.endswith("." + tail)}, key=len, reverse=True)
    renames = (("ffn.", "ff."), ("attn.", "mixer."), ("norm.", "norm1."))
    out = {}
    for key, value in state.items():
        p = next((b for b in blocks if key.startswith(b)), None)
        if p is not None:
            rest = key[len(p):]
            for old, new in renames:
                if rest.startswith(old):
                    key = p + new + rest[len(old):]
                    break
        out[key] = value
    return out


#: version -> the step that upgrades a state_dict of that version to the next.
_STEPS: dict[int, Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    1: _shared_regions, 2: _one_block_class}

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
