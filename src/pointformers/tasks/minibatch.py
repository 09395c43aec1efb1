"""Mini-batches as engine samples, for the tasks whose items are small (shapes, sequences, sets).

The engine takes one *sample* per loss call. Shapes, token sequences and sets are far too small
to train one at a time, so these tasks make each sample a mini-batch of items padded into
``(B, N, ·)`` tensors with a ``(B, N)`` mask:

* :class:`ItemPool` holds one split: per-item *ragged* tensors (first dimension = the item's
  size n_i, e.g. points (n_i, 3)) and per-item *fixed* tensors (e.g. the class label), and pads
  any subset of items into a batch (:meth:`ItemPool.collate`).
* :class:`MiniBatch` is an engine sample: the pool and the (B,) indices of its items. Its padded
  tensors are built once and kept (:meth:`MiniBatch.tensors`).
* :meth:`MiniBatch.members` -- the items a training step uses. With a generator (the engine passes
  one to ``task.loss``) and ``resample=True``, a fresh set of ``B`` distinct items is drawn from the
  whole pool, so the membership of the mini-batches changes from step to step (seeded, hence
  reproducible) instead of being fixed once at load time; otherwise the sample's own items.

Evaluation always uses the fixed partition of :meth:`ItemPool.batches`, which visits every
item exactly once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from ..data.batch import pad_clouds

__all__ = ["ItemPool", "MiniBatch", "check_mini_batch", "predict_items"]


def check_mini_batch(value: object, name: str = "data.mini_batch") -> int:
    """``value`` as an integer >= 1, else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1 (items per mini-batch), got {value!r}")
    return int(value)


class ItemPool:
    """The items of one split, padded into batches on demand.

    Args:
        ragged: name -> per-item tensors of shape ``(n_i, ...)``; every field must give item ``i``
            the same ``n_i`` (e.g. ``points`` (n_i, 3) and ``parts`` (n_i,)).
        fixed: name -> a tensor ``(S, ...)`` with one row per item (e.g. ``labels`` (S,)).
        pad_values: per ragged field, the value of padded rows (default 0; e.g. -1 for labels).
        meta: free-form information shared by every batch (class names, part blocks, ...).
    """

    def __init__(self, ragged: Mapping[str, Sequence[torch.Tensor]], fixed: Mapping[str, torch.Tensor] | None = None,
                 pad_values: Mapping[str, float] | None = None, meta: Mapping[str, object] | None = None) -> None:
        if not ragged:
            raise ValueError("ragged: need at least one per-item field (e.g. points)")
        sizes = None
        for name, items in ragged.items():
            n = [int(t.shape[0]) for t in items]
            if sizes is None:
                sizes = n
            elif n != sizes:
                raise ValueError(f"ragged[{name!r}]: item sizes differ from the other fields'")
        self.sizes = torch.tensor(sizes, dtype=torch.long)
        if len(self.sizes) == 0:
            raise ValueError("ragged: the split has no items")
        if int(self.sizes.min()) < 1:
            raise ValueError(f"ragged: item {int(self.sizes.argmin())} is empty; every item needs at least one element")
        self.ragged = {k: list(v) for k, v in ragged.items()}
        self.fixed = dict(fixed or {})
        for name, t in self.fixed.items():
            if t.shape[0] != len(self):
                raise ValueError(f"fixed[{name!r}]: expected {len(self)} rows (one per item), got {t.shape[0]}")
        self.pad_values = dict(pad_values or {})
        self.meta = dict(meta or {})

    def __len__(self) -> int:
        return int(self.sizes.shape[0])

    def collate(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Pad items ``index`` (B,) into ``{field: (B, N, ...), fixed: (B, ...), "mask": (B, N)}``."""
        idx = [int(i) for i in index]
        out: dict[str, torch.Tensor] = {}
        mask = None
        for name, items in self.ragged.items():
            out[name], mask = pad_clouds([items[i] for i in idx], self.pad_values.get(name, 0.0))
        out["mask"] = mask
        sel = torch.as_tensor(idx, dtype=torch.long)
        for name, t in self.fixed.items():
            out[name] = t[sel]
        return out

    def batches(self, size: int, resample: bool = False, order: torch.Tensor | None = None) -> list["MiniBatch"]:
        """The pool cut into ``ceil(S / size)`` consecutive mini-batches (in ``order`` when given,
        e.g. sorted by length so a batch pads little); the last one may be smaller."""
        size = check_mini_batch(size, "size")
        order = torch.arange(len(self)) if order is None else torch.as_tensor(order, dtype=torch.long)
        return [MiniBatch(self, order[a:a + size], resample) for a in range(0, len(self), size)]

    def draw(self, size: int, generator: torch.Generator) -> torch.Tensor:
        """``min(size, S)`` distinct random item indices (B,), drawn from ``generator``."""
        return torch.randperm(len(self), generator=generator)[: min(size, len(self))]


@dataclass
class MiniBatch:
    """One engine sample: items ``index`` (B,) of ``pool``.

    ``resample``: in training, a step with a generator draws a fresh membership of the same size
    (:meth:`members`). ``tensors()`` is the padded batch of the sample's own items (built once).
    """

    pool: ItemPool
    index: torch.Tensor
    resample: bool = False
    _cache: dict | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def tensors(self) -> dict[str, torch.Tensor]:
        """The padded tensors of this sample's own items (see :meth:`ItemPool.collate`)."""
        if self._cache is None:
            self._cache = self.pool.collate(self.index)
        return self._cache

    def members(self, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        """The padded batch a training step uses: a fresh random membership when ``resample`` and a
        generator is given, else :meth:`tensors`."""
        if self.resample and generator is not None:
            return self.pool.collate(self.pool.draw(len(self), generator))
        return self.tensors()

    @property
    def num_items(self) -> int:
        return len(self)


@torch.no_grad()
def predict_items(model: torch.nn.Module, samples: Sequence[MiniBatch], logits_of, what: str,
                  target: str = "labels") -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (S, C) float32 on CPU, targets (S, ...)) of every item of ``samples`` with ``model`` in
    eval mode (its mode restored after): ``logits_of(sample)`` gives one sample's logits (its own items),
    ``sample.tensors()[target]`` its targets (any batch with a ``tensors()`` dict: mini-batches of
    items, graph batches, document pairs); ``what`` names the items in the error for no samples."""
    if not samples:
        raise ValueError(f"samples: no {what} to evaluate")
    was = model.training
    model.eval()
    try:
        logits, targets = [], []
        for s in samples:
            logits.append(logits_of(s).float().cpu())
            targets.append(s.tensors()[target])
    finally:
        model.train(was)
    return torch.cat(logits), torch.cat(targets)


def num_batches(items: int, size: int) -> int:
    """How many mini-batches of ``size`` cover ``items`` items."""
    return int(math.ceil(items / size))
