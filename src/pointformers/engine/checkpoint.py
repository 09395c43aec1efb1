"""Atomic checkpoint and JSON files.

A checkpoint is a plain ``dict`` saved with :func:`torch.save` and loaded back with
``weights_only=True`` (no pickled code runs on load), so it may hold only tensors,
numbers, strings, lists, tuples and dicts. Keys written by the engine:

``format`` (:data:`CHECKPOINT_FORMAT`), ``version``, ``model`` (the ``state_dict``),
``model_name`` and ``model_config`` (registry name and options: enough to rebuild the
model with :func:`pointformers.models.build`), ``epoch``, ``metric_name``, ``metric``
and, for resumable ``last.pt`` files, ``optimizer``, ``scheduler``, ``generator``,
``torch_rng``, ``best_metric``, ``best_epoch``, ``history``.

``sha256`` (written since issue 21) is a content hash of every other entry, computed by
:func:`content_hash` over a canonical byte stream (keys in sorted order; tensors as dtype,
shape and raw bytes; numbers and strings by exact ``repr``), so it does not depend on how
:func:`torch.save` lays out the zip. :func:`load_checkpoint` recomputes it and refuses a file
whose content changed (a flipped bit in a weight, say) with "content hash mismatch".
Checkpoints written before the hash existed carry no ``sha256`` and load as before.

Writes never leave a partial file at the destination: the bytes go to a temporary file in
the same directory, are flushed and fsynced, and only then :func:`os.replace` puts it in
place (atomic on POSIX and Windows within one file system). If anything fails on the way
— an exception inside :func:`torch.save`, a full disk, Ctrl-C — the temporary file is
removed and the previous file at the destination is untouched; a failure of the file system
raises :class:`~pointformers.files.FileWriteError` ("cannot write FILE: reason", a ValueError).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from ..files import atomic_write
from ..models.migration import STATE_VERSION, migrate_state_dict

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "atomic_write",
    "save_checkpoint",
    "load_checkpoint",
    "content_hash",
    "model_from_checkpoint",
    "write_json",
    "remove_stale_temporaries",
]

#: Value of the ``format`` key that marks a pointformers checkpoint.
CHECKPOINT_FORMAT = "pointformers-checkpoint"
#: Format version written: the model state_dict layout version (:mod:`pointformers.models.migration`);
#: older checkpoints are migrated on load.
_VERSION = STATE_VERSION


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, corrupted or not a pointformers checkpoint."""


def remove_stale_temporaries(directory: str | os.PathLike, names: tuple[str, ...]) -> list[Path]:
    """Delete temporary files that :func:`atomic_write` left for ``names`` in ``directory`` when its
    process was killed mid-write (SIGKILL, power loss: no cleanup could run). Returns the paths
    removed. Only call this when no other process is writing those files."""
    directory = Path(directory)
    removed = []
    if not directory.is_dir():
        return removed
    for name in names:
        for p in directory.glob(f".{name}.*.tmp"):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


