"""Sequence classification shared by the token-sequence tasks (ListOps, LRA Text): token mini-batches,
cross-entropy, accuracy.

Samples are :class:`~pointformers.tasks.minibatch.MiniBatch` es of an :class:`ItemPool` with a ragged
``tokens`` field (padding 0) and fixed ``labels``; the model is called ``model(tokens (B, L) int64,
mask (B, L) bool) -> logits (B, C)``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .metrics import accuracy
from .minibatch import ItemPool, MiniBatch, predict_items

__all__ = ["token_pool", "SequenceClassificationTask"]


def token_pool(tokens: Sequence[np.ndarray], labels: np.ndarray, pad: int = 0) -> ItemPool:
    """An :class:`ItemPool` of token sequences (ragged ``tokens`` (L_i,), padding ``pad``) and ``labels`` (S,)."""
    if len(tokens) == 0:
        raise ValueError("data: the split has no sequences")
    toks = [torch.from_numpy(np.asarray(t, np.int64)) for t in tokens]
    return ItemPool({"tokens": toks}, {"labels": torch.from_numpy(np.asarray(labels, np.int64))}, {"tokens": pad})


def _check(sample: Any, what: str) -> MiniBatch:
    if not isinstance(sample, MiniBatch) or "tokens" not in sample.pool.ragged:
        raise ValueError(f"sample: expected a {what} MiniBatch (from this task's load), got {type(sample).__name__}")
    return sample


class SequenceClassificationTask:
    """Cross-entropy training and accuracy of a sequence classifier.

    Args:
        num_classes: the labels' classes (the model's logits need at least as many columns).
        label_smoothing: of the cross-entropy (0 = plain, LRA's loss).
        name: the task's name for error messages.
    """

    def __init__(self, num_classes: int, label_smoothing: float = 0.0, name: str = "sequence") -> None:
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
                or not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing: expected a number in [0, 1), got {label_smoothing!r}")
        self.num_classes, self.label_smoothing, self.name = int(num_classes), float(label_smoothing), name

    def _logits(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        p = next(model.parameters(), None)
        dev = p.device if p is not None else torch.device("cpu")
        tokens, mask = batch["tokens"].to(dev), batch["mask"].to(dev)
        logits = model(tokens, mask)
        if not isinstance(logits, torch.Tensor) or logits.shape != (tokens.shape[0], logits.shape[-1]) \
                or logits.dim() != 2 or logits.shape[1] < self.num_classes:
            raise ValueError(f"model: expected logits of shape ({tokens.shape[0]}, C) with C >= {self.num_classes}, got "
                             f"{tuple(getattr(logits, 'shape', ()))}; use a sequence classifier (e.g. samsa-seq)")
        return logits

    def loss(self, model: nn.Module, sample: MiniBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean cross-entropy over the sequences of the mini-batch."""
        batch = _check(sample, self.name).members(generator)
        logits = self._logits(model, batch)
        return F.cross_entropy(logits, batch["labels"].to(logits.device), label_smoothing=self.label_smoothing)

    def predict(self, model: nn.Module, samples: Sequence[MiniBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (S, C) float32 on CPU, labels (S,)) of every sequence, model in eval mode."""
        return predict_items(model, samples, lambda s: self._logits(model, _check(s, self.name).tensors()),
                             "sequences")

    def evaluate(self, model: nn.Module, samples: Sequence[MiniBatch]) -> dict[str, float]:
        """``{"accuracy", "loss"}`` over every sequence of ``samples``."""
        logits, labels = self.predict(model, samples)
        return {"accuracy": accuracy(logits, labels), "loss": float(F.cross_entropy(logits, labels))}
