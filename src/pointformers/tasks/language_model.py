"""Word-level language modelling, registered at import as ``task.name: language-model`` (FLT §5.1).

Data (``data:`` section): the generated WikiText-like corpus of :mod:`pointformers.data.language`
(``preset`` ``tiny`` | ``small`` | ``default``, optional ``sizes`` of the splits in tokens), cached
on disk; or, with ``root``, the released WikiText-103 (or WikiText-2) token files in that folder
(``max_vocab`` caps the vocabulary, which changes what the perplexity means). Each split's token
stream is cut into non-overlapping windows of ``block_len`` predicted tokens
(:func:`~pointformers.data.language.lm_windows`; the paper: 512, no context carried over from the
previous block), and ``mini_batch`` windows make one engine sample. ``task.resample: true`` draws
a fresh set of windows for every training step.

Model: ``model(tokens (B, L) int64, mask (B, L) bool) -> logits (B, L, V)``, position i scoring
token i + 1 (``flt-lm``, ``performer-lm``, ``full-lm``, ``mlp-lm``); ``model.options.vocab_size``
must cover the corpus's vocabulary. Loss: the mean cross-entropy over the predicted tokens.
Metrics: ``perplexity`` (exp of the mean negative log-likelihood per predicted token over the
whole split, :func:`~pointformers.tasks.metrics.perplexity`; lower is better), ``loss`` (that mean,
in nats) and ``accuracy`` (next-token top-1).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .metrics import token_nll
from .minibatch import ItemPool, MiniBatch, check_mini_batch
from .registry import TaskSpec, check_data_seed, config_section as _section, register_task

__all__ = ["load_corpus", "LanguageModelTask", "LANGUAGE_MODEL_TASK"]


def _params(d: Mapping[str, Any]):
    from ..data.language import PRESETS, TextParams

    if d["preset"] not in PRESETS:
        raise ValueError(f"data.preset: unknown text preset {d['preset']!r} (valid: {', '.join(sorted(PRESETS))})")
    over = {"sizes": tuple(d["sizes"])} if d.get("sizes") is not None else {}
    try:
        return TextParams(**{**PRESETS[d["preset"]], **over}), bool(over)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"data.{str(exc).splitlines()[0]}") from None


def load_corpus(cfg: Mapping[str, Any], splits: Sequence[str]):
    """The :class:`~pointformers.data.language.Corpus` named by ``cfg["data"]`` (its ``splits``)."""
    from ..data.language import load_generated_corpus, load_wikitext

    d = _section(cfg, "data", _DATA_DEFAULTS)
    if d["root"] is not None:
        corpus = load_wikitext(d["root"], splits, max_vocab=d["max_vocab"], cache_dir=d["cache_dir"])
    else:
        params, overridden = _params(d)
        corpus = load_generated_corpus(params if overridden else d["preset"], cache_dir=d["cache_dir"], seed=d["seed"])
    opts = (cfg.get("model") or {}).get("options") or {}
    if "vocab_size" in opts and opts["vocab_size"] < len(corpus.vocab):
        raise ValueError(f"model.options.vocab_size: the corpus's vocabulary has {len(corpus.vocab)} words, got "
                         f"{opts['vocab_size']}")
    return corpus


def _load(cfg: Mapping[str, Any], splits: Sequence[str], progress: bool = False) -> dict[str, list[MiniBatch]]:
    from ..data.language import PAD, lm_windows

    d = _section(cfg, "data", _DATA_DEFAULTS)
    t = _section(cfg, "task", _TASK_DEFAULTS)
    corpus = load_corpus(cfg, splits)
    out = {}
    for s in splits:
        windows = [torch.from_numpy(w.astype("int64")) for w in lm_windows(corpus.streams[s], d["block_len"])]
        pool = ItemPool({"tokens": windows}, pad_values={"tokens": PAD}, meta={"vocab_size": len(corpus.vocab)})
        out[s] = pool.batches(d["mini_batch"], resample=(s == "train" and t["resample"]))
    return out


def _check(sample: Any) -> MiniBatch:
    if not isinstance(sample, MiniBatch) or "tokens" not in sample.pool.ragged:
        raise ValueError(f"sample: expected a language-model MiniBatch (from this task's load), got "
                         f"{type(sample).__name__}")
    return sample


class LanguageModelTask:
    """Next-token cross-entropy training and perplexity of a causal language model."""

    @staticmethod
    def _forward(model: nn.Module, batch: Mapping[str, torch.Tensor]):
        """(logits (B, L, V), targets (B, L), target mask (B, L)) of a batch of windows (B, L + 1)."""
        p = next(model.parameters(), None)
        dev = p.device if p is not None else torch.device("cpu")
        tokens, mask = batch["tokens"].to(dev), batch["mask"].to(dev)
        inputs, in_mask = tokens[:, :-1], mask[:, :-1]
        logits = model(inputs, in_mask)
        B, L = inputs.shape
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != (B, L):
            raise ValueError(f"model: expected next-token logits of shape ({B}, {L}, V), got "
                             f"{tuple(getattr(logits, 'shape', ()))}; use a language model (e.g. flt-lm)")
        return logits, tokens[:, 1:], mask[:, 1:]

    def loss(self, model: nn.Module, sample: MiniBatch, generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean cross-entropy over the predicted tokens of the mini-batch's windows."""
        logits, target, tmask = self._forward(model, _check(sample).members(generator))
        return F.cross_entropy(logits[tmask], target[tmask])

    @torch.no_grad()
    def evaluate(self, model: nn.Module, samples: Sequence[MiniBatch]) -> dict[str, float]:
        """``{"perplexity", "loss", "accuracy"}`` over every predicted token of ``samples``."""
        was = model.training
        model.eval()
        total, count, correct = 0.0, 0, 0
        try:
            for s in samples:
                logits, target, tmask = self._forward(model, _check(s).tensors())
                nll, n = token_nll(logits.float(), target, tmask)
                total, count = total + nll, count + n
                correct += int((logits.argmax(-1)[tmask] == target[tmask]).sum())
        finally:
            model.train(was)
        if count == 0:
            raise ValueError("samples: no tokens to evaluate")
        loss = total / count
        return {"perplexity": math.exp(min(loss, 700.0)), "loss": loss, "accuracy": correct / count}