def _feed(h: "hashlib._Hash", o: Any) -> None:
    """Feed ``o`` to ``h`` as an unambiguous, layout-independent byte stream (type-tagged,
    length-prefixed)."""
    def put(tag: bytes, data: bytes) -> None:
        h.update(tag + len(data).to_bytes(8, "little") + data)

    if isinstance(o, torch.Tensor):
        t = o.detach().to("cpu").contiguous()
        put(b"T", f"{t.dtype}|{tuple(t.shape)}".encode())
        put(b"B", t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(o, Mapping):
        items = sorted(o.items(), key=lambda kv: (type(kv[0]).__name__, repr(kv[0])))
        put(b"D", str(len(items)).encode())
        for k, v in items:
            _feed(h, k)
            _feed(h, v)
    elif isinstance(o, (list, tuple)):
        put(b"L" if isinstance(o, list) else b"U", str(len(o)).encode())
        for v in o:
            _feed(h, v)
    elif isinstance(o, torch.Generator):  # not expected in a checkpoint; hash its state
        _feed(h, o.get_state())
    else:  # None, bool, int, float (repr is exact), str, bytes, torch.dtype/device, ...
        put(b"S", f"{type(o).__name__}:{o!r}".encode())


def content_hash(checkpoint: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of every entry of ``checkpoint`` except ``sha256`` (see the module docstring)."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in checkpoint.items() if k != "sha256"})
    return h.hexdigest()


def save_checkpoint(path: str | os.PathLike, checkpoint: Mapping[str, Any]) -> Path:
    """Atomically save ``checkpoint`` (a mapping; see the module docstring) to ``path``.

    ``format``, ``version`` and ``sha256`` (:func:`content_hash`) keys are added. Raises
    ValueError if ``checkpoint`` is not a mapping or has no ``model`` state_dict.
    """
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"checkpoint: expected a mapping, got {type(checkpoint).__name__}")
    if not isinstance(checkpoint.get("model"), Mapping):
        raise ValueError("checkpoint: needs a 'model' entry holding the model's state_dict")
    obj = {"format": CHECKPOINT_FORMAT, "version": _VERSION,
           **{k: v for k, v in checkpoint.items() if k != "sha256"}}
    obj["sha256"] = content_hash(obj)
    return atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    required: tuple[str, ...] = ("model",)) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`.

    Raises:
        CheckpointError (a ValueError) naming the file, if it does not exist, cannot be
        read, is truncated/corrupted, its content does not match its stored ``sha256``
        ("content hash mismatch"), is not a pointformers checkpoint, or lacks a key in
        ``required``. Files without ``sha256`` (written before it existed) are not checked.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r}: no such file")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r}: not a regular file")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r}: cannot be read (truncated or corrupted?): "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    except Exception as exc:  # weights_only unpickler refusals and the like
        raise CheckpointError(f"checkpoint {str(path)!r}: not a loadable pointformers checkpoint "
                              f"({type(exc).__name__})") from exc
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r}: not a pointformers checkpoint "
                              f"(no format={CHECKPOINT_FORMAT!r} entry)")
    if int(obj.get("version", 0)) > _VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r}: written by a newer format version "
                              f"{obj.get('version')} (this package reads <= {_VERSION})")
    if "sha256" in obj:
        try:
            actual = content_hash(obj)
        except Exception as exc:  # an entry the hash cannot walk: the file is not what we wrote
            raise CheckpointError(f"checkpoint {str(path)!r}: content hash mismatch (corrupted?): "
                                  f"cannot hash its content ({type(exc).__name__})") from exc
        if actual != obj["sha256"]:
            raise CheckpointError(f"checkpoint {str(path)!r}: content hash mismatch (corrupted?)")
    missing = [k for k in required if k not in obj]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r}: missing entries {missing}")
    return obj


def model_from_checkpoint(path_or_checkpoint: str | os.PathLike | Mapping[str, Any],
                          map_location: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model stored in a checkpoint (by ``model_name`` / ``model_config``) and load
    its weights strictly. Returns the model in ``eval()`` mode.

    Raises:
        CheckpointError if the file is unusable or its weights do not fit the architecture.
    """
    from .. import models  # engine sits above models in the layer order

    ckpt = (load_checkpoint(path_or_checkpoint, map_location, ("model", "model_name", "model_config"))
            if not isinstance(path_or_checkpoint, Mapping) else dict(path_or_checkpoint))
    where = str(path_or_checkpoint) if not isinstance(path_or_checkpoint, Mapping) else "<in memory>"
    for key in ("model", "model_name", "model_config"):
        if key not in ckpt:
            raise CheckpointError(f"checkpoint {where!r}: missing entry {key!r}")
    try:
        model = models.build(ckpt["model_name"], **dict(ckpt["model_config"]))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {where!r}: cannot rebuild model {ckpt['model_name']!r}: {exc}") from exc
    state = migrate_state_dict(ckpt["model"], int(ckpt.get("version", 1)))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint {where!r}: weights do not fit model {ckpt['model_name']!r}: "
                              f"{str(exc).splitlines()[0]}") from exc
    return model.to(map_location).eval()


def _json_clean(o: Any) -> Any:
    """JSON has no NaN/inf: write them as null so any JSON reader accepts the file."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, Mapping):
        return {str(k): _json_clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_clean(v) for v in o]
    if isinstance(o, torch.Tensor) and o.numel() == 1:
        return _json_clean(o.item())
    if hasattr(o, "item") and callable(o.item):  # numpy scalars
        return _json_clean(o.item())
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    return o


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomically write ``obj`` as indented JSON (NaN/inf become ``null``)."""
    text = json.dumps(_json_clean(obj), indent=2, allow_nan=False) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()))