# ---------------------------------------------------------------------------------- registration
_DATA_SCHEMA = {"preset": (str,), "seed": (int,), "cache_dir": (str, None), "root": (str, None),
                "sizes": (list, None), "max_vocab": (int, None), "block_len": (int,), "mini_batch": (int,)}
_DATA_DEFAULTS = {"preset": "small", "seed": 0, "cache_dir": None, "root": None, "sizes": None, "max_vocab": None,
                  "block_len": 256, "mini_batch": 16}
_TASK_SCHEMA = {"resample": (bool,)}
_TASK_DEFAULTS = {"resample": False}


def _validate(cfg: Mapping[str, Any]) -> None:
    from ..data.language import SPECIALS

    d = _section(cfg, "data", _DATA_DEFAULTS)
    check_data_seed(d)
    if d["root"] is not None:
        from pathlib import Path

        if not Path(d["root"]).expanduser().is_dir():
            raise ValueError(f"data.root: {d['root']!r} is not a folder (expected WikiText's wiki.*.tokens files)")
    else:
        _params(d)
    mv = d["max_vocab"]
    if mv is not None and mv <= len(SPECIALS):
        raise ValueError(f"data.max_vocab: must be > {len(SPECIALS)} or null, got {mv}")
    if d["block_len"] < 1:
        raise ValueError(f"data.block_len: must be >= 1 (predicted tokens per window), got {d['block_len']}")
    check_mini_batch(d["mini_batch"])
    opts = (cfg.get("model") or {}).get("options") or {}
    if d["root"] is None and "vocab_size" in opts and opts["vocab_size"] < _params(d)[0].vocab_size:
        raise ValueError(f"model.options.vocab_size: the {d['preset']!r} corpus has {_params(d)[0].vocab_size} "
                         f"words, got {opts['vocab_size']}")
    if opts.get("max_len") is not None and opts["max_len"] < d["block_len"]:
        raise ValueError(f"model.options.max_len: windows hold {d['block_len']} input tokens, got {opts['max_len']}")


def _build(cfg: Mapping[str, Any]) -> LanguageModelTask:
    return LanguageModelTask()


def _generate(cfg: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    corpus = load_corpus(cfg, splits)
    return [f"{s}: {len(corpus.streams[s])} tokens (vocabulary {len(corpus.vocab)})" for s in splits]


#: ``task.name: language-model`` (FLT's WikiText-103 experiment, App. B.1).
LANGUAGE_MODEL_TASK = register_task(TaskSpec(
    name="language-model",
    description="word-level language modelling (WikiText-103 or a generated stand-in); perplexity",
    data_schema=_DATA_SCHEMA, data_defaults=_DATA_DEFAULTS, task_schema=_TASK_SCHEMA, task_defaults=_TASK_DEFAULTS,
    load=_load, build=_build, metric="perplexity", mode="min", validate=_validate, generate=_generate,
    default_model="flt-lm",
))
